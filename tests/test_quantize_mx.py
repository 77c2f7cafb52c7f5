"""MX block quantization: kernel against the Fraction twin, measured library rows, corners."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import byte_copies
from mxsim import MXTensor, fake_quantize, get_format, quantize_mx as quantize
from mxsim.errors import ArgumentError, MxsimError, UnknownNameError
from mxsim.quantize import quantize_at_scales, quantize_grouped, quantize_groups
from mxsim.quantize.mx import _prepare, _quantize_blocked
from mxsim.quantize.options import PROFILES, QuantOptions, resolve_options
from mxsim.quantize.reference import quantize_block_reference

ELEMENT_FORMATS = ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8"]


def one_block(values, fmt, **options):
    tensor = quantize(np.array(values, dtype=np.float32), fmt, block_size=len(values), **options)
    return tensor.dequantize(), int(tensor.scales[0])


# --- separating vectors (docs/profiles.md §3, vector 2; torchao): block amax -> dequantized max -


@pytest.mark.parametrize(
    "fmt, amax, expected",
    [
        ("fp8_e4m3", 480.0, {"floor": 448, "rceil": 480, "ceil": 480, "even": 448}),
        ("fp8_e4m3", 500.0, {"floor": 448, "rceil": 512, "ceil": 512, "even": 512}),
        ("fp4_e2m1", 7.0, {"floor": 6, "rceil": 8, "ceil": 8, "even": 8}),
    ],
)
def test_scale_rules_reproduce_the_measured_table(fmt, amax, expected):
    for rule, dequantized_max in expected.items():
        values, _ = one_block([amax, 1.0, -0.5, 0.0], fmt, scale_rule=rule)
        assert values.max() == dequantized_max, rule


def test_float_log2_trap_gives_the_ocp_answer():
    # float32 log2(7.9999995) returns exactly 3.0; the exponent bits say 2, so OCP's floor
    # rule keeps scale 1 and the element rounds to fp4's max, 6.
    x = np.float32(7.9999995)
    assert np.log2(x) == 3.0
    values, scale = one_block([float(x), 1.0], "fp4_e2m1")
    assert (values.max(), scale) == (6.0, 127)


def test_floor_clips_the_block_max():
    values, scale = one_block([960.0, 957.0], "fp8_e4m3")
    assert scale == 128 and values.tolist() == [896.0, 896.0]


def test_microxcaling_rounds_ties_away_and_clamps_int8():
    values, _ = one_block([400.0, 448.0], "fp8_e4m3", profile="microxcaling")
    assert values[0] == 416
    values, _ = one_block([400.0, 448.0], "fp8_e4m3", profile="ocp")
    assert values[0] == 384
    values, _ = one_block([-1.999, 1.0], "int8", profile="microxcaling")
    assert values[0] == -127 / 64
    values, _ = one_block([-1.999, 1.0], "int8", profile="ocp")
    assert values[0] == -2.0


def test_mxint8_corners_at_scale_one():
    values, scale = one_block([1.0, 0.0078125, 1.99609375], "int8", element_rounding="nearest_away")
    assert scale == 127
    assert values.tolist() == [1.0, 0.015625, 1.984375]


# --- nonfinite, zero, and scale-range policies ------------------------------------------------


def test_nan_block_policy_makes_the_whole_block_nan():
    tensor = quantize(
        np.array([1.0, np.nan, 2.0, 3.0, 1.0, 2.0], dtype=np.float32), "fp8_e4m3", block_size=3
    )
    assert tensor.scales.tolist() == [0xFF, 127 + 1 - 8]  # amax 3: E = 1, emax 8
    out = tensor.dequantize()
    assert np.isnan(out[:3]).all()
    assert out[3:].tolist() == [3.0, 1.0, 2.0]


def test_propagate_keeps_other_elements():
    x = np.array([np.nan, 3.0, np.inf, 1.0], dtype=np.float32)
    out = fake_quantize(x, "fp4_e2m1", block_size=4, nonfinite="propagate")
    # amax over the finite values is 3: X = 1 - 2 = -1; NaN and Inf come back unchanged.
    assert np.isnan(out[0]) and out[1:].tolist() == [3.0, np.inf, 1.0]
    e5m2 = quantize(
        x, "fp8_e5m2", block_size=4, nonfinite="propagate", element_overflow="inf_nan"
    ).dequantize()
    assert np.isnan(e5m2[0]) and e5m2[1:].tolist() == [3.0, np.inf, 1.0]
    with pytest.raises(MxsimError, match="no NaN code"):
        quantize(x, "fp4_e2m1", block_size=4, nonfinite="propagate")
    with pytest.raises(MxsimError, match="cannot hold"):
        quantize(x, "fp8_e4m3", block_size=4, nonfinite="propagate")
    with pytest.raises(MxsimError, match="NaN or Inf"):
        quantize(x, "fp4_e2m1", block_size=4, nonfinite="raise")


def test_zero_block_gets_the_smallest_scale():
    tensor = quantize(np.zeros(32, dtype=np.float32), "fp8_e4m3")
    assert tensor.scales.tolist() == [0] and (tensor.dequantize() == 0).all()


def test_scale_underflow_clamp_versus_unclamped():
    x = np.array([2.0**-130, 2.0**-131], dtype=np.float64)
    clamped = fake_quantize(x, "fp8_e4m3", block_size=2)
    unclamped = fake_quantize(x, "fp8_e4m3", block_size=2, scale_underflow="unclamped")
    assert unclamped.tolist() == x.tolist()  # the ideal scale 2^-138 keeps them exact
    assert clamped.tolist() == [
        2.0**-130,
        2.0**-131,
    ]  # within e4m3 subnormals of 2^-127: still exact
    tiny = np.array([2.0**-140, 3 * 2.0**-141])
    assert fake_quantize(tiny, "fp8_e4m3", block_size=2)[0] == 0.0  # below 2^-136: flushed
    assert (
        fake_quantize(tiny, "fp8_e4m3", block_size=2, scale_underflow="unclamped").tolist()
        == tiny.tolist()
    )
    with pytest.raises(MxsimError, match="fake_quantize"):
        quantize(tiny, "fp8_e4m3", block_size=2, scale_underflow="unclamped")


def test_zero_signs():
    # Block [1.0, -2^-10, -0.0, -2^-200 (float64)], fp4_e2m1: X = 0 - 2 = -2, step 2^-3 at
    # the bottom, so the three negatives round to zero.  2^-200 * 2^2 <= 2^-150 underflows.
    x = np.array([1.0, -(2.0**-10), -0.0, -(2.0**-200)])
    signs = {
        "code": [1, 1, 1],  # fp4 is sign-magnitude: the code keeps the input's sign
        "positive": [0, 0, 0],
        "input": [1, 1, 1],
        "input_if_underflow": [0, 1, 1],  # -2^-10 * 2^2 is no float32 zero
        # over the step 2^(X-1) = 2^-3: -2^-7 stays negative, -0.0 and -2^-197 are zeros
        "input_unless_underflow": [1, 0, 0],
    }
    for rule, expected in signs.items():
        out = fake_quantize(x, "fp4_e2m1", block_size=4, zero_signs=(("fp4_e2m1", rule),))
        assert out[0] == 1.0 and (out[1:] == 0).all()
        assert np.signbit(out[1:]).astype(int).tolist() == expected, rule
    # INT8 has one zero code (+0); "input" restores the sign; other formats are unaffected.
    assert np.signbit(fake_quantize(x, "int8", block_size=4)[1:]).tolist() == [False] * 3
    assert np.signbit(
        fake_quantize(x, "int8", block_size=4, zero_signs=(("int8", "input"),))[1:]
    ).all()
    assert np.signbit(
        fake_quantize(x, "fp4_e2m1", block_size=4, zero_signs=(("int8", "positive"),))[1:]
    ).all()
    with pytest.raises(MxsimError, match="zero sign rule"):
        QuantOptions(zero_signs=(("int8", "negative"),))


def test_inf_field_and_even_rounding_to_inf():
    # inf_field: Inf reads as amax 2^128, so fp8_e4m3 gets X = 128 - 8 = 120 (code 247).
    x = np.array([np.inf, 1.0, 2.0**121], dtype=np.float32)
    tensor = quantize(x, "fp8_e4m3", block_size=3, nonfinite="inf_field")
    assert tensor.scales.tolist() == [247]
    assert tensor.dequantize().tolist() == [448 * 2.0**120, 0.0, 2.0**121]
    # even, fp4_e2m1 (p = 1): amax = 1.75 * 2^127 rounds to 2^128, float32's Inf pattern, so
    # the block behaves as if it held an Inf: NaN block, X = 127, or X = 128 - 2 = 126.
    y = np.array([1.75 * 2.0**127, 2.0**124], dtype=np.float32)
    for nonfinite, code in [
        ("nan_block", 0xFF),
        ("inf_scale_max", 254),
        ("inf_field", 253),
        ("propagate", 253),
    ]:
        assert quantize(
            y, "fp4_e2m1", block_size=2, scale_rule="even", nonfinite=nonfinite
        ).scales.tolist() == [code]
    # Just below the rounding threshold (1.7499999 * 2^127) nothing changes: X = 127 - 2.
    below = np.array([np.nextafter(np.float32(1.75 * 2.0**127), np.float32(0))], np.float32)
    assert quantize(
        below, "fp4_e2m1", block_size=1, scale_rule="even", nonfinite="inf_scale_max"
    ).scales.tolist() == [252]


def test_int8_min_step_and_min_scale_element_exponent():
    # amax 2^-125 (int8, floor): X = -125, step 2^-131.  A floor of 2^-126 on the step raises
    # X to -120: 1.5 * 2^-126 = 1.5 steps -> 2 (ties to even) -> 2^-125.
    x = np.array([2.0**-125, 1.5 * 2.0**-126], dtype=np.float32)
    assert fake_quantize(x, "int8", block_size=2).tolist() == x.tolist()
    raised = quantize(x, "int8", block_size=2, int8_min_step_exponent=-126)
    assert raised.scale_exponents.tolist() == [-120]
    assert raised.dequantize().tolist() == [2.0**-125, 2.0**-125]
    assert (
        fake_quantize(x, "fp4_e2m1", block_size=2, int8_min_step_exponent=-126).tolist()
        == fake_quantize(x, "fp4_e2m1", block_size=2).tolist()
    )  # INT8 only
    # A block whose scale is 2^-127 (fp8_e4m3: amax < 2^-119) encodes x * 2^126 but keeps
    # the scale: 2^-121 -> 32 = code 0x60, read back as 32 * 2^-127 = 2^-122.
    z = np.array([2.0**-121], dtype=np.float32)
    tensor = quantize(z, "fp8_e4m3", block_size=1, min_scale_element_exponent=-126)
    assert tensor.scales.tolist() == [0] and tensor.codes.tolist() == [0x60]
    assert tensor.dequantize().tolist() == [2.0**-122]
    # k = 0: elements unscaled, so 2^-121 is far below e4m3's smallest subnormal: 0.
    assert fake_quantize(z, "fp8_e4m3", block_size=1, min_scale_element_exponent=0).tolist() == [
        0.0
    ]


def test_rceil_from_float_log2():
    # torchao eager RCEIL, fp8_e4m3: X = ceil(log2(float32(amax / 448))).  amax = 448: 1.0 -> 0.
    # amax = 448 + 2^-15 (the next float32): the quotient rounds to 1 + 2^-23, whose float32
    # log2 (1.7e-7) is nonzero, ceil 1.  The exact rule agrees on both.
    for amax, code in [(448.0, 127), (float(np.nextafter(np.float32(448), np.float32(1e9))), 128)]:
        x = np.array([amax], np.float32)
        assert quantize(
            x, "fp8_e4m3", block_size=1, scale_rule="rceil", exponent_source="log2"
        ).scales.tolist() == [code]
        assert quantize(x, "fp8_e4m3", block_size=1, scale_rule="rceil").scales.tolist() == [code]
    # amax = 2^-140: the float32 quotient 2^-140 / 448 = 1.14 * 2^-149 rounds to the
    # subnormal 2^-149, log2 -149, clamped to -127.
    assert quantize(
        np.array([2.0**-140], np.float32), "fp8_e4m3", block_size=1, profile="torchao-rceil"
    ).scales.tolist() == [0]


def test_scale_overflow_nan_or_clamp():
    x = np.array([2.0**127 * 1.5, 1.0], dtype=np.float32)
    assert quantize(x, "int8", block_size=2, scale_rule="ceil").scales[0] == 0xFF
    assert (
        quantize(x, "int8", block_size=2, scale_rule="ceil", scale_overflow="clamp").scales[0]
        == 254
    )


# --- shapes, axes, padding ----------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_any_axis_round_trips_shape_and_matches_per_block(axis):
    x = np.random.default_rng(3).standard_normal((3, 5, 7)).astype(np.float32) * 10
    tensor = quantize(x, "fp8_e5m2", axis=axis, block_size=4)
    out = tensor.dequantize()
    assert out.shape == x.shape
    moved = np.moveaxis(x, axis, -1)
    n = moved.shape[-1]
    assert tensor.padding == -n % 4 and tensor.codes.shape[-1] == n + tensor.padding
    for index in np.ndindex(tensor.scales.shape):
        *outer, block = index
        chunk = list(moved[tuple(outer)][block * 4 : (block + 1) * 4]) + [0.0] * 4
        exponent, codes = quantize_block_reference(
            [float(v) for v in chunk[:4]], get_format("fp8_e5m2"), QuantOptions()
        )
        assert tensor.scales[index] == exponent + 127
        values = tensor.block_values(index)
        assert [float(v) for v in values[: len(codes)]] == [
            float(get_format("fp8_e5m2").value_of(c)) * 2.0**exponent for c in codes
        ]


def test_quark_names_and_float_dtypes():
    x = np.linspace(-3, 3, 64)
    for dtype in (np.float16, np.float32, np.float64):
        assert isinstance(quantize(x.astype(dtype), "MXFP6E2M3"), MXTensor)
    np.testing.assert_array_equal(
        quantize(x.astype(np.float32), "MXFP6E2M3").dequantize(),
        quantize(x.astype(np.float32), "fp6_e2m3").dequantize(),
    )


def test_dequantize_float32_is_the_rounded_exact_value():
    x = np.random.default_rng(4).standard_normal(256).astype(np.float32)
    tensor = quantize(x, "fp8_e4m3")
    np.testing.assert_array_equal(
        tensor.dequantize(np.float32), tensor.dequantize().astype(np.float32)
    )


def test_bad_arguments_get_clear_errors():
    x = np.ones((2, 8), dtype=np.float32)
    with pytest.raises(UnknownNameError, match="ocp"):
        quantize(x, "fp8_e4m3", profile="nvidia")
    with pytest.raises(UnknownNameError, match="scale_rule"):
        quantize(x, "fp8_e4m3", scale_rules="floor")
    with pytest.raises(UnknownNameError, match="rceil"):
        quantize(x, "fp8_e4m3", scale_rule="round")
    with pytest.raises(MxsimError, match="quantize: axis: expected an integer -2..1, got 2"):
        quantize(x, "fp8_e4m3", axis=2)
    with pytest.raises(MxsimError, match="block_size"):
        quantize(x, "fp8_e4m3", block_size=0)
    with pytest.raises(MxsimError, match="dtype int64"):
        quantize(np.ones(4, dtype=np.int64), "fp8_e4m3")
    with pytest.raises(MxsimError, match="numpy array"):
        quantize({"a": 1}, "fp8_e4m3")
    with pytest.raises(UnknownNameError, match="fp4_e2m1"):
        quantize(x, "fp3")


def test_profiles_resolve_with_overrides():
    assert resolve_options("quark", scale_rule="floor").scale_rule == "floor"
    assert set(PROFILES) >= {"ocp", "microxcaling", "quark", "quark-onnx", "torchao"}


# --- hypothesis: kernel == reference twin, every format and option ----------------------------

block_values = st.lists(
    st.one_of(
        st.floats(-1e6, 1e6, width=32),
        st.floats(allow_nan=False, allow_infinity=False, width=32),
        st.sampled_from(
            [
                0.0,
                -0.0,
                np.inf,
                -np.inf,
                np.nan,
                2.0**-149,
                448.0,
                464.0,
                6.0,
                7.0,
                480.0,
                1.75 * 2.0**127,
                1.9375 * 2.0**127,
                2.0**-127,
                2.0**-121,
            ]
        ),
    ),
    min_size=1,
    max_size=9,
)
options_strategy = st.builds(
    QuantOptions,
    scale_rule=st.sampled_from(["floor", "ceil", "even", "rceil"]),
    element_rounding=st.sampled_from(["nearest_even", "nearest_away", "toward_zero", "stochastic"]),
    element_overflow=st.just("saturate"),
    nonfinite=st.sampled_from(["nan_block", "propagate", "inf_scale_max", "inf_field"]),
    exponent_source=st.sampled_from(["bits", "field", "log2"]),
    scale_underflow=st.sampled_from(["clamp", "unclamped", "unclamped_eps"]),
    scale_overflow=st.sampled_from(["nan", "clamp"]),
    int8_minus_two=st.booleans(),
    int8_min_step_exponent=st.sampled_from([None, -126, -140]),
    min_scale_element_exponent=st.sampled_from([None, -126, 0]),
    seed=st.integers(0, 2**31),
)


@given(values=block_values, fmt_name=st.sampled_from(ELEMENT_FORMATS), options=options_strategy)
def test_kernel_equals_reference_twin(values, fmt_name, options):
    if options.nonfinite == "propagate" and not get_format(fmt_name).has_nan:
        values = [v for v in values if not math.isnan(v)] or [0.0]
    _assert_kernel_equals_twin(values, fmt_name, options)


def _assert_kernel_equals_twin(values: list, fmt_name: str, options: QuantOptions) -> None:
    """One block of float32 ``values``: the kernel's shared exponent and codes are the
    reference twin's."""
    fmt = get_format(fmt_name)
    if fmt.twos_complement:
        fmt = dataclasses.replace(fmt, allow_min_twos_complement=options.int8_minus_two)
    x = np.array(values, dtype=np.float32)
    fmt_used, opts, arr = _prepare(x, fmt_name, "ocp", dataclasses.asdict(options))
    codes, exponents, _, _ = _quantize_blocked(arr, fmt_used, opts, -1, len(values))
    exponent, want_codes = quantize_block_reference([float(v) for v in x], fmt, options)
    got_exponent = None if exponents[0] == 1 << 20 else int(exponents[0])
    assert got_exponent == exponent
    if exponent is not None:
        assert codes.tolist() == want_codes


