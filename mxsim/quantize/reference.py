"""Slow reference twin of MX block quantization, written from the definitions with Fractions.

One block at a time: amax as an exact Fraction, its binary exponent found by comparison
with powers of two, the scale rule applied as stated in ``QuantOptions``, and each element
``x / 2^X`` rounded by :func:`mxsim.formats.reference.encode_reference`.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..formats import FormatInfo
from ..formats.bits import floor_log2
from ..formats.reference import decode_reference, draw32_reference, encode_reference
from .options import QuantOptions

NAN_SCALE = None


# Largest binade (exponent of the largest finite value) of each input float width.
INPUT_MAX_EXPONENT = {16: 15, 32: 127, 64: 1023}


def even_fraction_bits(fmt: FormatInfo, options: QuantOptions) -> int:
    """p of the even rule: the option's override, else the fraction bits of fmt's top binade."""
    top_step = Fraction(fmt.max_finite) - Fraction(float(decode_reference(fmt, fmt.max_index - 1)))
    return dict(options.even_fraction_bits).get(
        fmt.name, floor_log2(Fraction(2) ** fmt.scale_emax / top_step)
    )


def even_rounds_to_inf(
    amax: Fraction, fmt: FormatInfo, options: QuantOptions, input_bits: int
) -> bool:
    """Whether the even rule's rounded amax (half-up to p fraction bits) leaves the input's range."""
    top = Fraction(2) ** INPUT_MAX_EXPONENT[input_bits]
    return options.scale_rule == "even" and amax >= top * (
        2 - Fraction(1, 2 ** (even_fraction_bits(fmt, options) + 1))
    )


def float32_reference(value: Fraction) -> float:
    """value rounded to float32 (nearest-even), as a float; via float64, which is exact enough
    for one quotient of two float32 values (double rounding is innocuous there)."""
    return float(np.float32(float(value)))


def scale_exponent_reference(
    amax: Fraction, fmt: FormatInfo, options: QuantOptions, input_bits: int = 32
) -> int:
    """X = E - emax for a positive amax under the options' rule and exponent source."""
    rule = options.scale_rule
    e = floor_log2(amax)
    if options.exponent_source == "log2" and rule == "rceil":
        # ceil(log2(amax / max_finite)), quotient and log2 each rounded to the input precision.
        descale = amax / Fraction(fmt.max_finite)
        if input_bits <= 32:
            descale = Fraction(float32_reference(descale))
        if descale == 0:
            return -150  # log2(0) = -inf, taken as one below any float32's exponent
        log2_value = math.log2(descale)
        if input_bits <= 32:
            log2_value = float(np.float32(log2_value))
        return math.ceil(log2_value)
    if options.exponent_source == "log2" and rule in ("floor", "ceil"):
        # log2 as a float library computes it: the real log2 rounded to the input precision.
        log2_value = math.log2(amax)
        if input_bits <= 32:
            log2_value = float(np.float32(log2_value))
        return (
            math.floor(log2_value) if rule == "floor" else math.ceil(log2_value)
        ) - fmt.scale_emax
    input_min_exponent = -126 if input_bits == 32 else (-14 if input_bits == 16 else -1022)
    if options.exponent_source == "field" and e < input_min_exponent:
        return input_min_exponent - 1 - fmt.scale_emax
    m = amax / Fraction(2) ** e
    bump = {
        "floor": False,
        "ceil": m > 1,
        "even": rule == "even"
        and m >= 2 - Fraction(1, 2 ** (even_fraction_bits(fmt, options) + 1)),
        "rceil": m > Fraction(fmt.max_finite) / Fraction(2) ** fmt.scale_emax,
    }[rule]
    return e + bump - fmt.scale_emax


