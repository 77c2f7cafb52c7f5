"""Numba kernels for units that are a chain of IEEE fused multiply-adds, vectorised across
outputs (``datapath.fma`` says which units): d = c, then d = fma(a_k, b_k, d) for k in order,
each step a * b + d rounded once to nearest even in the accumulator's binary format, which
is also the operands', c's and the output's (fp64: the GPUs' DMMA and MFMA f64 paths; fp32:
the MFMA fp32 paths).

Each step is the machine's own fused multiply-add (LLVM's ``llvm.fma``: one FMA instruction,
or the C library's correctly rounded ``fma`` where the processor has none), on the
operands' bit patterns viewed as machine floats, so that subnormals, signed zeros, Inf and
overflow follow IEEE 754 exactly as the unit does, provided the thread keeps subnormals (the
caller checks: a flush-to-zero mode would change them). A NaN result's payload is the
machine's, not the unit's canonical one: the caller recomputes NaN outputs with the generic
kernel.

A work item is a tile of at most ``LANES`` columns of one group's output in a chunk of row
pairs: B is read transposed, (K, N), so that a step of every column of the tile is one pass
over contiguous lanes, and two rows of A run together so that each load of B serves both.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

LANES = 512  # columns a work item: two rows' accumulators (8 KiB in fp64) stay in L1


@intrinsic
def fused_multiply_add(typingctx, a, b, c):
    """a * b + c rounded once to nearest even in the operands' float type (IEEE 754
    fusedMultiplyAdd)."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, arguments):
        return builder.fma(*arguments)

    return a(a, b, c), codegen


@njit(cache=True, nogil=True)
def fma_items(values_a, columns_b, c_values, out, rows_per_chunk, start, stop):
    """Work items ``start`` to ``stop`` of the GEMMs out[g] = the FMA chain of A[g] (M, K)
    times B[g] read as ``columns_b[g]`` (K, N), from c (``c_values`` (G, M, N), or (1, 1, 1)
    for one c everywhere): ``out`` (G, M, N) in the operands' float type. Items run over
    groups, then chunks of ``rows_per_chunk`` rows (even), then column tiles of ``LANES``."""
    n_groups, n_rows, length = values_a.shape
    n_columns = columns_b.shape[2]
    n_tiles = (n_columns + LANES - 1) // LANES
    n_chunks = (n_rows + rows_per_chunk - 1) // rows_per_chunk
    one_c = c_values.shape[0] == 1 and c_values.shape[1] == 1 and c_values.shape[2] == 1
    dtype = out.dtype
    acc0 = np.empty(LANES, dtype=dtype)
    acc1 = np.empty(LANES, dtype=dtype)
    for item in range(start, stop):
        g, rest = item // (n_chunks * n_tiles), item % (n_chunks * n_tiles)
        chunk, tile = rest // n_tiles, rest % n_tiles
        column0 = tile * LANES
        lanes = min(LANES, n_columns - column0)
        first = acc0[:lanes]
        second = acc1[:lanes]
        for row in range(chunk * rows_per_chunk, min((chunk + 1) * rows_per_chunk, n_rows), 2):
            # An odd last row runs as its pair's second row too, its copy's results discarded.
            other = min(row + 1, n_rows - 1)
            if one_c:
                first[:] = c_values[0, 0, 0]
                second[:] = c_values[0, 0, 0]
            else:
                for lane in range(lanes):
                    first[lane] = c_values[g, row, column0 + lane]
                    second[lane] = c_values[g, other, column0 + lane]
            chain_pair(values_a[g, row], values_a[g, other], columns_b[g], column0, first, second)
            for lane in range(lanes):
                out[g, row, column0 + lane] = first[lane]
                out[g, other, column0 + lane] = second[lane]


@njit(cache=True, inline="always")
def chain_pair(row0, row1, columns, column0, first, second):
    """first[lane] = fma(row0[k], columns[k, column0 + lane], first[lane]) for k in order,
    and second alike for row1: two rows' FMA chains against a tile of columns."""
    for k in range(row0.shape[0]):
        x0, x1 = row0[k], row1[k]
        column = columns[k, column0 : column0 + first.shape[0]]
        for lane in range(first.shape[0]):
            y = column[lane]
            first[lane] = fused_multiply_add(x0, y, first[lane])
            second[lane] = fused_multiply_add(x1, y, second[lane])


@njit(cache=True, nogil=True)
def fma_rows(values_a, values_b, c_values, out, start, stop):
    """out[i] = the FMA chain of row i of A and B (given transposed, (K, n): the rows are
    lanes) from c_values[i], for rows ``start`` to ``stop``."""
    for i in range(start, stop):
        out[i] = c_values[i]
    for k in range(values_a.shape[0]):
        a, b = values_a[k], values_b[k]
        for i in range(start, stop):
            out[i] = fused_multiply_add(a[i], b[i], out[i])
