"""mxsim.capture.torch_brevitas: models built from Brevitas' quantized layers, run live.

A two-layer MLP of ``brevitas.nn.QuantLinear`` (heavy-tailed weights, activations with
outlier channels) with Brevitas' OCP MX quantizers (``MXFloat8e4m3Weight`` /
``MXFloat8e4m3Act``, and the same mixins with E5M2 and E2M1 elements, as Brevitas builds its
MX formats) is captured. Brevitas' quantized operands are taken by forward hooks on its
quantizer proxies (their QuantTensors' ``.value``) and its layer outputs by hooks on the
layers, independently of the capture. Checked per layer: the capture's float operands
quantized by the recorded spec are Brevitas' quantized operands bit for bit, and the layer
replayed on an exact unit taking the model's operands (status "model") is Brevitas' float32
layer output at >= 100 dB. Brevitas' MX INT8 (``MXInt8Weight`` / ``MXInt8Act``) is read with
the scales Brevitas chose (its rule is not OCP's): element codes equal to Brevitas' integer
codes, scales to its scales, values bit for bit, layers at >= 100 dB on the exact unit and in
the loop. Per-tensor OCP FP8 quantizers are recorded as Brevitas computed them (no spec, a
note).
"""

from __future__ import annotations

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

from mxsim import load_hwconfig, quantize_mx
from mxsim.replay.lowering import gemm_reference
from mxsim.replay.run import run_layer
from mxsim.trace import MXQuant, load_trace, save_trace

OCP = load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml")


@pytest.fixture(scope="module")
def brevitas(torch):
    import_or_skip("brevitas", "brevitas")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import brevitas.nn as qnn
        from brevitas.quant import mx_quant_ocp as mx
        from brevitas.quant.experimental import float_quant_ocp as fp8

    def element(base, exponent: int, mantissa: int):
        """Brevitas' MX quantizer class ``base`` with other element widths (how its MX formats are made)."""
        return type(
            f"{base.__name__}E{exponent}M{mantissa}",
            (base,),
            {
                "bit_width": 1 + exponent + mantissa,
                "exponent_bit_width": exponent,
                "mantissa_bit_width": mantissa,
            },
        )

    quantizers = {
        "mxfp8_e4m3": (mx.MXFloat8e4m3Weight, mx.MXFloat8e4m3Act),
        "mxfp8_e5m2": (element(mx.MXFloat8e4m3Weight, 5, 2), element(mx.MXFloat8e4m3Act, 5, 2)),
        "mxfp4": (element(mx.MXFloat8e4m3Weight, 2, 1), element(mx.MXFloat8e4m3Act, 2, 1)),
        "fp8_per_tensor": (fp8.Fp8e4m3OCPWeightPerTensorFloat, fp8.Fp8e4m3OCPActPerTensorFloat),
        "mxint8": (mx.MXInt8Weight, mx.MXInt8Act),
        "mxint4": tuple(
            type(f"{q.__name__}4", (q,), {"bit_width": 4}) for q in (mx.MXInt8Weight, mx.MXInt8Act)
        ),
    }
    return qnn, quantizers


MX = {"mxfp8_e4m3": "fp8_e4m3", "mxfp8_e5m2": "fp8_e5m2", "mxfp4": "fp4_e2m1"}


