"""A float64 (float32 where exact) BLAS route for exact-tree units, bit-identical to the datapath kernel where it applies.

It applies to units whose trees are exact (no alignment window, no n-bit sum, exact
products, k order) and whose accumulator is fp32 with round-to-nearest-even, gradual
underflow and c as its first value, with an fp32 output — the OCP ideal (ocp-exact), MXDOTP
as its paper summarises it (mxdotp-paper) and exact BFP block sums (bfp-exact) — or exact
(kulisch), and to fixed-point-grid units (the cvfpu MXDOTP RTL: mxdotp and its rounding-mode
variants; below). The GPU units truncate below an alignment window: they refuse it.
Each key of ``datapath.schema.SCHEMA`` declares which of its values the route accepts
(``blas=``); a key that declares nothing refuses the route. Then each tree adds ``S = sum of F products`` exactly to the accumulator and rounds
once: ``acc = RNE_fp32(acc + S)``.

Why float64 BLAS computes S exactly: every element is a·2^Xa with a from a table of at most
8-bit significands, and a tree lies inside one block, so its products share one scale
2^(Xa+Xb): S = 2^(Xa+Xb) · s with s the sum of the unscaled products a·b, integer multiples
of u = 2^(lsb_a + lsb_b) (lsb: the exponent of the format's smallest subnormal step) below
2^(E+2), E = ea + eb with ea, eb the leading-bit exponents of the largest magnitudes in the
element tables (read from the tables: MX INT8's -2.0 lies one binade above 127/64, its
``emax``). Every partial sum of F such products, in any order, is a multiple of u below
F·2^(E+2), which needs at most (E + 2 - lsb_a - lsb_b) + ceil(log2 F) bits
(``tree_sum_bits``): when that is <= 53 every partial sum is a float64 and no BLAS summation
order can round; when it is <= 24 every partial sum is a float32, and the GEMMs run in float32
(twice as fast). (fp8_e4m3 x fp8_e4m3, F = 32: 36 + 5 = 41 bits, float64; fp4_e2m1: 8 + 5,
float32; fp8_e5m2 x fp8_e5m2 needs 64 + 5 and goes to the kernel.) Multiplying s by
2^(Xa+Xb) in float64 is exact: E8M0 exponents lie in [-127, 127], so the result lies between
2^(lsb_a + lsb_b - 254) and 2^(E + 7 + 254), normal float64s. The route is refused when the
thread's floating point flushes subnormals (``_threads.subnormals_work``): its final float64
-> float32 rounding must produce fp32 subnormals. A tree of several whole
blocks (bfp-exact: 16 products over sub-blocks of 2) is folded onto its least block scale:
each block's elements are multiplied by 2^(its exponent above that least), exactly, and its
sums need that many more bits (the largest rise in A plus that in B, read from the data;
refused beyond 53).
Blocks of zeros add nothing whatever their scale and are left out of the least, unless the
least of every block already keeps the sums within float32 (BFP's sub-blocks lie at most a
binade apart): then the codes need not be read, and the sums are the same. Where nothing is
kept of B between calls and float32 has room, the fold, every block counted, happens while
each pass decodes its operands (``_blas_kernels.decode_folded``: each tree's least, its step
and the raised values in one pass), each operand's rises held within half of float32's room
(``decode_fold_limits``); a rise beyond that voids the call, which is done again folded first.

The accumulation then rounds acc + S once to fp32: the float64 sum is made round-to-odd
(TwoSum gives the exact error; an inexact sum with an even last bit moves one ulp toward the
exact value), and round-to-odd at 53 bits followed by float64 -> float32 nearest-even
rounding is the correctly rounded fp32 sum, subnormals and overflow included (53 >= 24 + 2).
NaN/Inf elements, NaN scales, non-finite or -0 accumulator inputs go to the kernel.
Where the tree sums fit 24 bits and a block's scaled sums S all are float32s (their least
step 2^-149 or above, below 2^128: checked from the scale exponents over the whole batch at
once, else per tile and block), S itself is a float32 and the IEEE float32 sum acc + S is
RNE_fp32(acc + S): those blocks are added in float32 arithmetic, a few operations per output
instead of the round-to-odd step.

A fixed-point grid (``grid.fraction_bits`` n; one scale pair per tree, which the config
checks ensure) changes only the accumulation (``_blas_kernels.accumulate_grid_fp32``): per output and tree,
with X = Xa + Xb, the accumulator's LSB lies offset = (e - 23) - (X - n) places above the
grid's (e: its exponent, -126 when subnormal, -127 when zero); beyond the max left shift it
is kept, bits and sign; beyond the max right shift below with S = 0 likewise; else it
becomes acc + S rounded once in the unit's accumulator rounding, an exact zero +0. Every
mode but stochastic is computed from the round-to-odd float64 of acc + S (it lies strictly
between the same two fp32 neighbours as the exact sum, and on a tie only when the sum is
one): nearest-even by the conversion, the others by choosing between it and the neighbour
on the other side (``_blas_kernels.round_fp32``), IEEE overflow included. An overflow to ±Inf stays in the
accumulator, as the kernel's first overflow stays its result. Trees are cut per block as the
kernel cuts them (``grid_trees``: FP6's 11 + 11 + 10 with ``trees_in_blocks``), none past K.
Rounding to nearest even, the rules are idle above a floor of X (``grid_nearest_even_floor``):
blocks of a tile at or above it, as every earlier block, take the plain RNE_fp32(acc + S).

Trees of 8 float64 products rounded as RNE_fp32(acc + S) (mxdotp-paper with fp8_e4m3; mxdotp
with it, tiles above the floor) skip the rank-8 GEMMs: one fused kernel
(``_tree_kernels.rne_trees8``) forms each tree's sum in registers and rounds it at once (on
a tile of fewer columns than rows, transposed: the same exact products and sums).
In the other modes (mxdotp's rtz/rdn/rup/rmm variants) a grid's trees of 8 or 16 products
take fused kernels above a floor of X for every mode (``grid_floor``), where the rules
reduce to: acc kept when |acc| >= 2^(X + L - n + 24), else acc + S rounded once
(``_tree_kernels.grid_trees8`` and ``grid_trees16``; ``trees16_fp32``, in float32
arithmetic, for FP4's trees of 16 where the elements times their steps and the scaled sums
are float32s).

An exact (Kulisch) accumulator with one final RNE into fp32 takes sums of whole ranges of
blocks, in float64 with the scales folded into the elements (``ldexp``, exact; the results
stay normal float64s): products of blocks whose scale-exponent sums lie between m and h_t (t: the block)
are multiples of 2^(lsb_a + lsb_b + m) below sum_t F 2^(E + 2 + h_t), so one float64 GEMM
(or several, their results added in float64: partial sums too) sums a range exactly while
F 2^(E + 2 - lsb_a - lsb_b) sum_t 2^(h_t - m) <= 2^53 (``_exact_chunks``; for MXFP8 with
block scales a few binades apart, all of K is one range). The range sums are added to c
exactly in two float64s (TwoSum, and TwoSum
again on the low part to prove it did not round); the final fp32 rounding is the same
round-to-odd step. Outputs whose exact sum needs more than two float64s (range sums more
than ~2^100 apart that do not cancel) are flagged and recomputed by the kernel.
"""

from __future__ import annotations

import contextlib
import functools
import math

from concurrent.futures import wait

import numba
import numpy as np


from .._threads import in_kept_pool, kept_pool, run_in_threads, subnormals_work
from ..formats import get_format
from ..quantize._kernels import SCALE_NAN
from ._blas_kernels import (
    accumulate_double_double,
    accumulate_fp32,
    accumulate_grid_fp32,
    accumulate_rne_fp32,
    decode_codes,
    decode_folded,
    decode_raised,
    decode_scaled,
    fold_blocks,
    fold_code_blocks,
    holds_none_of,
    round_double_double_to_fp32,
    rows_all_finite,
    values_finite_and_not_negative_zero,
)
from .schema import DatapathParams, route_accepts
from .tables import FULL_TABLE_BITS


@functools.lru_cache(maxsize=None)
def span_bits(fmt) -> tuple[int, int]:
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


def slice_width(params: DatapathParams) -> int:
    """Products per BLAS call: one tree, or for an exact accumulator one scale block."""
    if params.accumulator_format == "exact":
        return params.block_size if params.scales != "none" else params.fused_terms
    return params.fused_terms


def tree_sum_bits(params: DatapathParams) -> int | None:
    """Bits that every tree sum of this unit's unscaled elements fits in (module docstring),
    or None for formats too wide for a table of every code."""
    if (
        max(get_format(params.a_format).field_bits, get_format(params.b_format).field_bits)
        > FULL_TABLE_BITS
    ):
        return None  # no table of every code to read the span from; fp32 alone spans 277 bits
    high_a, low_a = span_bits(get_format(params.a_format))
    high_b, low_b = span_bits(get_format(params.b_format))
    return (high_a + high_b + 2 - low_a - low_b) + math.ceil(math.log2(slice_width(params)))


