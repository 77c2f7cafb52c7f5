"""mxsim.trace.capture_torch: forward hooks on nn.Linear / nn.Conv2d."""

from __future__ import annotations


import numpy as np
import pytest

from mxsim.errors import MxsimError
from mxsim.trace import BFPQuant, MXQuant, load_trace, run_network, save_trace
from mxsim.trace.conv import conv2d_direct
from mxsim.trace.lowering import gemm_reference

# conv_zoo's padding="same" with an even kernel is deliberate (asymmetric padding)
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")


@pytest.fixture(scope="module")
def capture(torch):
    from mxsim.trace.capture_torch import capture_torch

    return capture_torch


def conv_zoo(torch):
    """One Conv2d per feature the trace must carry, then a Linear over a 3-d input."""
    nn = torch.nn

    class Zoo(nn.Module):
        def __init__(self):
            super().__init__()
            self.plain = nn.Conv2d(3, 4, 3)
            self.strided = nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2), bias=False)
            self.grouped = nn.Conv2d(6, 6, 3, padding=1, groups=3)
            self.depthwise = nn.Conv2d(6, 6, 3, padding=1, groups=6)
            self.same = nn.Conv2d(6, 4, 4, padding="same", dilation=1)  # even kernel: 1 before, 2 after
            self.reflect = nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")
            self.head = nn.Linear(4, 5)

        def forward(self, x):
            x = self.depthwise(self.grouped(self.strided(self.plain(x))))
            x = self.reflect(self.same(x))
            return self.head(x.permute(0, 2, 3, 1).flatten(1, 2))  # (N, H*W, C) -> linear on the last axis

    torch.manual_seed(0)
    return Zoo().eval()


def test_every_conv_and_linear_is_captured_with_its_attributes(torch, capture):
    model = conv_zoo(torch)
    x = torch.randn(2, 3, 9, 8)
    trace = capture(model, x, name="zoo")
    assert [layer.name for layer in trace.layers] == ["plain", "strided", "grouped", "depthwise", "same", "reflect", "head"]
    by_name = {layer.name: layer for layer in trace.layers}
    assert by_name["strided"].attrs == {"stride": [2, 1], "padding": [[1, 1], [2, 2]], "dilation": [1, 2], "groups": 1}
    assert "bias" not in by_name["strided"].tensors
    assert by_name["grouped"].attrs["groups"] == 3 and by_name["depthwise"].attrs["groups"] == 6
    assert by_name["same"].attrs["padding"] == [[1, 2], [1, 2]]
    assert by_name["reflect"].attrs["padding"] == [[0, 0], [0, 0]]
    assert by_name["reflect"].source == {"module": "reflect", "type": "Conv2d", "padding_mode": "reflect"}
    assert by_name["head"].op == "linear" and by_name["head"].input.ndim == 3
    for layer in trace.layers:
        module = getattr(model, layer.name)
        assert np.array_equal(layer.weight, module.weight.detach().numpy())
        assert layer.input.dtype == layer.output.dtype == np.float32


def test_captured_outputs_equal_torch_recomputed_from_the_captured_operands(torch, capture):
    F = torch.nn.functional
    trace = capture(conv_zoo(torch), torch.randn(2, 3, 9, 8))
    for layer in trace.layers:
        x, w = torch.from_numpy(layer.input), torch.from_numpy(layer.weight)
        b = None if layer.bias is None else torch.from_numpy(layer.bias)
        if layer.op == "linear":
            expected = F.linear(x, w, b)
        else:
            (top, bottom), (left, right) = layer.attrs["padding"]
            expected = F.conv2d(F.pad(x, (left, right, top, bottom)), w, b, stride=layer.attrs["stride"],
                                dilation=layer.attrs["dilation"], groups=layer.attrs["groups"])
        np.testing.assert_allclose(layer.output, expected.numpy(), rtol=1e-6, atol=1e-6)


def test_captured_outputs_equal_the_float64_gemm_view_and_direct_convolution(torch, capture):
    trace = capture(conv_zoo(torch), torch.randn(2, 3, 9, 8))
    for layer in trace.layers:
        reference = gemm_reference(layer)
        scale = np.abs(reference).max()
        np.testing.assert_allclose(layer.output, reference, rtol=0, atol=2e-6 * scale)
        if layer.op == "conv2d":
            direct = conv2d_direct(layer.input, layer.weight, layer.bias, layer.conv_geometry())
            np.testing.assert_allclose(reference, direct, rtol=1e-12, atol=1e-12 * scale)


