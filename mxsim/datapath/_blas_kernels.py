"""Numba kernels of the BLAS route (``datapath.blas``): decoding the codes, folding block
scales onto a tree's least, and adding each tree's float64 sums to the fp32 (or exact)
accumulators. The route's module docstring states why each step is exact."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..formats._kernels import power_of_two


@njit(cache=True, nogil=True)
def fold_blocks(exponents, per, least, rises):
    """least[i, t] = the least of the (rows, blocks) exponents[i, t*per : (t+1)*per],
    rises[i, b] = exponents[i, b] - least[i, b // per] (0 for block indices past the last;
    in the type of ``rises``: the caller checks that the largest rise, returned, fits it).
    The arrays C-contiguous. Where every tree has its ``per`` blocks, each loop runs over
    all rows' trees at once (long loops rather than a short loop of ``per`` per tree)."""
    rows, blocks = exponents.shape
    trees = least.shape[-1]
    top = np.int64(0)
    if blocks == trees * per:
        count = rows * trees
        flat, lows = exponents.reshape(count, per), least.reshape(count)
        steps = rises.reshape(count, per)
        if per == 8:  # (bfp-exact's trees of 8 sub-blocks: straight-line, a tree at a time)
            return _fold_eights(flat, lows, steps)
        for u in range(count):
            lows[u] = flat[u, 0]
        for m in range(1, per):
            for u in range(count):
                lows[u] = min(lows[u], np.int64(flat[u, m]))
        for m in range(per):
            for u in range(count):
                rise = np.int64(flat[u, m]) - lows[u]
                steps[u, m] = rise
                top = max(top, rise)
        return top
    for i in range(rows):
        row, row_least, row_rises = exponents[i], least[i], rises[i]
        for t in range(trees):
            first, last = t * per, min((t + 1) * per, blocks)
            low = np.int64(row[first])
            for b in range(first + 1, last):
                low = min(low, np.int64(row[b]))
            row_least[t] = low
            for b in range(first, last):
                rise = np.int64(row[b]) - low
                row_rises[b] = rise
                top = max(top, rise)
            for b in range(last, (t + 1) * per):  # past the last block
                row_rises[b] = 0
    return top


@njit(cache=True, inline="always")
def _fold_eights(exponents, least, rises):
    """:func:`fold_blocks` of trees of 8 blocks, ``exponents`` and ``rises`` (trees, 8):
    each tree's eight exponents loaded once, their least and largest as trees of
    comparisons (short dependency chains)."""
    top = np.int64(0)
    for u in range(exponents.shape[0]):
        e = exponents[u]
        x0, x1, x2, x3 = np.int64(e[0]), np.int64(e[1]), np.int64(e[2]), np.int64(e[3])
        x4, x5, x6, x7 = np.int64(e[4]), np.int64(e[5]), np.int64(e[6]), np.int64(e[7])
        low = min(min(min(x0, x1), min(x2, x3)), min(min(x4, x5), min(x6, x7)))
        high = max(max(max(x0, x1), max(x2, x3)), max(max(x4, x5), max(x6, x7)))
        least[u] = low
        r = rises[u]
        r[0], r[1], r[2], r[3] = x0 - low, x1 - low, x2 - low, x3 - low
        r[4], r[5], r[6], r[7] = x4 - low, x5 - low, x6 - low, x7 - low
        top = max(top, high - low)
    return top


@njit(cache=True, nogil=True)
def fold_code_blocks(codes, zero_table, exponents, block_of, per, least, rises):
    """least[g, i, t] = the least of the (groups, rows, blocks) exponents[g, i, t*per :
    (t+1)*per] over the blocks not marked as zeros (over all of the tree's blocks when every
    one is), rises[g, i, b] = exponents[g, i, b] - least[g, i, b // per] (0 for marked
    blocks and block indices past the last), the marks read from the (groups, rows, length)
    codes (position k < len(block_of) lies in block block_of[k]; a block is marked when each
    of its codes has a true ``zero_table`` entry, or it has none), in one loop per row. The
    rises are in the type of ``rises``: the caller checks that the largest rise, returned
    (0 without blocks), fits it."""
    groups, rows, length = codes.shape
    blocks = exponents.shape[-1]
    trees = least.shape[-1]
    reach = min(length, block_of.shape[0])
    top = np.int64(0)
    none = np.int64(1) << 40  # above every exponent: "no block counted yet" (branch-free)
    counted = np.empty(trees * per, dtype=np.int64)  # 1: the block holds a nonzero
    # Padding blocks (past the last) count as neither least nor marked block: their
    # exponent ``none`` loses every min, and their rise is 0 (0 counted).
    padded = np.full(trees * per, none)
    for g in range(groups):
        for i in range(rows):
            row, row_exponents = codes[g, i], exponents[g, i]
            row_least, row_rises = least[g, i], rises[g, i]
            counted[:] = 0
            for b in range(blocks):
                padded[b] = row_exponents[b]
            for k in range(reach):
                counted[block_of[k]] |= np.int64(not zero_table[row[k]])
            for t in range(trees):
                low_all = low = none
                for b in range(t * per, (t + 1) * per):
                    exponent = padded[b]
                    low_all = min(low_all, exponent)
                    low = min(low, exponent if counted[b] else none)
                low = low_all if low == none else low
                row_least[t] = low
                for b in range(t * per, (t + 1) * per):
                    rise = (padded[b] - low) * counted[b]
                    row_rises[b] = rise
                    top = max(top, rise)
    return top


