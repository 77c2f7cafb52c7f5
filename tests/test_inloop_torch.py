"""torch_unit: every matmul of a PyTorch model computed by an mxsim unit."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from mxsim import fake_quantize, matmul, quantize_mx as quantize
from mxsim.datapath import load_hwconfig
from mxsim.errors import MxsimError
from mxsim.formats import get_format
from mxsim.inloop import torch_unit
from mxsim.quantize import quantize_nvfp4
from mxsim.quantize.nvfp4 import tensor_scale_from_amax

from conftest import REPO, without_compile_notice

OCP = load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml")
H100 = load_hwconfig(REPO / "hwconfigs" / "h100-fp8.yaml")
NVFP4 = load_hwconfig(REPO / "hwconfigs" / "b200-nvfp4.yaml")


def _by_hand(hw, x, w, bias, fmt):
    """x @ w.T + bias with the unit computing the product: operands quantized by mxsim.quantize
    (OCP profile, unit block size, along K), the bias added in float64, rounded to float32."""
    block = hw.sections[("inputs", "block_size")]
    qa = quantize(x.astype(np.float64), fmt, axis=1, block_size=block, profile="ocp")
    qb = quantize(w.T.astype(np.float64), fmt, axis=0, block_size=block, profile="ocp")
    return (matmul(hw, qa, qb).values + bias.astype(np.float64)).astype(np.float32)


def test_linear_layers_bit_for_bit(torch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
    ).eval()
    x = torch.randn(6, 64)
    with torch_unit(model, OCP, a_format="fp8_e4m3") as unit:
        got = model(x)
    assert unit.computed_layers == ["0", "2"]
    first, second = model[0], model[2]
    hidden = _by_hand(
        OCP, x.numpy(), first.weight.detach().numpy(), first.bias.detach().numpy(), "fp8_e4m3"
    )
    expected = _by_hand(
        OCP,
        np.maximum(hidden, 0),
        second.weight.detach().numpy(),
        second.bias.detach().numpy(),
        "fp8_e4m3",
    )
    assert got.dtype == torch.float32
    assert np.array_equal(got.numpy().view(np.uint32), expected.view(np.uint32))
    with torch.no_grad():  # and it differs from float: the unit really computed it
        assert not np.array_equal(got.numpy(), model(x).numpy())


def test_batched_matmul_and_attention_go_through_the_unit(torch):
    torch.manual_seed(1)
    attention = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    q = torch.randn(2, 8, 32)
    with torch_unit(attention, OCP, a_format="fp8_e4m3") as unit:
        got = attention(q, q, q, need_weights=False)[0]
    names = unit.computed_layers
    assert "in_proj" in names and "out_proj" in names and any(n.endswith(".qk") for n in names)
    with torch.no_grad():
        reference = attention(q, q, q, need_weights=False)[0]
    error = float((got - reference).abs().max())
    assert 0 < error < 0.2 * float(reference.abs().max())


def test_bmm_equals_matmul_by_hand(torch):
    rng = np.random.default_rng(2)
    a, b = (
        rng.standard_normal((3, 4, 64)).astype(np.float32),
        rng.standard_normal((3, 64, 5)).astype(np.float32),
    )
    with torch_unit(None, OCP, a_format="fp8_e5m2"):
        got = torch.bmm(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    for g in range(3):
        expected = matmul(OCP, a[g], b[g], a_format="fp8_e5m2", b_format="fp8_e5m2").values.astype(
            np.float32
        )
        assert np.array_equal(got[g], expected)


def test_broadcast_batches_go_through_the_unit_and_unbroadcastable_ones_to_torch(torch):
    """A matmul whose batch dimensions broadcast ((2, 1) against (3,)) gives each pair's
    product by hand in the broadcast shape; batches that do not broadcast get torch's own
    error."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 1, 4, 64)).astype(np.float32)
    b = rng.standard_normal((3, 64, 5)).astype(np.float32)
    with torch_unit(None, OCP, a_format="fp8_e5m2"):
        got = torch.matmul(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    assert got.shape == (2, 3, 4, 5)
    for i in range(2):
        for j in range(3):
            expected = matmul(OCP, a[i, 0], b[j], a_format="fp8_e5m2", b_format="fp8_e5m2")
            assert np.array_equal(got[i, j], expected.values.astype(np.float32))
    with torch_unit(None, OCP, a_format="fp8_e5m2"), pytest.raises(RuntimeError):
        torch.matmul(torch.from_numpy(a[:, 0]), torch.from_numpy(b))


def _heads_and_linear(torch, unit, seed: int):
    """(q, k, layer, scores, out): 2 x 3 heads of a 4-d matmul q (5 x 40 each, magnitudes
    2^-4 to 2^3 per head) @ k (40 x 7) and a Linear(40, 6) with a bias on q's first head, both
    in the loop on ``unit`` (two computed layers)."""
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((2, 3, 5, 40)) * np.exp2(rng.integers(-4, 4, (2, 3, 1, 1)))).astype(
        np.float32
    )
    k = rng.standard_normal((2, 3, 40, 7)).astype(np.float32)
    layer = torch.nn.Linear(40, 6)
    with torch_unit(layer, unit) as loop:
        scores = torch.matmul(torch.from_numpy(q), torch.from_numpy(k)).numpy()
        out = layer(torch.from_numpy(q[0, 0])).detach().numpy()
    assert len(loop.computed_layers) == 2
    return q, k, layer, scores, out


