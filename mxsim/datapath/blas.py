"""A float64-BLAS route for exact-tree units, bit-identical to the datapath kernel where it applies.

It applies to units whose trees are exact (no alignment window, no n-bit sum, exact
products, k order) and whose accumulator is fp32 with round-to-nearest-even, gradual
underflow and c as its first value, with an fp32 output — the OCP ideal (ocp-exact) and
MXDOTP. Each key of ``datapath.schema.SCHEMA`` declares which of its values the route accepts
(``blas=``); a key that declares nothing refuses the route. Then each tree adds ``S = sum of F products`` exactly to the accumulator and rounds
once: ``acc = RNE_fp32(acc + S)``.

Why float64 BLAS computes S exactly: every element is a·2^Xa with a from a table of at most
8-bit significands, and a tree lies inside one block, so its products share one scale
2^(Xa+Xb) and are integer multiples of u = 2^(lsb_a + lsb_b + Xa + Xb) (lsb: the exponent of
the format's smallest subnormal step) below 2^(E+2), E = ea + eb with ea, eb the leading-bit
exponents of the largest magnitudes in the element tables (read from the tables: MX INT8's
-2.0 lies one binade above 127/64, its ``emax``). Every
partial sum of F such products, in any order, is a multiple of u below F·2^(E+2), which needs
at most (E + 2 - lsb_a - lsb_b) + ceil(log2 F) bits: when that is <= 53 every partial sum is a
float64 and no BLAS summation order can round. (fp8_e4m3 x fp8_e4m3, F = 32: 36 + 5 = 41 bits;
fp8_e5m2 x fp8_e5m2 needs 64 + 5 and goes to the kernel.) Scaling the elements by 2^X is exact
(``ldexp``; the results stay normal float64s). The route is refused when the thread's
floating point flushes subnormals (``subnormals_work``).

The accumulation then rounds acc + S once to fp32: the float64 sum is made round-to-odd
(TwoSum gives the exact error; an inexact sum with an even last bit moves one ulp toward the
exact value), and round-to-odd at 53 bits followed by float64 -> float32 nearest-even
rounding is the correctly rounded fp32 sum, subnormals and overflow included (53 >= 24 + 2).
NaN/Inf elements, NaN scales, non-finite or -0 accumulator inputs go to the kernel.

An exact (Kulisch) accumulator with one final RNE into fp32 takes the same block sums (one
BLAS call per scale block) and adds them to c exactly in two float64s (TwoSum, and TwoSum
again on the low part to prove it did not round); the final fp32 rounding is the same
round-to-odd step. Outputs whose exact sum needs more than two float64s (block sums more
than ~2^100 apart that do not cancel) are flagged and recomputed by the kernel.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit

from ..formats import get_format
from ..quantize._kernels import SCALE_NAN
from .schema import DatapathParams, route_accepts
from .tables import FULL_TABLE_BITS

ROW_TILE = 512  # rows of A per pass (of all groups in it); fewer for wide outputs (scratch ~8 MiB per array)


@functools.lru_cache(maxsize=None)
def _span_bits(fmt) -> tuple[int, int]:
    """(exponent of the largest magnitude's leading bit, exponent of the smallest step).

    The largest magnitude is read from the decoded code table, not from ``emax``: MX INT8's
    code 0x80 is -2.0, one binade above its largest positive value 127/64. A format too wide
    for a table (fp32) is sign-magnitude floating point: its largest is ``max_finite``."""
    if fmt.field_bits > FULL_TABLE_BITS:
        largest = float(fmt.max_finite)
    else:
        values = np.abs(fmt.decode_fields(np.arange(1 << fmt.field_bits)))
        largest = float(np.max(values[np.isfinite(values)]))
    return math.frexp(largest)[1] - 1, 1 - fmt.bias - fmt.mantissa_bits


def subnormals_work() -> bool:
    """Whether this thread's floating point keeps subnormals (no flush-to-zero or
    denormals-are-zero mode, as a library built with -ffast-math may set). The route's final
    float64 -> float32 rounding must produce fp32 subnormals, so it is refused otherwise."""
    tiny = np.float64(1e-40)  # an fp32 subnormal
    produced = np.float32(tiny)  # FTZ flushes the conversion's subnormal result
    consumed = produced * np.float32(1.0)  # DAZ reads a subnormal operand as zero
    return bool(produced != 0.0 and consumed != 0.0)


def slice_width(params: DatapathParams) -> int:
    """Products per BLAS call: one tree, or for an exact accumulator one scale block."""
    if params.accumulator_format == "exact":
        return params.block_size if params.scales != "none" else params.fused_terms
    return params.fused_terms


def exact_in_float64(params: DatapathParams) -> bool:
    """Whether every tree sum of this unit's formats is exact in float64 (module docstring)."""
    if max(get_format(params.a_format).field_bits, get_format(params.b_format).field_bits) > FULL_TABLE_BITS:
        return False  # no table of every code to read the span from; fp32 alone spans 277 bits
    high_a, low_a = _span_bits(get_format(params.a_format))
    high_b, low_b = _span_bits(get_format(params.b_format))
    return (high_a + high_b + 2 - low_a - low_b) + math.ceil(math.log2(slice_width(params))) <= 53


