"""The ``corners`` case kind: a fixed, deterministic list of golden inputs built from exact values.

NaN/Inf elements and c, E8M0 0xFF and extreme scales, max normals, subnormal elements, zero
blocks and signed-zero rules, massive cancellation, overflow past the output range, exact
ties (and ties ± a bit far below) at the rounding point of every output binade and of the
subnormal range, and alignment shifts right at the window edge.

Corner labels name the construction (``tie_odd_up_e-3_j5``); tests check the labels' claims
with an exact model. The codes by value, exact product pairs and sums and FP32 bits come from
:mod:`mxsim.exact`, shared with the probe. Block ``0`` carries each corner; other blocks (K > k) hold +0 elements
with scale 2^0.
"""

from __future__ import annotations

import contextlib
from fractions import Fraction

import numpy as np

from ..errors import MxsimError
from ..exact import (
    F32_INF,
    F32_NAN,
    F32_SIGN,
    ProductTable,
    code_book,
    fp32_bits_exact,
    odd_and_exponent,
)
from ..formats import E8M0_NAN, E8M0_ONE, get_format
from ..formats.bits import floor_log2
from .layout import GoldenUnit
from .vectors import VectorSet


class _Rows:
    """Accumulates vectors row by row."""

    def __init__(self, unit: GoldenUnit):
        self.unit = unit
        self.a: list[list[int]] = []
        self.b: list[list[int]] = []
        self.scale_a: list[list[int]] = []
        self.scale_b: list[list[int]] = []
        self.c: list[int] = []
        self.labels: list[str] = []

    def add(self, label: str, a_row, b_row, scale_a, scale_b, c_bits: int) -> None:
        """Add a vector; scales are given as E8M0 codes (powers of two) and re-encoded in the
        unit's scale format, the vector dropped when that format cannot hold one exactly."""
        nb = self.unit.dot_length // self.unit.block_size
        scale_a, scale_b = (self._in_scale_format(_scale_row(s, nb)) for s in (scale_a, scale_b))
        if scale_a is None or scale_b is None:
            return
        self.a.append(list(a_row))
        self.b.append(list(b_row))
        self.scale_a.append(scale_a)
        self.scale_b.append(scale_b)
        self.c.append(int(c_bits) & 0xFFFFFFFF)
        self.labels.append(label)

    def _in_scale_format(self, codes: list[int]) -> list[int] | None:
        if self.unit.power_of_two_scales:
            return codes
        converted = [
            self.unit.scale_nan
            if code == E8M0_NAN
            else self.unit.scale_code_of_power(code - E8M0_ONE)
            for code in codes
        ]
        return None if None in converted else converted

    def vector_set(self) -> VectorSet:
        unit = self.unit
        a_dtype, b_dtype = (
            get_format(unit.a_format).code_dtype,
            get_format(unit.b_format).code_dtype,
        )
        n = len(self.c)
        return VectorSet(
            a=np.array(self.a, dtype=a_dtype).reshape(n, unit.dot_length),
            b=np.array(self.b, dtype=b_dtype).reshape(n, unit.dot_length),
            scale_a=np.array(self.scale_a, dtype=np.uint8).reshape(n, -1) if unit.scaled else None,
            scale_b=np.array(self.scale_b, dtype=np.uint8).reshape(n, -1) if unit.scaled else None,
            c=np.array(self.c, dtype=np.uint32),
            labels=list(self.labels),
        )


def _scale_row(scale, n_blocks: int) -> list[int]:
    if isinstance(scale, (list, tuple)):
        return list(scale)
    return [int(scale)] + [E8M0_ONE] * (n_blocks - 1)


