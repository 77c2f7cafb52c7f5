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
from mxsim.trace import BFPQuant, MXQuant, QDQQuant

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


@pytest.mark.parametrize("name", ["bfp16", "fp8_per_tensor", "int8_per_tensor"])
def test_quantizers_mxsim_does_not_reproduce_are_recorded_as_quark_computed_them(
    torch, quark, name
):
    """BFP16 (Quark torch's own BFP16 differs from its ONNX kernel's in zero signs and rare
    roundings) and fp8 per-tensor (a float QDQ): spec none, Quark's values recorded, a note;
    int8 per-tensor is onnxruntime's QDQ arithmetic: a qdq spec with Quark's scale. Either way
    the product of the recorded operands is Quark's layer output."""
    from mxsim.capture.torch import capture_torch

    c = quark[1]
    spec = {
        "bfp16": c.BFP16Spec(ch_axis=-1),
        "fp8_per_tensor": c.FP8E4M3PerTensorSpec(),
        "int8_per_tensor": c.Int8PerTensorSpec(),
    }[name]
    model, x = quantize(torch, quark, spec)
    want = quark_run(torch, model, x)
    trace = capture_torch(model, x)
    for layer in trace.layers:
        for operand in ("input", "weight"):
            assert bit_mismatches(layer.quantized(operand), want[layer.name][operand])[0] == 0
            spec = layer.quant[operand]
            if name == "int8_per_tensor":
                assert isinstance(spec, QDQQuant) and spec.dtype == "int8" and spec.axis is None
                quantizer = getattr(model[int(layer.name)], f"_{operand}_quantizer")
                assert spec.scale == quantizer.scale.item()
            elif spec is None:
                assert layer.source["quant_notes"][operand]
        assert sqnr_db(want[layer.name]["output"], gemm_reference(layer)) >= 100
    if name != "int8_per_tensor":
        assert any(layer.quant[op] is None for layer in trace.layers for op in ("input", "weight"))


def test_quark_in_the_loop_takes_the_model_quantization(torch, quark):
    from mxsim.inloop.torch import torch_unit

    model, x = quantize(torch, quark, quark[1].OCP_MXFP8E4M3Spec(ch_axis=-1))
    with torch.no_grad():
        want = model(x).numpy()
    with torch_unit(model, OCP) as unit:
        got = model(x).numpy()
    assert unit.computed_layers == ["0", "2"]
    assert sqnr_db(want, got) >= 100
    taken = unit.model_quantization["2"]
    assert taken["input"].startswith("2._input_quantizer (DynamicScaledFakeQuantize): mx")
    assert "'profile': 'quark'" in taken["weight"] and "fp8_e4m3" in taken["weight"]


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