@pytest.mark.parametrize("unit", [OCP, H100], ids=lambda u: u.name)
def test_attention_heads_and_biased_linears_bit_for_bit(torch, unit):
    """The heads of a 4-d matmul (one batched call on the unit) and a linear layer with a bias
    (entering as c, scaled by 2^-(Ta+Tb) on a per-tensor unit) give the bits of one
    mxsim.matmul call per head and per layer."""
    per_tensor = unit is H100
    q, k, layer, scores, out = _heads_and_linear(torch, unit, seed=8)
    for g, (a, b) in enumerate(zip(q.reshape(6, 5, 40), k.reshape(6, 40, 7))):
        expected = matmul(unit, a, b, per_tensor_scale=per_tensor).values.astype(np.float32)
        np.testing.assert_array_equal(
            scores.reshape(6, 5, 7)[g].view(np.uint32), expected.view(np.uint32)
        )
    weight, bias = layer.weight.detach().numpy(), layer.bias.detach().numpy()
    c = np.broadcast_to(bias, (5, 6)).astype(np.float32)
    expected = matmul(unit, q[0, 0], weight.T, c=c, per_tensor_scale=per_tensor).values.astype(
        np.float32
    )
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))


def _nvfp4_by_hand(a: np.ndarray, b_rows: np.ndarray):
    """mxsim.matmul of a (M, K) and B given as its rows (N, K), each quantized by the NVFP4
    recipe along K zero-padded to whole blocks of 16, its tensor scale from its amax."""
    pad = ((0, 0), (0, -a.shape[1] % 16))
    qa, qb = (
        quantize_nvfp4(np.pad(x, pad), tensor_scale_from_amax(np.abs(x).max())) for x in (a, b_rows)
    )
    return matmul(NVFP4, qa, qb).values


def test_nvfp4_heads_and_biased_linears_bit_for_bit(torch):
    """On an NVFP4 unit each head of a 4-d matmul is a tensor of its own (its own tensor
    scale); a linear layer's bias is added after the unit's scaled sums, in float64."""
    q, k, layer, scores, out = _heads_and_linear(torch, NVFP4, seed=9)
    for g, (a, b) in enumerate(zip(q.reshape(6, 5, 40), k.reshape(6, 40, 7))):
        expected = _nvfp4_by_hand(a, b.T).astype(np.float32)
        np.testing.assert_array_equal(
            scores.reshape(6, 5, 7)[g].view(np.uint32), expected.view(np.uint32)
        )
    weight, bias = layer.weight.detach().numpy(), layer.bias.detach().numpy()
    expected = (_nvfp4_by_hand(q[0, 0], weight) + bias.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))


