"""mxsim.capture.torch: every matmul and convolution a model runs."""

from __future__ import annotations


import numpy as np
import pytest

from conftest import TRANSFORMER_FAMILIES, count_gemm_kernels, tiny_transformer
from mxsim.errors import CaptureWarning, MxsimError
from mxsim.replay import run_network
from mxsim.trace import BFPQuant, MXQuant, load_trace, save_trace
from mxsim.trace.conv import conv2d_direct, conv_transpose2d_direct
from mxsim.replay.lowering import gemm_reference

# conv_zoo's padding="same" with an even kernel is deliberate (asymmetric padding)
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")


@pytest.fixture(scope="module")
def capture(torch):
    from mxsim.capture.torch import capture_torch

    return capture_torch


def conv_zoo(torch):
    """One Conv2d per feature the trace must carry, then a Linear over a 3-d input."""
    nn = torch.nn

    class Zoo(nn.Module):
        def __init__(self):
            super().__init__()
            self.plain = nn.Conv2d(3, 4, 3)
            self.strided = nn.Conv2d(
                4, 6, (3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2), bias=False
            )
            self.grouped = nn.Conv2d(6, 6, 3, padding=1, groups=3)
            self.depthwise = nn.Conv2d(6, 6, 3, padding=1, groups=6)
            self.same = nn.Conv2d(
                6, 4, 4, padding="same", dilation=1
            )  # even kernel: 1 before, 2 after
            self.reflect = nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")
            self.head = nn.Linear(4, 5)

        def forward(self, x):
            x = self.depthwise(self.grouped(self.strided(self.plain(x))))
            x = self.reflect(self.same(x))
            return self.head(
                x.permute(0, 2, 3, 1).flatten(1, 2)
            )  # (N, H*W, C) -> linear on the last axis

    torch.manual_seed(0)
    return Zoo().eval()


def test_every_conv_and_linear_is_captured_with_its_attributes(torch, capture):
    model = conv_zoo(torch)
    x = torch.randn(2, 3, 9, 8)
    trace = capture(model, x, name="zoo")
    assert [layer.name for layer in trace.layers] == [
        "plain",
        "strided",
        "grouped",
        "depthwise",
        "same",
        "reflect",
        "head",
    ]
    by_name = {layer.name: layer for layer in trace.layers}
    assert by_name["strided"].attrs == {
        "stride": [2, 1],
        "padding": [[1, 1], [2, 2]],
        "dilation": [1, 2],
        "groups": 1,
    }
    assert "bias" not in by_name["strided"].tensors
    assert by_name["grouped"].attrs["groups"] == 3 and by_name["depthwise"].attrs["groups"] == 6
    # the padding torch applies outside the convolution kernel arrives in the input: "same" with
    # an even kernel pads the extra pixel after, reflect padding is done before the conv
    assert by_name["same"].attrs["padding"] == [[1, 1], [1, 1]]
    assert by_name["same"].input.shape[2:] == (
        by_name["depthwise"].output.shape[2] + 1,
        by_name["depthwise"].output.shape[3] + 1,
    )
    assert by_name["reflect"].attrs["padding"] == [[0, 0], [0, 0]]
    assert by_name["reflect"].input.shape[2:] == tuple(
        d + 2 for d in by_name["same"].output.shape[2:]
    )
    assert by_name["reflect"].source == {
        "op": "aten.convolution",
        "parameter": "reflect.weight",
        "module": "reflect",
        "type": "Conv2d",
    }
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
            expected = F.conv2d(
                F.pad(x, (left, right, top, bottom)),
                w,
                b,
                stride=layer.attrs["stride"],
                dilation=layer.attrs["dilation"],
                groups=layer.attrs["groups"],
            )
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
    trace = capture(
        conv_zoo(torch),
        torch.randn(1, 3, 9, 8),
        quant={"input": MXQuant("fp8_e4m3"), "weight": BFPQuant("MX6"), "bias": MXQuant("int8", 0)},
    )
    plain, strided, head = trace.layers[0], trace.layers[1], trace.layers[-1]
    assert plain.quant["input"] == MXQuant("fp8_e4m3", 1) and plain.quant["weight"] == BFPQuant(
        "MX6", 1
    )
    assert (
        head.quant["input"].axis == 2 and head.quant["weight"].axis == 1
    )  # linear input (N, HW, C)
    assert plain.quant["bias"].axis == 0 and "bias" not in strided.quant  # no bias, no bias entry


