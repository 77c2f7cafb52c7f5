"""mxsim.capture.torch_quark: models quantized by AMD Quark's torch ModelQuantizer, run live.

For each spec, a two-layer MLP (heavy-tailed weights, activations with outlier channels) is
quantized by Quark and captured. Quark's quantized operands are taken by forward hooks on its
quantizer modules and its layer outputs by hooks on its QuantLinear modules, independently of
the capture. Checked per layer: the capture's float operands quantized by the recorded spec
are Quark's quantized operands bit for bit (equal values: equal codes and scales), and the
layer replayed on an exact unit is Quark's layer output at >= 100 dB with the unit taking the
model's operands (status "model"). Quark's scaled fake quantizer is ``torch.compile``d unless
``QUARK_DISABLE_COMPILE`` is set: set here (before Quark is imported) since compiling each spec
costs minutes on CI; the capture runs Quark's quantizers outside its interception either way.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from conftest import (
    REPO,
    bit_mismatches,
    import_or_skip,
    outlier_activations,
    sqnr_db,
    trained_like,
)

from mxsim import load_hwconfig
from mxsim.replay.lowering import gemm_reference
from mxsim.replay.layer import run_layer
from mxsim.trace import BFPQuant, MXQuant, QDQQuant, load_trace, save_trace

os.environ.setdefault("QUARK_DISABLE_COMPILE", "1")
OCP = load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml")
BFP = load_hwconfig(REPO / "hwconfigs" / "bfp-exact.yaml")


@pytest.fixture(scope="module")
def quark(torch):
    import_or_skip("quark.torch", "oracles")
    from quark.torch import ModelQuantizer
    from quark.torch.quantization.config import config

    return ModelQuantizer, config


def mlp(torch):
    """Linear(64, 96) -> GELU -> Linear(96, 32), trained-like weights."""
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32)
    ).eval()
    trained_like(torch, (model[0], model[2]))
    return model


def quantize(torch, quark, spec, input_spec=None):
    ModelQuantizer, config = quark
    spec = spec.to_quantization_spec()
    layer = config.QLayerConfig(
        weight=spec, input_tensors=input_spec.to_quantization_spec() if input_spec else spec
    )
    x = outlier_activations(torch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ModelQuantizer(config.QConfig(global_quant_config=layer)).quantize_model(
            mlp(torch), [x]
        )
    return model, x


def quark_run(torch, model, x) -> dict:
    """layer -> {"input", "weight": Quark's quantized operands, "output": its layer output}, by hooks."""
    seen = {}

    def keep(name, key):
        def hook(_module, _inputs, output):
            seen.setdefault(name, {})[key] = output.detach().numpy().copy()

        return hook

    handles = []
    for name in ("0", "2"):
        handles.append(model[int(name)].register_forward_hook(keep(name, "output")))
        handles.append(model[int(name)]._input_quantizer.register_forward_hook(keep(name, "input")))
        handles.append(
            model[int(name)]._weight_quantizer.register_forward_hook(keep(name, "weight"))
        )
    with torch.no_grad():
        model(x)
    for handle in handles:
        handle.remove()
    return seen


SPECS = {  # name -> (Quark spec factory, mxsim format or BFP name, profile; None: BFP)
    "mxfp8_e4m3": (lambda c: c.OCP_MXFP8E4M3Spec(ch_axis=-1), "fp8_e4m3", "quark"),
    "mxfp8_e5m2": (lambda c: c.OCP_MXFP8E5M2Spec(ch_axis=-1), "fp8_e5m2", "quark"),
    "mxfp6_e2m3": (lambda c: c.OCP_MXFP6E2M3Spec(ch_axis=-1), "fp6_e2m3", "quark"),
    "mxfp6_e3m2": (lambda c: c.OCP_MXFP6E3M2Spec(ch_axis=-1), "fp6_e3m2", "quark"),
    "mxfp4": (lambda c: c.OCP_MXFP4Spec(ch_axis=-1), "fp4_e2m1", "quark"),
    "mxint8": (lambda c: c.OCP_MXINT8Spec(ch_axis=-1), "int8", "quark"),
    "mxfp8_e4m3 floor": (
        lambda c: c.OCP_MXFP8E4M3Spec(ch_axis=-1, scale_calculation_mode="floor"),
        "fp8_e4m3",
        "quark-floor",
    ),
    "mxfp4 ceil": (
        lambda c: c.OCP_MXFP4Spec(ch_axis=-1, scale_calculation_mode="ceil"),
        "fp4_e2m1",
        "quark-ceil",
    ),
    "mx6": (lambda c: c.MX6Spec(ch_axis=-1, block_size=16), "MX6", None),
    "mx9": (lambda c: c.MX9Spec(ch_axis=-1, block_size=16), "MX9", None),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_quark_quantized_layers_replay_bit_for_bit(torch, quark, name):
    from mxsim.capture.torch import capture_torch

    make, fmt, profile = SPECS[name]
    model, x = quantize(torch, quark, make(quark[1]))
    want = quark_run(torch, model, x)
    trace = capture_torch(model, x)
    assert [layer.name for layer in trace.layers] == ["0", "2"]
    for layer in trace.layers:
        quantizers = layer.source["quantizers"]
        assert quantizers["input"].startswith(f"{layer.name}._input_quantizer (")
        assert quantizers["weight"].startswith(f"{layer.name}._weight_quantizer (")
        assert np.array_equal(
            layer.weight, model[int(layer.name)].weight.detach().numpy()
        )  # the float weight
        for operand in ("input", "weight"):
            spec = layer.quant[operand]
            if profile:
                assert isinstance(spec, MXQuant) and (
                    spec.format,
                    spec.profile,
                    spec.block_size,
                ) == (fmt, profile, 32)
            else:
                assert (
                    isinstance(spec, BFPQuant) and spec.name == fmt and spec.spec.block_size == 16
                )
            assert spec.axis == layer.tensors[operand].ndim - 1
            quark_values = want[layer.name][operand]
            assert bit_mismatches(layer.quantized(operand), quark_values)[0] == 0
            ours = np.asarray(spec.fake_quantize(layer.tensors[operand])).astype(np.float32)
            assert bit_mismatches(ours, quark_values) == (0, [])
        run = run_layer(layer, BFP if profile is None else OCP)
        assert run.input.status == run.weight.status == "model"
        assert sqnr_db(want[layer.name]["output"], run.values) >= 100


@pytest.mark.parametrize("name", ["mx6", "mx9"])
def test_quark_mx6_mx9_zero_and_subnormal_inputs_give_positive_zeros(torch, quark, name):
    """quark.torch replaces zero and subnormal inputs by +0.0 before quantizing MX6/MX9 (its
    ONNX op keeps -0.0), while a normal negative that rounds to zero stays -0.0: the captured
    spec says so (``flushed_zero_sign``) and gives Quark's bits."""
    from mxsim.capture.torch import capture_torch

    make, fmt, _ = SPECS[name]
    model, x = quantize(torch, quark, make(quark[1]))
    x = x.clone()
    x[0, 0, 1:4] = -0.0
    x[0, 0, 4:7] = -(2.0**-140)
    x[0, 0, 8:11] = -1e-30
    want = quark_run(torch, model, x)["0"]["input"]
    assert not np.signbit(want[0, 0, 1:7]).any() and np.signbit(want[0, 0, 8:11]).all()
    layer = capture_torch(model, x).layers[0]
    spec = layer.quant["input"]
    assert isinstance(spec, BFPQuant) and spec.name == fmt
    assert spec.spec.flushed_zero_sign == "positive"
    ours = np.asarray(spec.fake_quantize(layer.tensors["input"])).astype(np.float32)
    assert bit_mismatches(ours, want) == (0, [])


SCALED = {  # name -> (weight spec factory, input spec factory or None: the weight's)
    "bfp16": (lambda c: c.BFP16Spec(ch_axis=-1), None),
    "fp8_e4m3 per tensor": (lambda c: c.FP8E4M3PerTensorSpec(), None),
    "fp8_e5m2 per tensor": (lambda c: c.FP8E5M2PerTensorSpec(), None),
    "fp8_e4m3 per channel": (
        lambda c: c.FP8E4M3PerChannelSpec(ch_axis=0),
        lambda c: c.FP8E4M3PerTensorSpec(),
    ),
}


@pytest.mark.parametrize("name", list(SCALED))
def test_quark_bfp16_and_fp8_with_float_scales_replay_bit_for_bit(torch, quark, name, tmp_path):
    """BFP16 (Quark torch's own: INT8 elements in blocks of 8 at stored block scales) and FP8
    per tensor / per output channel (Quark's float32 scales): the recorded spec applied to
    the float operand is Quark's quantized operand bit for bit, with Quark's scale values;
    replayed on an exact unit that takes the model's operands (FP8 codes, the float scales
    applied to the unit's sums), the layer is Quark's output at >= 100 dB."""
    from mxsim.capture.torch import capture_torch

    weight, inputs = SCALED[name]
    c = quark[1]
    model, x = quantize(torch, quark, weight(c), inputs and inputs(c))
    want = quark_run(torch, model, x)
    save_trace(capture_torch(model, x), tmp_path / "trace")
    trace = load_trace(tmp_path / "trace")  # the specs, scales and float scales as saved
    assert [layer.name for layer in trace.layers] == ["0", "2"]
    for layer in trace.layers:
        module = model[int(layer.name)]
        for operand in ("input", "weight"):
            spec, quark_values = layer.quant[operand], want[layer.name][operand]
            assert bit_mismatches(layer.quantized(operand), quark_values)[0] == 0
            ours = np.asarray(spec.fake_quantize(layer.tensors[operand])).astype(np.float32)
            assert bit_mismatches(ours, quark_values) == (0, [])
            if name == "bfp16":
                assert isinstance(spec, MXQuant) and (spec.format, spec.block_size) == ("int8", 8)
                assert spec.axis == layer.tensors[operand].ndim - 1
            else:
                quantizer = getattr(module, f"_{operand}_quantizer")
                assert isinstance(spec, QDQQuant) and spec.dtype.startswith("float8")
                assert np.array_equal(
                    spec.scale.reshape(-1), quantizer.scale.detach().numpy().reshape(-1)
                )
                levels, values = spec.levels(layer.tensors[operand])  # FP8 values x scale
                assert bit_mismatches(values, quark_values) == (0, [])
        run = run_layer(layer, BFP if name == "bfp16" else OCP)
        assert run.input.status == run.weight.status == "model"
        assert sqnr_db(want[layer.name]["output"], run.values) >= 100
        assert sqnr_db(want[layer.name]["output"], run.ideal) >= 100


@pytest.mark.parametrize("weights", ["per tensor", "per channel", "per channel asymmetric"])
def test_quark_int8_is_read_with_its_scales(torch, quark, weights):
    """int8 per tensor (and per output channel for the weights): a qdq spec with Quark's
    scales and torch's reciprocal arithmetic, which gives Quark's values bit for bit; the
    product of the recorded operands is Quark's layer output, and so is the layer on an
    exact unit that takes the integers as codes (>= 100 dB; asymmetric weights, whose
    q - zero_point an INT8 code cannot hold, reach it as the values Quark multiplied)."""
    from mxsim.capture.torch import capture_torch

    c = quark[1]
    weight = {
        "per tensor": c.Int8PerTensorSpec(),
        "per channel": c.Int8PerChannelSpec(ch_axis=0, symmetric=True),
        "per channel asymmetric": c.Int8PerChannelSpec(ch_axis=0),
    }[weights]
    model, x = quantize(torch, quark, weight, c.Int8PerTensorSpec())
    want = quark_run(torch, model, x)
    trace = capture_torch(model, x)
    for layer in trace.layers:
        for operand in ("input", "weight"):
            assert bit_mismatches(layer.quantized(operand), want[layer.name][operand])[0] == 0
            spec = layer.quant[operand]
            assert isinstance(spec, QDQQuant) and spec.dtype == "int8" and spec.reciprocal
            per_channel = operand == "weight" and weights != "per tensor"
            assert spec.axis == (0 if per_channel else None)
            quantizer = getattr(model[int(layer.name)], f"_{operand}_quantizer")
            assert np.array_equal(
                spec.scale, quantizer.scale.detach().numpy().reshape(spec.scale.shape)
            )
            ours = np.asarray(spec.fake_quantize(layer.tensors[operand]), dtype=np.float32)
            assert bit_mismatches(ours, want[layer.name][operand]) == (0, [])
        assert sqnr_db(want[layer.name]["output"], gemm_reference(layer)) >= 100
        run = run_layer(layer, OCP)  # the integers as MX INT8 codes, the scales after
        assert run.input.status == "model"
        if weights == "per channel asymmetric":
            assert run.weight.status == "added" and layer.quant["weight"].zero_point.any()
        else:
            assert run.weight.status == "model"
            assert sqnr_db(want[layer.name]["output"], run.values) >= 100


def test_int8_reading_is_torchs_reciprocal_on_near_ties(torch, quark):
    """Quark's int8 kernels (torch's ``x * (1 / scale)``) against mxsim's reciprocal QDQ on
    values at and one float32 step off half-integer multiples of scales whose reciprocal is
    inexact: equal; onnxruntime's division (``reciprocal`` false) differs there."""
    from quark.torch.kernel.hw_emulation import hw_emulation_interface as kernels

    rng = np.random.default_rng(3)
    scale = (rng.uniform(0.5, 2, size=64) * 0.013).astype(np.float32)
    ties = (rng.integers(-127, 127, size=(64, 512)) + 0.5) * scale[:, None].astype(np.float64)
    ties = ties.astype(np.float32)
    x = np.where(rng.random(ties.shape) < 0.5, np.nextafter(ties, 2 * ties), ties)
    x = x.astype(np.float32)
    zero = torch.zeros(64, dtype=torch.int32)
    want = kernels.fake_quantize_int_per_channel_affine(
        torch.from_numpy(x), torch.from_numpy(scale), zero, 0, -128, 127, 8
    ).numpy()
    ours = QDQQuant("int8", scale, None, 0, reciprocal=True).fake_quantize(x)
    assert bit_mismatches(ours, want) == (0, [])
    assert bit_mismatches(QDQQuant("int8", scale, None, 0).fake_quantize(x), want)[0] > 0
    want = kernels.fake_quantize_int_per_tensor_affine(
        torch.from_numpy(x), torch.tensor(scale[0]), zero[0], -128, 127, 8
    ).numpy()
    ours = QDQQuant("int8", scale[:1].reshape(()), reciprocal=True).fake_quantize(x)
    assert bit_mismatches(ours, want) == (0, [])


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "bfp16", "fp8_e4m3 per tensor"])
def test_quark_in_the_loop_takes_the_model_quantization(torch, quark, name):
    from mxsim.inloop.torch import torch_unit

    c = quark[1]
    spec = {
        "mxfp8_e4m3": c.OCP_MXFP8E4M3Spec(ch_axis=-1),
        "bfp16": c.BFP16Spec(ch_axis=-1),
        "fp8_e4m3 per tensor": c.FP8E4M3PerTensorSpec(),
    }[name]
    model, x = quantize(torch, quark, spec)
    with torch.no_grad():
        want = model(x).numpy()
    with torch_unit(model, BFP if name == "bfp16" else OCP) as unit:
        got = model(x).numpy()
    assert unit.computed_layers == ["0", "2"]
    assert not unit.not_read
    assert sqnr_db(want, got) >= 100
    taken = unit.model_quantization["2"]
    if name == "mxfp8_e4m3":
        assert taken["input"].startswith("2._input_quantizer (DynamicScaledFakeQuantize): mx")
        assert "'profile': 'quark'" in taken["weight"] and "fp8_e4m3" in taken["weight"]
    elif name == "bfp16":
        assert all(": mx " in taken[op] and "'int8'" in taken[op] for op in ("input", "weight"))
    else:
        assert all(
            ": qdq " in taken[op] and "float8e4m3fn" in taken[op] for op in ("input", "weight")
        )


