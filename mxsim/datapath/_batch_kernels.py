"""Numba kernels of the small-groups routes (``datapath.batch``): many small GEMMs
(attention heads) in a few calls per batch instead of passes, tiles and checks per group.

Exact-tree units of the BLAS route (:func:`exact_groups`): one kernel call for the batch
decodes each group's operands, forms each tree's sums in registers and adds them to every
output's accumulator with the BLAS route's steps: exactly what ``datapath.blas`` computes
per GEMM (its module docstring says why the float64 sums are exact in any order).

Truncating-window units (:func:`window_groups`): each group's outputs are SIMD lanes that read
the group's decoded rows of A and columns of B in place, through the window kernels' stages
(``_window_kernels``: tree references, tree finish, output encoding).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..formats._kernels import power_of_two
from ..quantize._kernels import SCALE_NAN
from . import _window_kernels as W
from ._blas_kernels import grid_sum, odd_sum, round_fp32, two_sum
from ._tree_kernels import _bits_rounding, _round_bits

#: ``exact_groups`` accumulation modes.
ROUND_EACH_TREE = 0  # RNE_fp32(acc + S) per tree
GRID = 1  # the fixed-point grid's rules per tree
EXACT_ACCUMULATOR = 2  # every tree's S added exactly (two float64s), one final RNE_fp32


#: Columns of a lane block of :func:`window_groups`: a group's columns are padded to whole
#: blocks, so that every loop over a block's lanes has a constant trip count (one vector of
#: float32, no remainder loop) whatever the group's width.
LANE_BLOCK = 16
#: Padded widths (columns) from which :func:`window_groups`' stages loop over a row's lanes
#: at once rather than a block at a time (:func:`_row_maxima`, :func:`_row_totals`): a
#: pass's setup (its views, the compiler's overlap tests of them) is then paid once per row
#: pair instead of once per block, while narrower groups keep their loops of one
#: constant-length vector (on loops of a runtime length, a few lanes would pay the setup).
ROW_LANES_FROM = 64
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
    transposed,
    start,
    stop,
):
    """Groups ``start`` to ``stop`` of a batch through a truncating-window unit
    (``datapath.window``): the output codes into ``out`` (G, M * N), 1 into ``flags_out``
    (G, M * N) where the generic kernel must recompute (a row of A or column of B holding a
    non-finite element or, for a unit with scales, a NaN scale: ``_window_kernels``'
    ``unusable_rows``; and every flag of the window stages); returns how many it flagged.
    ``codes_a`` (G, M, K),
    ``codes_b`` (G, N, K), their scales (G, rows, blocks), ``c_values`` (G, M * N) or
    (1, 1), ``cfg`` as ``_window_kernels.window_items`` takes it and the per-code tables
    packed into one int64 a code (``PACKED_EXPONENT_SHIFT``: the value table's float32,
    the exponent table's int8 and whether the code is non-finite). ``transposed``: output
    (i, j) goes to ``out[g, j * M + i]`` (and its flag alike): the caller passes the
    operands swapped (B's as A's, A's as B's, ``c_values`` transposed) to compute a group
    as C^T = B A^T, whose every output is the same dot product, its terms in the same order
    (products, exponent sums and scale shifts are symmetric in the two elements). Narrow
    groups (fewer than :data:`ROW_LANES_FROM` padded columns, never transposed) pass None
    instead, and take the stages that loop over a block of lanes at a time
    (:func:`_block_maxima`, :func:`_block_totals`); wide ones, a bool, and the stages that
    loop over a row's lanes at once (:func:`_row_maxima`, :func:`_row_totals`). Numba
    compiles the kernel once per type of ``transposed`` and prunes the branches on
    ``transposed is None`` by that type, so that a batch of narrow groups (MiniLM's heads)
    compiles none of the wide groups' stages, and the other way round.

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
    (``datapath.batch.window_groups_apply`` admits units whose int32 groups hold a pass;
    wide groups sum a whole int32 group's passes in int32) and those sums in float64
    (exact integers, in any order), and ``_window_kernels.finish_tree``."""
    groups, rows, length = codes_a.shape
    columns = codes_b.shape[1]
    padded = -(-columns // LANE_BLOCK) * LANE_BLOCK
    even_rows = rows + rows % 2  # (the passes take rows in pairs: a last odd one gets a zero row)
    lanes = even_rows * padded
    fused_terms, block_size, group = cfg[W.W_FUSED_TERMS], cfg[W.W_BLOCK_SIZE], cfg[W.W_GROUP]
    scaled = cfg[W.W_SCALED] != 0
    one_c = c_values.shape[0] == 1
    trees = (length + fused_terms - 1) // fused_terms
    # K padded with zero elements to whole passes (fused_terms is a multiple of a pass): the
    # last tree's last pass is whole too.
    padded_length = -(-length // PASS_TERMS) * PASS_TERMS
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
    parity = cfg[W.W_PARITY] != 0
    first_totals = np.empty(lanes if parity else 0)  # (a parity tree's first half's)
    first_references = np.empty(lanes if parity else 0, dtype=np.int64)
    partials = np.empty((even_rows, padded), dtype=np.int32)  # (_row_totals' int32 groups)
    acc = np.zeros(lanes)
    outer = np.zeros(lanes)
    # One c for every output: its rounding into the accumulator and its flag, once per call.
    # (the same value and flag in every lane: one lane's, then fills)
    start_acc = np.zeros(1)
    start_flags = np.zeros(1, dtype=np.uint8)
    if one_c:
        W.start_accumulators(c_values[0], 0, start_acc, start_flags, cfg)
    start_value, start_flag = start_acc[0], start_flags[0]
    lane_flags = np.empty(lanes, dtype=np.uint8)
    codes_out = np.empty(lanes, dtype=out.dtype)
    flagged = 0
    # Groups whose lanes are their outputs in order (no padding lanes, not transposed) run
    # their stages in the output arrays themselves: no copy of the codes and flags.
    in_place = padded == columns and even_rows == rows and (transposed is None or not transposed)
    for g in range(start, stop):
        if in_place:
            lane_flags, codes_out = flags_out[g], out[g]
        any_bad = 0
        for i in range(rows):
            row = codes_a[g, i]
            unusable = 0
            for k in range(length):
                entry = a_packed[row[k]]
                row_values[i, k] = np.int32(entry).view(np.float32)
                row_exponents[i, k] = np.int8(entry >> PACKED_EXPONENT_SHIFT)
                unusable |= entry
            unusable >>= PACKED_NON_FINITE_SHIFT
            if scaled:
                for block in range(row_scales.shape[1]):
                    x = scales_a[g, i, block]
                    unusable |= x == SCALE_NAN
                    row_scales[i, block] = 0 if x == SCALE_NAN else x
            bad_rows[i] = unusable != 0
            any_bad |= unusable
        # B's codes are decoded a row of the tile at a time (strided loads of codes, unit-stride
        # stores) and ORed together over the whole group, not into a flag per column (a
        # reduction per column across the strided stores of a decode column by column cost
        # more); non-finite codes are rare, their columns then found by a second pass. No
        # unusable row or column (the usual case): the lane flags are a plain fill.
        group_codes = codes_b[g]
        unusable = 0
        for k in range(length):
            values_k, exponents_k = tile_values[k], tile_exponents[k]
            for j in range(columns):
                entry = b_packed[group_codes[j, k]]
                values_k[j] = np.int32(entry).view(np.float32)
                exponents_k[j] = np.int8(entry >> PACKED_EXPONENT_SHIFT)
                unusable |= entry
        if unusable >> PACKED_NON_FINITE_SHIFT:
            for j in range(columns):
                row = group_codes[j]
                unusable = 0
                for k in range(length):
                    unusable |= b_packed[row[k]]
                bad_columns[j] = unusable >> PACKED_NON_FINITE_SHIFT != 0
            any_bad = 1
        else:
            for j in range(columns):
                bad_columns[j] = 0
        if scaled:
            for j in range(columns):
                for block in range(column_scales.shape[0]):
                    y = scales_b[g, j, block]
                    bad_columns[j] |= y == SCALE_NAN
                    any_bad |= y == SCALE_NAN
                    column_scales[block, j] = 0 if y == SCALE_NAN else y
        if any_bad:
            for i in range(even_rows):
                for j in range(padded):
                    lane_flags[i * padded + j] = bad_rows[i] | bad_columns[j]
        else:  # (the usual case: a plain fill)
            lane_flags[:] = 0
        if one_c:
            acc[:] = start_value
            if start_flag:
                for lane in range(lanes):
                    lane_flags[lane] = 1
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
        W.start_outer(acc, outer, cfg)
        for tree in range(trees):
            if scaled:
                block = tree * fused_terms // block_size
                for i in range(rows):  # (the zero row's shifts stay 0)
                    x = row_scales[i, block]
                    for j in range(padded):
                        shifts[i * padded + j] = x + column_scales[block, j]
            first = tree * fused_terms
            last = min(first + fused_terms, padded_length)
            if transposed is None:
                _block_maxima(row_exponents, tile_exponents, first, last, maxima)
            else:
                _row_maxima(row_exponents, tile_exponents, first, last, maxima)
            W.tree_references(maxima, shifts, acc, references, factors, cfg)
            if transposed is None:
                _block_totals(row_values, tile_values, factors, first, last, totals)
            else:
                _row_totals(row_values, tile_values, factors, first, last, group, partials, totals)
            if parity and W.parity_halves(
                first, length, totals, references, first_totals, first_references, lane_flags, cfg
            ):
                continue
            W.finish_tree(totals, references, acc, lane_flags, cfg)
            W.after_tree(first + fused_terms, acc, outer, lane_flags, cfg)
        W.finish_outer(acc, outer, lane_flags, cfg)
        W.encode_outputs(acc, lane_flags, codes_out, cfg)
        if in_place:
            for lane in range(lanes):
                flagged += lane_flags[lane]
            continue
        lanes_flagged = 0
        for lane in range(lanes):
            lanes_flagged += lane_flags[lane]
        if lanes_flagged == 0:  # (the usual case: the codes alone, the flags a plain fill)
            group_out, group_flags = out[g], flags_out[g]
            for lane in range(rows * columns):
                group_flags[lane] = 0
            if transposed is not None and transposed:
                for j in range(columns):
                    for i in range(rows):
                        group_out[j * rows + i] = codes_out[i * padded + j]
            else:
                for i in range(rows):
                    for j in range(columns):
                        group_out[i * columns + j] = codes_out[i * padded + j]
            continue
        if transposed is not None and transposed:
            for j in range(columns):
                for i in range(rows):
                    out[g, j * rows + i] = codes_out[i * padded + j]
                    flags_out[g, j * rows + i] = lane_flags[i * padded + j]
                    flagged += lane_flags[i * padded + j]
        else:
            for i in range(rows):
                for j in range(columns):
                    out[g, i * columns + j] = codes_out[i * padded + j]
                    flags_out[g, i * columns + j] = lane_flags[i * padded + j]
                    flagged += lane_flags[i * padded + j]
    return flagged


@njit(cache=True, nogil=True)
def cut_words(words, keep, pattern, out):
    """out[u] = words[u, :keep] for every row u of ``words`` (U, W) uint64; returns whether
    every word from ``keep`` on equals ``pattern`` (the rows' codes past the cut are all one
    code). Rows of four words cut to two (a row of 32 one-byte codes to 16: MiniLM's heads)
    take loops of known trip counts: a few instructions a row instead of two short loops'
    setup."""
    units, width = words.shape
    differ = np.uint64(0)
    if width == 4 and keep == 2:
        for u in range(units):
            out[u, 0] = words[u, 0]
            out[u, 1] = words[u, 1]
            differ |= (words[u, 2] ^ pattern) | (words[u, 3] ^ pattern)
        return differ == 0
    for u in range(units):
        row, kept = words[u], out[u]
        for w in range(keep):
            kept[w] = row[w]
        for w in range(keep, width):
            differ |= row[w] ^ pattern
    return differ == 0


@njit(cache=True, inline="always")
def _pass_terms(row, k):
    """row[k] to row[k + 7]: a pass's elements of one row, loaded once outside the loop over
    a block's lanes. Indexed unsigned (``k`` is never negative; :func:`_step_elements`): a
    signed index gets Numba's wraparound test, a compare and a select per load before the
    loop, which cost the wide groups' stages (a row's lanes a few vectors per pass) more
    than their loads."""
    return _step_elements(row, np.uint64(k))


@njit(cache=True, inline="always")
def _pass_column(tile, k, j):
    """tile[k, j] to tile[k + 7, j]: a pass's elements of one lane's column of the tile
    (rows indexed unsigned, as in :func:`_pass_terms`)."""
    u = np.uint64(k)
    return (
        tile[u, j],
        tile[u + np.uint64(1), j],
        tile[u + np.uint64(2), j],
        tile[u + np.uint64(3), j],
        tile[u + np.uint64(4), j],
        tile[u + np.uint64(5), j],
        tile[u + np.uint64(6), j],
        tile[u + np.uint64(7), j],
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


@njit(cache=True, inline="always")
def _row_maxima(row_exponents, tile_exponents, start, stop, maxima):
    """:func:`_block_maxima` for wide groups (:data:`ROW_LANES_FROM`): the same maxima, each
    pass looping over a row's ``NP`` lanes at once; the first pass's maxima start the lanes'.
    Passes outside, row pairs inside: a row's lanes are a few vectors of int8, so a pass's
    setup (the tile rows' addresses) costs as much as its loop; paid once per pass for every
    row pair rather than once per pass and row pair (the maxima, one int8 a lane, stay in
    L1)."""
    rows, padded = row_exponents.shape[0], tile_exponents.shape[1]
    t = tile_exponents[start:stop]
    for k in range(0, stop - start, PASS_TERMS):
        for i in range(0, rows, 2):
            x, y = row_exponents[i, start:stop], row_exponents[i + 1, start:stop]
            m0 = maxima[i * padded : (i + 1) * padded]
            m1 = maxima[(i + 1) * padded : (i + 2) * padded]
            xs, ys = _pass_terms(x, k), _pass_terms(y, k)
            if k == 0:
                for j in range(padded):
                    column = _pass_column(t, k, j)
                    m0[j] = _pass_maximum(xs, column)
                    m1[j] = _pass_maximum(ys, column)
            else:
                for j in range(padded):
                    column = _pass_column(t, k, j)
                    m0[j] = max(m0[j], _pass_maximum(xs, column))
                    m1[j] = max(m1[j], _pass_maximum(ys, column))


@njit(cache=True, inline="always")
def _row_totals(row_values, tile_values, factors, start, stop, group, partials, totals):
    """:func:`_block_totals` for wide groups (:data:`ROW_LANES_FROM`): the same sums, each
    pass looping over a row's ``NP`` lanes at once, the passes of each int32 group of
    ``group`` terms (a multiple of a pass: ``datapath.batch.window_groups_apply``; no sum of
    its truncated terms overflows, ``_window_kernels``) summed in int32 in ``partials``
    (rows, NP) and the groups' sums in float64 (exact integers below 2^53), group after
    group as before. Passes outside, row pairs inside, as in :func:`_row_maxima`: a pass's
    setup once for every row pair."""
    rows, padded = row_values.shape[0], tile_values.shape[1]
    t = tile_values[start:stop]
    for first in range(0, stop - start, group):
        for k in range(first, min(first + group, stop - start), PASS_TERMS):
            for i in range(0, rows, 2):
                x, y = row_values[i, start:stop], row_values[i + 1, start:stop]
                f0 = factors[i * padded : (i + 1) * padded]
                f1 = factors[(i + 1) * padded : (i + 2) * padded]
                p0, p1 = partials[i], partials[i + 1]
                xs, ys = _pass_terms(x, k), _pass_terms(y, k)
                if k == first:  # a group's first pass starts its partial sums
                    for j in range(padded):
                        column = _pass_column(t, k, j)
                        p0[j] = _pass_sum(xs, column, f0[j])
                        p1[j] = _pass_sum(ys, column, f1[j])
                else:
                    for j in range(padded):
                        column = _pass_column(t, k, j)
                        p0[j] += _pass_sum(xs, column, f0[j])
                        p1[j] += _pass_sum(ys, column, f1[j])
        for i in range(rows):
            s0, p0 = totals[i * padded : (i + 1) * padded], partials[i]
            if first == 0:  # the first group's sums start the totals
                for j in range(padded):
                    s0[j] = p0[j]
            else:
                for j in range(padded):
                    s0[j] += p0[j]


#: Columns of a group's passes in :func:`exact_groups`: a trip count known when compiling,
#: so a row's tree sums over a pass are whole SIMD vectors (columns past N are zeros).
LANES = 16


@njit(cache=True, nogil=True, fastmath={"contract"})
def exact_groups(
    codes_a,
    codes_b,
    scales_a,
    scales_b,
    c_values,
    table_a,
    table_b,
    trees,
    mode,
    floors,
    grid,
    choices,
    room,
    out,
    flags_out,
    start,
    stop,
):
    """Groups ``start`` to ``stop`` of a batch through an exact-tree unit of the BLAS route,
    decoded, summed and accumulated group by group: the fp32 bits into ``out`` (G, M, N,
    uint32), 1 into ``flags_out`` (G, M, N) where the generic kernel must recompute;
    returns how many it flagged. ``codes_a`` (G, M, K) and ``codes_b`` (G, N, K) of any
    unsigned dtype, ``scales_a``/``scales_b`` (G, rows, blocks) scale exponents
    (``SCALE_NAN``: NaN), ``c_values`` (G, M, N) fp32 or (1, 1, 1) (one c: any array of
    one element), ``table_a``/``table_b`` the element tables (float64; NaN/±Inf for
    special codes), ``trees`` (T, 3) first position, last position and scale block of each
    tree in order (``batch.exact_trees``; a tree may reach past K: the padding is zeros),
    ``mode`` one of :data:`ROUND_EACH_TREE`,
    :data:`GRID`, :data:`EXACT_ACCUMULATOR`; for GRID, ``floors`` (int64: the X from which
    each tree rounds as ``ROUND_EACH_TREE``, ``blas.grid_nearest_even_floor``, and from
    which the rules reduce to the keep rule, ``blas.grid_floor``; a value above every X
    where the unit has none), ``grid`` (fraction bits n, max left and right shift) and
    ``choices`` (the accumulator rounding's ``blas.ROUNDING_CHOICES`` row); ``room``: -1, or
    with ``EXACT_ACCUMULATOR`` only, 53 minus the bits of a tree's unscaled sums
    (``blas.tree_sum_bits``): then a group whose products one float64 sum holds exactly by
    that bound (:func:`one_sum_fits`) is summed as one tree over all of K, S its exact sum,
    one step.

    Each output's accumulator starts at c (-0 and non-finite c flagged, started at 0); each
    tree's sum then enters as S = s 2^Xa 2^Xb, s its unscaled sum: outside GRID, and in
    GRID's groups that step as ``ROUND_EACH_TREE`` (below), the scales are folded into
    the decode (every tree lies in one scale block, so A's row i is decoded there as its
    table values times 2^Xa[i, block] and B's column j times 2^Xb[j, block]) and the tree
    sum comes out as S itself; GRID's other groups decode unscaled and multiply s by 2^Xa
    2^Xb, as their steps need each tree's X. Either is exact, the
    same value: every nonzero finite element of the tables (formats whose tree sums are
    exact in float64, ``datapath.blas``) is a float32 value, a multiple of 2^-149 below
    2^128, or one times 2^r, r <= 53, in ``batch``'s folded tables; so with |Xa|, |Xb| <=
    127 every scaled element and product, and every nonzero partial sum of a tree (a
    multiple of the products' least quantum 2^-552, at most its terms times 2^616) is a
    normal float64, the unscaled one times 2^(Xa + Xb): no rounding happens in either
    order. ``ROUND_EACH_TREE``: acc = RNE_fp32(acc + S): fp32(t), t = RN64(acc + S), where
    every t of the pass is exact (t - acc == S and t - S == acc: one difference is exact,
    Dekker's lemma, and differs where t is not), else the round-to-odd float64 sum, then
    fp32, for the whole pass (a zero S counts as +0, as in
    ``_blas_kernels.accumulate_rne_fp32``); ``GRID``: the step of
    ``_blas_kernels.accumulate_grid_fp32``; ``EXACT_ACCUMULATOR``: (high, low) += S by
    TwoSum, flagged where ``low`` rounds, and RNE_fp32(high + low) at the end. Where
    every output's c is +0 (c = None), the first tree's sums are formed in ``high`` itself,
    non-finite ones flagged, as S, an exact sum from +0, is never -0: its
    ``ROUND_EACH_TREE`` step RNE_fp32(+0 + S) is RNE_fp32(S), and for the exact
    accumulator TwoSum(+0, S) is (S, +0) for a finite S (low left +0). The output
    is the accumulator's fp32 bits. s is exact: every product and partial sum, in any
    order, is a float64 (the module docstring of ``datapath.blas``), so chains of fused
    multiply-adds from +0 over the tree's positions, in any grouping, give the exact sum,
    and an exact zero sum is +0.

    GRID, for a group whose every tree has X at or above a floor (so every earlier tree's
    is there too, as those floors need): from ``floors[0]`` each tree is
    RNE_fp32(acc + S), the ``ROUND_EACH_TREE`` step, and the group runs as that mode; from
    ``floors[1]`` acc is kept when |acc| >= 2^(X + L - n + 24), else becomes acc + S rounded
    once in the mode (``blas.grid_floor``), computed from t = RN64(acc + S) by its bits
    (``_tree_kernels._round_bits``) where every t of the row is exact (t - acc == S and t -
    S == acc: one difference is exact, Dekker's lemma, and differs where t is not) and below
    2^128; a row with another t takes the full step.

    Flagged: a non-finite tree sum, a NaN scale of a tree's block, a bad c, and an exact
    accumulator whose sum needs more than two float64s. Every term of every sum is
    computed but products of code 0 (below), so a NaN or ±Inf element makes every sum of
    its row of A or column of B over its tree non-finite (±Inf times 0 is NaN): exactly
    the outputs of such rows and columns are flagged, as products of finite elements and
    their exact sums are finite. Each group's A and its B transposed are decoded (B's
    columns padded to whole passes of :data:`LANES` with zeros); the tree sums of two rows
    over a pass are SIMD vectors (``_tree_sums``: each element of B loaded once for both
    rows; an odd last row is paired with a row of zeros whose sums are not read), and the
    accumulation steps are loops over a pass's lanes (they vectorise): of every row at once,
    but a row at a time in GRID's groups that do not step as ``ROUND_EACH_TREE``.

    Zero codes: where code 0 is ±0 in both tables, the positions from which every code of
    the group's A and B is 0 (the zero padding of K short of a tree or of whole trees,
    MiniLM's P @ v), found at the granularity of trees and their halves, are neither
    decoded nor summed (:func:`_live_trees`): their products are ±0, which leave a tree's
    exact sum from +0 unchanged, and a tree wholly past them has the exact sum +0 without
    a term. Such a tree's accumulation step still runs with S = +0, as a step with S = +0
    is not the identity (acc = -0 becomes +0), but a run of such trees one after another
    takes one step where that step is idempotent. Plain steps (``ROUND_EACH_TREE``, and
    GRID's at or above ``floors[0]``) map acc to RNE_fp32(odd(acc + 0)) = acc + 0.0:
    TwoSum(acc, +0) is (acc + 0.0, +0) for finite acc (for -0: +0 and (-0 - +0) + +0 =
    +0), (acc, NaN) for ±Inf or NaN acc, whose round-to-odd is acc as it stands, and acc
    is a float32 value; and acc + 0.0 is idempotent. ``EXACT_ACCUMULATOR``: TwoSum(high,
    +0) gives high + 0.0 and error +0 for finite high, then TwoSum(low, +0) low + 0.0 and
    no flag for finite low; a non-finite high or low sets the flag (a NaN error) and
    leaves low non-finite, as the next step does again; flags are only ORed, so one step
    leaves what any number of them leave. GRID's other steps with S = +0 leave a nonzero acc
    as it is but make a -0 they do not keep +0, and whether they keep it depends on the
    tree's X (``_blas_kernels.grid_sum``), which differs between scale blocks: every one
    runs."""
    groups, rows, length = codes_a.shape
    columns = codes_b.shape[1]
    count = trees.shape[0]
    padded = length
    for t in range(count):
        padded = max(padded, trees[t, 1])
    passes = (columns + LANES - 1) // LANES
    fraction_bits, max_left, max_right = grid[0], grid[1], grid[2]
    directed, large_positive, large_negative = choices[0] != 0, choices[1] != 0, choices[2] != 0
    nearest_even = not (directed or large_positive or large_negative)
    mask, add_positive, add_negative = _bits_rounding(directed, large_positive, large_negative)
    keep_factor = power_of_two(max_left - fraction_bits + 24)
    one_c = c_values.size == 1  # (one c; or one output, with its own: the same)
    c_first = np.float64(c_values[0, 0, 0]) if one_c else 0.0  # (the padding's c: 0)
    # One c for every output (c=None: +0) is checked once, not per output.
    bad_first = not math.isfinite(c_first) or (c_first == 0.0 and math.copysign(1.0, c_first) < 0)
    start_first = 0.0 if bad_first else c_first
    # Every output's accumulator from +0: the first tree's sums are formed in ``high`` (for
    # the exact accumulator TwoSum(+0, S) is (S, +0) for a finite S, and RNE_fp32(+0 + S) is
    # RNE_fp32(S): an exact sum from +0 is never -0).
    from_zero = one_c and start_first == 0.0
    # Scratch once per call: a group's A (zeros past K; rows in pairs) and B transposed per
    # pass of columns (zeros past N and K), scale exponents per tree, and a pass's tree sums,
    # steps and accumulators. (Indexes come from ranges from 0, or are unsigned: a signed index of
    # unknown sign costs wraparound arithmetic per element, and the loops do not vectorise.)
    # A, B, the tree sums, the accumulators and the steps each start a page of one buffer:
    # Numba aligns an array to 32 bytes only, and rows read as 64-byte vectors that straddle
    # two cache lines cost two loads each (B's rows in the sums, the steps and accumulators
    # in the accumulation); and the arrays then lie at the same page offsets on every call,
    # whatever the heap's state.
    paired = rows + rows % 2  # (rows in pairs: a last odd one beside a row of zeros)
    sizes = (
        paired * padded,
        passes * padded * LANES,
        paired * LANES,
        paired * LANES,
        rows * LANES,
        count * rows,
        count * passes * LANES,
    )
    total = PAGE_FLOATS  # (room to start at a page)
    for size in sizes:
        total += _whole_pages(size)
    scratch = np.zeros(total)
    at = (-(scratch.ctypes.data // 8)) % PAGE_FLOATS
    a = scratch[at : at + sizes[0]].reshape((paired, padded))
    at += _whole_pages(sizes[0])
    b = scratch[at : at + sizes[1]].reshape((passes, padded, LANES))
    at += _whole_pages(sizes[1])
    sums = scratch[at : at + sizes[2]].reshape((paired, LANES))
    at += _whole_pages(sizes[2])
    high = scratch[at : at + sizes[3]].reshape((paired, LANES))  # (rows in pairs: sums)
    at += _whole_pages(sizes[3])
    low = scratch[at : at + sizes[4]].reshape((rows, LANES))
    at += _whole_pages(sizes[4])
    row_steps = scratch[at : at + sizes[5]].reshape((count, rows))
    at += _whole_pages(sizes[5])
    for q in range(sizes[6]):  # (the padding lanes' steps: 1)
        scratch[at + q] = 1.0
    column_steps = scratch[at : at + sizes[6]].reshape((count, passes, LANES))
    fresh = np.empty(LANES)
    # Runs of consecutive trees of one scale block, decoded with one factor a row/column.
    runs = np.empty((count, 3), dtype=np.int64)
    run_count = 0
    for t in range(count):
        joined = run_count > 0 and runs[run_count - 1, 1] == trees[t, 0]
        if joined and runs[run_count - 1, 2] == trees[t, 2]:
            runs[run_count - 1, 1] = trees[t, 1]
        else:
            runs[run_count, 0], runs[run_count, 1] = trees[t, 0], trees[t, 1]
            runs[run_count, 2] = trees[t, 2]
            run_count += 1
    bad_rows = np.zeros(rows, dtype=np.uint8)
    bad_columns = np.zeros((passes, LANES), dtype=np.uint8)
    lane_flags = np.empty((rows, LANES), dtype=np.uint8)
    flat_a, flat_b, flat_sums = a.reshape(a.size), b.reshape(b.size), sums.reshape(sums.size)
    flat_high, flat_low = high.reshape(high.size), low.reshape(low.size)
    flat_flags = lane_flags.reshape(lane_flags.size)
    # Each group's trees' summed positions and its positions to decode and trees to run
    # (:func:`_live_trees`), for the call's groups at once before them.
    group_terms = np.empty((stop - start, count), dtype=np.int64)
    limits = np.empty((stop - start, 2), dtype=np.int64)
    zero_code_zero = table_a[0] == 0.0 and table_b[0] == 0.0
    _live_trees(codes_a, codes_b, trees, zero_code_zero, start, stop, group_terms, limits)
    flagged = 0
    for g in range(start, stop):
        at = g - start
        decoded, run = limits[at, 0], limits[at, 1]
        # GRID: the least X of the group's trees; where it is at or above ``floors[0]`` every
        # step is RNE_fp32(acc + S), the group runs as ROUND_EACH_TREE (scales folded).
        least_x = np.int64(1 << 20)
        if mode == GRID:
            for r in range(run_count):
                block = runs[r, 2]
                least_row = _exponent_span(scales_a, g, block)[0]
                least_x = min(least_x, least_row + _exponent_span(scales_b, g, block)[0])
        plain = mode == ROUND_EACH_TREE or (mode == GRID and least_x >= floors[0])
        unfolded = mode == GRID and not plain
        fast = mode == GRID and least_x >= floors[1]
        idempotent = plain or mode == EXACT_ACCUMULATOR
        direct = from_zero and (plain or mode == EXACT_ACCUMULATOR)
        # An exact accumulator's group whose products one float64 sum holds exactly: one
        # tree, one step.
        steps = run if idempotent else count
        if room >= 0 and one_sum_fits(scales_a, scales_b, g, trees, room):
            steps = 1  # (its terms: the positions decoded, to the last tree's summed ones)
            group_terms[at, 0] = max(0, decoded - trees[0, 0])
        # An exact accumulator whose first tree, formed in ``high``, is its only step keeps
        # ``low`` +0: high + low is high.
        two_part = mode == EXACT_ACCUMULATOR and not (direct and steps == 1)
        group_bad = np.uint8(0)  # (a NaN scale of one of the group's rows or columns)
        # A and B decoded run by run (a run: consecutive trees of one scale block), each
        # row's and column's positions of a run times its factor 2^X there (1 for a NaN
        # scale, whose outputs are flagged; 1 in GRID's groups that do not step as
        # ROUND_EACH_TREE, whose steps scale the sums), its flag set on the way. (Unsigned
        # offsets: no wraparound arithmetic per element.)
        for r in range(run_count):
            first, block = np.uint64(runs[r, 0]), runs[r, 2]
            terms = max(0, min(runs[r, 1], decoded) - runs[r, 0])
            for i in range(rows):
                x = np.int64(scales_a[g, i, block])
                nan = np.uint8(x == SCALE_NAN)
                bad_rows[i] = nan if r == 0 else bad_rows[i] | nan
                group_bad |= nan
                factor = power_of_two(0 if x == SCALE_NAN or unfolded else x)
                for k in range(terms):
                    q = first + np.uint64(k)
                    a[i, q] = table_a[codes_a[g, i, q]] * factor
            for p in range(passes):
                for jj in range(min(LANES, columns - p * LANES)):
                    y = np.int64(scales_b[g, p * LANES + jj, block])
                    nan = np.uint8(y == SCALE_NAN)
                    bad_columns[p, jj] = nan if r == 0 else bad_columns[p, jj] | nan
                    group_bad |= nan
                    factor = power_of_two(0 if y == SCALE_NAN or unfolded else y)
                    for k in range(terms):
                        q = first + np.uint64(k)
                        b[p, q, jj] = table_b[codes_b[g, p * LANES + jj, q]] * factor
        # GRID's other groups: each tree's steps 2^Xa and 2^Xb (1 for a NaN scale).
        if unfolded:
            for t in range(count):
                block = trees[t, 2]
                for i in range(rows):
                    x = np.int64(scales_a[g, i, block])
                    row_steps[t, i] = power_of_two(0 if x == SCALE_NAN else x)
                for p in range(passes):
                    for jj in range(min(LANES, columns - p * LANES)):
                        y = np.int64(scales_b[g, p * LANES + jj, block])
                        column_steps[t, p, jj] = power_of_two(0 if y == SCALE_NAN else y)
        for p in range(passes):
            j0 = p * LANES
            live = min(LANES, columns - j0)
            if one_c:  # (fills over the pass's lanes of every row at once)
                if not direct:  # (else the first tree's sums are written there)
                    for q in range(rows * LANES):
                        flat_high[q] = start_first
                if two_part:  # (only its steps read ``low``)
                    for q in range(rows * LANES):
                        flat_low[q] = 0.0
                for q in range(rows * LANES):
                    flat_flags[q] = bad_first
                if group_bad:  # (rare: the rows' and columns' own flags lane by lane)
                    for i in range(rows):
                        for jj in range(LANES):
                            lane_flags[i, jj] |= bad_rows[i] | bad_columns[p, jj]
            else:
                for i in range(rows):
                    for jj in range(LANES):
                        high[i, jj] = c_first
                        if jj < live:
                            high[i, jj] = np.float64(c_values[g, i, j0 + jj])
                    for jj in range(LANES):
                        c = high[i, jj]
                        bad = not math.isfinite(c) or (c == 0.0 and math.copysign(1.0, c) < 0)
                        high[i, jj] = 0.0 if bad else c
                        low[i, jj] = 0.0
                        lane_flags[i, jj] = bad | bad_rows[i] | bad_columns[p, jj]
            # Past the last tree with terms, a run of trees whose sums are +0 takes one step
            # where that step is idempotent (module docstring), else a step each.
            for t in range(steps):
                first, terms = np.uint64(trees[t, 0]), group_terms[at, t]
                for i in range(0, rows, 2):  # (an odd last row beside A's row of zeros)
                    _tree_sums(
                        flat_a,
                        np.uint64(i * padded) + first,
                        np.uint64((i + 1) * padded) + first,
                        flat_b,
                        np.uint64(p * padded * LANES) + first * np.uint64(LANES),
                        terms,
                        flat_high if direct and t == 0 else flat_sums,
                        np.uint64(i * LANES),
                        np.uint64((i + 1) * LANES),
                    )
                # The sums are S where the scales are folded: each step one loop over the
                # pass's lanes of every row (contiguous in ``sums``, ``high``, ``low`` and
                # the flags).
                if direct and t == 0:  # high = S (the sums' target), low = +0
                    for q in range(rows * LANES):
                        s = flat_high[q]
                        flat_flags[q] |= not math.isfinite(s)
                        if plain:
                            flat_high[q] = np.float32(s)
                    continue
                if plain:
                    # RNE_fp32(acc + S) is fp32(t), t = RN64(acc + S), wherever t is exact:
                    # t - acc == S and t - S == acc (one difference is, Dekker's lemma); the
                    # pass's steps go through the round-to-odd sum where one is not.
                    inexact = False
                    for q in range(rows * LANES):
                        s, acc = flat_sums[q], flat_high[q]
                        flat_flags[q] |= not math.isfinite(s)
                        total = acc + s
                        flat_low[q] = np.float32(total)
                        inexact |= (total - acc != s) | (total - s != acc)
                    if inexact:
                        for q in range(rows * LANES):
                            flat_high[q] = np.float32(odd_sum(flat_high[q], flat_sums[q]))
                    else:
                        for q in range(rows * LANES):
                            flat_high[q] = flat_low[q]
                    continue
                if mode == EXACT_ACCUMULATOR:
                    for q in range(rows * LANES):
                        s = flat_sums[q]
                        flat_flags[q] |= not math.isfinite(s)
                        value, error = two_sum(flat_high[q], s)
                        flat_high[q] = value
                        rest, lost = two_sum(flat_low[q], error)
                        flat_low[q] = rest
                        flat_flags[q] |= lost != 0.0
                    continue
                for i in range(rows):  # GRID's other groups: S = s 2^Xa 2^Xb
                    step = row_steps[t, i]
                    redo = not fast
                    if fast:  # above the grid floor: the keep rule, one rounding
                        for jj in range(LANES):
                            s = sums[i, jj]
                            lane_flags[i, jj] |= not math.isfinite(s)
                            scale = step * column_steps[t, p, jj]
                            acc = high[i, jj]
                            total = acc + s * scale
                            # exact sums below 2^128 only: t - acc == S and t - S == acc
                            # hold iff t is exact (one difference is, Dekker's lemma)
                            redo |= (
                                (total - acc != s * scale)
                                | (total - s * scale != acc)
                                | ~(abs(total) < 2.0**128)
                            )
                            rounded = _round_bits(total, mask, add_positive, add_negative)
                            fresh[jj] = acc if abs(acc) >= keep_factor * scale else rounded
                        if not redo:
                            for jj in range(LANES):
                                high[i, jj] = fresh[jj]
                    if redo:
                        for jj in range(LANES):
                            s = sums[i, jj]
                            lane_flags[i, jj] |= not math.isfinite(s)
                            acc = np.float32(high[i, jj])
                            keep, odd, zero = grid_sum(
                                acc,
                                s,
                                step * column_steps[t, p, jj],
                                fraction_bits,
                                max_left,
                                max_right,
                            )
                            if nearest_even:
                                rounded = np.float32(0.0) if zero else np.float32(odd)
                            else:
                                rounded = (
                                    np.float32(0.0)
                                    if zero
                                    else round_fp32(odd, directed, large_positive, large_negative)
                                )
                            high[i, jj] = acc if keep else rounded
            for i in range(rows):
                if two_part:  # RNE_fp32(high + low): its round-to-odd sum
                    for jj in range(LANES):
                        high[i, jj] = odd_sum(high[i, jj], low[i, jj])
                # the row's flags ORed (one byte OR a lane), counted only where one is set
                # (rare): a count per lane widens every flag to int64 first
                any_flag = np.uint8(0)
                for jj in range(live):
                    out[g, i, j0 + jj] = np.float32(high[i, jj]).view(np.uint32)
                    flags_out[g, i, j0 + jj] = lane_flags[i, jj]
                    any_flag |= lane_flags[i, jj]
                if any_flag:
                    for jj in range(live):
                        flagged += lane_flags[i, jj]
    return flagged


@njit(cache=True)
def one_sum_fits(scales_a, scales_b, g, trees, room):
    """Whether group ``g``'s products over all of K one float64 sum holds exactly, in any
    order (an exact accumulator's trees, :func:`exact_groups`), as ``blas._exact_chunks``
    bounds a range of scale blocks: a tree's unscaled sums need b bits
    (``blas.tree_sum_bits``), so with h_t the tree's largest and m the group's least scale
    exponent sum Xa + Xb (over its rows and columns), every partial sum is a multiple of
    the least product's quantum times 2^m below that quantum times 2^(b + m) sum_t 2^(h_t -
    m), and fits 53 bits when sum_t 2^(h_t - m) <= 2^``room``, ``room`` = 53 - b. False
    for ``room`` < 0, for trees that are not in order and adjoining and for a group with a
    NaN scale (``SCALE_NAN``, above every exponent) in one of its trees' blocks.
    ``scales_a`` (G, M, blocks), ``scales_b`` (G, N, blocks); ``trees`` as
    :func:`exact_groups`'."""
    count = trees.shape[0]
    if room < 0:
        return False
    least = np.int64(1 << 40)
    for t in range(count):
        if t > 0 and trees[t, 0] != trees[t - 1, 1]:
            return False
        block = trees[t, 2]
        low_a, high_a = _exponent_span(scales_a, g, block)
        low_b, high_b = _exponent_span(scales_b, g, block)
        if high_a == SCALE_NAN or high_b == SCALE_NAN:
            return False
        least = min(least, low_a + low_b)
    total = 0.0
    for t in range(count):
        block = trees[t, 2]
        spread = _exponent_span(scales_a, g, block)[1] + _exponent_span(scales_b, g, block)[1]
        spread -= least
        if spread > room:
            return False
        total += power_of_two(spread)
    return total <= power_of_two(room)


@njit(cache=True, inline="always")
def _exponent_span(scales, g, block):
    """(least, largest) of scales[g, :, block] as int64 (2^20 and -2^20 for no rows: above
    and below every exponent)."""
    low, high = np.int64(1 << 20), np.int64(-(1 << 20))
    for i in range(scales.shape[1]):
        x = np.int64(scales[g, i, block])
        low, high = min(low, x), max(high, x)
    return low, high


#: float64 elements of a 4096-byte page.
PAGE_FLOATS = 512


@njit(cache=True)
def _live_trees(codes_a, codes_b, trees, zero_code_zero, start, stop, group_terms, limits):
    """For each group g from ``start`` to ``stop`` of :func:`exact_groups`: group_terms[g -
    start, t] the positions from its first that tree t sums, limits[g - start] (the
    positions to decode: to the end of the last tree's summed ones, at most K; the trees
    to run where a step with S = +0 is idempotent: up to the last with terms and one
    more, at most all). Each tree's, but where the trees lie in order and apart, from the
    last tree back: halved while a multiple of 16 and its second half holds zeros only, 0
    where the whole tree does: positions past K (the padding, decoded as +0), and where
    code 0 is ±0 in both tables (``zero_code_zero``) and the group's codes at K - 1 are 0
    in A's first row and B's first column, positions whose codes are 0 in every row of A
    and of B. The products left out are ±0 (a NaN or ±Inf code is not 0; the other
    operand's code at a padding position is padding too), which leave a tree's exact sum
    from +0 unchanged: a tree of 0 positions has the exact sum +0. The halves are 16 and 8
    positions, whole steps of ``_tree_sums``. (One call for the groups: a call per
    group costs about as much as the search.)"""
    length, count = codes_a.shape[2], trees.shape[0]
    ordered = True
    for t in range(count - 1):
        ordered &= trees[t, 1] <= trees[t + 1, 0]
    scan_any = zero_code_zero and ordered and min(codes_a.shape[1], codes_b.shape[1], length) > 0
    padding_at = -1  # the row of a group with the padding alone, once worked out
    for g in range(start, stop):
        at = g - start
        terms_g = group_terms[at]
        scan = scan_any and codes_a[g, 0, length - 1] == 0 and codes_b[g, 0, length - 1] == 0
        if not scan and padding_at >= 0:
            for t in range(count):
                terms_g[t] = group_terms[padding_at, t]
            limits[at, 0], limits[at, 1] = limits[padding_at, 0], limits[padding_at, 1]
            continue
        for t in range(count):
            terms_g[t] = trees[t, 1] - trees[t, 0]
        limits[at, 0], limits[at, 1] = length, count
        if not scan:
            padding_at = at
        if not ordered:
            continue
        zero_from = length  # every position from here on holds zeros
        last = count - 1
        while last >= 0:
            first, terms = trees[last, 0], terms_g[last]
            while terms:
                cut = first + terms // 2 if terms % 16 == 0 else first
                if cut < zero_from and not (
                    scan
                    and _zero_codes(codes_a[g], cut, zero_from)
                    and _zero_codes(codes_b[g], cut, zero_from)
                ):
                    break
                zero_from = min(zero_from, cut)
                terms = terms // 2 if cut > first else 0
            terms_g[last] = terms
            if terms:
                break
            last -= 1
        limits[at, 0] = min(length, trees[last, 0] + terms_g[last]) if last >= 0 else 0
        limits[at, 1] = min(count, last + 2)


@njit(cache=True)
def _zero_codes(codes, start, stop):
    """Whether every code of codes[:, start:stop] is 0 (the first nonzero row ends the
    search): segments of 8 and 16 positions, the trees' and halves' widths, by loops of a
    constant trip count (a row's segment loaded as one vector), others by a row's codes
    ORed together in a loop from 0 over its view. (A function of its own, not inlined:
    :func:`_live_trees` compiles faster, and runs no slower.)"""
    if stop - start == 8:
        return _zero_codes8(codes, start)
    if stop - start == 16:
        return _zero_codes16(codes, start)
    for i in range(codes.shape[0]):
        row = codes[i, start:stop]
        bits = 0
        for k in range(row.shape[0]):
            bits |= row[k]
        if bits:
            return False
    return True


def _fixed_zero_codes(width: int):
    """A kernel of :func:`_zero_codes` over segments of ``width`` positions (a constant when
    compiling: the loop over a row's segment unrolls)."""

    @njit(inline="always")
    def zero_codes(codes, start):
        for i in range(codes.shape[0]):
            row = codes[i, start : start + width]
            bits = row[0]
            for k in range(1, width):
                bits |= row[k]
            if bits:
                return False
        return True

    return zero_codes


_zero_codes8, _zero_codes16 = (_fixed_zero_codes(width) for width in (8, 16))


@njit(cache=True, inline="always")
def _whole_pages(size):
    """``size`` float64 elements rounded up to whole pages (of :data:`PAGE_FLOATS`)."""
    return -(-size // PAGE_FLOATS) * PAGE_FLOATS


#: Positions of a step of :func:`_pair_step_sums`: each row's eight elements of A are held
#: in registers while the step's eight rows of B are read once for both rows.
PAIR_STEP = 8


@njit(cache=True, inline="always")
def _step_elements(values, at):
    """values[at] to values[at + 7] (an unsigned offset): a step's elements of a row of A."""
    return (
        values[at],
        values[at + np.uint64(1)],
        values[at + np.uint64(2)],
        values[at + np.uint64(3)],
        values[at + np.uint64(4)],
        values[at + np.uint64(5)],
        values[at + np.uint64(6)],
        values[at + np.uint64(7)],
    )


@njit(cache=True, inline="always", fastmath={"contract"})
def _pair_step_sums(a, at_a, at_a2, b, at_b, terms, sums, at_sums, at_sums2):
    """sums[at_sums + jj] = the sum over m < ``terms`` of a[at_a + m] * b[at_b + m * LANES +
    jj], and sums[at_sums2 + jj] the same of a[at_a2 + m], for jj < :data:`LANES` (flat
    arrays, unsigned offsets): two rows of A against one pass of B, each element of B
    loaded once for both rows' fused multiply-adds (one row's would wait on loads, not on
    the multiply-add units). Steps of :data:`PAIR_STEP` positions, then the rest a position
    at a time; a step's products enter its sum as two chains (positions of one parity each)
    added to the sum so far last, so consecutive steps wait on one addition only. Exact for
    sums that fit float64, in any grouping (``datapath.blas``); from +0: every sum's last
    operation adds to +0 or to the sum of earlier positions, so an exact zero sum is +0."""
    whole = terms - terms % PAIR_STEP
    if terms == 0:
        for jj in range(LANES):
            sums[at_sums + np.uint64(jj)] = 0.0
            sums[at_sums2 + np.uint64(jj)] = 0.0
    for m in range(0, whole, PAIR_STEP):
        first = m == 0
        o, o2 = at_a + np.uint64(m), at_a2 + np.uint64(m)
        x0, x1, x2, x3, x4, x5, x6, x7 = _step_elements(a, o)
        y0, y1, y2, y3, y4, y5, y6, y7 = _step_elements(a, o2)
        step = at_b + np.uint64(m * LANES)
        for jj in range(LANES):
            q = step + np.uint64(jj)
            b0, b1 = b[q], b[q + np.uint64(LANES)]
            b2, b3 = b[q + np.uint64(2 * LANES)], b[q + np.uint64(3 * LANES)]
            b4, b5 = b[q + np.uint64(4 * LANES)], b[q + np.uint64(5 * LANES)]
            b6, b7 = b[q + np.uint64(6 * LANES)], b[q + np.uint64(7 * LANES)]
            s = 0.0 if first else sums[at_sums + np.uint64(jj)]
            r = 0.0 if first else sums[at_sums2 + np.uint64(jj)]
            even = ((x0 * b0 + x2 * b2) + x4 * b4) + x6 * b6
            odd = ((x1 * b1 + x3 * b3) + x5 * b5) + x7 * b7
            sums[at_sums + np.uint64(jj)] = s + (even + odd)
            even = ((y0 * b0 + y2 * b2) + y4 * b4) + y6 * b6
            odd = ((y1 * b1 + y3 * b3) + y5 * b5) + y7 * b7
            sums[at_sums2 + np.uint64(jj)] = r + (even + odd)
    for m in range(whole, terms):
        x, y = a[at_a + np.uint64(m)], a[at_a2 + np.uint64(m)]
        step = at_b + np.uint64(m * LANES)
        for jj in range(LANES):
            s = 0.0 if m == 0 else sums[at_sums + np.uint64(jj)]
            r = 0.0 if m == 0 else sums[at_sums2 + np.uint64(jj)]
            sums[at_sums + np.uint64(jj)] = s + x * b[step + np.uint64(jj)]
            sums[at_sums2 + np.uint64(jj)] = r + y * b[step + np.uint64(jj)]


@njit(cache=True, inline="always", fastmath={"contract"})
def _tree_sums(a, at_a, at_a2, b, at_b, terms, sums, at_sums, at_sums2):
    """:func:`_pair_step_sums` (two rows of A, one pass of B), compiled apart for trees of
    8 positions (one step: no loop, no test of the first step; trees of 8 make the most
    calls per product), and once for any other ``terms``. (Each width compiled apart adds
    about a quarter to the kernel's first compilation: 16 and 32, whose steps loop,
    gain little from it.)"""
    if terms == 8:
        _pair_step_sums(a, at_a, at_a2, b, at_b, 8, sums, at_sums, at_sums2)
    else:
        _pair_step_sums(a, at_a, at_a2, b, at_b, terms, sums, at_sums, at_sums2)


@njit(cache=True, inline="always")
def _fold_8x2(codes, exponents, u, t, size, cap, least, raised):
    """:func:`fold_group_codes`' step for tree ``t`` of row ``u`` when it holds 8 whole
    blocks of 2 positions (bfp-exact's trees of 16): the eight exponents loaded once, their
    least and largest as trees of comparisons, each block's raise added to its two codes
    (straight-line code: loops of unknown length do not keep the eight in registers). Returns the
    tree's largest rise."""
    first, k = t * 8, t * 16
    e = exponents[u]
    x0, x1, x2, x3 = (
        np.int64(e[first]),
        np.int64(e[first + 1]),
        np.int64(e[first + 2]),
        np.int64(e[first + 3]),
    )
    x4, x5, x6, x7 = (
        np.int64(e[first + 4]),
        np.int64(e[first + 5]),
        np.int64(e[first + 6]),
        np.int64(e[first + 7]),
    )
    low = min(min(min(x0, x1), min(x2, x3)), min(min(x4, x5), min(x6, x7)))
    high = max(max(max(x0, x1), max(x2, x3)), max(max(x4, x5), max(x6, x7)))
    least[u, t] = low
    c, r = codes[u], raised[u]
    for m, x in enumerate((x0, x1, x2, x3, x4, x5, x6, x7)):  # (unrolled: a tuple)
        step = size * min(x - low, cap)
        r[k + 2 * m] = c[k + 2 * m] + step
        r[k + 2 * m + 1] = c[k + 2 * m + 1] + step
    return high - low


@njit(cache=True, nogil=True)
def fold_block_pairs(pairs, exponents, size, cap, least, raised_pairs, tops):
    """:func:`fold_group_codes` for rows of whole trees of 8 blocks of 2 positions
    (bfp-exact's trees of 16), each block's two uint16 codes read as one uint32 of ``pairs``
    (U, blocks) (the codes viewed as uint32) and written likewise to ``raised_pairs``: adding
    step * (2^16 + 1) adds the block's step to both codes, and no carry crosses between
    them as every raised code is below 2^16 (the caller's uint16 raised codes), whichever
    half holds the first code. least, tops and the raised codes are
    :func:`fold_group_codes`'. Each pass is one loop over the whole batch (they vectorise;
    a row's loops of a few blocks do not): the trees' least and largest exponents by three
    halvings (pairs of blocks, of pairs, of fours: a tree's 8 blocks are consecutive), each
    tree's least written out to its blocks, then the blocks' steps. ``exponents`` is
    C-contiguous."""
    units, blocks = exponents.shape
    trees = least.shape[1]
    flat = exponents.reshape(units * blocks)
    halves = units * blocks // 2
    low2, high2 = np.empty(halves, dtype=np.int32), np.empty(halves, dtype=np.int32)
    for j in range(halves):
        x, y = flat[2 * j], flat[2 * j + 1]
        low2[j], high2[j] = min(x, y), max(x, y)
    quarters = halves // 2
    low4, high4 = np.empty(quarters, dtype=np.int32), np.empty(quarters, dtype=np.int32)
    for j in range(quarters):
        low4[j] = min(low2[2 * j], low2[2 * j + 1])
        high4[j] = max(high2[2 * j], high2[2 * j + 1])
    flat_least = least.reshape(units * trees)
    spans = np.empty(units * trees, dtype=np.int32)
    for t in range(units * trees):
        low = min(low4[2 * t], low4[2 * t + 1])
        flat_least[t] = low
        spans[t] = max(high4[2 * t], high4[2 * t + 1]) - low
    for u in range(units):
        top = np.int32(0)
        for t in range(trees):
            top = max(top, spans[u * trees + t])
        tops[u] = top
    lows = np.empty(units * blocks, dtype=np.int32)
    for t in range(units * trees):
        for m in range(8):
            lows[8 * t + m] = flat_least[t]
    flat_pairs, flat_raised = pairs.reshape(pairs.size), raised_pairs.reshape(raised_pairs.size)
    for b in range(units * blocks):
        step = size * min(np.int64(flat[b]) - np.int64(lows[b]), cap)
        flat_raised[b] = flat_pairs[b] + np.uint32(step) * np.uint32(0x10001)


@njit(cache=True, nogil=True)
def fold_group_codes(codes, exponents, per, block, size, cap, least, raised, tops):
    """Fold each tree of ``per`` scale blocks of ``block`` positions onto one scale, for
    :func:`exact_groups`, rows (codes (U, K), their scale exponents (U, blocks)) one after
    another: least[u, t] = the least exponent of tree t's blocks (``SCALE_NAN`` only where
    all of them are NaN: it lies above every exponent), raised[u, k] = codes[u, k] + size *
    min(r, cap) with r the rise of the exponent of position k's block above its tree's
    least, so that a table of the element values times 2^r, r = 0, 1, ..., cap, ``size``
    entries each, decodes the raised codes; tops[u] = the largest rise of the row (a NaN
    scale beside a number rises by about ``SCALE_NAN``). The last tree may hold fewer than
    ``per`` blocks, the last block fewer than ``block`` positions."""
    units, length = codes.shape
    blocks = exponents.shape[1]
    trees = least.shape[1]
    # trees of whole blocks unrolled where their shape is bfp-exact's, the rest in loops
    unrolled = min(trees, length // (per * block)) if per == 8 and block == 2 else 0
    for u in range(units):
        top = np.int64(0)
        for t in range(unrolled):
            top = max(top, _fold_8x2(codes, exponents, u, t, size, cap, least, raised))
        for t in range(unrolled, trees):
            first, count = t * per, min(per, blocks - t * per)
            low = np.int64(exponents[u, first])
            for m in range(1, count):
                low = min(low, np.int64(exponents[u, first + m]))
            least[u, t] = low
            for m in range(count):
                rise = np.int64(exponents[u, first + m]) - low
                top = max(top, rise)
                k0 = (first + m) * block
                for k in range(k0, min(k0 + block, length)):
                    raised[u, k] = codes[u, k] + size * min(rise, cap)
        tops[u] = top
