"""Numba kernels: exact encode and decode for any format of the table.

Kernels take plain arrays and scalars. A format reaches them as an int64 parameter vector
(``FormatInfo.kernel_params``) indexed by the ``P_*`` constants below, so one compiled
kernel serves every format: there are no per-format code paths.

Encoding works in "magnitude index" space: for sign-magnitude formats the index of a
non-negative value is exactly its code without the sign bit, and consecutive indices are
consecutive representable magnitudes. Rounding therefore picks between index ``q`` and
``q + 1``, and "ties to even" looks at the parity of ``q`` — the code's last bit, as IEEE
754 defines evenness (this matters for E8M0, which has no mantissa).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .._compile import NO_REFCOUNTS, generic_calls, watch_compiles

watch_compiles()  # every kernel module imports this one: the compile notice starts here

# Indices into the parameter vector built by FormatInfo.kernel_params.
P_BITS = 0
P_EXPONENT_BITS = 1
P_MANTISSA_BITS = 2
P_BIAS = 3
P_SIGNED = 4
P_TWOS_COMPLEMENT = 5
P_SPECIALS = 6
P_SUBNORMALS = 7
P_MAX_INDEX = 8
P_MAX_INDEX_NEGATIVE = 9
P_EMAX = 10
N_PARAMS = 11

SPECIALS_NONE = 0
SPECIALS_IEEE = 1  # top exponent reserved: Inf (mantissa 0) and NaN
SPECIALS_NAN_AT_MAX = 2  # only the all-ones magnitude is NaN (fp8_e4m3, e8m0)
SPECIALS_NAN_AT_NEGATIVE_ZERO = 3  # the code of -0 is the one NaN; no -0, no Inf (the fnuz formats)

ROUND_NEAREST_EVEN = 0
ROUND_NEAREST_AWAY = 1
ROUND_TOWARD_ZERO = 2
ROUND_TOWARD_POSITIVE = 3
ROUND_TOWARD_NEGATIVE = 4
ROUND_STOCHASTIC = 5
ROUND_NEAREST_TOWARD_POSITIVE = 6

OVERFLOW_SATURATE = 0
OVERFLOW_INF_NAN = 1  # IEEE 754 overflow (see rounding.OVERFLOW_POLICIES)
OVERFLOW_INF = 2  # ±Inf whatever the rounding direction

# Classes returned by decompose().
CLASS_FINITE = 0
CLASS_ZERO = 1
CLASS_INF = 2
CLASS_NAN = 3


@njit(cache=True, inline="always")
def power_of_two(exponent):
    """2^exponent as a float64 built from its bits (exponent in -1022..1023; faster than ldexp)."""
    return np.uint64((exponent + 1023) << 52).view(np.float64)


@njit(cache=True, inline="always")
def scale_by_power_of_two(value, exponent):
    """value * 2^exponent, exact when the result is a normal float64 (ldexp for the rest)."""
    if -1022 <= exponent <= 1023:
        return value * power_of_two(exponent)
    return math.ldexp(value, exponent)


@njit(cache=True, inline="always")
def random32(seed, index):
    """32 uniform bits from (seed, index): SplitMix64 finaliser, counter-based."""
    z = np.uint64(seed) + np.uint64(index) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.int64(z >> np.uint64(32))


@generic_calls
@njit(cache=True, **NO_REFCOUNTS)
def decompose(bits, in_exponent_bits, in_mantissa_bits):
    """Split IEEE binary bits into (class, sign, significand, lsb_exponent, floor_log2).

    The value is (-1)^sign * significand * 2^lsb_exponent exactly; floor_log2 is the
    exponent of its leading bit. Works for binary16/32/64 given their field widths.
    """
    b = np.uint64(bits)
    total = 1 + in_exponent_bits + in_mantissa_bits
    sign = np.int64((b >> np.uint64(total - 1)) & np.uint64(1))
    exponent_field = np.int64(
        (b >> np.uint64(in_mantissa_bits)) & np.uint64((1 << in_exponent_bits) - 1)
    )
    fraction = np.int64(b & np.uint64((1 << in_mantissa_bits) - 1))
    bias = (1 << (in_exponent_bits - 1)) - 1
    if exponent_field == (1 << in_exponent_bits) - 1:
        if fraction == 0:
            return CLASS_INF, sign, np.int64(0), np.int64(0), np.int64(0)
        return CLASS_NAN, sign, np.int64(0), np.int64(0), np.int64(0)
    if exponent_field == 0:
        if fraction == 0:
            return CLASS_ZERO, sign, np.int64(0), np.int64(0), np.int64(0)
        lsb_exponent = np.int64(1 - bias - in_mantissa_bits)
        leading = in_mantissa_bits - 1
        while (fraction >> leading) == 0:
            leading -= 1
        return CLASS_FINITE, sign, fraction, lsb_exponent, lsb_exponent + leading
    significand = fraction | (np.int64(1) << in_mantissa_bits)
    lsb_exponent = np.int64(exponent_field - bias - in_mantissa_bits)
    return CLASS_FINITE, sign, significand, lsb_exponent, lsb_exponent + in_mantissa_bits


@generic_calls
@njit(cache=True, **NO_REFCOUNTS)
def nan_code(sign, params):
    """The canonical NaN code (quiet NaN for IEEE-like formats), keeping the sign."""
    bits = params[P_BITS]
    mantissa_bits = params[P_MANTISSA_BITS]
    if params[P_SPECIALS] == SPECIALS_IEEE:
        magnitude = (((1 << params[P_EXPONENT_BITS]) - 1) << mantissa_bits) | (
            1 << (mantissa_bits - 1)
        )
    elif params[P_SPECIALS] == SPECIALS_NAN_AT_NEGATIVE_ZERO:
        return np.int64(1) << (bits - 1)
    else:
        magnitude = (1 << (bits - params[P_SIGNED])) - 1
    if params[P_SIGNED]:
        return (sign << (bits - 1)) | magnitude
    return magnitude


@njit(cache=True, **NO_REFCOUNTS)
def magnitude_to_code(sign, magnitude_index, params):
    """Assemble a code from a sign and a magnitude index."""
    bits = params[P_BITS]
    if params[P_TWOS_COMPLEMENT]:
        value = -magnitude_index if sign else magnitude_index
        return value & ((1 << bits) - 1)
    if magnitude_index == 0 and params[P_SPECIALS] == SPECIALS_NAN_AT_NEGATIVE_ZERO:
        return np.int64(0)  # zero has no sign (the -0 code is NaN)
    if params[P_SIGNED]:
        return (sign << (bits - 1)) | magnitude_index
    if sign and magnitude_index != 0:
        return nan_code(0, params)  # unsigned formats (E8M0) have no negative values
    return magnitude_index


@njit(cache=True, **NO_REFCOUNTS)
def overflow_code(sign, rounding, overflow, params):
    """Code for a result whose magnitude is above the largest finite value."""
    max_index = params[P_MAX_INDEX_NEGATIVE] if sign else params[P_MAX_INDEX]
    if overflow == OVERFLOW_SATURATE:
        return magnitude_to_code(sign, max_index, params)
    toward_finite = overflow == OVERFLOW_INF_NAN and (
        rounding == ROUND_TOWARD_ZERO
        or (rounding == ROUND_TOWARD_POSITIVE and sign == 1)
        or (rounding == ROUND_TOWARD_NEGATIVE and sign == 0)
    )
    if toward_finite or params[P_SPECIALS] == SPECIALS_NONE:
        return magnitude_to_code(sign, max_index, params)
    if params[P_SPECIALS] == SPECIALS_IEEE:
        return magnitude_to_code(
            sign, ((1 << params[P_EXPONENT_BITS]) - 1) << params[P_MANTISSA_BITS], params
        )
    return nan_code(sign, params)


@njit(cache=True, **NO_REFCOUNTS)
def round_up(rounding, sign, odd, below_half, tie, inexact, fraction32, draw32):
    """Whether to step from the lower neighbour to the upper one (magnitudes)."""
    if not inexact:
        return False
    if rounding == ROUND_NEAREST_EVEN:
        return (not below_half) and ((not tie) or odd)
    if rounding == ROUND_NEAREST_AWAY:
        return not below_half
    if rounding == ROUND_NEAREST_TOWARD_POSITIVE:
        return (not below_half) and ((not tie) or sign == 0)
    if rounding == ROUND_TOWARD_ZERO:
        return False
    if rounding == ROUND_TOWARD_POSITIVE:
        return sign == 0
    if rounding == ROUND_TOWARD_NEGATIVE:
        return sign == 1
    return fraction32 + draw32 >= (np.int64(1) << 32)  # stochastic


@generic_calls
@njit(cache=True)
def encode_finite(sign, significand, lsb_exponent, floor_log2, params, rounding, overflow, draw32):
    """Code of the exact nonzero value (-1)^sign * significand * 2^lsb_exponent.

    ``significand`` < 2^63; ``floor_log2`` is the exponent of its leading bit.
    """
    exponent_bits = params[P_EXPONENT_BITS]
    mantissa_bits = params[P_MANTISSA_BITS]
    bias = params[P_BIAS]
    if floor_log2 > params[P_EMAX]:
        return overflow_code(sign, rounding, overflow, params)
    if exponent_bits == 0:  # fixed point: one quantum everywhere
        quantum_exponent = 1 - bias - mantissa_bits
        index_offset = np.int64(0)
    else:
        min_exponent = 1 - bias if params[P_SUBNORMALS] else -bias
        if floor_log2 < min_exponent and not params[P_SUBNORMALS]:
            # Below the smallest value of a format without zero or subnormals (E8M0):
            # the smallest value is the only candidate.
            return magnitude_to_code(sign, np.int64(0), params)
        binade = max(floor_log2, min_exponent)
        quantum_exponent = binade - mantissa_bits
        # Index of the binade's first value: 0 for the subnormal binade of IEEE-like formats.
        index_offset = np.int64(binade + bias - 1) << mantissa_bits
    shift = quantum_exponent - lsb_exponent
    below_half = True
    tie = False
    inexact = False
    fraction32 = np.int64(0)
    if shift <= 0:
        quotient = significand << (-shift)
    elif shift > 63:  # the whole significand (< 2^63) lies below half a quantum
        quotient = np.int64(0)
        inexact = True
        fraction32 = significand >> (shift - 32) if shift - 32 < 63 else np.int64(0)
    else:
        quotient = significand >> shift
        remainder = significand - (quotient << shift)
        inexact = remainder != 0
        half = np.int64(1) << (shift - 1)
        below_half = remainder < half
        tie = remainder == half
        fraction32 = remainder << (32 - shift) if shift <= 32 else remainder >> (shift - 32)
    magnitude_index = quotient + index_offset
    if round_up(rounding, sign, magnitude_index & 1, below_half, tie, inexact, fraction32, draw32):
        magnitude_index += 1
    max_index = params[P_MAX_INDEX_NEGATIVE] if sign else params[P_MAX_INDEX]
    if magnitude_index > max_index:
        return overflow_code(sign, rounding, overflow, params)
    return magnitude_to_code(sign, magnitude_index, params)


@generic_calls
@njit(cache=True, **NO_REFCOUNTS)
def encode_bits(
    bits, in_exponent_bits, in_mantissa_bits, exponent_offset, params, rounding, overflow, draw32
):
    """Code of the IEEE-binary value ``bits`` times 2^exponent_offset (exact, one rounding)."""
    value_class, sign, significand, lsb_exponent, floor_log2 = decompose(
        bits, in_exponent_bits, in_mantissa_bits
    )
    if value_class == CLASS_FINITE:
        return encode_finite(
            sign,
            significand,
            lsb_exponent + exponent_offset,
            floor_log2 + exponent_offset,
            params,
            rounding,
            overflow,
            draw32,
        )
    if value_class == CLASS_ZERO:
        return magnitude_to_code(
            sign if params[P_SIGNED] and not params[P_TWOS_COMPLEMENT] else 0, np.int64(0), params
        )
    no_inf = (
        params[P_SPECIALS] == SPECIALS_NAN_AT_MAX
        or params[P_SPECIALS] == SPECIALS_NAN_AT_NEGATIVE_ZERO
    )
    if value_class == CLASS_NAN or (no_inf and overflow != OVERFLOW_SATURATE):
        return nan_code(sign, params)
    if params[P_SPECIALS] == SPECIALS_IEEE and overflow != OVERFLOW_SATURATE:
        return magnitude_to_code(
            sign, ((1 << params[P_EXPONENT_BITS]) - 1) << params[P_MANTISSA_BITS], params
        )
    max_index = params[P_MAX_INDEX_NEGATIVE] if sign else params[P_MAX_INDEX]
    return magnitude_to_code(sign, max_index, params)  # Inf saturates


@njit(cache=True, nogil=True, **NO_REFCOUNTS)
def encode_array(
    bits, in_exponent_bits, in_mantissa_bits, params, rounding, overflow, seed, out, start, stop
):
    """Encode elements ``start`` to ``stop`` of a flat array of IEEE-binary bit patterns into
    ``out`` (one code each; stochastic draw index i whatever chunks the callers cut)."""
    for i in range(start, stop):
        draw32 = random32(seed, i) if rounding == ROUND_STOCHASTIC else np.int64(0)
        out[i] = encode_bits(
            bits[i], in_exponent_bits, in_mantissa_bits, 0, params, rounding, overflow, draw32
        )


@njit(cache=True, **NO_REFCOUNTS)
def decode_code(code, params):
    """The float64 value of one code (exact: every format here fits in float64)."""
    bits = params[P_BITS]
    exponent_bits = params[P_EXPONENT_BITS]
    mantissa_bits = params[P_MANTISSA_BITS]
    bias = params[P_BIAS]
    code = np.int64(code)
    if params[P_TWOS_COMPLEMENT]:
        value = code - (np.int64(1) << bits) if code >= (np.int64(1) << (bits - 1)) else code
        sign = 1 if value < 0 else 0
        magnitude_index = -value if value < 0 else value
    elif params[P_SIGNED]:
        sign = (code >> (bits - 1)) & 1
        magnitude_index = code & ((np.int64(1) << (bits - 1)) - 1)
    else:
        sign = 0
        magnitude_index = code
    mantissa_mask = (np.int64(1) << mantissa_bits) - 1
    if (
        params[P_SPECIALS] == SPECIALS_IEEE
        and (magnitude_index >> mantissa_bits) == (1 << exponent_bits) - 1
    ):
        if magnitude_index & mantissa_mask:
            return np.nan
        return -np.inf if sign else np.inf
    if (
        params[P_SPECIALS] == SPECIALS_NAN_AT_MAX
        and magnitude_index == (np.int64(1) << (bits - params[P_SIGNED])) - 1
    ):
        return np.nan
    if params[P_SPECIALS] == SPECIALS_NAN_AT_NEGATIVE_ZERO and sign and magnitude_index == 0:
        return np.nan
    if exponent_bits == 0 or (params[P_SUBNORMALS] and magnitude_index <= mantissa_mask):
        magnitude = scale_by_power_of_two(float(magnitude_index), 1 - bias - mantissa_bits)
    else:
        exponent_field = magnitude_index >> mantissa_bits
        significand = (magnitude_index & mantissa_mask) | (np.int64(1) << mantissa_bits)
        magnitude = scale_by_power_of_two(float(significand), exponent_field - bias - mantissa_bits)
    return -magnitude if sign else magnitude


@njit(cache=True, nogil=True, **NO_REFCOUNTS)
def decode_array(codes, params, out, start, stop):
    """Decode codes ``start`` to ``stop`` of a flat array into float64 ``out``."""
    for i in range(start, stop):
        out[i] = decode_code(codes[i], params)
