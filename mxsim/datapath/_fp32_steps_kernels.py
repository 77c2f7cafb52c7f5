"""Numba kernels for units each of whose steps is computed by binary32 or binary64
arithmetic of the machine and rounded into an fp32 accumulator (``datapath.fp32_steps``
says which units), vectorised across outputs; the accumulator starts at c, then per tree of
``fused_terms`` products (fewer in K's last tree):

- pairwise (``adder.structure: pairwise_rounded``): each product a * b, the products added
  pair by pair, ((p0 + p1) + (p2 + p3)), an odd last one carried up a level, and the tree's
  sum added to the accumulator. Every add is one binary32 addition of the machine, rounded
  to nearest even, so that zero signs, cancellation and overflow to ±Inf follow IEEE 754 as
  the unit's adds do; the caller admits only operands whose products are exact, normal
  binary32 values (so that the unit's rounding of each product into fp32 changes nothing).
  A unit that flushes subnormal results (``accumulator.subnormals: false``, or
  ``output.subnormals: false`` for the result alone) differs from the machine only where an
  add's result is subnormal: with gradual underflow a sum of two binary32 values below
  2^-126 in magnitude is exact, so a result the unit flushes is one the machine leaves
  nonzero and below 2^-126, and such lanes are flagged.
- exact (an exact tree, the accumulator in it): the tree's products and the accumulator
  summed exactly and rounded once to binary32, nearest even, an exact zero sum +0, in a
  unit whose accumulator keeps subnormals. The products of binary32 values are exact
  binary64 values; their sums are binary64 additions, each checked exact by its TwoSum
  error (a lane where one was not is flagged); the accumulator joins the tree's sum rounded
  to odd at 53 bits, whose conversion to binary32 (the machine's, with gradual underflow) is
  then the one rounding to nearest even (53 >= 24 + 2).

Lanes whose result is not finite are flagged too; the caller recomputes flagged outputs
with the generic kernel.

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
from ._blas_kernels import odd_sum

LANES = 512  # columns a work item
ROW_BLOCK = 32  # rows whose accumulators a block of trees serves
TREE_BLOCK_TERMS = 64  # products a block of trees spans (rounded up to whole trees)
SMALLEST_NORMAL = np.float32(2.0**-126)


@njit(cache=True, inline="always")
def _subnormal(value):
    """Whether a binary32 value is nonzero and below the smallest normal in magnitude."""
    return (value != np.float32(0.0)) & (abs(value) < SMALLEST_NORMAL)


@njit(cache=True, inline="always")
def _sum_error(first, second, total):
    """first + second - total exactly (Knuth's TwoSum), total their float64 sum: 0 when
    that sum was exact (NaN where a term is not finite)."""
    second_part = total - first
    return (first - (total - second_part)) + (second - second_part)


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
def _two_rows_four_exact(x, w, columns, column0, k, acc0, acc1, bad0, bad1):
    """One exact step of four products and the accumulator for two rows of A (arguments as
    :func:`_two_rows_four`)."""
    x0, x1 = np.float64(x[k]), np.float64(x[k + 1])
    x2, x3 = np.float64(x[k + 2]), np.float64(x[k + 3])
    w0, w1 = np.float64(w[k]), np.float64(w[k + 1])
    w2, w3 = np.float64(w[k + 2]), np.float64(w[k + 3])
    end = column0 + acc0.shape[0]
    b0, b1 = columns[k, column0:end], columns[k + 1, column0:end]
    b2, b3 = columns[k + 2, column0:end], columns[k + 3, column0:end]
    for lane in range(acc0.shape[0]):
        y0, y1 = np.float64(b0[lane]), np.float64(b1[lane])
        y2, y3 = np.float64(b2[lane]), np.float64(b3[lane])
        acc0[lane], inexact = _exact_step(x0 * y0, x1 * y1, x2 * y2, x3 * y3, acc0[lane])
        bad0[lane] |= inexact
        acc1[lane], inexact = _exact_step(w0 * y0, w1 * y1, w2 * y2, w3 * y3, acc1[lane])
        bad1[lane] |= inexact


@njit(cache=True, **NO_REFCOUNTS)
def _two_rows_two_exact(x, w, columns, column0, k, acc0, acc1, bad0, bad1):
    """One exact step of two products and the accumulator for two rows of A (arguments as
    :func:`_two_rows_four`; as :func:`_exact_step`)."""
    x0, x1, w0, w1 = np.float64(x[k]), np.float64(x[k + 1]), np.float64(w[k]), np.float64(w[k + 1])
    end = column0 + acc0.shape[0]
    b0, b1 = columns[k, column0:end], columns[k + 1, column0:end]
    for lane in range(acc0.shape[0]):
        y0, y1 = np.float64(b0[lane]), np.float64(b1[lane])
        p0, p1 = x0 * y0, x1 * y1
        tree = p0 + p1
        acc0[lane] = np.float32(odd_sum(np.float64(acc0[lane]), tree) + 0.0)
        bad0[lane] |= _sum_error(p0, p1, tree) != 0.0
        p0, p1 = w0 * y0, w1 * y1
        tree = p0 + p1
        acc1[lane] = np.float32(odd_sum(np.float64(acc1[lane]), tree) + 0.0)
        bad1[lane] |= _sum_error(p0, p1, tree) != 0.0


@njit(cache=True, inline="always")
def _exact_step(p0, p1, p2, p3, previous):
    """(previous + p0 + p1 + p2 + p3 rounded once to binary32, nearest even, an exact zero
    +0; whether the products' float64 sum was not exact): the products' sum is exact where
    its three TwoSum errors are 0; the accumulator joins it rounded to odd at 53 bits
    (TwoSum), which the conversion to binary32 then rounds correctly."""
    left, right = p0 + p1, p2 + p3
    tree = left + right
    error = abs(_sum_error(p0, p1, left)) + abs(_sum_error(p2, p3, right))
    error += abs(_sum_error(left, right, tree))
    return np.float32(odd_sum(np.float64(previous), tree) + 0.0), error != 0.0


@njit(cache=True, **NO_REFCOUNTS)
def _one_row_exact(x, columns, column0, start, stop, acc, bad, sums):
    """One exact step of the products from position ``start`` to ``stop`` (any count) and
    the accumulator for one row of A (B as in :func:`_two_rows_four`): the products summed
    in k order in ``sums`` (float64 scratch of at least the lanes), each sum checked exact,
    then joined by the accumulator as :func:`_exact_step` does."""
    if stop == start:
        return
    lanes = acc.shape[0]
    end = column0 + lanes
    for lane in range(lanes):
        sums[lane] = 0.0
    for k in range(start, stop):
        value, column = np.float64(x[k]), columns[k, column0:end]
        for lane in range(lanes):
            product = value * np.float64(column[lane])
            total = sums[lane] + product
            bad[lane] |= _sum_error(sums[lane], product, total) != 0.0
            sums[lane] = total
    for lane in range(lanes):
        acc[lane] = np.float32(odd_sum(np.float64(acc[lane]), sums[lane]) + 0.0)


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
def steps_items(
    values_a,
    columns_b,
    c_values,
    fused_terms,
    exact,
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
    ``c_values`` ((G, M, N), or (1, 1, 1) for one c everywhere), by exact steps (``exact``)
    or pairwise ones (module docstring): ``out`` (G, M, N) float32, and ``bad`` (G, M, N)
    uint8 set where a step was not exact (``exact``), a pairwise add's result was subnormal
    (``flush``: the accumulator flushes them), the result is (``flush_output``: the output
    flushes them) or the result is not finite. Items run over groups, then chunks of
    ``rows_per_chunk`` rows, then column tiles of ``LANES``."""
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
    sums = np.empty(LANES)
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
                    _row_pair_trees(
                        x,
                        w,
                        columns,
                        column0,
                        (k0, whole, k1),
                        fused_terms,
                        exact,
                        flush,
                        (acc0, acc1),
                        (bad0, bad1),
                        terms,
                        sums,
                    )
            for r in range(rows):
                m = block0 + r
                for lane in range(lanes):
                    value = acc[r, lane]
                    out[g, m, column0 + lane] = value
                    flagged = flags[r, lane] | (not np.isfinite(value))
                    bad[g, m, column0 + lane] = flagged | (flush_output & _subnormal(value))


@njit(cache=True, inline="always")
def _row_pair_trees(x, w, columns, column0, span, fused_terms, exact, flush, acc, bad, terms, sums):
    """Two rows' trees, exact steps or pairwise ones, over ``span`` (k0, whole, k1): the whole
    trees from k0 up to ``whole``, then K's last, short one up to k1 (none where ``whole`` is
    k1); ``acc`` and ``bad`` the two rows' accumulators and flags, ``terms`` and ``sums``
    the scratch of :func:`_one_row_any` and :func:`_one_row_exact`."""
    k0, whole, k1 = span
    acc0, acc1 = acc
    bad0, bad1 = bad
    if exact:
        if fused_terms == 4:
            for k in range(k0, whole, 4):
                _two_rows_four_exact(x, w, columns, column0, k, acc0, acc1, bad0, bad1)
        elif fused_terms == 2:
            for k in range(k0, whole, 2):
                _two_rows_two_exact(x, w, columns, column0, k, acc0, acc1, bad0, bad1)
        else:
            for k in range(k0, whole, fused_terms):
                _one_row_exact(x, columns, column0, k, k + fused_terms, acc0, bad0, sums)
                _one_row_exact(w, columns, column0, k, k + fused_terms, acc1, bad1, sums)
        _one_row_exact(x, columns, column0, whole, k1, acc0, bad0, sums)
        _one_row_exact(w, columns, column0, whole, k1, acc1, bad1, sums)
        return
    if fused_terms == 4:
        for k in range(k0, whole, 4):
            _two_rows_four(x, w, columns, column0, k, acc0, acc1, bad0, bad1, flush)
    elif fused_terms == 2:
        for k in range(k0, whole, 2):
            _two_rows_two(x, w, columns, column0, k, acc0, acc1, bad0, bad1, flush)
    else:
        for k in range(k0, whole, fused_terms):
            _one_row_any(x, columns, column0, k, k + fused_terms, acc0, bad0, flush, terms)
            _one_row_any(w, columns, column0, k, k + fused_terms, acc1, bad1, flush, terms)
    _one_row_any(x, columns, column0, whole, k1, acc0, bad0, flush, terms)
    _one_row_any(w, columns, column0, whole, k1, acc1, bad1, flush, terms)