def mlp(torch, brevitas, name: str):
    """QuantLinear(64, 96) -> GELU -> QuantLinear(96, 32), trained-like weights."""
    qnn, quantizers = brevitas
    weight_quant, input_quant = quantizers[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torch.nn.Sequential(
            qnn.QuantLinear(64, 96, bias=True, weight_quant=weight_quant, input_quant=input_quant),
            torch.nn.GELU(),
            qnn.QuantLinear(96, 32, bias=True, weight_quant=weight_quant, input_quant=input_quant),
        )
    trained_like(torch, (model[0], model[2]))
    return model.eval()


def brevitas_run(torch, model, x) -> dict:
    """layer -> {"input", "weight": Brevitas' quantized operands, "output": its layer output}."""
    seen = {}

    def keep(name, key):
        def hook(_module, _inputs, output):
            seen.setdefault(name, {})[key] = (
                getattr(output, "value", output).detach().numpy().copy()
            )
            if type(output).__name__ == "GroupwiseIntQuantTensor":  # its integer codes, scales
                seen[name][f"{key} codes"] = output.int().detach().numpy().copy()
                seen[name][f"{key} scales"] = output.scale.detach().numpy().copy()

        return hook

    handles = []
    for name in ("0", "2"):
        handles.append(model[int(name)].register_forward_hook(keep(name, "output")))
        handles.append(model[int(name)].input_quant.register_forward_hook(keep(name, "input")))
        handles.append(model[int(name)].weight_quant.register_forward_hook(keep(name, "weight")))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(x)
    for handle in handles:
        handle.remove()
    return seen


def capture(torch, model, x):
    from mxsim.capture.torch import capture_torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return capture_torch(model, x)


@pytest.mark.parametrize("name", list(MX))
def test_brevitas_mx_layers_replay_bit_for_bit(torch, brevitas, name):
    model, x = mlp(torch, brevitas, name), outlier_activations(torch)
    want = brevitas_run(torch, model, x)
    trace = capture(torch, model, x)
    assert [layer.name for layer in trace.layers] == ["0", "2"]
    for layer in trace.layers:
        assert (
            layer.source["quantizers"]["weight"] == f"{layer.name}.weight_quant "
            "(GroupwiseWeightFloatQuantProxyFromInjector)"
        )
        assert np.array_equal(
            layer.weight, model[int(layer.name)].weight.detach().numpy()
        )  # the float weight
        for operand in ("input", "weight"):
            spec = layer.quant[operand]
            assert isinstance(spec, MXQuant) and (spec.format, spec.profile, spec.block_size) == (
                MX[name],
                "ocp",
                32,
            )
            assert spec.axis == layer.tensors[operand].ndim - 1
            assert bit_mismatches(layer.quantized(operand), want[layer.name][operand]) == (0, [])
            ours = np.asarray(spec.fake_quantize(layer.tensors[operand])).astype(np.float32)
            assert bit_mismatches(ours, want[layer.name][operand]) == (0, [])
        run = run_layer(layer, OCP)
        assert run.input.status == run.weight.status == "model"
        assert sqnr_db(want[layer.name]["output"], run.values) >= 100


def test_brevitas_mxint8_is_read_with_brevitas_scales(torch, brevitas, tmp_path):
    model, x = mlp(torch, brevitas, "mxint8"), outlier_activations(torch)
    want = brevitas_run(torch, model, x)
    save_trace(capture(torch, model, x), tmp_path / "trace")
    trace = load_trace(tmp_path / "trace")  # the specs and their scales as saved
    assert [layer.name for layer in trace.layers] == ["0", "2"]
    for layer in trace.layers:
        for operand in ("input", "weight"):
            spec, values = layer.quant[operand], layer.tensors[operand]
            assert isinstance(spec, MXQuant) and (spec.format, spec.block_size) == ("int8", 32)
            assert spec.axis == values.ndim - 1 and spec.scales is not None
            quantized = spec.quantize(values)
            codes = want[layer.name][f"{operand} codes"].reshape(-1, 32)
            assert np.array_equal(quantized.codes.view(np.int8).reshape(-1, 32), codes)
            steps = want[layer.name][f"{operand} scales"].reshape(-1, 32)
            assert np.array_equal(
                np.ldexp(1.0, quantized.scales.astype(int).reshape(-1) - 127 - 6), steps[:, 0]
            )
            assert bit_mismatches(layer.quantized(operand), want[layer.name][operand]) == (0, [])
            ours = np.asarray(spec.fake_quantize(values)).astype(np.float32)
            assert bit_mismatches(ours, want[layer.name][operand]) == (0, [])
            ocp = quantize_mx(values.reshape(-1, values.shape[-1]), "int8", axis=1).dequantize()
            assert not np.array_equal(ocp, want[layer.name][operand].reshape(ocp.shape))
        run = run_layer(layer, OCP)
        assert run.input.status == run.weight.status == "model"
        assert sqnr_db(want[layer.name]["output"], run.values) >= 100


def test_brevitas_mxint8_zero_signs(torch, brevitas):
    """Brevitas computes ``x / step + 0.0``: an input -0.0, and a negative whose quotient
    underflows to -0.0, come out +0.0, while a negative that rounds to zero stays -0.0; the
    captured spec (``input_unless_underflow``) gives Brevitas' bits."""
    model, x = mlp(torch, brevitas, "mxint8"), outlier_activations(torch).clone()
    x[0, 0, 0] = 2.0**100  # the first block's step is 2^94
    x[0, 0, 1:3] = -0.0
    x[0, 0, 3] = -(2.0**-60)  # x / step = -2^-154: a float32 zero
    x[0, 0, 4] = -(2.0**-50)  # x / step = -2^-144, rounds to -0
    x[0, 0, 5] = -(2.0**-130)  # subnormal, underflows too
    want = brevitas_run(torch, model, x)["0"]["input"]
    assert np.signbit(want[0, 0, 1:6]).tolist() == [False, False, False, True, False]
    layer = capture(torch, model, x).layers[0]
    spec = layer.quant["input"]
    assert isinstance(spec, MXQuant) and spec.format == "int8"
    ours = np.asarray(spec.fake_quantize(layer.tensors["input"])).astype(np.float32)
    assert bit_mismatches(ours, want) == (0, [])


def test_brevitas_fp8_per_tensor_is_read_with_its_scale(torch, brevitas):
    """OCP FP8 E4M3 per tensor: a float8e4m3fn QDQ spec with the QuantTensor's float32 scale,
    which gives Brevitas' values bit for bit; replayed on an exact unit (FP8 codes, the scales
    applied to its sums) each layer is Brevitas' output at >= 100 dB."""
    from mxsim.trace import QDQQuant

    model, x = mlp(torch, brevitas, "fp8_per_tensor"), outlier_activations(torch)
    want = brevitas_run(torch, model, x)
    trace = capture(torch, model, x)
    for layer in trace.layers:
        for operand in ("input", "weight"):
            spec = layer.quant[operand]
            assert isinstance(spec, QDQQuant) and spec.dtype == "float8e4m3fn"
            ours = spec.fake_quantize(layer.tensors[operand])
            assert bit_mismatches(ours, want[layer.name][operand]) == (0, [])
        run = run_layer(layer, OCP)
        assert run.input.status == run.weight.status == "model"
        assert sqnr_db(want[layer.name]["output"], run.values) >= 100


def test_quantizers_mxsim_does_not_read_are_recorded_as_brevitas_computed_them(torch, brevitas):
    model, x = mlp(torch, brevitas, "mxint4"), outlier_activations(torch)
    want = brevitas_run(torch, model, x)
    trace = capture(torch, model, x)
    for layer in trace.layers:
        for operand in ("input", "weight"):
            assert (
                layer.quant[operand] is None
                and "is not read by mxsim" in layer.source["quant_notes"][operand]
            )
            assert bit_mismatches(layer.quantized(operand), want[layer.name][operand]) == (0, [])
        assert sqnr_db(want[layer.name]["output"], gemm_reference(layer)) >= 100
    # in the loop the unit quantizes Brevitas' values, not the float before its quantizer
    from mxsim.inloop.torch import torch_unit

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch_unit(model, OCP) as unit:
            got = model(x).numpy()
    assert unit.not_read == {f"{n}.{op}" for n in ("0", "2") for op in ("input", "weight")}
    assert sqnr_db(want["2"]["output"], got) >= 20


@pytest.mark.parametrize("name", ["mxfp4", "mxint8", "fp8_per_tensor"])
def test_brevitas_in_the_loop_takes_the_model_quantization(torch, brevitas, name):
    from mxsim.inloop.torch import torch_unit

    model, x = mlp(torch, brevitas, name), outlier_activations(torch)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = model(x).numpy()
        with torch_unit(model, OCP) as unit:
            got = model(x).numpy()
    assert unit.computed_layers == ["0", "2"]
    assert sqnr_db(want, got) >= 100
    taken = unit.model_quantization["2"]
    if name == "fp8_per_tensor":
        assert all(": qdq " in taken[op] and "float8e4m3fn" in taken[op] for op in taken)
    elif name == "mxint8":
        assert taken["input"].startswith("2.input_quant (GroupwiseActQuantProxyFromInjector): mx")
        assert "'int8'" in taken["weight"] and "'scales': 'quant.weight.scales'" in taken["weight"]
    else:
        assert taken["input"].startswith(
            "2.input_quant (GroupwiseActFloatQuantProxyFromInjector): mx"
        )
        assert "'profile': 'ocp'" in taken["weight"] and "fp4_e2m1" in taken["weight"]
