"""Numba kernels of the small-groups routes (``datapath.batch``): many small GEMMs
(attention heads) in a few calls per batch instead of passes, tiles and checks per group.

Exact-tree units of the BLAS route: the route decodes the batch's operands
(``_blas_kernels.decode_codes``), forms each tree's sums of every group with one batched float64
matmul, and adds them to every output's accumulator (:func:`start_trees`, :func:`add_tree`
per tree, :func:`finish_trees`): exactly what ``datapath.blas`` computes per GEMM (its module
docstring says why the float64 sums are exact in any order).

Truncating-window units (:func:`window_groups`): each group's outputs are SIMD lanes that read
the group's decoded rows of A and columns of B in place, through the window kernels' stages
(``_window_kernels``: tree references, tree finish, output encoding).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..quantize._kernels import SCALE_NAN
from . import _window_kernels as W
from ._blas_kernels import grid_sum, odd_sum, round_fp32, round_to_odd, two_sum

#: ``add_tree`` accumulation modes.
ROUND_EACH_TREE = 0  # RNE_fp32(acc + S) per tree
GRID = 1  # the fixed-point grid's rules per tree
EXACT_ACCUMULATOR = 2  # every tree's S added exactly (two float64s), one final RNE_fp32


@njit(cache=True, nogil=True)
def start_trees(c_flat, high, low, flags):
    """high = c (the flattened (G, M, N) fp32 c, or one value), low = 0; flags = 1 where c is
    non-finite or -0 (high 0 there)."""
    one = c_flat.shape[0] == 1
    for at in range(high.shape[0]):
        c = np.float64(c_flat[0 if one else at])
        bad = not math.isfinite(c) or (c == 0.0 and math.copysign(1.0, c) < 0)
        flags[at] = bad
        high[at] = 0.0 if bad else c
        low[at] = 0.0


@njit(cache=True, nogil=True)
def add_tree(sums, scales_a, scales_b, block, mode, grid, choices, high, low, flags, steps):
    """One tree into every output's accumulator: ``sums`` (G, M, N) the tree's unscaled
    float64 sums (exact), scale exponents (G, rows, blocks) of which block ``block`` is the
    tree's; ``high``, ``low``, ``flags`` the flattened (G, M, N) accumulator parts
    (``start_trees``), ``steps`` (M * N,) float64 scratch. With S = sums * 2^(Xa + Xb)
    (exact): ``ROUND_EACH_TREE``: high = RNE_fp32(high + S) (round-to-odd float64 sum, then
    fp32; a zero S counts as +0, as in ``_blas_kernels.accumulate_rne_fp32``); ``GRID``:
    ``_blas_kernels.accumulate_grid_fp32``'s step (``grid``: fraction bits n, max left and right
    shift; ``choices``: the accumulator rounding's ``blas.ROUNDING_CHOICES`` row);
    ``EXACT_ACCUMULATOR``: (high, low) += S by TwoSum, flagged where ``low`` rounds. Flags
    a non-finite sum (a NaN or ±Inf element: products of finite elements and their exact
    sums are finite) and a NaN scale. A group's outputs are one loop per stage (branch-free
    where the mode allows: they vectorise)."""
    groups, rows, columns = sums.shape
    area = rows * columns
    fraction_bits, max_left, max_right = grid[0], grid[1], grid[2]
    directed, large_positive, large_negative = choices[0] != 0, choices[1] != 0, choices[2] != 0
    nearest_even = not (directed or large_positive or large_negative)
    for g in range(groups):
        group_sums = sums[g].reshape(area)
        base = g * area
        group_high = high[base : base + area]
        group_low = low[base : base + area]
        group_flags = flags[base : base + area]
        for i in range(rows):
            x = np.int64(scales_a[g, i, block])
            for j in range(columns):
                y = np.int64(scales_b[g, j, block])
                bad = (x == SCALE_NAN) | (y == SCALE_NAN)
                # 2^(Xa + Xb) from its bits: |Xa + Xb| <= 254 lies within float64's normals
                exponent = 0 if bad else x + y
                steps[i * columns + j] = np.int64((exponent + 1023) << 52).view(np.float64)
                group_flags[i * columns + j] |= bad
        for at in range(area):
            group_flags[at] |= not math.isfinite(group_sums[at])
        if mode == ROUND_EACH_TREE:
            for at in range(area):
                total = group_sums[at] * steps[at] + 0.0  # an exact zero sum is +0
                group_high[at] = np.float32(odd_sum(group_high[at], total))
        elif mode == GRID:
            for at in range(area):
                acc = np.float32(group_high[at])
                keep, odd, zero = grid_sum(
                    acc, group_sums[at], steps[at], fraction_bits, max_left, max_right
                )
                if nearest_even:
                    rounded = np.float32(0.0) if zero else np.float32(odd)
                else:
                    rounded = (
                        np.float32(0.0)
                        if zero
                        else round_fp32(odd, directed, large_positive, large_negative)
                    )
                group_high[at] = acc if keep else rounded
        else:
            for at in range(area):
                value, error = two_sum(group_high[at], group_sums[at] * steps[at])
                group_high[at] = value
                rest, lost = two_sum(group_low[at], error)
                group_low[at] = rest
                group_flags[at] |= lost != 0.0


@njit(cache=True, nogil=True)
def finish_trees(high, low, mode, out):
    """out = the fp32 bits (uint32) of each accumulator: high, or for ``EXACT_ACCUMULATOR``
    RNE_fp32(high + low) (round-to-odd float64 sum, then fp32)."""
    for at in range(high.shape[0]):
        value = high[at]
        if mode == EXACT_ACCUMULATOR:
            total, error = two_sum(high[at], low[at])
            value = round_to_odd(total, error)
        out[at] = np.float32(value).view(np.uint32)


#: Columns of a lane block of :func:`window_groups`: a group's columns are padded to whole
#: blocks, so that every loop over a block's lanes has a constant trip count (one vector of
#: float32, no remainder loop) whatever the group's width.
LANE_BLOCK = 16
#: Terms of a pass of :func:`window_groups`' stages (unrolled in their loops): the route
#: takes units whose trees are whole passes and whose int32 groups hold a pass's terms.
PASS_TERMS = 8
#: Bit positions of a packed element table's fields (:func:`window_groups`): the value's
#: float32 bits in bits 0-31, the int8 alignment exponent in bits 32-39, 1 in bit 40 for a
#: non-finite code. One load a code instead of three.
PACKED_EXPONENT_SHIFT = 32
PACKED_NON_FINITE_SHIFT = 40


@njit(cache=True, nogil=True)
def window_groups(
    codes_a,
    codes_b,
    scales_a,
    scales_b,
    c_values,
    a_packed,
    b_packed,
    cfg,
    out,
    flags_out,
    start,
    stop,
):
    """Groups ``start`` to ``stop`` of a batch through a truncating-window unit
    (``datapath.window``): the output codes into ``out`` (G, M * N), 1 into ``flags_out``
    (G, M * N) where the generic kernel must recompute (a row of A or column of B holding a
    non-finite element or, for a unit with scales, a NaN scale: ``_window_kernels``'
    ``unusable_rows``; and every flag of the window stages). ``codes_a`` (G, M, K),
    ``codes_b`` (G, N, K), their scales (G, rows, blocks), ``c_values`` (G, M * N) or
    (1, 1), ``cfg`` as ``_window_kernels.window_items`` takes it and the per-code tables
    packed into one int64 a code (``PACKED_EXPONENT_SHIFT``: the value table's float32,
    the exponent table's int8 and whether the code is non-finite).

    Each group's outputs are the lanes of one pass of the window stages, lane
    i * NP + j output (i, j), NP the group's N columns padded to whole ``LANE_BLOCK``s, its
    rows to an even count and K to whole passes of ``PASS_TERMS`` (the padding: zero
    elements, whose terms are 0 and whose exponent sums stay below ``threshold``; the
    padding lanes' outputs are dropped). The lanes read the group's decoded elements in
    place: A's rows (M, K) as one value per row broadcast over its lanes, B's columns
    decoded once into a (K, NP) tile read by every row; each tree's lane shifts are its
    row's scale exponent plus its column's. The stages per lane are those of
    ``_window_kernels.lane_trees``: the int8 exponent-sum maxima,
    ``_window_kernels.tree_references``, the truncated terms, each pass's summed in int32
    (``datapath.batch.window_groups_apply`` admits units whose int32 groups hold a pass)
    and the passes' sums in float64 (exact integers, in any order), and
    ``_window_kernels.finish_tree``."""
    groups, rows, length = codes_a.shape
    columns = codes_b.shape[1]
    padded = -(-columns // LANE_BLOCK) * LANE_BLOCK
    even_rows = rows + rows % 2  # (the passes take rows in pairs: a last odd one gets a zero row)
    lanes = even_rows * padded
    fused_terms, block_size = cfg[W.W_FUSED_TERMS], cfg[W.W_BLOCK_SIZE]
    scaled = cfg[W.W_SCALED] != 0
    one_c = c_values.shape[0] == 1
    trees = (length + fused_terms - 1) // fused_terms
    # K padded with zero elements to whole passes (fused_terms is a multiple of a pass): the
    # last tree's last pass is whole too.
    padded_length = -(-length // PASS_TERMS) * PASS_TERMS
    # B's columns are decoded into the tile a band of rows at a time, so that the lines
    # written at once fit the L1 cache's ways: rows 4 KiB apart share a set (8 ways).
    decode_rows = max(8, 8 * (4096 // (4 * padded)))
    # Scratch once per call, not per group; the padding rows, columns and terms stay zero
    # elements.
    row_values = np.zeros((even_rows, padded_length), dtype=np.float32)
    row_exponents = np.full((even_rows, padded_length), W.ZERO_EXPONENT, dtype=np.int8)
    tile_values = np.zeros((padded_length, padded), dtype=np.float32)
    tile_exponents = np.full((padded_length, padded), W.ZERO_EXPONENT, dtype=np.int8)
    bad_rows = np.zeros(even_rows, dtype=np.uint8)
    bad_columns = np.zeros(padded, dtype=np.uint8)
    row_scales = np.zeros((rows, scales_a.shape[2] if scaled else 0), dtype=np.int32)
    column_scales = np.zeros((scales_b.shape[2] if scaled else 0, padded), dtype=np.int32)
    shifts = np.zeros(lanes, dtype=np.int32)
    maxima = np.empty(lanes, dtype=np.int8)
    references = np.empty(lanes, dtype=np.int64)
    factors = np.empty(lanes, dtype=np.float32)
    totals = np.empty(lanes)
    acc = np.zeros(lanes)
    lane_flags = np.empty(lanes, dtype=np.uint8)
    codes_out = np.empty(lanes, dtype=out.dtype)
    for g in range(start, stop):
        for i in range(rows):
            row = codes_a[g, i]
            unusable = 0
            for k in range(length):
                entry = a_packed[row[k]]
                row_values[i, k] = np.int32(entry).view(np.float32)
                row_exponents[i, k] = np.int8(entry >> PACKED_EXPONENT_SHIFT)
                unusable |= entry >> PACKED_NON_FINITE_SHIFT
            if scaled:
                for block in range(row_scales.shape[1]):
                    x = scales_a[g, i, block]
                    unusable |= x == SCALE_NAN
                    row_scales[i, block] = 0 if x == SCALE_NAN else x
            bad_rows[i] = unusable != 0
        for j in range(columns):
            bad_columns[j] = 0
        for k0 in range(0, length, decode_rows):
            for j in range(columns):
                row = codes_b[g, j]
                unusable = 0
                for k in range(k0, min(k0 + decode_rows, length)):
                    entry = b_packed[row[k]]
                    tile_values[k, j] = np.int32(entry).view(np.float32)
                    tile_exponents[k, j] = np.int8(entry >> PACKED_EXPONENT_SHIFT)
                    unusable |= entry >> PACKED_NON_FINITE_SHIFT
                bad_columns[j] |= unusable != 0
        if scaled:
            for j in range(columns):
                for block in range(column_scales.shape[0]):
                    y = scales_b[g, j, block]
                    bad_columns[j] |= y == SCALE_NAN
                    column_scales[block, j] = 0 if y == SCALE_NAN else y
        for i in range(even_rows):
            for j in range(padded):
                lane_flags[i * padded + j] = bad_rows[i] | bad_columns[j]
        if one_c:
            W.start_accumulators(c_values[0], 0, acc, lane_flags, cfg)
        else:
            for i in range(rows):
                first = i * padded
                W.start_accumulators(
                    c_values[g, i * columns : (i + 1) * columns],
                    0,
                    acc[first : first + columns],
                    lane_flags[first : first + columns],
                    cfg,
                )
        for tree in range(trees):
            if scaled:
                block = tree * fused_terms // block_size
                for i in range(rows):  # (the zero row's shifts stay 0)
                    x = row_scales[i, block]
                    for j in range(padded):
                        shifts[i * padded + j] = x + column_scales[block, j]
            first = tree * fused_terms
            last = min(first + fused_terms, padded_length)
            _block_maxima(row_exponents, tile_exponents, first, last, maxima)
            W.tree_references(maxima, shifts, acc, references, factors, cfg)
            _block_totals(row_values, tile_values, factors, first, last, totals)
            W.finish_tree(totals, references, acc, lane_flags, cfg)
        W.encode_outputs(acc, lane_flags, codes_out, cfg)
        for i in range(rows):
            for j in range(columns):
                out[g, i * columns + j] = codes_out[i * padded + j]
                flags_out[g, i * columns + j] = lane_flags[i * padded + j]


@njit(cache=True, inline="always")
def _pass_terms(row, k):
    """row[k] to row[k + 7]: a pass's elements of one row, loaded once outside the loop over
    a block's lanes."""
    return (
        row[k],
        row[k + 1],
        row[k + 2],
        row[k + 3],
        row[k + 4],
        row[k + 5],
        row[k + 6],
        row[k + 7],
    )


@njit(cache=True, inline="always")
def _pass_column(tile, k, j):
    """tile[k, j] to tile[k + 7, j]: a pass's elements of one lane's column of the tile."""
    return (
        tile[k, j],
        tile[k + 1, j],
        tile[k + 2, j],
        tile[k + 3, j],
        tile[k + 4, j],
        tile[k + 5, j],
        tile[k + 6, j],
        tile[k + 7, j],
    )


@njit(cache=True, inline="always")
def _pass_maximum(row, column):
    """The largest int8 exponent sum row[d] + column[d] of a pass (d < 8)."""
    return max(
        max(
            max(np.int8(row[0] + column[0]), np.int8(row[1] + column[1])),
            max(np.int8(row[2] + column[2]), np.int8(row[3] + column[3])),
        ),
        max(
            max(np.int8(row[4] + column[4]), np.int8(row[5] + column[5])),
            max(np.int8(row[6] + column[6]), np.int8(row[7] + column[7])),
        ),
    )


@njit(cache=True, inline="always")
def _pass_sum(row, column, factor):
    """The int32 sum of a pass's truncated terms int32(row[d] * column[d] * factor) (d < 8)."""
    return np.int32(
        (
            (np.int32(row[0] * column[0] * factor) + np.int32(row[1] * column[1] * factor))
            + (np.int32(row[2] * column[2] * factor) + np.int32(row[3] * column[3] * factor))
        )
        + (
            (np.int32(row[4] * column[4] * factor) + np.int32(row[5] * column[5] * factor))
            + (np.int32(row[6] * column[6] * factor) + np.int32(row[7] * column[7] * factor))
        )
    )


@njit(cache=True, inline="always")
def _block_maxima(row_exponents, tile_exponents, start, stop, maxima):
    """maxima[i * NP + j] = max over k in [start, stop) of the int8 sum
    row_exponents[i, k] + tile_exponents[k, j]: a tree's exponent-sum maxima of every lane.
    Two rows (an even count) and eight k per pass over a block's ``LANE_BLOCK`` lanes: each
    pass pays for its views and the compiler's overlap tests of them once, so the more terms
    it holds the less they cost. (Lanes are indexed from 0 in views: an index Numba cannot
    prove non-negative gets its wraparound test, which turns the loads into gathers.)"""
    rows, padded = row_exponents.shape[0], tile_exponents.shape[1]
    for i in range(0, rows, 2):
        x, y = row_exponents[i, start:stop], row_exponents[i + 1, start:stop]
        for column0 in range(0, padded, LANE_BLOCK):
            lane0 = i * padded + column0
            m0 = maxima[lane0 : lane0 + LANE_BLOCK]
            m1 = maxima[lane0 + padded : lane0 + padded + LANE_BLOCK]
            t = tile_exponents[start:stop, column0 : column0 + LANE_BLOCK]
            for j in range(LANE_BLOCK):
                m0[j] = -128
                m1[j] = -128
            for pass_ in range((stop - start) // PASS_TERMS):
                k = PASS_TERMS * pass_
                xs, ys = _pass_terms(x, k), _pass_terms(y, k)
                for j in range(LANE_BLOCK):
                    column = _pass_column(t, k, j)
                    m0[j] = max(m0[j], _pass_maximum(xs, column))
                    m1[j] = max(m1[j], _pass_maximum(ys, column))


@njit(cache=True, inline="always")
def _block_totals(row_values, tile_values, factors, start, stop, totals):
    """totals[i * NP + j] = the sum over k in [start, stop) (whole passes) of the truncated
    terms int32(row_values[i, k] * tile_values[k, j] * factors[i * NP + j]): each pass's
    eight in int32 (no sum of a pass's terms overflows: :func:`window_groups`), the passes'
    sums in float64 (integers below 2^53, as the window route's tree sums: exact in any
    order); two rows and a pass per loop over a block's lanes, as in :func:`_block_maxima`."""
    rows, padded = row_values.shape[0], tile_values.shape[1]
    for i in range(0, rows, 2):
        x, y = row_values[i, start:stop], row_values[i + 1, start:stop]
        for column0 in range(0, padded, LANE_BLOCK):
            lane0 = i * padded + column0
            f0 = factors[lane0 : lane0 + LANE_BLOCK]
            f1 = factors[lane0 + padded : lane0 + padded + LANE_BLOCK]
            s0 = totals[lane0 : lane0 + LANE_BLOCK]
            s1 = totals[lane0 + padded : lane0 + padded + LANE_BLOCK]
            t = tile_values[start:stop, column0 : column0 + LANE_BLOCK]
            for j in range(LANE_BLOCK):
                s0[j] = 0.0
                s1[j] = 0.0
            for pass_ in range((stop - start) // PASS_TERMS):
                k = PASS_TERMS * pass_
                xs, ys = _pass_terms(x, k), _pass_terms(y, k)
                for j in range(LANE_BLOCK):
                    column = _pass_column(t, k, j)
                    s0[j] += _pass_sum(xs, column, f0[j])
                    s1[j] += _pass_sum(ys, column, f1[j])
