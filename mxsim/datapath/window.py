"""The vectorised route for truncating-window units (``_window_kernels``): which units and
formats may take it, and its drivers.

The route computes exactly what the generic kernel computes; :func:`window_applies` admits
only parameter values whose semantics the window kernels implement (each key of
``datapath.schema.SCHEMA`` declares them, ``window=``; a key that declares nothing refuses
the route) and only element formats for which the kernels' arithmetic is exact
(:func:`_format_tables`). Outputs the kernels flag (NaN/Inf inputs, NaN scales, c
non-finite or -0, values leaving the normal range of the accumulator or output format) are
the caller's to recompute with the generic kernel.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numba
import numpy as np

from .._threads import run_in_threads
from ..formats import get_format
from ..formats.bits import odd_part_bits
from ..formats.rounding import rounding_code
from . import _window_kernels as W
from .schema import NO_ZERO_TERM_EXPONENT, DatapathParams, route_accepts
from .tables import element_tables, sum_format

MAX_WINDOW_BITS = 29  # a truncated term is below 2^(W + 2) <= 2^31: one float32 -> int32 conversion
MAX_SCALE_SHIFT = 254  # |Xa + Xb| of two E8M0 scales
MAX_SUM_BITS = 51  # round_bits is exact on a round-to-odd float64 for n + 2 <= 53
#: Formats up to this many field bits get per-code tables (tf32's 19: 2^19 entries).
TABLE_BITS = 19
NARROW_EXPONENTS = 60  # a format's own tables serve where every exponent lies within ±this
# A wide format's elements (exponents beyond ±NARROW_EXPONENTS: bf16, tf32) take the route times
# 2^-offset, one offset per operand and call (the largest exponent of its finite nonzero
# elements less WIDE_HIGH, within ±WIDE_OFFSET_LIMIT so that two sum to at most
# MAX_SCALE_SHIFT), the offsets entering every tree as a block-scale shift: exponents e -
# offset in [WIDE_LOW, WIDE_HIGH] keep the int8 sums exact (a zero's ZERO_EXPONENT plus
# WIDE_HIGH stays below 2 WIDE_LOW) and the products in float32's normal range. An element
# below the band makes its row (or column) unusable: the generic kernel computes its outputs.
WIDE_LOW, WIDE_HIGH = -1, 60
WIDE_OFFSET_LIMIT = 127
NO_EXPONENT = -(1 << 15)  # a wide format's exponent table entry for zeros and non-finite codes


# No kept tiles of B (window_matmul without a memo): read-only as the kept ones are.
def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


_NO_TILES = (
    _read_only(np.zeros((0, 0, 0, 0), dtype=np.float32)),
    _read_only(np.zeros((0, 0, 0, 0), dtype=np.int8)),
)


@dataclasses.dataclass(frozen=True)
class _Tables:
    values: np.ndarray  # float32 value per code, 0 where not finite
    exponents: (
        np.ndarray
    )  # int8 alignment exponent per code, ZERO_EXPONENT for zeros and non-finite codes
    finite: np.ndarray  # bool per code
    non_finite: tuple[int, int]  # (mask, pattern): non_finite_codes
    significand_bits: int  # widest significand of a finite nonzero value
    low: int  # smallest alignment exponent of a finite nonzero value
    high: int  # largest
    smallest: float  # smallest finite nonzero magnitude
    largest: float
    wide: bool = False  # a wide format's (its values times 2^-offset): _operand_tables


@functools.lru_cache(maxsize=None)
def _format_tables(fmt_name: str, subnormals: bool) -> _Tables | None:
    """The window kernels' per-code tables of an element format (read-only: kept per format),
    or None if they cannot hold it."""

    if get_format(fmt_name).field_bits > TABLE_BITS:
        return None  # no per-code table (and products too wide for float32 anyway)
    values, exponents = element_tables(get_format(fmt_name), subnormals)
    finite = np.isfinite(values)
    usable = finite & (values != 0)
    if not usable.any():
        return None
    magnitudes = np.abs(values[usable])
    significand_bits = _format_significand_bits(fmt_name, subnormals)
    low, high = int(exponents[usable].min()), int(exponents[usable].max())
    values32 = np.where(finite, values, 0.0).astype(np.float32)
    if (values32[finite] != values[finite]).any():
        return None
    if low < -NARROW_EXPONENTS or high > NARROW_EXPONENTS:
        return _offset_tables(fmt_name, subnormals, 0)  # what every offset's tables guarantee
    exponents8 = np.where(usable, exponents, W.ZERO_EXPONENT).astype(np.int8)
    return _Tables(
        _read_only(values32),
        _read_only(exponents8),
        _read_only(finite),
        non_finite_codes(finite),
        significand_bits,
        low,
        high,
        float(magnitudes.min()),
        float(magnitudes.max()),
    )


@functools.lru_cache(maxsize=64)  # (tf32's take 3 MB each; a model's activations, a few offsets)
def _offset_tables(fmt_name: str, subnormals: bool, offset: int) -> _Tables:
    """A wide format's tables at ``offset``: each value times 2^-offset (float32, exact)
    and its exponent less ``offset``, codes whose exponent then leaves [WIDE_LOW, WIDE_HIGH]
    (and non-finite ones) not finite for the route (``finite``: the usable codes, zeros
    among them); the range fields are the band's, which every offset keeps."""
    values, exponents = element_tables(get_format(fmt_name), subnormals)
    shifted = exponents - offset
    nonzero = np.isfinite(values) & (values != 0)
    usable = nonzero & (shifted >= WIDE_LOW) & (shifted <= WIDE_HIGH)
    values32 = np.where(usable, np.ldexp(np.where(usable, values, 0.0), -offset), 0.0)
    return _Tables(
        _read_only(values32.astype(np.float32)),
        _read_only(np.where(usable, shifted, W.ZERO_EXPONENT).astype(np.int8)),
        _read_only(usable | (values == 0)),
        (0, 1),  # (not read: a wide operand's unusable rows come from ``finite``)
        _format_significand_bits(fmt_name, subnormals),
        WIDE_LOW,
        WIDE_HIGH,
        2.0**WIDE_LOW,
        2.0 ** (WIDE_HIGH + 1),
        wide=True,
    )