CORNERS = [0.0, -0.0, np.inf, -np.inf, np.nan, 2.0**-149, -(2.0**-140), 3.0e38, -(2.0**-126)]


@st.composite
def realistic_blocks(draw):
    """A block of 32 float32 values of one magnitude (as activations are), with a minority
    of corners at drawn places: zeros, subnormals, Inf, NaN, values near float32's largest;
    sometimes every element a zero."""
    if draw(st.integers(0, 9)) == 0:
        return [draw(st.sampled_from([0.0, -0.0])) for _ in range(32)]
    exponent = draw(st.integers(-130, 120))
    values = draw(
        st.lists(st.floats(-4.0, 4.0, width=32), min_size=32, max_size=32).map(
            lambda vs: [math.ldexp(v, exponent) for v in vs]
        )
    )
    places = draw(st.lists(st.integers(0, 31), max_size=4))
    for place in places:
        values[place] = draw(st.sampled_from(CORNERS))
    return values


@given(
    values=realistic_blocks(),
    fmt_name=st.sampled_from(ELEMENT_FORMATS),
    options=options_strategy.filter(lambda o: o.element_rounding != "stochastic"),
)
def test_table_path_equals_reference_twin_on_full_blocks(values, fmt_name, options):
    """Blocks of 32 through the table path (deterministic rounding), zero, subnormal and
    non-finite elements mixed in among normal ones, equal the reference twin's codes."""
    if options.nonfinite == "propagate" and not get_format(fmt_name).has_nan:
        values = [0.0 if math.isnan(v) else v for v in values]
    _assert_kernel_equals_twin(values, fmt_name, options)


