"""A wide exact fixed-point accumulator (Kulisch style) for the datapath kernels.

The value is sum(limbs[i] * 2^(32*i + LIMB_BASE_EXPONENT)); limbs are int64 holding 32-bit
digits plus lazy carries, so any float64 term can be added exactly and the sum rounded
once into any format. ``bounds`` ([lowest, highest] limb touched) keeps clearing and
normalising to the limbs in use.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._compile import STAGE, generic_calls

from ..formats._kernels import CLASS_FINITE, decompose, encode_finite

LIMB_BITS = 32
N_LIMBS = 160
# Covers 2^-2560 .. 2^2560: every float64, and every exact product of two fp64 values
# (2^-2148 .. 2^2048) times two E8M0 scales, with room for the carries of any sum.
LIMB_BASE_EXPONENT = -2560
LIMB_MASK = (1 << LIMB_BITS) - 1


@njit(cache=True, inline="always")
def limbs_clear(limbs, bounds):
    for i in range(max(bounds[0], 0), min(bounds[1] + 1, N_LIMBS)):
        limbs[i] = 0
    bounds[0] = N_LIMBS
    bounds[1] = -1


@njit(cache=True, **STAGE)
def limbs_add_integer(limbs, bounds, negative, magnitude, lsb_exponent):
    """Add (-1)^negative * magnitude * 2^lsb_exponent exactly (0 <= magnitude < 2^63)."""
    if magnitude == 0:
        return
    position = lsb_exponent - LIMB_BASE_EXPONENT
    index = position >> 5
    offset = position & 31
    low = (magnitude & LIMB_MASK) << offset  # < 2^63
    high = (magnitude >> 32) << offset  # < 2^62
    digit0 = low & LIMB_MASK
    digit1 = (low >> 32) + (high & LIMB_MASK)
    digit2 = high >> 32
    if negative:
        limbs[index] -= digit0
        limbs[index + 1] -= digit1
        limbs[index + 2] -= digit2
    else:
        limbs[index] += digit0
        limbs[index + 1] += digit1
        limbs[index + 2] += digit2
    if index < bounds[0]:
        bounds[0] = index
    if index + 2 > bounds[1]:
        bounds[1] = index + 2


@njit(cache=True, **STAGE)
def limbs_add_product(limbs, bounds, x, y, exponent_offset):
    """Add x * y * 2^exponent_offset exactly (x, y finite nonzero float64s): the 106-bit
    product of the significands as four partial products of 27 x 27 bits."""
    _, sign_x, significand_x, lsb_x, _ = decompose(np.float64(x).view(np.uint64), 11, 52)
    _, sign_y, significand_y, lsb_y, _ = decompose(np.float64(y).view(np.uint64), 11, 52)
    negative = sign_x != sign_y
    lsb = lsb_x + lsb_y + exponent_offset
    high_x, low_x = significand_x >> 26, significand_x & ((1 << 26) - 1)
    high_y, low_y = significand_y >> 26, significand_y & ((1 << 26) - 1)
    limbs_add_integer(limbs, bounds, negative, low_x * low_y, lsb)
    limbs_add_integer(limbs, bounds, negative, high_x * low_y, lsb + 26)
    limbs_add_integer(limbs, bounds, negative, low_x * high_y, lsb + 26)
    limbs_add_integer(limbs, bounds, negative, high_x * high_y, lsb + 52)


@njit(cache=True, inline="always")
def limbs_add_float(limbs, bounds, value):
    """Add a finite float64 exactly."""
    value_class, sign, significand, lsb_exponent, _ = decompose(
        np.float64(value).view(np.uint64), 11, 52
    )
    if value_class == CLASS_FINITE:
        # sign as a bool, as the other callers pass it: one compiled signature
        limbs_add_integer(limbs, bounds, sign != 0, significand, lsb_exponent)


@generic_calls
@njit(cache=True)
def limbs_round(limbs, bounds, params, rounding, overflow):
    """Round the exact sum once into the format ``params``: returns (code, is_zero).

    Normalises the limbs in place (carries propagated; the value is unchanged). A zero
    sum returns is_zero = True and code 0; the caller decides the sign of zero.
    """
    low = max(bounds[0], 0)
    high = min(bounds[1] + 2, N_LIMBS - 1)
    carry = np.int64(0)
    for i in range(low, high + 1):
        value = limbs[i] + carry
        limbs[i] = value & LIMB_MASK
        carry = value >> 32
    bounds[1] = high
    negative = carry < 0
    if negative:  # two's complement over the range: negate to get the magnitude
        borrow = np.int64(1)
        for i in range(low, high + 1):
            value = (LIMB_MASK - limbs[i]) + borrow
            limbs[i] = value & LIMB_MASK
            borrow = value >> 32
    top = high
    while top >= low and limbs[top] == 0:
        top -= 1
    if top < low:
        return np.int64(0), True
    # The top 62 bits of the magnitude, from the top three digits, and a sticky bit for the rest.
    leading = 31
    while (limbs[top] >> leading) == 0:
        leading -= 1
    digit2 = limbs[top]
    digit1 = limbs[top - 1] if top - 1 >= low else np.int64(0)
    digit0 = limbs[top - 2] if top - 2 >= low else np.int64(0)
    shift = leading + 3  # significand = floor((digit2:digit1:digit0) / 2^shift), 62 bits
    significand = digit2 << (64 - shift)
    if shift <= 32:
        significand |= (digit1 << (32 - shift)) | (digit0 >> shift)
        sticky = (digit0 & ((np.int64(1) << shift) - 1)) != 0
    else:
        significand |= digit1 >> (shift - 32)
        sticky = digit0 != 0 or (digit1 & ((np.int64(1) << (shift - 32)) - 1)) != 0
    for i in range(low, top - 2):
        if limbs[i] != 0:
            sticky = True
    lsb_exponent = (top - 2) * 32 + shift + LIMB_BASE_EXPONENT
    significand = (significand << 1) | (
        1 if sticky else 0
    )  # the sticky bit sits below all kept bits
    lsb_exponent -= 1
    floor_log2 = top * 32 + leading + LIMB_BASE_EXPONENT
    if negative:  # restore the sign so the limbs still hold the sum
        for i in range(low, high + 1):
            limbs[i] = -limbs[i]
    code = encode_finite(
        1 if negative else 0, significand, lsb_exponent, floor_log2, params, rounding, overflow, 0
    )
    return code, False
