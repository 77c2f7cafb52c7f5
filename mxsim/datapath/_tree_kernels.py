"""Fused kernel of the BLAS route (``blas.py``) for trees of 8 float64 products: each
tree's exact sum is formed in registers and rounded into the fp32 accumulator at once,
instead of one rank-8 GEMM per tree (which writes a whole float64 tile per 8 multiply-adds)
and a second pass over it."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .blas import odd_sum

#: Columns per pass: a tree's columns of B (packed, 8 x COLUMNS float64) stay in L1 while
#: every row of the tile takes the tree.
COLUMNS = 256


@njit(cache=True, nogil=True, fastmath={"contract"})
def rne_trees8(a, b, trees, row_steps, column_steps, acc, packed, fresh):
    """acc[g, i, j] = RNE_fp32(acc + S) for each tree in order: S = s 2^(Xa + Xb), s the
    tree's exact sum over k in [first, first + 8) of a[g, i, k] * b[g, j, k] (``trees``
    (T, 2): first, scale block), 2^Xa = row_steps[block, g, i], 2^Xb = column_steps[block,
    g, j]. ``a`` (g, rows, K) and ``b`` (g, columns, K) are float64 unscaled elements whose
    tree sums fit 53 bits (``tree_sum_bits``): every product and partial sum times 2^Xa is a
    float64 (the steps are E8M0 powers of two, the results normal float64s), so neither a
    fused multiply-add nor the product by 2^Xb can round. A zero sum counts as +0 (an exact
    sum has no sign; -0 + 0 is +0), as the datapath kernel and its twin have it.

    Per row and pass, t = acc + S is rounded to float64 and converted to fp32 (nearest
    even, IEEE overflow), into ``fresh``: the correctly rounded sum wherever t is exact,
    which holds iff t - acc == S and t - S == acc (one of the two differences is exact,
    Dekker's lemma, and differs when t is not). Where any of the row's pass is not exact (or
    the accumulator is infinite), the pass is redone from the accumulator through the
    round-to-odd sum (``odd_sum``), as ``accumulate_rne_fp32``. ``packed`` a (9, COLUMNS)
    float64 and ``fresh`` a (COLUMNS,) float32 scratch. Serial."""
    groups, rows, columns = acc.shape
    for g in range(groups):
        for j0 in range(0, columns, COLUMNS):
            width = min(COLUMNS, columns - j0)
            for t in range(trees.shape[0]):
                first, block = trees[t, 0], trees[t, 1]
                for j in range(width):  # the tree's B transposed, its column steps after it
                    for m in range(8):
                        packed[m, j] = b[g, j0 + j, first + m]
                    packed[8, j] = column_steps[block, g, j0 + j]
                for i in range(rows):
                    out = acc[g, i, j0 : j0 + width]
                    x = a[g, i, first : first + 8]
                    step = row_steps[block, g, i]
                    if _exact_pass(out, fresh, x, step, packed):
                        for j in range(width):
                            out[j] = fresh[j]
                    else:
                        _odd_pass(out, x, step, packed)


@njit(cache=True, inline="always", fastmath={"contract"})
def _exact_pass(out, fresh, x, step, packed) -> bool:
    """fresh = fp32(RN64(out + S)); whether every RN64 sum was exact."""
    width = out.shape[0]
    b0, b1, b2, b3 = packed[0, :width], packed[1, :width], packed[2, :width], packed[3, :width]
    b4, b5, b6, b7 = packed[4, :width], packed[5, :width], packed[6, :width], packed[7, :width]
    steps = packed[8, :width]
    x0, x1, x2, x3 = x[0] * step, x[1] * step, x[2] * step, x[3] * step
    x4, x5, x6, x7 = x[4] * step, x[5] * step, x[6] * step, x[7] * step
    inexact = False
    for j in range(width):
        s = ((x0 * b0[j] + x1 * b1[j]) + (x2 * b2[j] + x3 * b3[j])) + (
            (x4 * b4[j] + x5 * b5[j]) + (x6 * b6[j] + x7 * b7[j])
        )
        scaled = s * steps[j] + 0.0  # an exact zero sum is +0, whatever its products' signs
        old = np.float64(out[j])
        total = old + scaled
        fresh[j] = np.float32(total)
        inexact |= (total - old != scaled) | (total - scaled != old)
    return not inexact


@njit(cache=True, inline="always")
def _odd_pass(out, x, step, packed) -> None:
    """out = fp32(round-to-odd(out + S)): RNE_fp32(out + S) always."""
    for j in range(out.shape[0]):
        s = 0.0
        for m in range(8):
            s += (x[m] * step) * packed[m, j]
        out[j] = np.float32(odd_sum(np.float64(out[j]), s * packed[8, j] + 0.0))


@njit(cache=True, nogil=True, fastmath={"contract"})
def fused_grid_trees(a, b, trees, terms, row_steps, column_steps, keep_factor, choices, acc, work):
    """A fixed-point-grid unit's trees of ``terms`` products (8 or 16) above its floor
    (``blas.grid_floor``), fused: acc[g, i, j] = acc when |acc| >= 2^(Xa + Xb) keep_factor
    (its LSB more than the max left shift above the grid's: ``keep_factor`` = 2^(L - n +
    24)), else acc + S rounded once to fp32 in the mode of ``choices`` (a
    ``blas.ROUNDING_CHOICES`` row), IEEE overflow, an exact zero +0; for each tree in order.
    S = s 2^(Xa + Xb) with s the tree's exact sum over k in [first, first + terms) of
    a[g, i, k] * b[g, j, k] (``trees`` (T, 2): first, scale block), 2^Xa = row_steps[block,
    g, i], 2^Xb = column_steps[block, g, j]. ``a`` (g, rows, K) and ``b`` (g, columns, K)
    are float32 or float64 unscaled elements whose tree sums fit 53 bits, so the products,
    partial sums and S are exact float64s (as for ``rne_trees8``). An infinite accumulator
    is kept (an earlier overflow stays the result).

    Per row and pass, t = acc + S in float64 is exact where t - acc == S and t - S == acc
    (Dekker's lemma, as ``rne_trees8``), and then rounded by ``_round_fp32``; where any of
    the row's pass is neither exact nor kept, the pass is redone from the accumulator
    through the round-to-odd sum (``odd_sum``), which ``_round_fp32`` rounds alike.
    ``work`` a (terms + 2, COLUMNS) float64 scratch. Serial."""
    groups, rows, columns = acc.shape
    directed, large_positive, large_negative = choices[0] != 0, choices[1] != 0, choices[2] != 0
    ties = not directed and (large_positive or large_negative)
    # the fast pass's rounding of float64 bits (``_round_bits``): nearest even, the
    # conversion's; else the 29 bits below fp32's last cleared after adding all of them
    # (toward the neighbour farther from zero), none, or half of them (a tie away from
    # zero) or just under (a tie toward zero), by sign
    low, half = (1 << 29) - 1, 1 << 28
    if directed:
        adds = (low if large_positive else 0), (low if large_negative else 0)
    else:
        adds = (half if large_positive else half - 1), (half if large_negative else half - 1)
    mask = low if directed or ties else 0
    adds = adds if mask else (0, 0)
    modes = (mask, adds[0], adds[1]), (directed, large_positive, large_negative, ties)
    packed, sums = work[:terms], work[terms]
    column_limits = work[terms + 1]
    fresh = np.empty(COLUMNS, dtype=np.float32)
    for g in range(groups):
        for j0 in range(0, columns, COLUMNS):
            width = min(COLUMNS, columns - j0)
            for t in range(trees.shape[0]):
                first, block = trees[t, 0], trees[t, 1]
                for j in range(width):  # the tree's B transposed
                    for m in range(terms):
                        packed[m, j] = b[g, j0 + j, first + m]
                steps = column_steps[block, g, j0 : j0 + width]
                for j in range(width):
                    column_limits[j] = steps[j] * keep_factor
                for i in range(rows):
                    out = acc[g, i, j0 : j0 + width]
                    step = row_steps[block, g, i]
                    x = a[g, i, first : first + terms]
                    limits = column_limits, step
                    if terms == 8:
                        ok = _rounded_pass(
                            out, fresh, x, packed, sums, steps, limits, modes, False, False
                        )
                    else:  # the first 8 products summed ahead, the last 8 in the pass
                        _tree_sums(sums, x[:8], step, packed, width)
                        x, rest = x[8:], packed[8:]
                        ok = _rounded_pass(
                            out, fresh, x, rest, sums, steps, limits, modes, False, True
                        )
                    if not ok and terms == 8:
                        _rounded_pass(
                            out, fresh, x, packed, sums, steps, limits, modes, True, False
                        )
                    elif not ok:
                        _rounded_pass(
                            out, fresh, x, packed[8:], sums, steps, limits, modes, True, True
                        )
                    for j in range(width):
                        out[j] = fresh[j]


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


@njit(cache=True, inline="always", fastmath={"contract"})
def _rounded_pass(out, fresh, x, packed, sums, steps, limits, modes, odd, partial) -> bool:
    """fresh[j] = out[j] where kept (|out| >= column_limits[j] step, ``limits`` the pair),
    else out[j] + S rounded, S = (the sum over m < 8 of (x[m] step) packed[m, j], plus
    sums[j] where ``partial``) steps[j]: from the float64 sum by ``_round_bits`` (``modes[0]``),
    or (``odd``) from the round-to-odd float64 sum by ``_round_fp32`` (``modes[1]``). Returns
    whether every output was kept or exact in float64 and inside ``_round_bits``' range
    (``odd``: True)."""
    (mask, add_positive, add_negative), (directed, large_pos, large_neg, ties) = modes
    column_limits, step = limits
    b0, b1, b2, b3 = packed[0], packed[1], packed[2], packed[3]
    b4, b5, b6, b7 = packed[4], packed[5], packed[6], packed[7]
    x0, x1 = np.float64(x[0]) * step, np.float64(x[1]) * step
    x2, x3 = np.float64(x[2]) * step, np.float64(x[3]) * step
    x4, x5 = np.float64(x[4]) * step, np.float64(x[5]) * step
    x6, x7 = np.float64(x[6]) * step, np.float64(x[7]) * step
    missed = False
    for j in range(out.shape[0]):
        s = ((x0 * b0[j] + x1 * b1[j]) + (x2 * b2[j] + x3 * b3[j])) + (
            (x4 * b4[j] + x5 * b5[j]) + (x6 * b6[j] + x7 * b7[j])
        )
        if partial:
            s += sums[j]
        scaled = s * steps[j]
        old = np.float64(out[j])
        kept = abs(old) >= column_limits[j] * step
        if odd:  # an exact zero sum is +0
            rounded = _round_fp32(odd_sum(old, scaled + 0.0), directed, large_pos, large_neg, ties)
            fresh[j] = out[j] if kept else rounded
        else:  # (a -0 sum adds as +0: the accumulator is never -0 here)
            total = old + scaled
            fresh[j], inside = _round_bits(total, mask, add_positive, add_negative)
            inexact = (total - old != scaled) | (total - scaled != old)
            missed |= inexact | ~inside | kept
    return not missed


@njit(cache=True, inline="always")
def _round_bits(value, mask, add_positive, add_negative):
    """(``value`` rounded to fp32, whether that is right): its float64 bits plus
    ``add_positive`` or ``add_negative`` (by its sign) with the ``mask`` bits cleared,
    converted (exactly, or nearest even where ``mask`` is 0). The 29 bits below fp32's
    last place are those of a value from 2^-126 up to 2^128 (normal fp32s; the carry of a
    rounding up moves into the exponent, to Inf past fp32's largest): right for those and
    for zero, not claimed elsewhere."""
    bits = np.float64(value).view(np.int64)
    add = add_negative if value < 0.0 else add_positive
    rounded = np.int64((bits + add) & ~mask).view(np.float64)
    above = np.uint64((bits & 0x7FFFFFFFFFFFFFFF) - 0x3810000000000000)  # |value| - 2^-126
    inside = (above < np.uint64(0x0FE0000000000000)) | (value == 0.0)  # 2^128 - 2^-126
    return np.float32(rounded), inside


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