# --- profile vectors (docs/profiles.md §3, each derived by hand from the library source) ------

F32_MAX = float(np.finfo(np.float32).max)
PROFILE_VECTORS = [
    # (vector #, profile, format, block, expected dequantized values)
    (3, "microxcaling", "fp8_e4m3", [448.0, 400.0], [448.0, 416.0]),
    (3, "ocp", "fp8_e4m3", [448.0, 400.0], [448.0, 384.0]),
    (7, "ocp", "fp4_e2m1", [7.9999995], [6.0]),
    (7, "microxcaling", "fp4_e2m1", [7.9999995], [8.0]),
    (7, "quark-floor", "fp4_e2m1", [7.9999995], [8.0]),
    (7, "gfloat", "fp4_e2m1", [7.9999995], [8.0]),
    (8, "ocp", "fp8_e4m3", [F32_MAX], [448.0 * 2.0**119]),
    (8, "microxcaling", "fp8_e4m3", [F32_MAX], [256.0 * 2.0**120]),  # +Inf once cast to float32
    (9, "microxcaling", "int8", [1.0, 0.0078125], [1.0, 0.015625]),
    (9, "quark", "int8", [1.0, 0.0078125], [1.0, 0.0]),
    (11, "microxcaling", "int8", [1.99609375, -1.99609375], [1.984375, -1.984375]),
    (11, "quark-onnx", "int8", [1.99609375, -1.99609375], [1.984375, -2.0]),
    (11, "gfloat", "int8", [1.99609375, -1.99609375], [1.984375, -2.0]),
    (11, "quark-ceil", "int8", [1.99609375, -1.99609375], [2.0, -2.0]),
    (12, "quark", "int8", [1.999], [2.0]),
    (12, "ocp", "int8", [1.999], [1.984375]),
    (13, "ocp", "fp8_e4m3", [2.0**-120, 2.0**-137], [2.0**-120, 0.0]),
    (13, "microxcaling", "fp8_e4m3", [2.0**-120, 2.0**-137], [2.0**-120, 2.0**-136]),
    (13, "quark-floor", "fp8_e4m3", [2.0**-120, 2.0**-137], [2.0**-120, 2.0**-137]),
    (13, "quark-onnx", "fp8_e4m3", [2.0**-120, 2.0**-137], [2.0**-120, 2.0**-137]),
    (14, "ocp", "fp8_e4m3", [2.0**-140, 2.0**-149], [0.0, 0.0]),
    (14, "quark-onnx", "fp8_e4m3", [2.0**-140, 2.0**-149], [2.0**-140, 0.0]),
    (14, "quark-floor", "fp8_e4m3", [2.0**-140, 2.0**-149], [2.0**-140, 2.0**-149]),
    (15, "quark-floor", "fp8_e5m2", [2.0**-140], [0.0]),
    (15, "ocp", "fp8_e5m2", [2.0**-140], [2.0**-140]),
    (15, "quark-onnx", "fp8_e5m2", [2.0**-140], [2.0**-140]),
    (16, "ocp", "fp8_e4m3", [np.nan, 1.0], [np.nan, np.nan]),
    (16, "quark-onnx", "fp8_e4m3", [np.nan, 1.0], [np.nan, 1.0]),
    (
        17,
        "torchao",
        "fp8_e4m3",
        [np.inf, 1.0],
        [448.0 * 2.0**120, 0.0],
    ),  # torchao 0.18: Inf reads as 2^128
    (17, "quark", "fp8_e4m3", [np.inf, 1.0], [448.0 * 2.0**127, 0.0]),  # float32: +Inf
    (17, "gfloat", "fp8_e4m3", [np.inf, 1.0], [448.0 * 2.0**127, 0.0]),
    (18, "quark", "int8", [np.inf, 1.0], [127 * 2.0**121, 0.0]),
    (27, "torchao", "fp4_e2m1", [16.000002, 2.0], [16.0, 2.0]),
    (27, "quark-ceil", "fp4_e2m1", [16.000002, 2.0], [16.0, 2.0]),
    (1, "torchao-rceil", "fp4_e2m1", [7.0], [8.0]),
]