def exact_in_float64(params: DatapathParams) -> bool:
    """Whether every tree sum of this unit's formats is exact in float64 (module docstring)."""
    bits = tree_sum_bits(params)
    return bits is not None and bits <= 53


def blas_applies(
    params: DatapathParams, kernel_args, codes_a, codes_b, scales_a, scales_b, c_values
) -> bool:
    """Whether this GEMM may take the BLAS route: every key's value is one the route computes
    exactly (each key's ``blas`` declaration in ``datapath.schema``), the formats' tree sums
    fit float64, and the data holds no special value the route leaves to the kernel."""
    return (
        blas_route(params, kernel_args, codes_a, codes_b, scales_a, scales_b, c_values) is not None
    )


def blas_route(
    params: DatapathParams,
    kernel_args,
    codes_a,
    codes_b,
    scales_a,
    scales_b,
    c_values,
    memo: dict | None = None,
    defer_fold: bool = False,
) -> tuple | None:
    """:func:`blas_applies`'s decision with what it read from the data: None when the route
    is refused, else ``(folded,)``: for trees of several blocks, the (A, B) folds
    (:func:`_folded_trees`) that :func:`blas_matmul` folds the blocks with (computed once for
    both), else None. ``memo``: as for :func:`blas_matmul` (whether B's codes are all
    finite is kept there). ``defer_fold``: where :func:`blas_matmul` may fold while it
    decodes (:func:`decode_fold_limits`; no ``memo``), the folds are left to it (None), and
    so is the refusal of folded sums beyond 53 bits (it then returns None)."""
    unit_ok = route_accepts("blas", params) and exact_in_float64(params)
    if not unit_ok or not subnormals_work():
        return None
    a_values, b_values = kernel_args[0], kernel_args[2]
    b_finite = None if memo is None else memo.get("finite")
    if b_finite is None:
        b_finite = codes_all_finite(codes_b, np.isfinite(b_values))
        if memo is not None:
            memo["finite"] = b_finite
    if not (b_finite and codes_all_finite(codes_a, np.isfinite(a_values))):
        return None
    if (scales_a == SCALE_NAN).any() or (scales_b == SCALE_NAN).any():
        return None
    folded = None
    deferred = defer_fold and memo is None and decode_fold_limits(params) is not None
    if blocks_per_tree(params) > 1 and scales_a.size and scales_b.size and not deferred:
        folded = _folded_trees(params, kernel_args, codes_a, codes_b, scales_a, scales_b, memo)
        if tree_sum_bits(params) + folded[0][2] + folded[1][2] > 53:  # the folded sums' bits
            return None
    return (folded,) if values_finite_and_not_negative_zero(c_values) else None


