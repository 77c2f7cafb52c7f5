"""mxsim.trace.quant: per-operand quantization specs, their manifest form and fake_quantize."""

from __future__ import annotations

import numpy as np
import pytest

from mxsim import BFP_SPECS, fake_quantize, quantize_bfp
from mxsim.errors import MxsimError
from mxsim.trace.quant import BFPQuant, MXQuant, NVFP4Quant, QDQQuant, spec_from_manifest

RNG = np.random.default_rng(3)


def test_mx_spec_canonicalises_the_format_and_sorts_options():
    spec = MXQuant(
        "MXFP8E4M3",
        1,
        32,
        "quark-onnx",
        {"int8_minus_two": True, "element_rounding": "nearest_away"},
    )
    assert spec.format == "fp8_e4m3"
    assert spec.options == (("element_rounding", "nearest_away"), ("int8_minus_two", True))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(format="fp7"), "unknown format"),
        (dict(format="fp8_e4m3", profile="nvidia"), "unknown profile"),
        (dict(format="fp8_e4m3", options={"scale_rule": "round"}), "scale_rule"),
        (dict(format="fp8_e4m3", options={"no_such_option": 1}), "unknown quantization option"),
        (dict(format="fp8_e4m3", block_size=0), "block_size must be a positive int"),
        (dict(format="fp8_e4m3", axis=1.5), "axis must be an int"),
    ],
)
def test_mx_spec_rejects_invalid_values(kwargs, message):
    with pytest.raises(MxsimError, match=message):
        MXQuant(**kwargs)


def test_mx_fake_quantize_is_mxsim_fake_quantize_along_the_axis():
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    spec = MXQuant("fp4_e2m1", axis=1, block_size=16, profile="quark-onnx")
    assert np.array_equal(
        spec.fake_quantize(x),
        fake_quantize(x, "fp4_e2m1", axis=1, block_size=16, profile="quark-onnx"),
    )


def test_unresolved_axis_cannot_quantize():
    with pytest.raises(MxsimError, match="unresolved"):
        MXQuant("int8").fake_quantize(np.ones((2, 2), np.float32))


def test_single_element_bypass_returns_the_input():
    x = np.array([7.0], np.float32)
    assert MXQuant("fp4_e2m1", 0, bypass_single_element=True).fake_quantize(x).tolist() == [7.0]
    assert MXQuant("fp4_e2m1", 0).fake_quantize(x).tolist() == [6.0]  # 7 saturates to fp4's max


def test_bfp_spec_names_and_fake_quantize():
    spec = BFPQuant("mx6", axis=0)
    assert spec.spec == BFP_SPECS["MX6"] and spec.name == "MX6"
    assert (
        BFPQuant(BFP_SPECS["MX6"].replace(rounding_mode=2), 0).name == "MX6"
    )  # rounding is not layout
    assert BFPQuant(BFP_SPECS["MX6"].replace(block_size=8), 0).name is None
    x = RNG.standard_normal((32, 3)).astype(np.float32)
    assert np.array_equal(spec.fake_quantize(x), quantize_bfp(x, "MX6", axis=0).dequantize())
    with pytest.raises(MxsimError, match="unknown name"):
        BFPQuant("MX5", 0)


def test_qdq_per_tensor_uint8_rounds_half_to_even_and_saturates():
    spec = QDQQuant("uint8", np.array(0.5, np.float32), np.array(10, np.uint8))
    x = np.array([0.25, 0.75, -5.0, -6.0, 200.0], np.float32)
    # x/0.5 = 0.5, 1.5, -10, -12, 400 -> rint 0, 2, -10, -12, 400 -> +10 -> clip [0, 255]
    assert spec.fake_quantize(x).tolist() == [0.0, 1.0, -5.0, -5.0, 122.5]