@pytest.mark.parametrize("vector, profile, fmt, block, expected", PROFILE_VECTORS)
def test_profile_vectors(vector, profile, fmt, block, expected):
    got = fake_quantize(
        np.array(block, dtype=np.float32), fmt, block_size=len(block), profile=profile
    )
    np.testing.assert_array_equal(got, np.array(expected), err_msg=f"vector {vector}")


def test_quark_ceil_misses_the_power_of_two_just_above_it():
    # float32 log2(16.000002) rounds to 4.0, so Quark's ceil keeps E = 4 - 2 where the exact
    # ceil rule (torchao CEIL, exponent bits) gives E = 3: 2.0 / 8 = 0.25 ties to 0.
    x = np.array([16.000002, 2.0], dtype=np.float32)
    assert fake_quantize(x, "fp4_e2m1", block_size=2, scale_rule="ceil").tolist() == [16.0, 0.0]
    assert fake_quantize(x, "fp4_e2m1", block_size=2, profile="quark-ceil").tolist() == [16.0, 2.0]


def test_docs_show_the_profiles_table_verbatim():
    from conftest import REPO
    from mxsim.quantize.options import profiles_markdown

    assert profiles_markdown() in (REPO / "docs" / "profiles.md").read_text()


def test_per_tensor_scale_is_one_power_of_two_for_the_whole_tensor():
    # T by the OCP floor rule over the whole tensor's amax; elements x * 2^-T rounded to
    # nearest even and saturated at 448, checked against ml_dtypes' float8_e4m3fn cast.
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((5, 40)) * 3).astype(np.float32)
    tensor = quantize(x, "fp8_e4m3", axis=1, block_size=32, per_tensor_scale=True)
    exponent = math.floor(math.log2(float(np.abs(x).max()))) - 8
    assert tensor.tensor_scale_exponent == exponent
    assert tensor.scales.shape == (5, 2) and (tensor.scales == 127).all() and tensor.padding == 24
    scaled = np.clip(np.ldexp(x.astype(np.float64), -exponent), -448, 448)
    expected = np.ldexp(scaled.astype(ml_dtypes.float8_e4m3fn).astype(np.float64), exponent)
    np.testing.assert_array_equal(tensor.dequantize(), expected)
    along_rows = quantize(x, "fp8_e4m3", axis=0, block_size=4, per_tensor_scale=True)
    np.testing.assert_array_equal(along_rows.dequantize(), expected)
    with pytest.raises(MxsimError, match="finite"):
        quantize(np.array([1.0, np.nan]), "fp8_e4m3", per_tensor_scale=True)


