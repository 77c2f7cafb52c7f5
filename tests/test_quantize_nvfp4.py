"""NVFP4 quantization (mxsim.quantize.nvfp4) against its Fraction twin, and its argument checks.

The live comparison with torchao's own NVFP4 is in tests/test_oracles_torchao.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import byte_copies, corner_float32, realistic_float32
from hypothesis import given, settings
from hypothesis import strategies as st

from mxsim.errors import ArgumentError, BudgetError, MxsimError
from mxsim.formats import get_format
from mxsim.quantize.nvfp4 import (
    NVFP4_ROUNDINGS,
    quantize_nvfp4,
    quantize_nvfp4_at_scales,
    quantize_nvfp4_grouped,
    tensor_scale_from_amax,
)
from mxsim.quantize.reference import quantize_nvfp4_reference

E2M1, UE4M3 = get_format("fp4_e2m1"), get_format("ue4m3")


def _twin_matches(x: np.ndarray, tensor_scale, **options) -> None:
    tensor = quantize_nvfp4(x, tensor_scale, **options)
    rows = x.reshape(-1, 16)
    for i, row in enumerate(rows):
        scale_code, codes = quantize_nvfp4_reference(
            [float(v) for v in row], tensor.tensor_scale, E2M1, UE4M3, **options
        )
        assert tensor.scales.reshape(-1)[i] == scale_code, (row, tensor_scale)
        assert tensor.codes.reshape(-1, 16)[i].tolist() == codes, (row, tensor_scale)


def _finite(x: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(x), np.float32(1.5), x)


def test_realistic_and_corner_blocks_match_the_twin():
    rng = np.random.default_rng(7)
    x = np.concatenate([realistic_float32(rng, 24, 32), _finite(corner_float32(rng, 8, 32))])
    x[0, :16] = 0.0
    x[1, :16] = -0.0
    _twin_matches(x, None)
    for t in (
        tensor_scale_from_amax(np.abs(x[np.isfinite(x)]).max()),
        2.0**-100,
        float(np.float32(3e30)),
    ):
        _twin_matches(x, t)


@settings(max_examples=60, deadline=None)
@given(
    bits=st.lists(st.integers(0, 2**32 - 1), min_size=16, max_size=16),
    exponent_shift=st.integers(-20, 20),
    tensor_scale=st.one_of(st.none(), st.floats(2.0**-100, 2.0**100, width=32)),
    scale_rounding=st.sampled_from(NVFP4_ROUNDINGS),
    element_rounding=st.sampled_from(NVFP4_ROUNDINGS),
)
def test_hypothesis_blocks_match_the_twin(
    bits, exponent_shift, tensor_scale, scale_rounding, element_rounding
):
    x = np.array(bits, dtype=np.uint32).view(np.float32)
    x = _finite(x)
    x = np.where(np.abs(x) < 1e30, x * np.float32(2.0**exponent_shift), x).astype(np.float32)
    _twin_matches(x, tensor_scale, scale_rounding=scale_rounding, element_rounding=element_rounding)


def test_worked_example():
    # amax 6 -> d = 1 -> scale 1.0 (code 0x38); elements are x itself rounded to E2M1.
    x = np.array([6.0, -2.5, 0.25, 1.25] + [0.0] * 12, dtype=np.float32)
    tensor = quantize_nvfp4(x)
    assert tensor.scales.tolist() == [0x38]
    assert E2M1.decode(tensor.codes[:4]).tolist() == [
        6.0,
        -2.0,
        0.0,
        1.0,
    ]  # 2.5 and 1.25 tie to even, 0.25 to 0
    # an all-zero block takes the clamp's scale 2^-6; Inf saturates to 6 with scale 448
    assert quantize_nvfp4(np.zeros(16, np.float32)).scales.tolist() == [0x08]
    inf = quantize_nvfp4(np.array([np.inf] + [1.0] * 15, dtype=np.float32))
    assert inf.scales.tolist() == [0x7E] and E2M1.decode(inf.codes[:1]).tolist() == [6.0]
    assert inf.exact_values()[0] == 6 * 448


def test_dequantize_rounds_as_float32_and_exact_values_do_not():
    x = np.linspace(-7, 7, 32, dtype=np.float32)
    t = float(np.float32(0.1))
    tensor = quantize_nvfp4(x, t)
    scales = UE4M3.decode(tensor.scales).repeat(16)
    exact = E2M1.decode(tensor.codes) * scales * float(np.float32(t))
    np.testing.assert_array_equal(tensor.exact_values(), exact)
    step = (np.float32(t) * scales.astype(np.float32)).astype(np.float32)
    np.testing.assert_array_equal(
        tensor.dequantize(), E2M1.decode(tensor.codes).astype(np.float32) * step
    )


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: quantize_nvfp4(np.zeros(16)), "float32"),
        (lambda: quantize_nvfp4([1.0] * 16), "float32"),
        (lambda: quantize_nvfp4(np.zeros(15, np.float32)), "multiple of 16"),
        (lambda: quantize_nvfp4(np.full(16, np.nan, np.float32)), "NaN"),
        (lambda: quantize_nvfp4(np.zeros(16, np.float32), 0.0), "tensor_scale"),
        (lambda: quantize_nvfp4(np.zeros(16, np.float32), np.inf), "tensor_scale"),
        (lambda: quantize_nvfp4(np.zeros(16, np.float32), 0.1), "tensor_scale"),  # not a float32
        (lambda: quantize_nvfp4(np.zeros(16, np.float32), True), "tensor_scale"),
        (lambda: quantize_nvfp4(np.zeros(16, np.float32), profile="nope"), "torchao"),
        (
            lambda: quantize_nvfp4(np.zeros(16, np.float32), scale_rounding="stochastic"),
            "nearest_even",
        ),
        (lambda: quantize_nvfp4(np.zeros(16, np.float32), scale_format="e8m0"), "significand"),
        (lambda: quantize_nvfp4(np.zeros(16, np.float32), element_format="fp32"), "element format"),
        (lambda: quantize_nvfp4(np.zeros(16, np.float32), colour="red"), "block_size"),
        (lambda: tensor_scale_from_amax(-1.0), "amax"),
        (lambda: quantize_nvfp4(np.zeros(16, np.float32), 2.0**-130), "overflows float32"),
    ],
)
def test_bad_arguments_get_clear_errors(call, message):
    with pytest.raises(MxsimError, match=message):
        call()


# ----------------------------------------------------------------------------- hostile arguments


@pytest.mark.parametrize(
    "scale",
    [
        np.array([0.5]),
        [0.5],
        (0.5,),
        1 + 0j,
        10**400,
        -(10**400),
        "0.5",
        b"0.5",
        True,
        None.__class__,
        0,
        -0.5,
        float("nan"),
        float("inf"),
        1e39,
    ],
)
def test_tensor_scale_of_the_wrong_type_or_range_is_refused(scale):
    with pytest.raises(ArgumentError, match="tensor_scale") as caught:
        quantize_nvfp4(np.ones((2, 16), np.float32), scale)
    assert len(str(caught.value)) < 200


@pytest.mark.parametrize("scale", [0.5, np.float32(0.1), np.float64(0.25), 2, np.int64(3)])
def test_tensor_scale_of_any_real_number_type_holding_a_float32(scale):
    assert quantize_nvfp4(np.ones((2, 16), np.float32), scale).tensor_scale == float(
        np.float32(scale)
    )


@pytest.mark.parametrize("amax", [1e-45, 1e-42, np.float32(1e-45)])
def test_tensor_scale_from_an_amax_that_underflows_is_refused(amax):
    with pytest.raises(ArgumentError, match="underflows"):
        tensor_scale_from_amax(amax)


@pytest.mark.parametrize(
    "amax", ["0.5", [1.0], np.array(1.0), 1 + 0j, 10**400, True, 0, -1.0, float("nan")]
)
def test_tensor_scale_from_amax_refuses_what_is_no_positive_number(amax):
    with pytest.raises(ArgumentError, match="amax"):
        tensor_scale_from_amax(amax)


def test_smallest_amax_with_a_nonzero_scale():
    # 2688 * 2^-149 / 2: the float32 quotient rounds up to the smallest subnormal
    assert tensor_scale_from_amax(np.float32(2.0**-149 * 1345)) == 2.0**-149


@pytest.mark.parametrize("shape", [(0, 16), (3, 0), (0,), (2, 0, 32)])
def test_empty_input_gives_empty_codes_and_scales(shape):
    tensor = quantize_nvfp4(np.zeros(shape, np.float32))
    assert tensor.codes.shape == shape and tensor.scales.shape == (*shape[:-1], shape[-1] // 16)
    assert tensor.dequantize().shape == shape


def test_masked_array_is_refused():
    with pytest.raises(ArgumentError, match="masked"):
        quantize_nvfp4(
            np.ma.masked_array(np.ones((2, 16), np.float32), mask=[[True] * 16, [False] * 16])
        )


def test_budget_is_checked_before_any_copy(monkeypatch):
    monkeypatch.setenv("MXSIM_MAX_BYTES", "1M")
    huge = np.broadcast_to(
        np.float16(1), (1 << 20, 1 << 14)
    )  # 32 GiB as float16, no memory behind it
    with pytest.raises(BudgetError):
        quantize_nvfp4(huge)


@pytest.mark.parametrize("tensor_scale", [None, "amax"])
def test_at_the_scales_the_recipe_chose_the_codes_are_the_recipes(tensor_scale):
    rng = np.random.default_rng(11)
    x = realistic_float32(rng, 24, 64)
    t = tensor_scale_from_amax(np.abs(x).max()) if tensor_scale else None
    plain = quantize_nvfp4(x, t)
    again = quantize_nvfp4_at_scales(x, plain.scales, t)
    assert np.array_equal(again.codes, plain.codes) and np.array_equal(again.scales, plain.scales)
    assert again.tensor_scale == plain.tensor_scale
    # the dequantized values, quantized again at the same scales, give the same codes
    back = quantize_nvfp4_at_scales(plain.dequantize(), plain.scales, t)
    assert np.array_equal(back.codes, plain.codes)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    scale_codes=st.lists(st.integers(1, 0x7E), min_size=4, max_size=4),
    with_tensor_scale=st.booleans(),
)
def test_at_given_scales_blocks_match_the_twin(seed, scale_codes, with_tensor_scale):
    """Realistic blocks at scale codes drawn anywhere in UE4M3 (most far from the recipe's:
    elements saturate or underflow), with or without their tensor's scale."""
    x = realistic_float32(np.random.default_rng(seed), 1, 64)
    t = tensor_scale_from_amax(np.abs(x).max()) if with_tensor_scale else None
    scales = np.array([scale_codes], np.uint8)
    tensor = quantize_nvfp4_at_scales(x, scales, t)
    assert np.array_equal(tensor.scales, scales)
    for i, row in enumerate(x.reshape(-1, 16)):
        code, codes = quantize_nvfp4_reference(
            [float(v) for v in row], t, E2M1, UE4M3, scale_code=int(scale_codes[i])
        )
        assert code == scale_codes[i] and tensor.codes.reshape(-1, 16)[i].tolist() == codes


