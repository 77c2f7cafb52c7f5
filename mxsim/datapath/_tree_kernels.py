"""Fused kernels of the BLAS route (``blas.py``) for trees of 8 or 16 products: each tree's
exact sum is formed in registers and rounded into the fp32 accumulator at once, instead of
one GEMM per tree (which writes a whole float64 tile per 8 or 16 multiply-adds) and a
second pass over it."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._blas_kernels import odd_sum

#: Columns per pass: a tree's columns of B (packed, 8 x COLUMNS float64) stay in L1 while
#: every row of the tile takes the tree.
COLUMNS = 256
#: Values ``rne_trees8``' packed rows hold beyond a pass's COLUMNS: rows a power of two bytes
#: apart fall into the same few L1 sets.
PACKED_PAD = 8


@njit(cache=True, nogil=True)
def _copy_columns(source, target, g, j0, width):
    """target[g, :, j0 : j0 + width] = source[g, :, j0 : j0 + width], as loops: a slice
    assignment compiles Numba's shape-error formatting (about a second of CPU)."""
    for i in range(source.shape[1]):
        for j in range(j0, j0 + width):
            target[g, i, j] = source[g, i, j]


@njit(cache=True, nogil=True, fastmath={"contract"})
def rne_trees8(a, b, trees, row_steps, column_steps, acc, spare, packed):
    """acc[g, i, j] = RNE_fp32(acc + S) for each tree in order: S = s 2^(Xa + Xb), s the
    tree's exact sum over k in [first, first + 8) of a[g, i, k] * b[g, j, k] (``trees``
    (T, 2): first, scale block), 2^Xa = row_steps[block, g, i], 2^Xb = column_steps[block,
    g, j]. ``a`` (g, rows, K) and ``b`` (g, columns, K) are float64 unscaled elements whose
    tree sums fit 53 bits (``tree_sum_bits``): every product (a 2^Xa)(b 2^Xb) and partial
    sum is a float64 (the steps are E8M0 powers of two, the results normal float64s), so no
    fused multiply-add can round. A zero sum counts as +0 (an exact sum has no sign; -0 + 0
    is +0), as the datapath kernel and its twin have it.

    Per pair of rows and pass, t = acc + S is rounded to float64 and converted to fp32
    (nearest even, IEEE overflow): the correctly rounded sum wherever t is exact, which
    holds iff t - acc == S and t - S == acc (one of the two differences is exact, Dekker's
    lemma, and differs when t is not). The rows whose pass is not all exact (or whose
    accumulator is infinite) are redone from the accumulator through the round-to-odd sum
    (``odd_sum``), as ``accumulate_rne_fp32``, after the pass and out of line
    (``_redo_rows``): the pass stays small enough for its loops to keep the elements in
    registers. Each tree reads the accumulators from one of ``acc`` and ``spare`` (same
    shape, float32) and writes the other (the result ends in ``acc``). ``packed`` an (8, W +
    PACKED_PAD) float64 scratch: a pass takes W columns, the tree's columns of B packed
    there (in L1 while every row takes the tree). Serial."""
    groups, rows, columns = acc.shape
    count = trees.shape[0]
    pass_columns = packed.shape[1] - PACKED_PAD
    zeros = np.zeros(pass_columns)  # the chains' start, +0, read from memory
    redo = np.zeros(rows, dtype=np.bool_)  # rows whose pass was not all exact
    for g in range(groups):
        for j0 in range(0, columns, pass_columns):
            width = min(pass_columns, columns - j0)
            for t in range(count):
                first, block = trees[t, 0], trees[t, 1]
                source, target = (acc, spare) if t % 2 == 0 else (spare, acc)
                for j in range(width):  # the tree's B transposed, times the column steps
                    step = column_steps[block, g, j0 + j]
                    for m in range(8):
                        packed[m, j] = b[g, j0 + j, first + m] * step
                for i in range(0, rows, 2):
                    k = min(i + 1, rows - 1)  # an odd last row pairs with itself
                    old0, new0 = source[g, i, j0 : j0 + width], target[g, i, j0 : j0 + width]
                    old1, new1 = source[g, k, j0 : j0 + width], target[g, k, j0 : j0 + width]
                    x = _eight(a[g, i], first, row_steps[block, g, i])
                    y = _eight(a[g, k], first, row_steps[block, g, k])
                    bad0, bad1 = _rne_rows(old0, new0, old1, new1, x, y, packed, zeros, width)
                    redo[i] |= bad0
                    redo[k] |= bad1
                if redo.any():
                    steps = row_steps[block, g]
                    _redo_rows(source, target, a, g, j0, width, first, steps, packed, redo)
                    redo[:] = False
            if count % 2:
                _copy_columns(spare, acc, g, j0, width)


