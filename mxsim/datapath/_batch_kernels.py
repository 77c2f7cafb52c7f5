"""Numba kernels of the small-groups routes (``datapath.batch``): many small GEMMs
(attention heads) in a few calls per batch instead of passes, tiles and checks per group.

Exact-tree units of the BLAS route: the route decodes the batch's operands
(``_blas_kernels.decode_codes``), forms each tree's sums of every group with one batched float64
matmul, and adds them to every output's accumulator (:func:`start_trees`, :func:`add_tree`
per tree, :func:`finish_trees`): exactly what ``datapath.blas`` computes per GEMM (its module
docstring says why the float64 sums are exact in any order).

Truncating-window units (:func:`window_groups`): each group's outputs are the SIMD lanes of
one pass of the window kernels' stages (``_window_kernels.lane_trees``).
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


@njit(cache=True, nogil=True)
def window_groups(
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
    flags_out,
    start,
    stop,
):
    """Groups ``start`` to ``stop`` of a batch through a truncating-window unit
    (``datapath.window``), each group's M * N outputs the lanes of one pass: the output codes
    into ``out`` (G, M * N), 1 into ``flags_out`` (G, M * N) where the generic kernel must
    recompute. ``codes_a`` (G, M, K), ``codes_b`` (G, N, K), their scales (G, rows, blocks),
    ``c_values`` (G, M * N) or (1, 1), the per-code tables and ``cfg`` as
    ``_window_kernels.window_items`` takes them, ``bad_rows`` (G, M) and ``bad_columns``
    (G, N) from ``_window_kernels.unusable_rows``.

    Lane i * N + j pairs row i of A[g] with row j of B[g] (given as (N, K)): the group's
    elements are decoded once and repeated into (K, M * N) tiles, then the window stages run
    over the group's lanes at once as for row-wise dot products
    (``_window_kernels.lane_trees``)."""
    groups, rows, length = codes_a.shape
    columns = codes_b.shape[1]
    lanes = rows * columns
    fused_terms, block_size = cfg[W.W_FUSED_TERMS], cfg[W.W_BLOCK_SIZE]
    scaled = cfg[W.W_SCALED] != 0
    one_c = c_values.shape[0] == 1
    # Scratch once per call, not per group.
    row_values = np.empty((rows, length), dtype=np.float32)
    row_exponents = np.empty((rows, length), dtype=np.int8)
    column_values = np.empty((length, columns), dtype=np.float32)
    column_exponents = np.empty((length, columns), dtype=np.int8)
    values_a = np.empty((length, lanes), dtype=np.float32)
    values_b = np.empty((length, lanes), dtype=np.float32)
    exponents_a = np.empty((length, lanes), dtype=np.int8)
    exponents_b = np.empty((length, lanes), dtype=np.int8)
    shifts = np.zeros(((length + fused_terms - 1) // fused_terms, lanes), dtype=np.int32)
    lane_flags = np.empty(lanes, dtype=np.uint8)
    acc = np.empty(lanes)
    scratch = W._lane_scratch(lanes)
    for g in range(start, stop):
        for i in range(rows):
            row = codes_a[g, i]
            for k in range(length):
                row_values[i, k] = a_values[row[k]]
                row_exponents[i, k] = a_exponents[row[k]]
        for j in range(columns):
            row = codes_b[g, j]
            for k in range(length):
                column_values[k, j] = b_values[row[k]]
                column_exponents[k, j] = b_exponents[row[k]]
        for k in range(length):
            tile_values_a, tile_values_b = values_a[k], values_b[k]
            tile_exponents_a, tile_exponents_b = exponents_a[k], exponents_b[k]
            source_values, source_exponents = column_values[k], column_exponents[k]
            for i in range(rows):
                value, exponent = row_values[i, k], row_exponents[i, k]
                first = i * columns
                for j in range(columns):
                    tile_values_a[first + j] = value
                    tile_exponents_a[first + j] = exponent
                    tile_values_b[first + j] = source_values[j]
                    tile_exponents_b[first + j] = source_exponents[j]
        for i in range(rows):
            for j in range(columns):
                lane_flags[i * columns + j] = bad_rows[g, i] | bad_columns[g, j]
        if scaled:
            for tree in range(shifts.shape[0]):
                block = tree * fused_terms // block_size
                for i in range(rows):
                    x = scales_a[g, i, block]
                    x = 0 if x == SCALE_NAN else x
                    for j in range(columns):
                        y = scales_b[g, j, block]
                        shifts[tree, i * columns + j] = x + (0 if y == SCALE_NAN else y)
        W.start_accumulators(c_values[0 if one_c else g], 0, acc, lane_flags, cfg)
        W.lane_trees(
            values_a, exponents_a, values_b, exponents_b, shifts, acc, lane_flags, scratch, cfg
        )
        W.encode_outputs(acc, lane_flags, out[g], cfg)
        for lane in range(lanes):  # a loop: a slice assignment compiles shape-error formatting
            flags_out[g, lane] = lane_flags[lane]
