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

A work item is a tile of at most ``LANES`` columns of one group's output in a chunk of rows:
B is read transposed, (K, N), so that a step of every column of the tile is one pass over
contiguous lanes, and four rows of A run together so that each load of B serves four
chains.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

LANES = 512  # columns a work item
ROWS = 4  # rows of A a pass over the tile
# Rows whose accumulators (ROW_BLOCK x LANES, 128 KiB in fp64) stay in L2 while a block of
# K_BLOCK steps of the tile's columns (256 KiB) serves them all: B is read from memory once
# per ROW_BLOCK rows, not once per pass.
ROW_BLOCK = 32
K_BLOCK = 64


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
    groups, then chunks of ``rows_per_chunk`` rows, then column tiles of ``LANES``; within
    an item, blocks of ``ROW_BLOCK`` rows run K in blocks of ``K_BLOCK`` steps (each output's
    steps stay in k order)."""
    n_groups, n_rows, length = values_a.shape
    n_columns = columns_b.shape[2]
    n_tiles = (n_columns + LANES - 1) // LANES
    n_chunks = (n_rows + rows_per_chunk - 1) // rows_per_chunk
    one_c = c_values.shape[0] == 1 and c_values.shape[1] == 1 and c_values.shape[2] == 1
    # ROWS spare accumulators past the block's: the copies a short last pass runs.
    acc = np.zeros((ROW_BLOCK + ROWS, LANES), dtype=out.dtype)
    rows = np.empty(ROWS, dtype=np.int64)
    slots = np.empty(ROWS, dtype=np.int64)
    for item in range(start, stop):
        g, rest = item // (n_chunks * n_tiles), item % (n_chunks * n_tiles)
        chunk, tile = rest // n_tiles, rest % n_tiles
        column0 = tile * LANES
        lanes = min(LANES, n_columns - column0)
        last = min((chunk + 1) * rows_per_chunk, n_rows)
        for block0 in range(chunk * rows_per_chunk, last, ROW_BLOCK):
            block_last = min(block0 + ROW_BLOCK, last)
            for row in range(block0, block_last):
                for lane in range(lanes):
                    acc[row - block0, lane] = (
                        c_values[0, 0, 0] if one_c else c_values[g, row, column0 + lane]
                    )
            for k0 in range(0, length, K_BLOCK):
                k1 = min(k0 + K_BLOCK, length)
                for first in range(block0, block_last, ROWS):
                    for r in range(ROWS):
                        inside = first + r < block_last
                        rows[r] = first + r if inside else block_last - 1
                        slots[r] = first + r - block0 if inside else ROW_BLOCK + r
                    chain_rows(values_a[g], rows, columns_b[g], column0, lanes, acc, slots, k0, k1)
            for row in range(block0, block_last):
                for lane in range(lanes):
                    out[g, row, column0 + lane] = acc[row - block0, lane]


@njit(cache=True, inline="always")
def chain_rows(values_a, rows, columns, column0, lanes, acc, slots, k0, k1):
    """acc[slots[r], lane] = fma(values_a[rows[r], k], columns[k, column0 + lane],
    acc[slots[r], lane]) for k = k0 to k1 - 1 in order: four rows' FMA chains against a tile
    of columns (four distinct slots)."""
    first, second = acc[slots[0], :lanes], acc[slots[1], :lanes]
    third, fourth = acc[slots[2], :lanes], acc[slots[3], :lanes]
    row0, row1, row2, row3 = (
        values_a[rows[0]],
        values_a[rows[1]],
        values_a[rows[2]],
        values_a[rows[3]],
    )
    for k in range(k0, k1):
        x0, x1, x2, x3 = row0[k], row1[k], row2[k], row3[k]
        column = columns[k, column0 : column0 + lanes]
        for lane in range(lanes):
            y = column[lane]
            first[lane] = fused_multiply_add(x0, y, first[lane])
            second[lane] = fused_multiply_add(x1, y, second[lane])
            third[lane] = fused_multiply_add(x2, y, third[lane])
            fourth[lane] = fused_multiply_add(x3, y, fourth[lane])


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