@njit(cache=True, inline="always", fastmath={"contract"})
def _rne_rows(old0, new0, old1, new1, x, y, packed, zeros, width):
    """new = fp32(RN64(old + S)) for two rows, S the sum over m < 8 of x[m] packed[m, j] (of
    ``y`` for the second row; both read ``packed`` once per column), by :func:`_sum8` from
    +0 (``zeros``; exact in any order: the sums fit float64; an exact zero sum is +0,
    whatever its products' signs); whether any RN64 sum of either row was inexact."""
    rows = packed[0], packed[1], packed[2], packed[3], packed[4], packed[5], packed[6], packed[7]
    bad0 = bad1 = np.int64(0)
    for j in range(width):
        s, u = _sum8(zeros[j], x, rows, j), _sum8(zeros[j], y, rows, j)
        o = np.float64(old0[j])
        total0 = o + s
        new0[j] = np.float32(total0)
        bad0 |= _differ(total0 - o, s) | _differ(total0 - s, o)
        p = np.float64(old1[j])
        total1 = p + u
        new1[j] = np.float32(total1)
        bad1 |= _differ(total1 - p, u) | _differ(total1 - u, p)
    return bad0 != 0, bad1 != 0


@njit(cache=True, inline="always")
def _differ(first, second):
    """The bits of two float64s xor'd: 0 iff they are the same float64."""
    return np.float64(first).view(np.int64) ^ np.float64(second).view(np.int64)


@njit(cache=True, inline="always", fastmath={"contract"})
def _sum8(s, x, rows, j):
    """s + the sum over m < 8 of x[m] rows[m][j] (``rows`` a tuple of 8 arrays): two chains
    of fused multiply-adds, the even positions' from s and the odd positions' from their
    first product, added last (each chain half as long: the next column's sums start
    sooner). Exact in any order where the sums fit float64 (the adders leave the rounding
    to the caller). From s = +0 an exact zero sum is +0 whatever its products' signs: the
    even chain is then +0 (+0 plus products of zero), and +0 plus the odd chain's zero is
    +0; two opposite nonzero chains sum to +0 under rounding to nearest."""
    b0, b1, b2, b3, b4, b5, b6, b7 = rows
    even = s + x[0] * b0[j]
    odd = x[1] * b1[j]
    even += x[2] * b2[j]
    odd += x[3] * b3[j]
    even += x[4] * b4[j]
    odd += x[5] * b5[j]
    even += x[6] * b6[j]
    odd += x[7] * b7[j]
    return even + odd


@njit(cache=True)
def _redo_rows(source, target, a, g, j0, width, first, steps, packed, redo) -> None:
    """For each row i marked in ``redo``: target[g, i, j0 : j0 + width] = fp32(round-to-odd(
    source + S)), which is RNE_fp32(source + S), S the sum over m < 8 of a[g, i, first + m]
    steps[i] packed[m, j]."""
    for i in range(source.shape[1]):
        if not redo[i]:
            continue
        old, new = source[g, i, j0 : j0 + width], target[g, i, j0 : j0 + width]
        for j in range(width):
            s = 0.0
            for m in range(8):
                s += (a[g, i, first + m] * steps[i]) * packed[m, j]
            new[j] = np.float32(odd_sum(np.float64(old[j]), s + 0.0))


