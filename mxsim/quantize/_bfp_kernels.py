"""Numba kernels for block floating point (plain BFP and shared-microexponent MX4/MX6/MX9).

These kernels reproduce the integer arithmetic of AMD Quark's ``BFPQuantizeDequantize`` custom
op (see ``docs/bfp.md`` for the source of every rule).  They take the raw float32 bit patterns of
an already blocked tensor -- a C-contiguous ``uint32`` array of shape ``(blocks, block_size)`` --
plus plain integer parameters, and return the codes; they do no validation (``bfp.py`` does).

All arithmetic is done in int64 after reading each ``uint32``: numba would promote a mix of
unsigned and signed 64-bit integers to float64, which would silently break exactness.

Codes returned (per block ``b``, sub-block ``s``, element ``j``):

* ``shared[b]`` (uint8): the biased shared exponent E.  For ``to_bfp_prime`` E = 255 marks a NaN
  block; its other codes are all zero.
* ``micro[b, s]`` (uint8): the microexponent d (``to_bfp`` has one sub-block with d = 0).
* ``mant[b, j]`` (int32): the signed significand, ``-M`` or ``+M``.
* ``sign[b, j]`` (uint8): 1 where Quark's output carries a minus sign (this keeps -0.0).
* ``special[b, j]`` (uint32, ``to_bfp`` only): the input bits where the input is Inf/NaN (Quark
  passes those through unchanged), else 0.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._compile import watch_compiles

watch_compiles()

_FRACTION_MASK = 0x007FFFFF
_IMPLICIT_ONE = 0x00800000
_EXP_ALL_ONES = 0xFF

TIES_AWAY_FROM_ZERO = 0  # Quark STD_ROUND (C++ std::round)
TIES_TOWARD_POS_INF = 1  # Quark DPU_ROUND
TIES_TO_EVEN = 2  # Quark PY3_ROUND

CUDA_PRIME_TRUNCATE = 0
CUDA_PRIME_HALF_AWAY = 1
CUDA_PRIME_STOCHASTIC = 2


@njit(cache=True, nogil=True)
def _round_shift_nearest(significand, shift, negative, rounding_mode):
    """``significand / 2**shift`` (shift >= 0) rounded to an integer, ties per ``rounding_mode``.

    Works on the magnitude; ``negative`` only matters for ties toward +inf.
    """
    if shift == 0:
        return significand
    if shift > 25:
        # significand < 2**24 so the quotient is below 1/2: rounds to 0 in every mode.
        return 0
    kept = significand >> shift
    tail = significand & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if tail < half:
        return kept
    if tail > half:
        return kept + 1
    if rounding_mode == TIES_AWAY_FROM_ZERO:
        return kept + 1
    if rounding_mode == TIES_TOWARD_POS_INF:
        return kept if negative else kept + 1
    return kept + (kept & 1)  # ties to even


@njit(cache=True, nogil=True)
def _cuda_prime_round(bits, significand, shift, mantissa_bits, rounding_mode, random_word):
    """Quark CUDA ``BFPPrimeCUDAKernel`` rounding of one element.

    ``shift`` is the CUDA kernel's shift, one less than the CPU kernel's: it keeps one extra
    (half) bit, then rounding adds 1 (half away) or, stochastically, 2 to that and drops it.
    """
    if shift >= 32:
        shift = 31  # the kernel clamps to avoid undefined C shifts; result is 0 either way
    with_half_bit = significand >> shift
    all_ones = (1 << (mantissa_bits + 1)) - 1
    if rounding_mode != CUDA_PRIME_TRUNCATE and with_half_bit != all_ones:
        if rounding_mode == CUDA_PRIME_HALF_AWAY:
            with_half_bit += 1
        elif shift < 24:
            # Quark compares the low (shift + 1) bits of the *raw float32 encoding*, not of the
            # significand (differs when shift == 23, and for subnormals, which are not flushed).
            low_mask = (1 << (shift + 1)) - 1
            if (random_word & low_mask) < (bits & low_mask):
                with_half_bit += 2
    return with_half_bit >> 1


@njit(cache=True, nogil=True)
def _zero_codes(n_blocks, block_size, n_micro):
    """Zeroed ``(shared, micro, mant, sign)`` code arrays for ``n_blocks`` blocks."""
    return (
        np.zeros(n_blocks, np.uint8),
        np.zeros((n_blocks, n_micro), np.uint8),
        np.zeros((n_blocks, block_size), np.int32),
        np.zeros((n_blocks, block_size), np.uint8),
    )


@njit(cache=True, nogil=True)
def _largest_exponent(block_bits, b, start, stop, finite_only):
    """The largest biased exponent field of elements ``start..stop`` of block ``b`` (0 if
    none); with ``finite_only``, Inf/NaN elements (field 255) are left out."""
    largest = 0
    for j in range(start, stop):
        e = (np.int64(block_bits[b, j]) >> 23) & _EXP_ALL_ONES
        if e > largest and not (finite_only and e == _EXP_ALL_ONES):
            largest = e
    return largest


@njit(cache=True, nogil=True)
def bfp_prime_kernel(
    block_bits,
    mantissa_bits,
    sub_block_size,
    sub_block_shift_bits,
    rounding_mode,
    cuda,
    random_words,
    flushed_sign_kept,
):
    """Quantize blocks with shared exponent + per-sub-block microexponent (``to_bfp_prime``).

    ``cuda`` selects the CUDA kernel's rounding (0 truncate, 1 half away from zero saturating at
    2**m - 1, 2 stochastic from ``random_words``, a uint32 array shaped like ``block_bits``);
    otherwise the CPU kernel's round-to-nearest with ties per ``rounding_mode``, saturating at
    2**m - 1 (a rounding that carries out of the sub-block's top keeps the largest mantissa).
    A zero or subnormal input (flushed) keeps its sign bit with ``flushed_sign_kept``, else
    its sign bit is 0 (+0). Returns ``(shared, micro, mant, sign)``.
    """
    n_blocks, block_size = block_bits.shape
    n_sub = block_size // sub_block_size
    max_micro = (1 << sub_block_shift_bits) - 1
    shared, micro, mant, sign = _zero_codes(n_blocks, block_size, n_sub)
    # The exponents of every block first, then the elements: one loop nest doing both per
    # sub-block ran several times slower.
    for b in range(n_blocks):
        shared_exp = 0
        for s in range(n_sub):  # each sub-block's largest exponent; the block's is theirs
            start = s * sub_block_size
            sub_max_exp = _largest_exponent(block_bits, b, start, start + sub_block_size, False)
            micro[b, s] = sub_max_exp  # (made d below)
            shared_exp = max(shared_exp, sub_max_exp)
        shared[b] = shared_exp
        for s in range(n_sub):
            micro[b, s] = (
                0  # NaN block: every output element is NaN; codes stay zero
                if shared_exp == _EXP_ALL_ONES
                else min(shared_exp - np.int64(micro[b, s]), max_micro)
            )
    if not cuda:
        _prime_elements_nearest(
            block_bits, shared, micro, mant, sign, mantissa_bits, rounding_mode, flushed_sign_kept
        )
        return shared, micro, mant, sign
    for b in range(n_blocks):
        shared_exp = np.int64(shared[b])
        if shared_exp == _EXP_ALL_ONES:
            continue
        for j in range(block_size):
            d = np.int64(micro[b, j // sub_block_size])
            bits = np.int64(block_bits[b, j])
            e = (bits >> 23) & _EXP_ALL_ONES
            negative = (bits >> 31) & 1
            # Subnormals (and zeros) contribute a zero significand: flushed.
            significand = 0 if e == 0 else (bits & _FRACTION_MASK) | _IMPLICIT_ONE
            # random_words is only filled (and only read) for stochastic rounding.
            word = np.int64(0)
            if rounding_mode == CUDA_PRIME_STOCHASTIC:
                word = np.int64(random_words[b, j])
            m = _cuda_prime_round(
                bits,
                significand,
                shared_exp - d - e + 23 - mantissa_bits,
                mantissa_bits,
                rounding_mode,
                word,
            )
            mant[b, j] = -m if negative else m
            sign[b, j] = negative if (e != 0 or flushed_sign_kept) else 0
    return shared, micro, mant, sign


@njit(cache=True, nogil=True)
def _prime_elements_nearest(
    block_bits, shared, micro, mant, sign, mantissa_bits, rounding_mode, flushed_sign_kept
):
    """:func:`bfp_prime_kernel`'s elements under the CPU kernel's rounding, given the blocks'
    shared exponents E and microexponents d: each element's significand (0 for a zero or
    subnormal input: flushed) divided by 2^shift, shift = E - d - e + 24 - m, rounded to
    nearest (ties per ``rounding_mode``: ``_round_shift_nearest``) and saturated at 2^m - 1.
    Branch-free per element, so the loop over a block's elements vectorises: the shift is cut to
    26 (any shift above 25 rounds a significand below 2^24 to 0, as 26 does), and a shift of
    0 has no half (nothing to round). NaN blocks (E = 255) keep their zero codes."""
    n_blocks, block_size = block_bits.shape
    sub_block_size = block_size // micro.shape[1]
    max_mag = np.int64((1 << mantissa_bits) - 1)
    ties_away = np.int64(rounding_mode == TIES_AWAY_FROM_ZERO)
    ties_up = np.int64(rounding_mode == TIES_TOWARD_POS_INF)
    ties_even = np.int64(rounding_mode == TIES_TO_EVEN)
    kept_sign = np.int64(flushed_sign_kept)
    tops = np.empty(block_size, np.int64)  # E - d + 24 - m of each element's sub-block
    for b in range(n_blocks):
        shared_exp = np.int64(shared[b])
        if shared_exp == _EXP_ALL_ONES:
            continue
        for j in range(block_size):
            tops[j] = shared_exp - np.int64(micro[b, j // sub_block_size]) + 24 - mantissa_bits
        for j in range(block_size):
            bits = np.int64(block_bits[b, j])
            e = (bits >> 23) & _EXP_ALL_ONES
            negative = (bits >> 31) & 1
            normal = np.int64(e != 0)
            significand = normal * ((bits & _FRACTION_MASK) | _IMPLICIT_ONE)
            shift = min(tops[j] - e, np.int64(26))
            kept = significand >> shift
            tail = significand & ((np.int64(1) << shift) - 1)
            half = (np.int64(1) << shift) >> 1
            tie = np.int64(tail == half) & np.int64(half != 0)
            tie_up = ties_away | (ties_up & (1 - negative)) | (ties_even & kept)
            m = min(kept + (np.int64(tail > half) | (tie & tie_up)), max_mag)
            mant[b, j] = m - 2 * negative * m
            sign[b, j] = negative & (normal | kept_sign)


@njit(cache=True, nogil=True)
def bfp_plain_kernel(block_bits, mantissa_bits, rounding_mode):
    """Quantize blocks with one shared exponent and no microexponents (``to_bfp``).

    E is the largest biased exponent among the finite elements; each finite element becomes
    ``round(x / 2**(E - 126 - m))`` (ties per ``rounding_mode``), clamped to +-(2**m - 1).
    Subnormals are quantized, not flushed.  Inf/NaN pass through (``special``).
    Returns ``(shared, micro, mant, sign, special)``; ``micro`` is all zero, shape (blocks, 1).
    """
    n_blocks, block_size = block_bits.shape
    max_mag = (1 << mantissa_bits) - 1
    shared, micro, mant, sign = _zero_codes(n_blocks, block_size, 1)
    special = np.zeros((n_blocks, block_size), np.uint32)
    for b in range(n_blocks):
        shared_exp = _largest_exponent(block_bits, b, 0, block_size, True)
        shared[b] = shared_exp
        for j in range(block_size):
            bits = np.int64(block_bits[b, j])
            e = (bits >> 23) & _EXP_ALL_ONES
            if e == _EXP_ALL_ONES:
                special[b, j] = block_bits[b, j]
                continue
            negative = (bits >> 31) & 1
            if e == 0:
                significand = bits & _FRACTION_MASK  # subnormal: weight 2**-149, no implicit 1
                effective_exp = 1
            else:
                significand = (bits & _FRACTION_MASK) | _IMPLICIT_ONE
                effective_exp = e
            # x / 2**(E-126-m) == significand / 2**shift; shift >= 0 because m <= 23.
            shift = shared_exp - effective_exp + 24 - mantissa_bits
            m = _round_shift_nearest(significand, shift, negative, rounding_mode)
            if m > max_mag:
                m = max_mag
            if (
                negative
                and m == 0
                and rounding_mode == TIES_TO_EVEN
                and significand != 0
                and not _quotient_underflows_float32(significand, shift)
            ):
                # Quark's py3_round(q) for q in [-0.5, 0) returns floor(q) + 1 == +0.0; only a
                # quotient that already underflowed to -0.0 in float32 keeps its sign.
                negative = 0
            mant[b, j] = -m if negative else m
            sign[b, j] = negative
    return shared, micro, mant, sign, special


@njit(cache=True, nogil=True)
def _quotient_underflows_float32(significand, shift):
    """True when ``significand / 2**shift`` (> 0) rounds to 0 in float32, i.e. is <= 2**-150."""
    excess = shift - 150
    if excess < 0:
        return False
    if excess >= 24:
        return True  # significand < 2**24
    return significand <= (1 << excess)
