"""Numba kernels for units with a truncating alignment window, vectorised across outputs.

They cover one family (``datapath.window.window_applies`` says which units): k order, one
block scale per tree, exponent-sum reference, exact products, terms truncated toward zero
to the window, then an optional n-bit tree-sum rounding and a floating accumulator that c
starts (or, under promotion, an fp32 accumulator added every n products into an outer one
that c starts: :func:`start_outer`, :func:`after_tree`, :func:`finish_outer`). Instead of
one dot product at a time, a set of independent outputs (the columns of a GEMM tile, or the
rows of a row-wise dot) are SIMD lanes, and every stage is a loop over the lanes with the
tree position outside:

1. the reference R of each lane: the max over the tree of int8 exponent sums ea + eb (a
   zero element carries ``ZERO_EXPONENT``, so any sum with it stays below ``threshold``),
   plus the tree's block scale, or the accumulator's exponent when it joins the tree;
2. every product p = a * b (float32, exact: the caller checks that the formats' significand
   widths add up to at most 24 bits) times 2^(W + scale - R) (exact, or below 1 and so
   truncated to 0), truncated toward zero by the float -> int32 conversion, summed in int32
   groups of ``group`` terms, then in float64 (integers below 2^53: exact). |term| <
   2^(W + 2) and group * 2^(W + 2) <= 2^31, so no sum of terms of one group overflows, in
   whatever order (the GEMM kernel adds four terms per pass over the lanes);
3. the tree's integer sum is rounded in float64 (exact: it stays below 2^53) to the n-bit
   sum and into the accumulator by bit arithmetic on the float64 pattern (:func:`round_bits`),
   or added to the accumulator at a second alignment by floors of exact float64 values
   (:func:`_finish_lanes_second_alignment`). Under parity windows (``W_PARITY``) each half
   of a tree (its positions reordered even ones first) takes steps 1 and 2 as a tree of its
   own, and :func:`parity_halves` adds the two halves' sums before step 3.

A GEMM work item is a tile of at most ``LANES`` columns: it decodes its columns of B once
into a (K, lanes) tile of float32 values and int8 exponents (or reads them kept from an
earlier call on the same B: a model's weight) and runs rows of A against it,
``ROW_BLOCK`` rows at a time so that one tree's slice of the tile stays in cache across them,
two rows per pass over the lanes so that each load of the tile serves both.

Whatever this fast path does not model exactly — NaN/Inf elements, NaN scales, c non-finite
or -0, and any accumulator or output value outside the normal range of its format
(subnormals, zero signs from underflow, overflow) — sets the lane's flag; the caller
recomputes flagged outputs with the generic kernel (``datapath._kernels``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .._compile import NO_REFCOUNTS, generic_calls

from ..formats._kernels import (
    ROUND_NEAREST_AWAY,
    ROUND_NEAREST_EVEN,
    ROUND_NEAREST_TOWARD_POSITIVE,
    ROUND_TOWARD_NEGATIVE,
    ROUND_TOWARD_POSITIVE,
    ROUND_TOWARD_ZERO,
    power_of_two,
)
from ..quantize._kernels import SCALE_NAN
from ._blas_kernels import round_to_odd, two_sum

ZERO_EXPONENT = -64  # int8 exponent of zero (and non-finite) table entries
NO_REFERENCE = (
    -900
)  # the reference of a lane with no nonzero term (keeps 2^(±(W - R)) in float64 range)
# Outputs per work item (columns of a GEMM tile, rows of a row-wise dot): long lane loops
# amortise each per-tree call's setup and each pass's per-term setup (at 256 lanes a pass of
# the int8 exponent maxima is eight vector iterations); a 32-term tree's slice of a
# 1024-column B tile (values and exponents, 160 KiB) stays in L2 across the rows that run
# against it.
LANES = 1024
ROW_BLOCK = 32  # rows of A run tree by tree against the B tile together
DECODE_BLOCK = 8  # tile rows :func:`_decode_tile` writes together (its docstring says why)

# Indices into the int64 configuration vector built by ``datapath.window``.
W_FUSED_TERMS = 0
W_WINDOW_BITS = 1  # align_fraction_bits
W_GROUP = 2  # products per int32 partial sum
W_ACC_IN_TREE = 3
W_SUM_BITS = 4  # 0: no tree-sum rounding
W_SUM_ROUNDING = 5
W_ACC_BITS = 6  # accumulator precision (significand bits)
W_ACC_ROUNDING = 7
W_ACC_MIN_EXPONENT = 8  # exponent of the accumulator's smallest normal
W_ACC_MAX_EXPONENT = 9  # exponent of its largest finite value
W_OUT_BITS = 10
W_OUT_ROUNDING = 11
W_OUT_MIN_EXPONENT = 12
W_OUT_MAX_EXPONENT = 13
W_OUT_MANTISSA_BITS = 14
W_OUT_BIAS = 15
W_OUT_SIGN_SHIFT = 16  # position of the output format's sign bit
W_BLOCK_SIZE = 17
W_THRESHOLD = 18  # int8 exponent sums below this involve a zero element
W_SCALED = 19  # 1: the unit takes block scales
W_ZERO_FLOOR = (
    20  # adder.zero_term_exponent (or far below every R): lanes whose R lies below it are flagged
)
# 1: each tree's truncated n-bit sum, provably 0 or a normal float32, joins the accumulator
# as one float32 addition (datapath.window.float32_addition).
W_FLOAT32_ADD = 21
# accumulator.promotion_interval (0: none): every this many products the fp32 accumulator is
# added into an outer fp32 accumulator (one binary32 add, nearest even), which c starts.
# PROMOTION_AT_END, an interval no K reaches: the one add at the end of c_entry: end.
W_PROMOTION = 22
# adder.second_alignment_bits n, as n + 1 (0: none): each tree's sum joins the accumulator at a
# second alignment (:func:`_finish_lanes_second_alignment`); the adder drops a far accumulator.
W_SECOND_ALIGNMENT = 23
W_FAR_DROPPED = 24
# 1: adder.parity_windows. The caller reorders each tree's positions even ones first
# (datapath.window.in_tree_order) and sets W_FUSED_TERMS to half a tree, so that the kernels'
# trees are the windows, in pairs (:func:`parity_halves`).
W_PARITY = 25
N_WINDOW_CONFIG = 26
PROMOTION_AT_END = 1 << 62
FLOAT32_SMALLEST_NORMAL = 2.0**-126
FLOAT32_LARGEST = (2.0 - 2.0**-23) * 2.0**127


@njit(cache=True, inline="always")
def _exponent(value):
    """floor(log2|value|) of a nonzero normal float64 (from its bits); -1023 for zero."""
    return np.int64((np.float64(value).view(np.int64) >> 52) & 0x7FF) - 1023


@njit(cache=True, inline="always")
def _power_of_two_32(exponent):
    """2^exponent as a float32 (exponent in -126..127)."""
    return np.int32((exponent + 127) << 23).view(np.float32)


@njit(cache=True, **NO_REFCOUNTS)
def rounding_rule(precision, rounding):
    """How :func:`round_bits` rounds to ``precision`` (1..51) significant bits with
    ``rounding``: (bits cut off, bias added to a positive magnitude, to a negative one, 1 if
    ties go to even else 0). Computed once per loop, outside the lanes."""
    shift = 53 - precision
    unit = np.int64(1) << shift
    half = unit >> 1
    positive = negative = np.int64(0)  # toward zero
    if rounding == ROUND_NEAREST_EVEN:
        positive = negative = half - 1
    elif rounding == ROUND_NEAREST_AWAY:
        positive = negative = half
    elif rounding == ROUND_NEAREST_TOWARD_POSITIVE:
        positive, negative = half, half - 1
    elif rounding == ROUND_TOWARD_POSITIVE:
        positive = unit - 1
    elif rounding == ROUND_TOWARD_NEGATIVE:
        negative = unit - 1
    return shift, positive, negative, np.int64(rounding == ROUND_NEAREST_EVEN)


@njit(cache=True, **NO_REFCOUNTS)
def round_bits(value, rule):
    """``value`` (a nonzero normal float64, or +0) rounded as ``rule`` (:func:`rounding_rule`)
    says, exponent range unbounded. Exact when ``value`` is the exact value, and also when it
    is the exact value rounded to odd at 53 >= precision + 2 bits.

    Sign-magnitude on the float64 pattern, branch-free (it runs in SIMD lanes): the magnitude
    plus the mode's bias for the value's sign (plus the kept LSB for ties to even), then the
    bits below the kept LSB cut off. With L the cut-off bits and U the kept LSB's weight,
    L + bias carries into the kept bits exactly when the mode rounds the magnitude up: bias
    U - 1 whenever L > 0 (away from zero), U/2 when L >= U/2 (ties away), U/2 - 1 when L > U/2
    (ties toward zero), U/2 - 1 + LSB when L > U/2 or L = U/2 with the LSB odd (ties to even),
    0 never (toward zero). A carry into the exponent field is the next binade, as it should be.
    The LSB is the pattern's: at precision 1 the exponent field's, so that ties go to the even
    code of a format without stored significand bits whose exponent bias has float64's parity
    (the n-bit sum format's, ``datapath.tables.sum_format``)."""
    shift, positive, negative, even = rule
    bits = np.float64(value).view(np.int64)
    sign = bits & np.int64(-0x8000000000000000)
    magnitude = bits ^ sign
    bias = (negative if sign != 0 else positive) + ((magnitude >> shift) & even)
    return np.int64(((magnitude + bias) & (np.int64(-1) << shift)) | sign).view(np.float64)


@njit(cache=True, inline="always")
def _round_in_range(value, rule, min_exponent, max_exponent):
    """(``value`` rounded by ``rule``, True) when the result is a normal value of the format
    (or 0); else (0.0, False): subnormals and overflow are the generic kernel's.

    The exponent tests compare magnitudes with powers of two (``_exponent(v) >= e`` is
    ``|v| >= 2^e`` and ``_exponent(v) <= e`` is ``|v| < 2^(e + 1)``, an infinite bound
    when e + 1 is 1024): two float instructions a lane instead of a shift, a mask and an
    add on the int64 pattern."""
    rounded = round_bits(value, rule)
    ok = (value == 0.0) | (
        (abs(value) >= power_of_two(min_exponent)) & (abs(rounded) < power_of_two(max_exponent + 1))
    )
    return (rounded if ok else 0.0), ok


@generic_calls
@njit(cache=True)
def start_accumulators(c_values, offset, acc, flags, cfg):
    """acc[lane] = c_values[(offset + lane) % len] rounded into the accumulator; flags where
    that leaves the fast path (c non-finite or -0, or not normal in the accumulator).

    A single c (GEMMs without c) is rounded once, and a run of c that needs no wrapping is
    read without the modulo: an integer division a lane has no SIMD instruction and cost
    more than the rest of the loop."""
    rule = rounding_rule(cfg[W_ACC_BITS], cfg[W_ACC_ROUNDING])
    low, high = cfg[W_ACC_MIN_EXPONENT], cfg[W_ACC_MAX_EXPONENT]
    count = c_values.shape[0]
    if count == 1:
        value, bad = _start_lane(c_values[0], rule, low, high)
        for lane in range(acc.shape[0]):
            acc[lane] = value
            flags[lane] |= bad
    elif offset + acc.shape[0] <= count:
        for lane in range(acc.shape[0]):
            acc[lane], bad = _start_lane(c_values[offset + lane], rule, low, high)
            flags[lane] |= bad
    else:
        for lane in range(acc.shape[0]):
            acc[lane], bad = _start_lane(c_values[(offset + lane) % count], rule, low, high)
            flags[lane] |= bad


@njit(cache=True, inline="always")
def _start_lane(c_value, rule, low, high):
    """(c rounded into the accumulator, whether that leaves the fast path)."""
    c = np.float64(c_value)
    usable = math.isfinite(c) and not (c == 0.0 and math.copysign(1.0, c) < 0)
    value, ok = _round_in_range(c if usable else 0.0, rule, low, high)
    return value, not (ok and usable)


@njit(cache=True, inline="always")
def start_outer(acc, outer, cfg):
    """Promotion: the outer accumulators take what :func:`start_accumulators` left (c, exact
    in the fp32 accumulator), the accumulators restart at 0."""
    if cfg[W_PROMOTION] > 0:
        for lane in range(acc.shape[0]):
            outer[lane] = acc[lane]
            acc[lane] = 0.0


@njit(cache=True, inline="always")
def promote(acc, outer, flags):
    """outer = outer + acc, one IEEE binary32 addition (nearest even), and acc = 0; flags
    where outer is not 0 or a normal fp32 value (the generic kernel's outer register takes
    subnormals and overflows)."""
    for lane in range(acc.shape[0]):
        total = np.float32(outer[lane]) + np.float32(acc[lane])
        outer[lane] = total
        acc[lane] = 0.0
        magnitude = abs(total)
        flags[lane] |= not (
            magnitude == 0.0 or FLOAT32_SMALLEST_NORMAL <= magnitude <= FLOAT32_LARGEST
        )


@njit(cache=True, inline="always")
def after_tree(stop, acc, outer, flags, cfg):
    """Promotion after the tree ending at product ``stop`` where the interval says so."""
    interval = cfg[W_PROMOTION]
    if interval > 0 and stop % interval == 0:
        promote(acc, outer, flags)


@njit(cache=True, inline="always")
def finish_outer(acc, outer, flags, cfg):
    """Promotion: the last add into the outer accumulator, whose value acc then holds for
    :func:`encode_outputs`."""
    if cfg[W_PROMOTION] > 0:
        promote(acc, outer, flags)
        for lane in range(acc.shape[0]):
            acc[lane] = outer[lane]


@njit(cache=True, inline="always")
def _reference_lanes(maxima, shifts, acc, references, factors, window, threshold, in_tree):
    """:func:`tree_references`' loop, inlined with ``in_tree`` a constant (as
    :func:`_finish_lanes`)."""
    for lane in range(references.shape[0]):
        shift = np.int64(shifts[lane])
        reference = (
            np.int64(maxima[lane]) + shift if maxima[lane] >= threshold else np.int64(NO_REFERENCE)
        )
        if in_tree:  # a zero accumulator's exponent, -1023, lies below NO_REFERENCE
            reference = max(reference, _exponent(acc[lane]))
        references[lane] = reference
        # Clamped: beyond 2^-126 every product is far below one LSB; beyond 2^127 there are no nonzero products.
        factors[lane] = _power_of_two_32(min(max(window + shift - reference, -126), 127))


@njit(cache=True, **NO_REFCOUNTS)
def tree_references(maxima, shifts, acc, references, factors, cfg):
    """Per lane: the tree's reference exponent R (block scale included) and the float32
    factor 2^(W + scale - R) that puts unscaled products in units of the window's LSB."""
    window = cfg[W_WINDOW_BITS]
    threshold = cfg[W_THRESHOLD]
    if cfg[W_ACC_IN_TREE] != 0:
        _reference_lanes(maxima, shifts, acc, references, factors, window, threshold, True)
    else:
        _reference_lanes(maxima, shifts, acc, references, factors, window, threshold, False)


@njit(cache=True, **NO_REFCOUNTS)
def parity_halves(start, length, totals, references, first_totals, first_references, flags, cfg):
    """Under parity windows (``W_PARITY``; the kernels' trees are then half trees), the
    window at product ``start`` of K's ``length``: a first half followed by a second is kept
    (its sums and references copied to ``first_totals`` and ``first_references``; returns
    True: the caller finishes no tree), a second half joins the kept one
    (:func:`join_halves`). Returns False but for a kept first half, and does nothing without
    parity windows. One compiled stage that every window kernel calls."""
    terms = cfg[W_FUSED_TERMS]
    if cfg[W_PARITY] == 0:
        return False
    if (start // terms) % 2 == 0:
        if start + terms >= length:  # (a last half alone: no second to join)
            return False
        for lane in range(totals.shape[0]):
            first_totals[lane] = totals[lane]
            first_references[lane] = references[lane]
        return True
    join_halves(first_totals, first_references, totals, references, flags, cfg)
    return False


@njit(cache=True, **NO_REFCOUNTS)
def join_halves(first_totals, first_references, totals, references, flags, cfg):
    """``adder.parity_windows``, per lane: the window sum of a tree's even positions
    (``first_totals``, integers in units of 2^(R0 - W), R0 = ``first_references``) and of its
    odd ones (``totals``, ``references``: R1), each kept to multiples of 2^(max(R0, R1) - W)
    toward -inf and added into ``totals``; ``references`` becomes the larger R (NO_REFERENCE
    only where neither half has a nonzero term). The floors of float64 integers times powers
    of two are exact (a half without a nonzero term sums to 0 whatever it is scaled by). A
    half whose R lies below the zero floor flags the lane, as :func:`finish_tree` flags a
    tree's."""
    zero_floor = cfg[W_ZERO_FLOOR]
    for lane in range(totals.shape[0]):
        first, second = first_references[lane], references[lane]
        top = max(first, second)
        kept = np.floor(first_totals[lane] * power_of_two(max(first - top, -1000)))
        totals[lane] = kept + np.floor(totals[lane] * power_of_two(max(second - top, -1000)))
        references[lane] = top
        flags[lane] |= (NO_REFERENCE < first < zero_floor) | (NO_REFERENCE < second < zero_floor)


@njit(cache=True, inline="always")
def _finish_lanes(lanes, in_tree, one_rounding, truncating, rounded_sum, first_rule, acc_rule, cfg):
    """:func:`finish_tree`'s loop, inlined with ``in_tree`` and ``one_rounding`` constants
    so that each copy computes only its own stages. ``rounded_sum`` stays a runtime flag: in
    the one-rounding loop it only picks which value's range is checked, and a copy per value
    of it for the other units cost compile time and gained nothing measurable.

    ``one_rounding`` (the accumulator in the tree, and no n-bit sum or one at most as precise
    as the accumulator): the tree's value is rounded once, by ``first_rule``: the n-bit sum's
    (then on the accumulator's grid already, so that its rounding into the accumulator is the
    identity, and the rounded sum's range is checked) or, without an n-bit sum, the
    accumulator's (the unrounded value's range is checked: below it the accumulator rounds
    at a coarser, subnormal step). Otherwise the n-bit sum's rounding (``first_rule``) where
    ``rounded_sum``, then the accumulator's.

    ``truncating`` (a constant, with ``one_rounding``): ``first_rule`` rounds toward zero, a
    mask on the float64 pattern (sign-magnitude) instead of :func:`round_bits`' bias
    arithmetic; truncation keeps a magnitude at or above 2^low exactly when the unrounded
    one is, so the range check reads the unrounded value whichever rounding it was."""
    totals, references, acc, flags, window = lanes
    low, high = cfg[W_ACC_MIN_EXPONENT], cfg[W_ACC_MAX_EXPONENT]
    zero_floor = cfg[W_ZERO_FLOOR]
    for lane in range(totals.shape[0]):
        reference = references[lane]
        # A zero term might raise R: the generic kernel's case, unless the tree has no nonzero
        # term at all (its sum is 0 whatever R is).
        outside = NO_REFERENCE < reference < zero_floor
        total = totals[lane]
        previous = acc[lane]
        if in_tree:  # |acc| < 2^(R+1): its truncation toward zero fits W + 1 bits
            total += np.trunc(previous * power_of_two(window - reference))
        value = total * power_of_two(reference - window)  # exact: |total| < 2^53
        if one_rounding:
            if truncating:
                mask = np.int64(-1) << first_rule[0]
                rounded = np.int64(np.float64(value).view(np.int64) & mask).view(np.float64)
                checked = value
            else:
                rounded = round_bits(value, first_rule)
                checked = rounded if rounded_sum else value
            ok = (value == 0.0) | (
                (abs(checked) >= power_of_two(low)) & (abs(rounded) < power_of_two(high + 1))
            )
            result = rounded if ok else 0.0
        else:
            if rounded_sum:
                value = round_bits(value, first_rule)
            if not in_tree:
                high_part, error = two_sum(previous, value)
                value = round_to_odd(high_part, error)
            result, ok = _round_in_range(value, acc_rule, low, high)
        acc[lane] = result
        flags[lane] |= outside | (not ok)


@njit(cache=True, inline="always")
def _finish_lanes_float32(lanes, cut_bits, zero_floor):
    """:func:`finish_tree`'s loop for an accumulator outside the tree that is IEEE binary32
    rounding to nearest even, after an n-bit sum of at most 24 bits that truncates, every
    nonzero one provably a normal float32 (``W_FLOAT32_ADD``): the truncation is a mask on
    the float64 pattern (sign-magnitude: the ``cut_bits`` low bits cleared), the truncated
    sum is exactly a float32, and its rounding into the accumulator is one float32 addition
    (correctly rounded, ties to even) instead of TwoSum, round to odd and a rounding by bits.
    Lanes whose result is not 0 or a normal float32 are flagged, as the other loops flag
    them. An exact zero result is told by acc == -sum rather than by the result being 0, so
    that a subnormal result flushed to zero (a process running with flush-to-zero) is
    flagged all the same."""
    totals, references, acc, flags, window = lanes
    mask = np.int64(-1) << cut_bits
    for lane in range(totals.shape[0]):
        reference = references[lane]
        outside = NO_REFERENCE < reference < zero_floor  # as in _finish_lanes
        value = totals[lane] * power_of_two(reference - window)  # exact: |total| < 2^53
        term = np.float32(np.int64(np.float64(value).view(np.int64) & mask).view(np.float64))
        previous = np.float32(acc[lane])
        result = previous + term
        # Both addends are multiples of 2^-149: a sum below 2^-126 is exact (subnormal), so
        # no exact sum below the smallest normal rounds up to it.
        normal = (abs(result) >= np.float32(FLOAT32_SMALLEST_NORMAL)) & (
            abs(result) < np.float32(np.inf)
        )
        ok = (previous == -term) | normal
        acc[lane] = np.float64(result) if ok else 0.0
        flags[lane] |= outside | (not ok)


@njit(cache=True, inline="always")
def _finish_lanes_second_alignment(lanes, bits, far_dropped, acc_rule, cfg, binary32):
    """:func:`finish_tree`'s loop for a second alignment of ``bits`` n (``W_SECOND_ALIGNMENT``;
    the accumulator outside the tree, no n-bit sum): at E = max(R, e), e the accumulator's
    exponent (at least its format's emin, that emin for 0; R none for a tree without a
    nonzero term), the tree's sum kept to multiples of 2^(E-n-1) and the accumulator to
    multiples of 2^(E-W) (dropped where ``far_dropped`` and e < E - W - 1), both toward
    -inf, their exact sum cut to n+1 significant bits toward -inf (no finer than
    2^(emin-n)), then rounded into the accumulator (lanes whose result is not 0 or normal
    flagged, as elsewhere).

    The register is held in units of 2^(E-n-1) (``units``: the two floors at their grids,
    then their sum, exact in float64 as the register's span is at most max(n+1, W) + 3 bits
    plus the log2 of the tree's terms), where the cut and the rounding are bit
    arithmetic on the float64 pattern (:func:`round_bits`; both keep significant bits, so
    neither depends on the unit) before one exact scaling back. The cut keeps n+1 bits
    whatever the register's exponent: for a register below 2^emin, which the generic kernel
    cuts no finer than 2^(emin-n), the result is below 2^emin too (flagged) unless both cuts
    reach -2^emin. ``binary32`` (a constant: an IEEE binary32 accumulator rounding to nearest
    even, :func:`binary32_nearest`): that rounding is the float64 -> float32 conversion."""
    totals, references, acc, flags, window = lanes
    low, high = cfg[W_ACC_MIN_EXPONENT], cfg[W_ACC_MAX_EXPONENT]
    zero_floor = cfg[W_ZERO_FLOOR]
    cut_rule = rounding_rule(bits + 1, ROUND_TOWARD_NEGATIVE)
    acc_unit = power_of_two(bits + 1 - window)  # 2^(E-W) in units of 2^(E-n-1)
    for lane in range(totals.shape[0]):
        reference = references[lane]
        outside = NO_REFERENCE < reference < zero_floor  # as in _finish_lanes
        previous = acc[lane]
        exponent = max(_exponent(previous), low)  # (a zero's -1023 gives emin)
        no_tree = reference == NO_REFERENCE
        top = exponent if no_tree else max(exponent, reference)
        tree_units = np.floor(totals[lane] * power_of_two(reference - top + bits + 1 - window))
        acc_units = np.floor(previous * power_of_two(window - top)) * acc_unit
        if far_dropped and exponent < top - window - 1:
            acc_units = 0.0
        units = (0.0 if no_tree else tree_units) + acc_units
        value = round_bits(units, cut_rule) * power_of_two(top - bits - 1)
        if binary32:  # (a result of 2^128 or more is Inf)
            rounded = np.float64(np.float32(value))
        else:
            rounded = round_bits(value, acc_rule)
        ok = (units == 0.0) | (
            (abs(value) >= power_of_two(low)) & (abs(rounded) < power_of_two(high + 1))
        )
        acc[lane] = rounded if ok else 0.0
        flags[lane] |= outside | (not ok)


@njit(cache=True, inline="always")
def binary32_nearest(cfg):
    """Whether the accumulator is IEEE binary32 (24 bits, normal exponents -126..127)
    rounding to nearest even: its rounding of a float64 is the float32 conversion."""
    return (
        cfg[W_ACC_BITS] == 24
        and cfg[W_ACC_ROUNDING] == ROUND_NEAREST_EVEN
        and cfg[W_ACC_MIN_EXPONENT] == -126
        and cfg[W_ACC_MAX_EXPONENT] == 127
    )


@njit(cache=True, **NO_REFCOUNTS)
def finish_tree(totals, references, acc, flags, cfg):
    """Per lane: the tree's integer sum (in LSBs of 2^(R - W)), the accumulator when it
    joins the tree truncated to the window too, then the n-bit sum and the accumulation.

    ``totals`` holds the integers as float64 (exact: the callers keep tree sums below 2^53),
    and the accumulator's truncation is ``np.trunc``: float64 <-> int64 conversions have no
    SIMD instruction before AVX-512, and this loop runs once per tree and output. Three
    loops: units whose accumulator joins the tree with one rounding (the GPU FP8 units: an
    n-bit sum no more precise than the accumulator, or none), with two, and units whose
    accumulator does not join the tree: a stage a unit lacks (TwoSum and round-to-odd, the
    truncated accumulator, a second rounding), left in the loop under a branch, is computed
    for every lane all the same once the loop is vectorised."""
    window = cfg[W_WINDOW_BITS]
    sum_bits = cfg[W_SUM_BITS]
    sum_rule = rounding_rule(max(sum_bits, 1), cfg[W_SUM_ROUNDING])  # unused when sum_bits is 0
    acc_rule = rounding_rule(cfg[W_ACC_BITS], cfg[W_ACC_ROUNDING])
    rounded_sum = sum_bits > 0
    lanes = (totals, references, acc, flags, window)
    if cfg[W_SECOND_ALIGNMENT] != 0:
        bits, far_dropped = cfg[W_SECOND_ALIGNMENT] - 1, cfg[W_FAR_DROPPED] != 0
        if binary32_nearest(cfg):
            _finish_lanes_second_alignment(lanes, bits, far_dropped, acc_rule, cfg, True)
        else:
            _finish_lanes_second_alignment(lanes, bits, far_dropped, acc_rule, cfg, False)
    elif cfg[W_FLOAT32_ADD] != 0:
        _finish_lanes_float32(lanes, sum_rule[0], cfg[W_ZERO_FLOOR])
    elif cfg[W_ACC_IN_TREE] == 0:
        _finish_lanes(lanes, False, False, False, rounded_sum, sum_rule, acc_rule, cfg)
    elif sum_bits <= cfg[W_ACC_BITS]:
        first_rule = sum_rule if rounded_sum else acc_rule
        first_rounding = cfg[W_SUM_ROUNDING] if rounded_sum else cfg[W_ACC_ROUNDING]
        if first_rounding == ROUND_TOWARD_ZERO:
            _finish_lanes(lanes, True, True, True, rounded_sum, first_rule, acc_rule, cfg)
        else:
            _finish_lanes(lanes, True, True, False, rounded_sum, first_rule, acc_rule, cfg)
    else:
        _finish_lanes(lanes, True, False, False, True, sum_rule, acc_rule, cfg)


@njit(cache=True)
def encode_outputs(acc, flags, out, cfg):
    """out = the output format's bits of acc rounded into it (flags where not normal).

    ``acc`` holds what :func:`start_accumulators` and :func:`finish_tree` leave: every
    unflagged lane 0 or a normal value of the accumulator (at most ``W_ACC_BITS``
    significant bits, exponent within its range). An output format with IEEE binary32's
    fields that holds every such value (as precise, its range as wide) rounds none of them
    and flags none: the code is then the value's float32 bits, one conversion a lane
    (:func:`_binary32_outputs`; a flagged lane's code is the generic kernel's to write)."""
    if (
        cfg[W_OUT_BITS] == 24
        and cfg[W_OUT_MANTISSA_BITS] == 23
        and cfg[W_OUT_BIAS] == 127
        and cfg[W_OUT_SIGN_SHIFT] == 31
        and cfg[W_ACC_BITS] <= 24
        and -126 <= cfg[W_OUT_MIN_EXPONENT] <= cfg[W_ACC_MIN_EXPONENT]
        and cfg[W_ACC_MAX_EXPONENT] <= cfg[W_OUT_MAX_EXPONENT] <= 127
    ):
        _binary32_outputs(acc, out)
        return
    rule = rounding_rule(cfg[W_OUT_BITS], cfg[W_OUT_ROUNDING])
    low, high = cfg[W_OUT_MIN_EXPONENT], cfg[W_OUT_MAX_EXPONENT]
    mantissa_bits, bias, sign_shift = (
        cfg[W_OUT_MANTISSA_BITS],
        cfg[W_OUT_BIAS],
        cfg[W_OUT_SIGN_SHIFT],
    )
    for lane in range(acc.shape[0]):
        value, ok = _round_in_range(acc[lane], rule, low, high)
        flags[lane] |= not ok
        bits = np.float64(value).view(np.int64)
        code = 0
        if value != 0.0:
            code = (
                ((bits >> 63) & 1) << sign_shift
                | (_exponent(value) + bias) << mantissa_bits
                | ((bits >> (52 - mantissa_bits)) & ((np.int64(1) << mantissa_bits) - 1))
            )
        out[lane] = code


@njit(cache=True, inline="always")
def _binary32_outputs(acc, out):
    """out = the float32 bits of acc (values exact in float32), code 0 for either zero (as
    :func:`encode_outputs`' generic loop writes it)."""
    for lane in range(acc.shape[0]):
        value = acc[lane]
        out[lane] = np.float32(value).view(np.uint32) if value != 0.0 else np.uint32(0)


# The short helpers below that only these kernels call (the tile scales, the scratch arrays,
# the finiteness checks) and a work item's body are inlined in Numba's IR: compiled as kernels
# of their own, each would pay a compile's fixed cost and be optimised twice (alone, then
# again inside its caller's module), which added seconds to a unit's first use.


@njit(cache=True)
def _decode_tile(codes, first, lanes, values, exponents):
    """(tile_values, tile_exponents): tile_values[k, lane] = values[codes[first + lane, k]]
    (float32) and the exponents alike (int8), rows of codes become the lanes of a (K, lanes)
    tile (:func:`_decode_into`)."""
    length = codes.shape[1]
    tile_values = np.empty((length, lanes), dtype=np.float32)
    tile_exponents = np.empty((length, lanes), dtype=np.int8)
    _decode_into(codes, first, lanes, values, exponents, tile_values, tile_exponents)
    return tile_values, tile_exponents


@njit(cache=True, inline="always")
def _decode_into(codes, first, lanes, values, exponents, tile_values, tile_exponents):
    """Lanes 0 to ``lanes`` of the (K, >= lanes) tiles: tile_values[k, lane] =
    values[codes[first + lane, k]] and the exponents alike. Blocked along K so that the reads
    and the transposed writes stay in a few cache lines: ``DECODE_BLOCK`` rows of the tile at
    a time. The tile's rows lie a multiple of 4 KiB apart (1024 lanes), so that the lines
    written at once share one set of an 8-way L1 cache: more than eight of them evict each
    other at every lane (64 rows at a time made the decode several times slower)."""
    length = codes.shape[1]
    for k0 in range(0, length, DECODE_BLOCK):
        k1 = min(k0 + DECODE_BLOCK, length)
        for lane in range(lanes):
            row = codes[first + lane]
            for k in range(k0, k1):
                code = row[k]
                tile_values[k, lane] = values[code]
                tile_exponents[k, lane] = exponents[code]


@njit(cache=True)
def decode_tiles(codes, values, exponents, width):
    """Every column tile of a batch of B given as (G, N, K) codes, decoded as
    :func:`_column_tile` decodes one: (G, tiles, K, width) float32 values and int8 exponents,
    tile t holding columns t * width onwards (the last tile's lanes past N are 0), for a B
    that is kept from call to call (a model's weight)."""
    n_groups, n_columns, length = codes.shape
    n_tiles = (n_columns + width - 1) // width
    tile_values = np.zeros((n_groups, n_tiles, length, width), dtype=np.float32)
    tile_exponents = np.zeros((n_groups, n_tiles, length, width), dtype=np.int8)
    for g in range(n_groups):
        for tile in range(n_tiles):
            first = tile * width
            lanes = min(width, n_columns - first)
            _decode_into(
                codes[g],
                first,
                lanes,
                values,
                exponents,
                tile_values[g, tile],
                tile_exponents[g, tile],
            )
    return tile_values, tile_exponents


@njit(cache=True, inline="always")
def _tile_scales(scales, first, lanes, scaled):
    """tile[block, lane] = scales[first + lane, block], NaN scales as 0 (their lanes are
    flagged): the scales of a tile's columns, transposed once rather than gathered per row.
    Empty when the unit takes no scales."""
    tile = np.empty((scales.shape[1] if scaled else 0, lanes), dtype=np.int32)
    for lane in range(lanes):
        for block in range(tile.shape[0]):
            value = scales[first + lane, block]
            tile[block, lane] = 0 if value == SCALE_NAN else value
    return tile


@njit(cache=True, inline="always")
def _unusable(codes, scales, finite, scaled):
    """Whether a row of codes holds a non-finite element or (``scaled``) a NaN block scale."""
    count = 0
    for code in codes:
        count += not finite[code]
    if scaled:
        for value in scales:
            count += value == SCALE_NAN
    return count != 0


@njit(cache=True, inline="always")
def _lane_scratch(lanes):
    """Per-tree, per-lane working arrays: exponent-sum maxima, block-scale shifts, references,
    window factors, int32 group sums and tree sums (float64 integers: :func:`finish_tree`)."""
    return (
        np.empty(lanes, dtype=np.int8),
        np.zeros(lanes, dtype=np.int32),
        np.empty(lanes, dtype=np.int64),
        np.empty(lanes, dtype=np.float32),
        np.empty(lanes, dtype=np.int32),
        np.empty(lanes, dtype=np.float64),
    )


@njit(cache=True, inline="always")
def lane_trees(
    values_a, exponents_a, values_b, exponents_b, shifts, acc, outer, flags, scratch, cfg
):
    """Every tree of row-wise dot products whose operands are decoded into (K, lanes) tiles
    (values float32, exponents int8; lane l's A and B elements in column l): per tree the
    exponent-sum maxima, :func:`tree_references`, the truncated terms summed in int32 groups
    of ``group`` and :func:`finish_tree` into ``acc`` and ``flags``. ``shifts`` (trees,
    lanes) int32: each tree's Xa + Xb per lane (zeros without scales); ``scratch``:
    :func:`_lane_scratch` of the lanes and two arrays of them for a parity tree's first half
    (:func:`parity_halves`: float64 sums, int64 references); ``outer``: the outer
    accumulators of a promoting unit (:func:`start_outer`, :func:`after_tree`)."""
    length, lanes = values_a.shape
    fused_terms, group = cfg[W_FUSED_TERMS], cfg[W_GROUP]
    maxima, _, references, factors, partial, totals, first_totals, first_references = scratch
    for start in range(0, length, fused_terms):
        stop = min(start + fused_terms, length)
        maxima[:] = -128
        for k in range(start, stop):
            for lane in range(lanes):
                maxima[lane] = max(
                    maxima[lane], np.int8(exponents_a[k, lane] + exponents_b[k, lane])
                )
        tree_references(maxima, shifts[start // fused_terms], acc, references, factors, cfg)
        totals[:] = 0
        for group_start in range(start, stop, group):
            partial[:] = 0
            for k in range(group_start, min(group_start + group, stop)):
                for lane in range(lanes):
                    partial[lane] += np.int32(values_a[k, lane] * values_b[k, lane] * factors[lane])
            for lane in range(lanes):
                totals[lane] += partial[lane]
        if parity_halves(
            start, length, totals, references, first_totals, first_references, flags, cfg
        ):
            continue
        finish_tree(totals, references, acc, flags, cfg)
        after_tree(start + fused_terms, acc, outer, flags, cfg)


@njit(cache=True, **NO_REFCOUNTS)
def _pair_maxima(codes0, codes1, exponents, tile_exponents, start, stop, maxima0, maxima1):
    """maxima0[lane] = max over k in [start, stop) of exponents[codes0[k]] + tile_exponents[k, lane]
    (int8), maxima1 alike for codes1: two rows of A against a tile of B's columns. Two rows and
    four k per pass over the lanes, so that each load of the tile serves two rows and the loop
    overhead and the loads and stores of the maxima are paid once for four terms."""
    maxima0[:] = -128
    maxima1[:] = -128
    k = start
    while k + 4 <= stop:
        e0, e1, e2, e3 = (
            exponents[codes0[k]],
            exponents[codes0[k + 1]],
            exponents[codes0[k + 2]],
            exponents[codes0[k + 3]],
        )
        f0, f1, f2, f3 = (
            exponents[codes1[k]],
            exponents[codes1[k + 1]],
            exponents[codes1[k + 2]],
            exponents[codes1[k + 3]],
        )
        b0, b1, b2, b3 = (
            tile_exponents[k],
            tile_exponents[k + 1],
            tile_exponents[k + 2],
            tile_exponents[k + 3],
        )
        for lane in range(maxima0.shape[0]):
            x0, x1, x2, x3 = b0[lane], b1[lane], b2[lane], b3[lane]
            first = max(np.int8(e0 + x0), np.int8(e1 + x1))
            second = max(np.int8(e2 + x2), np.int8(e3 + x3))
            maxima0[lane] = max(maxima0[lane], max(first, second))
            first = max(np.int8(f0 + x0), np.int8(f1 + x1))
            second = max(np.int8(f2 + x2), np.int8(f3 + x3))
            maxima1[lane] = max(maxima1[lane], max(first, second))
        k += 4
    for k in range(k, stop):
        e0, f0, b0 = exponents[codes0[k]], exponents[codes1[k]], tile_exponents[k]
        for lane in range(maxima0.shape[0]):
            maxima0[lane] = max(maxima0[lane], np.int8(e0 + b0[lane]))
            maxima1[lane] = max(maxima1[lane], np.int8(f0 + b0[lane]))


@njit(cache=True, **NO_REFCOUNTS)
def _pair_group(
    codes0, codes1, values, tile_values, factors0, factors1, start, stop, partial0, partial1
):
    """partial0[lane] = sum over k in [start, stop) of the truncated term
    int32(values[codes0[k]] * tile_values[k, lane] * factors0[lane]), partial1 alike for
    codes1 and factors1: one int32 group of two rows of A against a tile of B's columns (the
    caller bounds the group so that no sum of its terms overflows). Two rows and four k per
    pass over the lanes, as in :func:`_pair_maxima`."""
    partial0[:] = 0
    partial1[:] = 0
    k = start
    while k + 4 <= stop:
        v0, v1, v2, v3 = (
            values[codes0[k]],
            values[codes0[k + 1]],
            values[codes0[k + 2]],
            values[codes0[k + 3]],
        )
        w0, w1, w2, w3 = (
            values[codes1[k]],
            values[codes1[k + 1]],
            values[codes1[k + 2]],
            values[codes1[k + 3]],
        )
        b0, b1, b2, b3 = tile_values[k], tile_values[k + 1], tile_values[k + 2], tile_values[k + 3]
        for lane in range(partial0.shape[0]):
            x0, x1, x2, x3 = b0[lane], b1[lane], b2[lane], b3[lane]
            factor = factors0[lane]
            first = np.int32(v0 * x0 * factor) + np.int32(v1 * x1 * factor)
            second = np.int32(v2 * x2 * factor) + np.int32(v3 * x3 * factor)
            partial0[lane] += first + second
            factor = factors1[lane]
            first = np.int32(w0 * x0 * factor) + np.int32(w1 * x1 * factor)
            second = np.int32(w2 * x2 * factor) + np.int32(w3 * x3 * factor)
            partial1[lane] += first + second
        k += 4
    for k in range(k, stop):
        v0, w0, b0 = values[codes0[k]], values[codes1[k]], tile_values[k]
        for lane in range(partial0.shape[0]):
            partial0[lane] += np.int32(v0 * b0[lane] * factors0[lane])
            partial1[lane] += np.int32(w0 * b0[lane] * factors1[lane])


@njit(cache=True, inline="always")
def _column_tile(
    tile,
    width,
    first_block,
    blocks_per_chunk,
    kept_values,
    kept_exponents,
    g,
    codes_a,
    codes_b,
    scales_a,
    scales_b,
    c_values,
    a_values,
    a_exponents,
    b_values,
    b_exponents,
    bad_rows,
    bad_columns,
    cfg,
    out,
    flags,
):
    """One work item of :func:`window_items`: the outputs of the columns of tile ``tile``
    (columns ``tile * width`` onwards, ``width`` of them, fewer at the end) in row blocks
    ``first_block`` onwards (``blocks_per_chunk`` of them, fewer at the end). The tile of B
    is decoded here, or read from ``kept_values[g, tile]`` and ``kept_exponents[g, tile]``
    where those hold B's decoded tiles (:func:`decode_tiles`; empty otherwise)."""
    n_rows, length = codes_a.shape
    n_columns = codes_b.shape[0]
    n_blocks = (n_rows + ROW_BLOCK - 1) // ROW_BLOCK
    fused_terms, group, block_size = cfg[W_FUSED_TERMS], cfg[W_GROUP], cfg[W_BLOCK_SIZE]
    scaled = cfg[W_SCALED] != 0
    c_rows = c_values.shape[0]
    column0 = tile * width
    lanes = min(width, n_columns - column0)
    if kept_values.shape[0] > 0:
        tile_values, tile_exponents = kept_values[g, tile], kept_exponents[g, tile]
    else:
        tile_values, tile_exponents = _decode_tile(codes_b, column0, lanes, b_values, b_exponents)
    tile_scales = _tile_scales(scales_b, column0, lanes, scaled)
    acc = np.empty((ROW_BLOCK, lanes))
    outer = np.empty((ROW_BLOCK, lanes))
    tile_flags = np.empty((ROW_BLOCK, lanes), dtype=np.uint8)
    maxima, shifts, references, factors, partial, totals = _lane_scratch(lanes)
    maxima1, shifts1, references1, factors1, partial1, totals1 = _lane_scratch(lanes)
    # A parity tree's first halves, row by row (none without parity windows).
    kept_rows = ROW_BLOCK if cfg[W_PARITY] != 0 else 0
    first_totals = np.empty((kept_rows, lanes))
    first_references = np.empty((kept_rows, lanes), dtype=np.int64)
    halves = kept_rows != 0
    for row_block in range(first_block, min(first_block + blocks_per_chunk, n_blocks)):
        row0 = row_block * ROW_BLOCK
        rows = min(ROW_BLOCK, n_rows - row0)
        for row in range(rows):
            m = row0 + row
            for lane in range(lanes):
                tile_flags[row, lane] = bad_rows[m] | bad_columns[column0 + lane]
            start_accumulators(c_values[m % c_rows], column0, acc[row], tile_flags[row], cfg)
            start_outer(acc[row], outer[row], cfg)
        for start in range(0, length, fused_terms):
            stop = min(start + fused_terms, length)
            block = start // block_size
            # Rows in pairs (the tile's loads serve both); an odd last row runs as its own
            # pair's second row too, its copy's results discarded.
            for row in range(0, rows, 2):
                other = min(row + 1, rows - 1)
                m, n = row0 + row, row0 + other
                _pair_maxima(
                    codes_a[m],
                    codes_a[n],
                    a_exponents,
                    tile_exponents,
                    start,
                    stop,
                    maxima,
                    maxima1,
                )
                if scaled:
                    scale_a = 0 if scales_a[m, block] == SCALE_NAN else scales_a[m, block]
                    scale_b = 0 if scales_a[n, block] == SCALE_NAN else scales_a[n, block]
                    scales = tile_scales[block]
                    for lane in range(lanes):
                        shifts[lane] = scale_a + scales[lane]
                        shifts1[lane] = scale_b + scales[lane]
                tree_references(maxima, shifts, acc[row], references, factors, cfg)
                tree_references(maxima1, shifts1, acc[other], references1, factors1, cfg)
                for group_start in range(start, stop, group):
                    _pair_group(
                        codes_a[m],
                        codes_a[n],
                        a_values,
                        tile_values,
                        factors,
                        factors1,
                        group_start,
                        min(group_start + group, stop),
                        partial,
                        partial1,
                    )
                    if group_start == start:  # the first group's sums start the totals
                        for lane in range(lanes):
                            totals[lane] = partial[lane]
                            totals1[lane] = partial1[lane]
                    else:
                        for lane in range(lanes):
                            totals[lane] += partial[lane]
                            totals1[lane] += partial1[lane]
                if halves:
                    first_kept = parity_halves(
                        start,
                        length,
                        totals,
                        references,
                        first_totals[row],
                        first_references[row],
                        tile_flags[row],
                        cfg,
                    )
                    parity_halves(
                        start,
                        length,
                        totals1,
                        references1,
                        first_totals[other],
                        first_references[other],
                        tile_flags[other],
                        cfg,
                    )
                    if first_kept:
                        continue
                finish_tree(totals, references, acc[row], tile_flags[row], cfg)
                if other != row:
                    finish_tree(totals1, references1, acc[other], tile_flags[other], cfg)
            for row in range(rows):
                after_tree(stop, acc[row], outer[row], tile_flags[row], cfg)
        for row in range(rows):
            finish_outer(acc[row], outer[row], tile_flags[row], cfg)
            encode_outputs(
                acc[row], tile_flags[row], out[row0 + row, column0 : column0 + lanes], cfg
            )
            for lane in range(
                lanes
            ):  # a loop: a slice assignment compiles Numba's shape-error formatting (seconds)
                flags[row0 + row, column0 + lane] = tile_flags[row, lane]


@njit(cache=True)
def unusable_rows(codes, scales, non_finite_mask, non_finite_pattern, scaled):
    """(G, rows) bools: whether each row of a batch of (G, rows, K) codes holds a code c with
    c & ``non_finite_mask`` == ``non_finite_pattern`` (``datapath.window``'s
    ``non_finite_codes``: every non-finite code matches) or (``scaled``) a NaN scale. A mask
    and a compare instead of a table lookup a code: the loop over a row's codes vectorises.
    Serial: a small fraction of a GEMM's time."""
    n_groups, n_rows, length = codes.shape
    bad = np.empty((n_groups, n_rows), dtype=np.bool_)
    mask, pattern = codes.dtype.type(non_finite_mask), codes.dtype.type(non_finite_pattern)
    for g in range(n_groups):
        for i in range(n_rows):
            row = codes[g, i]
            count = 0
            for k in range(length):
                count += (row[k] & mask) == pattern
            if scaled:
                for value in scales[g, i]:
                    count += value == SCALE_NAN
            bad[g, i] = count != 0
    return bad


@njit(cache=True, nogil=True)
def window_items(
    codes_a,
    codes_b,
    scales_a,
    scales_b,
    c_values,
    a_values,
    a_exponents,
    b_values,
    b_exponents,
    bad_rows,
    bad_columns,
    kept_values,
    kept_exponents,
    cfg,
    out,
    flags,
    n_tiles,
    width,
    items,
    blocks_per_chunk,
    start,
    stop,
):
    """Work items ``start`` to ``stop`` of a GEMM batch (``datapath.window.window_matmul``),
    ``items`` of them per group: column tile ``item % n_tiles`` (``width`` columns) of its
    group against the ``item // n_tiles``-th chunk of ``blocks_per_chunk`` row blocks; B's
    tiles decoded in each item, or read from ``kept_values`` and ``kept_exponents`` where
    they are not empty (:func:`decode_tiles`)."""
    c_groups = c_values.shape[0]
    for item in range(start, stop):
        g, rest = item // items, item % items
        _column_tile(
            rest % n_tiles,
            width,
            (rest // n_tiles) * blocks_per_chunk,
            blocks_per_chunk,
            kept_values,
            kept_exponents,
            g,
            codes_a[g],
            codes_b[g],
            scales_a[g],
            scales_b[g],
            c_values[g % c_groups],
            a_values,
            a_exponents,
            b_values,
            b_exponents,
            bad_rows[g],
            bad_columns[g],
            cfg,
            out[g],
            flags[g],
        )


@njit(cache=True, inline="always")
def _row_tile(
    row0,
    codes_a,
    codes_b,
    scales_a,
    scales_b,
    c_values,
    a_values,
    a_exponents,
    a_finite,
    b_values,
    b_exponents,
    b_finite,
    cfg,
    out,
    flags,
):
    """One work item of :func:`pair_items`: rows ``row0`` onwards, ``LANES`` of them (fewer
    at the end)."""
    n_rows, length = codes_a.shape
    fused_terms, block_size = cfg[W_FUSED_TERMS], cfg[W_BLOCK_SIZE]
    scaled = cfg[W_SCALED] != 0
    lanes = min(LANES, n_rows - row0)
    values_a, exponents_a = _decode_tile(codes_a, row0, lanes, a_values, a_exponents)
    values_b, exponents_b = _decode_tile(codes_b, row0, lanes, b_values, b_exponents)
    lane_flags = np.empty(lanes, dtype=np.uint8)
    for lane in range(lanes):
        i = row0 + lane
        lane_flags[lane] = _unusable(codes_a[i], scales_a[i], a_finite, scaled) | _unusable(
            codes_b[i], scales_b[i], b_finite, scaled
        )
    acc = np.empty(lanes)
    outer = np.empty(lanes)
    start_accumulators(c_values, row0, acc, lane_flags, cfg)
    start_outer(acc, outer, cfg)
    shifts = np.zeros(((length + fused_terms - 1) // fused_terms, lanes), dtype=np.int32)
    if scaled:
        for tree in range(shifts.shape[0]):
            block = tree * fused_terms // block_size
            for lane in range(lanes):
                scale_a, scale_b = scales_a[row0 + lane, block], scales_b[row0 + lane, block]
                shifts[tree, lane] = (0 if scale_a == SCALE_NAN else scale_a) + (
                    0 if scale_b == SCALE_NAN else scale_b
                )
    lane_trees(
        values_a,
        exponents_a,
        values_b,
        exponents_b,
        shifts,
        acc,
        outer,
        lane_flags,
        (*_lane_scratch(lanes), np.empty(lanes), np.empty(lanes, dtype=np.int64)),
        cfg,
    )
    finish_outer(acc, outer, lane_flags, cfg)
    encode_outputs(acc, lane_flags, out[row0 : row0 + lanes], cfg)
    for lane in range(lanes):
        flags[row0 + lane] = lane_flags[lane]


@njit(cache=True, nogil=True)
def pair_items(
    codes_a,
    codes_b,
    scales_a,
    scales_b,
    c_values,
    a_values,
    a_exponents,
    a_finite,
    b_values,
    b_exponents,
    b_finite,
    cfg,
    out,
    flags,
    start,
    stop,
):
    """Work items ``start`` to ``stop`` of ``datapath.window.window_dot``: rows
    ``start * LANES`` onwards, ``LANES`` rows (lanes) a work item."""
    for item in range(start, stop):
        _row_tile(
            item * LANES,
            codes_a,
            codes_b,
            scales_a,
            scales_b,
            c_values,
            a_values,
            a_exponents,
            a_finite,
            b_values,
            b_exponents,
            b_finite,
            cfg,
            out,
            flags,
        )