@njit(cache=True, nogil=True, fastmath={"contract"})
def grid_trees8(a, b, trees, row_steps, column_steps, limits, choices, acc, spare, work):
    """``grid_trees16``'s step for trees of 8 float64 products, in every mode but nearest even
    (refused: ``rne_trees8`` takes it), two rows at a time and with a cheaper exactness test.
    ``limits``: keep_factor, then exact_factor = 2^(low + 53), low the exponent of the
    formats' least product step. The accumulators are fp32 values
    held in float64 (no conversions per step); each tree reads them from one of ``acc`` and
    ``spare`` (same shape, float64) and writes the other (the result ends in ``acc``);
    ``work`` a (10, COLUMNS) float64 scratch.

    Per pair of rows and pass, t = RN64(acc + S) is rounded by ``_round_bits`` (its fp32
    result kept in float64: exact); a row is redone (as ``grid_trees16`` redoes one) where
    t - S != acc, or |t| reaches 2^127 (no rounding in the pass reaches fp32's overflow) or
    2^(Xa + least Xb) min(keep_factor / 2, exact_factor). That finds every inexact t: where
    |S| >= |acc|, t - S is exact (Dekker's lemma) and equals acc iff t is; where |acc| > |S|
    and t is inexact, the exact sum (a multiple of 2^(X + low), as S is, or of acc's fp32
    step where that is larger, and then below 2^(its exponent + 2): 25 bits) is a multiple
    of 2^(X + low) of more than 53 bits, so |t| >= 2^(X + low + 53). A kept accumulator and
    an infinite one reach the range bound. Serial."""
    groups, rows, columns = acc.shape
    keep_factor, exact_factor = limits
    directed, large_positive, large_negative = choices[0] != 0, choices[1] != 0, choices[2] != 0
    ties = not directed and (large_positive or large_negative)
    rounding = _bits_rounding(directed, large_positive, large_negative)
    if rounding[0] == 0:  # ``_round_bits64`` rounds by its mask alone
        raise ValueError("grid_trees8: choices must not be nearest even (rne_trees8 takes it)")
    flags = directed, large_positive, large_negative, ties
    packed, sums, column_limits = work[:8], work[-2], work[-1]
    count = trees.shape[0]
    for g in range(groups):
        for j0 in range(0, columns, COLUMNS):
            width = min(COLUMNS, columns - j0)
            for t in range(count):
                first, block = trees[t, 0], trees[t, 1]
                source, target = (acc, spare) if t % 2 == 0 else (spare, acc)
                steps = column_steps[block, g, j0 : j0 + width]
                for j in range(width):  # the tree's B transposed, times the column steps
                    for m in range(8):
                        packed[m, j] = b[g, j0 + j, first + m] * steps[j]
                    column_limits[j] = steps[j] * keep_factor
                least = steps.min() * min(keep_factor * 0.5, exact_factor)
                for i in range(0, rows - 1, 2):
                    old0, new0 = source[g, i, j0 : j0 + width], target[g, i, j0 : j0 + width]
                    old1 = source[g, i + 1, j0 : j0 + width]
                    new1 = target[g, i + 1, j0 : j0 + width]
                    step0, step1 = row_steps[block, g, i], row_steps[block, g, i + 1]
                    x, y = _eight(a[g, i], first, step0), _eight(a[g, i + 1], first, step1)
                    high0 = min(2.0**127, step0 * least)
                    high1 = min(2.0**127, step1 * least)
                    bad0, bad1 = _grid_rows(
                        old0, new0, old1, new1, x, y, packed, width, high0, high1, rounding
                    )
                    if bad0:
                        x8, limits0 = a[g, i, first : first + 8], (column_limits, step0)
                        _odd_grid_pass(old0, new0, x8, packed, sums, limits0, flags, False)
                    if bad1:
                        y8, limits1 = a[g, i + 1, first : first + 8], (column_limits, step1)
                        _odd_grid_pass(old1, new1, y8, packed, sums, limits1, flags, False)
                if rows % 2:  # the last row, as the first of a pair of it twice
                    i = rows - 1
                    old0, new0 = source[g, i, j0 : j0 + width], target[g, i, j0 : j0 + width]
                    step0 = row_steps[block, g, i]
                    x = _eight(a[g, i], first, step0)
                    high0 = min(2.0**127, step0 * least)
                    bad0, bad1 = _grid_rows(
                        old0, new0, old0, new0, x, x, packed, width, high0, high0, rounding
                    )
                    if bad0 or bad1:
                        x8, limits0 = a[g, i, first : first + 8], (column_limits, step0)
                        _odd_grid_pass(old0, new0, x8, packed, sums, limits0, flags, False)
            if count % 2:
                _copy_columns(spare, acc, g, j0, width)


