"""Numba kernels for units whose adder sums each tree's products pairwise in IEEE binary32
(``adder.structure: pairwise_rounded`` with an fp32 accumulator; ``datapath.pairwise`` says
which units), vectorised across outputs: the accumulator starts at c; per tree of
``fused_terms`` products (fewer in K's last tree), each product a * b, the products added
pair by pair, ((p0 + p1) + (p2 + p3)), an odd last one carried up a level, and the tree's
sum added to the accumulator. Every add is one binary32 addition of the machine, rounded to
nearest even, so that zero signs, cancellation and overflow to ±Inf follow IEEE 754 as the
unit's adds do; the caller admits only operands whose products are exact, normal binary32
values (so that the unit's rounding of each product into fp32 changes nothing).

A unit that flushes subnormal results (``accumulator.subnormals: false``, or
``output.subnormals: false`` for the result alone) differs from the machine only where an
add's result is subnormal: with gradual underflow a
sum of two binary32 values below 2^-126 in magnitude is exact, so a result the unit flushes
is one the machine leaves nonzero and below 2^-126. Such lanes are flagged, as are lanes
whose result is not finite; the caller recomputes flagged outputs with the generic kernel.

A work item is a tile of at most ``LANES`` columns of one group's output in a chunk of rows:
B is read transposed, (K, N), so that a product of every column of the tile is one pass over
contiguous lanes, and two rows of A run together so that each load of B serves both. Blocks
of ``ROW_BLOCK`` rows run K a block of trees at a time, so that the tile's slice of B stays
in cache while it serves every row of the block.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._compile import NO_REFCOUNTS

LANES = 512  # columns a work item
ROW_BLOCK = 32  # rows whose accumulators a block of trees serves
TREE_BLOCK_TERMS = 64  # products a block of trees spans (rounded up to whole trees)
SMALLEST_NORMAL = np.float32(2.0**-126)


@njit(cache=True, inline="always")
def _subnormal(value):
    """Whether a binary32 value is nonzero and below the smallest normal in magnitude."""
    return (value != np.float32(0.0)) & (abs(value) < SMALLEST_NORMAL)


@njit(cache=True, **NO_REFCOUNTS)
def _two_rows_four(x, w, columns, column0, k, acc0, acc1, bad0, bad1, flush):
    """One tree of four products for two rows of A: ``x`` and ``w`` their four values from
    position ``k``; B's values those of ``columns`` (K, N) from column ``column0`` on, one a
    lane (row slices of a C-contiguous array: Numba knows them contiguous, and vectorises)."""
    x0, x1, x2, x3 = x[k], x[k + 1], x[k + 2], x[k + 3]
    w0, w1, w2, w3 = w[k], w[k + 1], w[k + 2], w[k + 3]
    end = column0 + acc0.shape[0]
    b0, b1 = columns[k, column0:end], columns[k + 1, column0:end]
    b2, b3 = columns[k + 2, column0:end], columns[k + 3, column0:end]
    for lane in range(acc0.shape[0]):
        y0, y1, y2, y3 = b0[lane], b1[lane], b2[lane], b3[lane]
        left, right = x0 * y0 + x1 * y1, x2 * y2 + x3 * y3
        tree = left + right
        total = acc0[lane] + tree
        acc0[lane] = total
        if flush:
            bad0[lane] |= _subnormal(left) | _subnormal(right) | _subnormal(tree)
            bad0[lane] |= _subnormal(total)
        left, right = w0 * y0 + w1 * y1, w2 * y2 + w3 * y3
        tree = left + right
        total = acc1[lane] + tree
        acc1[lane] = total
        if flush:
            bad1[lane] |= _subnormal(left) | _subnormal(right) | _subnormal(tree)
            bad1[lane] |= _subnormal(total)


@njit(cache=True, **NO_REFCOUNTS)
def _two_rows_two(x, w, columns, column0, k, acc0, acc1, bad0, bad1, flush):
    """One tree of two products for two rows of A (as :func:`_two_rows_four`)."""
    x0, x1, w0, w1 = x[k], x[k + 1], w[k], w[k + 1]
    end = column0 + acc0.shape[0]
    b0, b1 = columns[k, column0:end], columns[k + 1, column0:end]
    for lane in range(acc0.shape[0]):
        y0, y1 = b0[lane], b1[lane]
        tree = x0 * y0 + x1 * y1
        total = acc0[lane] + tree
        acc0[lane] = total
        if flush:
            bad0[lane] |= _subnormal(tree) | _subnormal(total)
        tree = w0 * y0 + w1 * y1
        total = acc1[lane] + tree
        acc1[lane] = total
        if flush:
            bad1[lane] |= _subnormal(tree) | _subnormal(total)


@njit(cache=True, **NO_REFCOUNTS)
def _one_row_any(x, columns, column0, start, stop, acc, bad, flush, terms):
    """One tree of the products from position ``start`` to ``stop`` (any count) for one row
    of A (B as in :func:`_two_rows_four`), summed level by level in ``terms`` (scratch of at
    least (stop - start, lanes))."""
    count = stop - start
    end = column0 + acc.shape[0]
    for j in range(count):
        value, column = x[start + j], columns[start + j, column0:end]
        row = terms[j]
        for lane in range(acc.shape[0]):
            row[lane] = value * column[lane]
    while count > 1:
        for j in range(count // 2):
            into, first, second = terms[j], terms[2 * j], terms[2 * j + 1]
            for lane in range(acc.shape[0]):
                total = first[lane] + second[lane]
                into[lane] = total
                if flush:
                    bad[lane] |= _subnormal(total)
        if count % 2:
            into, last = terms[count // 2], terms[count - 1]
            for lane in range(acc.shape[0]):
                into[lane] = last[lane]
        count = (count + 1) // 2
    if stop > start:
        tree = terms[0]
        for lane in range(acc.shape[0]):
            total = acc[lane] + tree[lane]
            acc[lane] = total
            if flush:
                bad[lane] |= _subnormal(total)


@njit(cache=True, nogil=True)
def pairwise_items(
    values_a,
    columns_b,
    c_values,
    fused_terms,
    flush,
    flush_output,
    out,
    bad,
    rows_per_chunk,
    start,
    stop,
):
    """Work items ``start`` to ``stop`` of the GEMMs out[g] = A[g] (M, K) times B[g] read as
    ``columns_b[g]`` (K, N), binary32 values, from the binary32 accumulator starts
    ``c_values`` ((G, M, N), or (1, 1, 1) for one c everywhere): ``out`` (G, M, N) float32,
    and ``bad`` (G, M, N) uint8 set where an add's result was subnormal (``flush``: the
    accumulator's adds flush them), the result is (``flush_output``: the output flushes
    them) or the result is not finite. Items run over groups, then chunks of ``rows_per_chunk`` rows, then
    column tiles of ``LANES``."""
    n_groups, n_rows, length = values_a.shape
    n_columns = columns_b.shape[2]
    n_tiles = (n_columns + LANES - 1) // LANES
    n_chunks = (n_rows + rows_per_chunk - 1) // rows_per_chunk
    one_c = c_values.shape[0] == 1 and c_values.shape[1] == 1 and c_values.shape[2] == 1
    span = fused_terms * max(1, TREE_BLOCK_TERMS // fused_terms)
    # one spare accumulator and flag row: a block's odd last row runs as its pair's second
    acc = np.zeros((ROW_BLOCK + 1, LANES), dtype=np.float32)
    flags = np.zeros((ROW_BLOCK + 1, LANES), dtype=np.uint8)
    terms = np.empty((fused_terms, LANES), dtype=np.float32)
    for item in range(start, stop):
        g, rest = item // (n_chunks * n_tiles), item % (n_chunks * n_tiles)
        chunk, tile_index = rest // n_tiles, rest % n_tiles
        column0 = tile_index * LANES
        lanes = min(LANES, n_columns - column0)
        columns = columns_b[g]
        last = min((chunk + 1) * rows_per_chunk, n_rows)
        for block0 in range(chunk * rows_per_chunk, last, ROW_BLOCK):
            rows = min(ROW_BLOCK, last - block0)
            for r in range(rows):
                for lane in range(lanes):
                    acc[r, lane] = (
                        c_values[0, 0, 0] if one_c else c_values[g, block0 + r, column0 + lane]
                    )
                    flags[r, lane] = 0
            for k0 in range(0, length, span):
                k1 = min(k0 + span, length)
                whole = k0 + (k1 - k0) // fused_terms * fused_terms  # past the whole trees
                for r in range(0, rows, 2):
                    s = r + 1 if r + 1 < rows else ROW_BLOCK  # the spare row
                    x = values_a[g, block0 + r]
                    w = values_a[g, block0 + min(r + 1, rows - 1)]
                    acc0, acc1 = acc[r, :lanes], acc[s, :lanes]
                    bad0, bad1 = flags[r, :lanes], flags[s, :lanes]
                    if fused_terms == 4:
                        for k in range(k0, whole, 4):
                            _two_rows_four(x, w, columns, column0, k, acc0, acc1, bad0, bad1, flush)
                    elif fused_terms == 2:
                        for k in range(k0, whole, 2):
                            _two_rows_two(x, w, columns, column0, k, acc0, acc1, bad0, bad1, flush)
                    else:
                        for k in range(k0, whole, fused_terms):
                            _one_row_any(
                                x, columns, column0, k, k + fused_terms, acc0, bad0, flush, terms
                            )
                            _one_row_any(
                                w, columns, column0, k, k + fused_terms, acc1, bad1, flush, terms
                            )
                    # K's last tree, short of fused_terms
                    _one_row_any(x, columns, column0, whole, k1, acc0, bad0, flush, terms)
                    _one_row_any(w, columns, column0, whole, k1, acc1, bad1, flush, terms)
            for r in range(rows):
                m = block0 + r
                for lane in range(lanes):
                    value = acc[r, lane]
                    out[g, m, column0 + lane] = value
                    flagged = flags[r, lane] | (not np.isfinite(value))
                    bad[g, m, column0 + lane] = flagged | (flush_output & _subnormal(value))