def test_qdq_per_axis_and_blocked_scales_follow_onnx_broadcasting():
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 6
    per_axis = QDQQuant("int8", np.array([1.0, 2.0, 4.0], np.float32), np.zeros(3, np.int8), axis=0)
    # row scales 1, 2, 4: -0.5 and 0.5 round to even (0), 0.75 and 1.25 to 1
    assert per_axis.fake_quantize(x).tolist() == [[-6, -5, -4, -3], [-2, 0, 0, 0], [0, 4, 4, 4]]
    blocked = QDQQuant("int4", np.array([[1.0, 4.0]] * 3, np.float32), None, axis=1, block_size=3)
    # columns 0-2 use scale 1, column 3 (a partial block) uses scale 4
    assert blocked.fake_quantize(x).tolist() == [[-6, -5, -4, -4], [-2, -1, 0, 0], [2, 3, 4, 4]]
    saturating = QDQQuant("int4", np.array(1.0, np.float32))
    assert saturating.fake_quantize(np.array([9.0, -9.0], np.float32)).tolist() == [7.0, -8.0]


@pytest.mark.parametrize("dtype", ["float8e4m3fn", "float8e5m2"])
def test_qdq_fp8_is_torchs_scaled_float8_cast(torch, dtype):
    """FP8 QDQ against torch's own float8 cast (an independent implementation): float32
    ``x / scale``, clamped to the format's largest value, cast (nearest even), times the
    scale in float32; per tensor and per axis, on heavy-tailed values that reach the
    subnormals, both zeros and the saturation bound."""
    target, largest = {
        "float8e4m3fn": (torch.float8_e4m3fn, 448.0),
        "float8e5m2": (torch.float8_e5m2, 57344.0),
    }[dtype]
    rng = np.random.default_rng(7)
    x = rng.standard_t(2, size=(6, 300)) * np.float32(3.0) ** rng.integers(-12, 4, (6, 1))
    x = x.astype(np.float32)
    x[0, :4] = [0.0, -0.0, np.float32(1e-30), -np.float32(1e-30)]
    scales = (np.abs(x).max(axis=1) / np.float32(largest / 2)).astype(np.float32)  # saturates

    def torch_qdq(values, scale):
        t, s = torch.from_numpy(values), torch.from_numpy(scale)
        return ((t / s).clamp(-largest, largest).to(target).float() * s).numpy()

    per_tensor = QDQQuant(dtype, scales[:1].reshape(()))
    got = per_tensor.fake_quantize(x)
    want = torch_qdq(x, scales[:1].reshape(()))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    per_axis = QDQQuant(dtype, scales, axis=0)
    got = per_axis.fake_quantize(x)
    want = torch_qdq(x, scales[:, None])
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    levels, values = per_axis.levels(x)
    assert np.array_equal(values.view(np.uint32), want.view(np.uint32))
    cast = torch.from_numpy(x / scales[:, None]).clamp(-largest, largest).to(target).float()
    assert np.array_equal(levels.astype(np.float32).view(np.uint32), cast.numpy().view(np.uint32))


def test_qdq_reciprocal_is_torchs_fake_quantize(torch):
    """``reciprocal``: torch's ``fake_quantize_per_tensor_affine`` (x * fl(1/scale)); 1.55 / 0.1
    rounds to 15 where 1.55 * fl(1 / 0.1) rounds to 16 (float32)."""
    x = np.array([1.55, -1.55, 0.75, 3.15, 12.7, -13.0], np.float32)
    want = torch.fake_quantize_per_tensor_affine(torch.from_numpy(x), 0.1, 0, -128, 127).numpy()
    got = QDQQuant("int8", np.array(0.1, np.float32), reciprocal=True).fake_quantize(x)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert QDQQuant("int8", np.array(0.1, np.float32)).fake_quantize(x)[0] != want[0]


def test_qdq_reciprocal_is_written_only_when_set_and_refused_on_float_types():
    spec = QDQQuant("int8", np.array(0.1, np.float32), reciprocal=True)
    entry = spec.to_manifest("input")
    assert entry["reciprocal"] is True
    again = spec_from_manifest(entry, spec.arrays("input"), "input")
    assert again.reciprocal and again.dtype == "int8"
    assert "reciprocal" not in QDQQuant("int8", np.array(0.1, np.float32)).to_manifest("input")
    for bad in ("yes", 1):
        with pytest.raises(MxsimError, match="reciprocal must be true or false"):
            QDQQuant("int8", np.array(0.1, np.float32), reciprocal=bad)
    with pytest.raises(MxsimError, match="true only for integer types"):
        QDQQuant("float8e4m3fn", np.array(0.1, np.float32), reciprocal=True)
    with pytest.raises(MxsimError, match="reciprocal must be true or false"):
        spec_from_manifest(dict(entry, reciprocal="true"), spec.arrays("input"), "input")