def test_at_given_scales_a_block_is_encoded_at_them():
    """[4, -2, 1, ...] at scale 1 (code 0x38) are E2M1 codes of 4, -2, 1; at scale 2 (0x40)
    they are 2, -1, 0.5; the recipe would choose the scale 4/6."""
    x = np.array([[4.0, -2.0, 1.0] + [0.0] * 13], np.float32)
    e2m1 = get_format("fp4_e2m1")
    for code, want in ((0x38, [4.0, -2.0, 1.0]), (0x40, [2.0, -1.0, 0.5])):
        got = quantize_nvfp4_at_scales(x, np.array([[code]], np.uint8))
        assert e2m1.decode(got.codes[0, :3]).tolist() == want


@pytest.mark.parametrize(
    "scales, message",
    [
        (np.full((2, 2), 0x38, np.uint8), r"scales must be a uint8 array of shape \(2, 1\)"),
        (np.full((2, 1), 0x38, np.int16), r"scales must be a uint8 array of shape \(2, 1\)"),
        ([[0x38], [0x38]], r"scales must be a uint8 array"),
        (np.array([[0x38], [0x7F]], np.uint8), "scales hold a NaN code"),
    ],
)
def test_at_scales_refuses_bad_scales(scales, message):
    with pytest.raises(ArgumentError, match=f"^quantize_nvfp4_at_scales: {message}"):
        quantize_nvfp4_at_scales(np.ones((2, 16), np.float32), scales)