@functools.lru_cache(maxsize=None)
def _format_significand_bits(fmt_name: str, subnormals: bool) -> int:
    """The widest significand (bits from the leading to the lowest set one) of the format's
    nonzero finite values as the unit reads them."""
    values = element_tables(get_format(fmt_name), subnormals)[0]
    magnitudes = np.abs(values[np.isfinite(values) & (values != 0)])
    mantissas, _ = np.frexp(magnitudes)
    return max(odd_part_bits(v) for v in np.unique((mantissas * 2.0**53).astype(np.int64)).tolist())


@functools.lru_cache(maxsize=None)
def _wide_exponents(fmt_name: str, subnormals: bool) -> np.ndarray:
    """int16 alignment exponent of each finite nonzero code of a wide format (NO_EXPONENT
    for the others): what an operand's offset is found from."""
    values, exponents = element_tables(get_format(fmt_name), subnormals)
    nonzero = np.isfinite(values) & (values != 0)
    return _read_only(np.where(nonzero, exponents, NO_EXPONENT).astype(np.int16))


def _operand_tables(params: DatapathParams, fmt_name: str, tables: _Tables, codes, scales):
    """(tables, scales) of one operand (codes and scales with rows on the same leading
    axes): a narrow format's own; a wide format's tables at this operand's offset and
    scales that carry it (their ``finite``: the usable codes)."""
    if not tables.wide:
        return tables, scales
    offset = operand_offset(params, fmt_name, codes)
    tables = _offset_tables(fmt_name, params.input_subnormals, offset)
    return tables, np.full(scales.shape, offset, dtype=np.int32)


def _unusable_rows(tables: _Tables, codes, scales, scaled: bool) -> np.ndarray:
    """(G, rows) bools: rows holding a code the route cannot take: a wide format's outside
    the band or non-finite (a lookup of its tables), else ``_window_kernels.unusable_rows``'
    mask test (non-finite codes, NaN scales)."""
    if tables.wide:
        return ~tables.finite[codes].all(axis=-1)
    return W.unusable_rows(codes, scales, *tables.non_finite, scaled)


