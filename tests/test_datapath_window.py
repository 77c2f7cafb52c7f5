"""The vectorised window route equals the generic kernel and the Fraction twin bit for bit."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conftest import REPO
from mxsim import get_format, quantize_mx as quantize
from mxsim.formats.rounding import rounding_code
from mxsim.quantize._kernels import SCALE_NAN
from mxsim.datapath import _window_kernels as W
from mxsim.datapath import load_hwconfig, matmul, matmul_batched
from mxsim.datapath.config import DatapathParams
from mxsim.datapath.api import (
    _kernel_arguments,
    _scales_for_unit,
    dot_with_params,
    matmul_groups,
)
from mxsim.datapath.reference import dot_reference
from mxsim.datapath.window import (
    WIDE_HIGH as W_HIGH,
    WIDE_OFFSET_LIMIT,
    _format_tables,
    _offset_tables,
    _window_config,
    in_tree_order,
    non_finite_codes,
    operand_offset,
    window_applies,
    window_dot,
    window_matmul,
)

ROUNDINGS = [
    "nearest_even",
    "toward_zero",
    "toward_negative",
    "toward_positive",
    "nearest_away",
    "nearest_toward_positive",
]
ELEMENTS = ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8"]
ORACLES = REPO / "tests" / "data" / "gpu-fp8"


def unit(name: str):
    return load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")


def h100(**changes) -> DatapathParams:
    return dataclasses.replace(unit("h100-fp8").params("fp8_e4m3", "fp8_e4m3"), **changes)


# --- which units take the route --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "h100-fp8",
        "b200-fp8",
        "ada-fp8",
        "h200-cublaslt-fp8-fast",
        "h200-cublaslt-fp8",
        "h100-fp8-promoted",
        "h200-fp8",  # fp16 HMMA trees in k mod 4 order, promoted after each instruction
    ],
)
@pytest.mark.parametrize(
    "formats", [("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e5m2"), ("fp8_e4m3", "fp8_e5m2")]
)
def test_gpu_fp8_units_take_the_route_for_fp32_outputs(name, formats):
    assert window_applies(unit(name).params(*formats))


@pytest.mark.parametrize("name", ["b200-tcgen05-mxf8f6f4", "rtx50-mma-mxf8f6f4"])
@pytest.mark.parametrize(
    "formats", [("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp6_e2m3"), ("fp4_e2m1", "fp8_e4m3")]
)
def test_block_scaled_units_with_a_zero_term_exponent_take_the_route(name, formats):
    # Per-product E8M0 scales join every exponent sum, so the route's R is the kernel's.
    assert window_applies(unit(name).params(*formats))


@pytest.mark.parametrize(
    "name",
    [
        "ocp-exact",
        "kulisch",
        "mxdotp-paper",
        "bfp-exact",
    ],
)
def test_other_units_do_not(name):
    config = unit(name)
    assert not window_applies(config.params(config.a_formats[0], config.b_formats[0]))


@pytest.mark.parametrize(
    "changes",
    [
        {"term_order": tuple(range(24))},  # runs that would cross scale blocks
        {"below_window": "floor"},
        {"below_window": "nearest_even"},
        {"below_window": "sticky"},
        {"carry_bits": 4},
        {"product_fraction_bits": 10},
        {"align_reference": "leading_bit"},
        {"align_fraction_bits": None, "sum_significant_bits": None},
        {"align_fraction_bits": 30},  # truncated terms would not fit an int32
        {"promotion_interval": 128, "accumulator_format": "fp16"},  # fp32 adds only
        {"c_entry": "end", "c_add_rounding": "toward_zero"},  # nearest even only
        {"c_entry": "end", "accumulator_format": "fp16"},  # binary32 adds only
        {"sum_rounding": "stochastic"},
        {"accumulator_format": "exact", "align_fraction_bits": None, "sum_significant_bits": None},
        {"scales": "products", "block_size": 16},  # a tree spanning two scale blocks
        # block_sum: the kernel compares the zero-term exponent with R before the tree's scale
        {"scales": "block_sum", "accumulator_in_tree": False},
        {"a_format": "fp32"},  # products wider than float32's significand
        # group-scaled sums and scales that are not powers of two: not yet shown exact on this route
        {"scales": "group_sum", "block_size": 32, "group_terms": 16},
        {"scales": "group_sum", "block_size": 16, "group_terms": 16, "scale_format": "ue4m3"},
        # matrix-core adders (AMD CDNA): rounded pairwise adds, input zero signs, parity windows,
        # a product overflow the formats reach (E4M3's reach 2^17), a second alignment after an
        # n-bit sum or with promotion
        {"structure": "pairwise_rounded"},
        {"input_zero_sign": "positive"},
        {"product_overflow_exponent": 16},
        # parity windows with a term order (the route's reordering of the halves is its own)
        {"parity_windows": True, "accumulator_in_tree": False, "term_order": tuple(range(32))},
        {"second_alignment_bits": 31, "accumulator_in_tree": False},
        {
            "second_alignment_bits": 31,
            "accumulator_in_tree": False,
            "sum_significant_bits": None,
            "promotion_interval": 64,
            "accumulator_format": "fp32",
        },
    ],
)
def test_features_the_kernels_do_not_model_refuse_the_route(changes):
    assert window_applies(h100())
    assert not window_applies(h100(**changes))


def test_an_unknown_parameter_refuses_the_route():
    # A datapath key added later is not silently ignored: the route must be taught it first.
    Extended = dataclasses.make_dataclass(
        "Extended",
        [("new_key", int, dataclasses.field(default=0))],
        bases=(DatapathParams,),
        frozen=True,
    )
    assert not window_applies(Extended(**h100().__dict__))


# --- random units of the family, realistic inputs ------------------------------------------------


@st.composite
def window_params(draw) -> DatapathParams:
    fused = draw(st.sampled_from([1, 2, 3, 4, 7, 8, 16, 32, 64]))
    scales = draw(st.sampled_from(["none", "products", "block_sum"]))
    in_tree = False if scales == "block_sum" else draw(st.booleans())
    return DatapathParams(
        a_format=draw(st.sampled_from(ELEMENTS)),
        b_format=draw(st.sampled_from(ELEMENTS)),
        same_format=False,
        trees_in_blocks=draw(st.booleans()),  # the same trees: fused_terms divides block_size
        grid_fraction_bits=None,
        grid_max_left_shift=70,
        grid_max_right_shift=24,
        block_size=fused * draw(st.integers(1, 3)),
        scales=scales,
        input_subnormals=draw(st.booleans()),
        c_format="fp32",
        product_fraction_bits=None,
        fused_terms=fused,
        term_order=None,
        accumulator_in_tree=in_tree,
        align_reference="exponent_sum",
        align_fraction_bits=draw(st.integers(0, 29)),
        below_window="truncate",
        carry_bits=None,
        adder_overflow="wrap",
        sum_significant_bits=draw(st.one_of(st.none(), st.integers(1, 30))),
        sum_rounding=draw(st.sampled_from(ROUNDINGS)),
        accumulator_format=draw(st.sampled_from(["fp32", "fp32", "fp16", "bf16"])),
        accumulator_rounding=draw(st.sampled_from(ROUNDINGS)),
        accumulator_subnormals=draw(st.booleans()),
        c_entry="initial",
        c_add_rounding="nearest_even",
        promotion_interval=None,
        output_format=draw(st.sampled_from(["fp32", "fp32", "fp16", "bf16"])),
        output_rounding=draw(st.sampled_from(ROUNDINGS)),
        output_subnormals=draw(st.booleans()),
        # MMA-Sim's conventions: the route takes them where it is exact (datapath.schema).
        accumulator_exponent=draw(st.sampled_from(["leading_bit", "format_emin"])),
        zero_term_exponent=draw(st.sampled_from([None, None, -133, -60, -21])),
        accumulator_overflow=draw(st.sampled_from(["ieee", "infinity"])),
        output_zero_sign=draw(st.sampled_from(["ieee", "positive"])),
        scale_format="e8m0",
        group_terms=16,
        structure="fused",
        input_zero_sign="keep",
        product_overflow_exponent=None,
        parity_windows=False,
        second_alignment_bits=None,
        far_accumulator="floor",
        special_accumulator_exponent=None,
    )


def operands(params, rng, rows, length, columns, corners: bool, spread: float):
    """Quantized operands from Gaussian data with per-row/column magnitudes ``2^±spread``; with
    ``corners`` some elements become NaN/Inf/zero runs/cancelling pairs/tiny window-edge terms."""
    A = rng.standard_normal((rows, length)) * np.exp2(rng.uniform(-spread, spread, (rows, 1)))
    B = rng.standard_normal((length, columns)) * np.exp2(rng.uniform(-spread, spread, (1, columns)))
    if corners:
        A[rng.random(A.shape) < 0.1] = 0.0  # scattered zeros
        A[0, : min(length, params.fused_terms)] = 0.0  # a zero tree
        B[:, 0] = -B[:, 0]
        if columns > 1:
            B[:, 1] = B[:, 0] * -1.0  # column 1 cancels column 0 for every row
        A[-1, rng.integers(0, length)] *= 2.0 ** rng.integers(-24, -8)  # terms at the window's edge
        A[rng.random(A.shape) < 0.01] = rng.choice([np.nan, np.inf, -np.inf])
    qa = quantize(A, params.a_format, axis=1, block_size=params.block_size)
    qb = quantize(B, params.b_format, axis=0, block_size=params.block_size)
    if params.scales == "none":
        qa = dataclasses.replace(qa, scales=np.full_like(qa.scales, 127))
        qb = dataclasses.replace(qb, scales=np.full_like(qb.scales, 127))
    return qa, qb


def stored_codes(tensor, rows) -> np.ndarray:
    """Those rows of an MXTensor's codes (field codes) as stored codes, what ``dot`` and the
    twin read (tf32's fp32 pattern; the same codes for formats without padding bits)."""
    padding = get_format(tensor.element_format).padding_bits
    return tensor.codes[rows].astype(np.uint64) << np.uint64(padding)


def reference_bits(params, qa, qb, c, m, n):
    # The codes as the kernels see them: K zero-padded to whole blocks.
    value = dot_reference(
        params,
        stored_codes(qa, m).tolist(),
        stored_codes(qb, n).tolist(),
        qa.scales[m].tolist() if params.scales != "none" else None,
        qb.scales[n].tolist() if params.scales != "none" else None,
        float(c[m, n]),
    )
    return int(get_format(params.output_format).encode(np.array([value]), overflow="inf_nan")[0])


def gemm(params, qa, qb, c, method):
    a_codes = qa.codes.reshape(qa.shape[0], -1)
    b_codes = qb.codes.reshape(qb.shape[1], -1)
    scales_a, scales_b = _scales_for_unit(qa.scales, params), _scales_for_unit(qb.scales, params)
    out = np.empty(
        (a_codes.shape[0], b_codes.shape[0]), dtype=np.uint32
    )  # the API's one kernel signature
    tile = (
        a_codes[None],
        b_codes[None],
        scales_a[None],
        scales_b[None],
        c[None],
    )  # a batch of one GEMM
    if method == "window":
        _, *left = window_matmul(params, *tile, out[None])
        return out, tuple(left)
    matmul_groups(*tile, *_kernel_arguments(params)[2], out[None])
    return out, None


# GEMM shapes (rows, K, columns), corners (0: crafted corners), magnitudes' spread, seed.
ROUTE_CASES = dict(
    shape=st.tuples(st.integers(1, 5), st.integers(1, 100), st.integers(1, 6)),
    corners=st.integers(0, 3),
    spread=st.sampled_from([0, 4, 20, 60]),
    seed=st.integers(0, 2**32 - 1),
)


@settings(max_examples=60, deadline=None)
@given(
    params=window_params(),
    **ROUTE_CASES,
)
def test_window_route_equals_generic_kernel_and_fraction_twin(params, shape, corners, spread, seed):
    assume(window_applies(params))  # every pair of ELEMENTS fits; kept as a guard
    check_route(params, shape, corners, spread, seed)


def check_route(params, shape, corners, spread, seed, make_operands=operands):
    """The window kernel's own outputs equal the generic kernel's and the Fraction twin's, and
    the public API (fast path plus fallback) equals the generic kernel everywhere."""
    rng = np.random.default_rng(seed)
    rows, length, columns = shape
    qa, qb = make_operands(params, rng, rows, length, columns, corners == 0, spread)
    c = (rng.standard_normal((rows, columns)) * 2.0 ** rng.integers(-20, 20)).astype(np.float32)
    if corners == 0:
        c.flat[rng.integers(0, c.size)] = rng.choice([0.0, -0.0, np.inf, np.nan, 1e-40, 3e38])
    fast, left = gemm(params, qa, qb, c, "window")
    slow, _ = gemm(params, qa, qb, c, "kernel")
    unflagged = np.ones(fast.shape, dtype=bool)
    unflagged[left] = False
    # The window kernel's own outputs (before any generic fallback) against both.
    np.testing.assert_array_equal(fast[unflagged], slow[unflagged])
    for m, n in zip(*np.nonzero(unflagged)):
        assert int(fast[m, n]) == reference_bits(params, qa, qb, c, m, n), (m, n, params)
    # A tree whose largest product lies below the unit's zero-term exponent is the generic
    # kernel's case (a zero term might raise its reference): data of this spread reaches it
    # only for a floor within some 40 binades of its smallest magnitudes.
    floor = params.zero_term_exponent
    floor_unreached = floor is None or floor <= -2 * spread - 40
    fp32 = params.accumulator_format == params.output_format == "fp32"
    if corners and spread <= 20 and fp32 and floor_unreached:
        assert unflagged.all()  # realistic data stays on the fast path
    # The public API (fast path plus fallback) equals the generic kernel everywhere.
    np.testing.assert_array_equal(row_dot_bits(params, qa, qb, c), slow)


def wide_operands(params, rng, rows, length, columns, corners: bool, spread: float):
    """Operands of a wide format (bf16) and another, unscaled, whose codes are the data's
    own values (no scale moves them to the format's top): Gaussian data with per-row/column
    magnitudes ``2^±spread``; with ``corners`` some elements are the smallest subnormal, the
    largest value, ±Inf, NaN or zero runs."""
    A = rng.standard_normal((rows, length)) * np.exp2(rng.uniform(-spread, spread, (rows, 1)))
    B = rng.standard_normal((length, columns)) * np.exp2(rng.uniform(-spread, spread, (1, columns)))
    tensors = []
    for x, name, axis in ((A, params.a_format, 1), (B, params.b_format, 0)):
        fmt = get_format(name)
        x = np.clip(x, -fmt.max_finite, fmt.max_finite)
        tensor = quantize(
            x,
            name,
            axis=axis,
            block_size=params.block_size,
            per_tensor_scale=True,
            tensor_scale_exponent=0,
        )
        if corners:
            codes = tensor.codes.copy()
            corner_values = [-fmt.max_finite, 0.0] + (
                [fmt.min_subnormal] if fmt.exponent_bits else []
            )
            if fmt.has_nan:
                corner_values += [np.inf, -np.inf, np.nan]
            specials = fmt.encode(
                np.array(corner_values), overflow="inf_nan" if fmt.has_nan else "saturate"
            ) >> np.uint64(fmt.padding_bits)  # field codes, as the tensor's
            where = rng.random(codes.shape) < 0.02
            codes[where] = rng.choice(specials, int(where.sum()))
            tensor = dataclasses.replace(tensor, codes=codes)
        tensors.append(tensor)
    return tuple(tensors)


@st.composite
def wide_params(draw) -> DatapathParams:
    """Units of the family with bf16 or tf32 operands (one or both; the other narrow),
    unscaled."""
    params = draw(window_params())
    pairs = [("bf16", "bf16"), ("bf16", "fp8_e4m3"), ("int8", "bf16")]
    pairs += [("tf32", "tf32"), ("tf32", "bf16"), ("fp8_e4m3", "tf32")]
    a_format, b_format = draw(st.sampled_from(pairs))
    return dataclasses.replace(params, a_format=a_format, b_format=b_format, scales="none")


@settings(max_examples=60, deadline=None)
@given(params=wide_params(), **{**ROUTE_CASES, "spread": st.sampled_from([0, 4, 20, 45, 90])})
def test_wide_formats_equal_generic_kernel_and_fraction_twin(params, shape, corners, spread, seed):
    # bf16's and tf32's exponents leave the int8 band: each operand takes an offset
    # (window.operand_offset) that enters the trees as a block-scale shift; elements below
    # the band flag their row.
    assume(window_applies(params))
    check_route(params, shape, corners, spread, seed, wide_operands)


@pytest.mark.parametrize(
    "largest, offset",
    [
        (0.0, 0),  # no finite nonzero element
        (1.0, -W_HIGH),
        (2.0**127, 127 - W_HIGH),
        (2.0**-60, -60 - W_HIGH),
        (2.0**-126, -WIDE_OFFSET_LIMIT),  # beyond the limit: clamped
        (2.0**-133, -WIDE_OFFSET_LIMIT),  # a subnormal: aligned at the format's emin
    ],
)
def test_a_wide_operands_offset_puts_its_largest_exponent_at_the_bands_top(largest, offset):
    params = unit("h100").params("bf16", "bf16")
    fmt = get_format("bf16")
    codes = fmt.encode(np.array([[largest, 0.0, np.inf]]), overflow="inf")
    assert operand_offset(params, "bf16", codes) == offset
    usable = _offset_tables("bf16", True, offset).finite
    assert usable[codes[0, 1]] and not usable[codes[0, 2]]  # zeros usable, Inf not
    assert usable[codes[0, 0]]
    if offset == -W_HIGH:  # the band's floor: 61 binades below the top, not 62
        edge = fmt.encode(np.array([2.0**-61, 2.0**-62]))
        assert usable[edge[0]] and not usable[edge[1]]


def test_wide_tables_leave_codes_below_the_band_to_the_generic_kernel():
    # An operand spanning more binades than the band: its rows with an element below the band
    # are flagged, the others computed, every output the generic kernel's bits.
    params = unit("h200-cublas").params("bf16", "bf16")
    rng = np.random.default_rng(4)
    a = rng.standard_normal((6, 64))
    a[0, 5] = 2.0**-100  # 100 binades below the largest: below the band
    a[1, 7] = 2.0**10
    b = rng.standard_normal((64, 5))
    qa, qb = (
        quantize(x, "bf16", axis=axis, per_tensor_scale=True, tensor_scale_exponent=0)
        for x, axis in ((a, 1), (b, 0))
    )
    c = np.zeros((6, 5), dtype=np.float32)
    fast, left = gemm(params, qa, qb, c, "window")
    assert sorted(set(left[0].tolist())) == [0]  # the row of the tiny element alone
    slow, _ = gemm(params, qa, qb, c, "kernel")
    unflagged = np.ones(fast.shape, dtype=bool)
    unflagged[left] = False
    np.testing.assert_array_equal(fast[unflagged], slow[unflagged])
    np.testing.assert_array_equal(matmul(unit("h200-cublas"), qa, qb).bits, slow)


@pytest.mark.parametrize("shape", [(24, 14, 32, 14), (24, 14, 14, 32), (4, 128, 64, 128)])
def test_wide_formats_in_batches_equal_the_generic_kernel(shape):
    # The small-groups kernel (window_groups) with each call's offsets, and the kept tiles of
    # B (b_memo) of the per-GEMM route.
    groups, rows, length, columns = shape
    hw = unit("h100")
    rng = np.random.default_rng(sum(shape))
    a = [
        quantize(
            rng.standard_normal((rows, length)) * 2.0 ** rng.integers(-30, 30),
            "bf16",
            axis=1,
            per_tensor_scale=True,
            tensor_scale_exponent=0,
        )
        for _ in range(groups)
    ]
    b = [
        quantize(
            rng.standard_normal((length, columns)),
            "bf16",
            axis=0,
            per_tensor_scale=True,
            tensor_scale_exponent=0,
        )
        for _ in range(groups)
    ]
    want = matmul_batched(hw, a, b, method="kernel").bits
    memo: dict = {}
    for _ in range(2):
        np.testing.assert_array_equal(matmul_batched(hw, a, b, b_memo=memo).bits, want)


@pytest.mark.parametrize(
    "name, fmt",
    [
        ("h200-cublas", "bf16"),
        ("h100", "bf16"),
        ("a100", "bf16"),
        ("a100", "tf32"),
        ("mi300", "fp8_e4m3fnuz"),  # parity windows
        ("mi300", "fp8_e5m2fnuz"),
    ],
)
def test_wide_formats_and_parity_windows_on_minilms_operands(minilm_operands, name, fmt):
    # A real transformer's bf16, tf32 or FP8 operands: the query projection (activations,
    # weight) on the route's own kernel, nothing flagged, and its attention heads (softmax
    # probabilities spanning many binades among them) through matmul_batched: the generic
    # kernel's bits.
    hw = unit(name)
    params = hw.params(fmt, fmt)
    ops = minilm_operands
    qa, qb = (
        quantize(x, fmt, axis=axis, per_tensor_scale=True, tensor_scale_exponent=0)
        for x, axis in ((ops["x"], 1), (ops["weight"], 0))
    )
    c = np.zeros((len(ops["x"]), ops["weight"].shape[1]), dtype=np.float32)
    fast, left = gemm(params, qa, qb, c, "window")
    assert left[0].size == 0
    np.testing.assert_array_equal(fast, gemm(params, qa, qb, c, "kernel")[0])
    kw = dict(a_format=fmt, b_format=fmt, per_tensor_scale=True)
    for heads in ((ops["q"], ops["k_t"]), (ops["p"], ops["v"])):
        got = matmul_batched(hw, *heads, **kw).bits
        np.testing.assert_array_equal(got, matmul_batched(hw, *heads, method="kernel", **kw).bits)


@st.composite
def float32_addition_params(draw) -> DatapathParams:
    """Units of the family whose tree sums join the accumulator as one float32 addition
    (``window.float32_addition``): the accumulator outside the tree, fp32 rounding to
    nearest even, an n-bit sum of at most 24 bits that truncates, no block scales (B200's
    FP8 path among them)."""
    return dataclasses.replace(
        draw(window_params()),
        scales="none",
        accumulator_in_tree=False,
        accumulator_format="fp32",
        accumulator_rounding="nearest_even",
        sum_significant_bits=draw(st.sampled_from([1, 2, 8, 11, 23, 24])),
        sum_rounding="toward_zero",
    )


@settings(max_examples=40, deadline=None)
@given(params=float32_addition_params(), **ROUTE_CASES)
def test_float32_addition_equals_generic_kernel_and_fraction_twin(
    params, shape, corners, spread, seed
):
    assume(window_applies(params))
    assert _window_config(params)[0][W.W_FLOAT32_ADD] == 1  # the sums' range is proven
    check_route(params, shape, corners, spread, seed)


@st.composite
def promoting_params(draw) -> DatapathParams:
    """Units of the family whose fp32 accumulator is promoted every n products into an outer
    fp32 accumulator that c starts (cuBLASLt's FP8 GEMMs, DeepSeek-V3's fix)."""
    params = draw(window_params())
    return dataclasses.replace(
        params,
        accumulator_format="fp32",
        promotion_interval=params.fused_terms * draw(st.integers(1, 4)),
    )


@st.composite
def c_at_end_params(draw) -> DatapathParams:
    """Units of the family that add c once after the last tree (an fp32 accumulator, nearest
    even: cuBLAS's bias epilogue), with or without a term order."""
    params = draw(window_params())
    return dataclasses.replace(
        params, accumulator_format="fp32", c_entry="end", c_add_rounding="nearest_even"
    )


@settings(max_examples=30, deadline=None)
@given(params=c_at_end_params(), **ROUTE_CASES)
def test_c_at_the_end_equals_generic_kernel_and_fraction_twin(params, shape, corners, spread, seed):
    assume(window_applies(params))
    check_route(params, shape, corners, spread, seed)


@settings(max_examples=40, deadline=None)
@given(params=promoting_params(), **ROUTE_CASES)
def test_promotion_equals_generic_kernel_and_fraction_twin(params, shape, corners, spread, seed):
    assume(window_applies(params))
    check_route(params, shape, corners, spread, seed)


@st.composite
def reordering_params(draw) -> DatapathParams:
    """Units of the family whose trees take each run of T products in a term order of their
    own, T dividing the block size (the H200's FP8 mma.sync: k mod 4 in {0,1}, then {2,3});
    promoting units among them."""
    params = draw(window_params())
    period = draw(
        st.sampled_from([t for t in range(1, params.block_size + 1) if params.block_size % t == 0])
    )
    return dataclasses.replace(
        params,
        term_order=tuple(draw(st.permutations(range(period)))),
        accumulator_format="fp32",
        promotion_interval=draw(st.sampled_from([None, params.fused_terms])),
    )


@settings(max_examples=40, deadline=None)
@given(params=reordering_params(), **ROUTE_CASES)
def test_term_order_equals_generic_kernel_and_fraction_twin(params, shape, corners, spread, seed):
    assume(window_applies(params))
    check_route(params, shape, corners, spread, seed)


def test_in_tree_order_reorders_each_run_and_pads_a_short_one():
    params = h100(term_order=(2, 0, 3, 1), block_size=32)
    codes = np.arange(1, 7, dtype=np.uint8)[None]
    assert in_tree_order(params, codes).tolist() == [[3, 1, 4, 2, 0, 5, 0, 6]]
    assert in_tree_order(h100(), codes) is codes


def test_promotion_takes_the_route_with_an_fp32_accumulator_only():
    assert window_applies(h100(promotion_interval=64))
    assert window_applies(h100(accumulator_format="fp16"))
    assert not window_applies(h100(promotion_interval=64, accumulator_format="fp16"))


@st.composite
def truncating_in_tree_params(draw) -> DatapathParams:
    """Units whose accumulator joins the tree with one rounding, toward zero (the GPU FP8
    and tcgen05 units): the n-bit sum's, no more precise than the accumulator, or without
    one the accumulator's."""
    params = draw(window_params())
    accumulator = draw(st.sampled_from(["fp32", "fp32", "fp16", "bf16"]))
    precision = get_format(accumulator).mantissa_bits + 1
    sum_bits = draw(st.one_of(st.none(), st.integers(1, precision)))
    return dataclasses.replace(
        params,
        scales="none" if params.scales == "block_sum" else params.scales,
        accumulator_in_tree=True,
        accumulator_format=accumulator,
        sum_significant_bits=sum_bits,
        sum_rounding="toward_zero",
        accumulator_rounding="toward_zero" if sum_bits is None else params.accumulator_rounding,
    )


@settings(max_examples=40, deadline=None)
@given(
    params=truncating_in_tree_params(),
    **ROUTE_CASES,
)
def test_truncating_one_rounding_equals_generic_kernel_and_fraction_twin(
    params, shape, corners, spread, seed
):
    assume(window_applies(params))
    check_route(params, shape, corners, spread, seed)


@pytest.mark.parametrize("accumulator", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("extra_bits", [-1, 0, 1])
@pytest.mark.parametrize("rounding", ["toward_positive", "nearest_even"])
def test_n_bit_sums_beside_the_accumulator_precision(accumulator, extra_bits, rounding):
    # An accumulator in the tree and an n-bit sum no more precise than it: the kernels skip
    # the accumulator's rounding (the identity then); one bit more precise, they must not.
    precision = get_format(accumulator).mantissa_bits + 1
    params = h100(
        accumulator_format=accumulator,
        accumulator_rounding=rounding,
        sum_significant_bits=precision + extra_bits,
        sum_rounding="toward_zero",
    )
    assert window_applies(params) and params.accumulator_in_tree
    rng = np.random.default_rng(7)
    qa, qb = operands(params, rng, 8, 96, 40, corners=False, spread=0)
    # Elements of magnitude about 1/4 (unit scales would leave MX elements up to 448): the
    # sums stay inside fp16's range, so every output takes the fast path.
    fmt = get_format("fp8_e4m3")
    small = [fmt.encode(rng.standard_normal(q.codes.shape) / 4) for q in (qa, qb)]
    qa, qb = (
        dataclasses.replace(q, codes=code.astype(q.codes.dtype)) for q, code in zip((qa, qb), small)
    )
    c = rng.standard_normal((8, 40)).astype(np.float32)
    fast, left = gemm(params, qa, qb, c, "window")
    assert left[0].size == 0
    np.testing.assert_array_equal(fast, gemm(params, qa, qb, c, "kernel")[0])
    for m, n in zip(rng.integers(0, 8, 12).tolist(), rng.integers(0, 40, 12).tolist()):
        assert int(fast[m, n]) == reference_bits(params, qa, qb, c, m, n), (m, n)


def row_dot_bits(params, qa, qb, c):
    """Every (m, n) output as one row-wise dot through the public ``dot`` (the pairs kernel)."""
    m, n = (index.ravel() for index in np.indices(c.shape))
    scaled = params.scales != "none"
    out = dot_with_params(
        params,
        stored_codes(qa, m),
        stored_codes(qb, n),
        scale_a=qa.scales[m] if scaled else None,
        scale_b=qb.scales[n] if scaled else None,
        c=c[m, n],
    )
    return out.reshape(c.shape)


# --- the shipped GPU units on real GPU data and at GEMM scale --------------------------------------


@pytest.mark.parametrize("gpu", ["H100", "B200"])
@pytest.mark.parametrize("fmt", ["E4M3", "E5M2"])
def test_gpu_data_through_the_window_kernels(gpu, fmt):
    # The measured cases are row-wise dots (K = 32): through the pairs kernel, and as the
    # diagonals of 128 x 128 GEMMs through the GEMM kernel; no generic fallback counted.
    data = np.load(ORACLES / f"{gpu}_{fmt}.npz", allow_pickle=False)
    element = get_format({"E4M3": "fp8_e4m3", "E5M2": "fp8_e5m2"}[fmt])
    a = element.encode(data["a"].view(np.float32))
    b = element.encode(data["b"].view(np.float32))
    c = data["c"].view(np.float32) if gpu == "B200" else np.zeros(len(a), dtype=np.float32)
    params = unit(gpu.lower() + "-fp8").params(element.name, element.name)
    assert window_applies(params)
    zeros = np.zeros((len(a), 1), dtype=np.int32)
    out = np.empty(len(a), dtype=np.uint32)
    left = window_dot(params, a, b, zeros, zeros, c, out)
    kept = np.setdiff1d(np.arange(len(a)), left)
    assert len(kept) >= len(a) - 50
    np.testing.assert_array_equal(out[kept], data["d_fp32"][kept])
    size = 128
    for start in range(0, len(a) - size + 1, 8 * size):
        rows = slice(start, start + size)
        c_grid = np.zeros((size, size), dtype=np.float32)
        np.fill_diagonal(c_grid, c[rows])
        grid = np.empty((size, size), dtype=np.uint32)
        _, *flagged = window_matmul(
            params,
            a[rows][None],
            b[rows][None],
            zeros[rows][None],
            zeros[rows][None],
            c_grid[None],
            grid[None],
        )
        diagonal = np.ones(size, dtype=bool)
        diagonal[flagged[0][flagged[0] == flagged[1]]] = False
        np.testing.assert_array_equal(np.diag(grid)[diagonal], data["d_fp32"][rows][diagonal])


@pytest.mark.parametrize("name", ["h100-fp8", "b200-fp8"])
def test_a_gemm_with_realistic_operands_stays_on_the_fast_path(name):
    rng = np.random.default_rng(3)
    params = unit(name).params("fp8_e4m3", "fp8_e4m3")
    fmt = get_format("fp8_e4m3")
    columns = W.LANES + 22  # a full column tile and a partial one
    A = rng.standard_normal((40, 300)).astype(np.float32)
    B = rng.standard_normal((300, columns)).astype(np.float32)
    qa, qb = (quantize(x, fmt.name, axis=axis) for x, axis in ((A, 1), (B, 0)))
    qa = dataclasses.replace(qa, scales=np.full_like(qa.scales, 127))
    qb = dataclasses.replace(qb, scales=np.full_like(qb.scales, 127))
    c = rng.standard_normal((40, columns)).astype(np.float32)
    fast, left = gemm(params, qa, qb, c, "window")
    assert left[0].size == 0
    np.testing.assert_array_equal(fast, gemm(params, qa, qb, c, "kernel")[0])
    np.testing.assert_array_equal(matmul(unit(name), qa, qb, c=c).bits, fast)


@pytest.mark.parametrize("name", ["h100-fp8", "b200-fp8"])
def test_matmul_recomputes_flagged_outputs_with_the_generic_kernel(name):
    # NaN/Inf elements, -0 / subnormal / huge c: flagged by the window kernel, recomputed.
    rng = np.random.default_rng(4)
    A = rng.standard_normal((6, 64))
    A[1, 3], A[2, 40] = np.nan, np.inf
    B = rng.standard_normal((64, 5))
    qa = quantize(A, "fp8_e4m3", axis=1)
    qb = quantize(B, "fp8_e4m3", axis=0)
    qa = dataclasses.replace(qa, scales=np.full_like(qa.scales, 127))
    qb = dataclasses.replace(qb, scales=np.full_like(qb.scales, 127))
    c = rng.standard_normal((6, 5)).astype(np.float32)
    c[0, :4] = [-0.0, 1e-40, 3.4e38, -np.inf]
    params = unit(name).params("fp8_e4m3", "fp8_e4m3")
    _, left = gemm(params, qa, qb, c, "window")
    assert 0 < left[0].size < c.size
    np.testing.assert_array_equal(
        matmul(unit(name), qa, qb, c=c).bits, matmul(unit(name), qa, qb, c=c, method="kernel").bits
    )


@pytest.mark.parametrize("name", ["b200-fp8", "b200-tcgen05-mxf8f6f4", "h200-fp8"])
def test_kept_tiles_of_b_give_the_bits_of_decoding_b_per_call(name):
    # window_matmul with a memo decodes B's tiles once and reads them in later calls: the
    # same outputs and flags as without, and as the generic kernel, for a batch of two GEMMs
    # whose N is split into two uneven tiles, a column of B holding a NaN (its usability is
    # kept too) and rows of A that change from call to call.
    rng = np.random.default_rng(11)
    params = unit(name).params("fp8_e4m3", "fp8_e4m3")
    groups, rows, length, columns = 2, 37, 70, W.LANES + 37
    fmt = get_format("fp8_e4m3")
    tensor_scale = params.scales == "none"  # a unit without block scales: one per tensor
    quantized = [
        quantize(
            rng.standard_normal((columns, length)), fmt.name, axis=1, per_tensor_scale=tensor_scale
        )
        for _ in range(groups)
    ]
    quantized[1].codes[5, 3] = fmt.encode(np.array([np.nan]))[0]
    codes_b = np.stack([q.codes for q in quantized]).astype(np.uint32)
    scales_b = np.stack([_scales_for_unit(q.scales, params) for q in quantized])
    c_values = rng.standard_normal((groups, rows, columns)).astype(np.float32)
    memo: dict = {}
    for call in range(3):
        qa = [
            quantize(
                rng.standard_normal((rows, length)), fmt.name, axis=1, per_tensor_scale=tensor_scale
            )
            for _ in range(groups)
        ]
        codes_a = np.stack([q.codes for q in qa]).astype(np.uint32)
        scales_a = np.stack([_scales_for_unit(q.scales, params) for q in qa])
        operands = (codes_a, codes_b, scales_a, scales_b, c_values)
        kept = np.empty((groups, rows, columns), dtype=np.uint32)
        kept_left = window_matmul(params, *operands, kept, memo)
        fresh = np.empty_like(kept)
        fresh_left = window_matmul(params, *operands, fresh)
        np.testing.assert_array_equal(kept, fresh)
        for index_kept, index_fresh in zip(kept_left, fresh_left):
            np.testing.assert_array_equal(index_kept, index_fresh)
        assert set(kept_left[2].tolist()) == {5} and set(kept_left[0].tolist()) == {1}
        unflagged = np.ones(kept.shape, dtype=bool)
        unflagged[kept_left] = False
        slow = np.empty_like(kept)
        matmul_groups(*operands, *_kernel_arguments(params)[2], slow)
        np.testing.assert_array_equal(kept[unflagged], slow[unflagged])
        values = memo["window", params.term_order][1]
        tiles = (groups, 2, codes_b.shape[2], -(-columns // 2))  # K padded to whole blocks
        assert values.shape == tiles and not values.flags.writeable


def test_matmul_batched_keeps_the_window_routes_tiles_in_b_memo():
    rng = np.random.default_rng(12)
    hw = unit("b200-fp8")
    A = rng.standard_normal((3, 20, 64)).astype(np.float32)
    B = rng.standard_normal((3, 64, 30)).astype(np.float32)
    memo: dict = {}
    first = matmul_batched(hw, A, B, per_tensor_scale=True, b_memo=memo)
    (kept,) = memo.values()
    assert ("window", None) in kept["route"]  # (the term order keys the tiles)
    widened = kept["route"]["kernel codes"]  # B's codes in the kernels' type, widened once
    assert widened.dtype == np.uint32
    np.testing.assert_array_equal(widened.reshape(kept["codes"].shape), kept["codes"])
    again = matmul_batched(hw, A * 2.0**-3, B, per_tensor_scale=True, b_memo=memo)
    fresh = matmul_batched(hw, A * 2.0**-3, B, per_tensor_scale=True)
    slow = matmul_batched(hw, A, B, per_tensor_scale=True, method="kernel")
    np.testing.assert_array_equal(first.bits, slow.bits)
    np.testing.assert_array_equal(again.bits, fresh.bits)


def test_start_accumulators_reads_a_single_c_a_run_and_a_wrapped_run_alike():
    # Three ways to read c (one value for every lane, a run, indices wrapping around): the
    # same accumulators and flags from the same values, corners included.
    params = h100(accumulator_format="bf16", accumulator_rounding="toward_positive")
    cfg = _window_config(params)[0]
    values = np.array(
        [1.5, -0.0, 0.0, np.nan, np.inf, 1e-40, 3.4e38, -2.75, 1.0 + 2.0**-20], dtype=np.float32
    )

    def start(c_values, offset, lanes):
        acc, flags = np.empty(lanes), np.zeros(lanes, dtype=np.uint8)
        W.start_accumulators(c_values, offset, acc, flags, cfg)
        return acc, flags

    # -0, NaN, Inf, a subnormal and a value above bf16's largest leave the fast path
    for c, flagged in zip(values, [0, 1, 0, 1, 1, 1, 1, 0, 0]):
        single = start(np.array([c]), 5, 20)
        wrapped = start(np.full(3, c), 2, 20)
        np.testing.assert_array_equal(single[0], wrapped[0])
        np.testing.assert_array_equal(single[1], wrapped[1])
        np.testing.assert_array_equal(single[1], flagged)
    run = start(values, 5, 4)
    wrapped = start(values, 5 + len(values), 4)
    np.testing.assert_array_equal(run[0], wrapped[0])
    np.testing.assert_array_equal(run[1], wrapped[1])
    np.testing.assert_array_equal(run[0][2:], [-2.75, 1.0 + 2.0**-7])  # rounded up to bf16
    np.testing.assert_array_equal(run[1], [1, 1, 0, 0])


# --- the kernels' rounding against plain integer arithmetic --------------------------------------


def rounded_reference(value: float, precision: int, mode: str) -> float:
    """``value`` rounded to ``precision`` significant bits, from its integer significand.
    Ties to even go to the even code of the n-bit sum format: the even significand, or at one
    bit (no stored significand bits) the even exponent field (its bias 2^9 - 1 is odd, so
    that is an odd leading-bit exponent)."""
    fraction, exponent = math.frexp(abs(value))  # leading-bit exponent: exponent - 1
    significand = int(fraction * 2**53)
    cut = 53 - precision
    kept, rest, half = significand >> cut, significand & ((1 << cut) - 1), 1 << (cut - 1)
    odd = kept % 2 == 1 if precision > 1 else exponent % 2 == 1
    negative = value < 0
    up = {
        "toward_zero": False,
        "toward_positive": rest > 0 and not negative,
        "toward_negative": rest > 0 and negative,
        "nearest_away": rest >= half,
        "nearest_toward_positive": rest > half or (rest == half and not negative),
        "nearest_even": rest > half or (rest == half and odd),
    }[mode]
    return math.copysign(math.ldexp(kept + up, exponent - precision), value)


@pytest.mark.parametrize("mode", ROUNDINGS)
def test_round_bits_equals_integer_rounding(mode):
    rng = np.random.default_rng(5)
    code = rounding_code(mode)
    for precision in range(1, 52):
        rule = W.rounding_rule(precision, code)
        cut = 53 - precision
        # Random significands, and ties, values just beside ties and exact values at this precision.
        significands = [int(s) for s in rng.integers(2**52, 2**53, 40)]
        for kept in rng.integers(2 ** (precision - 1), 2**precision, 10).tolist():
            base = int(kept) << cut
            significands += [
                base,
                base + (1 << (cut - 1)),
                base + (1 << (cut - 1)) - 1,
                base + (1 << (cut - 1)) + 1,
                base + (1 << cut) - 1,
            ]
        for significand in significands:
            for sign in (1.0, -1.0):
                value = sign * math.ldexp(significand, int(rng.integers(-60, 60)))
                assert W.round_bits(value, rule) == rounded_reference(value, precision, mode), (
                    value,
                    precision,
                )
    assert W.round_bits(0.0, W.rounding_rule(24, code)) == 0.0


# --- the float32-addition finish against Fraction arithmetic, corners included -------------------


def fraction_rounded(value: Fraction, precision: int, mode: str) -> Fraction:
    """``value`` rounded to ``precision`` significant bits by ``mode`` (toward zero or to
    nearest even), exponent range unbounded, in exact rational arithmetic."""
    if value == 0:
        return Fraction(0)
    magnitude = abs(value)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1
    step = Fraction(2) ** (exponent - precision + 1)
    kept, rest = divmod(magnitude, step)
    if mode == "nearest_even" and (rest > step / 2 or (rest == step / 2 and kept % 2 == 1)):
        kept += 1
    return (-kept if value < 0 else kept) * step


def float32_addition_reference(total, reference, window, sum_bits, sum_mode, acc):
    """(the accumulator after the tree, whether it is 0 or a normal fp32): the tree sum
    total * 2^(reference - window) rounded to ``sum_bits`` by ``sum_mode``, added to ``acc``
    exactly and rounded to fp32's 24 bits to nearest even."""
    value = fraction_rounded(
        Fraction(int(total)) * Fraction(2) ** (reference - window), sum_bits, sum_mode
    )
    result = fraction_rounded(Fraction(float(acc)) + value, 24, "nearest_even")
    normal = result == 0 or Fraction(2) ** -126 <= abs(result) < Fraction(2) ** 128
    return result, normal


def test_float32_addition_finish_equals_fraction_arithmetic():
    # finish_tree's float32-addition loop against exact rational arithmetic and against the
    # TwoSum loop of the other units (W_FLOAT32_ADD 0), on lanes crafted at its corners:
    # exact cancellation to +0, ties to even, results that are subnormal or overflow, trees
    # without a nonzero term, references below the zero floor.
    params = unit("b200-fp8").params("fp8_e4m3", "fp8_e4m3")
    params = dataclasses.replace(params, zero_term_exponent=-133)
    window, sum_bits, sum_mode = (
        params.align_fraction_bits,
        params.sum_significant_bits,
        "toward_zero",
    )
    largest = float(np.finfo(np.float32).max)
    lanes = [  # (integer tree sum, reference R, accumulator)
        (2**31 + 12345, 3, 1.0),
        (-(2**32) + 1, 16, 3.0),
        (2**25, 0, -1.0),  # value 1: cancels exactly to +0
        (-(2**25), 0, 1.0),
        (1, 1, 1.0),  # 2^-24: a tie at 1.0, stays 1.0 (even)
        (1, 1, 1.0 + 2.0**-23),  # a tie at an odd significand: rounds up
        (3, 1, 1.0),  # 3 * 2^-24: above the tie, rounds up
        (2**24 + 1, 5, 2.0**7),  # 25 significant bits: the n-bit sum rounds
        (2**26 - 1, -125, -1.5 * 2.0**-126),  # a sum just below 2^-124, truncated
        (-(2**25), -126, 1.5 * 2.0**-126),  # a subnormal result: flagged
        (2**25, 103, largest),  # a tie above the largest finite: overflows, flagged
        (2**24, 103, largest),  # below the tie: stays the largest finite
        (2**25, 102, -largest),
        (0, W.NO_REFERENCE, 2.5),  # no nonzero term in the tree
        (0, 7, -2.5),
        (5, -140, 1.0),  # below the zero floor: flagged
    ]
    totals = np.array([float(t) for t, _, _ in lanes])
    references = np.array([r for _, r, _ in lanes], dtype=np.int64)
    accumulators = np.array([a for _, _, a in lanes], dtype=np.float32).astype(np.float64)
    cfg = _window_config(params)[0].copy()
    assert cfg[W.W_FLOAT32_ADD] == 1  # B200's FP8 path takes the float32-addition loop

    def finish(cfg):
        acc, flags = accumulators.copy(), np.zeros(len(lanes), dtype=np.uint8)
        W.finish_tree(totals, references, acc, flags, cfg)
        return acc, flags

    acc, flags = finish(cfg)
    for lane, (total, reference, start) in enumerate(lanes):
        result, normal = float32_addition_reference(
            total, reference, window, sum_bits, sum_mode, np.float32(start)
        )
        below_floor = W.NO_REFERENCE < reference < params.zero_term_exponent
        if normal and not below_floor:  # an exact zero sum is +0 (ties-to-even addition)
            assert not flags[lane], lanes[lane]
            assert Fraction(acc[lane]) == result, lanes[lane]
            assert result != 0 or math.copysign(1, acc[lane]) > 0, lanes[lane]
        else:
            assert flags[lane], lanes[lane]
    assert flags.sum() == 3
    cfg[W.W_FLOAT32_ADD] = 0  # the TwoSum loop: the same flags and accumulators
    generic, generic_flags = finish(cfg)
    np.testing.assert_array_equal(generic_flags, flags)
    np.testing.assert_array_equal(generic[flags == 0], acc[flags == 0])


@pytest.mark.parametrize(
    "fmt_name", ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "fp16", "int8"]
)
def test_non_finite_codes_mask_and_pattern_match_exactly_the_non_finite_codes(fmt_name):
    """``unusable_rows``' mask and compare: the codes matching it are the codes that decode to
    NaN or ±Inf (the format's own decoding), for every element format the route takes."""
    tables = _format_tables(fmt_name, True)
    mask, pattern = tables.non_finite
    codes = np.arange(tables.finite.size)
    decoded = get_format(fmt_name).decode_fields(codes)
    np.testing.assert_array_equal((codes & mask) == pattern, ~np.isfinite(decoded))


def test_non_finite_codes_is_a_superset_where_no_mask_is_exact():
    """Non-finite codes that share no mask exactly ({1, 2} of four): the match covers them
    (their rows flagged), and a table without any matches no code."""
    mask, pattern = non_finite_codes(np.array([True, False, False, True]))
    matched = {code for code in range(4) if code & mask == pattern}
    assert {1, 2} <= matched
    mask, pattern = non_finite_codes(np.ones(16, dtype=bool))
    assert not any(code & mask == pattern for code in range(16))


def test_unusable_rows_flags_rows_with_non_finite_codes_or_nan_scales():
    """``unusable_rows`` against a plain check of each row: codes decoding to NaN/Inf
    (E5M2's eight), a NaN scale exponent (the kernels' ``SCALE_NAN``) where the unit takes
    scales."""

    tables = _format_tables("fp8_e5m2", True)
    rng = np.random.default_rng(4)
    codes = rng.integers(0, 256, (3, 40, 9)).astype(np.uint32)
    codes[rng.random(codes.shape) < 0.8] = 0x38  # most rows without a special code
    scales = rng.integers(100, 140, (3, 40, 1)).astype(np.int32)
    scales[rng.random(scales.shape) < 0.2] = SCALE_NAN
    decoded = get_format("fp8_e5m2").decode_fields(codes)
    for scaled in (False, True):
        want = ~np.isfinite(decoded).all(axis=-1)
        if scaled:
            want |= (scales == SCALE_NAN).any(axis=-1)
        got = W.unusable_rows(codes, scales, *tables.non_finite, scaled)
        np.testing.assert_array_equal(got, want)
        assert want.any() and not want.all()


@pytest.mark.parametrize("name", ["h100-fp8", "b200-fp8", "b200-tcgen05-mxf8f6f4"])
def test_encode_outputs_binary32_path_equals_the_generic_loop_and_the_ieee_bits(name):
    # encode_outputs on an fp32 output that holds every accumulator value (its float32-bits
    # path) against its generic rounding loop (taken when W_ACC_BITS, which that loop never
    # reads, is raised past 24) and against the IEEE binary32 bits by struct, on accumulator
    # values as start_accumulators and finish_tree leave them: 0 or normal float32, their
    # extremes included (and -0, which both write as code 0).
    import struct

    params = unit(name).params("fp8_e4m3", "fp8_e4m3")
    cfg = _window_config(params)[0].copy()
    assert (cfg[W.W_OUT_BITS], cfg[W.W_OUT_MIN_EXPONENT], cfg[W.W_OUT_MAX_EXPONENT]) == (
        24,
        -126,
        127,
    )
    assert cfg[W.W_ACC_BITS] <= 24  # (the accumulators below are on its grid)
    rng = np.random.default_rng(24)
    realistic = (rng.standard_normal(3000) * np.exp2(rng.integers(-40, 40, 3000))).astype(
        np.float32
    )
    tiny, largest = np.float32(2.0**-126), np.finfo(np.float32).max
    corners = np.array(
        [0.0, -0.0, tiny, -tiny, largest, -largest, 1.0, -1.0, np.nextafter(tiny, np.float32(1))],
        dtype=np.float32,
    )
    extremes = (rng.integers(1, 2**24, 200) * np.exp2(rng.integers(-149, 105, 200))).astype(
        np.float32
    )
    extremes = extremes[np.abs(extremes) >= tiny]
    acc = np.concatenate([realistic, corners, extremes]).astype(np.float64)

    def encode(cfg):
        out, flags = np.empty(acc.size, dtype=np.uint32), np.zeros(acc.size, dtype=np.uint8)
        W.encode_outputs(acc, flags, out, cfg)
        return out, flags

    fast, fast_flags = encode(cfg)
    generic_cfg = cfg.copy()
    generic_cfg[W.W_ACC_BITS] = 25
    generic, generic_flags = encode(generic_cfg)
    np.testing.assert_array_equal(fast, generic)
    np.testing.assert_array_equal(fast_flags, generic_flags)
    assert not fast_flags.any()
    ieee = [0 if v == 0 else struct.unpack("<I", struct.pack("<f", v))[0] for v in acc.tolist()]
    assert fast.tolist() == ieee


def test_kept_window_tables_and_config_are_read_only():
    """The window kernels' per-format tables and per-unit config, kept, refuse an in-place
    write."""
    params = load_hwconfig(REPO / "hwconfigs" / "h100-fp8.yaml").params("fp8_e4m3", "fp8_e5m2")
    cfg, a, b = _window_config(params)
    arrays = [cfg] + [x for t in (a, b) for x in (t.values, t.exponents, t.finite)]
    assert _format_tables("fp8_e4m3", True) is a
    assert not [x for x in arrays if x.flags.writeable]


@st.composite
def second_alignment_params(draw) -> DatapathParams:
    """Units of the family whose accumulator is added to each tree's sum at a second
    alignment (AMD CDNA3's fp16/bf16/tf32 MFMA: n = 31, the far accumulator kept toward -inf;
    its FP8 MFMA drops it), no n-bit sum, products that overflow at 2^128 or never, and
    exact-positive zero results among the others."""
    params = draw(window_params())
    return dataclasses.replace(
        params,
        accumulator_in_tree=False,
        sum_significant_bits=None,
        second_alignment_bits=draw(st.sampled_from([31, 31, 23, 25, 40, 0])),
        far_accumulator=draw(st.sampled_from(["floor", "zero"])),
        product_overflow_exponent=draw(st.sampled_from([None, 128])),
        output_zero_sign=draw(st.sampled_from(["ieee", "positive", "exact_positive"])),
    )


@settings(max_examples=60, deadline=None)
@given(params=second_alignment_params(), **ROUTE_CASES)
def test_second_alignment_equals_generic_kernel_and_fraction_twin(
    params, shape, corners, spread, seed
):
    assume(window_applies(params))
    check_route(params, shape, corners, spread, seed)


@pytest.mark.parametrize("seed", range(6))
def test_mi300_fp16_takes_the_route_and_equals_the_generic_kernel(seed):
    """MI300's fp16 MFMA (trees of 8, a 24-bit window, the second alignment at 31 bits, c
    kept toward -inf however far below, exact-positive zeros): realistic and corner data."""
    params = unit("mi300").params("fp16", "fp16")
    assert window_applies(params)
    rows, length, columns = 5, 8 * (seed + 1) + seed, 6
    check_route(params, (rows, length, columns), seed % 2, [0, 4, 20][seed % 3], seed)


@st.composite
def parity_params(draw) -> DatapathParams:
    """Units whose trees' even and odd positions sum in windows of their own (AMD CDNA3's FP8
    MFMA: trees of 16, a 24-bit window, the second alignment at 31 bits dropping a far
    accumulator, a NaN or Inf one entering it at exponent -1), with and without a second
    alignment, trees of 2 to 32 (halves shorter and longer than a pass of 8 and of the
    kernels' four-term unrolling)."""
    params = draw(st.one_of(second_alignment_params(), window_params()))
    fused = draw(st.sampled_from([2, 4, 6, 8, 16, 16, 32]))
    drops_far = params.second_alignment_bits is not None and params.far_accumulator == "zero"
    return dataclasses.replace(
        params,
        parity_windows=True,
        accumulator_in_tree=False,
        fused_terms=fused,
        block_size=fused * draw(st.integers(1, 3)),
        special_accumulator_exponent=(
            draw(st.sampled_from([None, -1, -1, 20, -140])) if drops_far else None
        ),
    )


@settings(max_examples=60, deadline=None)
@given(params=parity_params(), **ROUTE_CASES)
def test_parity_windows_equal_generic_kernel_and_fraction_twin(
    params, shape, corners, spread, seed
):
    # Each tree's positions reordered even ones first (window.in_tree_order); each half one
    # window of the kernels, the halves joined toward -inf (_window_kernels.join_halves).
    assume(window_applies(params))
    check_route(params, shape, corners, spread, seed)


@pytest.mark.parametrize(
    "formats",
    [
        ("fp8_e4m3fnuz", "fp8_e4m3fnuz"),
        ("fp8_e4m3fnuz", "fp8_e5m2fnuz"),
        ("fp8_e5m2fnuz", "fp8_e4m3fnuz"),
        ("fp8_e5m2fnuz", "fp8_e5m2fnuz"),
    ],
)
@pytest.mark.parametrize("seed", range(3))
def test_mi300_fp8_takes_the_route_and_equals_the_generic_kernel(formats, seed):
    """MI300's FP8 MFMA (trees of 16 in two parity windows, the second alignment dropping a
    far c, a NaN c entering it at exponent -1): every pairing, K past whole trees, realistic
    and corner data (NaN c among them)."""
    params = unit("mi300").params(*formats)
    assert params.parity_windows and params.special_accumulator_exponent == -1
    assert window_applies(params)
    rows, length, columns = 5, 16 * (seed + 1) + 3 * seed, 6
    check_route(params, (rows, length, columns), seed % 2, [0, 4, 20][seed], seed)


@pytest.mark.parametrize("floor", [10, 12, 14])
def test_a_half_below_the_zero_term_exponent_is_the_generic_kernels(floor):
    """A parity tree (of 4, a 2-bit window) whose even half's reference is 14 and whose odd
    half holds a zero and one small negative product (reference 6): under a zero-term
    exponent between them the generic kernel raises the odd half's reference to it, which
    truncates that product to 0 (the route would keep it, as -1 at the joined LSB): the
    route leaves the output to the generic kernel."""
    params = dataclasses.replace(
        unit("mi300").params("fp8_e4m3fnuz", "fp8_e4m3fnuz"),
        fused_terms=4,
        align_fraction_bits=2,
        zero_term_exponent=floor,
    )
    assert window_applies(params)
    a = np.array([[1.5, -1.5 * 2.0**-8, 0.75, 0.0]])
    b = np.array([[1.25], [1.5], [-1.25], [1.125]])
    qa, qb = (quantize(x, "fp8_e4m3fnuz", axis=axis, block_size=32) for x, axis in ((a, 1), (b, 0)))
    qa, qb = (dataclasses.replace(q, scales=np.full_like(q.scales, 127)) for q in (qa, qb))
    c = np.zeros((1, 1), dtype=np.float32)
    fast, left = gemm(params, qa, qb, c, "window")
    slow, _ = gemm(params, qa, qb, c, "kernel")
    assert left[0].tolist() == [0]
    assert int(slow[0, 0]) == reference_bits(params, qa, qb, c, 0, 0) == 0x46800000
    np.testing.assert_array_equal(row_dot_bits(params, qa, qb, c), slow)


def test_parity_windows_take_the_route_for_even_trees_in_k_order_only():
    fp8 = unit("mi300").params("fp8_e4m3fnuz", "fp8_e5m2fnuz")
    assert window_applies(fp8)
    assert not window_applies(dataclasses.replace(fp8, fused_terms=15))
    assert not window_applies(dataclasses.replace(fp8, term_order=tuple(range(16))))


def test_in_tree_order_puts_each_trees_even_positions_first():
    params = dataclasses.replace(
        unit("mi300").params("fp8_e4m3fnuz", "fp8_e4m3fnuz"), fused_terms=4
    )
    codes = np.arange(1, 7, dtype=np.uint8)[None]  # a tree and a short one (zero-padded)
    assert in_tree_order(params, codes).tolist() == [[1, 3, 2, 4, 5, 0, 6, 0]]


def test_second_alignment_and_product_overflow_declarations():
    """The route takes a second alignment outside the tree without an n-bit sum, and a
    product overflow no product of two narrow formats reaches (fp16: below 2^32), or, for a
    wide format (bf16: products up to 2^256), one it bounds per call from the operands'
    offsets (tf32, 2^19 codes, as bf16)."""
    mi300 = unit("mi300")
    assert window_applies(mi300.params("fp16", "fp16"))
    assert window_applies(mi300.params("bf16", "bf16"))
    assert window_applies(mi300.params("tf32", "tf32"))
    fp16 = mi300.params("fp16", "fp16")
    assert not window_applies(dataclasses.replace(fp16, sum_significant_bits=24))
    assert not window_applies(dataclasses.replace(fp16, accumulator_in_tree=True))
    assert not window_applies(dataclasses.replace(fp16, product_overflow_exponent=30))
    assert window_applies(dataclasses.replace(fp16, product_overflow_exponent=33))
    scaled = h100(scales="products", block_size=32)  # block-scaled products: not bounded here
    assert window_applies(scaled)
    assert not window_applies(dataclasses.replace(scaled, product_overflow_exponent=128))


@st.composite
def wide_second_alignment_params(draw) -> DatapathParams:
    """bf16 and tf32 units with a second alignment and products that overflow at 2^n
    (MI300's bf16 and xf32 MFMA: n = 128): the route bounds a call's products by its
    operands' offsets."""
    params = draw(second_alignment_params())
    a_format, b_format = draw(
        st.sampled_from([("bf16", "bf16"), ("bf16", "fp8_e4m3"), ("tf32", "tf32")])
    )
    return dataclasses.replace(
        params,
        a_format=a_format,
        b_format=b_format,
        scales="none",
        product_overflow_exponent=draw(st.sampled_from([None, 128, 40])),
    )


@settings(max_examples=60, deadline=None)
@given(
    params=wide_second_alignment_params(),
    **{**ROUTE_CASES, "spread": st.sampled_from([0, 4, 20, 45, 90])},
)
def test_wide_second_alignment_equals_generic_kernel_and_fraction_twin(
    params, shape, corners, spread, seed
):
    assume(window_applies(params))
    check_route(params, shape, corners, spread, seed, wide_operands)


@pytest.mark.parametrize("scale", [1.0, 2.0**60, 2.0**-60])
def test_products_that_may_overflow_go_to_the_generic_kernel(scale):
    """MI300's bf16 path: products overflow at 2^128. Operands whose largest exponents sum
    to more (both near 2^64) leave every output to the generic kernel (which makes the
    overflowing products ±Inf); others take the route; every bit the generic kernel's, per
    GEMM and in batches."""
    config = unit("mi300")
    params = config.params("bf16", "bf16")
    assert window_applies(params)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((5, 48)) * scale
    b = rng.standard_normal((48, 7)) * scale
    a[0, 0] = 2.0**70 if scale > 1 else a[0, 0]  # a product of 2^130 with B's column
    b[0, :] = 2.0**60 if scale > 1 else b[0, :]
    qa, qb = (
        quantize(x, "bf16", axis=axis, per_tensor_scale=True, tensor_scale_exponent=0)
        for x, axis in ((a, 1), (b, 0))
    )
    c = np.zeros((5, 7), dtype=np.float32)
    fast, left = gemm(params, qa, qb, c, "window")
    slow, _ = gemm(params, qa, qb, c, "kernel")
    assert (len(left[0]) == fast.size) == (scale > 1)  # all outputs left, or none
    unflagged = np.ones(fast.shape, dtype=bool)
    unflagged[left] = False
    np.testing.assert_array_equal(fast[unflagged], slow[unflagged])
    np.testing.assert_array_equal(matmul(config, qa, qb).bits, slow)
    if scale > 1:
        assert np.isinf(matmul(config, qa, qb).values[0]).any()  # the unit's ±Inf products
    batch_a = np.stack([a, a / 2])
    batch_b = np.stack([b, b * 2])
    kw = dict(per_tensor_scale=True, a_format="bf16", b_format="bf16")
    np.testing.assert_array_equal(
        matmul_batched(config, batch_a, batch_b, **kw).bits,
        matmul_batched(config, batch_a, batch_b, method="kernel", **kw).bits,
    )
