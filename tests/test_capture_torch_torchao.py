"""mxsim.capture.torch_torchao: bf16 models quantized by torchao's MX inference workflow, run live.

For each element type and scaling mode, a two-layer bf16 MLP (heavy-tailed weights,
activations with outlier channels) is quantized by ``quantize_(model,
MXDynamicActivationMXWeightConfig(...))`` with torchao's emulated kernels (its CPU path) and
captured. torchao's own operands are taken independently of the capture: the weight's
``qdata`` and (unswizzled) ``scale``, and the input's codes and scales from torchao's
``MXTensor.to_mx`` of the input a forward hook saw, with the weight's ``act_quant_kwargs``.
Checked per layer: the recorded input quantized by the recorded spec gives torchao's codes
and scales; the recorded weight is torchao's dequantized weight bit for bit, and its spec
(with the stored scales it carries) gives torchao's codes and scales, also after the trace
is saved and loaded again; the layer replayed on an exact unit, with the model's operands
(status "model") and its result rounded once to bf16, equals torchao's own bf16 layer
output. torchao's emulated GEMM is torch's bf16 ``addmm(bias, a, w.t())`` of its operands
dequantized to bf16 (checked: its output is that addmm's; the dequantization is exact, an
FP8/FP6/FP4 element times a power of two fitting bf16 in its range), which on CPU sums in
float32 and rounds once to bf16; the exact product rounded once can differ from it only where
a float32 sum crosses a bf16 rounding boundary, which none of these layers' outputs does
(0 ulp). The end-to-end run with the unit in the loop is held to the same equality.

torchao's weight-only NVFP4 (``NVFP4WeightOnlyConfig``, with and without its tensor scale) is
checked the same way: the weight's codes, UE4M3 scale codes and tensor scale, the bf16 values
the layer consumed, and the layer's output on a bf16 unit.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import REPO, bit_mismatches, import_or_skip, outlier_activations, trained_like

from mxsim import load_hwconfig, quantize_mx
from mxsim.errors import MxsimError
from mxsim.replay.run import run_layer
from mxsim.trace import MXQuant, load_trace, save_trace

OCP = load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml")
B200 = load_hwconfig(REPO / "hwconfigs" / "b200.yaml")
B200_FP64 = load_hwconfig(REPO / "hwconfigs" / "b200-dmma.yaml")
DTYPES = {
    "fp8_e4m3": "float8_e4m3fn",
    "fp6_e2m3": "fp6_e2m3",
    "fp4_e2m1": "float4_e2m1fn_x2",
}  # torch or torchao names
PROFILES = {"rceil": "torchao-rceil", "floor": "torchao"}


@pytest.fixture(scope="module")
def torchao(torch):
    import_or_skip("torchao.prototype.mx_formats.inference_workflow", "oracles")
    from torchao.prototype.mx_formats import inference_workflow, kernels, mx_tensor, utils
    from torchao.quantization import quantize_
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    return {
        "quantize_": quantize_,
        "workflow": inference_workflow,
        "mx": mx_tensor,
        "kernels": kernels,
        "utils": utils,
        "emulated": KernelPreference.EMULATED,
    }


def mlp(torch):
    """bf16 Linear(64, 96) -> GELU -> Linear(96, 32), trained-like weights."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32))
    trained_like(torch, (model[0], model[2]))
    return model.to(torch.bfloat16).eval()


def activations(torch):
    """The shared outlier activations in bf16."""
    return outlier_activations(torch).to(torch.bfloat16)


def quantized_mlp(torch, torchao, element: str, mode: str):
    dtype = getattr(torch, DTYPES[element], DTYPES[element])
    config = torchao["workflow"].MXDynamicActivationMXWeightConfig(
        activation_dtype=dtype,
        weight_dtype=dtype,
        kernel_preference=torchao["emulated"],
        scaling_mode=torchao["mx"].ScaleCalculationMode(mode),
    )
    model = mlp(torch)
    torchao["quantize_"](model, config)
    return model


