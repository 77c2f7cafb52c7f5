"""Numba kernel of the group-sum route (``datapath.groups``): exact group sums, given by a
BLAS GEMM per group, aligned, truncated and accumulated, the columns of a row as SIMD lanes.

``datapath.groups`` states the exactness argument and decides which units take the route;
the accumulator, the n-bit tree sum and the output encoding are the window kernels' stages
(``_window_kernels``: :func:`start_accumulators`, :func:`finish_tree`, :func:`encode_outputs`),
which also flag what this route leaves to the generic kernel.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..formats._kernels import power_of_two
from ._window_kernels import (
    NO_REFERENCE,
    W_ACC_IN_TREE,
    W_WINDOW_BITS,
    W_ZERO_FLOOR,
    _exponent,
    encode_outputs,
    finish_tree,
    start_accumulators,
)
from .schema import NO_ZERO_TERM_EXPONENT


@njit(cache=True)
def _group_row(
    row,
    group_sums,
    c_values,
    scale_a_values,
    scale_a_exponents,
    mask_a,
    scale_b_values,
    scale_b_exponents,
    mask_b,
    bad_rows,
    bad_columns,
    groups_per_tree,
    cfg,
    out,
    flags,
):
    """Output row ``row``, its columns the lanes: per tree each lane's reference R, its
    truncated group terms summed, then the window kernels' :func:`finish_tree`."""
    n_groups, _, lanes = group_sums.shape
    window = cfg[W_WINDOW_BITS]
    in_tree = cfg[W_ACC_IN_TREE] != 0
    floor = cfg[W_ZERO_FLOOR]
    zero_reference = floor if floor != NO_ZERO_TERM_EXPONENT else NO_REFERENCE  # R of a zero term
    acc = np.empty(lanes)
    lane_flags = np.empty(lanes, dtype=np.uint8)
    for lane in range(lanes):
        lane_flags[lane] = bad_rows[row] | bad_columns[lane]
    start_accumulators(c_values[row % c_values.shape[0]], 0, acc, lane_flags, cfg)
    references = np.empty(lanes, dtype=np.int64)
    largest = np.empty(lanes, dtype=np.int32)  # the largest group term exponent (8 lanes a vector)
    factors = np.empty(lanes)
    sums = np.empty(lanes)  # the tree's integer sum, exact in float64 (finish_tree)
    for first in range(0, n_groups, groups_per_tree):
        last = min(first + groups_per_tree, n_groups)
        largest[:] = -(1 << 30) if in_tree else NO_REFERENCE  # in the tree: the accumulator's below
        for g in range(first, last):
            # A zero term (every product 0: no element position nonzero in both masks, or a
            # zero scale, whose group's mask is 0) sits at the zero-term exponent; any other
            # group, cancelling ones included, at its scales' exponent sum.
            row_mask = mask_a[row, g]
            exponent_a = scale_a_exponents[row, g]
            exponents_b = scale_b_exponents[g]
            masks_b = mask_b[g]
            for lane in range(lanes):
                exponent = np.int32(
                    exponent_a + exponents_b[lane]
                    if (row_mask & masks_b[lane]) != 0
                    else zero_reference
                )
                largest[lane] = max(largest[lane], exponent)
        for lane in range(lanes):
            reference = np.int64(largest[lane])
            if in_tree:  # a zero accumulator in the tree is a zero term
                reference = max(
                    reference, _exponent(acc[lane]) if acc[lane] != 0.0 else zero_reference
                )
            references[lane] = reference
        for lane in range(lanes):
            factors[lane] = power_of_two(window - references[lane])
            sums[lane] = 0.0
        for g in range(first, last):
            row_sums = group_sums[g, row]
            scale_a = scale_a_values[row, g]
            scales_b = scale_b_values[g]
            for lane in range(lanes):
                # Exact up to the truncation toward zero (groups.py); the sum of truncated terms
                # is an integer below 2^53, exact in float64.
                sums[lane] += np.trunc(
                    np.float64(row_sums[lane]) * scale_a * scales_b[lane] * factors[lane]
                )
        finish_tree(sums, references, acc, lane_flags, cfg)
    encode_outputs(acc, lane_flags, out[row], cfg)
    for lane in range(lanes):
        flags[row, lane] = lane_flags[lane]


@njit(cache=True, nogil=True)
def group_rows(
    group_sums,
    c_values,
    scale_a_values,
    scale_a_exponents,
    mask_a,
    scale_b_values,
    scale_b_exponents,
    mask_b,
    bad_rows,
    bad_columns,
    groups_per_tree,
    cfg,
    out,
    flags,
):
    """The R rows of a tile of the GEMM from ``group_sums`` (G, R, N): the exact sum of each
    group g of products of the tile's rows of A with the columns of B.

    ``scale_*_values`` the group's scale value (0 for NaN), ``scale_*_exponents`` its
    alignment exponent (int32), ``mask_*`` (uint32) bit i set where the group's i-th element is
    nonzero (and finite) and its scale is nonzero, A's as (R, G), B's as (G, N);
    ``bad_rows``/``bad_columns``: NaN/Inf elements or NaN scales. ``c_values`` (R, N) or
    (1, 1). out[r, n] gets the output code, flags[r, n] = 1 where the generic kernel must
    compute it. Serial and without the GIL: the caller runs row tiles on its own threads,
    each with its GEMMs."""
    for row in range(group_sums.shape[1]):
        _group_row(
            row,
            group_sums,
            c_values,
            scale_a_values,
            scale_a_exponents,
            mask_a,
            scale_b_values,
            scale_b_exponents,
            mask_b,
            bad_rows,
            bad_columns,
            groups_per_tree,
            cfg,
            out,
            flags,
        )


@njit(cache=True, nogil=True)
def group_batch(
    group_sums,
    c_values,
    scale_a_values,
    scale_a_exponents,
    mask_a,
    scale_b_values,
    scale_b_exponents,
    mask_b,
    bad_rows,
    bad_columns,
    groups_per_tree,
    cfg,
    out,
    flags,
    start,
    stop,
):
    """:func:`group_rows` of items ``start`` to ``stop`` of a batch: each argument of it with
    a leading batch axis, but ``c_values``, whose first axis has length 1 where one c (or
    one GEMM's) serves every item."""
    for item in range(start, stop):
        group_rows(
            group_sums[item],
            c_values[0] if c_values.shape[0] == 1 else c_values[item],
            scale_a_values[item],
            scale_a_exponents[item],
            mask_a[item],
            scale_b_values[item],
            scale_b_exponents[item],
            mask_b[item],
            bad_rows[item],
            bad_columns[item],
            groups_per_tree,
            cfg,
            out[item],
            flags[item],
        )