@njit(cache=True, inline="always", fastmath={"contract"})
def _grid_rows(old0, new0, old1, new1, x, y, packed, width, high0, high1, rounding):
    """new = ``_round_bits``(RN64(old + S)) in float64 for two rows, S the sum over m < 8 of x[m]
    packed[m, j] (of ``y`` for the second row; both read ``packed`` once per column), by
    :func:`_sum8` (exact in any order: the sums fit float64); whether either row had a sum
    t with t - S != old or |t| at least its ``high``."""
    mask, add_positive, add_negative = rounding
    rows = packed[0], packed[1], packed[2], packed[3], packed[4], packed[5], packed[6], packed[7]
    magnitude = np.int64(0x7FFFFFFFFFFFFFFF)  # the bits of |t|, ordered as |t| is
    differ0 = differ1 = top0 = top1 = np.int64(0)
    for j in range(width):
        s, u = _sum8(0.0, x, rows, j), _sum8(0.0, y, rows, j)
        o = old0[j]
        total0 = o + s
        new0[j] = _round_bits64(total0, mask, add_positive, add_negative)
        differ0 |= _differ(total0 - s, o)
        top0 = max(top0, np.float64(total0).view(np.int64) & magnitude)
        p = old1[j]
        total1 = p + u
        new1[j] = _round_bits64(total1, mask, add_positive, add_negative)
        differ1 |= _differ(total1 - u, p)
        top1 = max(top1, np.float64(total1).view(np.int64) & magnitude)
    bad0 = differ0 != 0 or top0 >= np.float64(high0).view(np.int64)
    bad1 = differ1 != 0 or top1 >= np.float64(high1).view(np.int64)
    return bad0, bad1


@njit(cache=True, inline="always")
def _bits_rounding(directed, large_positive, large_negative):
    """``_round_bits``' (mask, add for a positive value, for a negative one) of a mode: nearest
    even is the conversion's; the other modes clear the 29 bits below fp32's last place after
    adding all of them (to the neighbour farther from zero), none, half of them (a tie away
    from zero) or just under (a tie toward zero)."""
    low, half = (1 << 29) - 1, 1 << 28
    if directed:
        return low, (low if large_positive else 0), (low if large_negative else 0)
    if large_positive or large_negative:
        return low, (half if large_positive else half - 1), (half if large_negative else half - 1)
    return 0, 0, 0


@njit(cache=True, nogil=True, fastmath={"contract"})
def grid_trees16(a, b, trees, row_steps, column_steps, keep_factor, choices, acc, work):
    """A fixed-point-grid unit's trees of 16 products above its floor (``blas.grid_floor``),
    fused: acc[g, i, j] = acc when |acc| >= 2^(Xa + Xb) keep_factor (its LSB more than the
    max left shift above the grid's: ``keep_factor`` = 2^(L - n + 24)), else acc + S rounded
    once to fp32 in the mode of ``choices`` (a ``blas.ROUNDING_CHOICES`` row), IEEE
    overflow, an exact zero +0; for each tree in order. S = s 2^(Xa + Xb) with s the tree's
    exact sum over k in [first, first + 16) of a[g, i, k] * b[g, j, k] (``trees`` (T, 2):
    first, scale block), 2^Xa = row_steps[block, g, i], 2^Xb = column_steps[block, g, j].
    ``a`` (g, rows, K) and ``b`` (g, columns, K) are float32 or float64 unscaled elements
    whose tree sums fit 53 bits, so every product (a 2^Xa)(b 2^Xb), partial sum and S is an
    exact float64 (as for ``rne_trees8``), and |S| < 2^(Xa + Xb) keep_factor / 4 (the caller
    checks). An infinite accumulator is kept (an earlier overflow stays the result).

    Per row and pass, t = acc + S in float64 is exact where t - acc == S and t - S == acc
    (Dekker's lemma, as ``rne_trees8``), then rounded by ``_round_bits``, which is right for
    |t| below 2^128 (above the floor every acc + S is a multiple of 2^-149). Where any of
    the row's pass is inexact, or |t| reaches 2^128 or 2^(Xa + least Xb) keep_factor / 2
    (which every kept accumulator plus S does), the pass is redone from the accumulator
    with the rule itself and the round-to-odd sum (``odd_sum``), rounded by
    ``_round_fp32``. ``work`` a (18, COLUMNS) float64 scratch. Serial."""
    groups, rows, columns = acc.shape
    directed, large_positive, large_negative = choices[0] != 0, choices[1] != 0, choices[2] != 0
    ties = not directed and (large_positive or large_negative)
    rounding = _bits_rounding(directed, large_positive, large_negative)
    flags = directed, large_positive, large_negative, ties
    packed, sums, column_limits = work[:16], work[-2], work[-1]
    fresh = np.empty(COLUMNS, dtype=np.float32)
    for g in range(groups):
        for j0 in range(0, columns, COLUMNS):
            width = min(COLUMNS, columns - j0)
            for t in range(trees.shape[0]):
                first, block = trees[t, 0], trees[t, 1]
                steps = column_steps[block, g, j0 : j0 + width]
                for j in range(width):  # the tree's B transposed, times the column steps
                    for m in range(16):
                        packed[m, j] = b[g, j0 + j, first + m] * steps[j]
                    column_limits[j] = steps[j] * keep_factor
                least = steps.min() * keep_factor * 0.5
                for i in range(rows):
                    out = acc[g, i, j0 : j0 + width]
                    step = row_steps[block, g, i]
                    x = a[g, i, first : first + 16]
                    high = min(2.0**128, step * least)
                    # the first 8 products summed ahead, the last 8 in the pass
                    _tree_sums(sums, x[:8], step, packed, width)
                    if _fast_pass(out, fresh, x[8:], packed[8:], sums, step, high, rounding):
                        out[:] = fresh[:width]
                        continue
                    limits = column_limits, step
                    _odd_grid_pass(out, fresh, x[8:], packed[8:], sums, limits, flags, True)
                    out[:] = fresh[:width]