@njit(cache=True)
def rows_all_finite(codes, finite_table):
    """Whether every code of the (G, rows, K) ``codes`` has a finite table value."""
    groups, rows, length = codes.shape
    for g in range(groups):
        for i in range(rows):
            row, bad = codes[g, i], 0
            for k in range(length):
                bad += not finite_table[row[k]]
            if bad:
                return False
    return True


@njit(cache=True, nogil=True)
def holds_none_of(words, masks, values, ones, highs):
    """Whether no lane c of the 1-D uint64 ``words`` has c & mask == value for any pair of
    ``masks`` and ``values`` (uint64, the lane's pattern in every lane; ``ones``: 1 in each
    lane's lowest bit, ``highs``: each lane's highest bit). x = (word & mask) ^ value has a
    zero lane exactly where a code matches, and (x - ones) & ~x & highs is nonzero exactly
    when x has a zero lane (a borrow enters a lane only from a zero lane below it): one pass
    of a few word operations that vectorise per pair (a format's few non-finite codes, one
    pair where they are every code with some bits fixed; a table lookup per code does not
    vectorise, and a compare per code widens it to a 64-bit lane)."""
    for e in range(masks.shape[0]):
        mask, value = masks[e], values[e]
        hits = np.uint64(0)
        for k in range(words.shape[0]):
            x = (words[k] & mask) ^ value
            hits |= (x - ones) & ~x & highs
        if hits:
            return False
    return True


@njit(cache=True)
def values_finite_and_not_negative_zero(values):
    """Whether every accumulator input is finite and none is -0 (those go to the kernel).
    Branch-free over chunks of 4,096 values, each chunk's findings read once (the loop
    vectorises): value - value is 0 exactly for finite values (NaN for ±Inf and NaN)."""
    flat = values.ravel()
    for first in range(0, flat.size, 4096):
        finite, negative_zero = True, False
        for i in range(first, min(first + 4096, flat.size)):
            value = flat[i]
            finite &= value - value == 0
            negative_zero |= (value == 0) & np.signbit(value)
        if not finite or negative_zero:
            return False
    return True


@njit(cache=True, inline="always")
def two_sum(a, b):
    """(a + b rounded, its exact rounding error): a + b == total + error exactly (finite sums)."""
    total = a + b
    back = total - a
    return total, (a - (total - back)) + (b - back)


@njit(cache=True, inline="always")
def odd_sum(a, b):
    """a + b rounded to odd at 53 bits, branch-free (loops over it vectorise): the nearest sum,
    stepped back toward zero when TwoSum's exact error lies below it, its last bit set when
    inexact. An infinite sum is left as it is (its error is NaN)."""
    total, error = two_sum(a, b)
    bits = np.float64(total).view(np.int64)
    inexact = np.int64(abs(error) > 0.0)
    toward_zero = inexact & np.int64((error > 0.0) != (total > 0.0))
    return np.int64((bits - toward_zero) | inexact).view(np.float64)


@njit(cache=True, inline="always")
def round_to_odd(total, error):
    """The float64 round-to-odd of total + error (total = RN(exact), error its exact remainder)."""
    if error == 0.0 or not math.isfinite(total):
        return total
    bits = np.float64(total).view(np.int64)
    toward_zero = np.int64((error > 0.0) != (total > 0.0))
    return np.int64((bits - toward_zero) | 1).view(np.float64)


