"""One layer on one unit: equal to mxsim.matmul bit for bit, conv equal to a direct convolution,
the ideal of the operands the unit got, compile time apart."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from conftest import REPO, byte_copies, mx_linear_layer, sqnr_db
from mxsim import matmul
from mxsim.datapath import load_hwconfig
from mxsim.errors import MxsimError
from mxsim.formats import get_format
from mxsim.quantize import quantize, quantize_nvfp4
from mxsim.quantize.nvfp4 import tensor_scale_from_amax
from mxsim.replay.layer import replay_layer, run_layer
from mxsim.replay.report import format_report
from mxsim.replay.run import replay
from mxsim.trace import Layer, MXQuant, Trace, conv2d_direct, load_trace

E2M1 = get_format("fp4_e2m1")
HW = {
    name: load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
    for name in ("ocp-exact", "kulisch", "mxdotp", "h100-fp8", "b200-nvfp4")
}


def test_linear_layer_replays_as_matmul_bit_for_bit():
    layer = mx_linear_layer(np.random.default_rng(1), "fp6_e2m3")
    result = replay_layer(layer, HW["ocp-exact"])
    qa = quantize(layer.input, "fp6_e2m3", axis=1)
    qb = quantize(layer.weight.T, "fp6_e2m3", axis=0)
    expected = matmul(HW["ocp-exact"], qa, qb).bits
    np.testing.assert_array_equal(result.bits[0], expected)
    assert result.input.format == "fp6_e2m3" and result.input.note == ""


def test_a_unit_that_takes_the_spec_equals_the_exact_ideal():
    # ocp-exact rounds once per block into fp32, kulisch once per output: on the model's own
    # operands kulisch is the ideal, bit for bit.
    layer = mx_linear_layer(np.random.default_rng(8), "fp6_e3m2")
    exact = replay_layer(layer, HW["kulisch"])
    assert (
        exact.status == "model" and exact.identical_to_ideal_fraction == 1.0 and exact.ideal_exact
    )
    assert exact.sqnr_vs_ideal_db == float("inf") and exact.max_error_vs_ideal_ulps == 0
    blockwise = replay_layer(layer, HW["ocp-exact"])
    assert blockwise.max_error_vs_ideal_ulps <= 3 and blockwise.rel_rms_error_vs_ideal < 2.0**-20


@pytest.mark.parametrize("unit", ["kulisch", "ocp-exact", "mxdotp"])
def test_conv_layer_equals_an_independent_direct_convolution(unit):
    # Small integers (|v| <= 7) are exact fp8_e4m3 values under any block scale, so MX
    # quantization is the identity in every layout, and the float64 direct convolution is
    # exact: an exact unit must return it bit for bit (plus the bias, added in float64).
    rng = np.random.default_rng(3)
    x = rng.integers(-7, 8, size=(2, 6, 7, 7)).astype(np.float32)
    w = rng.integers(-7, 8, size=(4, 3, 3, 3)).astype(np.float32)
    bias = np.array([0.5, -1.0, 0.25, 2.0], dtype=np.float32)
    attrs = {"stride": [2, 1], "padding": [[1, 0], [2, 1]], "dilation": [1, 2], "groups": 2}
    probe = Layer(
        "conv",
        "conv2d",
        {"input": x, "weight": w, "output": np.zeros(1, np.float32)},
        attrs,
        {"input": None, "weight": None, "bias": None},
        {},
    )
    expected = conv2d_direct(x, w, bias, probe.conv_geometry())
    layer = Layer(
        "conv",
        "conv2d",
        {"input": x, "weight": w, "bias": bias, "output": expected.astype(np.float32)},
        attrs,
        {"input": None, "weight": None, "bias": None},
        {},
    )
    values = run_layer(layer, HW[unit]).values
    np.testing.assert_array_equal(values, expected)
    assert replay_layer(layer, HW[unit]).sqnr_vs_float_db == float("inf")


def test_bfp_spec_replays_with_microexponents():
    from mxsim import quantize_bfp
    from mxsim.trace import BFPQuant

    layer = mx_linear_layer(np.random.default_rng(4))
    layer = Layer(
        layer.name,
        layer.op,
        layer.tensors,
        layer.attrs,
        {"input": BFPQuant("MX9", axis=1), "weight": BFPQuant("MX6", axis=1), "bias": None},
        {},
    )
    unit = load_hwconfig(REPO / "hwconfigs" / "bfp-exact.yaml")
    result = replay_layer(layer, unit)
    assert (result.input.format, result.weight.format) == (
        "mx9",
        "mx6",
    ) and result.status == "model"
    qa = quantize_bfp(layer.input, "MX9", axis=1).as_mx_tensor()
    qb = quantize_bfp(layer.weight.T, "MX6", axis=0).as_mx_tensor()
    np.testing.assert_array_equal(result.bits[0], matmul(unit, qa, qb).bits)


def _fp8_layer(input_scale: np.ndarray, input_axis=None, bias=True) -> Layer:
    """``mx_linear_layer`` with FP8 QDQ specs: the input's ``input_scale``, the weight per
    output feature (axis 0), and a bias."""
    from mxsim.trace import QDQQuant

    base = mx_linear_layer(np.random.default_rng(11))
    tensors = dict(base.tensors)
    if bias:
        tensors["bias"] = np.linspace(-1, 1, 5).astype(np.float32)
    weight_scale = (np.abs(base.weight).max(axis=1) / 448).astype(np.float32)
    quant = {
        "input": QDQQuant("float8e4m3fn", input_scale, axis=input_axis),
        "weight": QDQQuant("float8e5m2", weight_scale, axis=0),
        "bias": None,
    }
    return Layer(base.name, base.op, tensors, {}, quant, {})


def test_fp8_operands_with_float_scales_go_to_the_unit_as_codes_scaled_after():
    """FP8 QDQ operands (one float scale per tensor; the weight's per output feature) reach a
    unit that takes FP8 as the model's codes ("model"); the float scales multiply the unit's
    sums and the bias is added after: the layer is the float64 product of the model's
    dequantized operands to fp32 precision."""
    layer = _fp8_layer(np.array(0.0123, np.float32))
    run = run_layer(layer, HW["ocp-exact"])
    assert run.input.status == run.weight.status == "model"
    assert (run.input.format, run.weight.format) == ("fp8_e4m3", "fp8_e5m2")
    a = layer.quant["input"].fake_quantize(layer.input).astype(np.float64)
    b = layer.quant["weight"].fake_quantize(layer.weight).astype(np.float64)
    want = a @ b.T + layer.bias
    assert sqnr_db(want, run.values) >= 130
    assert sqnr_db(want, run.ideal) >= 130 and not run.ideal_exact
    # a unit with per-tensor power-of-two scales only (no block scales) does not take them:
    # as for any QDQ operand it quantizes the values the model multiplied ("added", which
    # strict runs such as the unit in the loop accept)
    other = run_layer(layer, HW["h100-fp8"], strict=True)
    assert other.input.status == other.weight.status == "added"
    assert sqnr_db(want, other.values) > 20


def test_int8_operands_with_float_scales_go_to_the_unit_as_mx_int8_codes():
    """INT8 QDQ operands (zero point 0; the weight per output feature, torch's reciprocal
    arithmetic) reach a unit that takes int8 as their integers (MX INT8 codes under scale
    2^6), the float scales applied after: the float64 product of the dequantized operands to
    fp32 precision. An asymmetric (nonzero zero point) operand is not taken as codes."""
    from mxsim.trace import QDQQuant

    base = mx_linear_layer(np.random.default_rng(13))
    weight_scale = (np.abs(base.weight).max(axis=1) / 127).astype(np.float32)
    quant = {
        "input": QDQQuant("int8", np.array(0.021, np.float32)),
        "weight": QDQQuant("int8", weight_scale, axis=0, reciprocal=True),
        "bias": None,
    }
    layer = Layer(base.name, base.op, base.tensors, {}, quant, {})
    run = run_layer(layer, HW["ocp-exact"])
    assert run.input.status == run.weight.status == "model"
    a = quant["input"].fake_quantize(layer.input).astype(np.float64)
    b = quant["weight"].fake_quantize(layer.weight).astype(np.float64)
    assert sqnr_db(a @ b.T, run.values) >= 130
    assert sqnr_db(a @ b.T, run.ideal) >= 130
    uint8 = QDQQuant("uint8", np.array(0.021, np.float32), np.array(128, np.uint8))
    skewed = Layer(base.name, base.op, base.tensors, {}, dict(quant, input=uint8), {})
    assert run_layer(skewed, HW["ocp-exact"]).input.status == "added"


def test_fp8_scales_along_k_are_not_taken_as_codes():
    """A per-channel FP8 input scale runs along K: it does not factor out of the sums, so the
    unit gets replay's quantization of the values the model multiplied ("added")."""
    layer = _fp8_layer(np.linspace(0.01, 0.02, 70).astype(np.float32), input_axis=1)
    run = run_layer(layer, HW["ocp-exact"])
    assert run.input.status == "added" and run.weight.status == "model"


def test_float_operands_on_a_shared_microexponent_unit_are_quantized_as_mx9():
    """A float layer on bfp-exact: replay quantizes both operands as MX9 defines it (one
    8-bit exponent per 16 elements, a 1-bit shift per pair), the bits of Quark's quantizer
    (``quantize_bfp``, checked against Quark elsewhere), even where neighbouring pairs differ by
    many binades, which a free scale per pair would keep and MX9 flushes."""
    from mxsim import quantize_bfp

    rng = np.random.default_rng(5)
    base = mx_linear_layer(rng)
    spread = base.input * np.exp2(rng.integers(-60, 1, base.input.shape)).astype(np.float32)
    tensors = dict(base.tensors, input=spread)
    layer = Layer(base.name, base.op, tensors, {}, dict(base.quant, input=None, weight=None), {})
    unit = load_hwconfig(REPO / "hwconfigs" / "bfp-exact.yaml")
    result = replay_layer(layer, unit)
    assert (result.input.format, result.weight.format, result.status) == ("mx9", "mx9", "added")
    qa = quantize_bfp(spread, "MX9", axis=1).as_mx_tensor()
    qb = quantize_bfp(base.weight.T, "MX9", axis=0).as_mx_tensor()
    scales = qa.scales.astype(int).reshape(6, -1, 8)  # a block of 16: 8 pairs
    assert (scales.max(axis=-1) - scales.min(axis=-1)).max() == 1
    assert result.input.underflowed > 0  # the pairs far below their block's largest
    np.testing.assert_array_equal(result.bits[0], matmul(unit, qa, qb).bits)
    # groups (attention heads) quantized in one call: each as its own quantize_bfp
    from mxsim.replay.choice import choose_operand
    from mxsim.replay.layer import _requantize
    from mxsim.replay.operands import layer_operands

    choice, options = choose_operand(layer_operands(layer).a, "input", None, unit, None)
    heads = np.stack([spread[:, :33], spread[:, 30:63], -spread[:, 1:34]])
    for head, tensor in zip(heads, _requantize(heads, choice, options, False)[0].tensors()):
        alone = quantize_bfp(head, "MX9", axis=1).as_mx_tensor()
        assert (tensor.shape, tensor.axis, tensor.padding) == (alone.shape, 1, alone.padding)
        np.testing.assert_array_equal(tensor.codes, alone.codes)
        np.testing.assert_array_equal(tensor.scales, alone.scales)


def test_replay_quantizes_the_library_values_of_an_operand_it_does_not_read():
    """An operand without a spec whose quantized values the trace holds: replay's own
    quantization starts from those values (what the model multiplied), not the float before
    the library's quantizer, as the unit in the loop does."""
    from mxsim.replay.operands import layer_operands

    base = mx_linear_layer(np.random.default_rng(12))
    recorded = np.round(base.input * 4).astype(np.float32) / 4
    tensors = dict(base.tensors, input_quantized=recorded)
    layer = Layer(base.name, base.op, tensors, {}, dict(base.quant, input=None), {})
    ops = layer_operands(layer)
    assert np.array_equal(ops.a_float[0, :, :70], recorded)
    assert np.array_equal(ops.b_float[0, :, :70], base.weight)  # read as a spec: the float


def test_the_ideal_of_a_row_is_that_of_the_operands_the_unit_got():
    # digits-cnn is a float model: every unit gets replay's quantization ("added" rows), and the
    # ideal is the exact result of those operands, so an exact unit equals it bit for bit and
    # the per-tensor FP8 unit (whose adder keeps about 13 fraction bits) stays within a relative
    # RMS error of 2^-10 of it.
    trace = load_trace(REPO / "traces" / "digits-cnn")
    for layer in trace.layers:
        exact = replay_layer(layer, HW["kulisch"])
        assert (
            exact.status == "added"
            and exact.identical_to_ideal_fraction == 1.0
            and exact.ideal_exact
        )
        fp8 = replay_layer(layer, HW["h100-fp8"])
        assert (
            fp8.input.per_tensor_scale
            and fp8.max_error_vs_ideal_ulps > 0
            and fp8.rel_rms_error_vs_ideal < 2**-10
        )
        assert (
            fp8.sqnr_vs_ideal_db > fp8.sqnr_vs_float_db + 30
        )  # arithmetic error far below quantization error


def test_compile_time_is_reported_apart_from_run_time(monkeypatch):
    """A layer's seconds leave out the time spent compiling kernels, which is reported apart."""
    import time

    import mxsim.replay.layer as layer_module

    compiled = [0.0]
    real_run_layer = layer_module.run_layer

    def compiling_run_layer(*args, **kwargs):
        time.sleep(0.3)  # stands for a compile, as the compile-event listener would count it
        compiled[0] += 0.3
        return real_run_layer(*args, **kwargs)

    monkeypatch.setattr(layer_module, "run_layer", compiling_run_layer)
    monkeypatch.setattr(layer_module, "compile_seconds", lambda: compiled[0])
    trace = Trace("t", [mx_linear_layer(np.random.default_rng(2))])
    start = time.perf_counter()
    report = replay(trace, [HW["ocp-exact"]])
    wall = time.perf_counter() - start
    result = report["_results"]["ocp-exact"][0]
    assert result.compile_seconds == pytest.approx(0.3)
    assert 0.0 < result.seconds <= wall - 0.3  # the sleep is not in the run time
    assert report["totals"]["ocp-exact"]["compile_seconds"] == pytest.approx(0.3)
    assert "(+ 0.3 s compiling kernels)" in format_report(report)
    monkeypatch.setattr(layer_module, "run_layer", real_run_layer)
    quiet = replay(trace, [HW["ocp-exact"]])
    assert quiet["totals"]["ocp-exact"][
        "compile_seconds"
    ] == 0.0 and "compiling" not in format_report(quiet)


@pytest.mark.parametrize("channels, geometries", [(32, 1), (6, 2)])
def test_a_layer_is_lowered_once(monkeypatch, channels, geometries):
    """The unit in the loop (a new input) works its conv layer's geometry out once per call,
    plus once for the operands' view when their channels are padded to whole blocks; the
    result equals the layer's direct convolution."""
    from mxsim.trace import conv

    made = []
    real = conv.Conv2dGeometry.from_shapes.__func__
    monkeypatch.setattr(
        conv.Conv2dGeometry,
        "from_shapes",
        classmethod(lambda cls, *args: made.append(args[0]) or real(cls, *args)),
    )
    rng = np.random.default_rng(5)
    x = rng.integers(-7, 8, size=(1, channels, 5, 5)).astype(np.float32)
    w = rng.integers(-7, 8, size=(3, channels, 3, 3)).astype(np.float32)
    attrs = {"stride": [1, 1], "padding": [[1, 1], [1, 1]], "dilation": [1, 1], "groups": 1}
    spec = MXQuant("fp8_e4m3", axis=1, block_size=32)
    layer = Layer(
        "conv",
        "conv2d",
        {"input": x[:, :, :4], "weight": w, "output": np.zeros((1, 3, 4, 5), np.float32)},
        attrs,
        {"input": spec, "weight": spec, "bias": None},
        {},
    )
    values = run_layer(layer, HW["ocp-exact"], x).values
    assert len(made) == geometries
    expected = conv2d_direct(x, w, None, real(conv.Conv2dGeometry, x.shape, w.shape, 1, 1, 1, 1))
    np.testing.assert_array_equal(values, expected)


def _same_layouts(stand_in, real, names) -> None:
    """The arrays ``names`` of both have one shape, dtype and C order (the kernels compile per
    type and layout)."""
    for name in names:
        got, want = getattr(stand_in, name), getattr(real, name)
        assert (got.shape, got.dtype, got.flags.c_contiguous) == (
            want.shape,
            want.dtype,
            want.flags.c_contiguous,
        ), name


@pytest.mark.parametrize(
    ("unit", "fmt", "per_tensor", "exponent"),
    [
        ("h100-fp8", "fp8_e4m3", False, None),
        ("ocp-exact", "fp4_e2m1", False, None),
        ("a100", "fp16", True, -3),
        ("ocp-exact", "int8", True, None),
        ("bfp-exact", "mx9", False, None),
    ],
)
def test_placeholder_quantization_has_the_quantizers_layout_and_types(
    unit, fmt, per_tensor, exponent
):
    """The warm-up's stand-in for replay's quantization (no kernels) gives what
    ``_requantize`` gives but the values: the arrays' shapes, dtypes and C order (the route's
    kernels compile per type and layout), the block layout and options; every code 0 and every
    scale 1, except for shared-microexponent formats, which it quantizes."""
    from mxsim.replay.choice import OperandChoice
    from mxsim.replay.layer import _requantize, by_shared_exponents, placeholder_quantization

    hw = load_hwconfig(REPO / "hwconfigs" / f"{unit}.yaml")
    block = hw.params(fmt, fmt).block_size
    values = np.random.default_rng(3).normal(size=(3, 5, 70)).astype(np.float32)
    choice = OperandChoice(
        fmt, "ocp", per_tensor, tensor_scale_exponent=exponent, block_size=block, status="added"
    )
    real, _, _ = _requantize(values, choice, {}, False)
    stand_in, saturated, underflowed = placeholder_quantization(values, choice, {})
    assert (saturated, underflowed) == (0, 0)
    _same_layouts(stand_in, real, ("codes", "scales", "tensor_scale_exponents"))
    for name in ("element_format", "shape", "axis", "block_size", "padding", "options"):
        assert getattr(stand_in, name) == getattr(real, name), name
    if by_shared_exponents(choice):
        np.testing.assert_array_equal(stand_in.codes, real.codes)
        return
    assert not stand_in.codes.any() and (stand_in.scales == 127).all()
    assert (stand_in.tensor_scale_exponents == (exponent or 0)).all()


@pytest.mark.parametrize("per_tensor", [True, False])
def test_placeholder_nvfp4_has_the_quantizers_layout_and_types(per_tensor):
    """On an NVFP4 unit the stand-in is NVFP4 groups of the quantizer's shapes, dtypes and
    options: codes 0, every scale 1.0 (UE4M3 0x38), no tensor scales."""
    from mxsim.replay.choice import OperandChoice
    from mxsim.replay.layer import _requantize, placeholder_quantization

    values = np.random.default_rng(4).normal(size=(3, 5, 70)).astype(np.float32)
    choice = OperandChoice(
        "fp4_e2m1", "torchao", per_tensor, block_size=16, scale_format="ue4m3", status="added"
    )
    real, _, _ = _requantize(values, choice, {}, False)
    stand_in, *_ = placeholder_quantization(values, choice, {})
    _same_layouts(stand_in, real, ("codes", "scales"))
    assert stand_in.options == real.options and len(stand_in) == 3
    assert (real.tensor_scales[0] is not None) == per_tensor
    assert not stand_in.codes.any() and (stand_in.scales == 0x38).all()
    assert stand_in.tensor_scales == (None, None, None)


@pytest.mark.parametrize(
    "unit, fmt",
    [
        ("ocp-exact", "fp8_e4m3"),
        ("mxdotp", "fp8_e4m3"),
        ("h100-fp8", "fp8_e4m3"),
        ("b200-nvfp4", "fp4_e2m1"),
    ],
)
def test_run_layer_leaves_the_layer_its_input_and_kept_weights_unchanged(unit, fmt):
    """run_layer, called twice with kept weight quantizations, input quantizations and a
    weight memo, on a layer the model quantized and on a float layer with a bias that
    replay quantizes (a K of 70: blocks padded), leaves every byte of the layer's tensors,
    of the input given, and of what the first call kept as it was; the second call's
    values are the first's."""
    rng = np.random.default_rng(12)
    quantized = mx_linear_layer(rng, "fp8_e4m3")
    x = rng.standard_normal((6, 70)).astype(np.float32)
    w = rng.standard_normal((5, 70)).astype(np.float32)
    bias = rng.standard_normal(5).astype(np.float32)
    output = (x.astype(np.float64) @ w.T.astype(np.float64) + bias).astype(np.float32)
    plain = Layer(
        "fc",
        "linear",
        {"input": x, "weight": w, "bias": bias, "output": output},
        {},
        {"input": None, "weight": None, "bias": None},
        {},
    )
    for layer in (quantized, plain):
        given = rng.standard_normal((6, 70)).astype(np.float32)
        given.reshape(-1)[:2] = [-0.0, 1e-40]
        before = byte_copies([layer.tensors, given])
        kept = {"weight_quantizations": {}, "input_quantizations": {}, "weight_memo": {}}
        runs = []
        for _ in range(2):
            runs.append(run_layer(layer, HW[unit], given, element_format=fmt, **kept))
            assert byte_copies([layer.tensors, given]) == before
            if len(runs) == 1:
                first_kept = byte_copies(kept)
        assert byte_copies(kept) == first_kept and (layer is quantized or first_kept)
        np.testing.assert_array_equal(runs[1].values, runs[0].values)


# --- units with UE4M3 block scales: replay quantizes to NVFP4 ------------------------------------


def _float_linear(seed: int, bias: bool = True) -> Layer:
    """A float 6x70 by 70x5 linear layer (no quantizers), the input and weight of different
    magnitudes, with a bias."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((6, 70)) * 37.0).astype(np.float32)
    w = (rng.standard_normal((5, 70)) * 2.0**-9).astype(np.float32)
    tensors = {"input": x, "weight": w, "output": np.zeros((6, 5), np.float32)}
    if bias:
        tensors["bias"] = np.linspace(-1, 1, 5).astype(np.float32)
    return Layer("fc", "linear", tensors, {}, {"input": None, "weight": None, "bias": None}, {})


def _round_to_fp32(value: Fraction) -> float:
    """``value`` rounded once to float32, nearest even (via float64 only where that is exact)."""
    wide = float(value)
    assert Fraction(wide) == value  # the test's sums fit float64: one rounding below
    return float(np.float32(wide))


@pytest.mark.parametrize("per_tensor_scale", [None, False])
def test_an_nvfp4_unit_gets_nvfp4_operands_bit_for_bit(per_tensor_scale):
    """On a unit with UE4M3 scales per 16, each operand is quantized by the NVFP4 recipe along
    K (padded to whole blocks; by default two-level, the tensor scale from the operand's amax;
    single-level when per_tensor_scale is False): the unit's bits are matmul's on those
    tensors, its values times both tensor scales plus the bias (after: the epilogue adds it),
    and the ideal is the exact sum of the e * s products rounded once to fp32, times the
    tensor scales."""
    layer = _float_linear(41)
    hw = load_hwconfig(REPO / "hwconfigs" / "b200-nvfp4.yaml")
    run = run_layer(layer, hw, per_tensor_scale=per_tensor_scale)
    x, w = (np.pad(layer.tensors[n], ((0, 0), (0, 10))) for n in ("input", "weight"))
    two_level = per_tensor_scale is None
    qa, qb = (
        quantize_nvfp4(v, tensor_scale_from_amax(np.abs(v).max()) if two_level else None)
        for v in (x, w)
    )
    assert (qa.tensor_scale is not None) == two_level
    unit = matmul(hw, qa, qb)
    np.testing.assert_array_equal(run.bits[0], unit.bits)
    np.testing.assert_array_equal(run.values, unit.values + layer.tensors["bias"])
    for choice in (run.input, run.weight):
        assert (choice.format, choice.block_size, choice.scale_format) == ("fp4_e2m1", 16, "ue4m3")
        assert choice.status == "added" and choice.per_tensor_scale == two_level
    t = (qa.tensor_scale or 1.0) * (qb.tensor_scale or 1.0)
    a_values = qa.exact_values() / (qa.tensor_scale or 1.0)
    b_values = qb.exact_values() / (qb.tensor_scale or 1.0)
    for m in range(6):
        for n in range(5):
            exact = sum(Fraction(p) * Fraction(q) for p, q in zip(a_values[m], b_values[n]))
            want = _round_to_fp32(exact) * t + float(layer.tensors["bias"][n])
            assert run.ideal[m, n] == want, (m, n)
    # elements the quantization clipped to +-6 times their scales
    assert run.input.saturated == int(
        (
            (np.abs(layer.input) > np.abs(qa.exact_values()[:, :70]))
            & (np.abs(E2M1.decode(qa.codes[:, :70])) == 6)
        ).sum()
    )


def test_an_nvfp4_unit_replaces_an_mx_quantized_operand():
    """An MX spec (E8M0 scales per 32) is no quantization an NVFP4 unit takes, even in a format
    it takes: replay quantizes the float to NVFP4 and marks the row; strict refuses it."""
    layer = mx_linear_layer(np.random.default_rng(42), "fp4_e2m1")
    hw = load_hwconfig(REPO / "hwconfigs" / "b200-nvfp4.yaml")
    run = run_layer(layer, hw)
    assert run.input.status == run.weight.status == "replaced"
    assert "takes ue4m3 block scales" in run.input.note
    assert (run.input.format, run.input.profile) == ("fp4_e2m1", "torchao")
    with pytest.raises(MxsimError, match="takes ue4m3 block scales"):
        run_layer(layer, hw, strict=True)


def test_replay_of_a_trace_on_nvfp4_units_reports_their_operands():
    trace = load_trace(REPO / "traces" / "digits-cnn")
    units = [
        load_hwconfig(REPO / "hwconfigs" / f"{n}.yaml")
        for n in ("b200-nvfp4", "rtx50-mma-mxf4nvf4")
    ]
    report = replay(trace, units, end_to_end=True)
    assert "fp4_e2m1/16/ue4m3/pt x fp4_e2m1/16/ue4m3/pt" in format_report(report)
    for hw in units:
        results = report["_results"][hw.name]
        assert len(results) == 4
        assert all(r.sqnr_vs_float_db > 12 and r.sqnr_vs_ideal_db > 100 for r in results)
        assert report["end_to_end"]["accuracy"][hw.name] > 0.9