def test_each_operand_gets_its_own_quantizer_reading(torch, quark):
    """Int8 per-tensor input with MXFP4 weights: each operand gets its own quantizer's reading."""
    from mxsim.capture.torch import capture_torch

    c = quark[1]
    model, x = quantize(torch, quark, c.OCP_MXFP4Spec(ch_axis=-1), input_spec=c.Int8PerTensorSpec())
    want = quark_run(torch, model, x)
    trace = capture_torch(model, x)
    for layer in trace.layers:
        assert isinstance(layer.quant["input"], QDQQuant) and isinstance(
            layer.quant["weight"], MXQuant
        )
        assert bit_mismatches(layer.quantized("weight"), want[layer.name]["weight"])[0] == 0
        assert sqnr_db(want[layer.name]["output"], gemm_reference(layer)) >= 100


def test_bfp16_reading_is_quarks_kernel_on_corner_blocks(torch, quark):
    """mxsim's reading of Quark torch BFP16 (:func:`bfp16_scales` and MX INT8 at them) against
    Quark's own ``fake_quantize_bfp16`` on the blocks where its rules bite: amax just below a
    power of two (the float32 log2 rounds up), elements rounding to +128 (the exponent
    carries) and to -128 (kept), all-zero blocks, negative values that round to zero (+0),
    over exponents -100..99, along either axis."""
    from quark.torch.kernel.hw_emulation.hw_emulation_interface import fake_quantize_bfp16

    from mxsim.capture.torch_quark import BFP16_OPTIONS, BFP16_PROFILE, bfp16_scales

    exponents = np.arange(-100, 100)
    steps = np.arange(64)
    below = np.ldexp(1.0, exponents)[:, None] * (1 - steps[None, :] * 2.0**-24)
    carry = np.ldexp(127.5 + steps / 128, exponents[:, None] - 6)  # x * 2^(6-X) in [127.5, 128)
    rows = np.concatenate([below, -below, carry, -carry, np.zeros_like(carry), -carry / 300])
    blocks = rows.astype(np.float32).reshape(-1, 8)
    for x, axis in ((blocks, 1), (np.ascontiguousarray(blocks.T), 0)):
        want = fake_quantize_bfp16(torch.from_numpy(x), axis=axis, block_size=8).numpy()
        spec = MXQuant("int8", axis, 8, BFP16_PROFILE, BFP16_OPTIONS, scales=bfp16_scales(x, axis))
        assert bit_mismatches(spec.fake_quantize(x).astype(np.float32), want) == (0, [])
