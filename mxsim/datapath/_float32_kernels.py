"""Numba kernel of the exact small-groups route for trees of several scale blocks whose
sums fit float32 (``datapath.batch``: bfp-exact's trees of 16 products over sub-blocks of
2 for MX9/MX6/MX4 and MX INT8, each tree's exact sum rounded into an fp32 accumulator).

Why float32 is exact here, with no fold. An element is v 2^x: v a table value, an integer
multiple of 2^lsb below 2^(e + 1) (``blas.span_bits``), x its block's scale exponent. It
is decoded as the float32 v 2^x, exact where x + lsb >= -149 and x + e + 1 <= 128 (v has
few bits; a power of two only moves its exponent). Take one tree of a row of A and a
column of B, L_a and L_b the least exponents of their blocks and r_a, r_b the largest
rises of a block above them. Each product is v_a v_b 2^(x_a + x_b): an integer multiple of
u = 2^(lsb_a + lsb_b + L_a + L_b) below 2^(E + 2 + r_a + r_b + L_a + L_b), E = e_a + e_b;
so every partial sum of the tree's F products, in any order, is a multiple of u of at
most ``blas.tree_sum_bits`` + r_a + r_b bits (the fold's argument of ``datapath.blas``,
with the scale kept in the elements). Where that is at most 24 (the rises within the
room R = 24 - ``tree_sum_bits``), u >= 2^-149 and u 2^24 <= 2^128, every product and
partial sum is a float32: chains of fused multiply-adds from +0 in any grouping give the
exact scaled tree sum S (an exact zero as +0, as the chains start at +0), and the IEEE
float32 sum acc + S is RNE_fp32(acc + S), overflow to ±Inf included (an infinite
accumulator stays so). So a tree costs one float32 FMA per product and one addition per
output, with no steps to multiply and no codes to rewrite.

The kernel checks this per group from its scale exponents, conservatively over the whole
group (the largest span of a tree's exponents in A plus that in B within R; every
exponent within its operand's bounds; the least exponent of A plus that of B, and the
largest plus the largest, within the sums' bounds) and leaves the other groups to the
caller: NaN scales, exponents far apart within a tree (sub-blocks of zeros at 2^-127
beside numbers), or sums at the edges of float32's range. With the BFP quantizer's
sub-blocks (at most a binade apart) on realistic data no group is left.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..quantize._kernels import SCALE_NAN

#: Columns of a group's passes: one SIMD vector of float32 (columns past N are zeros).
LANES = 16


@njit(cache=True, inline="always", fastmath={"contract"})
def _pair_sums16(a, at_a, at_a2, b, at_b, sums, at_sums, at_sums2):
    """sums[at_sums + jj] = the sum over m < 16 of a[at_a + m] * b[at_b + m * LANES + jj]
    and sums[at_sums2 + jj] likewise from a[at_a2 + m] (jj < :data:`LANES`; flat float32
    arrays, unsigned offsets: an index of unknown sign costs wraparound arithmetic and the
    loop does not vectorise): two rows at once, each element of B loaded once for both,
    four chains per row and column (positions m mod 4) added at the end (any grouping of
    the exact sums is exact)."""
    for jj in range(LANES):
        s0 = s1 = s2 = s3 = np.float32(0.0)
        r0 = r1 = r2 = r3 = np.float32(0.0)
        for m in range(0, 16, 4):
            b0 = b[at_b + np.uint64(m * LANES + jj)]
            b1 = b[at_b + np.uint64((m + 1) * LANES + jj)]
            b2 = b[at_b + np.uint64((m + 2) * LANES + jj)]
            b3 = b[at_b + np.uint64((m + 3) * LANES + jj)]
            s0 += a[at_a + np.uint64(m)] * b0
            s1 += a[at_a + np.uint64(m + 1)] * b1
            s2 += a[at_a + np.uint64(m + 2)] * b2
            s3 += a[at_a + np.uint64(m + 3)] * b3
            r0 += a[at_a2 + np.uint64(m)] * b0
            r1 += a[at_a2 + np.uint64(m + 1)] * b1
            r2 += a[at_a2 + np.uint64(m + 2)] * b2
            r3 += a[at_a2 + np.uint64(m + 3)] * b3
        sums[at_sums + np.uint64(jj)] = (s0 + s1) + (s2 + s3)
        sums[at_sums2 + np.uint64(jj)] = (r0 + r1) + (r2 + r3)


@njit(cache=True, inline="always", fastmath={"contract"})
def _pair_sums(a, at_a, at_a2, b, at_b, terms, sums, at_sums, at_sums2):
    """:func:`_pair_sums16` for trees of any ``terms`` positions (16: unrolled into
    registers; others a position at a time, a row after the other)."""
    if terms == 16:
        _pair_sums16(a, at_a, at_a2, b, at_b, sums, at_sums, at_sums2)
        return
    for at_row, at_out in ((at_a, at_sums), (at_a2, at_sums2)):
        for jj in range(LANES):
            sums[at_out + np.uint64(jj)] = np.float32(0.0)
        for m in range(terms):
            x = a[at_row + np.uint64(m)]
            for jj in range(LANES):
                sums[at_out + np.uint64(jj)] += x * b[at_b + np.uint64(m * LANES + jj)]


@njit(cache=True, nogil=True)
def _tree_ranges(exponents, per, start, stop, low, high):
    """low[q], high[q] = the least and largest exponent of the q-th tree of ``per``
    consecutive blocks of groups ``start`` to ``stop`` of the (G, rows, blocks) block
    ``exponents`` (C-contiguous), rows after rows, ``SCALE_NAN`` above every exponent; the
    trees' count per row is returned. Trees of 8 blocks covering the rows (bfp-exact's) by
    straight-line code per tree (the eight exponents held in registers)."""
    rows, blocks = exponents.shape[1], exponents.shape[2]
    trees = -(-blocks // per)
    if per == 8 and blocks % 8 == 0:
        # (the groups' exponents as one flat view from 0: indexes known non-negative)
        flat = exponents.reshape(exponents.size)[start * rows * blocks : stop * rows * blocks]
        for q in range((stop - start) * rows * trees):
            x0, x1, x2, x3 = flat[8 * q], flat[8 * q + 1], flat[8 * q + 2], flat[8 * q + 3]
            x4, x5, x6, x7 = flat[8 * q + 4], flat[8 * q + 5], flat[8 * q + 6], flat[8 * q + 7]
            low[q] = min(min(min(x0, x1), min(x2, x3)), min(min(x4, x5), min(x6, x7)))
            high[q] = max(max(max(x0, x1), max(x2, x3)), max(max(x4, x5), max(x6, x7)))
        return trees
    q = 0
    for g in range(start, stop):
        for u in range(rows):
            for b0 in range(0, blocks, per):
                low[q] = high[q] = exponents[g, u, b0]
                for b in range(b0 + 1, min(b0 + per, blocks)):
                    low[q] = min(low[q], exponents[g, u, b])
                    high[q] = max(high[q], exponents[g, u, b])
                q += 1
    return trees


@njit(cache=True, inline="always")
def _group_range(low, high, first, count):
    """(least, largest, largest span high - low) over entries ``first`` to ``first`` +
    ``count`` of :func:`_tree_ranges`' ``low`` and ``high``."""
    least, most, span = np.int64(SCALE_NAN), -np.int64(SCALE_NAN), np.int64(0)
    lows, highs = low[first : first + count], high[first : first + count]  # (indexes from 0)
    for q in range(count):
        least, most = min(least, np.int64(lows[q])), max(most, np.int64(highs[q]))
        span = max(span, np.int64(highs[q]) - np.int64(lows[q]))
    return least, most, span