def test_one_kernel_signature_for_every_input_width_and_output_dtype():
    """float16/32/64 inputs and float32/64 dequantized outputs share one compiled kernel each."""
    from mxsim.quantize import _kernels

    x = np.random.default_rng(5).standard_normal((4, 64))
    counts = []  # compiled signatures after each input width (other tests may have added their own)
    for dtype in (np.float16, np.float32, np.float64):
        tensor = quantize(x.astype(dtype), "fp8_e4m3", axis=1)
        np.testing.assert_array_equal(
            tensor.dequantize(np.float32), tensor.dequantize().astype(np.float32)
        )
        counts.append(
            (len(_kernels.quantize_blocks.signatures), len(_kernels.dequantize_blocks.signatures))
        )
    assert counts[0] == counts[1] == counts[2], (counts, _kernels.quantize_blocks.signatures)


@pytest.mark.parametrize(
    "shape, axis", [((0, 32), -1), ((4, 0), -1), ((0, 5), 1), ((2, 0, 3), 1), ((0,), 0)]
)
def test_empty_input_gives_an_empty_result_of_the_same_shape(shape, axis):
    x = np.zeros(shape, np.float32)
    out = fake_quantize(x, "fp8_e4m3", axis=axis)
    assert out.shape == shape and out.dtype == np.float64
    tensor = quantize(x, "fp4_e2m1", axis=axis)
    assert tensor.shape == shape and tensor.dequantize().shape == shape


@pytest.mark.parametrize(
    "options, message",
    [
        ({"profile": ["ocp"]}, "unknown profile ['ocp']"),
        ({"scale_rule": ["floor"]}, "unknown value for option scale_rule ['floor']"),
        ({"nonfinite": {"a": 1}}, "unknown value for option nonfinite {'a': 1}"),
        ({"block_size": 0}, "quantize: block_size: expected an integer 1..4096, got 0"),
        (
            {"block_size": 10**12},
            "quantize: block_size: expected an integer 1..4096, got 1000000000000",
        ),
        ({"block_size": 2.0}, "quantize: block_size: expected an integer 1..4096, got 2.0"),
        ({"axis": 1.0}, "quantize: axis: expected an integer -2..1, got 1.0"),
        ({"seed": -1}, "option seed must be an integer 0..2**63-1, got -1"),
    ],
)
def test_bad_arguments_are_mxsim_errors(options, message):
    with pytest.raises(MxsimError) as caught:
        fake_quantize(np.ones((2, 32), np.float32), "fp8_e4m3", **options)
    assert message in str(caught.value)


def test_lists_of_numbers_are_read_and_other_lists_refused():
    assert fake_quantize([[1.0, 2.0]], "fp8_e4m3").shape == (1, 2)
    with pytest.raises(MxsimError, match="expected numbers"):
        fake_quantize([["a", 1.0]], "fp8_e4m3")
    with pytest.raises(MxsimError, match="expected numbers"):
        fake_quantize([[1.0], [1.0, 2.0]], "fp8_e4m3")


