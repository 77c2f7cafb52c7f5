"""Numba kernels of the small-groups route (``datapath.batch``): many small GEMMs
(attention heads) through an exact-tree unit of the BLAS route, the whole batch at once.

The route decodes the batch's operands (:func:`decode_padded`), forms each tree's sums of
every group with one batched float64 matmul, and adds them to every output's accumulator
(:func:`start_trees`, :func:`add_tree` per tree, :func:`finish_trees`): exactly what
``datapath.blas`` computes per GEMM (its module docstring says why the float64 sums are
exact in any order), with a few kernel calls per batch instead of passes, tiles and checks
per group.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..quantize._kernels import SCALE_NAN
from .blas import _grid_sum, odd_sum, round_fp32, round_to_odd, two_sum

#: ``add_tree`` accumulation modes.
ROUND_EACH_TREE = 0  # RNE_fp32(acc + S) per tree
GRID = 1  # the fixed-point grid's rules per tree
EXACT_ACCUMULATOR = 2  # every tree's S added exactly (two float64s), one final RNE_fp32


@njit(cache=True, nogil=True)
def decode_padded(table, codes, out):
    """out[g, i, k] = table[codes[g, i, k]] for the (G, rows, K) codes (any unsigned dtype),
    zeros in the rest of out's last axis (its padding to whole trees)."""
    groups, rows, length = codes.shape
    for g in range(groups):
        for i in range(rows):
            values, row = out[g, i], codes[g, i]
            for k in range(length):
                values[k] = table[row[k]]
            for k in range(length, values.shape[0]):
                values[k] = 0.0


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
    fp32; a zero S counts as +0, as in ``blas.accumulate_rne_fp32``); ``GRID``:
    ``blas.accumulate_grid_fp32``'s step (``grid``: fraction bits n, max left and right
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
                keep, odd, zero = _grid_sum(
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