def test_per_tensor_scaling_on_a_unit_without_block_scales(torch):
    """h100-style unit: each operand gets one power of two 2^X (X = floor(log2 max) - emax),
    elements x * 2^-X encoded, the product scaled back by 2^(Xa + Xb): operands far below the
    format's range still come out close to the float product."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 64)) * 1e-6).astype(
        np.float32
    )  # below fp8 e4m3's smallest subnormal
    w = (rng.standard_normal((8, 64)) * 50).astype(np.float32)
    layer = torch.nn.Linear(64, 8, bias=False)
    layer.weight.data = torch.from_numpy(w)
    with torch_unit(layer, H100) as unit:
        got = layer(torch.from_numpy(x)).numpy().astype(np.float64)
    assert len(unit.computed_layers) == 1
    info = get_format(H100.a_formats[0])
    ea = int(np.floor(np.log2(np.abs(x).max()))) - info.scale_emax
    eb = int(np.floor(np.log2(np.abs(w).max()))) - info.scale_emax
    a = info.decode(info.encode(x.astype(np.float64) * 2.0**-ea)) * 2.0**ea
    b = info.decode(info.encode(w.astype(np.float64) * 2.0**-eb)) * 2.0**eb
    ideal = a @ b.T
    assert np.max(np.abs(got - ideal)) <= 1e-2 * np.max(np.abs(ideal))
    assert np.max(np.abs(got)) > 0


def test_bad_options(torch):
    with pytest.raises(MxsimError, match="scaling"):
        with torch_unit(None, OCP, scaling="row"):
            pass
    with pytest.raises(MxsimError, match="no block scales"):
        with torch_unit(None, H100, scaling="block"):
            torch.matmul(torch.ones(2, 32), torch.ones(32, 2))
    with pytest.raises(MxsimError, match="nn.Module"):
        with torch_unit("model", OCP):
            pass


def test_a_format_the_unit_cannot_take_is_refused_in_the_loop(torch):
    """The one policy (docs/replay.md): in the loop there is no row to mark, so neither a
    caller's format nor a recorded spec the unit cannot take is substituted."""
    from mxsim.trace import MXQuant

    model = torch.nn.Sequential(torch.nn.Linear(64, 8)).eval()
    x = torch.randn(2, 64)
    with pytest.raises(MxsimError, match="h100-fp8 does not take fp4_e2m1"):
        with torch_unit(model, H100, a_format="fp4_e2m1"):
            model(x)
    spec = MXQuant("fp4_e2m1")
    with pytest.raises(
        MxsimError, match="layer '0' on h100-fp8: the unit cannot take fp4_e2m1 block 32.*strict"
    ):
        with torch_unit(model, H100, quant={"input": spec, "weight": spec}):
            model(x)
    with torch_unit(
        model, OCP, quant={"input": spec, "weight": spec}
    ) as unit:  # a unit that takes it
        model(x)
    assert unit.computed_layers == ["0"]


# --- shapes, dtypes and convolutions a model may bring -----------------------------------------


def test_empty_batches_give_empty_results(torch):
    """Zero rows: nothing to compute; each result has torch's shape and dtype."""
    linear, conv = torch.nn.Linear(4, 3), torch.nn.Conv2d(4, 3, 3)
    attention = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    q = torch.zeros(0, 5, 32)
    with torch_unit(None, OCP, a_format="fp8_e4m3"):
        results = [
            linear(torch.zeros(0, 4)),
            conv(torch.zeros(0, 4, 5, 5)),
            torch.bmm(torch.zeros(0, 2, 4), torch.zeros(0, 4, 3)),
            torch.zeros(0, 4) @ torch.ones(4, 2),
            attention(q, q, q, need_weights=False)[0],
        ]
    shapes = [(0, 3), (0, 3, 3, 3), (0, 2, 3), (0, 2), (0, 5, 32)]
    assert [tuple(r.shape) for r in results] == shapes
    assert all(r.dtype == torch.float32 for r in results)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_zero_width_linear_gives_its_bias(torch):
    """Linear(0, 3): every output is the empty sum (+0) plus the bias."""
    layer = torch.nn.Linear(0, 3)
    with torch.no_grad():
        layer.bias.copy_(torch.tensor([0.5, -1.25, 3.0]))
    with torch_unit(layer, OCP, a_format="fp8_e4m3") as unit:
        got = layer(torch.zeros(2, 0))
    assert len(unit.computed_layers) == 1
    assert np.array_equal(got.numpy(), np.array([[0.5, -1.25, 3.0]] * 2, dtype=np.float32))


def _nearest_even_bf16(value: float, got: float) -> bool:
    """``got`` is ``value`` rounded to the nearest bfloat16, ties to an even code (exact check)."""
    from fractions import Fraction

    bits = int(np.array([got], dtype=np.float32).view(np.uint32)[0])
    neighbours = [
        np.array([b], dtype=np.uint32).view(np.float32)[0] for b in (bits - 0x10000, bits + 0x10000)
    ]
    distance = abs(Fraction(value) - Fraction(float(got)))
    for other in neighbours:
        other_distance = abs(Fraction(value) - Fraction(float(other)))
        if other_distance < distance or (other_distance == distance and (bits >> 16) & 1):
            return False
    return True