def test_quant_specs_default_to_the_reduction_axis(torch, capture):
    trace = capture(conv_zoo(torch), torch.randn(1, 3, 9, 8),
                    quant={"input": MXQuant("fp8_e4m3"), "weight": BFPQuant("MX6"), "bias": MXQuant("int8", 0)})
    plain, strided, head = trace.layers[0], trace.layers[1], trace.layers[-1]
    assert plain.quant["input"] == MXQuant("fp8_e4m3", 1) and plain.quant["weight"] == BFPQuant("MX6", 1)
    assert head.quant["input"].axis == 2 and head.quant["weight"].axis == 1  # linear input (N, HW, C)
    assert plain.quant["bias"].axis == 0 and "bias" not in strided.quant  # no bias, no bias entry


def test_quant_callable_chooses_per_layer(torch, capture):
    def per_layer(name, module):
        return {"weight": MXQuant("fp4_e2m1", block_size=16)} if isinstance(module, torch.nn.Linear) else None

    trace = capture(conv_zoo(torch), torch.randn(1, 3, 9, 8), quant=per_layer)
    assert all(spec is None for layer in trace.layers[:-1] for spec in layer.quant.values())
    assert trace.layers[0].quant == {"input": None, "weight": None, "bias": None}
    assert trace.layers[-1].quant == {"input": None, "weight": MXQuant("fp4_e2m1", 1, 16), "bias": None}
    with pytest.raises(MxsimError, match="quant operand must be input, weight or bias"):
        capture(conv_zoo(torch), torch.randn(1, 3, 9, 8), quant={"output": MXQuant("int8")})


def test_a_module_called_twice_gets_numbered_names(torch, capture):
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(torch.relu(self.fc(x)))

    trace = capture(Twice(), torch.randn(3, 4))
    assert [layer.name for layer in trace.layers] == ["fc", "fc#2"]
    assert np.array_equal(trace.layers[1].input, np.maximum(trace.layers[0].output, 0))


def test_sequential_models_record_a_network(torch, capture, tmp_path):
    nn = torch.nn
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(),
                          nn.Sequential(nn.Linear(27, 6), nn.ReLU(), nn.Identity(), nn.Linear(6, 2))).eval()
    x = torch.randn(5, 1, 5, 5)
    labels = np.array([0, 1, 1, 0, 1])
    trace = capture(model, x, dataset={"inputs": x.numpy(), "labels": labels}, network=True)
    assert [s.get("layer", s.get("op")) for s in trace.network.steps] == ["0", "relu", "flatten", "4.0", "relu", "4.3"]
    assert trace.network.labels == "labels"
    saved = load_trace(save_trace(trace, tmp_path / "seq"))
    with torch.no_grad():
        expected = model(x).numpy()
    np.testing.assert_allclose(run_network(saved), expected, rtol=1e-5, atol=1e-6)


def test_network_is_omitted_when_it_cannot_be_derived(torch, capture):
    model = conv_zoo(torch)
    x = torch.randn(1, 3, 9, 8)
    assert capture(model, x, dataset={"inputs": x.numpy()}).network is None  # not an nn.Sequential
    with pytest.raises(MxsimError, match="network=True needs"):
        capture(model, x, dataset={"inputs": x.numpy()}, network=True)
    train_mode = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.5)).train()
    y = torch.randn(2, 3)
    assert capture(train_mode, y, dataset={"inputs": y.numpy()}).network is None


def test_bfloat16_is_widened_exactly(torch, capture):
    torch.manual_seed(2)
    model = torch.nn.Linear(8, 3).to(torch.bfloat16)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    layer = capture(model, x).layers[0]
    assert layer.input.dtype == np.float32 and layer.source["dtype"] == "bfloat16"
    assert np.array_equal(layer.input, x.to(torch.float32).numpy())
    assert np.array_equal(layer.weight, model.weight.to(torch.float32).detach().numpy())


def test_models_without_linear_or_conv_are_rejected(torch, capture):
    with pytest.raises(MxsimError, match="no nn.Linear or nn.Conv2d"):
        capture(torch.nn.ReLU(), torch.randn(2))


def test_hooks_are_removed_even_when_the_forward_fails(torch, capture):
    model = torch.nn.Linear(4, 2)
    with pytest.raises(RuntimeError):
        capture(model, torch.randn(3, 5))  # wrong input width
    assert not model._forward_hooks