@njit(cache=True, inline="always", fastmath={"contract"})
def _tree_sums(sums, x, step, packed, width) -> None:
    """sums[j] = the exact sum over m of (x[m] step) packed[m, j], 8 terms at a time."""
    sums[:width] = 0.0
    for c in range(0, x.shape[0], 8):
        b0, b1, b2, b3 = packed[c], packed[c + 1], packed[c + 2], packed[c + 3]
        b4, b5, b6, b7 = packed[c + 4], packed[c + 5], packed[c + 6], packed[c + 7]
        x0, x1 = np.float64(x[c]) * step, np.float64(x[c + 1]) * step
        x2, x3 = np.float64(x[c + 2]) * step, np.float64(x[c + 3]) * step
        x4, x5 = np.float64(x[c + 4]) * step, np.float64(x[c + 5]) * step
        x6, x7 = np.float64(x[c + 6]) * step, np.float64(x[c + 7]) * step
        for j in range(width):
            sums[j] += ((x0 * b0[j] + x1 * b1[j]) + (x2 * b2[j] + x3 * b3[j])) + (
                (x4 * b4[j] + x5 * b5[j]) + (x6 * b6[j] + x7 * b7[j])
            )


@njit(cache=True, inline="always")
def _eight(values, first, step):
    """values[first + m] * step for m < 8, as float64s."""
    return (
        np.float64(values[first]) * step,
        np.float64(values[first + 1]) * step,
        np.float64(values[first + 2]) * step,
        np.float64(values[first + 3]) * step,
        np.float64(values[first + 4]) * step,
        np.float64(values[first + 5]) * step,
        np.float64(values[first + 6]) * step,
        np.float64(values[first + 7]) * step,
    )


@njit(cache=True, inline="always")
def _bits_step(old, s, high, rounding):
    """(``_round_bits``(old + s), whether the float64 sum old + s was inexact or its
    magnitude at least ``high``)."""
    mask, add_positive, add_negative = rounding
    total = old + s  # (a -0 sum adds as +0: the accumulator is never -0 here)
    rounded = _round_bits(total, mask, add_positive, add_negative)
    return rounded, (total - old != s) | (total - s != old) | ~(abs(total) < high)


@njit(cache=True, inline="always", fastmath={"contract"})
def _fast_pass(out, fresh, x, packed, sums, step, high, rounding) -> bool:
    """fresh[j] = ``_round_bits``(out[j] + S), S = sums[j] plus the sum over m < 8 of
    (x[m] step) packed[m, j]; whether every float64 sum out[j] + S was exact and its
    magnitude below ``high`` (<= 2^128)."""
    b0, b1, b2, b3 = packed[0], packed[1], packed[2], packed[3]
    b4, b5, b6, b7 = packed[4], packed[5], packed[6], packed[7]
    x0, x1, x2, x3, x4, x5, x6, x7 = _eight(x, 0, step)
    missed = False
    for j in range(out.shape[0]):
        s = ((x0 * b0[j] + x1 * b1[j]) + (x2 * b2[j] + x3 * b3[j])) + (
            (x4 * b4[j] + x5 * b5[j]) + (x6 * b6[j] + x7 * b7[j])
        )
        s += sums[j]
        fresh[j], bad = _bits_step(np.float64(out[j]), s, high, rounding)
        missed |= bad
    return not missed


