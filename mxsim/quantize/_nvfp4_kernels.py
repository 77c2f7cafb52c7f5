"""Numba kernel of NVFP4 quantization (:mod:`mxsim.quantize.nvfp4`) with both roundings to
nearest even: the recipe's float32 steps per block, each format's rounding a search of its
sorted finite magnitudes (the scale's by bisection, the few elements' by counting). The
stages are named as in the twin (:func:`mxsim.quantize.reference.quantize_nvfp4_reference`):
amax, descale, scale code, scale value, reciprocal, element codes."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .._compile import NO_REFCOUNTS


@njit(cache=True, nogil=True, **NO_REFCOUNTS)
def nearest_even_index(magnitude, values):
    """The index of ``values`` (a format's finite magnitudes, ascending, the first 0, their
    indices their codes) nearest to ``magnitude`` (at most the last value), a tie going to the
    even index: rounding to nearest even for sign-magnitude formats."""
    lo, hi = 0, len(values) - 1
    while lo < hi:  # the largest index whose value is at most the magnitude
        middle = (lo + hi + 1) >> 1
        if values[middle] <= magnitude:
            lo = middle
        else:
            hi = middle - 1
    if values[lo] == magnitude or lo == len(values) - 1:
        return lo
    half = (values[lo] + values[lo + 1]) * 0.5  # exact: both hold float32 significands
    if magnitude > half:
        return lo + 1
    if magnitude < half or lo % 2 == 0:
        return lo
    return lo + 1


@njit(cache=True, nogil=True, **NO_REFCOUNTS)
def nearest_even_count(magnitude, middles):
    """:func:`nearest_even_index` by counting, without branches, the midpoints ``middles``
    (between consecutive magnitudes) the magnitude passes: above one, or on one whose upper
    neighbour's index is even. For a format of few magnitudes (the elements): ``middles`` a
    tuple, whose length the compiled loop knows (unrolled and vectorized, 10x faster than an
    array's)."""
    index = 0
    for j in range(len(middles)):
        index += (magnitude > middles[j]) | ((magnitude == middles[j]) & (j % 2 == 1))
    return index


@njit(cache=True, nogil=True, error_model="numpy", **NO_REFCOUNTS)  # 1 / 0: Inf, as float32
def quantize_rows(
    rows,
    row_scales,
    element_middles,
    element_max,
    scale_values,
    smallest_scale,
    element_sign,
    given_scales,
    scale_codes,
    codes,
    start,
    stop,
):
    """NVFP4 of rows ``start`` to ``stop`` of float32 ``rows`` (n, K), each row's float32
    tensor scale ``row_scales[i]`` (1 for single-level: d / 1 and (1 / 1) / s are exact), into
    ``codes`` (n, K) and, unless ``given_scales`` (then read from it), ``scale_codes``
    (n, K / block); ``element_middles``: the midpoints between the elements' consecutive
    magnitudes (a tuple of float64), ``element_max`` the largest; ``smallest_scale``: the
    float32 the descale is clamped up to (the scale format's smallest normal);
    ``element_sign``: the element codes' sign bit. Returns False where a reciprocal
    overflows float32."""
    blocks = scale_codes.shape[1]
    block = rows.shape[1] // blocks if blocks else 0
    e_max = np.float32(element_max)
    s_max = np.float32(scale_values[-1])
    one = np.float32(1.0)
    for i in range(start, stop):
        t = row_scales[i]
        for b in range(blocks):
            # (a block's elements read through views indexed from 0: the loops vectorise)
            values = rows[i, b * block : (b + 1) * block]
            block_codes = codes[i, b * block : (b + 1) * block]
            if given_scales:
                scale_code = scale_codes[i, b]
            else:
                amax = np.float32(0.0)
                for j in range(block):
                    amax = max(amax, abs(values[j]))
                descale = amax / e_max / t
                clamped = min(max(descale, smallest_scale), s_max)
                scale_code = nearest_even_index(np.float64(clamped), scale_values)
                scale_codes[i, b] = scale_code
            scale_value = np.float32(scale_values[scale_code])
            reciprocal = one / t / scale_value
            if not math.isfinite(reciprocal):
                return False
            for j in range(block):
                y = min(max(values[j] * reciprocal, -e_max), e_max)
                code = nearest_even_count(np.float64(abs(y)), element_middles)
                block_codes[j] = code | (element_sign * np.signbit(y))
    return True
