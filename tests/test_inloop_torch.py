"""torch_unit: every matmul of a PyTorch model computed by an mxsim unit."""

from __future__ import annotations

import numpy as np
import pytest

from mxsim import matmul, quantize_mx as quantize
from mxsim.datapath import load_hwconfig
from mxsim.errors import MxsimError
from mxsim.formats import get_format
from mxsim.inloop import torch_unit

from conftest import REPO

OCP = load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml")
H100 = load_hwconfig(REPO / "hwconfigs" / "h100-fp8.yaml")


def _by_hand(hw, x, w, bias, fmt):
    """x @ w.T + bias with the unit computing the product: operands quantized by mxsim.quantize
    (OCP profile, unit block size, along K), the bias added in float64, rounded to float32."""
    block = hw.sections[("inputs", "block_size")]
    qa = quantize(x.astype(np.float64), fmt, axis=1, block_size=block, profile="ocp")
    qb = quantize(w.T.astype(np.float64), fmt, axis=0, block_size=block, profile="ocp")
    return (matmul(hw, qa, qb).values + bias.astype(np.float64)).astype(np.float32)


def test_linear_layers_bit_for_bit(torch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)).eval()
    x = torch.randn(6, 64)
    with torch_unit(model, OCP, a_format="fp8_e4m3") as unit:
        got = model(x)
    assert unit.computed_layers == ["0", "2"]
    first, second = model[0], model[2]
    hidden = _by_hand(OCP, x.numpy(), first.weight.detach().numpy(), first.bias.detach().numpy(), "fp8_e4m3")
    expected = _by_hand(OCP, np.maximum(hidden, 0), second.weight.detach().numpy(), second.bias.detach().numpy(),
                        "fp8_e4m3")
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
    a, b = rng.standard_normal((3, 4, 64)).astype(np.float32), rng.standard_normal((3, 64, 5)).astype(np.float32)
    with torch_unit(None, OCP, a_format="fp8_e5m2"):
        got = torch.bmm(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    for g in range(3):
        expected = matmul(OCP, a[g], b[g], a_format="fp8_e5m2", b_format="fp8_e5m2").values.astype(np.float32)
        assert np.array_equal(got[g], expected)


def test_per_tensor_scaling_on_a_unit_without_block_scales(torch):
    """h100-style unit: each operand gets one power of two 2^X (X = floor(log2 max) - emax),
    elements x * 2^-X encoded, the product scaled back by 2^(Xa + Xb): operands far below the
    format's range still come out close to the float product."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 64)) * 1e-6).astype(np.float32)  # below fp8 e4m3's smallest subnormal
    w = (rng.standard_normal((8, 64)) * 50).astype(np.float32)
    layer = torch.nn.Linear(64, 8, bias=False)
    layer.weight.data = torch.from_numpy(w)
    with torch_unit(layer, H100) as unit:
        got = layer(torch.from_numpy(x)).numpy().astype(np.float64)
    assert len(unit.computed_layers) == 1
    info = get_format(H100.a_formats[0])
    ea = int(np.floor(np.log2(np.abs(x).max()))) - info.scale_emax
    eb = int(np.floor(np.log2(np.abs(w).max()))) - info.scale_emax
    a = info.decode(info.encode(x.astype(np.float64) * 2.0 ** -ea)) * 2.0 ** ea
    b = info.decode(info.encode(w.astype(np.float64) * 2.0 ** -eb)) * 2.0 ** eb
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
    with pytest.raises(MxsimError, match="layer '0' on h100-fp8: the unit cannot take fp4_e2m1 block 32.*strict"):
        with torch_unit(model, H100, quant={"input": spec, "weight": spec}):
            model(x)
    with torch_unit(model, OCP, quant={"input": spec, "weight": spec}) as unit:  # a unit that takes it
        model(x)
    assert unit.computed_layers == ["0"]