@njit(cache=True, inline="always", fastmath={"contract"})
def _odd_grid_pass(out, fresh, x, packed, sums, limits, flags, partial) -> None:
    """fresh[j] = out[j] where kept (|out| >= column_limits[j] step, ``limits`` the pair),
    else ``_round_fp32`` of the round-to-odd float64 sum out[j] + S (S as ``_fast_pass``'s;
    an exact zero sum +0), in the mode of ``flags`` (directed, large_positive,
    large_negative, ties)."""
    directed, large_positive, large_negative, ties = flags
    column_limits, step = limits
    for j in range(out.shape[0]):
        s = 0.0
        for m in range(8):
            s += (np.float64(x[m]) * step) * packed[m, j]
        if partial:
            s += sums[j]
        old = np.float64(out[j])
        total = odd_sum(old, s + 0.0)
        rounded = _round_fp32(total, directed, large_positive, large_negative, ties)
        fresh[j] = out[j] if abs(old) >= column_limits[j] * step else rounded


@njit(cache=True, inline="always")
def _round_bits64(value, mask, add_positive, add_negative):
    """``_round_bits``' fp32 result as a float64 (the bits it converts), for ``value`` below
    2^127 in magnitude (so no rounding reaches 2^128) and a nonzero ``mask`` (nearest even,
    mask 0, is the conversion's: not here)."""
    bits = np.float64(value).view(np.int64)
    add = add_negative if value < 0.0 else add_positive
    return np.int64((bits + add) & ~mask).view(np.float64)


@njit(cache=True, inline="always")
def _round_bits(value, mask, add_positive, add_negative):
    """``value`` rounded to fp32 through its float64 bits: plus ``add_positive`` or
    ``add_negative`` (by its sign), the ``mask`` bits cleared, converted (exactly; nearest
    even where ``mask`` is 0). The 29 bits below fp32's last place are those of a value
    from 2^-126 up to 2^128 (normal fp32s; the carry of a rounding up moves into the
    exponent, to Inf past fp32's largest): right there. Below 2^-126 it is right for
    multiples of 2^-149 (fp32 subnormals: those bits are 0, the add carries nothing)."""
    bits = np.float64(value).view(np.int64)
    add = add_negative if value < 0.0 else add_positive
    return np.float32(np.int64((bits + add) & ~mask).view(np.float64))


@njit(cache=True, inline="always")
def _round_fp32(value, directed, large_positive, large_negative, ties):
    """``value`` (a float64: acc + S exactly, or its round-to-odd at 53 bits, which lies
    strictly between the same fp32 neighbours) rounded to fp32: nearest even by the
    conversion, then, where the conversion rounded and the mode says so (``directed``, or
    ``ties`` and ``value`` is the midpoint of its neighbours), moved to the other neighbour
    when it is the one the mode takes (farther from zero: ``large_positive`` for a positive
    value, ``large_negative`` for a negative one; else nearer zero). IEEE overflow: past
    fp32's largest the neighbours are it and Inf (their midpoint 2^128 - 2^103). A zero
    ``value`` is kept (+0 for an exact zero sum from a +0 or nonzero accumulator, the only
    ones here). Branch-free."""
    nearest = np.float32(value)
    near = np.float64(nearest)
    up = abs(near) < abs(value)  # the conversion went toward zero: the other lies farther
    bits = nearest.view(np.int32)
    other = np.int32(bits + (1 if up else -1)).view(np.float32)
    edge = math.copysign(2.0**128, value)  # Inf's place in the midpoint
    here = near if abs(nearest) < np.inf else edge
    beyond = np.float64(other) if abs(other) < np.inf else edge
    tie = ties & ((here + beyond) * 0.5 == value)
    large = large_positive if value > 0.0 else large_negative
    move = (near != value) & (directed | tie) & (large == up)
    return other if move else nearest