def blas_applies(params: DatapathParams, kernel_args, codes_a, codes_b, scales_a, scales_b, c_values) -> bool:
    """Whether this GEMM may take the BLAS route: every key's value is one the route computes
    exactly (each key's ``blas`` declaration in ``datapath.schema``), the formats' tree sums
    fit float64, and the data holds no special value the route leaves to the kernel."""
    unit_ok = route_accepts("blas", params) and exact_in_float64(params)
    if not unit_ok or not subnormals_work():
        return False
    a_values, b_values = kernel_args[0], kernel_args[2]
    if not (codes_all_finite(codes_a, np.isfinite(a_values)) and codes_all_finite(codes_b, np.isfinite(b_values))):
        return False
    if (scales_a == SCALE_NAN).any() or (scales_b == SCALE_NAN).any():
        return False
    return values_finite_and_not_negative_zero(c_values)


@njit(cache=True)
def codes_all_finite(codes, finite_table):
    """Whether every code's table value is finite (no M x K temporary)."""
    for code in codes.ravel():
        if not finite_table[code]:
            return False
    return True


@njit(cache=True)
def values_finite_and_not_negative_zero(values):
    """Whether every accumulator input is finite and none is -0 (those go to the kernel)."""
    for value in values.ravel():
        if not math.isfinite(value) or (value == 0.0 and math.copysign(1.0, value) < 0):
            return False
    return True


@njit(cache=True, inline="always")
def two_sum(a, b):
    """(a + b rounded, its exact rounding error): a + b == total + error exactly (finite sums)."""
    total = a + b
    back = total - a
    return total, (a - (total - back)) + (b - back)


@njit(cache=True, inline="always")
def round_to_odd(total, error):
    """The float64 round-to-odd of total + error (total = RN(exact), error its exact remainder)."""
    if error == 0.0 or not math.isfinite(total):
        return total
    bits = np.float64(total).view(np.int64)
    toward_zero = np.int64((error > 0.0) != (total > 0.0))
    return np.int64((bits - toward_zero) | 1).view(np.float64)


@njit(cache=True)  # serial: BLAS's own threads are still spinning right after each GEMM
def accumulate_rne_fp32(acc, tree_sums, sums, errors):
    """acc = RNE_fp32(acc + tree_sums) elementwise, exactly: the float64 sum made round-to-odd
    (TwoSum's exact error says which way the exact sum lies), then rounded to fp32.

    ``sums``/``errors`` are float64 scratch arrays of acc's shape. Written as simple loops
    over rows so that they vectorise.
    """
    rows, columns = acc.shape
    for i in range(rows):
        total_row = sums[i]
        error_row = errors[i]
        for j in range(columns):
            a = np.float64(acc[i, j])
            b = tree_sums[i, j]
            total = a + b
            back = total - a
            total_row[j] = total
            error_row[j] = (a - (total - back)) + (b - back)  # NaN when total is infinite: left alone
        bits = total_row.view(np.int64)
        for j in range(columns):
            error = error_row[j]
            inexact = np.int64(error != 0.0 and error == error)
            # Round to odd: step back toward zero when the exact sum lies below |total|, then set the last bit.
            toward_zero = inexact & np.int64((error > 0.0) != (total_row[j] > 0.0))
            bits[j] = (bits[j] - toward_zero) | inexact
        for j in range(columns):
            acc[i, j] = np.float32(total_row[j])


@njit(cache=True)
def accumulate_double_double(high, low, inexact, block_sums):
    """(high, low) += block_sums exactly as long as ``low`` never rounds; ``inexact`` marks
    the elements where it did (their exact sum needs more than two float64s)."""
    rows, columns = high.shape
    for i in range(rows):
        for j in range(columns):
            total, error = two_sum(high[i, j], block_sums[i, j])
            high[i, j] = total
            rest, low_error = two_sum(low[i, j], error)
            low[i, j] = rest
            if low_error != 0.0:
                inexact[i, j] = True