def test_qdq_fp8_codes_refuse_what_they_cannot_hold():
    with pytest.raises(MxsimError, match="needs a zero point of 0"):
        QDQQuant("float8e4m3fn", np.array(1.0, np.float32), np.array(1, np.int8)).fake_quantize(
            np.ones(3, np.float32)
        )
    with pytest.raises(MxsimError, match="not modelled for float8e4m3fnuz"):
        QDQQuant("float8e4m3fnuz", np.array(1.0, np.float32)).fake_quantize(np.ones(3))


def test_qdq_spec_validation():
    with pytest.raises(MxsimError, match="unknown quantized type"):
        QDQQuant("int9", np.ones(1, np.float32))
    with pytest.raises(MxsimError, match="needs an axis"):
        QDQQuant("int8", np.ones(3, np.float32))


@pytest.mark.parametrize(
    "spec",
    [
        MXQuant(
            "int8",
            1,
            32,
            "quark-onnx",
            {"element_rounding": "nearest_toward_positive"},
            bypass_single_element=True,
        ),
        MXQuant("fp6_e2m3", 0, 16, "quark", {"even_fraction_bits": (("int8", 8),)}),
        BFPQuant(BFP_SPECS["MX9"].replace(kernel="cuda", rounding_mode=2, seed=5), 1),
        BFPQuant("BFP16", 0, bypass_single_element=True),
        BFPQuant(BFP_SPECS["MX6"].replace(rounding_mode=2, flushed_zero_sign="positive"), 1),
    ],
)
def test_manifest_round_trip(spec):
    assert spec_from_manifest(spec.to_manifest(), {}, "weight") == spec


def test_qdq_manifest_names_its_arrays():
    spec = QDQQuant("int8", np.array([0.5, 0.25], np.float32), np.array([0, 1], np.int8), axis=0)
    entry = spec.to_manifest("weight")
    assert (
        entry["scale"] == "quant.weight.scale" and entry["zero_point"] == "quant.weight.zero_point"
    )
    back = spec_from_manifest(entry, spec.arrays("weight"), "weight")
    assert np.array_equal(back.scale, spec.scale) and np.array_equal(
        back.zero_point, spec.zero_point
    )
    with pytest.raises(MxsimError, match="quant.input.scale"):
        spec_from_manifest(entry, spec.arrays("weight"), "input")


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            {"kind": "mx", "format": "fp8_e4m3", "axis": 1, "block_size": 32, "colour": 1},
            "unknown keys",
        ),
        (
            {
                "kind": "bfp",
                "name": "MX4",
                "axis": 0,
                "method": "to_bfp_prime",
                "bit_width": 13,
                "block_size": 16,
                "sub_block_size": 2,
                "sub_block_shift_bits": 1,
            },
            "does not match",
        ),
        ({"kind": "fixed"}, "unknown kind"),
    ],
)
def test_invalid_manifest_entries(entry, message):
    with pytest.raises(MxsimError, match=message):
        spec_from_manifest(entry, {}, "input")


def test_mx_spec_with_stored_scales_quantizes_at_them_and_names_its_array():
    """A block whose values have two encodings (fp4 [3, 1.5, 0.5...] at scale 1 is [6, 3, 1...]
    at scale 1/2): the stored scale decides the codes; the manifest names the array, and
    trace loading reads it back. ``==`` compares the reading, not the array."""
    x = np.array([[3.0, 1.5, 0.5, -2.0], [1.0, 0.0, -0.5, 0.25]], np.float32)
    plain = MXQuant("fp4_e2m1", 1, 4, "torchao-rceil")
    assert plain.quantize(x).scales.tolist() == [[126], [125]]  # the rule: the lower scales
    spec = MXQuant("fp4_e2m1", 1, 4, "torchao-rceil", scales=np.array([[127], [126]], np.uint8))
    stored = spec.quantize(x)
    assert (
        stored.scales.tolist() == [[127], [126]] and stored.codes[0, 0] == 0b0101
    )  # 3.0 at scale 1
    assert np.array_equal(spec.fake_quantize(x), x) and np.array_equal(plain.fake_quantize(x), x)
    entry = spec.to_manifest("weight")
    assert entry["scales"] == "quant.weight.scales"
    back = spec_from_manifest(entry, spec.arrays("weight"), "weight")
    assert back == plain and np.array_equal(back.scales, spec.scales)
    with pytest.raises(MxsimError, match="quant.input.scales"):
        spec_from_manifest(entry, spec.arrays("weight"), "input")
    with pytest.raises(MxsimError, match="operand"):
        spec.to_manifest()
    with pytest.raises(MxsimError, match="uint8"):
        MXQuant("fp4_e2m1", 1, 4, scales=np.array([[127]], np.int32))


