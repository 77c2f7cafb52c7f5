"""Cancellation and trees: which terms meet where, and what survives a cancellation."""

from __future__ import annotations

import math

import numpy as np

from ...exact import fp32_bits_rounded
from ..draw import _powers_of_two, Batch, Drawing, FP32


class SumsFamilies(Drawing):
    """Cancellation and trees: which terms meet where, and what survives a cancellation."""

    def cancellation(self, n: int) -> Batch:
        """A product and its exact negation (or a near negation) and 1-4 small terms 0..60
        binades below them (0..2p+8 for a c or output of p > 24 significant bits: fp64's
        106-bit products): what survives shows the window width and how bits below it go."""
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            place = self.positions(6)
            top = int(self.rng.integers(max(low, high - 8), high + 1))
            a, b, top = self.pair_at(top)
            batch.a[row, place[0]], batch.b[row, place[0]] = a, b
            batch.a[row, place[1]] = self.A.negated(a)
            batch.b[row, place[1]] = b
            if row % 4 == 3:  # near negation: b's neighbouring code
                batch.b[row, place[1]] = b ^ np.uint64(1 << self.B.fmt.padding_bits)
            for i in range(2, 2 + int(self.rng.integers(1, 5))):
                if i < len(place):
                    self.set_term(
                        batch,
                        row,
                        place[i],
                        top - int(self.rng.integers(0, self.reach)),
                        bool(self.rng.integers(2)),
                    )
            if row % 3 == 2:
                batch.c[row] = self.random_c(
                    top - int(self.rng.integers(0, self.reach)), bool(self.rng.integers(2))
                )
        return batch

    def trees(self, n: int) -> Batch:
        """A product B at one position, -B at another, a small term at a third (and sometimes
        c = B): which terms share a tree, and in what order trees meet the accumulator."""
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            place = self.positions(4)
            top = int(self.rng.integers(max(low, high - 6), high + 1))
            a, b, top = self.pair_at(top)
            batch.a[row, place[0]], batch.b[row, place[0]] = a, b
            if row % 3 == 0:
                batch.c[row] = int(
                    self.c_bits(
                        [
                            -(
                                self.A.fmt.decode(np.array([a], np.uint64))[0]
                                * self.B.fmt.decode(np.array([b], np.uint64))[0]
                            )
                        ]
                    )[0]
                )
            else:
                batch.a[row, place[1]] = self.A.negated(a)
                batch.b[row, place[1]] = b
                if (
                    row % 6 == 1
                ):  # a full-precision c below B: rounded with B in the accumulator unless B cancels first
                    batch.c[row] = self.random_c(
                        top - int(self.rng.integers(1, 13)), bool(self.rng.integers(2))
                    )
            gap = int(self.rng.integers(4, 30))
            if len(place) > 2:  # K = 2: B and -B alone
                self.set_term(batch, row, place[2], top - gap, bool(self.rng.integers(2)))
            if row % 2 and len(place) > 3:
                self.set_term(
                    batch,
                    row,
                    place[3],
                    top - int(self.rng.integers(4, 30)),
                    bool(self.rng.integers(2)),
                )
        return batch

    def sum_cancel(self, n: int) -> Batch:
        """A tree's sum cancelled by c down to its low bits: a term of 2^top and 2-5 of either
        sign 1 to the window held (24 when null) binades below it, in one aligned run of 4..32
        positions (one tree for every tree size of a power of two at least the run), and c the
        negated exact sum rounded to 5-10 significant bits, so that what is left is the sum's
        low bits: a tree sum rounded to fewer bits than the terms span shows even in a narrow
        output."""
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            size = min(1 << int(self.rng.integers(2, 6)), self.k)
            start = int(self.rng.integers(0, self.k // size)) * size
            place = self.rng.permutation(np.arange(start, start + size))[
                : int(self.rng.integers(3, 7))
            ]
            reach = max(1, min(self.window if self.window is not None else 24, high - low))
            top = int(self.rng.integers(min(high, low + reach), high + 1))
            self.set_term(batch, row, int(place[0]), top, bool(self.rng.integers(2)))
            for position in place[1:]:
                self.set_term(
                    batch,
                    row,
                    int(position),
                    top - int(self.rng.integers(1, reach + 1)),
                    bool(self.rng.integers(2)),
                )
            blocks = np.arange(self.k) // self.block_size
            scales = (
                self.scale.fmt.decode(batch.scale_a[row].astype(np.uint64))[blocks]
                * self.scale.fmt.decode(batch.scale_b[row].astype(np.uint64))[blocks]
            )
            total = float(
                np.sum(self.A.fmt.decode(batch.a[row]) * self.B.fmt.decode(batch.b[row]) * scales)
            )
            if total and math.isfinite(total):
                step = 2.0 ** (math.floor(math.log2(abs(total))) - int(self.rng.integers(4, 10)))
                batch.c[row] = self.c_bits([-round(total / step) * step])[0]
        return batch

    def pair_trees(self, n: int) -> Batch:
        """B, -B and a term 8..40 binades smaller at three positions of one aligned run of 2^j
        positions (or B and -B in a run of 2, the small term anywhere): which pairs a balanced
        tree of rounded adds sums first, against a chain or a fused tree (a small term added to
        B before -B is lost to the rounding, added to B - B = 0 it stays)."""
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            size = 1 << int(self.rng.integers(1, max(2, self.k.bit_length())))
            size = min(size, 1 << (self.k.bit_length() - 1))
            start = int(self.rng.integers(0, self.k // size)) * size
            run = self.rng.permutation(np.arange(start, start + size))
            if size < 2:  # K = 1
                place = [int(p) for p in self.positions(3)]
            else:
                place = (
                    [int(p) for p in run[:3]]
                    if size >= 4
                    else [*map(int, run[:2]), int(self.rng.integers(self.k))]
                )
            if place[2] in place[:2]:
                place = place[:2]
            a, b, top = self.pair_at(
                int(np.clip(self.rng.integers(-8, 9), low, high))
            )  # inside every float's range
            batch.a[row, place[0]], batch.b[row, place[0]] = a, b
            batch.a[row, place[1]], batch.b[row, place[1]] = self.A.negated(a), b
            if len(place) == 3:
                self.set_term(
                    batch,
                    row,
                    place[2],
                    top - int(self.rng.integers(8, 41)),
                    bool(self.rng.integers(2)),
                )
            if row % 4 == 3:
                batch.c[row] = self.random_c(
                    top - int(self.rng.integers(8, 41)), bool(self.rng.integers(2))
                )
        return batch

    def accumulator_entry(self, n: int) -> Batch:
        """c far above or below the products, or cancelling one: where c enters."""
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            terms = self.positions(int(self.rng.integers(1, 5)))
            exponents = [
                self.set_term(
                    batch, row, p, int(self.rng.integers(low, high + 1)), bool(self.rng.integers(2))
                )
                for p in terms
            ]
            gap = int(self.rng.integers(-40, 41))
            batch.c[row] = self.random_c(
                max(exponents) + gap,
                bool(self.rng.integers(2)),
                bits=int(self.rng.choice([1, 8, 24])),
            )
        return batch

    def subnormal_accumulator(self, n: int) -> Batch:
        """c subnormal in fp32 or in the output format, with terms of its size and a little
        above or below it: the exponent a subnormal accumulator aligns with."""
        batch = self.empty(n)
        for row in range(n):
            fmt = FP32 if row % 2 else self.out_fmt
            emin = 1 - fmt.bias
            exponent = emin - int(self.rng.integers(1, fmt.mantissa_bits + 1))
            bits = max(1, exponent - (emin - fmt.mantissa_bits) + 1)
            batch.c[row] = self.random_c(
                exponent, bool(self.rng.integers(2)), bits=min(bits, self.c_precision)
            )
            for position in self.positions(int(self.rng.integers(1, 4))):
                self.set_term(
                    batch,
                    row,
                    int(position),
                    exponent + int(self.rng.integers(-30, 8)),
                    bool(self.rng.integers(2)),
                )
        return batch

    def tiny_terms(self, n: int) -> Batch:
        """One to three terms far below 1 (2^-200 .. 2^0), zero products beside them and c = +-0
        or tiny: whether zeros take part in the alignment reference, and where."""
        batch = self.empty(n)
        for row in range(n):
            exponent = int(self.rng.integers(-200, 1))
            for position in self.positions(int(self.rng.integers(1, 4))):
                self.set_term(
                    batch,
                    row,
                    int(position),
                    exponent - int(self.rng.integers(0, 30)),
                    bool(self.rng.integers(2)),
                )
            if row % 3 == 0:
                batch.c[row] = self.random_c(
                    exponent - int(self.rng.integers(-10, 30)), bool(self.rng.integers(2))
                )
            elif row % 3 == 1:
                batch.c[row] = self.c_bits([-0.0])[0]
        return batch

    def zero_anchor(self, n: int) -> Batch:
        """c = +-0 beside a power-of-two term in the output's subnormal range or just above
        (its block's scales carry it there) and, in another block where there is one, a term of
        the other sign a window below a random anchor at or above the large term: where zero
        terms (c, zero products, all-zero groups) pull the reference up to that anchor or
        above, the window drops the small term; else it stays, and the sum rounded toward zero
        is one step lower. Scaled units meet such references only through tiny scales (E8M0
        group sums, whose zero groups count at 2^-139 in MMA-Sim's model)."""
        batch = self.empty(n)
        lowest = self.out_emin - self.out_fmt.mantissa_bits
        powers = (_powers_of_two(self.A), _powers_of_two(self.B))
        for row in range(n):
            top = int(self.rng.integers(lowest, self.out_emin + 2))
            negative = bool(self.rng.integers(2))
            first = int(self.rng.integers(min(self.block_size, self.k)))
            self.set_term(
                batch, row, first, top, negative, pair=self._nearest_power_pair(powers, top)
            )
            others = [j for j in range(self.blocks) if j != first // self.block_size]
            if others:
                block = int(self.rng.choice(others))
                position = block * self.block_size + int(
                    self.rng.integers(min(self.block_size, self.k - block * self.block_size))
                )
            else:
                position = (
                    (first + 1 + int(self.rng.integers(self.k - 1))) % self.k
                    if self.k > 1
                    else first
                )
            anchor = int(
                self.rng.integers(top, self.out_emin + 3)
            )  # a zero term there or above cuts the small term
            window = self.window if self.window is not None else int(self.rng.integers(20, 41))
            gap = top - anchor + window + int(self.rng.integers(0, 3))
            if position != first:
                self.set_term(batch, row, position, top - gap, not negative)
            batch.c[row] = fp32_bits_rounded([-0.0 if row % 2 else 0.0])[0]
        return batch