@njit(cache=True, nogil=True)
def accumulate_rne_fp32(running, tree_sums, row_steps, column_steps):
    """running = RNE_fp32(running + tree_sums * row_steps * column_steps) elementwise and
    exactly: ``running`` (g, rows, columns) float32, ``tree_sums`` float32 or float64 of that
    shape, the steps (g, rows) and (g, columns) float64 powers of two (the product of a sum
    and its scale 2^(Xa + Xb) is exact: module doc). The float64 sum is made round-to-odd
    (TwoSum's exact error says which way the exact sum lies), then rounded to fp32. An
    accumulator that overflowed to +-Inf stays so (its error is NaN: left alone). A zero tree
    sum counts as +0 (an exact sum has no sign), so -0 + 0 is +0. Branch-free inner loops that
    vectorise; serial (the caller runs a tile per thread)."""
    groups, rows, columns = running.shape
    for g in range(groups):
        for i in range(rows):
            step = row_steps[g, i]
            totals, sums, steps = running[g, i], tree_sums[g, i], column_steps[g]
            for j in range(columns):
                # + 0.0: a tree's exact zero sum is +0 whatever sign bit its GEMM gave
                b = np.float64(sums[j]) * (step * steps[j]) + 0.0
                totals[j] = np.float32(odd_sum(np.float64(totals[j]), b))


@njit(cache=True, nogil=True)
def accumulate_fp32(running, tree_sums, row_steps, column_steps):
    """running += tree_sums * row_steps * column_steps elementwise in float32 arithmetic
    (``running``, ``tree_sums`` (g, rows, columns) float32, the steps (g, rows) and
    (g, columns) float32 powers of two). Exact RNE_fp32(acc + S) when every scaled sum is
    a float32 (the caller checks: ``_fp32_exact_blocks``): the product of the steps and
    of a sum by them are then exact, and an IEEE float32 addition of two float32s is the
    correctly rounded sum (an infinite accumulator stays so); a zero sum counts as +0.
    Serial, vectorises."""
    groups, rows, columns = running.shape
    for g in range(groups):
        for i in range(rows):
            step = row_steps[g, i]
            totals, sums, steps = running[g, i], tree_sums[g, i], column_steps[g]
            for j in range(columns):
                totals[j] = totals[j] + (sums[j] * (step * steps[j]) + np.float32(0.0))


@njit(cache=True, nogil=True)
def accumulate_grid_fp32(running, tree_sums, row_steps, column_steps, grid, choices):
    """One tree of a fixed-point-grid unit (``grid.fraction_bits``) into the fp32 accumulators,
    elementwise and exactly: ``running`` (g, rows, columns) float32, ``tree_sums`` the tree's
    unscaled sums s (float32 or float64, exact), the steps (g, rows) and (g, columns) float64
    powers of two 2^Xa and 2^Xb; ``grid`` (fraction bits n, max left shift, max right shift),
    ``choices`` the accumulator rounding's ``ROUNDING_CHOICES`` row (every mode but
    stochastic). With S = s 2^(Xa+Xb) (exact) and X = Xa + Xb, the accumulator's LSB lies
    offset = (e - 23) - (X - n) places above the grid's (e its exponent: -126 when subnormal,
    -127 when zero); the accumulator is kept, bits and sign, when offset > max left shift, or
    offset < -max right shift and S = 0; otherwise it becomes acc + S rounded once to fp32
    (``round_fp32``), an exact zero +0, IEEE overflow (±Inf, or ±max finite when the mode
    rounds toward zero). An infinite accumulator (an earlier overflow, which the kernel keeps
    as its result) stays so. Serial; one branch-free inner loop per row (vectorises)."""
    groups, rows, columns = running.shape
    directed, large_positive, large_negative = choices[0] != 0, choices[1] != 0, choices[2] != 0
    for g in range(groups):
        for i in range(rows):
            if directed or large_positive or large_negative:
                grid_row(
                    running[g, i],
                    tree_sums[g, i],
                    row_steps[g, i],
                    column_steps[g],
                    grid,
                    directed,
                    large_positive,
                    large_negative,
                )
            else:  # nearest even: the conversion
                grid_row_nearest_even(
                    running[g, i], tree_sums[g, i], row_steps[g, i], column_steps[g], grid
                )


@njit(cache=True, inline="always")
def grid_sum(acc, tree_sum, scale, fraction_bits, max_left, max_right):
    """(whether the grid keeps ``acc``, acc + S as a round-to-odd float64 (0 for an exact zero),
    whether acc + S is exactly zero) for S = tree_sum * scale (``accumulate_grid_fp32``)."""
    a = np.float64(acc)
    b = np.float64(tree_sum) * scale
    exponent = (np.float64(scale).view(np.int64) >> 52) - 1023  # X: the steps are positive
    field = (np.float64(a).view(np.int64) >> 52) & 0x7FF  # fp32 subnormals: float64 normals
    acc_exponent = max(field - 1023, -126) - np.int64(a == 0.0)
    offset = acc_exponent - 23 - exponent + fraction_bits
    keep = (offset > max_left) | ((offset < -max_right) & (b == 0.0)) | (abs(a) == np.inf)
    return keep, odd_sum(a, b), a + b == 0.0