def product_overflow_possible(params: DatapathParams, a: _Tables, b: _Tables, scales_a, scales_b):
    """Whether a product of this call's operands may reach the unit's
    ``multiplier.overflow_exponent`` where a format is wide (its outputs are then the generic
    kernel's): an operand's largest exponent is at most its tables' ``high`` plus, for a wide
    one, its offset (its scales' value), and two magnitudes below 2^(top + 1) multiply to
    below 2^(top_a + top_b + 2). Narrow formats are bounded once (:func:`_window_config`)."""
    limit = params.product_overflow_exponent
    if limit is None or not (a.wide or b.wide):
        return False

    def top(tables: _Tables, scales) -> int:
        offset = int(scales.flat[0]) if tables.wide and scales.size else 0
        return tables.high + offset

    return top(a, scales_a) + top(b, scales_b) + 2 > limit


def operand_offset(params: DatapathParams, fmt_name: str, codes) -> int:
    """The offset of an operand of a wide format (its codes, any shape): the largest
    exponent of its finite nonzero elements less WIDE_HIGH, within ±WIDE_OFFSET_LIMIT (0
    for an operand without such elements)."""
    top = int(_wide_exponents(fmt_name, params.input_subnormals)[codes].max(initial=NO_EXPONENT))
    offset = 0 if top == NO_EXPONENT else top - WIDE_HIGH
    return min(max(offset, -WIDE_OFFSET_LIMIT), WIDE_OFFSET_LIMIT)


def non_finite_codes(finite: np.ndarray) -> tuple[int, int]:
    """(mask, pattern) such that the codes c with c & mask == pattern are exactly the codes
    that ``finite`` marks False (IEEE-style formats: the all-ones exponent field; OCP E4M3:
    the all-ones exponent and mantissa), else a superset of them: the bits all non-finite
    codes share. A superset is still sound (a row it marks is flagged, its outputs computed
    by the generic kernel), only slower. No non-finite codes: a pattern no code matches."""
    codes = np.flatnonzero(~finite)
    if codes.size == 0:
        return 0, 1
    common = int(np.bitwise_and.reduce(codes))
    varying = int(np.bitwise_or.reduce(codes)) ^ common
    mask = (finite.size - 1) & ~varying  # (tables have 2^bits entries)
    return mask, common & mask


def window_applies(params: DatapathParams) -> bool:
    """Whether this unit and format pair may take the window route: every key's value is one
    the kernels model (each key's ``window`` declaration in ``datapath.schema``), the window
    and the n-bit sum fit their arithmetic, and so do the formats (module docstring)."""
    return (
        route_accepts("window", params)
        and params.align_fraction_bits <= MAX_WINDOW_BITS
        and (params.sum_significant_bits or 0) <= MAX_SUM_BITS
        and _window_config(params) is not None
    )