def test_quant_callable_chooses_per_layer(torch, capture):
    def per_layer(name, module):
        return (
            {"weight": MXQuant("fp4_e2m1", block_size=16)}
            if isinstance(module, torch.nn.Linear)
            else None
        )

    trace = capture(conv_zoo(torch), torch.randn(1, 3, 9, 8), quant=per_layer)
    assert all(spec is None for layer in trace.layers[:-1] for spec in layer.quant.values())
    assert trace.layers[0].quant == {"input": None, "weight": None, "bias": None}
    assert trace.layers[-1].quant == {
        "input": None,
        "weight": MXQuant("fp4_e2m1", 1, 16),
        "bias": None,
    }
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
    model = nn.Sequential(
        nn.Conv2d(1, 3, 3),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Flatten(),
        nn.Sequential(nn.Linear(27, 6), nn.ReLU(), nn.Identity(), nn.Linear(6, 2)),
    ).eval()
    x = torch.randn(5, 1, 5, 5)
    labels = np.array([0, 1, 1, 0, 1])
    trace = capture(model, x, dataset={"inputs": x.numpy(), "labels": labels}, network=True)
    assert [s.get("layer", s.get("op")) for s in trace.network.steps] == [
        "0",
        "relu",
        "flatten",
        "4.0",
        "relu",
        "4.3",
    ]
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


def test_models_without_matmuls_are_rejected(torch, capture):
    with pytest.raises(MxsimError, match="ran no matmul or convolution"):
        capture(torch.nn.ReLU(), torch.randn(2))


def test_sample_inputs_may_be_keyword_arguments(torch, capture):
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x, scale=1.0):
            return self.fc(x) * scale

    model, x = Scaled(), torch.randn(3, 4)
    (layer,) = capture(model, {"scale": torch.tensor(2.0), "x": x}).layers
    assert layer.name == "fc" and np.array_equal(layer.tensors["input"], x.numpy())


def test_hooks_and_modes_are_removed_even_when_the_forward_fails(torch, capture):
    model = torch.nn.Linear(4, 2)
    with pytest.raises(
        MxsimError, match=r"^capture_torch: module 'Linear' raised RuntimeError \(mat1 and mat2"
    ) as error:
        capture(model, torch.randn(3, 5))  # wrong input width: torch's error, in one line
    assert isinstance(error.value.__cause__, RuntimeError)
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert torch.backends.mha.get_fastpath_enabled()
    assert (
        len(capture(model, torch.randn(3, 4)).layers) == 1
    )  # no mode left behind to double-record


# ----------------------------------------------------------------------------- real transformers


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("family", TRANSFORMER_FAMILIES)
def test_transformers_capture_every_gemm_kernel_the_profiler_counts(
    torch, capture, family, attention
):
    model, sample = tiny_transformer(torch, family, attention)
    counted = count_gemm_kernels(torch, model, sample)
    trace = capture(model, sample)
    assert len(trace.layers) == sum(counted.values()), counted
    assert "skipped" not in trace.source
    # per family: every projection and MLP layer, two attention matmuls per layer, the head
    expected = {"gpt2": 13, "bert": 17, "llama": 19, "vit": 18}[family]
    assert len(trace.layers) == expected
    names = [layer.name for layer in trace.layers]
    assert len(set(names)) == len(names)
    for layer in trace.layers:
        reference = gemm_reference(layer)
        np.testing.assert_allclose(
            layer.output, reference, rtol=0, atol=1e-5 * max(np.abs(reference).max(), 1)
        )