def codes_and_scales(
    torch, torchao, qdata, scale, element: str, shape: tuple
) -> tuple[np.ndarray, np.ndarray]:
    """torchao's element codes (fp4 unpacked) and E8M0 scale bytes as (rows, K) and (rows, K/32)."""
    codes = qdata.view(torch.uint8)
    if element == "fp4_e2m1":
        codes = torchao["kernels"].unpack_uint4(codes)
    return codes.numpy().reshape(shape), scale.view(torch.uint8).numpy().reshape(shape[0], -1)


def torchao_run(torch, torchao, model, x, element: str) -> dict:
    """layer -> torchao's input and weight (codes, scales), dequantized weight and bf16 output."""
    seen = {}

    def keep(name):
        def hook(module, inputs, output):
            w = module.weight
            rows = inputs[0].reshape(-1, inputs[0].shape[-1]).contiguous()
            k = w.act_quant_kwargs
            a = torchao["mx"].MXTensor.to_mx(
                rows, k.elem_dtype, k.block_size, k.scaling_mode, k.kernel_preference
            )
            n, kk = w.shape
            scale = (
                torchao["utils"].from_blocked(w.scale, n, kk // w.block_size)
                if w.is_swizzled_scales
                else w.scale
            )
            seen[name] = {
                "input": codes_and_scales(
                    torch, torchao, a.qdata, a.scale, element, tuple(rows.shape)
                ),
                "weight": codes_and_scales(torch, torchao, w.qdata, scale, element, (n, kk)),
                "weight_values": w.dequantize(torch.float32).numpy(),
                "output": output.float().numpy(),
                "addmm": torch.addmm(
                    module.bias, a.dequantize(torch.bfloat16), w.dequantize(torch.bfloat16).t()
                )
                .float()
                .numpy(),
            }

        return hook

    handles = [model[int(name)].register_forward_hook(keep(name)) for name in ("0", "2")]
    with torch.no_grad():
        out = model(x)
    for handle in handles:
        handle.remove()
    seen["model"] = out.float().numpy()
    return seen


def bf16(torch, values: np.ndarray) -> np.ndarray:
    """``values`` rounded once to bf16 (nearest even), as float32."""
    from mxsim.capture.torch import _rounded_tensor

    return _rounded_tensor(torch, values, torch.bfloat16).float().numpy()


@pytest.mark.parametrize("mode", list(PROFILES))
@pytest.mark.parametrize("element", list(DTYPES))
def test_torchao_mx_layers_replay_as_torchao_computed_them(torch, torchao, element, mode, tmp_path):
    from mxsim.capture.torch import capture_torch

    model = quantized_mlp(torch, torchao, element, mode)
    x = activations(torch)
    want = torchao_run(torch, torchao, model, x, element)
    save_trace(capture_torch(model, x), tmp_path / "trace")
    trace = load_trace(tmp_path / "trace")
    assert [layer.name for layer in trace.layers] == ["0", "2"]
    for layer in trace.layers:
        assert (
            layer.source["quantizers"]["weight"]
            == f"{layer.name}.weight (torchao MX {element} block 32 {mode})"
        )
        for operand in ("input", "weight"):
            spec = layer.quant[operand]
            assert isinstance(spec, MXQuant) and (spec.format, spec.profile, spec.block_size) == (
                element,
                PROFILES[mode],
                32,
            )
            assert spec.axis == layer.tensors[operand].ndim - 1
        rows = layer.input.reshape(-1, layer.input.shape[-1])
        ours = quantize_mx(rows, element, axis=1, block_size=32, profile=PROFILES[mode])
        codes, scales = want[layer.name]["input"]
        assert np.array_equal(ours.scales, scales) and np.array_equal(ours.codes, codes)
        assert bit_mismatches(layer.weight, want[layer.name]["weight_values"]) == (0, [])
        ours = layer.quant["weight"].quantize(layer.weight)
        codes, scales = want[layer.name]["weight"]
        assert np.array_equal(ours.scales, scales) and np.array_equal(ours.codes, codes)
        assert "quant_notes" not in layer.source
        run = run_layer(layer, OCP)
        assert run.input.status == run.weight.status == "model"
        output = want[layer.name]["output"]
        assert np.array_equal(want[layer.name]["addmm"].reshape(output.shape), output)
        assert np.array_equal(bf16(torch, run.values), output)


def test_torchao_in_the_loop_takes_the_model_quantization(torch, torchao):
    from mxsim.inloop.torch import torch_unit

    model = quantized_mlp(torch, torchao, "fp4_e2m1", "rceil")
    x = activations(torch)
    want = torchao_run(torch, torchao, model, x, "fp4_e2m1")["model"]
    with torch_unit(model, OCP) as unit:
        with torch.no_grad():
            got = model(x)
    assert got.dtype == torch.bfloat16 and unit.computed_layers == ["0", "2"]
    assert np.array_equal(got.float().numpy(), want)
    taken = unit.model_quantization["2"]
    assert taken["input"].startswith(
        "2.weight.act_quant_kwargs (torchao MX fp4_e2m1 block 32 rceil): mx"
    )
    assert "'profile': 'torchao-rceil'" in taken["weight"]


def nvfp4_run(torch, torchao, model, x) -> dict:
    """layer -> torchao's NVFP4 weight (codes unpacked, UE4M3 scale codes unswizzled, tensor
    scale), its dequantization in the model's dtype, the layer's output and torch's F.linear of
    that."""
    seen = {}

    def keep(name):
        def hook(module, inputs, output):
            w = module.weight
            n, k = w.shape
            t = w.per_tensor_scale
            dequantized = w.dequantize(w.orig_dtype)
            seen[name] = {
                "codes": torchao["kernels"].unpack_uint4(w.qdata.view(torch.uint8)).numpy(),
                "scales": torchao["utils"]
                .from_blocked(w.scale, n, k // 16)
                .view(torch.uint8)
                .numpy()
                .reshape(n, k // 16),
                "tensor_scale": None if t is None else float(t),
                "weight": dequantized.float().numpy(),
                "output": output.float().numpy(),
                "linear": torch.nn.functional.linear(inputs[0], dequantized, module.bias)
                .float()
                .numpy(),
            }

        return hook

    handles = [model[int(name)].register_forward_hook(keep(name)) for name in ("0", "2")]
    with torch.no_grad():
        model(x)
    for handle in handles:
        handle.remove()
    return seen


@pytest.mark.parametrize("per_tensor", [True, False])
def test_torchao_nvfp4_weights_replay_as_torchao_computed_them(
    torch, torchao, per_tensor, tmp_path
):
    """torchao's weight-only NVFP4 (its CPU path): the recorded spec gives torchao's FP4 codes
    and UE4M3 scale codes bit for bit, its tensor scale is torchao's, and the recorded weight
    is torchao's bf16 dequantization (``fl(e * fl(t * s))`` rounded once to bf16); the
    layer, run on a bf16 unit (the input is bf16, which no NVFP4 unit takes), rounded once to
    bf16, equals torchao's output, which is torch's F.linear of its bf16 operands."""
    from mxsim.capture.torch import capture_torch
    from mxsim.trace import NVFP4Quant

    model = mlp(torch)
    config = torchao["workflow"].NVFP4WeightOnlyConfig(use_dynamic_per_tensor_scale=per_tensor)
    torchao["quantize_"](model, config)
    x = activations(torch)
    want = nvfp4_run(torch, torchao, model, x)
    save_trace(capture_torch(model, x), tmp_path / "trace")
    trace = load_trace(tmp_path / "trace")
    assert [layer.name for layer in trace.layers] == ["0", "2"]
    for layer in trace.layers:
        seen = want[layer.name]
        described = "with" if per_tensor else "without"
        assert layer.source["quantizers"] == {
            "weight": f"{layer.name}.weight (torchao NVFP4 {described} tensor scale)"
        }
        assert layer.quant["input"] is None and "quant_notes" not in layer.source
        spec = layer.quant["weight"]
        assert isinstance(spec, NVFP4Quant) and spec.axis == 1 and spec.dequantized == "bfloat16"
        assert spec.tensor_scale == seen["tensor_scale"]
        assert (seen["tensor_scale"] is not None) == per_tensor
        ours = spec.quantize(layer.weight)
        assert np.array_equal(ours.codes, seen["codes"]) and np.array_equal(
            ours.scales, seen["scales"]
        )
        assert bit_mismatches(layer.quantized("weight"), seen["weight"]) == (0, [])
        output = seen["output"]
        assert np.array_equal(seen["linear"], output)
        run = run_layer(layer, B200, element_format="bf16")
        assert np.array_equal(bf16(torch, run.values), output)


def test_torchao_nvfp4_float32_model_replays_above_100_db(torch, torchao):
    """A float32 model: torchao dequantizes to float32 (``fl(e * fl(t * s))``, the recorded
    weight bit for bit) and sums in float32; the layer on an fp64 unit (exact operands) is
    at >= 100 dB against torchao's layer output, and the codes and scales are torchao's."""
    from mxsim.capture.torch import capture_torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32))
    trained_like(torch, (model[0], model[2]))
    torchao["quantize_"](model.eval(), torchao["workflow"].NVFP4WeightOnlyConfig())
    x = outlier_activations(torch)
    want = nvfp4_run(torch, torchao, model, x)
    for layer in capture_torch(model, x).layers:
        seen = want[layer.name]
        assert layer.quant["weight"].dequantized == "float32" and "quant_notes" not in layer.source
        ours = layer.quant["weight"].quantize(layer.weight)
        assert np.array_equal(ours.codes, seen["codes"]) and np.array_equal(
            ours.scales, seen["scales"]
        )
        run = run_layer(layer, B200_FP64, element_format="fp64")
        output = seen["output"].reshape(run.values.shape).astype(np.float64)
        noise = np.sum(np.square(run.values - output))
        assert 10 * np.log10(np.sum(np.square(output)) / noise) >= 100


def test_torchao_nvfp4_in_the_loop_on_a_bf16_unit_equals_torchao(torch, torchao):
    """The unit in the loop computes each layer from the weight torchao consumed (bf16) and
    the bf16 input: the model's output is torchao's, and the NVFP4 quantization taken is named."""
    from mxsim.inloop.torch import torch_unit

    model = mlp(torch)
    torchao["quantize_"](model, torchao["workflow"].NVFP4WeightOnlyConfig())
    x = activations(torch)
    with torch.no_grad():
        want = model(x).float().numpy()
    with torch_unit(model, B200, a_format="bf16", b_format="bf16") as unit:
        with torch.no_grad():
            got = model(x)
    assert got.dtype == torch.bfloat16 and unit.computed_layers == ["0", "2"]
    assert np.array_equal(got.float().numpy(), want)
    taken = unit.model_quantization["2"]
    assert list(taken) == ["weight"]
    assert taken["weight"].startswith("2.weight (torchao NVFP4 with tensor scale): nvfp4 ")


@pytest.mark.parametrize("per_tensor", [True, False])
def test_torchao_nvfp4_weights_on_an_nvfp4_unit_are_taken_as_torchao_stored_them(
    torch, torchao, per_tensor
):
    """On a unit with UE4M3 scales per 16 the weight is torchao's NVFP4 tensor itself (its FP4
    codes, UE4M3 scale codes and tensor scale: status ``model``), the bf16 input quantized by
    replay's two-level NVFP4 recipe: in replay and in the loop the unit's bits are
    mxsim.matmul's on those two tensors; in the loop the layer's output is their values plus
    the bias, rounded once to bf16."""
    from mxsim import matmul
    from mxsim.capture.torch import capture_torch
    from mxsim.inloop.torch import torch_unit
    from mxsim.quantize import NVFP4_PROFILES, NVFP4Tensor, quantize_nvfp4
    from mxsim.quantize.nvfp4 import tensor_scale_from_amax
    from mxsim.replay.layer import replay_layer

    nvfp4 = load_hwconfig(REPO / "hwconfigs" / "b200-nvfp4.yaml")
    model = mlp(torch)
    config = torchao["workflow"].NVFP4WeightOnlyConfig(use_dynamic_per_tensor_scale=per_tensor)
    torchao["quantize_"](model, config)
    x = activations(torch)
    seen = nvfp4_run(torch, torchao, model, x)

    def by_hand(name, rows):
        rows = rows.reshape(-1, rows.shape[-1]).astype(np.float32)
        qa = quantize_nvfp4(rows, tensor_scale_from_amax(np.abs(rows).max()))
        taken = seen[name]
        stored = NVFP4Tensor(
            taken["codes"], taken["scales"], taken["tensor_scale"], NVFP4_PROFILES["torchao"]
        )
        return matmul(nvfp4, qa, stored)

    for layer in capture_torch(model, x).layers:
        result = replay_layer(layer, nvfp4)
        assert (result.weight.status, result.input.status) == ("model", "added")
        assert result.weight.per_tensor_scale == per_tensor
        np.testing.assert_array_equal(result.bits[0], by_hand(layer.name, layer.input).bits)
        assert result.sqnr_vs_ideal_db > 120  # the unit's arithmetic against exact sums
    with torch_unit(model[0], nvfp4) as unit:
        with torch.no_grad():
            got = model[0](x)
    (name,) = unit.computed_layers
    assert got.dtype == torch.bfloat16
    bias = model[0].bias.detach().float().numpy().astype(np.float64)
    want = bf16(torch, by_hand("0", x.float().numpy()).values + bias)
    np.testing.assert_array_equal(got.float().numpy().reshape(want.shape), want)
    assert "torchao NVFP4" in unit.model_quantization[name]["weight"]


def test_nvfp4_with_activation_quantization_and_weight_only_mx_are_refused_in_one_line(
    torch, torchao
):
    from mxsim.capture.torch import capture_torch
    from mxsim.inloop.torch import torch_unit

    nvfp4 = sys.modules["torchao.prototype.mx_formats.nvfp4_tensor"]
    model = mlp(torch)
    with torch.no_grad():
        model[0].weight = torch.nn.Parameter(
            nvfp4.NVFP4Tensor.to_nvfp4(
                model[0].weight.detach(), act_quant_kwargs=nvfp4.QuantizeTensorToNVFP4Kwargs()
            ),
            requires_grad=False,
        )
    x = activations(torch)
    for attempt in (lambda: capture_torch(model, x), lambda: torch_unit(model, OCP).__enter__()):
        with pytest.raises(
            MxsimError,
            match=r"^\w+: 0\.weight of module '0': a torchao NVFP4Tensor weight with activation "
            r"quantization is not supported [^\n]*$",
        ):
            attempt()
    model = mlp(torch)
    with torch.no_grad():
        model[2].weight = torch.nn.Parameter(
            torchao["mx"].MXTensor.to_mx(
                model[2].weight.detach(),
                torch.float8_e4m3fn,
                32,
                kernel_preference=torchao["emulated"],
            ),
            requires_grad=False,
        )
    with pytest.raises(
        MxsimError,
        match=r"^capture_torch: module '2': a torchao MXTensor weight without activation "
        r"quantization is not supported$",
    ):
        capture_torch(model, x)

    class Matmul(torch.nn.Module):  # an MXTensor used other than as F.linear's weight
        def __init__(self, weight):
            super().__init__()
            self.weight = weight

        def forward(self, x):
            return x @ self.weight.t()

    with pytest.raises(
        MxsimError,
        match=r"^capture_torch: module '<model>' \(Matmul\) calls matmul with a MXTensor, "
        r"which is not supported [^\n]*$",
    ):
        capture_torch(Matmul(quantized_mlp(torch, torchao, "fp8_e4m3", "floor")[0].weight), x)
