"""Slow, obviously-correct scalar twin of the format kernels (Python ints and Fractions).

Written from the format definitions, not from the kernels: a code is split into its fields
and valued by the textbook formula; encoding finds the two representable neighbours of the
exact input and applies the rounding rule's definition. Tests compare the kernels with it.
"""

from __future__ import annotations

import bisect
import functools
import math
from fractions import Fraction

from .table import FormatInfo

NAN = float("nan")


def decode_reference(fmt: FormatInfo, code: int) -> Fraction | float:
    """Exact value of ``code``: a Fraction, or a float for NaN, ±Inf and -0.

    ``code`` is a stored code; its ``padding_bits`` low bits must be zero (tf32)."""
    if code & ((1 << fmt.padding_bits) - 1):
        raise ValueError(f"{fmt.name} code {code:#x} has nonzero padding bits")
    code >>= fmt.padding_bits
    width = fmt.bits - fmt.padding_bits
    if fmt.twos_complement:
        integer = code - (1 << width) if code >> (width - 1) else code
        return Fraction(integer) * Fraction(2) ** (1 - fmt.bias - fmt.mantissa_bits)
    sign = (code >> (width - 1)) & 1 if fmt.signed else 0
    exponent_field = (code >> fmt.mantissa_bits) & ((1 << fmt.exponent_bits) - 1)
    mantissa_field = code & ((1 << fmt.mantissa_bits) - 1)
    all_ones_magnitude = (1 << (width - fmt.signed)) - 1
    magnitude_code = code & all_ones_magnitude
    if fmt.specials == "ieee" and exponent_field == (1 << fmt.exponent_bits) - 1:
        if mantissa_field:
            return NAN
        return -math.inf if sign else math.inf
    if fmt.specials == "nan_at_max" and magnitude_code == all_ones_magnitude:
        return NAN
    if fmt.specials == "nan_at_negative_zero" and sign and magnitude_code == 0:
        return NAN
    if fmt.exponent_bits == 0:
        magnitude = Fraction(mantissa_field) * Fraction(2) ** (1 - fmt.bias - fmt.mantissa_bits)
    elif exponent_field == 0 and fmt.subnormals:
        magnitude = Fraction(mantissa_field, 1 << fmt.mantissa_bits) * Fraction(2) ** (1 - fmt.bias)
    else:
        magnitude = (1 + Fraction(mantissa_field, 1 << fmt.mantissa_bits)) * Fraction(2) ** (
            exponent_field - fmt.bias
        )
    if sign and magnitude == 0:
        return -0.0
    return -magnitude if sign else magnitude


@functools.lru_cache(maxsize=None)
def _magnitudes(fmt: FormatInfo) -> tuple[tuple[Fraction, ...], tuple[int, ...]]:
    """Sorted non-negative finite values and their magnitude codes (formats up to 16 bits;
    tuples: kept per format, shared by every caller)."""
    pairs = []
    for code in range(1 << (fmt.bits - fmt.signed)):
        value = decode_reference(fmt, code)  # formats up to 16 bits have no padding
        if isinstance(value, Fraction):
            pairs.append((value, code))
    pairs.sort()
    return tuple(v for v, _ in pairs), tuple(c for _, c in pairs)


def _neighbours(fmt: FormatInfo, magnitude: Fraction, negative: bool):
    """(lower value, its magnitude code, upper value) bracketing ``magnitude``.

    The upper neighbour of the largest finite value continues that binade's spacing, as
    IEEE 754 defines overflow ("as if the exponent range were unbounded").
    """
    if fmt.bits <= 16 and not fmt.padding_bits:
        values, codes = _magnitudes(fmt)
        if fmt.twos_complement and negative and fmt.allow_min_twos_complement:
            values = values + (values[-1] + (values[-1] - values[-2]),)
            codes = codes + (codes[-1] + 1,)
        position = bisect.bisect_right(values, magnitude) - 1
        if position < 0:
            return None, None, values[0]
        low = values[position]
        if position + 1 < len(values):
            return low, codes[position], values[position + 1]
        return low, codes[position], low + (low - values[position - 1])
    # Wide IEEE formats: the binade's spacing from the definition.
    min_exponent = 1 - fmt.bias
    # Within one of floor(log2): exact for values beyond float64's range (fp64 products).
    exponent = (
        magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
        if magnitude
        else min_exponent
    )
    while Fraction(2) ** exponent > magnitude:
        exponent -= 1
    while Fraction(2) ** (exponent + 1) <= magnitude:
        exponent += 1
    exponent = max(exponent, min_exponent)
    spacing = Fraction(2) ** (exponent - fmt.mantissa_bits)
    steps = math.floor(magnitude / spacing)
    low = steps * spacing
    low_code = (exponent - min_exponent) * (1 << fmt.mantissa_bits) + steps
    return low, low_code, low + spacing