@functools.lru_cache(maxsize=None)
def _window_config(params: DatapathParams):
    """(config vector, A tables, B tables), or None where the kernels' arithmetic is not exact."""
    a = _format_tables(params.a_format, params.input_subnormals)
    b = _format_tables(params.b_format, params.input_subnormals)
    if a is None or b is None:
        return None
    # Promotion adds fp32 accumulators by binary32 arithmetic, and c enters them unrounded;
    # c added at the end is such an add, once (tree_end_config).
    c_at_end = params.c_entry == "end"
    if (params.promotion_interval or c_at_end) and params.accumulator_format != "fp32":
        return None
    if c_at_end and params.c_add_rounding != "nearest_even":
        return None
    if params.parity_windows and (params.promotion_interval or c_at_end):
        return None  # (the kernels promote after whole windows: half a parity tree)
    wide = a.wide or b.wide  # (its offsets take the block scales' place)
    if wide and params.scales != "none":
        return None
    # A tree order reorders runs inside blocks (in_tree_order): the trees' scales stay theirs.
    order = tree_order(params)
    if order is not None and params.block_size % len(order):
        return None
    window = params.align_fraction_bits
    fused = params.fused_terms
    # Products exact in float32: significands fit 24 bits, magnitudes within its normal range.
    if a.significand_bits + b.significand_bits > 24:
        return None
    if not (a.smallest * b.smallest >= 2.0**-126 and a.largest * b.largest < 2.0**127):
        return None
    # A product overflow no product of two narrow formats reaches (wide ones: per call,
    # product_overflow_possible).
    overflow = params.product_overflow_exponent
    narrow = not (a.wide or b.wide)
    if overflow is not None and narrow and not a.largest * b.largest < 2.0**overflow:
        return None
    # int8 exponent sums: sums with a zero element stay below every sum of two nonzero ones.
    threshold = W.ZERO_EXPONENT + max(a.high, b.high) + 1
    if a.low + b.low < threshold or a.high + b.high > 127:
        return None
    # Tree sums (the accumulator's truncation included) below 2^53: exact in float64.
    if (fused + 1) * 2 ** (window + 2) > 2**53:
        return None
    acc = get_format(params.accumulator_format)
    # Every tree sum lies inside the n-bit sum format's normal range (its rounding is then bit arithmetic).
    shift = MAX_SCALE_SHIFT if params.scales != "none" or wide else 0
    lowest = min(a.low + b.low - shift, 1 - acc.bias) - window
    highest = max(a.high + b.high + shift, acc.emax + 1) + 2 + math.ceil(math.log2(fused + 1))
    sums = sum_format(params.sum_significant_bits or 24)
    if lowest < 1 - sums.bias or highest >= sums.emax:
        return None
    cfg = tree_end_config(params)
    cfg[W.W_FLOAT32_ADD] = float32_addition(params, a, b)
    # The kernels' trees are the unit's windows: half a tree each under parity windows.
    terms = fused // 2 if params.parity_windows else fused
    cfg[W.W_FUSED_TERMS] = terms
    cfg[W.W_GROUP] = min(
        terms, 2 ** (MAX_WINDOW_BITS - window)
    )  # |group sum| < group * 2^(W+2) <= 2^31
    cfg[W.W_BLOCK_SIZE] = params.block_size
    cfg[W.W_THRESHOLD] = threshold
    cfg[W.W_SCALED] = params.scales != "none" or wide
    cfg.setflags(write=False)
    return cfg, a, b


@functools.lru_cache(maxsize=None)
def tree_order(params: DatapathParams) -> tuple[int, ...] | None:
    """The order in which the route takes each run of positions: ``adder.term_order``, or
    under ``adder.parity_windows`` a tree's even positions then its odd ones (so that each
    half of a tree is one window of the kernels: ``_window_kernels.join_halves``); None for
    k order (the schema refuses the route to a unit with both)."""
    if params.parity_windows:
        terms = params.fused_terms
        return tuple(range(0, terms, 2)) + tuple(range(1, terms, 2))
    return params.term_order


def in_tree_order(params: DatapathParams, codes: np.ndarray) -> np.ndarray:
    """``codes`` (..., K) with K in the order the unit's trees take the products: each run of
    T = len(:func:`tree_order`) positions reordered by it (a copy), or ``codes`` itself
    where the unit takes k order. A K short of a multiple of T is padded with zero codes,
    where the generic kernel leaves empty positions: the same sums, as a zero term's
    exponent raises no tree's reference (or half's) the route keeps unflagged. T divides
    the block size (:func:`_window_config`), so the padding stays inside the last block."""
    order = tree_order(params)
    if order is None:
        return codes
    period = len(order)
    padding = -codes.shape[-1] % period
    if padding:
        codes = np.concatenate(
            [codes, np.zeros((*codes.shape[:-1], padding), dtype=codes.dtype)], axis=-1
        )
    index = (np.arange(0, codes.shape[-1], period)[:, None] + np.asarray(order)).reshape(-1)
    return np.ascontiguousarray(codes[..., index])