def quantize_block_reference(
    block: list[float],
    fmt: FormatInfo,
    options: QuantOptions,
    first_index: int = 0,
    input_bits: int = 32,
):
    """(scale exponent or None for a NaN scale, element codes) of one block.

    ``first_index`` is the flat index of the block's first element (stochastic draws);
    ``input_bits`` the width of the input float (the ``log2``/``field`` sources read it).
    """
    has_nan = any(math.isnan(x) for x in block)
    has_inf = any(math.isinf(x) for x in block)
    if (has_nan and options.nonfinite != "propagate") or (
        has_inf and options.nonfinite == "nan_block"
    ):
        return NAN_SCALE, [0] * len(block)
    amax = max((abs(Fraction(x)) for x in block if math.isfinite(x)), default=Fraction(0))
    if options.nonfinite != "propagate" and even_rounds_to_inf(amax, fmt, options, input_bits):
        has_inf = True  # the rounded amax is the input format's Inf
        if options.nonfinite in ("nan_block", "raise"):
            return NAN_SCALE, [0] * len(block)
    if has_inf and options.nonfinite == "inf_scale_max":
        exponent = 127
    elif has_inf and options.nonfinite == "inf_field":
        # Inf's exponent field (all ones) minus the bias: 2^128 for float32.
        exponent = INPUT_MAX_EXPONENT[input_bits] + 1 - fmt.scale_emax
    elif amax == 0:
        exponent = -127
    else:
        exponent = scale_exponent_reference(amax, fmt, options, input_bits)
    if options.scale_underflow == "clamp":
        exponent = max(exponent, -127)
    elif options.scale_underflow == "unclamped_eps" and exponent < -149:
        exponent = -23
    if options.int8_min_step_exponent is not None and fmt.twos_complement:
        # INT8's step is 2^X times its smallest value; raise X until the step reaches 2^k.
        exponent = max(
            exponent, options.int8_min_step_exponent - floor_log2(Fraction(fmt.min_subnormal))
        )
    if exponent > 127:
        if options.scale_overflow == "nan":
            return NAN_SCALE, [0] * len(block)
        exponent = 127
    element_exponent = exponent
    if exponent == -127 and options.min_scale_element_exponent is not None:
        element_exponent = options.min_scale_element_exponent
    codes = []
    for i, x in enumerate(block):
        scaled = (
            x
            if not math.isfinite(x)
            else (
                math.copysign(0.0, x) if x == 0 else Fraction(x) / Fraction(2) ** element_exponent
            )
        )
        draw = (
            draw32_reference(options.seed, first_index + i)
            if options.element_rounding == "stochastic"
            else 0
        )
        codes.append(
            encode_reference(fmt, scaled, options.element_rounding, options.element_overflow, draw)
        )
    return exponent, codes


@np.errstate(over="ignore")  # float32 overflow to ±Inf is a step of the recipe
def quantize_nvfp4_reference(
    row: list[float],
    tensor_scale: float | None,
    element: FormatInfo,
    scale: FormatInfo,
    scale_rounding: str = "nearest_even",
    element_rounding: str = "nearest_even",
    scale_code: int | None = None,
):
    """One NVFP4 block (finite or ±Inf float32 values) as (scale code, element codes), from the
    steps of :mod:`mxsim.quantize.nvfp4` with each float32 operation an exact Fraction rounded
    by :func:`float32_reference`; ``scale_code`` (a nonzero, non-NaN code) replaces step 2's
    choice, as :func:`mxsim.quantize.quantize_nvfp4_at_scales` does."""
    e_max = Fraction(element.max_finite)
    amax = max((abs(Fraction(x)) for x in row if math.isfinite(x)), default=Fraction(0))
    infinite = any(math.isinf(x) for x in row)
    top, bottom = Fraction(scale.max_finite), Fraction(scale.min_normal)
    descale: Fraction | float = (
        top  # an Inf amax: Inf / 6 (/ t) is Inf, clamped to the scale's largest value
    )
    if not infinite:
        descale = float32_reference(amax / e_max)
        if tensor_scale is not None:
            descale = float32_reference(
                Fraction(descale) / Fraction(tensor_scale)
            )  # may overflow to Inf
    if scale_code is None:
        scale_code = encode_reference(scale, min(max(descale, bottom), top), scale_rounding)
    scale_value = Fraction(decode_reference(scale, scale_code))
    if tensor_scale is None:
        reciprocal = Fraction(float32_reference(1 / scale_value))
    else:
        reciprocal = Fraction(
            float32_reference(Fraction(float32_reference(1 / Fraction(tensor_scale))) / scale_value)
        )
    codes = []
    for x in row:
        # fl(x * r), which may overflow to ±Inf, clamped to ±max_E; a zero keeps x's sign
        y: Fraction | float = (
            math.copysign(math.inf, x)
            if math.isinf(x)
            else float32_reference(Fraction(x) * reciprocal)
        )
        y = min(max(y, -e_max), e_max)
        if y == 0:
            y = math.copysign(0.0, x)
        codes.append(encode_reference(element, y, element_rounding))
    return scale_code, codes