def test_transformer_layer_names_and_shapes(torch, capture):
    model, sample = tiny_transformer(torch, "gpt2")
    by_name = {layer.name: layer for layer in capture(model, sample).layers}
    c_attn = by_name["model.transformer.h.0.attn.c_attn"]  # HF Conv1D: addmm with a (K, N) weight
    assert c_attn.op == "matmul" and c_attn.weight.shape == (32, 96) and c_attn.bias.shape == (96,)
    assert np.array_equal(
        c_attn.weight, model.model.transformer.h[0].attn.c_attn.weight.detach().numpy()
    )
    qk, pv = (
        by_name["model.transformer.h.0.attn.sdpa.qk"],
        by_name["model.transformer.h.0.attn.sdpa.pv"],
    )
    assert qk.input.shape == (2, 4, 8, 8) and qk.weight.shape == (
        2,
        4,
        8,
        8,
    )  # (batch, heads, ...) kept
    assert qk.source["is_causal"] or qk.source["mask"] is not None
    probabilities = pv.input
    np.testing.assert_allclose(probabilities.sum(-1), 1, rtol=1e-6)
    assert np.all(np.triu(probabilities[0, 0], 1) == 0)  # causal
    assert by_name["model.lm_head"].op == "linear"
    eager = {
        layer.name: layer for layer in capture(*tiny_transformer(torch, "bert", "eager")).layers
    }
    scores = eager[
        "model.encoder.layer.0.attention.self.matmul"
    ]  # torch.matmul with its batch dims
    assert scores.input.shape == (2, 4, 8, 8) and scores.weight.shape == (2, 4, 8, 8)


def test_sdpa_decomposition_matches_torch_sdpa(torch, capture):
    F = torch.nn.functional

    class Attention(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask
            ) + F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)

    torch.manual_seed(3)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 4)
    mask = torch.rand(5, 6) > 0.3
    mask[:, 0] = True
    trace = capture(Attention(), (q, k, v, mask))
    assert [layer.name for layer in trace.layers] == [
        "sdpa.qk",
        "sdpa.pv",
        "sdpa#2.qk",
        "sdpa#2.pv",
    ]
    for pv, kwargs in (
        (trace.layers[1], {"attn_mask": mask}),
        (trace.layers[3], {"is_causal": True, "scale": 0.3}),
    ):
        np.testing.assert_allclose(
            pv.output,
            F.scaled_dot_product_attention(q, k, v, **kwargs).numpy(),
            rtol=1e-5,
            atol=1e-6,
        )
    np.testing.assert_allclose(
        trace.layers[0].output, (q @ k.transpose(-2, -1)).numpy(), rtol=1e-6, atol=1e-6
    )
    assert (
        trace.layers[2].source["softmax_scale"] == 0.3
        and trace.layers[0].source["mask"] == "boolean"
    )


def test_the_model_continues_with_its_own_attention_result(torch, capture):
    """The recorded decomposition rounds apart from the fused kernel (in bf16, visibly): the
    layer after attention sees, during the capture, the input the model computes without it."""
    F = torch.nn.functional
    torch.manual_seed(5)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)

        def forward(self, x):
            q, k, v = self.qkv(x).view(2, 7, 3, 4, 8).permute(2, 0, 3, 1, 4)
            return self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))

    model = Block().to(torch.bfloat16).eval()
    x = (torch.randn(2, 7, 32) * 4).to(torch.bfloat16)
    with torch.no_grad():
        want = model(x)
    trace = capture(model, x)
    out = {layer.name: layer for layer in trace.layers}["out"]
    assert out.output.dtype == np.float32 and np.array_equal(out.output, want.float().numpy())
    pv = {layer.name: layer for layer in trace.layers}["sdpa.pv"]  # the decomposition's own
    assert not np.array_equal(pv.output.transpose(0, 2, 1, 3).reshape(2, 7, 32), out.input)


