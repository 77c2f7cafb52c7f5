"""The group-sum route: units with ``inputs.scales: group_sum`` (Blackwell kind::mxf4 and
kind::mxf4nvf4: NVFP4, MXFP4) through one BLAS GEMM per group of products and a small
vectorised kernel (``_group_kernels``), bit-identical to the generic kernel where it applies.

The unit (``datapath._kernels.group_tree_terms``, then ``align_and_add``): each group of
``group_terms`` products (k order, inside one block and one tree) is summed exactly, g;
g * sa * sb is one term of alignment exponent ea + eb (the scale codes' exponents,
``tables.scale_tables``); an all-zero group or a zero scale is a zero term, a group whose
products cancel a term of value 0 that keeps ea + eb. The tree's reference R is the largest
term exponent, with the accumulator's exponent when it joins the tree, and at least
``zero_term_exponent`` when the tree holds a zero term (a zero accumulator in the tree
counts as one). Every term is truncated toward zero to a multiple of 2^(R - W), W =
``align_fraction_bits``, the integers summed, then rounded (n-bit sum, accumulator).

Why the route computes exactly that, with ha, hb the leading-bit exponents of the largest
element magnitudes and la, lb the exponents of the formats' smallest steps
(``blas.span_bits``), and G = ``group_terms``:

1. Group sums by BLAS. Every product is an integer multiple of 2^(la + lb) below
   2^(ha + hb + 2), so every partial sum of at most G of them, in any order and with or
   without fused multiply-adds, is a multiple of 2^(la + lb) below 2^S, S = ha + hb + 2 +
   ceil(log2 G): when S - la - lb <= 24 (and the values lie in float32's normal range) the
   float32 GEMM is exact, else when it is <= 53 the float64 GEMM, else the route is refused.
   (fp4_e2m1 x fp4_e2m1, G = 16: 8 + 4 = 12 bits, float32.) Non-finite elements are 0 in the
   tables and their rows and columns are flagged, as are NaN scales.
2. Zero terms. A group is a zero term exactly when every one of its products is 0 or a
   scale is zero: each operand's group carries a mask with bit i set where its i-th element
   is nonzero (cleared entirely where its scale is zero), and the products are all 0
   exactly when the two masks share no bit (a product of two nonzero table values is
   nonzero: they lie far inside float64's range). A group whose nonzero products cancel is
   no zero term: it keeps ea + eb, whatever its sum.
3. Terms. g has at most S - la - lb significant bits and each scale at most ``s`` (read from
   the scale table), so g * sa * sb is exact in float64 when S - la - lb + 2 s <= 53 and
   its magnitude stays normal (checked); multiplying by 2^(W - R) is exact, or gives a value
   below 1 whose truncation is 0 either way; ``trunc`` is the truncation toward zero. A
   nonzero scale s of exponent e lies below 2^(e + 1) (floor(log2 s), or emin for a
   subnormal scale), so |g sa sb| < 2^(S + E + 2), E = ea + eb <= R: every truncated term is
   an integer below 2^(S + W + 2), the accumulator's below 2^(W + 1), and a tree of T = F / G
   groups (F = ``fused_terms``) sums below (T + 1) 2^(S + W + 2) <= 2^53 (checked): every
   partial sum of the truncated terms is exact in float64.
4. The tree's integer sum, R and the accumulator go to the window kernels' last stages
   (``_window_kernels.finish_tree``, ``start_accumulators``, ``encode_outputs``): the n-bit
   sum and the accumulator and output roundings exactly as the window route does them (see
   ``datapath.window``), flagging subnormals, overflow, -0 or non-finite c. The exponent
   range is checked so that 2^(W - R), 2^(R - W) and the tree sum stay normal float64s and
   inside the n-bit sum format.

Flagged outputs are the caller's to recompute with the generic kernel. Each key of
``datapath.schema.SCHEMA`` declares what the route accepts (``groups=``).
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
from . import _group_kernels as GK
from ._window_kernels import NO_REFERENCE
from .blas import span_bits
from .schema import DatapathParams, route_accepts
from .tables import element_tables, scale_tables, sum_format
from .window import flagged_outputs, tree_end_config

ROW_TILE = 16  # rows of A per batch of group GEMMs (their sums: groups x 16 x N values)
# A batch's group values of A formed at once up to this size (heads), else a tile at a time.
A_OPERAND_BYTES = 1 << 26
#: The most bytes a batch's group sums (batch x groups x rows x columns) may take to be formed
#: by one GEMM and read by one kernel call, as the small GEMMs of attention heads are.
SUMS_BYTES = 1 << 25
MAX_EXPONENT = (
    1000  # |2^(W - R)|, |2^(R - W)| and every tree sum stay inside float64's normal range
)


@dataclasses.dataclass(frozen=True)
class _Setup:
    dtype: type  # float32 or float64: the GEMM whose group sums are exact
    a_values: np.ndarray  # float64 value per code, 0 where not finite
    a_finite: np.ndarray
    b_values: np.ndarray
    b_finite: np.ndarray
    scale_values: np.ndarray  # float64 value per scale code, 0 for NaN
    scale_exponents: np.ndarray  # int32 alignment exponent per scale code
    scale_nan: np.ndarray  # bool per scale code
    cfg: np.ndarray  # the window kernels' configuration vector (tree end, accumulator, output)


def _significant_bits(values: np.ndarray) -> int:
    """The widest significand among finite nonzero float64 values."""
    mantissas = np.frexp(np.abs(values[np.isfinite(values) & (values != 0)]))[0]
    integers = (mantissas * 2.0**53).astype(np.int64).tolist()
    return max(odd_part_bits(v) for v in integers)


@functools.lru_cache(maxsize=None)
def _setup(params: DatapathParams) -> _Setup | None:
    """The route's tables (read-only), or None where its arithmetic is not exact (module
    docstring)."""
    group = params.group_terms
    if params.block_size % group or params.fused_terms % group or group > 32:
        return None  # (a group's nonzero elements are a uint32 mask)
    a_fmt, b_fmt, scale_fmt = (
        get_format(name) for name in (params.a_format, params.b_format, params.scale_format)
    )
    high_a, low_a = span_bits(a_fmt)
    high_b, low_b = span_bits(b_fmt)
    top = high_a + high_b + 2 + math.ceil(math.log2(group))  # |group sum| < 2^top
    sum_bits = top - low_a - low_b
    if sum_bits <= 24 and low_a + low_b >= -126 and top <= 127:
        dtype = np.float32
    elif sum_bits <= 53 and low_a + low_b >= -MAX_EXPONENT:
        dtype = np.float64
    else:
        return None
    scale_values, scale_exponents = scale_tables(scale_fmt)
    scale_nan = np.isnan(scale_values)
    finite_scales = scale_values[~scale_nan]
    if (finite_scales < 0).any() or not np.isfinite(finite_scales).all():
        return None
    usable = finite_scales > 0
    low_scale = int(scale_exponents[~scale_nan][usable].min())
    high_scale = int(scale_exponents[~scale_nan][usable].max())
    smallest_scale = (
        math.frexp(float(finite_scales[usable].min()))[1] - 1
    )  # below low_scale for subnormal scales
    if (
        sum_bits + 2 * _significant_bits(finite_scales) > 53
        or low_a + low_b + 2 * smallest_scale < -MAX_EXPONENT
    ):
        return None
    window = params.align_fraction_bits
    trees_bits = math.ceil(math.log2(params.fused_terms // group + 1))
    if trees_bits + top + window + 2 > 53:
        return None
    acc = get_format(params.accumulator_format)
    floor = params.zero_term_exponent
    low_r = min(2 * low_scale, 1 - acc.bias, floor if floor is not None else 0)
    high_r = max(2 * high_scale + 2, acc.emax + 1, floor if floor is not None else 0)
    lowest, highest = low_r - window, high_r + top + 2 + trees_bits
    sums = sum_format(params.sum_significant_bits or 24)
    if not (
        -MAX_EXPONENT <= lowest
        and highest <= MAX_EXPONENT
        and window - NO_REFERENCE <= MAX_EXPONENT
    ):
        return None
    if lowest < 1 - sums.bias or highest >= sums.emax:
        return None
    a_values, _ = element_tables(a_fmt, params.input_subnormals)
    b_values, _ = element_tables(b_fmt, params.input_subnormals)
    tables = (
        np.where(np.isfinite(a_values), a_values, 0.0),
        np.isfinite(a_values),
        np.where(np.isfinite(b_values), b_values, 0.0),
        np.isfinite(b_values),
        np.where(scale_nan, 0.0, scale_values),
        scale_exponents.astype(np.int32),
        scale_nan,
        tree_end_config(params),
    )
    for table in tables:
        table.setflags(write=False)  # (kept per params: every call shares them)
    return _Setup(dtype, *tables)


def groups_apply(params: DatapathParams) -> bool:
    """Whether this unit and format pair may take the group-sum route: every key's value is
    one the route computes exactly (each key's ``groups`` declaration in ``datapath.schema``)
    and the formats, scales and window fit its arithmetic (module docstring)."""
    return route_accepts("groups", params) and _setup(params) is not None


def _group_operand(setup: _Setup, values_table, codes, scales, params, n_groups):
    """(element values (rows, groups * G) in the GEMM's dtype, zero padded; per group: scale
    value, scale exponent (int32), and a uint32 mask whose bit i is set where the group's
    i-th element is nonzero, all bits clear where the scale is zero: a group's products are
    all zero exactly when the masks of its two operands share no bit)."""
    rows, length = codes.shape
    group = params.group_terms
    values = np.zeros((rows, n_groups * group), dtype=setup.dtype)
    values[:, :length] = values_table[codes]
    blocks = (np.arange(n_groups) * group) // params.block_size
    scale_codes = np.ascontiguousarray(scales[:, blocks])  # (C order: one kernel signature)
    scale_values = setup.scale_values[scale_codes]
    bits = np.left_shift(np.uint32(1), np.arange(group, dtype=np.uint32))
    masks = ((values.reshape(rows, n_groups, group) != 0) * bits).sum(axis=2, dtype=np.uint32)
    masks[scale_values == 0] = 0  # (distinct bits: their sum is their OR)
    return values, scale_values, setup.scale_exponents[scale_codes], masks


def _unusable(finite, codes, scale_nan, scales) -> np.ndarray:
    """Per row, whether it holds a non-finite element or a NaN scale (the elements are not
    looked at for a format whose every code is finite)."""
    bad = scale_nan[scales].any(axis=1)
    if not finite.all():
        bad |= ~finite[codes].all(axis=1)
    return bad


def _flat(array: np.ndarray) -> np.ndarray:
    """(batch, rows, n) as (batch * rows, n)."""
    return array.reshape(array.shape[0] * array.shape[1], array.shape[2])


def _b_operand(setup: _Setup, params, codes_b, scales_b, n_groups: int) -> tuple:
    """B's side of :func:`groups_matmul`: its group values as (batch, groups, G, N) GEMM
    operands, per group and column its scale value, exponent and mask (batch, groups, N), and
    its unusable columns (batch, N)."""
    n_batch, columns = codes_b.shape[:2]
    group = params.group_terms
    bad_columns = _unusable(setup.b_finite, _flat(codes_b), setup.scale_nan, _flat(scales_b))
    values_b, *per_group_b = _group_operand(
        setup, setup.b_values, _flat(codes_b), _flat(scales_b), params, n_groups
    )
    gemm_b = np.ascontiguousarray(
        values_b.reshape(n_batch, columns, n_groups, group).transpose(0, 2, 3, 1)
    )
    scale_b, exponents_b, mask_b = (
        np.ascontiguousarray(x.reshape(n_batch, columns, n_groups).transpose(0, 2, 1))
        for x in per_group_b
    )
    return gemm_b, scale_b, exponents_b, mask_b, bad_columns.reshape(n_batch, columns)


def groups_matmul(
    params: DatapathParams,
    codes_a,
    codes_b,
    scales_a,
    scales_b,
    c_values,
    out,
    progress=None,
    memo: dict | None = None,
):
    """Fill ``out`` (G, M, N) with the output bits of the batch of GEMMs A[g] (M, K) codes
    times B[g] given as (N, K) (scale codes per block, (G, rows, blocks); ``c_values``
    (G, M, N) or (1, 1, 1)); returns the (groups, rows, columns) index arrays of the outputs
    the generic kernel must compute. ``progress(rows_done, rows_total)``: rows of all
    groups, after each round of tiles.

    The operands' group values, scales and masks are formed once for the whole batch (A's
    too where they fit ``A_OPERAND_BYTES``; else a tile of rows at a time), then each tile of
    ``ROW_TILE`` rows of a group is one BLAS GEMM of its group sums and one kernel call.
    ``memo``: None, or a dict kept by the caller for one B (its codes and scales unchanged
    from call to call): B's group values, scales, masks and unusable columns are kept there
    (about 1.2 times B's elements in the GEMM's dtype) and later calls skip forming them."""
    setup = _setup(params)
    n_batch, rows, length = codes_a.shape
    group = params.group_terms
    n_groups = -(-length // group)
    flags = np.empty(out.shape, dtype=np.uint8)
    bad_rows = _unusable(setup.a_finite, _flat(codes_a), setup.scale_nan, _flat(scales_a)).reshape(
        codes_a.shape[:2]
    )
    kept = None if memo is None else memo.get("groups")
    if kept is None:
        kept = _b_operand(setup, params, codes_b, scales_b, n_groups)
        if memo is not None:
            memo["groups"] = kept
    gemm_b, scale_b, exponents_b, mask_b, bad_columns = kept
    whole_a = None
    if n_batch * rows * n_groups * group * np.dtype(setup.dtype).itemsize <= A_OPERAND_BYTES:
        whole_a = [
            x.reshape(n_batch, rows, *x.shape[1:])
            for x in _group_operand(
                setup, setup.a_values, _flat(codes_a), _flat(scales_a), params, n_groups
            )
        ]
    columns = codes_b.shape[1]
    cfg = (params.fused_terms // group, setup.cfg)
    if (
        whole_a is not None
        and progress is None
        and n_batch > 1
        and n_batch * n_groups * rows * columns * np.dtype(setup.dtype).itemsize <= SUMS_BYTES
    ):  # a batch of small GEMMs (attention heads): one GEMM of group sums, one kernel call
        values_a, scale_a, exponents_a, mask_a = whole_a
        group_sums = np.matmul(
            values_a.reshape(n_batch, rows, n_groups, group).transpose(0, 2, 1, 3), gemm_b
        )
        run_in_threads(
            lambda start, stop: GK.group_batch(
                group_sums,
                c_values,
                scale_a,
                exponents_a,
                mask_a,
                scale_b,
                exponents_b,
                mask_b,
                bad_rows,
                bad_columns,
                *cfg,
                out,
                flags,
                start,
                stop,
            ),
            n_batch,
        )
        return flagged_outputs(flags)
    n_tiles = -(-rows // ROW_TILE)

    def run_tiles(first, last):
        for item in range(first, last):
            run_tile(item // n_tiles, (item % n_tiles) * ROW_TILE)

    def run_tile(g, start):
        stop = min(start + ROW_TILE, rows)
        if whole_a is not None:
            values_a, scale_a, exponents_a, mask_a = (x[g, start:stop] for x in whole_a)
        else:
            values_a, scale_a, exponents_a, mask_a = _group_operand(
                setup,
                setup.a_values,
                codes_a[g, start:stop],
                scales_a[g, start:stop],
                params,
                n_groups,
            )
        group_sums = np.matmul(
            values_a.reshape(stop - start, n_groups, group).transpose(1, 0, 2), gemm_b[g]
        )
        GK.group_batch(  # (a batch of one: row ranges of C-ordered arrays are contiguous)
            group_sums[None],
            c_values if c_values.shape == (1, 1, 1) else c_values[g : g + 1, start:stop],
            scale_a[None],
            exponents_a[None],
            mask_a[None],
            scale_b[g : g + 1],
            exponents_b[g : g + 1],
            mask_b[g : g + 1],
            bad_rows[g : g + 1, start:stop],
            bad_columns[g : g + 1],
            *cfg,
            out[g : g + 1, start:stop],
            flags[g : g + 1, start:stop],
            0,
            1,
        )

    # Tiles on the kept threads (one thread: the calling one), a round of one tile a thread
    # between progress reports.
    items = n_batch * n_tiles
    per_round = max(1, items if progress is None else numba.get_num_threads())
    for first in range(0, items, per_round):
        last = min(first + per_round, items)
        run_in_threads(
            lambda start, stop, first=first: run_tiles(first + start, first + stop), last - first
        )
        if progress is not None:
            done = (last // n_tiles) * rows + min((last % n_tiles) * ROW_TILE, rows)
            progress(done, n_batch * rows)
    return flagged_outputs(flags)