def test_at_scales_refuses_bad_inputs():
    scales = np.full((1, 1), 0x38, np.uint8)
    with pytest.raises(ArgumentError, match="x has NaN"):
        quantize_nvfp4_at_scales(np.full((1, 16), np.nan, np.float32), scales)
    with pytest.raises(ArgumentError, match="multiple of 16"):
        quantize_nvfp4_at_scales(np.ones((1, 8), np.float32), scales)
    with pytest.raises(ArgumentError, match="tensor_scale: expected a positive finite"):
        quantize_nvfp4_at_scales(np.ones((1, 16), np.float32), scales, -1.0)
    with pytest.raises(ArgumentError, match="overflows float32"):
        quantize_nvfp4_at_scales(
            np.ones((1, 16), np.float32), np.zeros((1, 1), np.uint8), 2.0**-149
        )


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_nvfp4_quantizers_leave_their_inputs_unchanged(dtype):
    """quantize_nvfp4 (one and two levels) and quantize_nvfp4_at_scales leave every byte of
    ``x`` (C-contiguous: its own memory is the blocked input) and of the scales as it was."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((6, 64)) * np.exp2(rng.integers(-8, 9, (6, 1)))).astype(dtype)
    x.reshape(-1)[:5] = [-0.0, np.inf, -np.inf, np.nan, 1e-7]
    x[0] = -0.0
    finite = np.where(np.isfinite(x), x, 0).astype(dtype)
    kept = byte_copies([x, finite])
    quantize_nvfp4(x)
    tensor = quantize_nvfp4(finite, tensor_scale_from_amax(float(np.abs(finite).max())))
    scales = tensor.scales.copy()
    scale_bytes = byte_copies(scales)
    quantize_nvfp4_at_scales(finite, scales, tensor.tensor_scale)
    assert byte_copies([x, finite]) == kept and byte_copies(scales) == scale_bytes


# --- groups: a batch of tensors, each with its own tensor scale ---------------------------------


def _grouped_input(seed: int) -> np.ndarray:
    """(5, 3, 48): realistic groups of different magnitudes, an all-zero group (no tensor
    scale from its amax), one with Inf and one with corner values."""
    rng = np.random.default_rng(seed)
    x = np.stack([realistic_float32(rng, 3, 48) * np.float32(2.0**e) for e in (-30, 0, 5, 0, 0)])
    x[3] = 0.0
    x[4] = _finite(corner_float32(rng, 3, 48))
    x[2, 1, 7] = -np.inf
    return x


@pytest.mark.parametrize("how", ["none", "amax", "given"])
def test_groups_equal_one_call_per_group(how):
    x = _grouped_input(21)
    finite_amax = [np.abs(g[np.isfinite(g)]).max() for g in x]
    per_group = {
        "none": [None] * 5,
        "amax": [tensor_scale_from_amax(a) if a > 0 else None for a in finite_amax],
        "given": [2.0**-3, None, float(np.float32(0.1)), 1.0, 2.0**40],
    }[how]
    groups = quantize_nvfp4_grouped(x, {"none": None, "amax": "amax", "given": per_group}[how])
    assert len(groups) == 5 and groups.tensor_scales == tuple(per_group)
    exact = groups.exact_values()
    for g, tensor in enumerate(groups.tensors()):
        alone = quantize_nvfp4(x[g], per_group[g])
        assert np.array_equal(tensor.codes, alone.codes) and tensor.codes.base is not None
        assert np.array_equal(tensor.scales, alone.scales)
        assert tensor.tensor_scale == alone.tensor_scale
        np.testing.assert_array_equal(exact[g], alone.exact_values())
    unscaled = groups.exact_values(with_tensor_scales=False)
    np.testing.assert_array_equal(
        unscaled * groups.tensor_scale_array()[:, None, None], exact
    )  # e * s * t, each exact: multiplying by t is exact too
    assert per_group[3] is None or how == "given"  # the zero group has no amax scale


def test_groups_amax_scale_of_a_group_too_small_for_one_is_none():
    x = np.zeros((2, 1, 16), np.float32)
    x[0, 0, 0] = np.float32(1e-42)  # amax / 2688 underflows float32
    x[1, 0, 0] = 1.0
    groups = quantize_nvfp4_grouped(x, "amax")
    assert groups.tensor_scales == (None, tensor_scale_from_amax(1.0))


@pytest.mark.parametrize(
    "x, scales, message",
    [
        (np.ones(16, np.float32), None, "must be (groups, ..., K)"),
        (np.ones((2, 1, 16), np.float32), "max", "must be None, 'amax' or a sequence"),
        (np.ones((2, 1, 16), np.float32), 0.5, "must be None, 'amax' or a sequence"),
        (np.ones((2, 1, 16), np.float32), [0.5], "1 entries for 2 groups"),
        (np.ones((2, 1, 16), np.float32), [0.5, 0.1], "tensor_scales[1]: must be exactly"),
        (np.ones((2, 1, 16), np.float32), [0.5, -1.0], "tensor_scales[1]: expected a positive"),
        (np.ones((2, 1, 12), np.float32), None, "must be a multiple of 16"),
        (np.full((2, 1, 16), np.nan, np.float32), None, "NaN"),
        (np.ones((2, 1, 16)), None, "expected a float32"),
    ],
)
def test_groups_refuse_bad_arguments(x, scales, message):
    with pytest.raises(ArgumentError) as error:
        quantize_nvfp4_grouped(x, scales)
    assert message in str(error.value) and "quantize_nvfp4_grouped" in str(error.value)


@pytest.mark.parametrize("name", ["fp4_e2m1", "ue4m3", "fp6_e2m3", "fp8_e4m3"])
def test_the_kernels_nearest_even_search_is_the_formats_rounding(name):
    """Every value, every midpoint between neighbours and the float32 values either side of
    each, and random magnitudes up to the largest: the bisection's and the count's index is
    encode's code."""
    from mxsim.quantize._nvfp4_kernels import nearest_even_count, nearest_even_index

    fmt = get_format(name)
    values = fmt.decode(np.arange(1 << (fmt.bits - fmt.signed)))
    values = values[: np.argmin(np.isfinite(values))] if not np.isfinite(values).all() else values
    middles = ((values[:-1] + values[1:]) / 2).astype(np.float32)
    rng = np.random.default_rng(3)
    probes = np.concatenate(
        [
            values.astype(np.float32),
            middles,
            np.nextafter(middles, np.float32(0)),
            np.nextafter(middles, np.float32(np.inf)),
            (rng.random(20_000) * values[-1]).astype(np.float32),
        ]
    )
    probes = probes[probes <= values[-1]]
    want = fmt.encode(probes, "nearest_even").astype(np.int64)
    got = np.array([nearest_even_index(float(p), values) for p in probes])
    np.testing.assert_array_equal(got, want)
    halves = tuple(float(m) for m in (values[:-1] + values[1:]) / 2)
    counted = np.array([nearest_even_count(float(p), halves) for p in probes])
    np.testing.assert_array_equal(counted, want)