def test_results_come_back_in_the_models_dtype(torch):
    """A half, bfloat16 or double model gets its own dtype back: the unit's float64 result
    rounded once (the double model's result is that float64 value itself)."""
    torch.manual_seed(4)
    base = torch.nn.Linear(64, 8)
    with torch.no_grad():  # operands exact in every dtype, so each model multiplies the same values
        base.weight.copy_(torch.randint(-64, 64, base.weight.shape) / 64)
        base.bias.copy_(torch.randint(-64, 64, base.bias.shape) / 64)
    x = torch.randint(-64, 64, (5, 64)) / 64
    results = {}
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        model = torch.nn.Linear(64, 8).to(dtype)
        model.load_state_dict({k: v.to(dtype) for k, v in base.state_dict().items()})
        with torch_unit(model, OCP, a_format="fp8_e4m3"):
            results[dtype] = model(x.to(dtype))
        assert results[dtype].dtype == dtype
    exact = results[torch.float64].numpy()
    assert np.array_equal(results[torch.float32].numpy(), exact.astype(np.float32))
    assert np.array_equal(results[torch.float16].numpy(), exact.astype(np.float16))
    bf16 = results[torch.bfloat16].to(torch.float32).numpy()
    assert all(_nearest_even_bf16(v, g) for v, g in zip(exact.ravel(), bf16.ravel()))
    with torch.no_grad():
        assert not np.array_equal(exact, base.double()(x.double()).numpy())  # the unit computed it


def _fake_quantized(torch, tensor, axis: int):
    """``tensor`` quantized to fp8_e4m3 in blocks of 32 along ``axis`` and back, float64."""
    return torch.from_numpy(
        fake_quantize(tensor.detach().double().numpy(), "fp8_e4m3", axis=axis, block_size=32)
    )


# (module, input shape): channels per group a multiple of the unit's block (32), so that the
# unit's blocks are the model's channel blocks and the float64 convolution of the operands
# quantized along the channels is the unit's result up to its fp32 accumulation.
CONVOLUTIONS = {
    "conv1d": (lambda nn: nn.Conv1d(32, 8, 3, padding=1), (2, 32, 9)),
    "conv1d grouped dilated circular": (
        lambda nn: nn.Conv1d(64, 16, 3, groups=2, dilation=2, padding=2, padding_mode="circular"),
        (1, 64, 11),
    ),
    "conv2d strided dilated": (
        lambda nn: nn.Conv2d(32, 8, 3, stride=2, padding=1, dilation=2),
        (1, 32, 9, 8),
    ),
    "conv2d same reflect grouped": (
        lambda nn: nn.Conv2d(64, 16, 3, groups=2, padding="same", padding_mode="reflect"),
        (1, 64, 6, 5),
    ),
    "conv2d same even kernel": (lambda nn: nn.Conv2d(32, 8, (2, 4), padding="same"), (1, 32, 5, 6)),
    "conv2d replicate": (
        lambda nn: nn.Conv2d(32, 8, 3, padding=2, padding_mode="replicate", bias=False),
        (1, 32, 4, 4),
    ),
    "conv_transpose1d output_padding": (
        lambda nn: nn.ConvTranspose1d(32, 8, 3, stride=2, output_padding=1),
        (2, 32, 5),
    ),
    "conv_transpose2d dilated": (
        lambda nn: nn.ConvTranspose2d(32, 8, 3, stride=2, padding=1, output_padding=1, dilation=2),
        (1, 32, 4, 5),
    ),
    "conv_transpose2d grouped": (
        lambda nn: nn.ConvTranspose2d(64, 16, (3, 2), stride=(2, 3), groups=2),
        (1, 64, 3, 4),
    ),
}


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
@pytest.mark.parametrize("name", list(CONVOLUTIONS))
def test_convolutions_equal_the_quantized_float64_convolution(torch, name):
    factory, shape = CONVOLUTIONS[name]
    torch.manual_seed(5)
    model = factory(torch.nn).eval()
    x = torch.randn(*shape)
    with torch_unit(model, OCP, a_format="fp8_e4m3") as unit:
        got = model(x).double()
    assert len(unit.computed_layers) == 1 and not unit.skipped
    transposed = isinstance(model, (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d))
    reference = model.double()
    with torch.no_grad():
        float_result = reference(x.double())
        weight = reference.weight.detach().clone()
        reference.weight.copy_(_fake_quantized(torch, weight, 0 if transposed else 1))
        expected = reference(_fake_quantized(torch, x, 1))
        reference.weight.copy_(reference.weight.abs())
        if reference.bias is not None:
            reference.bias.zero_()
        bound = reference(
            _fake_quantized(torch, x, 1).abs()
        )  # sum of |products|: the scale of fp32 rounding
    assert got.shape == expected.shape
    assert torch.all((got - expected).abs() <= 1e-6 * bound + 1e-30)
    assert not torch.equal(got, float_result)  # the unit computed it (fp8 is not float)


