"""Zeros: exact-zero and underflowing results, and the sign they carry."""

from __future__ import annotations

import numpy as np

from ..draw import Batch, Drawing, FP32


class ZerosFamilies(Drawing):
    """Zeros: exact-zero and underflowing results, and the sign they carry."""

    def zero_results(self, n: int) -> Batch:
        """Results that are exactly zero: all products +-0 with c = +-0, a product cancelled
        by c or by its negation (c = -0 beside it), and negative sums that underflow the
        output (scales or c that put them far below its range): the sign of a zero."""
        batch = self.empty(n)
        for row in range(n):
            kind = row % 4
            if kind == 0:  # signed zero elements only
                self._negative_zero_products(batch, row, self.rng.random(self.k) < 0.5)
                batch.c[row] = self.c_bits([-0.0 if self.rng.integers(2) else 0.0])[0]
            elif kind == 1:  # a product and c = -product
                low, high = self.span()
                a, b, _ = self.pair_at(int(self.rng.integers(low, high + 1)))
                place = int(self.rng.integers(self.k))
                batch.a[row, place], batch.b[row, place] = a, b
                value = float(
                    self.A.fmt.decode(np.array([a], np.uint64))[0]
                    * self.B.fmt.decode(np.array([b], np.uint64))[0]
                )
                batch.c[row] = self.c_bits([-value])[0]
            elif kind == 2:  # a product and its negation, c = -0
                self._cancel_row(batch, row)
                batch.c[row] = self.c_bits([-0.0])[0]
            else:  # a tiny negative result: below the output's smallest subnormal
                target = self.out_emin - self.out_fmt.mantissa_bits - int(self.rng.integers(1, 4))
                low, high = self.span()
                exponent = self.set_term(
                    batch,
                    row,
                    int(self.rng.integers(self.k)),
                    int(np.clip(target, low, high)),
                    True,
                )
                if exponent > target:  # the elements cannot reach it: c alone is the result
                    batch.a[row], batch.b[row] = self.A.zero, self.B.zero
                    batch.c[row] = self.c_bits([-np.ldexp(1.0, max(target, self.c_min_exponent))])[
                        0
                    ]
        return batch

    def zero_chains(self, n: int) -> Batch:
        """Chains whose early step leaves a zero that later steps of -0 products meet: three
        rows in four put a negative product below a quarter of the smallest subnormal of fp32,
        of c's carrier and of the output (the smallest A element times an element of 2^-3 or
        less, scales making up what the elements cannot reach) in the first half, which a
        step rounds to -0; the fourth cancels a * 1 with -a * 1 (a of 2^-60..2^60, which a
        step holds exactly) in the first two positions (+0). Every other product is -0 and c is +-0: an accumulator that signs each
        step's zero (``zero_sign: ieee_steps``) keeps the -0, the whole sum's rule gives +0."""
        batch = self.empty(n)
        batch.b[:] = self.B.one  # -0 * 1 (or +0 * -0 where only B has a -0)
        self._negative_zero_products(batch, slice(None), slice(None))
        batch.c[:] = self.c_bits(np.where(self.rng.random(n) < 0.5, -0.0, 0.0))
        tiny_a, a_exponent = self._smallest_code(self.A)
        below = min(FP32, self.c_carrier, self.out_fmt, key=lambda fmt: fmt.min_subnormal)
        target = int(np.log2(below.min_subnormal)) - 2
        # elements of 2^-60 .. 2^60: a step holds each exactly (one is the smallest when none is)
        moderate = self.A.codes[np.abs(np.log2(np.abs(self.A.values))) <= 60]
        moderate = moderate if moderate.size else self.A.codes[[np.argmin(np.abs(self.A.values))]]
        for row in range(n):
            position = 0 if row % 2 else int(self.rng.integers(max(1, self.k // 2)))
            if row % 4 == 3:  # exact cancellation to +0 in the first two steps: a * 1 and -a * 1
                a = int(self.rng.choice(moderate))
                batch.a[row, :2] = [a, self.A.negated(a)][: self.k]
                batch.b[row, :2] = self.B.one
                continue
            b, b_exponent = self._smallest_code(self.B, largest=-3, rng=self.rng)
            batch.a[row, position] = self.A.negated(tiny_a)
            batch.b[row, position] = b
            shortfall = target - (a_exponent + b_exponent)
            if (
                shortfall < 0
            ):  # the block's scales take the product down (a unit without scales ignores them)
                block = position // self.block_size
                batch.scale_a[row, block] = self.scale.power(shortfall // 2)
                got = int(
                    np.log2(
                        self.scale.fmt.decode(
                            batch.scale_a[row, block : block + 1].astype(np.uint64)
                        )[0]
                    )
                )
                batch.scale_b[row, block] = self.scale.power(shortfall - got)
        return batch

    def scaled_zeros(self, n: int) -> Batch:
        """Elements +0 only, c = -0, and one block's scales putting its trees' scale exponent X
        anywhere in -150..0, each value once in every 151 rows (the other blocks' scales 1).
        Each tree's products sum to exactly zero: a fixed-point grid whose last place 2^(X-n)
        lies more than its accumulator_max_right_shift places above the zero accumulator's
        passes the -0 through, else the sum is +0, so the sign shows n + that shift. Random
        rows meet such scales only in corners, and where the products are exact on any grid of
        a few bits (E2M3, E3M2) nothing else shows it (mxdotp-rmm E2M3 x E2M3 -> bf16, E3M2 x E3M2 -> fp32)."""
        batch = self.empty(n)
        blocks = self.rng.integers(self.blocks, size=n)
        # Each X once before any twice (a shuffled sweep): the sign flips at one X, which
        # uniform draws leave a few places unseen on either side.
        sweeps = -(-n // 151)
        exponents = np.concatenate([self.rng.permutation(151) for _ in range(sweeps)])[:n] - 150
        batch.scale_a[np.arange(n), blocks] = self.scale.power(exponents // 2)
        batch.scale_b[np.arange(n), blocks] = self.scale.power(exponents - exponents // 2)
        batch.c[:] = self.c_bits([-0.0])[0]
        return batch

    def flushed_results(self, n: int) -> Batch:
        """c just inside fp32's normal range and 1-2 terms of the other sign a little smaller:
        results at and below the smallest normal, negative in half the rows (a flushed or
        rounded-away result keeps or loses its sign), or subnormal c alone."""
        batch = self.empty(n)
        emin = 1 - FP32.bias
        for row in range(n):
            negative = bool(self.rng.integers(2))
            exponent = emin + int(self.rng.integers(0, 4))
            if row % 4 == 3:  # a subnormal c alone: read as a zero of its sign or as +0
                batch.c[row] = self.random_c(emin - int(self.rng.integers(1, 20)), negative, bits=1)
                continue
            batch.c[row] = self.random_c(exponent, negative, bits=int(self.rng.choice([1, 8, 24])))
            for position in self.positions(int(self.rng.integers(1, 3))):
                self.set_term(
                    batch, row, int(position), exponent - int(self.rng.integers(0, 3)), not negative
                )
        return batch