@njit(cache=True, inline="always")
def _outside(range_a, range_b, bounds):
    """Whether a group whose A and B have the (least, largest, largest span)
    :func:`_group_range`'s ``range_a`` and ``range_b`` lies outside float32 (the ``bounds``
    of :func:`scaled_float32_groups`)."""
    (least_a, most_a, span_a), (least_b, most_b, span_b) = range_a, range_b
    return not (
        span_a + span_b <= bounds[0]
        and bounds[1] <= least_a
        and most_a <= bounds[2]
        and bounds[3] <= least_b
        and most_b <= bounds[4]
        and bounds[5] <= least_a + least_b
        and most_a + most_b <= bounds[6]
    )


@njit(cache=True, nogil=True)
def first_group_outside(scales_a, scales_b, per, bounds):
    """Whether :func:`scaled_float32_groups` would leave the batch's first group (the
    arguments as it takes them): the caller's glance at a batch before compiling or
    calling it (a batch of the MX quantizer's sub-blocks, each its own scale, mostly lies
    outside)."""
    low_a = np.empty(scales_a.shape[1] * scales_a.shape[2], dtype=scales_a.dtype)
    high_a = np.empty_like(low_a)
    low_b = np.empty(scales_b.shape[1] * scales_b.shape[2], dtype=scales_b.dtype)
    high_b = np.empty_like(low_b)
    trees_a = _tree_ranges(scales_a, per, 0, 1, low_a, high_a)
    trees_b = _tree_ranges(scales_b, per, 0, 1, low_b, high_b)
    range_a = _group_range(low_a, high_a, 0, scales_a.shape[1] * trees_a)
    range_b = _group_range(low_b, high_b, 0, scales_b.shape[1] * trees_b)
    return _outside(range_a, range_b, bounds)