def _folded_trees(
    params: DatapathParams, kernel_args, codes_a, codes_b, scales_a, scales_b, memo=None
):
    """The (A, B) folds of trees of several blocks: (each tree's least block exponent
    (..., trees), each block's exponent above it (..., trees * per), the largest of those
    rises). Blocks of zeros are left out (``_fold_code_blocks``, a pass over the codes)
    unless folding every block (``_fold_blocks``, from the scales alone) already keeps the
    tree sums within float32's 24 bits (the trees' bits plus both largest rises; BFP's
    sub-blocks rise at most a binade above their
    block's least): leaving blocks out only lowers the rises, and any fold whose sums fit
    is exact, so the outputs are the same either way. B's fold depends on its own codes and
    scales alone: kept in ``memo`` (as for :func:`blas_matmul`, always with blocks of zeros
    left out) and read from it on later calls."""
    per, size = blocks_per_tree(params), params.block_size
    trees = -(-scales_a.shape[-1] // per)

    def fold(codes, values, scales):
        return _fold_code_blocks(codes, values, scales, size, per, trees)

    folded_b = None if memo is None else memo.get("folded")
    folded_a, bits = _fold_blocks(scales_a, per, trees), tree_sum_bits(params)
    if folded_b is None and memo is None and bits + folded_a[2] <= 24:
        plain_b = _fold_blocks(scales_b, per, trees)
        if bits + folded_a[2] + plain_b[2] <= 24:
            return folded_a, plain_b
    if folded_b is None:
        folded_b = fold(codes_b, kernel_args[2], scales_b)
        if memo is not None:
            least, rises, top = folded_b
            if top <= np.iinfo(np.uint8).max:  # kept: a byte per block rather than eight
                rises = rises.astype(np.uint8, copy=False)
            memo["folded"] = least, rises, top
    if bits + folded_a[2] + folded_b[2] <= 24:
        return folded_a, folded_b
    return fold(codes_a, kernel_args[0], scales_a), folded_b


def decode_fold_limits(params: DatapathParams) -> tuple[int, int] | None:
    """(A's, B's) largest rise of a block above its tree's least that :func:`blas_matmul`'s
    fold while decoding (``_blas_kernels.decode_folded``) accepts: float32's room above the
    tree sums' bits, halved (the folded sums then fit 24 bits: exact in float32 GEMMs);
    None for trees inside blocks, fixed-point grids, exact accumulators, or less than a
    binade of room each."""
    bits = tree_sum_bits(params)
    if blocks_per_tree(params) <= 1 or params.grid_fraction_bits is not None or bits is None:
        return None
    room = 24 - bits
    if room < 2:
        return None
    return room // 2, room - room // 2


def _decoded_folded(values, codes, exponents, per: int, block: int, padded: int, limit: int):
    """(..., padded) float32 values of the (G, n, K) codes with each block folded onto its
    tree's least exponent, every block counted (``_blas_kernels.decode_folded``: one pass,
    where :func:`_fold_blocks` and :func:`_unscaled` take two), the trees' steps 2^least
    (trees, G, n) float64, and the largest rise: where it exceeds ``limit`` the values are
    wrong and the caller folds another way. Codes widened a few rows at a time
    (``_row_chunks``)."""
    trees = padded // (per * block)
    decoded = np.empty(codes.shape[:-1] + (padded,), dtype=np.float32)
    steps = np.empty((trees,) + codes.shape[:-1])
    table = values.astype(np.float32)
    powers = _folded_powers(limit)
    top = 0
    for g, r in _row_chunks(codes):
        out = decoded[g, r]
        part = np.empty((trees,) + out.shape[:-1])
        exps = np.ascontiguousarray(exponents[g, r], dtype=np.int32)
        rises = np.empty(exps.shape, dtype=np.uint8)
        chunk = _decodable(codes[g, r])
        found = decode_folded(table, chunk, exps, per, block, powers, part, rises, out)
        top = max(top, int(found))
        steps[:, g, r] = part
    return decoded, steps, top


@functools.lru_cache(maxsize=8)
def _folded_powers(limit: int) -> np.ndarray:
    """256 float32s, 2^r for r <= ``limit`` and 0 beyond (a rise past the limit discards the
    values decoded with it; E8M0 rises are below 256), read-only."""
    powers = np.zeros(256, dtype=np.float32)
    powers[: limit + 1] = np.ldexp(np.float32(1.0), np.arange(limit + 1))
    powers.setflags(write=False)
    return powers


def _fold_blocks(exponents, per: int, trees: int):
    """The fold of the block exponents (..., blocks) onto trees of ``per`` blocks, every block
    counted: (each tree's least exponent (..., trees), each block's exponent above it (...,
    trees * per; 0 past the last block), the largest rise), by ``_blas_kernels.fold_blocks``; the rises
    bytes where they fit one, else int64."""
    exps = np.ascontiguousarray(exponents.reshape((-1,) + exponents.shape[-1:]))
    least = np.empty((exps.shape[0], trees), dtype=np.int64)
    for dtype in (np.uint8, np.int64):
        rises = np.empty((exps.shape[0], trees * per), dtype=dtype)
        top = int(fold_blocks(exps, per, least, rises))
        if top <= np.iinfo(dtype).max:  # (a larger rise wrapped around in the bytes)
            break
    lead = exponents.shape[:-1]
    return least.reshape(lead + (trees,)), rises.reshape(lead + (trees * per,)), top


@functools.lru_cache(maxsize=1024)
def blocks_per_tree(params: DatapathParams) -> int:
    """Scale blocks a tree spans on the rounding route: 1 where trees lie inside blocks, else
    fused_terms / block_size (the schema admits only trees of whole blocks)."""
    if params.accumulator_format == "exact" or params.scales == "none":
        return 1
    return max(1, params.fused_terms // params.block_size)


def _fold_code_blocks(codes, values, exponents, block: int, per: int, trees: int):
    """The fold of :func:`_fold_blocks` with the blocks whose codes all decode to 0 or -0
    (``values``) and those past the operand's last left out of each tree's least and rising
    by 0 (a tree of nothing else takes its blocks' least): they add nothing to a tree sum
    whatever their scale. In one pass over the codes (``_blas_kernels.fold_code_blocks``), a few rows at a
    time (``_row_chunks``, on Numba's threads). The rises are bytes where they fit one (E8M0 scales: always),
    else int64."""
    lead = (1,) * (3 - codes.ndim) + codes.shape
    codes = codes.reshape(lead)
    exps = exponents.reshape(lead[:2] + exponents.shape[-1:])
    least = np.empty(lead[:2] + (trees,), dtype=np.int64)
    block_of = np.arange(min(codes.shape[-1], exps.shape[-1] * block)) // block
    zero = values == 0
    chunks = list(_row_chunks(codes))
    tops = np.zeros(len(chunks), dtype=np.int64)
    for dtype in (np.uint8, np.int64):
        rises = np.empty(lead[:2] + (trees * per,), dtype=dtype)

        def fold(start: int, stop: int, rises=rises) -> None:
            for n in range(start, stop):
                g, r = chunks[n]
                tops[n] = fold_code_blocks(
                    _wide(codes[g, r]), zero, exps[g, r], block_of, per, least[g, r], rises[g, r]
                )

        run_in_threads(fold, len(chunks))  # the chunks on Numba's threads (a nogil kernel)
        top = int(tops.max(initial=0))
        if top <= np.iinfo(dtype).max:  # (a larger rise wrapped around in the bytes)
            break
    lead_out = exponents.shape[:-1]
    return least.reshape(lead_out + (trees,)), rises.reshape(lead_out + (trees * per,)), top


def codes_all_finite(codes, finite_table) -> bool:
    """Whether every code's table value is finite: at once for a format without non-finite
    codes; for one with at most ``FEW_NON_FINITE`` (fp8_e4m3: 2, fp8_e5m2: 8) by masked
    compares of C-contiguous codes, several codes to a 64-bit word
    (``_blas_kernels.holds_none_of``, the patterns of :func:`non_finite_patterns`: one pass
    where the non-finite codes are every code with some bits fixed, as for those two); else
    by a scan of the (..., K) codes (any unsigned dtype and strides) a few rows at a time
    (``_row_chunks``)."""
    if finite_table.all():
        return True
    excluded = np.flatnonzero(~finite_table)
    if excluded.size <= FEW_NON_FINITE and codes.flags.c_contiguous:
        flat = codes.reshape(-1)
        patterns = non_finite_patterns(tuple(excluded.tolist()), flat.dtype.itemsize)
        lanes = 8 // flat.dtype.itemsize
        whole = flat.size - flat.size % lanes  # codes in whole words
        words = flat[:whole].view(np.uint64)
        if not words.flags.aligned:  # (the kernel's one signature: aligned words)
            words = words.copy()
        tail = flat[whole:].tolist()  # fewer codes than a word holds: compared here
        return not set(tail).intersection(excluded.tolist()) and bool(
            holds_none_of(words, *patterns)
        )
    codes = codes.reshape((1,) * (3 - codes.ndim) + codes.shape)
    return all(rows_all_finite(_wide(codes[g, r]), finite_table) for g, r in _row_chunks(codes))


@functools.lru_cache(maxsize=64)
def non_finite_patterns(excluded: tuple, width: int) -> tuple:
    """``_blas_kernels.holds_none_of``'s (masks, values, ones, highs) for codes of ``width``
    bytes (1, 2, 4 or 8), 8 / ``width`` to a uint64 word: codes c with c & mask == value,
    for some pair, are exactly the codes ``excluded`` (distinct, each below 2^(8 width)).
    One pair where they are all 2^f codes that agree on every bit but f (fp8_e4m3's 0x7F
    and 0xFF: mask 0x7F), else a pair per code, its mask every bit; each mask and value
    repeated in every lane (``ones``: 1 in each lane's lowest bit, ``highs`` its highest).
    The arrays read-only (kept)."""
    bits = 8 * width
    every = (1 << bits) - 1
    common, either = every, 0
    for code in excluded:
        common &= code
        either |= code
    free = common ^ either  # the bits on which the codes differ
    if len(excluded) == 1 << bin(free).count("1"):  # distinct: all 2^f combinations of them
        pairs = [(every ^ free, common)]
    else:
        pairs = [(every, code) for code in excluded]
    ones = sum(1 << (bits * lane) for lane in range(64 // bits))
    masks = np.array([mask * ones for mask, _ in pairs], dtype=np.uint64)
    values = np.array([value * ones for _, value in pairs], dtype=np.uint64)
    masks.setflags(write=False)
    values.setflags(write=False)
    return masks, values, np.uint64(ones), np.uint64(ones << (bits - 1))


def _row_chunks(codes):
    """Slices (groups, rows) of the (G, rows, K) ``codes`` covering them a few rows at a time
    (at most ``CODES_AT_ONCE`` codes; whole groups together when a group has fewer): each
    chunk widened by itself (``_wide``) keeps the GEMM's memory near its packed operands."""
    groups, rows, length = codes.shape
    per_group = max(rows * length, 1)
    if per_group <= CODES_AT_ONCE:  # many small groups (attention heads): few calls
        step = CODES_AT_ONCE // per_group
        for g in range(0, groups, step):
            yield slice(g, min(g + step, groups)), slice(0, rows)
        return
    step = max(1, CODES_AT_ONCE // max(length, 1))
    for g in range(groups):
        for r in range(0, rows, step):
            yield slice(g, g + 1), slice(r, min(r + step, rows))


def _wide(codes) -> np.ndarray:
    """C-contiguous uint32 codes: the one code type of this module's kernels (the route takes
    formats of at most ``FULL_TABLE_BITS`` bits), but for the decoding ones."""
    return np.ascontiguousarray(codes, dtype=np.uint32)


def _decodable(codes) -> np.ndarray:
    """The codes as the decoding kernels take them: C-contiguous codes of one or two bytes
    as they are (a table lookup per code reads them as fast, without a widened copy: the
    decoding passes run per call on every element of A, and of B without a memo), others as
    :func:`_wide` (each width a signature of its own: Numba compiles the kernel for each
    width it meets)."""
    if codes.dtype in (np.uint8, np.uint16) and codes.flags.c_contiguous:
        return codes
    return _wide(codes)


#: Per rounding mode (ROUNDING_MODES name): (directed, the far neighbour from zero chosen for a
#: positive value, for a negative one); for the nearest modes the last two apply to ties.
ROUNDING_CHOICES = {
    "nearest_even": (0, 0, 0),  # (ties: the conversion's even neighbour)
    "nearest_away": (0, 1, 1),
    "nearest_toward_positive": (0, 1, 0),
    "toward_zero": (1, 0, 0),
    "toward_positive": (1, 1, 0),
    "toward_negative": (1, 0, 1),
}


def grid_rule(params: DatapathParams) -> tuple[np.ndarray, np.ndarray]:
    """A grid unit's ``(grid, choices)`` as the grid kernels take them: int64 [fraction bits,
    largest left shift, largest right shift] and the accumulator rounding's
    :data:`ROUNDING_CHOICES` row."""
    grid = [params.grid_fraction_bits, params.grid_max_left_shift, params.grid_max_right_shift]
    choices = ROUNDING_CHOICES[params.accumulator_rounding]
    return np.array(grid, dtype=np.int64), np.array(choices, dtype=np.int64)


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


def _decoded(values, codes, exponents, block: int, padded: int) -> np.ndarray:
    """(..., padded) float64 of the elements' values times 2^(their block's scale exponent)
    (exact: powers of two, results normal float64s), zeros past the operand's length.
    ``exponents`` None: no scales. Scaled while decoded where ``block`` is a power of two
    (``_blas_kernels.decode_scaled``, each block's power of two from
    :func:`_powers_of_two`): one pass, where decoding and then scaling each block take
    two."""
    if exponents is None or block & (block - 1):
        decoded = _unscaled(values, codes, padded, np.float64)
        if exponents is not None:
            blocks = padded // block
            steps = np.ldexp(1.0, exponents[..., :blocks].astype(np.int32))
            grouped = decoded.reshape(codes.shape[:-1] + (blocks, block))
            grouped *= steps[..., None]
        return decoded
    blocks = padded // block
    steps = _powers_of_two(exponents[..., :blocks])
    decoded = np.empty(codes.shape[:-1] + (padded,))
    table, shift = values.astype(np.float64), block.bit_length() - 1
    for g, r in _row_chunks(codes):
        decode_scaled(table, _decodable(codes[g, r]), steps[g, r], shift, decoded[g, r])
    return decoded


def _unscaled(values, codes, padded: int, dtype, rises=None, block: int = 1) -> np.ndarray:
    """(..., padded) ``dtype`` array of the elements' values, zeros past the operand's length
    (float32 holds every value of the formats it is used for: their tree sums fit 24 bits),
    each block of ``block`` elements times 2^(its rise) where ``rises`` (..., padded / block)
    are given (exact: the route keeps the folded sums within 53 bits). The codes (any
    unsigned dtype, 3-D) are widened a few rows at a time (``_row_chunks``)."""
    decoded = np.empty(codes.shape[:-1] + (padded,), dtype=dtype)
    table = values.astype(dtype, copy=False)  # (the caller may pass it cast once per call)
    if rises is not None:
        powers = _rise_powers(int(rises.max(initial=0)), np.dtype(dtype))
    for g, r in _row_chunks(codes):
        chunk, out = _decodable(codes[g, r]), decoded[g, r]
        if rises is None:
            decode_codes(table, chunk, out)
        else:
            steps = np.ascontiguousarray(rises[g, r])  # bytes, or int64 for rises beyond 255
            decode_raised(table, chunk, steps, block, powers, out)
    return decoded


@functools.lru_cache(maxsize=64)
def _rise_powers(top: int, dtype: np.dtype) -> np.ndarray:
    """2^0, 2^1, ..., 2^top in ``dtype``, read-only (kept: every pass of a call asks for
    them; the kernels only read them)."""
    powers = np.ldexp(1.0, np.arange(top + 1)).astype(dtype)
    powers.setflags(write=False)
    return powers


def _steps(exponents, shape: tuple, blocks: int) -> np.ndarray:
    """(blocks, g, n) float64 powers of two 2^X of the scale exponents (g, n, blocks; E8M0's,
    in [-127, 127]) of the rows or columns of a tile, ones without scales (``exponents``
    None)."""
    if exponents is None:
        return np.ones((blocks,) + shape)
    return _powers_of_two(exponents[..., :blocks].transpose(2, 0, 1))


def _powers_of_two(exponents) -> np.ndarray:
    """2^x as C-contiguous float64 for integer exponents x in [-127, 127] (E8M0's, and trees'
    least of them: normal float64s), built from the bits: shifts and adds, where ldexp
    computes each power in a call of its own. On a copy (``astype`` always makes one): the
    caller's exponents, which it may read again, are left as they are, even where they are
    int64 and contiguous already (one block's transposed exponents, a folded tree's least)."""
    bits = exponents.astype(np.int64, order="C")
    bits += 1023
    bits <<= 52
    return bits.view(np.float64)


def _exact_chunks(
    params: DatapathParams, exponents_a, exponents_b, block: int
) -> list[tuple[int, int]]:
    """Ranges of scale blocks [first, last) whose products one float64 GEMM sums exactly
    (exact accumulator): the sums of one block need ``base`` bits (module doc); blocks of
    scale exponents Xa + Xb between m and h_t sum to a multiple of 2^(lsb + m) below
    width 2^(E + 2 + lsb) sum_t 2^(h_t - m), so they fit when sum_t 2^(h_t - m) <= 2^(53 - base).
    h_t and m are taken over all rows and columns (exponents (..., blocks) of the pass, of
    blocks of ``block`` products)."""
    blocks = exponents_a.shape[-1]
    if blocks <= 1:  # one block: exact by itself (tree_sum_bits <= 53)
        return [(0, blocks)] if blocks else []
    high_a, low_a = span_bits(get_format(params.a_format))
    high_b, low_b = span_bits(get_format(params.b_format))
    base = (high_a + high_b + 2 - low_a - low_b) + math.ceil(math.log2(block))
    room = 1 << (53 - base)
    # per block over the rows: reduced along the blocks' own contiguous copies (numpy's
    # reduction of the first axis of a (many, few) array runs a slow strided loop)
    by_block_a, by_block_b = (
        np.ascontiguousarray(e.reshape(-1, e.shape[-1]).T, dtype=np.int64)
        for e in (exponents_a, exponents_b)
    )
    most = (by_block_a.max(axis=1) + by_block_b.max(axis=1)).tolist()
    least = (by_block_a.min(axis=1) + by_block_b.min(axis=1)).tolist()
    chunks, first, floor, total = [], 0, least[0] if blocks else 0, 0
    for t in range(blocks):
        new_floor = min(floor, least[t])
        new_total = (total << (floor - new_floor)) + (1 << (most[t] - new_floor))
        if t > first and new_total > room:
            chunks.append((first, t))
            first, new_floor = t, least[t]
            new_total = 1 << (most[t] - new_floor)
        floor, total = new_floor, new_total
    if blocks:
        chunks.append((first, blocks))
    return chunks


# Tiles run on this module's threads, each GEMM on the calling thread: OpenBLAS's own threads,
# woken for every small GEMM, made them 10-100x slower on a loaded machine. Where the BLAS
# library's threads can be held to one for the call (threadpoolctl finds it), a tree's GEMM
# is TILE_ROWS x width x TILE_COLUMNS (at depth 32 BLAS needs a few hundred rows and columns
# to run near its full speed; the float64 tree sums and the fp32 accumulators of a tile stay
# in cache) and an exact accumulator's at most KULISCH_MACS. Otherwise GEMMs stay
# within SINGLE_THREAD_MACS, the size OpenBLAS runs on the calling thread by itself.
SINGLE_THREAD_MACS = 1 << 18
TILE_ROWS = 256  # rows per tile at most, whole groups together when they have fewer
TILE_COLUMNS = 256  # columns per GEMM at most
KULISCH_MACS = 1 << 24
GROUP_PASS_TILES = 4  # tiles' area of a pass of whole groups (attention heads)
SMALL_TILE_ROWS = 32  # rows per tile without control of the BLAS threads
KULISCH_COLUMNS = 64  # columns per exact-accumulator GEMM without it
# The decoded operands are kept small beside the packed codes and the output (an 8192^3
# MXFP8 GEMM within 1.5 x its packed operands plus its output): B a panel of columns at a
# time (A decoded again for each), A's tiles fewer rows at long K.
DECODED_VALUES = 1 << 21  # decoded elements of B kept at once (16 MiB of float64)
DECODED_ROW_VALUES = 1 << 20  # decoded elements of A per tile at most (while rows allow)
CODES_AT_ONCE = 1 << 18  # codes widened to the kernels' uint32 at once
FEW_NON_FINITE = 8  # non-finite codes at most that ``codes_all_finite`` compares the codes with


@functools.lru_cache(maxsize=None)
def _blas_threads():
    """threadpoolctl's controller of the loaded BLAS libraries, or None when threadpoolctl is
    not installed or finds none (then GEMMs stay small enough to run on the calling thread)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    controller = ThreadpoolController().select(user_api="blas")
    return controller if controller.lib_controllers else None


def _split(first: int, last: int, parts: int) -> list[tuple[int, int]]:
    """[first, last) cut into ``parts`` near-equal ranges (fewer when it is shorter)."""
    parts = max(1, min(parts, last - first))
    bounds = [first + (last - first) * p // parts for p in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def blas_matmul(
    params: DatapathParams,
    kernel_args,
    codes_a,
    codes_b,
    scales_a,
    scales_b,
    c_values,
    out,
    progress=None,
    folded=None,
    memo: dict | None = None,
) -> list[tuple[int, int, int]]:
    """Fill ``out`` (G, M, N uint32 fp32 bits) with the unit's batch of GEMMs A[g] times B[g]
    given as (N, K) through BLAS (see module doc); codes and scales are (G, rows, ...),
    ``c_values`` (G, M, N) or (1, 1, 1). Any order of the exact tree sums is exact, so a
    batch's outputs are those of its groups computed one by one.

    B is decoded in panels of columns (``DECODED_VALUES``), A per tile of rows once per panel,
    from codes of any unsigned dtype widened a few rows at a time: unscaled into float64, or
    float32 where the tree sums fit it, for an fp32 accumulator; into float64 with the block
    scales folded in for an exact one. Per tile of rows and columns, each tree's sums are one
    GEMM run on the calling thread, then scaled and added to the tile's fp32 accumulators in
    tree order by a serial kernel while they are in cache.
    Tiles run on ``numba.get_num_threads()`` threads (BLAS and the kernels release the GIL),
    the BLAS library's own threads held to one meanwhile (``_blas_threads``).

    For an exact (Kulisch) accumulator the sums of whole ranges of blocks that one GEMM
    adds exactly (``_exact_chunks``) are added exactly in two float64s; returns the (group,
    row, column) outputs whose sum needed more (the caller recomputes them with the
    kernel). Otherwise returns []. Returns None where ``folded`` is None and the folded sums
    need more than 53 bits (the route is refused: ``out`` holds nothing of use).
    ``progress(rows_done, rows_total)`` counts rows of all
    groups (tiles done, as rows). ``folded``: :func:`blas_route`'s folded trees of these
    operands where it computed them (None: computed here). ``memo``: None, or a mapping the
    caller keeps for this same B (its codes and scales unchanged between the calls given it,
    with the same ``params``): B's decoded panels and their steps, and for trees of several
    blocks B's folded tree exponents (``_folded_trees``), are kept there and reused (a
    model's weights, decoded once; a folded panel is decoded again when A's rises change
    its float type).
    """
    a_values, b_values = kernel_args[0], kernel_args[2]
    groups, rows, length = codes_a.shape
    columns = codes_b.shape[1]
    width = slice_width(params)
    kulisch = params.accumulator_format == "exact"
    scaled = params.scales != "none"
    per = blocks_per_tree(params)
    bits = tree_sum_bits(params)
    rises_a = rises_b = None
    # Trees of several blocks, each tree's blocks folded onto its least scale: while decoding
    # (one pass) where nothing is kept and float32 has room, else first (``_folded_trees``).
    limits = None
    if per > 1 and folded is None and memo is None and progress is None:
        limits = decode_fold_limits(params)
    if limits is not None:
        bits += sum(limits)  # the folded sums' bits at most, where the rises keep the limits
        raw_a, raw_b = scales_a, scales_b
    elif per > 1:
        if folded is None:
            folded = _folded_trees(params, kernel_args, codes_a, codes_b, scales_a, scales_b, memo)
            if bits + folded[0][2] + folded[1][2] > 53:
                return None
        (scales_a, rises_a, top_a), (scales_b, rises_b, top_b) = folded
        bits += top_a + top_b  # the folded sums' bits
    block = params.block_size * per if scaled else width
    padded = -(-length // block) * block
    blocks = padded // block
    dtype = np.float32 if bits is not None and bits <= 24 else np.float64
    # float32 sums: multiples of 2^(lsb_a + lsb_b) below 2^(that + bits) (module doc)
    lsb = span_bits(get_format(params.a_format))[1] + span_bits(get_format(params.b_format))[1]
    span = (lsb, lsb + bits) if dtype == np.float32 else None
    grid = trees = choices = floor = None
    if params.grid_fraction_bits is not None:
        grid, choices = grid_rule(params)
        floor = grid_nearest_even_floor(params)
        cut = params.block_size if params.trees_in_blocks else block
        trees = [(first, last, first // block) for first, last in grid_trees(params, length, cut)]
    # trees of 8 float64 products, rounded to nearest even as they come: one fused kernel
    eights = _eight_term_trees(params, dtype, padded, trees, floor, block)
    # other grid trees of 8 or 16 products, any mode, above the grid's floor: fused too
    fused = _fused_grid_starts(params, trees) if grid is not None else None
    any_floor = grid_floor(params)
    # An exact accumulator's blocks all one exact range over the whole batch are one over
    # any tile's rows and columns (its largest and least scale sums lie within the batch's)
    one_range = (
        kulisch
        and scaled
        and len(_exact_chunks(params, scales_a[..., :blocks], scales_b[..., :blocks], block)) <= 1
    )
    acc_all = out.view(np.float32)
    # one accumulator input for every output: the tiles of fused trees of 8 start from it
    start = c_values.flat[0] if c_values.shape == (1, 1, 1) else None
    if length == 0 or rows == 0 or columns == 0:
        acc_all[...] = c_values if start is None else start
        return []
    # A grid's floors read per tile from the blocks' least scale exponent sums, blocks of
    # zeros left out (``_least_scale_sums``), unless the whole batch's least, every block
    # counted, already lies at or above them: a tile's least, over fewer rows and columns
    # and fewer blocks, is at least that, so its floor checks all hold without reading it.
    plain_batch = fused_batch = False
    if grid is not None:
        scale_pair = (scales_a, scales_b) if scaled else (None, None)
        least_batch = sum(_exponent_range(e, blocks)[0] for e in scale_pair)
        plain_batch = floor is not None and least_batch >= floor
        fused_batch = fused is not None and least_batch >= any_floor
    # Likewise, float32 tree sums whose scaled sums are float32s over the whole batch are so
    # over every tile (``_fp32_exact_blocks``: its bounds hold for fewer rows and columns).
    # (Folding while decoding, each tree's least lies within its blocks' exponents' range.)
    narrow_batch = None
    if span is not None and scaled and not kulisch:
        ends_a, ends_b = (
            np.ldexp(1.0, np.array(_exponent_range(e, n))).reshape(1, 1, 2)
            for e, n in (
                ((raw_a, raw_a.shape[-1]), (raw_b, raw_b.shape[-1]))
                if limits is not None
                else ((scales_a, blocks), (scales_b, blocks))
            )
        )
        if _fp32_exact_blocks(ends_a, ends_b, span).all():
            narrow_batch = np.ones(blocks, dtype=np.bool_)
    tile_least = grid is not None and (
        (floor is not None and not plain_batch) or (fused is not None and not fused_batch)
    )
    # Where every tile takes the fused trees of 8 from one c, each writes c to its outputs as
    # it starts (in cache), not the whole output first.
    if start is None or eights is None or not (grid is None or plain_batch):
        acc_all[...] = c_values if start is None else start
    limiter = _blas_threads() if groups * rows * columns * padded > SINGLE_THREAD_MACS else None
    tile = TILE_ROWS if limiter is not None else SMALL_TILE_ROWS
    tile = max(SMALL_TILE_ROWS, min(tile, DECODED_ROW_VALUES // padded))  # long K: fewer rows
    macs = KULISCH_MACS if limiter is not None else SINGLE_THREAD_MACS
    if limiter is not None:
        chunk = TILE_COLUMNS
    else:
        chunk = KULISCH_COLUMNS if kulisch else max(1, SINGLE_THREAD_MACS // (tile * width))
    panel = max(1, min(columns, DECODED_VALUES // (padded * groups)))
    panels = [(c0, min(c0 + panel, columns)) for c0 in range(0, columns, panel)]
    # A narrow output (attention heads: N of 32-128) takes more rows per tile, whole groups
    # together, so each pass's GEMMs and kernel calls cover about a tile's area, or
    # GROUP_PASS_TILES tiles' where the passes hold whole groups (fewer passes: less Python
    # per MAC).
    area = tile * max(1, chunk // max(columns, 1))
    if rows <= area:
        area *= GROUP_PASS_TILES
    passes = list(batch_passes(groups, rows, area))
    threads = numba.get_num_threads()
    # Each pass's columns in as many parts as it takes to give every thread work.
    parts = -(-threads // len(passes))
    items = [(p, part) for p in passes for part in range(parts)]
    # Without a memo, a batch whose passes hold whole groups and take all of B's columns
    # decodes each pass's groups of B in the pass: its decoded B and A stay a tile's size
    # (fresh memory for a whole decoded B per call costs more than the decoding).
    by_pass = (
        memo is None
        and groups > 1
        and len(panels) == 1
        and parts == 1
        and all(r0 == 0 and r1 == rows for _, _, r0, r1 in passes)
    )

    # The element tables in the decoded type, and for passes of whole groups every row's and
    # column's steps, once per call rather than once per pass (small: attention heads).
    table_a, table_b = a_values.astype(dtype), b_values.astype(dtype)
    all_steps_a = all_steps_b = None
    if by_pass and not kulisch and limits is None:
        all_steps_a = _steps(scales_a if scaled else None, (groups, rows), blocks)
        all_steps_b = _steps(scales_b if scaled else None, (groups, columns), blocks)

    def decode_b(g0, g1, c0, c1):
        """(B's values, steps, zero-block marks) of groups [g0, g1) and columns [c0, c1);
        None where its fold while decoding rose beyond its limit."""
        if limits is not None:
            b, b_steps, top = _decoded_folded(
                b_values,
                codes_b[g0:g1, c0:c1],
                raw_b[g0:g1, c0:c1],
                per,
                params.block_size,
                padded,
                limits[1],
            )
            return None if top > limits[1] else (b, b_steps, None)
        exps_b = scales_b[g0:g1, c0:c1] if scaled else None
        if kulisch:
            return _decoded(b_values, codes_b[g0:g1, c0:c1], exps_b, block, padded), None, None
        # (G, n, padded) unscaled (BLAS reads each tree's slice transposed)
        rises = rises_b[g0:g1, c0:c1] if per > 1 else None
        b = _unscaled(table_b, codes_b[g0:g1, c0:c1], padded, dtype, rises, params.block_size)
        if all_steps_b is None:
            b_steps = _steps(exps_b, (g1 - g0, c1 - c0), blocks)
        else:
            b_steps = np.ascontiguousarray(all_steps_b[:, g0:g1, c0:c1])
        # a grid's floors skip columns of zero blocks (``_above_floor``)
        return b, b_steps, zero_block_mask(b, blocks) if tile_least else None

    leftovers = []
    done = 0
    refold: list = []  # marked when a fold while decoding rose beyond its limit
    # the process's kept pool (starting threads costs about 0.1 ms a call)
    pool = kept_pool(threads) if threads > 1 and len(items) > 1 and not in_kept_pool() else None
    with limiter.limit(limits=1) if limiter is not None else contextlib.nullcontext():
        for c0, c1 in panels:
            # A folded B's panel depends on B alone, but its float type on A's rises too
            # (``dtype``): one panel is kept, of the type last used.
            key = None if memo is None else ("panel", c0, c1, block, padded)
            kept = None if key is None else memo.get(key)
            if kept is not None and kept[0].dtype != (np.float64 if kulisch else dtype):
                kept = None
            if kept is not None:
                b, b_steps, b_zeros = kept
            elif by_pass:  # each pass decodes its own groups of B (``run``)
                b = b_steps = b_zeros = None
            else:
                decoded = decode_b(0, groups, c0, c1)
                if decoded is None:
                    return _refolded(
                        params, kernel_args, codes_a, codes_b, raw_a, raw_b, c_values, out
                    )
                b, b_steps, b_zeros = decoded
            if key is not None and kept is None:
                memo[key] = (b, b_steps, b_zeros)

            def run(item, b=b, b_steps=b_steps, b_zeros=b_zeros, c0=c0, c1=c1):
                (g0, g1, r0, r1), part = item
                if refold:  # (the call is done again, folded first: this item is void)
                    return None
                first = 0  # the group at b's index 0
                if b is None:
                    decoded = decode_b(g0, g1, c0, c1)
                    if decoded is None:
                        refold.append(True)
                        return None
                    b, b_steps, b_zeros = decoded
                    first = g0
                exps_a = scales_a[g0:g1, r0:r1] if scaled else None
                if limits is not None:
                    a, a_steps, top = _decoded_folded(
                        a_values,
                        codes_a[g0:g1, r0:r1],
                        exps_a,
                        per,
                        params.block_size,
                        padded,
                        limits[0],
                    )
                    if top > limits[0]:
                        refold.append(True)
                        return None
                elif kulisch:
                    a = _decoded(a_values, codes_a[g0:g1, r0:r1], exps_a, block, padded)
                else:
                    rises = rises_a[g0:g1, r0:r1] if per > 1 else None
                    a = _unscaled(
                        table_a, codes_a[g0:g1, r0:r1], padded, dtype, rises, params.block_size
                    )
                    if all_steps_a is None:
                        a_steps = _steps(exps_a, a.shape[:2], blocks)
                    else:
                        a_steps = np.ascontiguousarray(all_steps_a[:, g0:g1, r0:r1])
                    a_zeros = zero_block_mask(a, blocks) if tile_least else None
                found = []
                # This item's share of the panel's columns (none when it has fewer than parts).
                for p0, p1 in _split(c0, c1, parts)[part : part + 1]:
                    for k0 in range(p0, p1, chunk):
                        k1 = min(k0 + chunk, p1)
                        acc = acc_all[g0:g1, r0:r1, k0:k1]
                        b_tile = b[g0 - first : g1 - first, k0 - c0 : k1 - c0]
                        if kulisch:
                            found += _kulisch_tile(
                                params,
                                a,
                                b_tile,
                                exps_a,
                                scales_b[g0:g1, k0:k1] if scaled else None,
                                block,
                                acc,
                                (g0, r0, k0),
                                macs,
                                one_range,
                            )
                            continue
                        steps = np.ascontiguousarray(
                            b_steps[:, g0 - first : g1 - first, k0 - c0 : k1 - c0]
                        )
                        plain, fused_tile = None, fused_batch
                        if tile_least:
                            zeros = b_zeros[:, g0 - first : g1 - first, k0 - c0 : k1 - c0]
                            least = _least_scale_sums(a_steps, steps, a_zeros, zeros)
                            if floor is not None:
                                plain = _above_floor(least, floor)
                            fused_tile = _above_floor(least, any_floor).all()
                        elif floor is not None:
                            plain = np.ones(blocks, dtype=np.bool_)  # (``plain_batch``)
                        if eights is not None and (grid is None or plain.all()):
                            _tree8_tile(a, b_tile, a_steps, steps, eights, acc, start)
                        elif fused is not None and fused_tile:
                            _grid_trees_tile(
                                a, b_tile, a_steps, steps, fused, acc, grid, choices, span
                            )
                        elif grid is not None:
                            _grid_tile(
                                a, b_tile, a_steps, steps, trees, acc, grid, choices, plain, span
                            )
                        else:
                            _rounding_tile(
                                a, b_tile, a_steps, steps, width, block, acc, span, narrow_batch
                            )
                return found

            futures = [] if pool is None else [pool.submit(run, item) for item in items]
            try:
                for found in map(run, items) if pool is None else (f.result() for f in futures):
                    if found is None:  # (``refold``)
                        continue
                    leftovers.extend(found)
                    done += 1
                    if progress is not None:
                        progress(done * groups * rows // (len(items) * len(panels)), groups * rows)
            finally:  # (an exception, a progress callback's included: no tile left running)
                for future in futures:
                    future.cancel()
                wait(futures)
            del b, b_steps, run  # this panel freed before the next one is decoded
            if refold:
                break
    if refold:
        return _refolded(params, kernel_args, codes_a, codes_b, raw_a, raw_b, c_values, out)
    return leftovers


def _refolded(params, kernel_args, codes_a, codes_b, scales_a, scales_b, c_values, out):
    """:func:`blas_matmul` with the blocks folded first (``_folded_trees``), where its fold
    while decoding found a block rising beyond its limit (None where the folded sums need
    more than 53 bits: the route is refused)."""
    folded = _folded_trees(params, kernel_args, codes_a, codes_b, scales_a, scales_b)
    if tree_sum_bits(params) + folded[0][2] + folded[1][2] > 53:
        return None
    return blas_matmul(
        params, kernel_args, codes_a, codes_b, scales_a, scales_b, c_values, out, folded=folded
    )


def _fp32_exact_blocks(row_steps, column_steps, span: tuple[int, int]) -> np.ndarray:
    """Per scale block, whether every tree sum times its steps is a float32: the sums are
    multiples of 2^low below 2^high (``span``), the steps (blocks, g, r) and (blocks, g, n)
    powers of two; so it holds when the least step product times 2^low is at least float32's
    smallest subnormal 2^-149 and the largest times 2^high at most 2^128, and the step
    products themselves are float32s (in [2^-149, 2^127])."""
    low, high = span
    blocks = row_steps.shape[0]
    rows, columns = row_steps.reshape(blocks, -1), column_steps.reshape(blocks, -1)
    if rows.shape[1] == 0 or columns.shape[1] == 0:
        return np.ones(blocks, dtype=np.bool_)
    least = rows.min(axis=1) * columns.min(axis=1)
    most = rows.max(axis=1) * columns.max(axis=1)
    return (
        (np.ldexp(least, low) >= 2.0**-149)
        & (np.ldexp(most, high) <= 2.0**128)
        & (least >= 2.0**-149)
        & (most <= 2.0**127)
    )


def _exponent_range(exponents, blocks: int) -> tuple[int, int]:
    """(least, largest) scale exponent of a batch's (G, n, >= blocks) ``exponents`` (None:
    no scales, 0) over all its rows and first ``blocks`` blocks (at least one row): a
    tile's per-block least and largest, over fewer rows and blocks, lie within it."""
    if exponents is None:
        return 0, 0
    chosen = exponents[..., :blocks]
    return int(chosen.min()), int(chosen.max())


def _rounding_tile(
    a,
    b,
    row_steps,
    column_steps,
    width: int,
    block: int,
    acc,
    span: tuple[int, int] | None,
    narrow=None,
) -> None:
    """acc (g, r, n fp32) = its values with each tree's sum added and rounded in turn: tree
    t's unscaled sums are a (g, r, padded)'s tree t times b (g, n, padded)'s, one GEMM, scaled
    by its block's steps (of (blocks, g, r) and (blocks, g, n); trees lie inside blocks) and
    added to a contiguous copy of the accumulators while both are in cache. With float32
    sums (``span``: their (low, high) bounds, tree_sum_bits <= 24), blocks whose scaled sums
    are all float32s are added by float32 arithmetic (``_blas_kernels.accumulate_fp32``):
    per block, ``narrow`` where the caller read that from wider bounds, else read here."""
    running = np.ascontiguousarray(acc)
    sums = np.empty(acc.shape, dtype=a.dtype)
    if span is not None:
        if narrow is None:
            narrow = _fp32_exact_blocks(row_steps, column_steps, span)
        row_steps32 = row_steps.astype(np.float32)
        column_steps32 = column_steps.astype(np.float32)
    for t in range(a.shape[-1] // width):
        tree = slice(t * width, (t + 1) * width)
        np.matmul(a[..., tree], b[..., tree].transpose(0, 2, 1), out=sums)
        blk = t * width // block
        if narrow is not None and narrow[blk]:
            accumulate_fp32(running, sums, row_steps32[blk], column_steps32[blk])
        else:
            accumulate_rne_fp32(running, sums, row_steps[blk], column_steps[blk])
    acc[...] = running


def grid_trees(params: DatapathParams, length: int, cut: int) -> list[tuple[int, int]]:
    """(first, last position) of each tree the datapath kernel runs over K = ``length``
    (its ``tree_count``/``tree_bounds``): runs of fused_terms cut from each run of ``cut``
    positions (block_size with ``trees_in_blocks``, where a block's last tree may be short;
    else a multiple of fused_terms), none starting at or past K (the last may reach into the
    operands' zero padding, which adds nothing to its exact sum)."""
    width = params.fused_terms
    return [
        (start, min(start + width, first + cut))
        for first in range(0, length, cut)
        for start in range(first, min(first + cut, length), width)
    ]


def grid_nearest_even_floor(params: DatapathParams) -> int | None:
    """The least scale exponent sum X above which a nearest-even grid unit's tree step is
    RNE_fp32(acc + S), its pass-through rules idle (None: not nearest-even, or no such X).

    With n fraction bits, max left shift L, |S| < 2^(X + H) (H: ``tree_sum_bits``' top,
    ``span_bits``' leading exponents + 2 + ceil(log2 F)) and every S a multiple of
    2^(X + low) (low: the formats' least steps), for X >= max(n - L - 150, -149 - low) and
    H <= L - n - 1: a zero accumulator (-127 as its exponent) is never kept left; a nonzero
    one kept left (its exponent e >= X + L - n + 24 >= X + H + 25) has |S| below a quarter
    of its fp32 step, so RNE(acc + S) is acc; every nonzero exact sum is a multiple of
    2^-149, so no rounding gives -0, and as the route refuses a -0 c, no accumulator is -0
    while every earlier tree's X is at or above the floor too: keeping it for S = 0 (right)
    is acc + 0 = acc, and an exact zero sums to +0 in IEEE arithmetic. An infinite
    accumulator stays either way."""
    if params.accumulator_rounding != "nearest_even":
        return None
    high_a, low_a = span_bits(get_format(params.a_format))
    high_b, low_b = span_bits(get_format(params.b_format))
    high = high_a + high_b + 2 + math.ceil(math.log2(params.fused_terms))
    fraction, left = params.grid_fraction_bits, params.grid_max_left_shift
    if high > left - fraction - 1:
        return None
    return max(fraction - left - 150, -149 - low_a - low_b)


def grid_floor(params: DatapathParams) -> int | None:
    """The least scale exponent sum X from which a fixed-point-grid unit's tree step, in any
    rounding mode but stochastic, is: the accumulator kept when |acc| >= 2^(X + L - n + 24)
    (n fraction bits, max left shift L), else acc + S rounded once (None: no grid).

    For X >= max(n - L - 149, -149 - low) (low: the formats' least product step): every
    nonzero acc + S is a multiple of 2^-149, so no rounding gives a zero and, as the route
    refuses a -0 c, no accumulator is -0 while every earlier tree's X is at or above the
    floor too; a zero accumulator (exponent -127) or a subnormal one (-126) is never kept
    left, as 2^(X + L - n + 24) >= 2^-125 exceeds it; a normal one's LSB lies more than L
    places above the grid's exactly when |acc| >= 2^(X + L - n + 24); kept right (S = 0), it
    equals acc + 0 rounded (exact; +0 for a zero). An infinite accumulator stays either way."""
    if params.grid_fraction_bits is None:
        return None
    low = span_bits(get_format(params.a_format))[1] + span_bits(get_format(params.b_format))[1]
    fraction, left = params.grid_fraction_bits, params.grid_max_left_shift
    return max(fraction - left - 149, -149 - low)


def _fused_grid_starts(params, trees):
    """((T, 2) first position and scale block of each tree, products per tree, 2^(low + 53)
    with low the exponent of the formats' least product step) when every grid tree
    (``grid_trees``'s, with blocks) has 8 or 16 products and every tree sum lies below a
    quarter of the left pass-through limit, |S| < 2^(X + L - n + 22)
    (``_tree_kernels.grid_trees8``' and ``grid_trees16``' conditions), else None. Not for
    nearest even, whose trees of 8 take ``rne_trees8`` and whose float32 tree sums (FP4)
    take float32 additions (``_grid_tile``), both faster."""
    rounding = params.accumulator_rounding
    if trees is None or rounding not in ROUNDING_CHOICES or rounding == "nearest_even":
        return None
    terms = {last - first for first, last, _ in trees}
    if len(terms) != 1 or terms.isdisjoint({8, 16}):
        return None
    (high_a, low_a), (high_b, low_b) = (
        span_bits(get_format(f)) for f in (params.a_format, params.b_format)
    )
    high = high_a + high_b + 2 + math.ceil(math.log2(params.fused_terms))
    if high > params.grid_max_left_shift - params.grid_fraction_bits + 22:
        return None
    starts = np.array([(first, blk) for first, _, blk in trees], dtype=np.int64)
    return starts.reshape(-1, 2), terms.pop(), 2.0 ** (low_a + low_b + 53)


def _grid_trees_tile(a, b, row_steps, column_steps, fused, acc, grid, choices, span) -> None:
    """acc (g, r, n fp32) = each tree's step of the grid (``grid``: n, L, R) in turn, fused
    (``_tree_kernels.grid_trees8`` for trees of 8, ``grid_trees16`` for 16): the tile's
    blocks lie at or above ``grid_floor``. Trees of 16 float32 products (``span``: their
    sums' bounds) whose elements times their steps and scaled sums are all float32s take
    ``trees16_fp32``."""
    from ._tree_kernels import COLUMNS, grid_trees8, grid_trees16, trees16_fp32

    trees, terms, exact_factor = fused
    running = np.ascontiguousarray(acc)
    keep_factor = 2.0 ** (int(grid[1]) - int(grid[0]) + 24)
    work = np.empty((18, COLUMNS))
    b = np.ascontiguousarray(b)
    if terms == 8:  # the accumulators in float64 while the kernel runs
        limits, wide = (keep_factor, exact_factor), running.astype(np.float64)
        spare = np.empty_like(wide)
        grid_trees8(a, b, trees, row_steps, column_steps, limits, choices, wide, spare, work)
        running[...] = wide
    elif (
        span is not None
        and a.dtype == b.dtype == np.float32
        and _fp32_exact_blocks(row_steps, column_steps, span).all()
        and _times_steps_fit_fp32(a, row_steps)
        and _times_steps_fit_fp32(b, column_steps)
    ):
        rows32, columns32 = row_steps.astype(np.float32), column_steps.astype(np.float32)
        trees16_fp32(a, b, trees, rows32, columns32, keep_factor, choices, running, work)
    else:
        grid_trees16(a, b, trees, row_steps, column_steps, keep_factor, choices, running, work)
    acc[...] = running


def _times_steps_fit_fp32(values, steps) -> bool:
    """Whether every element of ``values`` (g, n, K, float32) times any of the steps
    (blocks, g, n, powers of two at least 2^-127) stays below 2^128: a float32, exact
    (subnormal results of elements of a few bits above 2^-127 steps are exact too)."""
    largest = float(np.abs(values).max(initial=0.0)) * float(steps.max(initial=1.0))
    return largest < 2.0**127


def _eight_term_trees(params, dtype, padded: int, trees, floor, block: int):
    """(T, 2) first position and scale block of each tree when every tree has 8 float64
    products and rounds as RNE_fp32(acc + S): trees of fused_terms (``trees`` None: no grid)
    or a nearest-even grid's (``floor`` not None; checked per tile); else None."""
    if dtype != np.float64 or params.accumulator_format == "exact":
        return None
    if trees is None:
        if params.fused_terms != 8:
            return None
        trees = [(first, first + 8, first // block) for first in range(0, padded, 8)]
    elif floor is None:
        return None
    if any(last - first != 8 for first, last, _ in trees):
        return None
    return np.array([(first, blk) for first, _, blk in trees], dtype=np.int64).reshape(-1, 2)


def _tree8_tile(a, b, row_steps, column_steps, trees, acc, start=None) -> None:
    """acc (g, r, n fp32) = RNE_fp32(acc + S) for each tree (``trees``: first position,
    block) of 8 products of a (g, r, padded) and b (g, n, padded), fused
    (``_tree_kernels.rne_trees8``); steps (blocks, g, r) and (blocks, g, n). ``start``:
    None, or the one value every element of ``acc`` starts from (then written to it here:
    ``acc`` need not hold it, and its values are not read)."""
    from ._tree_kernels import COLUMNS, PACKED_PAD, rne_trees8

    packed = np.empty((8, COLUMNS + PACKED_PAD))
    rows, columns = acc.shape[1:]
    if columns < min(rows, COLUMNS):
        # Narrow outputs (P @ v: N = 64) computed transposed, A's rows as the kernel's
        # columns: its per-row work is spread over more columns a pass. Exact alike: the
        # products and their sums are exact in any order.
        if start is None:
            running = np.ascontiguousarray(acc.transpose(0, 2, 1))
        else:  # (a transposed copy reads acc column by column: slow)
            running = np.full(acc.shape[:1] + acc.shape[:0:-1], start, dtype=np.float32)
        spare = np.empty_like(running)
        b = np.ascontiguousarray(b)
        rne_trees8(b, a, trees, column_steps, row_steps, running, spare, packed)
        acc[...] = running.transpose(0, 2, 1)
        return
    if start is not None:
        acc[...] = start
    running = np.ascontiguousarray(acc)
    spare = np.empty_like(running)
    rne_trees8(a, np.ascontiguousarray(b), trees, row_steps, column_steps, running, spare, packed)
    acc[...] = running


def zero_block_mask(values, blocks: int) -> np.ndarray:
    """(blocks, g, n) bool: whether each of the ``blocks`` equal blocks of the (g, n, padded)
    ``values`` holds only zeros."""
    nonzero = values.reshape(values.shape[:2] + (blocks, -1)) != 0  # (-0 == 0)
    return ~nonzero.any(axis=-1).transpose(2, 0, 1)  # (any of bools: a byte an element, not eight)


def _least_scale_sums(row_steps, column_steps, zero_rows, zero_columns) -> np.ndarray:
    """Per scale block, 2^(its least scale exponent sum) over the tile's rows and columns
    (steps (blocks, g, r) and (blocks, g, n)). Rows (columns) whose block holds only zeros
    (``zero_rows`` (blocks, g, r), ``zero_columns`` (blocks, g, n): ``zero_block_mask`` of the
    tile's operands) are left out (+inf where all are): they add S = 0 to every output of
    theirs, which the grid's rules and RNE_fp32(acc + S) keep alike at any X for an
    accumulator other than -0."""
    blocks = row_steps.shape[0]
    least = np.ones(blocks)
    for steps, zero in ((row_steps, zero_rows), (column_steps, zero_columns)):
        least *= np.where(zero, np.inf, steps).reshape(blocks, -1).min(axis=1, initial=np.inf)
    return least


def _above_floor(least, floor: int) -> np.ndarray:
    """Per scale block, whether its least scale exponent sum (``least``:
    :func:`_least_scale_sums`), and every earlier block's, is at least ``floor``
    (``grid_nearest_even_floor`` or ``grid_floor``; an earlier block below it may have left a
    -0)."""
    return np.logical_and.accumulate(least >= 2.0**floor)


def _grid_tile(
    a, b, row_steps, column_steps, trees, acc, grid, choices, plain=None, span=None
) -> None:
    """acc (g, r, n fp32) = its values with each tree's exact sum added by the grid's rules
    (``_blas_kernels.accumulate_grid_fp32``) in tree order: tree (first, last, block)'s unscaled sums are
    a (g, r, padded)[..., first:last] times b (g, n, padded)'s, one GEMM, its scales those of
    ``block`` (steps (blocks, g, r) and (blocks, g, n)). Blocks marked in ``plain`` (per
    block: ``_above_floor`` of the tile, its least scale exponent sum and every earlier
    block's at least the grid's floor; None: none) take the plain RNE_fp32(acc + S)
    (``_blas_kernels.accumulate_rne_fp32``, or ``_blas_kernels.accumulate_fp32`` where, with ``span``, the scaled sums
    are float32s: ``_fp32_exact_blocks``)."""
    running = np.ascontiguousarray(acc)
    sums = np.empty(acc.shape, dtype=a.dtype)
    narrow = None
    if plain is not None:
        if span is not None:
            narrow = _fp32_exact_blocks(row_steps, column_steps, span)
            row_steps32 = row_steps.astype(np.float32)
            column_steps32 = column_steps.astype(np.float32)
    for first, last, blk in trees:
        np.matmul(a[..., first:last], b[..., first:last].transpose(0, 2, 1), out=sums)
        if plain is None or not plain[blk]:
            accumulate_grid_fp32(running, sums, row_steps[blk], column_steps[blk], grid, choices)
        elif narrow is not None and narrow[blk]:
            accumulate_fp32(running, sums, row_steps32[blk], column_steps32[blk])
        else:
            accumulate_rne_fp32(running, sums, row_steps[blk], column_steps[blk])
    acc[...] = running


def _kulisch_tile(
    params, a, b, exponents_a, exponents_b, block: int, acc, origin, macs: int, one_range=False
) -> list[tuple[int, int, int]]:
    """acc (g, r, n fp32) = RNE_fp32(acc + the exact sum of every product) of a (g, r, padded)
    by b (g, n, padded): per range of blocks that float64 sums exactly, GEMMs of at most
    ``macs`` multiply-adds summed in float64 (partial sums of the range: exact), the ranges
    added in two float64s; returns the (group, row, column) outputs, offset by ``origin``,
    whose exact sum needed more than two float64s (``one_range``: all of K is known to be
    one range, without reading the exponents). When all of K is one range, its exact
    sum S is added as a tree's is, RNE_fp32(acc + S) (``_blas_kernels.accumulate_rne_fp32``: what the two
    float64s give when the second holds only acc + S's rounding error)."""
    together, height, padded = a.shape
    blocks = padded // block
    if exponents_a is None:  # every product at scale 1
        exponents_a = exponents_b = np.zeros((1, blocks), np.int64)
    if one_range:  # (the whole batch's blocks are one range: so are any tile's)
        chunks = [(0, blocks)]
    else:
        chunks = _exact_chunks(params, exponents_a, exponents_b, block)
    columns = acc.shape[-1]
    depth = max(block, macs // (together * height * columns) // block * block)
    sums = np.empty(acc.shape)
    part = np.empty_like(sums)
    b_columns = b.transpose(0, 2, 1)  # (g, padded, n)
    if len(chunks) == 1:  # all of K one exact float64 sum S: acc + S rounds once, as a tree
        _range_sums(a, b_columns, chunks[0][0] * block, chunks[0][1] * block, depth, sums, part)
        running = np.ascontiguousarray(acc)
        unit_rows, unit_columns = np.ones((together, height)), np.ones((together, columns))
        accumulate_rne_fp32(running, sums, unit_rows, unit_columns)  # steps 2^0: S itself
        if running is not acc:
            acc[...] = running
        return []
    shape = (together * height, columns)
    high = acc.astype(np.float64).reshape(shape)
    low = np.zeros(shape)
    inexact = np.zeros(shape, dtype=np.bool_)
    flagged = 0
    for first, last in chunks:
        _range_sums(a, b_columns, first * block, last * block, depth, sums, part)
        flagged += accumulate_double_double(high, low, inexact, sums.reshape(shape))
    rounded = np.empty(shape, dtype=np.float32)
    round_double_double_to_fp32(high, low, rounded)
    acc[...] = rounded.reshape(acc.shape)
    if not flagged:
        return []
    g0, r0, c0 = origin
    g, i, j = np.nonzero(inexact.reshape(acc.shape))
    return [(g0 + int(x), r0 + int(y), c0 + int(z)) for x, y, z in zip(g, i, j)]


def _range_sums(a, b_columns, k0: int, k1: int, depth: int, sums, part) -> None:
    """sums (g, r, n float64) = a (g, r, padded)[..., k0:k1] times b_columns (g, padded,
    n)[:, k0:k1], in GEMMs of at most ``depth`` positions added in float64 (``part``: their
    scratch); exact where the range's products and partial sums are (``_exact_chunks``)."""
    for k in range(k0, k1, depth):
        stop = min(k + depth, k1)
        np.matmul(a[..., k:stop], b_columns[:, k:stop], out=part if k > k0 else sums)
        if k > k0:
            sums += part
