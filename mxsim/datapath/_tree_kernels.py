"""Fused kernel of the BLAS route (``blas.py``) for trees of 8 float64 products: each
tree's exact sum is formed in registers and rounded into the fp32 accumulator at once,
instead of one rank-8 GEMM per tree (which writes a whole float64 tile per 8 multiply-adds)
and a second pass over it."""

from __future__ import annotations

import numpy as np
from numba import njit

from .blas import odd_sum

#: Columns per pass: a tree's columns of B (packed, 8 x COLUMNS float64) stay in L1 while
#: every row of the tile takes the tree.
COLUMNS = 256


@njit(cache=True, nogil=True, fastmath={"contract"})
def rne_trees8(a, b, trees, row_steps, column_steps, acc, packed, fresh):
    """acc[g, i, j] = RNE_fp32(acc + S) for each tree in order: S = s 2^(Xa + Xb), s the
    tree's exact sum over k in [first, first + 8) of a[g, i, k] * b[g, j, k] (``trees``
    (T, 2): first, scale block), 2^Xa = row_steps[block, g, i], 2^Xb = column_steps[block,
    g, j]. ``a`` (g, rows, K) and ``b`` (g, columns, K) are float64 unscaled elements whose
    tree sums fit 53 bits (``tree_sum_bits``): every product and partial sum times 2^Xa is a
    float64 (the steps are E8M0 powers of two, the results normal float64s), so neither a
    fused multiply-add nor the product by 2^Xb can round. A zero sum counts as +0 (an exact
    sum has no sign; -0 + 0 is +0), as the datapath kernel and its twin have it.

    Per row and pass, t = acc + S is rounded to float64 and converted to fp32 (nearest
    even, IEEE overflow), into ``fresh``: the correctly rounded sum wherever t is exact,
    which holds iff t - acc == S and t - S == acc (one of the two differences is exact,
    Dekker's lemma, and differs when t is not). Where any of the row's pass is not exact (or
    the accumulator is infinite), the pass is redone from the accumulator through the
    round-to-odd sum (``odd_sum``), as ``accumulate_rne_fp32``. ``packed`` a (9, COLUMNS)
    float64 and ``fresh`` a (COLUMNS,) float32 scratch. Serial."""
    groups, rows, columns = acc.shape
    for g in range(groups):
        for j0 in range(0, columns, COLUMNS):
            width = min(COLUMNS, columns - j0)
            for t in range(trees.shape[0]):
                first, block = trees[t, 0], trees[t, 1]
                for j in range(width):  # the tree's B transposed, its column steps after it
                    for m in range(8):
                        packed[m, j] = b[g, j0 + j, first + m]
                    packed[8, j] = column_steps[block, g, j0 + j]
                for i in range(rows):
                    out = acc[g, i, j0 : j0 + width]
                    x = a[g, i, first : first + 8]
                    step = row_steps[block, g, i]
                    if _exact_pass(out, fresh, x, step, packed):
                        for j in range(width):
                            out[j] = fresh[j]
                    else:
                        _odd_pass(out, x, step, packed)


@njit(cache=True, inline="always", fastmath={"contract"})
def _exact_pass(out, fresh, x, step, packed) -> bool:
    """fresh = fp32(RN64(out + S)); whether every RN64 sum was exact."""
    width = out.shape[0]
    b0, b1, b2, b3 = packed[0, :width], packed[1, :width], packed[2, :width], packed[3, :width]
    b4, b5, b6, b7 = packed[4, :width], packed[5, :width], packed[6, :width], packed[7, :width]
    steps = packed[8, :width]
    x0, x1, x2, x3 = x[0] * step, x[1] * step, x[2] * step, x[3] * step
    x4, x5, x6, x7 = x[4] * step, x[5] * step, x[6] * step, x[7] * step
    inexact = False
    for j in range(width):
        s = ((x0 * b0[j] + x1 * b1[j]) + (x2 * b2[j] + x3 * b3[j])) + (
            (x4 * b4[j] + x5 * b5[j]) + (x6 * b6[j] + x7 * b7[j])
        )
        scaled = s * steps[j] + 0.0  # an exact zero sum is +0, whatever its products' signs
        old = np.float64(out[j])
        total = old + scaled
        fresh[j] = np.float32(total)
        inexact |= (total - old != scaled) | (total - scaled != old)
    return not inexact


@njit(cache=True, inline="always")
def _odd_pass(out, x, step, packed) -> None:
    """out = fp32(round-to-odd(out + S)): RNE_fp32(out + S) always."""
    for j in range(out.shape[0]):
        s = 0.0
        for m in range(8):
            s += (x[m] * step) * packed[m, j]
        out[j] = np.float32(odd_sum(np.float64(out[j]), s * packed[8, j] + 0.0))