@njit(cache=True, nogil=True, fastmath={"contract"})
def trees16_fp32(a, b, trees, row_steps, column_steps, keep_factor, choices, acc, work):
    """``grid_trees16`` for float32 products in any mode but nearest even (``choices`` a
    ``blas.ROUNDING_CHOICES`` row), in float32 arithmetic (twice the lanes): the caller checks that every element times its step
    (``row_steps``, ``column_steps``, float32 powers of two) and every tree sum times its
    two steps is a float32 (``blas._fp32_exact_blocks``), so S is exact in float32.

    Per row and tree, t = acc + S rounded to nearest and its exact error e (TwoSum, exact
    with gradual underflow) give the rounding: t, or its neighbour on e's side where the
    mode takes that one (directed: whenever e is not 0; nearest: where acc + S is their
    midpoint, t + 2e, which is then a float32). Where any |t| of the row's pass reaches 2^(Xa + least
    Xb) keep_factor / 2 (every kept accumulator plus S does; an infinite t too), the pass
    is redone as ``grid_trees16`` redoes one (the rule itself, round-to-odd in
    float64). ``work`` a (18, COLUMNS) float64 scratch. Serial."""
    groups, rows, columns = acc.shape
    directed, large_positive, large_negative = choices[0] != 0, choices[1] != 0, choices[2] != 0
    ties = not directed and (large_positive or large_negative)
    flags = directed, large_positive, large_negative, ties
    packed = np.empty((16, COLUMNS), dtype=np.float32)
    sums, column_limits = work[-2], work[-1]
    fresh = np.empty(COLUMNS, dtype=np.float32)
    scaled = np.empty(16, dtype=np.float32)
    for g in range(groups):
        for j0 in range(0, columns, COLUMNS):
            width = min(COLUMNS, columns - j0)
            for t in range(trees.shape[0]):
                first, block = trees[t, 0], trees[t, 1]
                steps = column_steps[block, g, j0 : j0 + width]
                for j in range(width):  # the tree's B transposed, times the column steps
                    for m in range(16):
                        packed[m, j] = b[g, j0 + j, first + m] * steps[j]
                    column_limits[j] = np.float64(steps[j]) * keep_factor
                least = np.float64(steps.min()) * keep_factor * 0.5
                for i in range(rows):
                    out = acc[g, i, j0 : j0 + width]
                    step = row_steps[block, g, i]
                    x = a[g, i, first : first + 16]
                    high = np.float32(min(3.4028234663852886e38, np.float64(step) * least))
                    sides = directed, large_positive, large_negative
                    if _rounded_pass_fp32(out, fresh, x, scaled, packed, step, high, sides):
                        continue
                    limits = column_limits, np.float64(step)
                    _tree_sums(sums, x[:8], np.float64(step), packed, width)
                    _odd_grid_pass(out, fresh, x[8:], packed[8:], sums, limits, flags, True)
                    out[:] = fresh[:width]


@njit(cache=True, inline="always", fastmath={"contract"})
def _rounded_pass_fp32(out, fresh, x, xs, packed, step, high, sides) -> bool:
    """out[j] = acc + S rounded in the mode of ``sides`` (directed, large_positive,
    large_negative: ``_round_fp32``'s flags), S the float32 sum over m < 16 of (x[m] step)
    packed[m, j], where every |acc + S| lies below ``high``; else out is left as it was and
    False returned (``fresh``, ``xs``: scratch)."""
    directed, large_positive, large_negative = sides
    width = out.shape[0]
    for m in range(16):
        xs[m] = x[m] * step
    missed = False
    for j in range(width):
        # two chains of fused multiply-adds (even and odd positions): exact in any order
        even, odd = xs[0] * packed[0, j], xs[1] * packed[1, j]
        for m in range(2, 16, 2):
            even += xs[m] * packed[m, j]
            odd += xs[m + 1] * packed[m + 1, j]
        s = even + odd
        old = out[j]
        total = old + s
        back = total - old  # TwoSum: total + error == old + s exactly
        error = (old - (total - back)) + (s - back)
        away = (error > 0) == (total > 0)  # the exact sum lies farther from zero than total
        large = large_positive if total > 0 else large_negative
        twice = error + error
        tie = (total + twice) - total == twice  # the other neighbour is total + 2 error
        move = (error != 0) & (directed | tie) & (away == large)
        bits = np.float32(total).view(np.int32)
        moved = np.int32(bits + (1 if away else -1)).view(np.float32)
        fresh[j] = moved if move else total
        missed |= ~(abs(total) < high)
    if missed:
        return False
    out[:] = fresh[:width]
    return True