def encode_reference(
    fmt: FormatInfo,
    x: float | Fraction,
    rounding: str = "nearest_even",
    overflow: str = "saturate",
    draw32: int = 0,
) -> int:
    """The code of ``x`` under the named rounding mode and overflow policy.

    ``overflow``: ``"saturate"``, ``"inf_nan"`` (IEEE 754) or ``"inf"`` (every overflow
    to ±Inf, NaN where the format has no Inf, whatever the rounding). ``draw32`` is the
    32-bit uniform draw used by stochastic rounding. The code is a stored code: its fields
    shifted left by ``padding_bits``.
    """
    return _encode_fields(fmt, x, rounding, overflow, draw32) << fmt.padding_bits


def _encode_fields(fmt: FormatInfo, x, rounding: str, overflow: str, draw32: int) -> int:
    negative = (math.copysign(1.0, x) < 0) if isinstance(x, float) else x < 0
    width = fmt.bits - fmt.padding_bits
    sign_bit = 1 << (width - 1)
    max_magnitude = fmt.max_index + (
        negative and fmt.twos_complement and fmt.allow_min_twos_complement
    )

    def assemble(magnitude_code: int) -> int:
        if fmt.specials == "nan_at_negative_zero" and magnitude_code == 0:
            return 0  # one unsigned zero: the -0 code is NaN
        if fmt.twos_complement:
            return (-magnitude_code if negative else magnitude_code) % (1 << width)
        if not fmt.signed:
            return nan() if negative and magnitude_code else magnitude_code
        return (sign_bit if negative else 0) | magnitude_code

    def nan() -> int:
        if fmt.specials == "nan_at_negative_zero":
            return sign_bit
        if fmt.specials == "ieee":
            magnitude = (((1 << fmt.exponent_bits) - 1) << fmt.mantissa_bits) | (
                1 << (fmt.mantissa_bits - 1)
            )
        else:
            magnitude = (1 << (width - fmt.signed)) - 1
        return (sign_bit if negative and fmt.signed else 0) | magnitude

    def too_big() -> int:
        finite_side = overflow == "inf_nan" and (
            rounding == "toward_zero"
            or (rounding == "toward_positive" and negative)
            or (rounding == "toward_negative" and not negative)
        )
        if overflow == "saturate" or finite_side or fmt.specials == "none":
            return assemble(max_magnitude)
        if fmt.specials == "ieee":
            return assemble(((1 << fmt.exponent_bits) - 1) << fmt.mantissa_bits)
        return nan()

    if isinstance(x, float) and math.isnan(x):
        return nan()
    if isinstance(x, float) and math.isinf(x):
        if overflow == "saturate" or fmt.specials == "none":
            return assemble(max_magnitude)
        # An infinite input is exact, not an overflow: NaN where the format has no infinity.
        return (
            assemble(((1 << fmt.exponent_bits) - 1) << fmt.mantissa_bits)
            if fmt.specials == "ieee"
            else nan()
        )
    magnitude = abs(Fraction(x))
    if magnitude == 0:
        return 0 if (fmt.twos_complement or not fmt.signed) else assemble(0)
    low, low_code, high = _neighbours(fmt, magnitude, negative)
    if low is None:  # below the smallest value of a format without zero
        return assemble(0)
    if low == magnitude:
        code = low_code
    elif magnitude >= high:  # beyond the top binade's continuation: an overflow in every mode
        return too_big()
    else:
        fraction = (magnitude - low) / (high - low)
        half = Fraction(1, 2)
        up = {
            "nearest_even": fraction > half or (fraction == half and low_code % 2 == 1),
            "nearest_away": fraction >= half,
            "nearest_toward_positive": fraction > half or (fraction == half and not negative),
            "toward_zero": False,
            "toward_positive": not negative,
            "toward_negative": negative,
            "stochastic": math.floor(fraction * 2**32) + draw32 >= 2**32,
        }[rounding]
        code = low_code + up
    if code > max_magnitude or (low_code is not None and low_code > max_magnitude):
        return too_big()
    return assemble(code)


def draw32_reference(seed: int, index: int) -> int:
    """Stochastic rounding's 32-bit draw for element ``index`` (SplitMix64 finaliser)."""
    mask = (1 << 64) - 1
    z = (seed + index * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return (z ^ (z >> 31)) >> 32