class CornerBuilder:
    """Builds the corner-case list of one unit from exact values (see the module docstring)."""

    def __init__(self, unit: GoldenUnit, rng: np.random.Generator):
        self.unit = unit
        self.rng = rng
        self.A = code_book(unit.a_format)
        self.B = code_book(unit.b_format)
        self.products = ProductTable(self.A, self.B)
        self.k = unit.block_size
        self.K = unit.dot_length
        self.out = get_format(unit.out_format)
        self.rows = _Rows(unit)
        self._split = 0

    # Building blocks -------------------------------------------------------------------
    def pairs_row(self, pairs):
        """A and B rows with ``pairs`` in lanes 0.. of block 0 and +0 elsewhere."""
        a = [self.A.zero] * self.K
        b = [self.B.zero] * self.K
        for lane, (ca, cb) in enumerate(pairs):
            a[lane], b[lane] = ca, cb
        return a, b

    def add_pairs(self, label: str, pairs, scale_a, scale_b, c_bits: int) -> None:
        if len(pairs) > self.k:
            return
        a, b = self.pairs_row(pairs)
        self.rows.add(label, a, b, scale_a, scale_b, c_bits)

    def block_of(self, value: Fraction):
        """(pairs, scale_a, scale_b) whose block 0 is exactly ``value`` (not 0), or None.

        The block is S·2^(quantum + Xa + Xb − 254) with S the realized integer: the smallest
        power-of-two multiple of value's odd part that keeps Xa + Xb ≤ 508. The scale sum is
        split three ways in turn (evenly, mostly on A, mostly on B) to exercise both inputs.
        """
        sign = -1 if value < 0 else 1
        m, t = odd_and_exponent(abs(Fraction(value)))
        base = t - self.products.quantum_exponent + 254
        top = 508 if self.unit.scaled else 254  # a unit without scales works at 2^0
        s = max(0, base - top)
        xs = base - s
        if xs < 0 or not self.unit.scaled and xs != 254:
            return None
        pairs = self.products.realize(m << s, self.k)
        if pairs is None:
            return None
        if sign < 0:
            pairs = [(self.A.negate(ca), cb) for ca, cb in pairs]
        self._split = (self._split + 1) % 3
        if self._split == 0:
            sa = xs - xs // 2
        elif self._split == 1:
            sa = min(xs, 254)
        else:
            sa = xs - min(xs, 254)
        return pairs, sa, xs - sa

    def add_value(self, label: str, block: Fraction, c_bits: int) -> bool:
        """Add a vector whose block 0 is exactly ``block``; False (nothing added) if unrealizable."""
        if block == 0:
            self.rows.add(label, *self.pairs_row([]), E8M0_ONE, E8M0_ONE, c_bits)
            return True
        found = self.block_of(block)
        if found is None:
            return False
        pairs, sa, sb = found
        self.add_pairs(label, pairs, sa, sb, c_bits)
        return True

    def scales(self, *pairs):
        """The (scale_a, scale_b) pairs a family should use: all, or 2^0 alone for unscaled units."""
        return list(pairs) if self.unit.scaled else [(E8M0_ONE, E8M0_ONE)]

    def ulp(self, e: int) -> Fraction:
        """Spacing of output values in binade e (subnormal spacing below emin)."""
        emin = 1 - self.out.bias
        return Fraction(2) ** (max(e, emin) - self.out.mantissa_bits)

    @property
    def out_max(self) -> Fraction:
        return Fraction(self.out.max_finite)

    # Families --------------------------------------------------------------------------
    def specials(self) -> None:
        A, B = self.A, self.B
        one = (A.one, B.one)
        for sa, sb, tag in (
            (E8M0_NAN, E8M0_ONE, "a"),
            (E8M0_ONE, E8M0_NAN, "b"),
            (E8M0_NAN, E8M0_NAN, "both"),
        ):
            if not self.unit.scaled:
                break
            self.add_pairs(f"nan_scale_{tag}", [one] * self.k, sa, sb, 0)
            self.add_pairs(f"nan_scale_{tag}_zero_block", [], sa, sb, 0)
            self.add_pairs(f"nan_scale_{tag}_inf_c", [one], sa, sb, F32_INF)
            self.add_pairs(f"nan_scale_{tag}_neg_zero_c", [], sa, sb, F32_SIGN)
        if self.unit.scaled and self.unit.n_blocks > 1:
            last = [E8M0_ONE] * (self.unit.n_blocks - 1) + [E8M0_NAN]
            self.add_pairs("nan_scale_a_last_block", [one], last, E8M0_ONE, 0)
            self.add_pairs("nan_scale_b_last_block", [one], E8M0_ONE, last, 0)
        for bits in (F32_NAN, 0x7F800001, 0xFFC00000, 0x7FFFFFFF, 0xFFFFFFFF):
            self.add_pairs(f"nan_c_{bits:08x}", [one] * 3, E8M0_ONE, E8M0_ONE, bits)
        self.add_pairs("nan_c_zero_block", [], E8M0_ONE, E8M0_ONE, F32_NAN)
        for sign, tag in ((0, "pos"), (F32_SIGN, "neg")):
            self.add_pairs(f"inf_c_{tag}", [one] * 4, E8M0_ONE, E8M0_ONE, F32_INF | sign)
            self.add_pairs(f"inf_c_{tag}_zero_block", [], E8M0_ONE, E8M0_ONE, F32_INF | sign)
            big = (A.max, B.max) if sign else (A.negate(A.max), B.max)  # block of the other sign
            for sa, sb in self.scales((254, 254)):
                self.add_pairs(
                    f"inf_c_{tag}_vs_huge_opposite_block", [big] * self.k, sa, sb, F32_INF | sign
                )
        for book, other, operand in ((A, B, "a"), (B, A, "b")):

            def pair(x, y):
                return (x, y) if operand == "a" else (y, x)

            for nan in book.nans[:1] + book.nans[-1:]:
                self.add_pairs(
                    f"nan_element_{operand}_{nan:x}_lane0",
                    [pair(nan, other.one)],
                    E8M0_ONE,
                    E8M0_ONE,
                    0,
                )
                pairs = [pair(book.one, other.one)] * (self.k - 1) + [pair(nan, other.zero)]
                self.add_pairs(
                    f"nan_element_{operand}_{nan:x}_times_zero_last_lane",
                    pairs,
                    E8M0_ONE,
                    E8M0_ONE,
                    0,
                )
            if book.positive_inf is None:
                continue
            pinf, ninf = book.positive_inf, book.negative_inf
            self.add_pairs(
                f"inf_element_{operand}_pos", [pair(pinf, other.one)], E8M0_ONE, E8M0_ONE, 0
            )
            self.add_pairs(
                f"inf_element_{operand}_neg", [pair(ninf, other.one)], E8M0_ONE, E8M0_ONE, 0
            )
            for sa, sb in self.scales((0, 0)):
                self.add_pairs(
                    f"inf_element_{operand}_tiny_scale", [pair(pinf, other.min_positive)], sa, sb, 0
                )
            self.add_pairs(
                f"inf_element_{operand}_times_zero", [pair(pinf, other.zero)], E8M0_ONE, E8M0_ONE, 0
            )
            self.add_pairs(
                f"inf_element_{operand}_pos_and_neg",
                [pair(pinf, other.one), pair(ninf, other.one)],
                E8M0_ONE,
                E8M0_ONE,
                0,
            )
            self.add_pairs(
                f"inf_element_{operand}_vs_neg_inf_c",
                [pair(pinf, other.one)],
                E8M0_ONE,
                E8M0_ONE,
                F32_INF | F32_SIGN,
            )
            self.add_pairs(
                f"inf_element_{operand}_with_pos_inf_c",
                [pair(pinf, other.one)],
                E8M0_ONE,
                E8M0_ONE,
                F32_INF,
            )
            if self.unit.scaled:
                self.add_pairs(
                    f"inf_element_{operand}_nan_scale",
                    [pair(pinf, other.one)],
                    E8M0_NAN,
                    E8M0_ONE,
                    0,
                )

    def scale_extremes(self) -> None:
        if not self.unit.scaled:
            return
        A, B = self.A, self.B
        patterns = {
            "one": [(A.one, B.one)],
            "all_max": [(A.max, B.max)] * self.k,
            "all_neg_max": [(A.negate(A.max), B.max)] * self.k,
            "min_positive": [(A.min_positive, B.min_positive)],
        }
        scales = [
            (0, 0),
            (0, 1),
            (1, 0),
            (0, 127),
            (127, 0),
            (0, 254),
            (254, 0),
            (127, 127),
            (253, 254),
            (254, 254),
        ]
        for sa, sb in scales:
            for name, pairs in patterns.items():
                for c_name, c_bits in (("zero_c", 0), ("one_c", fp32_bits_exact(1))):
                    self.add_pairs(f"scale_{sa}_{sb}_{name}_{c_name}", pairs, sa, sb, c_bits)

    def max_normals(self) -> None:
        A, B = self.A, self.B
        top = (A.max, B.max)
        neg = (A.negate(A.max), B.max)
        alternating = [top if lane % 2 == 0 else neg for lane in range(self.k - self.k % 2)]
        fmax = fp32_bits_exact(Fraction(get_format("fp32").max_finite))
        self.add_pairs("max_all_lanes_pos", [top] * self.k, E8M0_ONE, E8M0_ONE, 0)
        self.add_pairs("max_all_lanes_neg", [neg] * self.k, E8M0_ONE, E8M0_ONE, 0)
        self.add_pairs("max_alternating_signs_cancel", alternating, E8M0_ONE, E8M0_ONE, 0)
        self.add_pairs(
            "max_alternating_signs_cancel_neg_zero_c", alternating, E8M0_ONE, E8M0_ONE, F32_SIGN
        )
        self.add_pairs("max_all_lanes_c_fp32_max", [top] * self.k, E8M0_ONE, E8M0_ONE, fmax)
        self.add_pairs(
            "max_all_lanes_neg_c_neg_fp32_max", [neg] * self.k, E8M0_ONE, E8M0_ONE, fmax | F32_SIGN
        )
        self.add_pairs("max_a_times_one", [(A.max, B.one)] * self.k, E8M0_ONE, E8M0_ONE, 0)
        self.add_pairs("one_times_max_b", [(A.one, B.max)] * self.k, E8M0_ONE, E8M0_ONE, 0)

    def element_subnormals(self) -> None:
        A, B = self.A, self.B
        a_sub = A.subnormals or (A.min_positive,)
        b_sub = B.subnormals or (B.min_positive,)
        if not (A.subnormals or B.subnormals):
            return
        patterns = {
            "min_sub_x_min_sub": (a_sub[0], b_sub[0]),
            "max_sub_x_max_sub": (a_sub[-1], b_sub[-1]),
            "min_sub_x_max": (a_sub[0], B.max),
            "max_x_min_sub": (A.max, b_sub[0]),
        }
        for name, (ca, cb) in patterns.items():
            for sa, sb in self.scales((127, 127), (0, 0), (20, 20), (254, 254)):
                self.add_pairs(f"subnormal_{name}_scale_{sa}_{sb}", [(ca, cb)] * self.k, sa, sb, 0)
                self.add_pairs(
                    f"subnormal_{name}_neg_scale_{sa}_{sb}",
                    [(A.negate(ca), cb)] * self.k,
                    sa,
                    sb,
                    F32_SIGN,
                )

    def zeros(self) -> None:
        A, B = self.A, self.B
        k = self.k
        pos = (A.zero, B.zero)
        self.add_pairs("zero_block_pos_zero_c", [], E8M0_ONE, E8M0_ONE, 0)
        self.add_pairs("zero_block_neg_zero_c", [], E8M0_ONE, E8M0_ONE, F32_SIGN)
        self.add_pairs(
            "zero_block_c_one_and_half", [], E8M0_ONE, E8M0_ONE, fp32_bits_exact(Fraction(3, 2))
        )
        self.add_pairs("zero_block_c_neg_min_subnormal", [], E8M0_ONE, E8M0_ONE, 0x80000001)
        neg_one_b = B.negate(B.one)
        zero_neg = (A.zero, neg_one_b)  # +0 × −1 = −0
        self.add_pairs("neg_zero_products_neg_zero_c", [zero_neg] * k, E8M0_ONE, E8M0_ONE, F32_SIGN)
        self.add_pairs("neg_zero_products_pos_zero_c", [zero_neg] * k, E8M0_ONE, E8M0_ONE, 0)
        self.add_pairs(
            "neg_zero_products_but_one_pos_zero_neg_zero_c",
            [zero_neg] * (k - 1) + [pos],
            E8M0_ONE,
            E8M0_ONE,
            F32_SIGN,
        )
        for sa, sb in self.scales((0, 0), (254, 254)):
            self.add_pairs(
                f"neg_zero_products_scale_{sa}_{sb}_neg_zero_c", [zero_neg] * k, sa, sb, F32_SIGN
            )
        if A.negative_zero is not None:
            nz_pos = (A.negative_zero, B.zero)  # −0 × +0 = −0
            self.add_pairs(
                "neg_zero_a_products_neg_zero_c", [nz_pos] * k, E8M0_ONE, E8M0_ONE, F32_SIGN
            )
            if B.negative_zero is not None:
                self.add_pairs(
                    "neg_zero_times_neg_zero_products_neg_zero_c",  # (−0)(−0) = +0
                    [(A.negative_zero, B.negative_zero)] * k,
                    E8M0_ONE,
                    E8M0_ONE,
                    F32_SIGN,
                )
        if self.K > k:  # −0 products in block 0, +0 × +0 in the other blocks
            self.add_pairs(
                "neg_zero_block0_only_neg_zero_c", [zero_neg] * k, E8M0_ONE, E8M0_ONE, F32_SIGN
            )

    def _largest_exact_block(self) -> tuple[tuple[int, int], Fraction]:
        """(A code, B code) of the largest product whose k-lane block sum at scale 2^0 is an
        FP32 value, and that sum: max x max, unless (fp16 x bf16) it is beyond FP32."""
        q = Fraction(2) ** self.products.quantum_exponent
        for units in reversed(self.products.units):
            block = units * self.k * q
            with contextlib.suppress(MxsimError):
                fp32_bits_exact(block)
                if units == self.products.units[-1]:
                    return (self.A.max, self.B.max), block
                return self.products.pair[units], block
        # Unreachable for the formats golden accepts: their smallest products' blocks are FP32 values.
        raise MxsimError(
            f"golden: no product of {self.A.fmt.name} x {self.B.fmt.name} sums to an FP32 block"
        )

    def cancellation(self) -> None:
        A, B = self.A, self.B
        top, block = self._largest_exact_block()  # all lanes top at scale 2^0 sum to block
        neg = (A.negate(top[0]), top[1])
        half = self.k // 2
        self.add_pairs(
            "cancel_block_vs_c_exact", [top] * self.k, E8M0_ONE, E8M0_ONE, fp32_bits_exact(-block)
        )
        self.add_pairs(
            "cancel_block_vs_c_exact_neg",
            [neg] * self.k,
            E8M0_ONE,
            E8M0_ONE,
            fp32_bits_exact(block),
        )
        e = floor_log2(block)
        for delta_bits in (1, 2, 11, 23):
            tiny = Fraction(2) ** (e - delta_bits)
            for sign_name, sign in (("plus", 1), ("minus", -1)):
                c_value = -block + sign * tiny
                try:
                    c_bits = fp32_bits_exact(c_value)
                except MxsimError:
                    continue
                self.add_pairs(
                    f"cancel_block_vs_c_{sign_name}_2^-{delta_bits}",
                    [top] * self.k,
                    E8M0_ONE,
                    E8M0_ONE,
                    c_bits,
                )
        if half:
            inner = [top, neg] * (half - 1)
            tiny_pair = (A.min_positive, B.min_positive)
            for sa, sb in self.scales((127, 127), (200, 200), (30, 30)):
                self.add_pairs(
                    f"cancel_inside_block_leaves_min_product_scale_{sa}_{sb}",
                    inner + [tiny_pair],
                    sa,
                    sb,
                    0,
                )
            self.add_pairs(
                "cancel_inside_block_exact_zero_neg_zero_c",
                [top, neg] * half,
                E8M0_ONE,
                E8M0_ONE,
                F32_SIGN,
            )
        # c removes every leading bit of the block but the last: the result 2^e needs a long
        # normalisation shift after the subtraction.
        for j in range(1, 13):
            for e in (0, -140):  # a normal and a subnormal result
                lsb = Fraction(2) ** e
                found = self.block_of((2**j + 1) * lsb)
                if found is None:
                    continue
                pairs, sa, sb = found
                self.add_pairs(
                    f"cancel_long_2^{j}+1_minus_2^{j}_e{e}",
                    pairs,
                    sa,
                    sb,
                    fp32_bits_exact(-(2**j) * lsb),
                )
                self.add_pairs(
                    f"cancel_long_neg_2^{j}+1_plus_2^{j}_e{e}",
                    [(A.negate(ca), cb) for ca, cb in pairs],
                    sa,
                    sb,
                    fp32_bits_exact((2**j) * lsb),
                )

    def overflow(self) -> None:
        A, B = self.A, self.B
        out_max = self.out_max
        emax = self.out.emax
        ulp = self.ulp(emax)
        half = ulp / 2
        max_bits = fp32_bits_exact(out_max)
        for sign, tag in ((1, "pos"), (-1, "neg")):
            c_bits = max_bits | (F32_SIGN if sign < 0 else 0)
            self.add_value(f"overflow_max_plus_half_ulp_tie_{tag}", sign * half, c_bits)
            self.add_value(f"overflow_max_plus_ulp_{tag}", sign * ulp, c_bits)
            for j in (1, 8):
                self.add_value(
                    f"overflow_max_plus_half_ulp_minus_2^-{j}_{tag}",
                    sign * (half - half / 2**j),
                    c_bits,
                )
            self.add_value(f"overflow_max_minus_half_ulp_{tag}", -sign * half, c_bits)
            # A block far above the output range, cancelled by c = ∓max: 2^(emax+1) − max = ulp is finite.
            for i in range(1, 6):
                self.add_value(
                    f"overflow_block_2^{emax + i}_vs_c_minus_max_{tag}",
                    sign * Fraction(2) ** (emax + i),
                    max_bits | (F32_SIGN if sign > 0 else 0),
                )
                self.add_value(
                    f"overflow_block_2^{emax + i}_zero_c_{tag}", sign * Fraction(2) ** (emax + i), 0
                )
        if self.unit.scaled:
            q = Fraction(2) ** self.products.quantum_exponent
            block = (
                self.products.units[-1] * self.k * q
            )  # all lanes max × max: the largest block sum
            threshold = out_max + half  # at or above rounds to Inf
            xs = 0
            while block * Fraction(2) ** (xs - 254) < threshold and xs < 508:
                xs += 1
            for x in sorted({max(xs - 2, 0), max(xs - 1, 0), xs, min(xs + 1, 508), 508}):
                sa = min(x, 254)
                self.add_pairs(
                    f"overflow_all_max_block_scale_sum_{x}",
                    [(A.max, B.max)] * self.k,
                    sa,
                    x - sa,
                    0,
                )
                self.add_pairs(
                    f"overflow_all_neg_max_block_scale_sum_{x}",
                    [(A.negate(A.max), B.max)] * self.k,
                    sa,
                    x - sa,
                    0,
                )

    def ties(self) -> None:
        """Exact ties, and ties ± 2^-j of a half ulp, at the rounding point of every output binade."""
        mbits = self.out.mantissa_bits
        emin, emax = 1 - self.out.bias, self.out.emax
        depths = (1, 2, 3, 5, 8, 11)
        for index, e in enumerate(range(emin, emax + 1)):
            ulp = self.ulp(e)
            half = ulp / 2
            j = depths[index % len(depths)]
            sign = -1 if index % 2 else 1
            m_even = (1 << mbits) + 2 * int(self.rng.integers(0, 1 << (mbits - 1)))
            m_odd = m_even + 1
            variants = (
                ("even_down", m_even, half),
                ("odd_up", m_odd, half),
                ("even_plus_tiny_up", m_even, half + half / 2**j),
                ("odd_minus_tiny_down", m_odd, half - half / 2**j),
            )
            for name, m, delta in variants:
                self.add_value(
                    f"tie_{name}_e{e}_j{j}", sign * delta, fp32_bits_exact(sign * m * ulp)
                )
            if e in (emin, 0, emax - 1):  # odd top mantissa: the tie carries into the next binade
                top = (1 << (mbits + 1)) - 1
                self.add_value(
                    f"tie_carry_to_next_binade_e{e}", sign * half, fp32_bits_exact(sign * top * ulp)
                )
        # Subnormal range: one fixed spacing; c = M ulp with M across the range, j reaching
        # far below the half ulp (below any internal sticky cut two or three bits down).
        ulp = self.ulp(emin - 1)
        half = ulp / 2
        sub_depths = (1, 2, 3, 4, 6, 10, 12)
        ms = (
            0,
            1,
            2,
            3,
            (1 << (mbits - 1)) - 1,
            1 << (mbits - 1),
            (1 << mbits) - 2,
            (1 << mbits) - 1,
        )
        for index, m in enumerate(ms):
            j = sub_depths[index % len(sub_depths)]
            for sign, tag in ((1, "pos"), (-1, "neg")):
                c_bits = fp32_bits_exact(sign * m * ulp) if m else (F32_SIGN if sign < 0 else 0)
                self.add_value(f"tie_subnormal_m{m}_plus_half_{tag}", sign * half, c_bits)
                self.add_value(
                    f"tie_subnormal_m{m}_plus_half_plus_tiny_j{j}_{tag}",
                    sign * (half + half / 2**j),
                    c_bits,
                )
                self.add_value(
                    f"tie_subnormal_m{m}_plus_half_minus_tiny_j{j}_{tag}",
                    sign * (half - half / 2**j),
                    c_bits,
                )
                self.add_value(f"tie_subnormal_m{m}_minus_half_{tag}", -sign * half, c_bits)
                for deep in (3, 5, 9):  # half + a bit 3..9 places below it: only a sticky bit knows
                    self.add_value(
                        f"tie_subnormal_m{m}_plus_half_plus_2^-{deep}_{tag}",
                        sign * (half + half / 2**deep),
                        c_bits,
                    )

    def alignment(self) -> None:
        """Shifts around the window edge: the unit's alignment window, else the output precision."""
        precision = self.out.mantissa_bits + 1
        window = self.unit.align_fraction_bits or precision
        shifts = sorted(
            {
                s
                for s in (
                    window - 2,
                    window - 1,
                    window,
                    window + 1,
                    window + 2,
                    window + 3,
                    precision - 1,
                    precision,
                    precision + 1,
                    precision + 2,
                    2 * window,
                    3 * window + 7,
                )
                if s > 0
            }
        )
        emin = 1 - self.out.bias
        for d in shifts:
            for e0 in (0, emin + 3):
                big = Fraction(2) ** e0
                tiny = Fraction(2) ** (e0 - d)
                sticky = tiny + tiny / 8
                odd_big = big * Fraction(3, 2)
                self.add_value(f"align_c_2^{e0}_minus_2^-{d}", -tiny, fp32_bits_exact(big))
                self.add_value(f"align_c_2^{e0}_plus_2^-{d}", tiny, fp32_bits_exact(big))
                self.add_value(f"align_c_2^{e0}_minus_2^-{d}_sticky", -sticky, fp32_bits_exact(big))
                self.add_value(
                    f"align_c_1.5x2^{e0}_plus_2^-{d}_sticky", sticky, fp32_bits_exact(odd_big)
                )
                # Reversed: the block is large and c lies d binades below it.
                try:
                    c_tiny, c_neg = fp32_bits_exact(tiny), fp32_bits_exact(-sticky)
                except MxsimError:
                    continue
                self.add_value(f"align_block_2^{e0}_c_2^-{d}", big, c_tiny)
                self.add_value(f"align_block_2^{e0}_c_minus_2^-{d}_sticky", big, c_neg)
        # Products of one block far apart: the largest next to the smallest, and pairs
        # whose exponents differ by the window ± 1 where the formats reach that far.
        A, B = self.A, self.B
        spread = [(A.max, B.max), (A.min_positive, B.min_positive)]
        self.add_pairs("align_widest_product_spread", spread, E8M0_ONE, E8M0_ONE, 0)
        self.add_pairs(
            "align_widest_product_spread_neg",
            [(A.negate(A.max), B.max), spread[1]],
            E8M0_ONE,
            E8M0_ONE,
            0,
        )
        largest = self.products.units[-1]
        for d in (window - 1, window, window + 1):
            small = Fraction(largest, 2**d)
            if small.denominator != 1 or int(small) not in self.products.pair:
                continue
            pairs = [self.products.pair[largest], self.products.pair[int(small)]]
            self.add_pairs(f"align_products_{d}_apart", pairs, E8M0_ONE, E8M0_ONE, 0)

    def build(self) -> VectorSet:
        self.specials()
        self.scale_extremes()
        self.max_normals()
        self.element_subnormals()
        self.zeros()
        self.cancellation()
        self.overflow()
        self.ties()
        self.alignment()
        return self.rows.vector_set()


