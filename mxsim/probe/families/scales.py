"""Scales: where they enter, their format, group sums and a fixed-point grid."""

from __future__ import annotations

import numpy as np

from ..draw import Batch, Drawing, SHARED_SCALE_CODES


class ScalesFamilies(Drawing):
    """Scales: where they enter, their format, group sums and a fixed-point grid."""

    def scales(self, n: int) -> Batch:
        """Realistic rows with scales spread over the scale format's range (tiny, huge, NaN
        scales), B's near the reciprocal of A's."""
        batch = self.realistic(n)
        shape = batch.scale_a.shape
        batch.scale_a[:] = self.rng.choice(self.scale.codes, size=shape)
        value = self.scale.fmt.decode(batch.scale_a.astype(np.uint64))
        exponent = -np.floor(np.log2(np.where(value > 0, value, 1.0))).astype(np.int64)
        batch.scale_b[:] = self.scale.power(exponent + self.rng.integers(-40, 41, shape))
        batch.scale_a[self.rng.random(shape) < 0.05] = self.scale.nan
        batch.c[self.rng.random(n) < 0.5] = 0
        return batch

    def scale_formats(self, n: int) -> Batch:
        """Realistic rows whose scale codes are finite both as E8M0 and as UE4M3 (written before
        the probe knows which the unit reads), c zero in half the rows: whether scales matter,
        where they enter, and their format."""
        batch = self.realistic(n, scaled=False)
        for scales in (batch.scale_a, batch.scale_b):
            scales[:] = self.rng.choice(SHARED_SCALE_CODES, size=scales.shape)
        batch.c[self.rng.random(n) < 0.5] = 0
        return batch

    def groups(self, n: int) -> Batch:
        """Terms of mixed signs in one block, below the window's anchor (a c of one significant
        bit, or another block's scale over one product) by the window held (``window``; 0..60
        binades when it is null), so that the window cuts through their low bits: one cut of a
        group's exact sum differs from one per product, and an anchor at a binade boundary lets
        a result rounded toward zero show it. Every third row with another block has that
        block's products cancel exactly, which keeps its scale the anchor."""
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            block = int(self.rng.integers(self.blocks))
            members = np.arange(block * self.block_size, min((block + 1) * self.block_size, self.k))
            place = self.rng.choice(
                members, size=min(len(members), int(self.rng.integers(2, 7))), replace=False
            )
            top = int(self.rng.integers(max(low, high - 4), high + 1))
            negative = bool(self.rng.integers(2))
            for position in place:  # mostly of the anchor's other sign
                self.set_term(
                    batch,
                    row,
                    int(position),
                    top - int(self.rng.integers(0, 4)),
                    bool(self.rng.random() < 0.7) != negative,
                )
            gap = (
                int(self.rng.integers(0, 61))
                if self.window is None
                else self.window + top - int(self.rng.integers(0, 6))
            )
            others = [j for j in range(self.blocks) if j != block]
            if others and row % 2:  # another block's scale sets the anchor
                other = int(self.rng.choice(others))
                width = min(self.block_size, self.k - other * self.block_size)
                position = other * self.block_size + int(self.rng.integers(width))
                a, b, got = self.pair_at(
                    int(self.rng.integers(low, high + 1))
                )  # its leading bit: anywhere
                if negative:
                    a = self.A.negated(a)
                batch.a[row, position], batch.b[row, position] = a, b
                if (
                    row % 3 == 0 and width > 1
                ):  # its products cancel: the anchor is its scale, not its sum
                    twin = (
                        other * self.block_size + (position - other * self.block_size + 1) % width
                    )
                    batch.a[row, twin], batch.b[row, twin] = self.A.negated(a), b
                batch.scale_a[row, other] = self.scale.power(gap)
            else:
                batch.c[row] = self.c_bits(
                    [np.ldexp(-1.0 if negative else 1.0, int(np.clip(gap, -126, 127)))]
                )[0]
        return batch

    def grid(self, n: int) -> Batch:
        """c 0..150 binades above or below the products, and products that sum to exactly zero
        beside a c far above or below them: a fixed-point grid's reach for the accumulator."""
        batch = self.empty(n)
        low, high = self.span()
        for row in range(n):
            top = int(self.rng.integers(low, high + 1))
            if row % 3 == 0:  # an exact zero sum
                a, b, top = self.pair_at(top)
                place = self.positions(2)
                batch.a[row, place[0]], batch.b[row, place[0]] = a, b
                batch.a[row, place[1]] = self.A.negated(a)
                batch.b[row, place[1]] = b
            else:
                top = max(
                    self.set_term(
                        batch,
                        row,
                        int(p),
                        top - int(self.rng.integers(0, 8)),
                        bool(self.rng.integers(2)),
                    )
                    for p in self.positions(int(self.rng.integers(1, 4)))
                )
            gap = int(self.rng.integers(-150, 151))
            batch.c[row] = self.random_c(
                int(np.clip(top + gap, -140, 126)),
                bool(self.rng.integers(2)),
                bits=int(self.rng.choice([1, 8, 24])),
            )
        return batch