@njit(cache=True, inline="always")
def _decode(row, exponents, table, powers, block, values):
    """values[k] = table[row[k]] * powers[127 + the exponent of position k's block], blocks
    of ``block`` positions (2: by a shift, not a division per position)."""
    if block == 2 and row.shape[0] == 2 * exponents.shape[0]:
        for q in range(exponents.shape[0]):
            step = powers[np.uint64(np.int64(exponents[q]) + 127)]  # (the caller's bounds)
            values[2 * q] = table[row[2 * q]] * step
            values[2 * q + 1] = table[row[2 * q + 1]] * step
        return
    for q in range(exponents.shape[0]):
        step = powers[np.uint64(np.int64(exponents[q]) + 127)]
        for k in range(q * block, min((q + 1) * block, row.shape[0])):
            values[k] = table[row[k]] * step


@njit(cache=True, nogil=True, fastmath={"contract"})
def scaled_float32_groups(
    codes_a,
    codes_b,
    scales_a,
    scales_b,
    c_values,
    table_a,
    table_b,
    powers,
    per,
    block,
    bounds,
    out,
    flags_out,
    deferred,
    start,
    stop,
):
    """Groups ``start`` to ``stop`` of a batch of GEMMs A[g] (M, K) times B[g] given as (N, K)
    through a unit whose trees are ``per`` scale blocks of ``block`` positions, each tree's
    exact sum rounded into an fp32 accumulator (module docstring), in float32 arithmetic:
    the fp32 bits into ``out`` (G, M, N uint32), 1 into ``flags_out`` (G, M, N) where c is
    non-finite or -0 (those outputs are the generic kernel's; the others keep their 0:
    ``flags_out`` starts all 0); returns how many it flagged.
    Groups whose operands leave float32 (below) are not computed: 1 into ``deferred`` (G),
    else 0. ``codes_a``/``codes_b`` (G, rows, K) unsigned, ``scales_a``/``scales_b``
    (G, rows, blocks) scale exponents in [-127, 127] or ``SCALE_NAN``, ``c_values``
    (G, M, N) or (1, 1, 1) float32, ``table_a``/``table_b`` the element values (float32,
    finite), ``powers`` the float32 2^x at x + 127 for x in [-127, 127], ``bounds`` (int64):
    the room (24 minus ``blas.tree_sum_bits``), the least and largest block exponent of A
    and of B that keep its elements float32s, and the least and largest sum of A's and
    B's exponents that keep every tree sum a float32 (module docstring). A group is
    computed where it holds no NaN scale, the largest span of a tree's exponents in A plus
    that in B is within the room, its exponents lie within A's and B's bounds, and its
    least (largest) exponent of A plus that of B within the sums' bounds."""
    groups, rows, length = codes_a.shape
    columns = codes_b.shape[1]
    span = per * block
    trees = -(-length // span)
    padded = trees * span
    passes = (columns + LANES - 1) // LANES
    one_c = c_values.shape[0] == 1
    c_first = c_values[0, 0, 0] if one_c else np.float32(0.0)
    bad_first = not math.isfinite(c_first) or (c_first == 0.0 and math.copysign(1.0, c_first) < 0)
    start_first = np.float32(0.0) if bad_first else c_first
    even_rows = rows + rows % 2  # (rows in pairs: a last odd one beside a row of zeros)
    a = np.zeros((even_rows, padded), dtype=np.float32)
    b = np.zeros((passes, padded, LANES), dtype=np.float32)
    sums = np.zeros(even_rows * LANES, dtype=np.float32)
    acc = np.zeros(even_rows * LANES, dtype=np.float32)
    lane_flags = np.zeros(even_rows * LANES, dtype=np.uint8)
    flat_a, flat_b = a.reshape(a.size), b.reshape(b.size)
    # every tree's least and largest exponent, for all the groups at once
    low_a = np.empty((stop - start) * rows * scales_a.shape[2], dtype=scales_a.dtype)
    high_a = np.empty_like(low_a)
    low_b = np.empty((stop - start) * columns * scales_b.shape[2], dtype=scales_b.dtype)
    high_b = np.empty_like(low_b)
    trees_a = _tree_ranges(scales_a, per, start, stop, low_a, high_a)
    trees_b = _tree_ranges(scales_b, per, start, stop, low_b, high_b)
    lanes = acc.shape[0]  # (a trip count unknown when compiling: the loops vectorise)
    flagged = 0
    for g in range(start, stop):
        n_a, n_b = rows * trees_a, columns * trees_b
        range_a = _group_range(low_a, high_a, (g - start) * n_a, n_a)
        range_b = _group_range(low_b, high_b, (g - start) * n_b, n_b)
        deferred[g] = _outside(range_a, range_b, bounds)
        if deferred[g]:
            continue
        # every element's value v 2^x (exact: a float32 within the bounds)
        for i in range(rows):
            _decode(codes_a[g, i], scales_a[g, i], table_a, powers, block, a[i])
        for p in range(passes):
            for jj in range(min(LANES, columns - p * LANES)):
                j = p * LANES + jj
                _decode(codes_b[g, j], scales_b[g, j], table_b, powers, block, b[p, :, jj])
        for p in range(passes):
            j0 = p * LANES
            live = min(LANES, columns - j0)
            any_bad = bad_first
            if one_c:
                for q in range(lanes):
                    acc[q] = start_first
                    lane_flags[q] = bad_first
            else:
                for i in range(rows):
                    for jj in range(LANES):
                        c = c_values[g, i, j0 + jj] if jj < live else np.float32(0.0)
                        bad = not math.isfinite(c) or (c == 0.0 and math.copysign(1.0, c) < 0)
                        acc[i * LANES + jj] = np.float32(0.0) if bad else c
                        lane_flags[i * LANES + jj] = bad
                        any_bad |= bad
            for t in range(trees):
                first = np.uint64(t * span)
                for i in range(0, even_rows, 2):
                    _pair_sums(
                        flat_a,
                        np.uint64(i * padded) + first,
                        np.uint64((i + 1) * padded) + first,
                        flat_b,
                        np.uint64(p * padded * LANES) + first * np.uint64(LANES),
                        span,
                        sums,
                        np.uint64(i * LANES),
                        np.uint64((i + 1) * LANES),
                    )
                for q in range(lanes):  # RNE_fp32(acc + S): S exact, a zero S +0
                    acc[q] = acc[q] + sums[q]
            bits = acc.view(np.uint32)
            for i in range(rows):
                for jj in range(live):
                    out[g, i, j0 + jj] = bits[i * LANES + jj]
            if any_bad:  # (flags_out starts all 0)
                for i in range(rows):
                    for jj in range(live):
                        flags_out[g, i, j0 + jj] = lane_flags[i * LANES + jj]
                        flagged += lane_flags[i * LANES + jj]
    return flagged