@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention_projections_and_matmuls(torch, capture, need_weights):
    torch.manual_seed(4)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x, memory):
            return (
                self.attn(x, x, x, need_weights=need_weights)[0] + self.attn(x, memory, memory)[0]
            )

    model = Block().eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    torch.backends.mha.set_fastpath_enabled(
        False
    )  # count the unfused kernels, as capture runs them
    try:
        counted = count_gemm_kernels(torch, lambda a: model(a, memory), x)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    trace = capture(model, (x, memory))
    assert len(trace.layers) == sum(counted.values()) == 9
    names = [layer.name for layer in trace.layers]
    middle = ["attn.bmm", "attn.bmm#2"] if need_weights else ["attn.sdpa.qk", "attn.sdpa.pv"]
    assert names[:4] == ["attn.in_proj"] + middle + ["attn.out_proj"]
    # cross-attention projects q, then k and v together, with slices of in_proj_weight
    assert names[4:6] == ["attn.in_proj#2", "attn.in_proj#3"]
    assert [layer.weight.shape for layer in trace.layers[:6:4]] == [(48, 16), (16, 16)]
    assert trace.layers[5].weight.shape == (32, 16)
    with torch.no_grad():
        expected = model.attn(x, x, x, need_weights=need_weights)[0].numpy()
    # MultiheadAttention works sequence-first: the out projection's rows are (position, batch)
    out_proj = trace.layers[3].output.reshape(5, 2, 16).transpose(1, 0, 2)
    np.testing.assert_allclose(out_proj, expected, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- other ops


def test_matmul_family_ops(torch, capture):
    class Ops(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(4, 6))

        def forward(self, x, y, v):
            a = torch.einsum("bij,bjk->bik", x, y)  # bmm inside einsum
            b = torch.baddbmm(a, x, y, beta=0.5, alpha=2.0)
            c = torch.addmm(torch.zeros(4), x[0], self.weight.t(), alpha=3.0)  # linear with alpha
            d = x[0] @ v  # 1-d operand
            e = torch.mv(x[1], v) + torch.dot(v, v)
            return b.sum() + c.sum() + d.sum() + e.sum() + (x @ y).sum()

    torch.manual_seed(5)
    x, y, v = torch.randn(2, 3, 6), torch.randn(2, 6, 5), torch.randn(6)
    model = Ops()
    trace = capture(model, (x, y, v))
    counted = count_gemm_kernels(torch, lambda a: model(a, y, v), x)
    assert len(trace.layers) == sum(counted.values()) == 7
    by_name = {layer.name: layer for layer in trace.layers}
    assert set(by_name) == {"bmm", "baddbmm", "weight", "matmul", "mv", "dot", "matmul#2"}
    assert by_name["baddbmm"].attrs == {"alpha": 2.0, "beta": 0.5} and by_name[
        "baddbmm"
    ].bias.shape == (2, 3, 5)
    assert by_name["weight"].op == "linear" and by_name["weight"].attrs == {"alpha": 3.0}
    assert (
        by_name["matmul"].weight.shape == (6, 1)
        and by_name["matmul"].source["promoted"] == "vector"
    )
    assert by_name["dot"].input.shape == (1, 6) and by_name["dot"].output.shape == (1, 1)
    assert by_name["matmul#2"].input.shape == (2, 3, 6) and by_name["matmul#2"].weight.shape == (
        2,
        6,
        5,
    )
    for layer in trace.layers:
        np.testing.assert_allclose(layer.output, gemm_reference(layer), rtol=1e-5, atol=1e-5)


def test_conv1d_and_transposed_convolutions(torch, capture):
    nn = torch.nn
    torch.manual_seed(6)

    class Convs(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv1d(4, 6, 3, padding=1, groups=2)
            self.t1 = nn.ConvTranspose1d(6, 4, 3, stride=2)
            self.t2 = nn.ConvTranspose2d(
                4,
                6,
                (3, 2),
                stride=(2, 3),
                padding=(1, 0),
                output_padding=(1, 2),
                dilation=(1, 2),
                groups=2,
            )
            self.c2 = nn.Conv2d(6, 6, 3, groups=6)

        def forward(self, x):
            y = self.t1(self.c1(x))  # (2, 4, 19)
            return self.c2(self.t2(y[..., :18].reshape(2, 4, 3, 6)))

    model = Convs().eval()
    x = torch.randn(2, 4, 9)
    trace = capture(model, x)
    assert [layer.op for layer in trace.layers] == [
        "conv2d",
        "conv_transpose2d",
        "conv_transpose2d",
        "conv2d",
    ]
    assert trace.layers[0].source["conv1d_as_2d"] and trace.layers[0].input.shape == (2, 4, 1, 9)
    transposed = trace.layers[2]
    assert transposed.attrs == {
        "stride": [2, 3],
        "padding": [[1, 1], [0, 0]],
        "dilation": [1, 2],
        "groups": 2,
        "output_padding": [1, 2],
    }
    for layer in trace.layers:
        direct = conv2d_direct if layer.op == "conv2d" else conv_transpose2d_direct
        reference = direct(layer.input, layer.weight, layer.bias, layer.conv_geometry())
        np.testing.assert_allclose(layer.output, reference, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(gemm_reference(layer), reference, rtol=1e-12, atol=1e-12)


def test_unsupported_matmul_like_ops_are_listed_and_warned_about(torch, capture):
    nn = torch.nn
    torch.manual_seed(7)

    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.bilinear = nn.Bilinear(3, 4, 2)
            self.conv3d = nn.Conv3d(1, 2, 2)
            self.fc = nn.Linear(3, 2)

        def forward(self, x, y, volume):
            return self.bilinear(x, y).sum() + self.conv3d(volume).sum() + self.fc(x).sum()

    with pytest.warns(CaptureWarning, match="2 matmul-like op"):
        trace = capture(Mixed(), (torch.randn(2, 3), torch.randn(2, 4), torch.randn(1, 1, 3, 3, 3)))
    assert [layer.name for layer in trace.layers] == ["fc"]
    skipped = trace.source["skipped"]
    assert [(s["name"], s["op"]) for s in skipped] == [
        ("bilinear._trilinear", "aten._trilinear"),
        ("conv3d.convolution", "aten.convolution"),
    ]
    assert "3-d convolution" in skipped[1]["reason"]


# ----------------------------------------------------------------------------- what capture refuses


def subclass_linear(torch):
    """A Linear whose weight is a tensor subclass with its own dispatch (as torchao's are)."""
    from torch.testing._internal.two_tensor import TwoTensor

    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    weight = TwoTensor(torch.randn(2, 4), torch.randn(2, 4))
    model[0].weight = torch.nn.Parameter(weight, requires_grad=False)
    return model


def test_what_the_interception_cannot_see_through_is_refused_in_one_line(torch, capture):
    from torch.utils._python_dispatch import TorchDispatchMode

    x = torch.randn(3, 4)
    with pytest.raises(
        MxsimError,
        match=r"^capture_torch: 0.weight of module '0' \(Linear\) is a TwoTensor, a tensor "
        r"subclass, which is not supported",
    ):
        capture(subclass_linear(torch), x)
    compiled = torch.nn.Sequential(torch.compile(torch.nn.Linear(4, 2)))
    with pytest.raises(
        MxsimError, match=r"^capture_torch: module '0' is compiled by torch.compile"
    ):
        capture(compiled, x)

    class Other(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with (
        Other(),
        pytest.raises(
            MxsimError, match=r"^capture_torch: a torch mode is already active \(Other\)"
        ),
    ):
        capture(torch.nn.Linear(4, 2), x)

    class Boxed:  # a library's quantized-tensor object (as Brevitas' QuantTensor): not a torch.Tensor
        def __init__(self, value):
            self.value = value

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return func(*[a.value if isinstance(a, Boxed) else a for a in args], **(kwargs or {}))

    class BoxedLinear(torch.nn.Linear):
        def forward(self, x):
            return torch.nn.functional.linear(x, Boxed(self.weight), self.bias)

    with pytest.raises(
        MxsimError,
        match=r"^capture_torch: module '0' \(BoxedLinear\) calls linear with a Boxed, "
        r"which is not supported",
    ):
        capture(torch.nn.Sequential(BoxedLinear(4, 2)), x)

    class Failing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(4, 2)

        def forward(self, x):
            raise NotImplementedError("no kernel for this")

    with pytest.raises(
        MxsimError, match=r"^capture_torch: module 'Failing' raised NotImplementedError \(no kernel"
    ):
        capture(Failing(), x)