@njit(cache=True, nogil=True)
def grid_row_nearest_even(totals, sums, step, steps, grid):
    fraction_bits, max_left, max_right = grid[0], grid[1], grid[2]
    for j in range(totals.shape[0]):
        scale = step * steps[j]
        keep, odd, zero = grid_sum(totals[j], sums[j], scale, fraction_bits, max_left, max_right)
        rounded = np.float32(0.0) if zero else np.float32(odd)
        totals[j] = totals[j] if keep else rounded


@njit(cache=True, nogil=True)
def grid_row(totals, sums, step, steps, grid, directed, large_positive, large_negative):
    fraction_bits, max_left, max_right = grid[0], grid[1], grid[2]
    for j in range(totals.shape[0]):
        scale = step * steps[j]
        keep, odd, zero = grid_sum(totals[j], sums[j], scale, fraction_bits, max_left, max_right)
        rounded = (
            np.float32(0.0) if zero else round_fp32(odd, directed, large_positive, large_negative)
        )
        totals[j] = totals[j] if keep else rounded


@njit(cache=True, inline="always")
def round_fp32(value, directed, large_positive, large_negative):
    """``value`` (a float64, nonzero, round-to-odd at 53 bits of the exact sum: it lies
    strictly between the same fp32 neighbours as the exact sum, or is it) rounded to fp32 by
    the mode of the flags (a ``ROUNDING_CHOICES`` row): the neighbour nearer zero or the one
    farther (``value``'s nearest-even conversion and the neighbour on the other side of it;
    an fp32 tie is the float64 midpoint of the two). IEEE overflow: beyond fp32's range the
    neighbours are ±max finite and ±Inf (their tie: 2^128 - 2^103). Branch-free (selects)."""
    nearest = np.float32(value)
    near = np.float64(nearest)
    away = abs(near) < abs(value)  # the other neighbour lies farther from zero
    other = np.int32(np.float32(nearest).view(np.int32) + (1 if away else -1)).view(np.float32)
    small = nearest if away else other  # the neighbour nearer zero
    large = other if away else nearest
    beyond = np.float64(large) if abs(large) < np.inf else math.copysign(2.0**128, value)
    tie = (np.float64(small) + beyond) * 0.5 == value
    chosen = large if (large_positive if value > 0.0 else large_negative) else small
    return chosen if (directed | tie) & (near != value) else nearest


@njit(cache=True, nogil=True)
def accumulate_double_double(high, low, inexact, block_sums):
    """(high, low) += block_sums exactly as long as ``low`` never rounds; ``inexact`` marks
    the elements where it did (their exact sum needs more than two float64s); returns how
    many times it did."""
    rows, columns = high.shape
    count = 0
    for i in range(rows):
        for j in range(columns):
            total, error = two_sum(high[i, j], block_sums[i, j])
            high[i, j] = total
            rest, low_error = two_sum(low[i, j], error)
            low[i, j] = rest
            if low_error != 0.0:
                inexact[i, j] = True
                count += 1
    return count


@njit(cache=True, nogil=True)
def round_double_double_to_fp32(high, low, acc):
    """acc = RNE_fp32(high + low) exactly (round-to-odd float64 sum, then fp32)."""
    rows, columns = high.shape
    for i in range(rows):
        for j in range(columns):
            total, error = two_sum(high[i, j], low[i, j])
            acc[i, j] = np.float32(round_to_odd(total, error))


@njit(cache=True, nogil=True)
def decode_codes(table, codes, out):
    """out[g, i, k] = table[codes[g, i, k]] for the (groups, rows, length) codes, zeros in the
    rest of out's last axis (its padding to whole blocks)."""
    groups, rows, length = codes.shape
    for g in range(groups):
        for i in range(rows):
            values, row = out[g, i], codes[g, i]
            for k in range(length):
                values[k] = table[row[k]]
            values[length:] = 0.0


@njit(cache=True, nogil=True)
def decode_scaled(table, codes, steps, shift, out):
    """out[g, i, k] = table[codes[g, i, k]] * steps[g, i, k >> shift] for the (groups, rows,
    length) codes (blocks of 2^shift positions, ``steps`` (groups, rows, blocks) powers of
    two in out's type: exact where the products are normal), zeros in the rest of out's
    last axis (its padding to whole blocks)."""
    groups, rows, length = codes.shape
    for g in range(groups):
        for i in range(rows):
            values, row, factors = out[g, i], codes[g, i], steps[g, i]
            for k in range(length):
                values[k] = table[row[k]] * factors[k >> shift]
            values[length:] = 0.0