@given(
    rows=st.lists(realistic_blocks(), min_size=1, max_size=3),
    short=st.integers(1, 31),
    block=st.sampled_from([32, 16, 64]),
    fmt_name=st.sampled_from(ELEMENT_FORMATS),
    options=options_strategy,
)
def test_an_axis_shorter_than_a_block_equals_it_padded_with_zeros(
    rows, short, block, fmt_name, options
):
    """An axis shorter than one block, quantized as blocks of its own length and its codes
    padded, gives the codes and scales of the same values explicitly padded with +0 to a
    whole block (every option, NaN and Inf blocks, stochastic rounding included)."""
    short = min(short, block - 1)
    if options.nonfinite == "propagate" and not get_format(fmt_name).has_nan:
        rows = [[0.0 if math.isnan(v) else v for v in row] for row in rows]
    x = np.array([row[:short] for row in rows], dtype=np.float32)
    padded = np.zeros((len(rows), block), dtype=np.float32)
    padded[:, :short] = x
    fmt, opts, values = _prepare(x, fmt_name, "ocp", dataclasses.asdict(options))
    codes, exponents, axis, padding = _quantize_blocked(values, fmt, opts, -1, block)
    want_codes, want_exponents, _, _ = _quantize_blocked(padded, fmt, opts, 1, block)
    assert (axis, padding) == (1, block - short)
    np.testing.assert_array_equal(exponents, want_exponents)
    np.testing.assert_array_equal(codes, want_codes)


def test_tensors_over_the_memory_budget_are_refused(monkeypatch):
    monkeypatch.setenv("MXSIM_MAX_BYTES", "1K")
    with pytest.raises(
        MxsimError, match="quantize: the blocked tensor needs 2 KiB, more than the memory budget"
    ):
        fake_quantize(np.ones((8, 1), np.float32), "fp8_e4m3", block_size=32)


def _tf32_value(code: int, scale_code: int) -> float:
    """A tf32 field code (1 + 8 + 10 bits) times 2^(scale - 127), by hand (finite codes only)."""
    sign = -1.0 if code >> 18 else 1.0
    exponent, mantissa = (code >> 10) & 0xFF, code & 0x3FF
    magnitude = (
        math.ldexp(mantissa, -149) if exponent == 0 else math.ldexp(1024 + mantissa, exponent - 137)
    )
    return sign * math.ldexp(magnitude, scale_code - 127)


@pytest.mark.parametrize("name", ["tf32", "fp32"])
def test_wide_element_formats_dequantize(name):
    """Formats of over 16 bits have no decode table; dequantizing them still gives exact values."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 64)) * np.exp2(rng.integers(-20, 20, (4, 1)))).astype(np.float32)
    tensor = quantize(x, name)
    out = tensor.dequantize()
    if name == "fp32":  # every float32 fits, whatever the block's scale
        np.testing.assert_array_equal(out, x.astype(np.float64))
    else:
        scales = np.repeat(tensor.scales.reshape(4, -1), 32, axis=1)
        expected = [
            [_tf32_value(int(c), int(s)) for c, s in zip(row, srow)]
            for row, srow in zip(tensor.codes, scales)
        ]
        np.testing.assert_array_equal(out, np.array(expected))
        assert np.max(np.abs(out - x) / np.abs(x)) <= 2.0**-11  # 10 fraction bits, nearest
    np.testing.assert_array_equal(fake_quantize(x, name), out)


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("bf16", "bfloat16"),
        ("fp16", "float16"),
        ("fp8_e4m3fnuz", "float8_e4m3fnuz"),
        ("fp8_e5m2fnuz", "float8_e5m2fnuz"),
    ],
)
def test_a_fixed_tensor_scale_of_one_is_the_cast(name, dtype):
    """``tensor_scale_exponent=0``: each value rounded once into the format, as ml_dtypes casts."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 40)) * np.exp2(rng.integers(-8, 8, (3, 40)))).astype(np.float32)
    target = np.float16 if name == "fp16" else getattr(ml_dtypes, dtype)
    tensor = quantize(x, name, tensor_scale_exponent=0, element_overflow="inf_nan")
    np.testing.assert_array_equal(tensor.dequantize(), x.astype(target).astype(np.float64))
    assert tensor.tensor_scale_exponent == 0 and (tensor.scales == 127).all()
    shifted = quantize(
        x, name, tensor_scale_exponent=-3, element_overflow="inf_nan"
    )  # x * 2^3, rounded
    np.testing.assert_array_equal(
        shifted.dequantize(), (x * 8).astype(target).astype(np.float64) / 8
    )
    with pytest.raises(ArgumentError, match="tensor_scale_exponent"):
        quantize(x, name, tensor_scale_exponent=200)


CAST_FORMATS = [*ELEMENT_FORMATS, "fp8_e4m3fnuz", "fp8_e5m2fnuz", "fp16", "bf16", "tf32"]


@given(
    values=st.lists(
        st.one_of(st.floats(-1e5, 1e5, width=32), st.sampled_from(CORNERS)),
        min_size=1,
        max_size=40,
    ),
    fmt_name=st.sampled_from(CAST_FORMATS),
    dtype=st.sampled_from([np.float16, np.float32, np.float64]),
    exponent=st.integers(-127, 127),
    rounding=st.sampled_from(["nearest_even", "nearest_away", "toward_zero"]),
    overflow=st.sampled_from(["saturate", "inf_nan"]),
)
def test_a_cast_at_a_given_scale_is_the_formats_encoder(
    values, fmt_name, dtype, exponent, rounding, overflow
):
    """``tensor_scale_exponent=T`` (a cast at scale 2^T, through the quantization kernel's
    table where the format has one): every element's code is the one the format's own
    encoder gives x * 2^-T (formats of 4 to 19 bits, float16/32/64 inputs, every
    deterministic rounding and overflow, zeros, subnormals, ±Inf and NaN among them)."""
    with np.errstate(over="ignore"):
        x = np.array(values, dtype=np.float32).astype(dtype)
    fmt = get_format(fmt_name)
    if not (fmt.has_inf or fmt.has_nan):  # (no code for them: saturated, finite values only)
        overflow, x = "saturate", x[np.isfinite(x)]
        if not x.size:
            return
    tensor = quantize(
        x,
        fmt_name,
        tensor_scale_exponent=exponent,
        element_rounding=rounding,
        element_overflow=overflow,
    )
    with np.errstate(over="ignore", under="ignore"):
        scaled = np.ldexp(x.astype(np.float64), -exponent)
    exact = np.ldexp(scaled, exponent) == x.astype(np.float64)
    want = fmt.encode(scaled, rounding, overflow) >> fmt.padding_bits
    got = tensor.codes.reshape(-1)[: x.size]
    keep = exact | ~np.isfinite(x)  # (float64's own under/overflow of x * 2^-T left out)
    np.testing.assert_array_equal(got[keep], want[keep].astype(got.dtype))