@pytest.mark.parametrize(
    "rule", ["code", "positive", "input", "input_if_underflow", "input_unless_underflow"]
)
@pytest.mark.parametrize("fmt", ["int8", "fp4_e2m1"])
def test_stored_scales_sign_zeros_as_fake_quantize_does(fmt, rule):
    """At the scales the rule itself chose, a spec with stored scales gives mxsim.fake_quantize's
    bits, zeros signed by the ``zero_signs`` option (tiny negatives round to zero; blocks of
    small scales make ``input_if_underflow`` keep some signs and drop others)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 64)) * np.array([1.0, 1e-3, 1e-37, 1e3, 1.0, 1e-38])[:, None]
    x[:, ::7] = -np.abs(x[:, ::7]) * 2.0**-30  # negatives far below each block's step
    x = x.astype(np.float32)
    options = {"zero_signs": ((fmt, rule),), "scale_underflow": "clamp"}
    plain = MXQuant(fmt, 1, 32, "ocp", options)
    stored = MXQuant(fmt, 1, 32, "ocp", options, scales=plain.quantize(x).scales)
    want = fake_quantize(x, fmt, axis=1, block_size=32, **options)
    got = stored.fake_quantize(x)
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64))
    assert ((want == 0) & np.signbit(x)).any()  # negative inputs that quantize to zero


def test_stored_scales_of_another_shape_are_refused_by_validation():
    from mxsim.trace.model import Layer, Trace
    from mxsim.trace.validate import validate_trace

    def trace(scales):
        x, w = np.ones((3, 40), np.float32), np.ones((4, 40), np.float32)
        layer = Layer(
            "l",
            "linear",
            {"input": x, "weight": w, "output": np.ones((3, 4), np.float32)},
            quant={"weight": MXQuant("fp8_e4m3", 1, 32, scales=scales)},
        )
        return Trace("t", [layer])

    validate_trace(trace(np.full((4, 2), 127, np.uint8)))
    with pytest.raises(MxsimError, match=r"quant\.weight\.scales.*expected \(4, 2\)"):
        validate_trace(trace(np.full((4, 1), 127, np.uint8)))


def _nvfp4_block() -> tuple[np.ndarray, np.ndarray]:
    """One block of 16 whose largest element is 4 (not 6), stored at UE4M3 scale 1 (code 0x38),
    and that code: the recipe, given these values, would choose the scale 4/6 and other codes."""
    x = np.array([[4.0, -2.0, 1.0, 0.5, 0, 3.0, -1.5, 0.5] * 2], np.float32)
    return x, np.array([[0x38]], np.uint8)


def test_nvfp4_spec_quantizes_at_its_stored_scales_and_dequantizes_as_the_library():
    x, scales = _nvfp4_block()
    stored = NVFP4Quant(1, scales)
    assert np.array_equal(stored.fake_quantize(x), x)  # every element an E2M1 value at scale 1
    assert NVFP4Quant(1).quantize(x).scales.tolist() != scales.tolist()  # the recipe's choice
    # tensor scale 3 * 2^-10 (float32): values are fl(e * fl(t * s)); bf16 keeps 8 bits of them
    t = 3 * 2.0**-10
    got = NVFP4Quant(1, scales, t).fake_quantize(x * np.float32(t))
    assert np.array_equal(got, x * np.float32(t))
    odd = float(np.float32(1 / 3))  # 24 significant bits: the bf16 rounding shows
    f32 = NVFP4Quant(1, scales, odd).fake_quantize(x * np.float32(odd))
    b16 = NVFP4Quant(1, scales, odd, dequantized="bfloat16").fake_quantize(x * np.float32(odd))
    assert np.array_equal(f32, x * np.float32(odd))
    assert np.array_equal(
        b16[0, :3], [1.3359375, -0.66796875, 0.333984375]
    )  # bf16 of 4/3, -2/3, 1/3


def test_nvfp4_spec_manifest_round_trip_names_its_array():
    x, scales = _nvfp4_block()
    spec = NVFP4Quant(1, scales, float(np.float32(1e-3)), dequantized="bfloat16")
    entry = spec.to_manifest("weight")
    assert entry == {
        "kind": "nvfp4",
        "axis": 1,
        "profile": "torchao",
        "tensor_scale": float(np.float32(1e-3)),
        "dequantized": "bfloat16",
        "scales": "quant.weight.scales",
    }
    back = spec_from_manifest(entry, spec.arrays("weight"), "weight")
    assert np.array_equal(back.scales, scales) and back.tensor_scale == spec.tensor_scale
    assert back.dequantized == "bfloat16" and back.block_size == 16
    plain = spec_from_manifest(NVFP4Quant(0).to_manifest(), {}, "input")
    assert plain.scales is None and plain.tensor_scale is None and plain.dequantized == "float32"
    with pytest.raises(MxsimError, match="quant.input.scales"):
        spec_from_manifest(entry, spec.arrays("weight"), "input")
    with pytest.raises(MxsimError, match="operand"):
        spec.to_manifest()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tensor_scale": -1.0}, "tensor_scale must be a positive finite float32"),
        ({"tensor_scale": float("nan")}, "tensor_scale must be a positive finite float32"),
        ({"tensor_scale": float("inf")}, "tensor_scale must be a positive finite float32"),
        ({"tensor_scale": 0.1}, "tensor_scale must be a positive finite float32"),  # not float32
        ({"tensor_scale": "1"}, "tensor_scale must be a positive finite float32"),
        ({"profile": "nvidia"}, "unknown profile 'nvidia'; accepted: torchao"),
        ({"dequantized": "float16"}, "dequantized must be one of float32, bfloat16"),
        ({"scales": np.ones((1, 1), np.int32)}, "scales must be a uint8"),
        ({"axis": 1.5}, "axis must be an int"),
    ],
)
def test_nvfp4_spec_rejects_invalid_values(kwargs, message):
    with pytest.raises(MxsimError, match=f"^NVFP4 spec: {message}"):
        NVFP4Quant(**{"axis": 1, **kwargs})


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"kind": "nvfp4", "axis": 1, "scale_format": "ue4m3"}, r"unknown keys \['scale_format'\]"),
        ({"kind": "nvfp4", "axis": 1, "tensor_scale": -2.0}, "tensor_scale must be"),
        ({"kind": "nvfp4", "axis": 1, "scales": "quant.weight.codes"}, "scales must name"),
        ({"kind": "nvfp4", "axis": 1, "dequantized": "fp8"}, "dequantized must be"),
    ],
)
def test_invalid_nvfp4_manifest_entries(entry, message):
    with pytest.raises(MxsimError, match=message):
        spec_from_manifest(entry, {}, "weight")


def test_nvfp4_scales_of_another_shape_or_a_partial_block_are_refused_by_validation():
    from mxsim.trace.model import Layer, Trace
    from mxsim.trace.validate import validate_trace

    def trace(k, scales):
        x, w = np.ones((3, k), np.float32), np.ones((4, k), np.float32)
        layer = Layer(
            "l",
            "linear",
            {"input": x, "weight": w, "output": np.ones((3, 4), np.float32)},
            quant={"weight": NVFP4Quant(1, scales)},
        )
        return Trace("t", [layer])

    validate_trace(trace(32, np.full((4, 2), 0x38, np.uint8)))
    with pytest.raises(MxsimError, match=r"quant\.weight\.scales.*expected \(4, 2\)"):
        validate_trace(trace(32, np.full((4, 1), 0x38, np.uint8)))
    with pytest.raises(
        MxsimError,
        match=r"quant\.weight\.axis.*\(40\) is not a multiple of the NVFP4 block size 16",
    ):
        validate_trace(trace(40, np.full((4, 3), 0x38, np.uint8)))
