"""The edges of the ranges: overflow, specials, subnormal elements and c."""

from __future__ import annotations

import math

import numpy as np

from ...exact import fp32_bits_rounded
from ...formats import get_format
from ..draw import Batch, Drawing, FP32


class RangesFamilies(Drawing):
    """The edges of the ranges: overflow, specials, subnormal elements and c."""

    def overflow(self, n: int) -> Batch:
        """Sums just past the accumulator's range (fp32, or the output format's): c near the
        format's largest value with a term of its sign, or the largest elements at large
        scales. Under a directed rounding toward zero this tells +-Inf from the largest value."""
        batch = self.empty(n)
        low, high = self.full_span()  # sums past the range: never cut to the output's
        for row in range(n):
            fmt = FP32 if row % 2 else self.out_fmt
            top = math.frexp(fmt.max_finite)[1] - 1  # np.log2 rounds fp64's largest up to 1024
            negative = bool(self.rng.integers(2))
            if row % 3 == 2:  # the largest elements, scales that carry them past the range
                batch.a[row], batch.b[row] = self.A.max_code, self.B.max_code
                if negative:
                    batch.a[row] = self.A.negate(batch.a[row])
                need = top + 1 - (high + int(np.log2(self.k)))
                batch.scale_a[row] = self.scale.power(need // 2 + int(self.rng.integers(0, 3)))
                batch.scale_b[row] = self.scale.power(need - need // 2)
                continue
            significand = (
                fmt.max_finite
                / 2.0**top
                * (1 - float(self.rng.random()) * 2.0 ** -(fmt.mantissa_bits - 2))
            )
            batch.c[row] = self.c_bits([np.ldexp(significand, top) * (-1 if negative else 1)])[0]
            for position in self.positions(int(self.rng.integers(1, 4))):
                self.set_term(
                    batch,
                    row,
                    int(position),
                    top - int(self.rng.integers(0, fmt.mantissa_bits + 2)),
                    negative,
                )
        return batch

    def partial_overflow(self, n: int) -> Batch:
        """Realistic rows with one block emptied but for two terms of opposite signs, the later
        one or two binades above the earlier, the block's scales carrying the earlier just past
        the range of fp32 (odd rows) or of the output format (even rows): the block's exact sum
        overflows (or stays finite) with the later term's sign, while a tree, step or promotion
        that ends between them takes the earlier alone, overflows with its sign and keeps that
        ±Inf. They show where partial sums are rounded (tree size, promotion, term order) under
        scales at the extremes. Where the scales cannot carry the terms there (no scales,
        UE4M3), the products keep their own size, three binades below the largest."""
        batch = self.realistic(n)
        high = self.full_span()[1]
        for row in range(n):
            fmt = FP32 if row % 2 else self.out_fmt
            top = math.frexp(fmt.max_finite)[1] - 1
            block = int(self.rng.integers(self.blocks))
            start, stop = block * self.block_size, min((block + 1) * self.block_size, self.k)
            if stop - start < 2:
                continue
            batch.a[row, start:stop], batch.b[row, start:stop] = self.A.zero, self.B.zero
            early, late = sorted(
                int(p) for p in start + self.rng.choice(stop - start, 2, replace=False)
            )
            negative = bool(self.rng.integers(2))
            a, b, exponent = self.pair_at(high - 3)  # room for the later term above it
            batch.a[row, early] = self.A.negated(a) if negative else a
            batch.b[row, early] = b
            a, b, _ = self.pair_at(exponent + int(self.rng.integers(1, 3)))
            batch.a[row, late] = a if negative else self.A.negated(a)
            batch.b[row, late] = b
            shift = top + 1 - exponent
            batch.scale_a[row, block] = self.scale.power(shift // 2)
            batch.scale_b[row, block] = self.scale.power(shift - shift // 2)
        return batch

    def product_overflow(self, n: int) -> Batch:
        """A product of 2^(n-1) or 2^n for n an overflow boundary (or anywhere in the 64
        binades below the largest product, when none is reached), beside its negation (an
        exact zero, or NaN from Inf - Inf), a c of its size and the other sign, or a near
        negation: where a product becomes ±Inf."""
        batch = self.empty(n)
        high = self._largest_product_exponent()
        boundaries = self.overflow_boundaries()
        for row in range(n):
            place = self.positions(2)
            negative = bool(self.rng.integers(2))
            target = (
                int(self.rng.choice(boundaries)) - int(self.rng.integers(0, 2))
                if boundaries
                else high - int(self.rng.integers(0, 65))
            )
            exponent = self.set_term(batch, row, int(place[0]), target, negative)
            kind = row % 3
            if kind == 0 and len(place) > 1:
                batch.a[row, place[1]] = self.A.negate(batch.a[row, place[[0]]])[0]
                batch.b[row, place[1]] = batch.b[row, place[0]]
            elif kind == 1:
                batch.c[row] = self.random_c(min(exponent, 127), not negative)
            elif len(place) > 1:
                self.set_term(
                    batch, row, int(place[1]), exponent - int(self.rng.integers(0, 3)), not negative
                )
        return batch

    def special_accumulator(self, n: int) -> Batch:
        """A NaN or ±Inf c, or a NaN or Inf element early in the row (half the rows, where A has
        such codes), then one product of 2^E later in the row, E across every exponent the
        elements' products reach: whether, and from which E up, a NaN or Inf accumulator no
        longer reaches the result (``adder.special_accumulator_exponent``)."""
        batch = self.empty(n)
        specials = self.c_bits([np.nan, np.inf, -np.inf])
        for row in range(n):
            early, late = sorted(int(p) for p in self.positions(2))
            low, high = self.full_span()  # products past a narrow output's range drop it too
            target = int(self.rng.integers(low, high + 1))
            self.set_term(batch, row, late, target, bool(self.rng.integers(2)))
            if row % 2 and self.A.special_codes and early != late:
                batch.a[row, early] = self.rng.choice(self.A.special_codes)
                batch.b[row, early] = self.B.one
            else:
                batch.c[row] = specials[self.rng.integers(len(specials))]
        return batch

    def subnormal_products(self, n: int) -> Batch:
        """A subnormal element of A or B times a large one of the other (a product well inside
        the normal range when the subnormal is read as itself), c zero or of the product's
        size: subnormal elements read as themselves or as zero, whatever the products become."""
        batch = self.empty(n)
        for row in range(n):
            for position in self.positions(int(self.rng.integers(1, 3))):
                small, large = (self.A, self.B) if (row + int(position)) % 2 else (self.B, self.A)
                subnormal = small.codes[np.abs(small.values) < small.fmt.min_normal]
                if not subnormal.size:
                    continue
                big = large.codes[np.abs(large.values) >= large.fmt.max_finite / 16]
                pair = (int(self.rng.choice(subnormal)), int(self.rng.choice(big)))
                a, b = pair if small is self.A else pair[::-1]
                batch.a[row, position], batch.b[row, position] = a, b
            if row % 2:
                value = float(self.A.fmt.decode(batch.a[row]) @ self.B.fmt.decode(batch.b[row]))
                batch.c[row] = fp32_bits_rounded([value * float(self.rng.uniform(-2, 2))])[0]
        return batch

    def c_format_edge(self, n: int) -> Batch:
        """c subnormal in c's format or in its lowest normal binades (a value of the format
        after :meth:`fit_c`), with one to three terms of its size and up to 30 binades below:
        the emin a subnormal c aligns at in the first tree (``inputs.c_format`` under
        ``accumulator_exponent: format_emin``)."""
        batch = self.empty(n)
        fmt = get_format(self.c_format)
        emin = 1 - fmt.bias
        for row in range(n):
            exponent = emin - int(self.rng.integers(-1, fmt.mantissa_bits + 1))
            negative = bool(self.rng.integers(2))
            batch.c[row] = self.random_c(
                exponent, negative, bits=int(self.rng.integers(1, fmt.mantissa_bits + 2))
            )
            for position in self.positions(int(self.rng.integers(1, 4))):
                self.set_term(
                    batch,
                    row,
                    int(position),
                    exponent + int(self.rng.integers(-30, 4)),
                    bool(self.rng.integers(2)),
                )
        return batch