# --- quantize_groups: every group a tensor of its own, in one call -----------------------------


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp4_e2m1", "int8"])
@pytest.mark.parametrize(
    "scaling",
    [{}, {"per_tensor_scale": True}, {"tensor_scale_exponent": 0}, {"tensor_scale_exponent": -3}],
)
def test_quantize_groups_equals_group_by_group(fmt, scaling):
    rng = np.random.default_rng(11)
    # groups of very different magnitudes (per-tensor exponents differ), K not a multiple of the block
    x = rng.standard_normal((5, 3, 45)) * np.array([1e-3, 1.0, 40.0, 1e4, 0.0]).reshape(5, 1, 1)
    got = quantize_groups(x, fmt, block_size=16, **scaling)
    assert len(got) == 5
    for group, tensor in zip(x, got):
        alone = quantize(group, fmt, axis=1, block_size=16, **scaling)
        assert (
            tensor.shape == alone.shape
            and tensor.padding == alone.padding
            and tensor.axis == alone.axis
        )
        assert tensor.tensor_scale_exponent == alone.tensor_scale_exponent
        assert np.array_equal(tensor.codes, alone.codes) and np.array_equal(
            tensor.scales, alone.scales
        )
        assert np.array_equal(tensor.dequantize(), alone.dequantize())
    grouped = quantize_grouped(x, fmt, block_size=16, **scaling)  # the same groups, held as one
    assert len(grouped) == 5 and grouped.codes.shape[0] == grouped.scales.shape[0] == 5
    wanted = [quantize(group, fmt, axis=1, block_size=16, **scaling) for group in x]
    assert grouped.tensor_scale_exponents.tolist() == [t.tensor_scale_exponent for t in wanted]
    assert np.array_equal(grouped.dequantize(), np.stack([t.dequantize() for t in wanted]))
    # the same codes read as (K, R) groups along axis 0 (B of a GEMM): each group transposed
    columns = dataclasses.replace(grouped, shape=(45, 3), axis=0)
    assert np.array_equal(columns.dequantize(), np.stack([t.dequantize().T for t in wanted]))
    assert np.array_equal(columns.group(3).dequantize(), wanted[3].dequantize().T)


def test_quantize_groups_edges():
    assert [
        t.codes.shape
        for t in quantize_groups(np.zeros((2, 0, 8)), "fp8_e4m3", per_tensor_scale=True)
    ] == [(0, 32), (0, 32)]
    assert quantize_groups(np.zeros((0, 3, 8)), "fp8_e4m3") == []
    assert quantize_grouped(np.zeros((0, 3, 8)), "fp8_e4m3").dequantize().shape == (0, 3, 8)
    with pytest.raises(MxsimError, match="finite"):
        quantize_groups(
            np.array([[[1.0, np.inf]], [[1.0, 2.0]]]), "fp8_e4m3", per_tensor_scale=True
        )
    with pytest.raises(MxsimError, match="stochastic"):
        quantize_groups(np.ones((2, 2, 4)), "fp8_e4m3", element_rounding="stochastic")
    with pytest.raises(MxsimError, match="groups, rows, K"):
        quantize_groups(np.ones((2, 4)), "fp8_e4m3")


def test_a_scale_format_is_not_an_element_format():
    # e8m0 quantized [1, -2, 0, 3] to [1, nan, 6.9e-77, 2] before
    for function in (fake_quantize, quantize):
        with pytest.raises(
            ArgumentError, match="e8m0 is not an element format .* accepted: fp8_e4m3, .*fp4_e2m1"
        ):
            function(np.array([1.0, -2.0, 0.0, 3.0]), "e8m0")


# --- the encode table: the codes of encode_bits, element by element --------------------------