@njit(cache=True)
def round_double_double_to_fp32(high, low, acc):
    """acc = RNE_fp32(high + low) exactly (round-to-odd float64 sum, then fp32)."""
    rows, columns = high.shape
    for i in range(rows):
        for j in range(columns):
            total, error = two_sum(high[i, j], low[i, j])
            acc[i, j] = np.float32(round_to_odd(total, error))


def batch_passes(groups: int, rows: int, tile: int):
    """(first group, last group + 1, first row, last row + 1) of each pass over a batch of
    ``groups`` GEMMs of ``rows`` rows: whole groups together while they hold at most ``tile``
    rows, else one group ``tile`` rows at a time."""
    if rows <= tile:
        together = max(1, tile // max(rows, 1))
        for g in range(0, groups, together):
            yield g, min(g + together, groups), 0, rows
        return
    for g in range(groups):
        for start in range(0, rows, tile):
            yield g, g + 1, start, min(start + tile, rows)


def blas_matmul(params: DatapathParams, kernel_args, codes_a, codes_b, scales_a, scales_b, c_values, out,
                progress=None) -> list[tuple[int, int, int]]:
    """Fill ``out`` (G, M, N uint32 fp32 bits) with the unit's batch of GEMMs A[g] times B[g]
    given as (N, K) through float64 BLAS (see module doc); codes and scales are (G, rows, ...),
    ``c_values`` (G, M, N) or (1, 1, 1). Any order of the exact tree sums is exact, so a
    batch's outputs are those of its groups computed one by one.

    For an exact (Kulisch) accumulator the block sums are added exactly in two float64s;
    returns the (group, row, column) outputs whose sum needed more (the caller recomputes
    them with the kernel). Otherwise returns []. ``progress(rows_done, rows_total)`` counts
    rows of all groups.
    """
    a_values, b_values = kernel_args[0], kernel_args[2]
    groups, rows, length = codes_a.shape
    columns = codes_b.shape[1]
    width = slice_width(params)
    block = params.block_size
    kulisch = params.accumulator_format == "exact"
    leftovers = []
    # Rows of all groups as one (G * M, ...) array: a pass is a contiguous range of its rows.
    acc_all = out.view(np.float32).reshape(groups * rows, columns)
    flat_a = codes_a.reshape(groups * rows, length)
    flat_scales_a = scales_a.reshape(groups * rows, -1)
    flat_c = c_values.reshape(-1, columns) if c_values.shape != (1, 1, 1) else None
    tile = max(16, min(ROW_TILE, (1 << 20) // max(columns, 1)))  # scratch stays near 8 MiB per array
    passes = list(batch_passes(groups, rows, tile))
    capacity = max(((g1 - g0 - 1) * rows + r1 - r0 for g0, g1, r0, r1 in passes), default=0)
    tree_sums = np.empty((capacity, columns))
    sums = np.empty((capacity, columns))
    errors = np.empty((capacity, columns))
    for g0, g1, r0, r1 in passes:
        first, last = g0 * rows + r0, (g1 - 1) * rows + r1
        height, together = last - first, g1 - g0
        acc = acc_all[first:last]
        acc[...] = c_values.flat[0] if flat_c is None else flat_c[first:last]
        if kulisch:
            high = sums[:height]
            low = errors[:height]
            high[...] = acc
            low[...] = 0.0
            inexact = np.zeros((height, columns), dtype=np.bool_)
        for k in range(0, length, width):
            tree_a = a_values[flat_a[first:last, k : k + width]]
            tree_b = b_values[codes_b[g0:g1, :, k : k + width]]
            if params.scales != "none":  # exact power-of-two scaling (ldexp, not a rounded exp2)
                tree_a = np.ldexp(tree_a, flat_scales_a[first:last, k // block, None])
                tree_b = np.ldexp(tree_b, scales_b[g0:g1, :, k // block, None])
            products = tree_sums[:height]
            np.matmul(tree_a.reshape(together, r1 - r0, -1), tree_b.transpose(0, 2, 1),
                      out=products.reshape(together, r1 - r0, columns))
            if kulisch:
                accumulate_double_double(high, low, inexact, products)
            else:
                accumulate_rne_fp32(acc, products, sums[:height], errors[:height])
        if kulisch:
            round_double_double_to_fp32(high, low, acc)
            leftovers.extend(((first + int(i)) // rows, (first + int(i)) % rows, int(j)) for i, j in zip(*np.nonzero(inexact)))
        if progress is not None:
            progress(last, groups * rows)
    return leftovers