def test_small_channel_counts_and_transposed_bias(torch):
    """Blocks that straddle filter taps (3 channels) and a transposed convolution's bias:
    computed, close to float."""
    torch.manual_seed(6)
    for model, shape in (
        (torch.nn.ConvTranspose2d(3, 2, 3, stride=2), (1, 3, 4, 4)),
        (torch.nn.Conv2d(8, 8, 3, groups=8), (1, 8, 6, 6)),
    ):
        x = torch.randn(*shape)
        with torch_unit(model, OCP, a_format="fp8_e4m3") as unit:
            got = model(x)
        with torch.no_grad():
            reference = model(x)
        assert len(unit.computed_layers) == 1 and got.shape == reference.shape
        error = float((got - reference).abs().max())
        assert 0 < error < 0.1 * float(reference.abs().max())


def test_three_dimensional_convolutions_are_refused(torch):
    for model, shape in (
        (torch.nn.Conv3d(4, 2, 3), (1, 4, 5, 5, 5)),
        (torch.nn.ConvTranspose3d(4, 2, 3), (1, 4, 3, 3, 3)),
    ):
        with pytest.raises(MxsimError, match=r"aten.convolution.*3-d convolution.*cannot compute"):
            with torch_unit(model, OCP):
                model(torch.randn(*shape))


def test_progress_counts_layers_only_when_asked(torch, capsys, monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    with torch_unit(model, OCP, a_format="fp8_e4m3"):  # stderr is not a terminal here: quiet
        model(torch.randn(3, 8))
    assert without_compile_notice(capsys.readouterr().err) == ""
    monkeypatch.setitem(sys.modules, "tqdm", None)  # without tqdm: a plain counter
    with torch_unit(model, OCP, a_format="fp8_e4m3", progress=True):
        model(torch.randn(3, 8))
    assert "2 layers" in capsys.readouterr().err


# --- weights quantized once per context -------------------------------------------------------


def _two_layers(torch):
    """Two linear layers of one shape (a cache keyed on the shape alone would mix them up)."""
    torch.manual_seed(9)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32)
    ).eval()


def _bits(tensor) -> np.ndarray:
    return tensor.numpy().view(np.uint32)


@pytest.mark.parametrize("unit", [OCP, H100, NVFP4], ids=lambda u: u.name)
def test_weights_are_quantized_once_per_context_with_the_same_bits(
    torch, monkeypatch, counted_quantizations, unit
):
    """Later forwards in a context quantize only the inputs, and give the bits of forwards
    whose weights are quantized anew each time (no kept quantizations)."""
    from mxsim.inloop import UnitInLoop

    model, x = _two_layers(torch), torch.randn(4, 32)
    quantized = counted_quantizations
    with torch_unit(model, unit):
        got = [model(x), model(x), model(3 * x)]
    assert len(quantized) == 4 + 2 + 2
    monkeypatch.setattr(UnitInLoop, "kept_quantizations", lambda self, values: None)
    with torch_unit(model, unit):
        expected = [model(x), model(x), model(3 * x)]
    assert len(quantized) == 8 + 4 * 3
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(_bits(g), _bits(e))


def _shared_input_model(torch):
    """Three projections of one activation, as attention's query, key and value; the third
    reads it after an in-place change (same tensor, new values)."""

    class Projections(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(32, 8) for _ in range(3))

        def forward(self, x):
            x = x.clone()
            q, k = self.q(x), self.k(x)
            x.mul_(3.0)
            return torch.cat([q, k, self.v(x)], dim=-1)

    torch.manual_seed(4)
    return Projections().eval()