@njit(cache=True, nogil=True)
def decode_raised(table, codes, rises, block, powers, out):
    """``decode_codes`` with each value times powers[the rise of its block] (rises
    (groups, rows, blocks), position k in block k // ``block``, ``powers`` 2^0, 2^1, ... in
    out's type: exact). One flat loop over positions, not a short loop per block of two (BFP
    sub-blocks); the block a shift where ``block`` is a power of two (no lookup: the loop
    vectorises better)."""
    groups, rows, length = codes.shape
    shift = -1
    if block & (block - 1) == 0:
        shift = 0
        while (1 << shift) < block:
            shift += 1
    for g in range(groups):
        for i in range(rows):
            values, row, steps = out[g, i], codes[g, i], rises[g, i]
            if shift >= 0:
                for k in range(length):
                    values[k] = table[row[k]] * powers[steps[k >> shift]]
            else:
                for k in range(length):
                    values[k] = table[row[k]] * powers[steps[k // block]]
            values[length:] = 0.0


@njit(cache=True, nogil=True)
def decode_folded(table, codes, exponents, per, block, powers, steps, rises, out):
    """Fold and decode in one pass, every block counted (as ``fold_blocks``): per row and tree
    of ``per`` blocks of ``block`` positions, low = the least of its (groups, rows, blocks)
    ``exponents`` (blocks past the last left out); steps[t, g, i] = 2^low (float64; E8M0
    exponents and their least: normal float64s); out[g, i, k] = table[codes[g,
    i, k]] * powers[the rise of k's block above low], zeros past the codes' length; ``rises``
    (groups, rows, blocks) uint8 scratch. Returns the largest rise: where it exceeds the
    caller's limit, ``out`` is wrong (``powers`` has 256 entries, 0 past the limit: E8M0
    rises are below 256) and the caller folds another way. The arrays C-contiguous. Per
    row, its trees first, then one flat loop over its positions; trees of 8 blocks of 2
    (bfp-exact's sub-blocks) by a loop of constant strides (``_decode_folded_eights``)."""
    groups, rows, length = codes.shape
    blocks = exponents.shape[-1]
    trees = steps.shape[0]
    if per == 8 and block == 2 and blocks == trees * 8 and out.shape[-1] == length:
        return _decode_folded_eights(table, codes, exponents, powers, steps, out)
    top = np.int64(0)
    for g in range(groups):
        for i in range(rows):
            values, row, e, row_rises = out[g, i], codes[g, i], exponents[g, i], rises[g, i]
            for t in range(trees):
                first, last = t * per, min((t + 1) * per, blocks)
                low = np.int64(e[first])
                for b in range(first + 1, last):
                    low = min(low, np.int64(e[b]))
                steps[t, g, i] = power_of_two(low)
                for b in range(first, last):
                    rise = np.int64(e[b]) - low
                    row_rises[b] = rise
                    top = max(top, rise)
            for k in range(length):
                values[k] = table[row[k]] * powers[row_rises[k // block]]
            values[length:] = 0.0
    return top


@njit(cache=True, nogil=True)
def _decode_folded_eights(table, codes, exponents, powers, steps, out):
    """:func:`decode_folded` of trees of 8 blocks of 2 positions covering every row, each
    block's two values decoded as its rise is found (one lookup of its factor a block, not
    a position; no rises written). (Its own fold, not :func:`_fold_eights` over each
    row's reshaped views: with those the compiled pass measured markedly slower.)"""
    groups, rows, length = codes.shape
    trees = steps.shape[0]
    top = np.int64(0)
    for g in range(groups):
        for i in range(rows):
            values, row, e = out[g, i], codes[g, i], exponents[g, i]
            for t in range(trees):
                b = t * 8
                low = min(
                    min(min(e[b], e[b + 1]), min(e[b + 2], e[b + 3])),
                    min(min(e[b + 4], e[b + 5]), min(e[b + 6], e[b + 7])),
                )
                steps[t, g, i] = power_of_two(np.int64(low))
                for q in range(8):
                    rise = np.int64(e[b + q]) - low
                    top = max(top, rise)
                    factor = powers[rise & 255]  # (a rise past 255: the call is void)
                    k = 2 * (b + q)
                    values[k] = table[row[k]] * factor
                    values[k + 1] = table[row[k + 1]] * factor
    return top