def _mixed_blocks(dtype, every_float16: bool):
    """Blocks of mixed magnitudes: values over a wide exponent range, zeros and subnormals of
    ``dtype``, and with ``every_float16`` every finite float16 (as ``dtype``) in random order."""
    rng = np.random.default_rng(11)
    span = 12 if dtype == np.float16 else 120 if dtype == np.float32 else 600
    wide = (
        rng.standard_normal(2048) * np.exp2(rng.integers(-span, span, 2048).astype(float))
    ).astype(dtype)
    wide[::17] = 0.0
    wide[::19] = np.finfo(dtype).smallest_subnormal * rng.integers(-3, 4, wide[::19].size)
    if every_float16:
        every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
        wide = np.concatenate([rng.permutation(every[np.isfinite(every)]).astype(dtype), wide])
    return wide[: wide.size // 64 * 64].reshape(-1, 64)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_encode_table_gives_the_codes_of_encode_bits(dtype, monkeypatch):
    """Every element format, deterministic rounding and overflow policy, block and per-tensor
    scaling: the table path and ``encode_bits`` alone (the path the twin test covers) agree,
    on every finite float16 value (nearest-even, saturating) and on wide-range values."""
    from mxsim.formats.rounding import OVERFLOW_POLICIES, ROUNDING_MODES
    from mxsim.quantize import mx

    with_table = mx._encode_table
    cases = tables = 0
    for name in ELEMENT_FORMATS + ["fp16", "bf16", "fp8_e4m3fnuz", "fp8_e5m2fnuz"]:
        for rounding in sorted(set(ROUNDING_MODES) - {"stochastic"}):
            for overflow in OVERFLOW_POLICIES:
                if overflow == "inf_nan" and not get_format(name).has_nan:
                    continue
                every = (rounding, overflow) == ("nearest_even", "saturate")
                x = _mixed_blocks(dtype, every_float16=every)
                scalings = [{"block_size": 32}, {"per_tensor_scale": True}]
                for options in (
                    scalings if every else scalings[cases % 2 :][:1]
                ):  # the others alternate
                    got = []
                    for encode_table in (with_table, lambda *args: (mx._NO_TABLE, 0, 0, 0)):
                        monkeypatch.setattr(mx, "_encode_table", encode_table)
                        tensor = quantize(
                            x,
                            name,
                            axis=1,
                            element_rounding=rounding,
                            element_overflow=overflow,
                            **options,
                        )
                        got.append((tensor.codes, tensor.scales, tensor.tensor_scale_exponent))
                    np.testing.assert_array_equal(
                        got[0][0], got[1][0], err_msg=f"{name} {rounding} {overflow}"
                    )
                    assert np.array_equal(got[0][1], got[1][1]) and got[0][2] == got[1][2]
                    cases += 1
                    tables += with_table(get_format(name), 0, 0, np.finfo(dtype).nmant)[0].size > 0
    assert tables >= 0.8 * cases  # fp16 and bf16 elements of float16 inputs take encode_bits alone


# --- given scales (a model's stored scale codes) -----------------------------------------------


@pytest.mark.parametrize("profile", ["ocp", "torchao-rceil", "quark"])
@pytest.mark.parametrize("fmt", ELEMENT_FORMATS)
def test_quantize_at_the_scales_quantize_chose_gives_its_codes(fmt, profile):
    from mxsim.quantize import quantize_at_scales

    rng = np.random.default_rng(7)
    x = (rng.standard_t(4, (6, 70)) * np.exp2(rng.integers(-40, 40, (6, 1)))).astype(np.float32)
    x[0, :5] = 0.0
    tensor = quantize(x, fmt, axis=1, block_size=32, profile=profile)
    again = quantize_at_scales(x, fmt, tensor.scales, axis=1, block_size=32, profile=profile)
    assert np.array_equal(again.codes, tensor.codes) and np.array_equal(again.scales, tensor.scales)
    assert (again.shape, again.axis, again.padding) == (tensor.shape, tensor.axis, tensor.padding)


def test_quantize_at_scales_nan_blocks_and_refusals():
    from mxsim.quantize import quantize_at_scales

    x = np.array([[1.0, np.nan, 2.0, 3.0], [1.0, 2.0, 4.0, np.inf]], np.float32)
    tensor = quantize_at_scales(
        x, "fp8_e4m3", np.array([[0xFF, 127], [127, 0xFF]], np.uint8), axis=1, block_size=2
    )
    values = tensor.dequantize()
    assert (
        np.isnan(values[0, :2]).all()
        and values[0, 2:].tolist() == [2.0, 3.0]
        and values[1, :2].tolist() == [1, 2]
    )
    with pytest.raises(MxsimError, match="NaN or Inf element"):
        quantize_at_scales(x, "fp8_e4m3", np.full((2, 2), 127, np.uint8), axis=1, block_size=2)
    with pytest.raises(MxsimError, match=r"uint8 of shape \(2, 2\)"):
        quantize_at_scales(x, "fp8_e4m3", np.full((2, 1), 127, np.uint8), axis=1, block_size=2)


def test_scale_exponents_of_codes_on_every_e8m0_code_and_layout():
    """``scale_exponents_of_codes``: every E8M0 code's unbiased exponent (code - 127; the NaN
    code 0xFF as ``SCALE_NAN``), as int32 of the codes' shape, for uint8 codes (the kernel
    pass) in C order, transposed, sliced and empty, and for wider integer codes."""
    from mxsim.quantize._kernels import SCALE_NAN
    from mxsim.quantize.mx import scale_exponents_of_codes

    codes = np.arange(256, dtype=np.uint8)
    want = np.array([int(SCALE_NAN) if c == 0xFF else c - 127 for c in range(256)])
    grid = codes.reshape(4, 8, 8)
    layouts = [codes, grid, grid.transpose(2, 0, 1), grid[:, ::2, 1:], codes[:0].reshape(0, 3)]
    for layout in layouts + [grid.astype(np.int64), grid.astype(np.uint16)]:
        got = scale_exponents_of_codes(layout)
        assert got.dtype == np.int32 and got.shape == layout.shape
        np.testing.assert_array_equal(got, want[layout.astype(np.int64)])


def quantizer_inputs(rng, shape, dtype) -> np.ndarray:
    """Realistic values (each row its own magnitude) with -0, ±Inf, NaN and a subnormal."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-8, 9, shape[:-1] + (1,)))
    x.reshape(-1)[:5] = [-0.0, np.inf, -np.inf, np.nan, 1e-40]
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("fmt_name", ["fp8_e4m3", "fp4_e2m1", "int8"])
def test_quantizers_leave_their_inputs_unchanged(fmt_name, dtype):
    """quantize (along either axis, C-contiguous or not), quantize_at_scales, quantize_grouped,
    quantize_groups and fake_quantize leave every byte of ``x`` and of given scales as it was
    (K a multiple of the block, so the blocked input is ``x``'s own memory, and not)."""
    rng = np.random.default_rng(5)
    for length in (64, 70):
        x = quantizer_inputs(rng, (3, 6, length), dtype)
        kept = byte_copies(x)
        quantize(x[0], fmt_name, axis=1)
        quantize(x[0], fmt_name, axis=0)
        quantize(
            x[1].T, fmt_name, axis=0, per_tensor_scale=True
        )  # (finite: x[0] holds the specials)
        q = quantize(x[0], fmt_name, axis=1, nonfinite="nan_block")
        scales = q.scales.copy()
        scale_bytes = byte_copies(scales)
        quantize_at_scales(x[0], fmt_name, scales, axis=1)
        assert byte_copies(scales) == scale_bytes
        quantize_grouped(x, fmt_name, 32)
        quantize_groups(x[1:], fmt_name, 32, per_tensor_scale=True)
        fake_quantize(x, fmt_name, axis=-1)
        fake_quantize(x, fmt_name, axis=1, scale_underflow="unclamped", nonfinite="propagate")
        assert byte_copies(x) == kept