def tree_end_config(params: DatapathParams) -> np.ndarray:
    """A writable configuration vector with the fields that :func:`_window_kernels.start_accumulators`,
    ``finish_tree`` and ``encode_outputs`` read: window, accumulator in the tree, the n-bit
    sum, the accumulator and output formats and roundings, the zero-term exponent."""
    acc = get_format(params.accumulator_format)
    out = get_format(params.output_format)
    cfg = np.zeros(W.N_WINDOW_CONFIG, dtype=np.int64)
    cfg[W.W_WINDOW_BITS] = params.align_fraction_bits
    cfg[W.W_ACC_IN_TREE] = params.accumulator_in_tree
    cfg[W.W_SUM_BITS] = params.sum_significant_bits or 0
    cfg[W.W_SUM_ROUNDING] = rounding_code(params.sum_rounding)
    cfg[W.W_ACC_BITS] = acc.mantissa_bits + 1
    cfg[W.W_ACC_ROUNDING] = rounding_code(params.accumulator_rounding)
    cfg[W.W_ACC_MIN_EXPONENT] = 1 - acc.bias
    cfg[W.W_ACC_MAX_EXPONENT] = acc.emax
    cfg[W.W_OUT_BITS] = out.mantissa_bits + 1
    cfg[W.W_OUT_ROUNDING] = rounding_code(params.output_rounding)
    cfg[W.W_OUT_MIN_EXPONENT] = 1 - out.bias
    cfg[W.W_OUT_MAX_EXPONENT] = out.emax
    cfg[W.W_OUT_MANTISSA_BITS] = out.mantissa_bits
    cfg[W.W_OUT_BIAS] = out.bias
    cfg[W.W_OUT_SIGN_SHIFT] = out.bits - 1
    cfg[W.W_ZERO_FLOOR] = (
        NO_ZERO_TERM_EXPONENT if params.zero_term_exponent is None else params.zero_term_exponent
    )
    cfg[W.W_PROMOTION] = params.promotion_interval or (
        W.PROMOTION_AT_END if params.c_entry == "end" else 0
    )
    cfg[W.W_SECOND_ALIGNMENT] = (
        0 if params.second_alignment_bits is None else params.second_alignment_bits + 1
    )
    cfg[W.W_FAR_DROPPED] = params.far_accumulator == "zero"
    cfg[W.W_PARITY] = params.parity_windows
    return cfg


def float32_addition(params: DatapathParams, a: _Tables, b: _Tables) -> bool:
    """Whether each tree's n-bit sum joins the accumulator as exactly one IEEE float32
    addition (``_window_kernels._finish_lanes_float32``): the accumulator lies outside the
    tree, has binary32's precision (24 bits) and normal exponents (-126..127) and rounds to
    nearest even, and the n-bit sum has at most 24 bits, truncates, and is 0 or a normal
    float32 for every pair of formats ``a`` and ``b`` and scale: its nonzero values are at
    least the window's LSB 2^(R - W), and below fused * 2^(R + 2) (truncation only lowers
    them), R the tree's exponent sum plus scale."""
    acc = get_format(params.accumulator_format)
    shift = MAX_SCALE_SHIFT if params.scales != "none" or a.wide or b.wide else 0
    window, fused = params.align_fraction_bits, params.fused_terms
    return (
        not params.accumulator_in_tree
        and 0 < (params.sum_significant_bits or 0) <= 24
        and params.sum_rounding == "toward_zero"
        and acc.mantissa_bits + 1 == 24
        and 1 - acc.bias == -126
        and acc.emax == 127
        and params.accumulator_rounding == "nearest_even"
        and a.low + b.low - shift - window >= -126
        and a.high + b.high + shift + 2 + math.ceil(math.log2(fused)) <= 127
    )


