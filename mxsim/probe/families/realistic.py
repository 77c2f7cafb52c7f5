"""Random data, uniform codes and corners."""

from __future__ import annotations

import numpy as np

from ..draw import Batch, Drawing, random_fields


class RealisticFamilies(Drawing):
    """Random data, uniform codes and corners."""

    def realistic(self, n: int, scaled: bool = True) -> Batch:
        """Gaussian data quantized into each operand format (per-block max to the format's
        largest value, times 2^-U{0..3}), scales near 1, c of the dot's size (a fifth zero)."""
        batch = self.empty(n)
        for operand, out in ((self.A, batch.a), (self.B, batch.b)):
            fmt = operand.fmt
            x = self.rng.standard_normal((n, self.k))
            for start in range(0, self.k, self.block_size):
                block = x[:, start : start + self.block_size]
                peak = np.abs(block).max(axis=1, keepdims=True)
                largest = min(fmt.max_finite, 2.0**16)  # wide formats: moderate magnitudes
                shift = self.rng.integers(0, 4, (n, 1)) + (
                    self.rng.integers(-6, 7, (n, 1)) if largest >= 2**16 else 0
                )
                x[:, start : start + self.block_size] = (
                    block / peak * largest * np.exp2(-shift.astype(float))
                )
            out[:] = fmt.encode(x).astype(np.uint64)
        if scaled:
            batch.scale_a[:] = self.scale.between(self.rng, -4, 4, batch.scale_a.shape)
            batch.scale_b[:] = self.scale.between(self.rng, -4, 4, batch.scale_b.shape)
        typical = (
            np.sqrt(self.k)
            * min(self.A.fmt.max_finite, 2.0**16)
            * min(self.B.fmt.max_finite, 2.0**16)
            / 4
        )
        c = self.rng.standard_normal(n) * typical * np.exp2(self.rng.integers(-8, 3, n))
        c[self.rng.random(n) < 0.2] = 0.0
        batch.c[:] = self.c_bits(np.clip(c, -3e38, 3e38))
        return batch

    def uniform(self, n: int) -> Batch:
        """Uniformly random codes (any code, specials included: the whole dynamic range),
        scales 1 +- 8 binades, c from random fp32 bits or of the dot's size."""
        batch = self.empty(n)
        for operand, out in ((self.A, batch.a), (self.B, batch.b)):
            fmt = operand.fmt
            fields = random_fields(self.rng, fmt.bits - fmt.padding_bits, (n, self.k))
            codes = (fields << fmt.padding_bits).astype(np.uint64)
            if fmt.twos_complement:  # the most negative code has no negation; keep it rare
                codes[self.rng.random(codes.shape) < 0.5] = operand.zero
            out[:] = codes
        batch.scale_a[:] = self.scale.between(self.rng, -8, 8, batch.scale_a.shape)
        batch.scale_b[:] = self.scale.between(self.rng, -8, 8, batch.scale_b.shape)
        batch.c[:] = self.rng.integers(0, 1 << self.c_carrier.bits, n, dtype=np.uint64).astype(
            self.c_code_dtype
        )
        sized = self.rng.random(n) < 0.5
        high = float(self.span()[1])
        with np.errstate(over="ignore"):  # fp64 products reach 2^2046: such a c is +-Inf
            batch.c[sized] = self.c_bits(
                self.rng.standard_normal(int(sized.sum()))
                * np.exp2(high + self.rng.integers(-8, 4, int(sized.sum())))
            )
        return batch

    def corners(self, n: int) -> Batch:
        """Specials and extremes: NaN/Inf/max/min-subnormal elements, signed zeros, NaN and
        extreme scales, special c, sums past the output's range and below its normal range."""
        batch = self.realistic(n)
        special_c = self.c_bits(
            [
                0.0,
                -0.0,
                np.inf,
                -np.inf,
                np.nan,
                3.4028235e38,
                -3.4028235e38,
                1e-45,
                -1e-45,
                1.1754944e-38,
                6.1e-5,
                65504.0,
                65520.0,
                -65536.0,
                *self.c_extremes,
            ]
        )
        for row in range(n):
            kind = row % 8
            place = self.positions(int(self.rng.integers(1, 4)))
            if kind == 0:  # special or extreme elements
                for operand, codes in ((self.A, batch.a), (self.B, batch.b)):
                    pick = operand.special_codes + [
                        operand.max_code,
                        operand.min_code,
                        operand.negated(operand.zero),
                    ]
                    codes[row, place] = self.rng.choice(pick, size=len(place))
            elif kind == 1:  # all zeros, some or all negative: the sign of an exact zero
                batch.a[row] = self.A.zero
                batch.b[row] = self.B.zero
                negative = self.rng.random(self.k) < (0.5 if row % 16 == 1 else 1.0)
                self._negative_zero_products(batch, row, negative)
                batch.c[row] = special_c[int(self.rng.integers(0, 2))]
            elif kind == 2:  # special c
                batch.c[row] = special_c[int(self.rng.integers(len(special_c)))]
            elif kind == 3:  # overflow: the largest elements, large scales
                batch.a[row] = self.A.max_code
                batch.b[row] = self.B.max_code
                if self.rng.integers(2):
                    batch.a[row, place] = self.A.negate(batch.a[row, place])
                batch.scale_a[row] = self.scale.between(self.rng, 23, 127, self.blocks)
                batch.scale_b[row] = self.scale.between(self.rng, 0, 127, self.blocks)
            elif kind == 4 and row % 16 == 4:  # results far below the range: tiny scales
                batch.scale_a[row] = self.scale.between(self.rng, -127, -88, self.blocks)
                batch.scale_b[row] = self.scale.between(self.rng, -127, -88, self.blocks)
                batch.c[row] = special_c[int(self.rng.choice([0, 7, 8, 9]))]
            elif kind == 4:  # results in the output's subnormal range: scales that put them there
                target = (
                    self.out_emin
                    - self.out_fmt.mantissa_bits
                    + int(self.rng.integers(-3, self.out_fmt.mantissa_bits + 4))
                )
                row_exponent = self.span()[1] + int(np.log2(self.k))
                shift = target - row_exponent
                batch.scale_a[row] = self.scale.power(shift // 2)
                batch.scale_b[row] = self.scale.power(shift - shift // 2)
                batch.c[row] = (
                    special_c[int(self.rng.choice([0, 7, 8, 9]))] if self.rng.integers(2) else 0
                )
            elif kind == 5:  # subnormal elements
                batch.a[row, place] = self.A.min_code
                batch.b[row, place] = self.B.min_code if self.rng.integers(2) else self.B.one
                batch.c[row] = 0
            elif kind == 6:  # NaN scale, or a zero scale where the format has one
                zero = self.scale.zero is not None and row % 16 == 14
                batch.scale_a[row, int(self.rng.integers(self.blocks))] = (
                    self.scale.zero if zero else self.scale.nan
                )
            else:  # exact cancellation to zero with c
                self._cancel_row(batch, row)
        return batch