@pytest.mark.parametrize("unit", [OCP, H100, NVFP4], ids=lambda u: u.name)
def test_layers_reading_one_activation_quantize_it_once_with_the_same_bits(
    torch, counted_quantizations, unit
):
    """Consecutive layers reading one tensor with the same values share its quantization; a
    change in place between them is seen; the bits are those of each layer computed alone."""
    model, x = _shared_input_model(torch), torch.randn(5, 32)
    with torch_unit(model, unit):
        got = model(x)
    assert len(counted_quantizations) == 3 + 2  # the weights, x once, then 3 * x
    expected = []
    for layer, values in ((model.q, x), (model.k, x), (model.v, 3 * x)):
        with torch_unit(layer, unit):
            expected.append(layer(values))
    np.testing.assert_array_equal(_bits(got), _bits(torch.cat(expected, dim=-1)))


def _load_state(model, torch):
    model.load_state_dict({name: value * 0.5 for name, value in model.state_dict().items()})


def _optimizer_step(model, torch):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.25)
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    optimizer.step()


def _copy_under_no_grad(model, torch):
    with torch.no_grad():
        model[0].weight.copy_(model[0].weight.flip(0))


def _data_copy(model, torch):  # through .data: torch's _version counter does not move
    model[2].weight.data.copy_(-model[2].weight.data)


def _one_element_through_data(model, torch):
    model[0].weight.data[3, 5] = 4 * float(model[0].weight.abs().max())


@pytest.mark.parametrize(
    "change",
    [_load_state, _optimizer_step, _copy_under_no_grad, _data_copy, _one_element_through_data],
    ids=lambda f: f.__name__.strip("_"),
)
@pytest.mark.parametrize("unit", [H100, OCP, NVFP4], ids=lambda u: u.name)
def test_a_weight_changed_in_place_gives_the_new_result(torch, change, unit):
    """A weight changed in place between two forwards of a context: the second forward gives
    the bits of a forward in a new context (kept quantizations and decoded forms dropped)."""
    model, x = _two_layers(torch), torch.randn(4, 32)
    with torch_unit(model, unit):
        before = model(x)
        change(model, torch)
        got = model(x)
    with torch_unit(model, unit):
        expected = model(x)
    np.testing.assert_array_equal(_bits(got), _bits(expected))
    assert not np.array_equal(_bits(got), _bits(before))  # the change mattered


def test_kept_quantizations_end_with_the_context(torch):
    """One entry per parameter, held weakly, holding copies (no view of the weights), and
    nothing left when the context ends."""
    model, x = _two_layers(torch), torch.randn(4, 32)
    with torch_unit(model, H100) as loop:
        model(x)
        kept = dict(loop.weight_quantizations.items())
        assert [id(param) for param in kept] == [id(model[0].weight), id(model[2].weight)]
        for param, views in kept.items():
            ((values, quantizations, decoded),) = views.values()
            assert len(quantizations) == 1 and not np.shares_memory(values, param.detach().numpy())
            assert len(decoded) == 1  # the weight's decoded forms, per quantization
        assert loop.decoded_bytes > 0
        del kept, param, views, values, quantizations, decoded
    assert len(loop.weight_quantizations) == 0


def test_what_the_loop_cannot_see_through_is_refused_in_one_line(torch):
    from test_capture_torch import subclass_linear

    x = torch.randn(3, 4)
    with pytest.raises(
        MxsimError, match=r"^torch_unit: 0.weight of module '0' \(Linear\) is a TwoTensor, a tensor"
    ):
        with torch_unit(subclass_linear(torch), OCP):
            pass
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    with pytest.raises(
        MxsimError, match=r"^torch_unit: module '0' raised RuntimeError \(mat1 and mat2"
    ) as error:
        with torch_unit(model, OCP):
            model(torch.randn(3, 5))
    assert isinstance(error.value.__cause__, RuntimeError)
    with torch_unit(model, OCP) as unit:  # nothing left behind
        model(x)
    assert unit.computed_layers == ["0"]


def test_decoded_weights_stay_within_their_share_of_the_budget(torch, monkeypatch):
    """Once the kept decoded forms exceed their share of the memory budget, further weights
    are decoded per call (nothing kept for them), with the same bits."""
    import mxsim.inloop.torch as loop_module

    model, x = _two_layers(torch), torch.randn(4, 32)
    with torch_unit(model, OCP):
        expected = model(x)
    monkeypatch.setattr(loop_module, "DECODED_SHARE", 0.0)
    with torch_unit(model, OCP) as loop:
        got = model(x)
        kept = [views for _, views in loop.weight_quantizations.items()]
        assert [len(decoded) for views in kept for _, _, decoded in views.values()] == [1, 0]
    np.testing.assert_array_equal(_bits(got), _bits(expected))