#: Element formats up to this width get the full corner list (built from a table of every
#: code); wider ones (fp32, fp64) the value-built list of :func:`wide_corner_cases`.
CODE_BOOK_MAX_BITS = 16


def corner_cases(unit: GoldenUnit, count: int | None, rng: np.random.Generator) -> VectorSet:
    """The corner-case vectors of ``unit`` (``count`` is ignored: the list is fixed).

    For a unit without scales only the constructions reachable at scale 2^0 are made.
    """
    if max(get_format(unit.a_format).bits, get_format(unit.b_format).bits) > CODE_BOOK_MAX_BITS:
        return wide_corner_cases(unit)
    if unit.c_format != "fp32":
        raise MxsimError(
            f"golden: the corner list of {unit.pair_name} is built around an FP32 c; {unit.config_name} "
            f"takes {unit.c_format} c: use the random kind"
        )
    return CornerBuilder(unit, rng).build()


def wide_corner_cases(unit: GoldenUnit) -> VectorSet:
    """The corners of a unit whose element codes are too many to tabulate (fp32, fp64), built
    from values in lane 0 (and 1) of block 0, every other lane +0 (-0 x +0 in the ``zero_*neg``
    cases), scales 2^0: signed zeros (``zero_*``: -0 only when every addend is -0, also after a
    product that underflows to -0, as an IEEE FMA chain keeps it), cancellation, NaN/Inf elements and c, overflow of the largest values, subnormal
    elements, and ties at the output's rounding point around c = 1."""
    fa, fb, fc, out = (
        get_format(n) for n in (unit.a_format, unit.b_format, unit.c_format, unit.out_format)
    )
    tiny_a, tiny_b = fa.min_subnormal, fb.min_subnormal
    half_ulp = 2.0 ** -(out.mantissa_bits + 1)  # of 1.0 in the output format
    inf, nan = float("inf"), float("nan")
    cases = [  # (label, A lane values, B lane values, c); lanes not given are +0 (x +0)
        ("zero_all_pos_c_pos", [0.0], [0.0], 0.0),
        ("zero_all_c_neg", [-0.0, -0.0], [1.0, 1.0], -0.0),
        ("zero_neg_products_c_pos", [-0.0], [1.0], 0.0),
        ("zero_one_pos_product_c_neg", [0.0], [1.0], -0.0),
        ("zero_all_neg", [-0.0], [1.0], -0.0),
        ("zero_underflow_then_neg", [-tiny_a, -0.0], [0.125, 1.0], 0.0),
        ("zero_underflow_pos_then_neg", [tiny_a, -0.0], [0.125, 1.0], -0.0),
        ("cancel_products_c_neg_zero", [1.5, -1.5], [1.0, 1.0], -0.0),
        ("cancel_c", [1.5], [1.0], -1.5),
        ("cancel_c_leaves_tiny", [1.0, tiny_a], [1.0, 1.0], -1.0),
        ("nan_element", [nan], [1.0], 0.0),
        ("inf_times_zero", [inf], [0.0], 0.0),
        ("inf_minus_inf", [inf, -inf], [1.0, 1.0], 0.0),
        ("inf_element", [-inf], [2.0], 1.0),
        ("nan_c", [1.0], [1.0], nan),
        ("inf_c", [1.0], [1.0], inf),
        ("inf_c_against_inf", [inf], [1.0], -inf),
        ("max_times_two", [fa.max_finite], [2.0], 0.0),
        ("max_times_max", [-fa.max_finite], [fb.max_finite], 0.0),
        ("max_c_plus_max", [fa.max_finite], [1.0], fc.max_finite),
        ("subnormal_elements", [tiny_a, -tiny_a], [1.0, 0.5], 0.0),
        ("subnormal_product", [tiny_a], [tiny_b], 0.0),
        ("tie_even_down", [half_ulp], [1.0], 1.0),
        ("tie_odd_up", [half_ulp], [1.0], 1.0 + 2 * half_ulp),
        ("tie_plus_tiny_up", [half_ulp, tiny_a], [1.0, 1.0], 1.0),
        ("tie_minus_tiny_down", [half_ulp, -tiny_a], [1.0, 1.0], 1.0 + 2 * half_ulp),
    ]
    K = unit.dot_length
    cases = [case for case in cases if len(case[1]) <= K]
    a_values = np.zeros((len(cases), K))
    b_values = np.zeros((len(cases), K))
    for row, (label, a_lanes, b_lanes, _) in enumerate(cases):
        if label.startswith("zero_") and label.endswith("neg"):  # every other product -0 too
            a_values[row] = -0.0
        a_values[row, : len(a_lanes)] = a_lanes
        b_values[row, : len(b_lanes)] = b_lanes
    c = np.array([case[3] for case in cases])
    with np.errstate(over="ignore"):
        a, b = fa.encode(a_values, overflow="inf_nan"), fb.encode(b_values, overflow="inf_nan")
        c_bits = fc.encode(c, overflow="inf_nan").astype(fc.code_dtype)
    scales = (
        np.full((len(cases), unit.n_blocks), unit.scale_one, dtype=np.uint8)
        if unit.scaled
        else None
    )
    return VectorSet(
        a.astype(fa.code_dtype),
        b.astype(fb.code_dtype),
        scales,
        None if scales is None else scales.copy(),
        c_bits,
        labels=[case[0] for case in cases],
    )