def window_matmul(
    params: DatapathParams,
    codes_a,
    codes_b,
    scales_a,
    scales_b,
    c_values,
    out,
    memo: dict | None = None,
):
    """Fill ``out`` (G, M, N) with the output bits of the batch of GEMMs A[g] (M, K) times
    B[g] given as (N, K) (codes and scales (G, rows, ...), ``c_values`` (G, M, N) or
    (1, 1, 1)); returns the (groups, rows, columns) index arrays of the outputs the generic
    kernel must compute.

    Work items are column tiles of one group, ``LANES`` columns or fewer (N split evenly),
    each decoding its B tile once (``_window_kernels.window_items``); rows are split into
    chunks of row blocks only as far as it takes to give each of Numba's thread count of
    Python threads work (``_threads.run_in_threads``: a ``prange`` loop compiles as a second,
    parallel kernel). The split does not change the result.

    ``memo``: None, or a dict kept with this B (its codes and scales unchanged from call to
    call, as ``matmul_batched``'s ``b_memo``): B's decoded tiles and its rows' usability are
    kept there under ("window", term order) (5 bytes per element of B, a little more where N
    is not a multiple of the tile width; for a wide format, its offset's tables and scales
    too), and later calls read them instead of decoding B again."""
    cfg, a, b = _window_config(params)
    codes_a = in_tree_order(params, codes_a)
    scaled = bool(cfg[W.W_SCALED])
    flags = np.empty(out.shape, dtype=np.uint8)
    n_groups, n_rows = codes_a.shape[0], codes_a.shape[1]
    n_columns = codes_b.shape[1]
    n_tiles = max(1, -(-n_columns // W.LANES))
    width = max(1, -(-n_columns // n_tiles))
    key = ("window", tree_order(params))  # B's tiles in the trees' order
    kept = None if memo is None else memo.get(key)
    if kept is None:  # (kept tiles are in the trees' order already: B is reordered once)
        codes_b = in_tree_order(params, codes_b)
        b, scales_b = _operand_tables(params, params.b_format, b, codes_b, scales_b)
        bad_columns = _unusable_rows(b, codes_b, scales_b, scaled)
        kept = (bad_columns, *_NO_TILES, b, scales_b)
        if memo is not None:
            tiles = W.decode_tiles(codes_b, b.values, b.exponents, width)
            for array in tiles:
                array.setflags(write=False)  # one kernel signature with _NO_TILES
            kept = memo[key] = (bad_columns, *tiles, b, scales_b)
    bad_columns, kept_values, kept_exponents, b, scales_b = kept
    a, scales_a = _operand_tables(params, params.a_format, a, codes_a, scales_a)
    bad_rows = _unusable_rows(a, codes_a, scales_a, scaled)
    if product_overflow_possible(params, a, b, scales_a, scales_b):
        bad_rows[...] = True
    n_blocks = -(-n_rows // W.ROW_BLOCK)
    threads = numba.get_num_threads()
    chunks = min(n_blocks, max(1, -(-2 * threads // max(1, n_tiles * n_groups))))
    blocks_per_chunk = -(-n_blocks // chunks)
    arguments = (
        codes_a,
        codes_b,
        scales_a,
        scales_b,
        c_values,
        a.values,
        a.exponents,
        b.values,
        b.exponents,
        bad_rows,
        bad_columns,
        kept_values,
        kept_exponents,
        cfg,
        out,
        flags,
        n_tiles,
        width,
        n_tiles * chunks,
        blocks_per_chunk,
    )
    run_in_threads(
        lambda start, stop: W.window_items(*arguments, start, stop), n_groups * n_tiles * chunks
    )
    return flagged_outputs(flags)


def flagged_outputs(flags: np.ndarray) -> tuple:
    """``np.nonzero(flags)``: the index arrays of the outputs a route flagged for the generic
    kernel, told first by ``any`` (the common case, none, 60x faster to tell than nonzero)."""
    if not flags.any():
        return tuple(np.empty(0, dtype=np.intp) for _ in range(flags.ndim))
    return np.nonzero(flags)


def window_dot(params: DatapathParams, codes_a, codes_b, scales_a, scales_b, c_values, out):
    """Fill ``out`` (n,) with row-wise dot products; returns the indices of the rows the
    generic kernel must compute. The rows are the lanes, ``LANES`` rows a work item
    (``_window_kernels.pair_items``), on Python threads as :func:`window_matmul`'s."""
    cfg, a, b = _window_config(params)
    codes_a, codes_b = in_tree_order(params, codes_a), in_tree_order(params, codes_b)
    # (a wide format's unusable codes are its tables' not-finite ones: the kernel finds them)
    a, scales_a = _operand_tables(params, params.a_format, a, codes_a, scales_a)
    b, scales_b = _operand_tables(params, params.b_format, b, codes_b, scales_b)
    if product_overflow_possible(params, a, b, scales_a, scales_b):
        return np.arange(out.shape[0])  # every row the generic kernel's
    flags = np.empty(out.shape, dtype=np.uint8)
    arguments = (
        codes_a,
        codes_b,
        scales_a,
        scales_b,
        c_values,
        a.values,
        a.exponents,
        a.finite,
        b.values,
        b.exponents,
        b.finite,
        cfg,
        out,
        flags,
    )
    run_in_threads(
        lambda start, stop: W.pair_items(*arguments, start, stop), -(-codes_a.shape[0] // W.LANES)
    )
    return np.nonzero(flags)[0]
