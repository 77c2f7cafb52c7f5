"""run_onnx_on_unit: an ONNX graph with its MatMul/Gemm/Conv nodes computed by a unit."""

from __future__ import annotations

import numpy as np

from mxsim import matmul
from mxsim.datapath import load_hwconfig
from mxsim.inloop import run_onnx_on_unit

from conftest import REPO

OCP = load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml")


def test_exported_mlp_equals_matmul_by_hand(onnx, torch, tmp_path):
    """A torch MLP exported to ONNX (MatMul/Gemm + Relu): each layer = mxsim.matmul of the
    previous value and the weight, bias added in float64, rounded to float32."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
    x = torch.randn(5, 64)
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(model, (x,), str(path), input_names=["x"], output_names=["y"], dynamo=False)
    got = run_onnx_on_unit(path, {"x": x.numpy()}, OCP, a_format="fp8_e4m3")["y"]
    value = x.numpy()
    for index in (0, 2):
        w, b = model[index].weight.detach().numpy(), model[index].bias.detach().numpy()
        value = (matmul(OCP, value, w.T, a_format="fp8_e4m3", b_format="fp8_e4m3").values
                 + b.astype(np.float64)).astype(np.float32)
        if index == 0:
            value = np.maximum(value, 0)
    assert np.array_equal(got, value)


def test_conv_goes_through_the_unit(onnx, torch, tmp_path):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(32, 8, 3, padding=1), torch.nn.ReLU()).eval()
    x = torch.randn(1, 32, 6, 6)
    path = tmp_path / "conv.onnx"
    torch.onnx.export(model, (x,), str(path), input_names=["x"], output_names=["y"], dynamo=False)
    got = run_onnx_on_unit(path, {"x": x.numpy()}, OCP, a_format="fp8_e4m3")["y"]
    with torch.no_grad():
        reference = model(x).numpy()
    assert got.shape == reference.shape and got.dtype == np.float32
    error = np.abs(got - reference).max()
    assert 0 < error < 0.1 * np.abs(reference).max()


def test_empty_batch_gives_an_empty_result(onnx, torch, tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(model, (torch.randn(2, 64),), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, dynamo=False)
    got = run_onnx_on_unit(path, {"x": np.zeros((0, 64), dtype=np.float32)}, OCP, a_format="fp8_e4m3")["y"]
    assert got.shape == (0, 4) and got.dtype == np.float32


def test_matmul_output_shapes_follow_numpy(onnx):
    """MatMul/Gemm nodes are not run for their shape: the shape numpy's matmul gives (1-d
    operands promoted and dropped, batch dims broadcast), None where numpy refuses."""
    from mxsim.inloop.onnx import _output_template

    matmul = onnx.helper.make_node("MatMul", ["a", "b"], ["y"])
    cases = [((4, 8), (8, 3)), ((8,), (8, 3)), ((4, 8), (8,)), ((8,), (8,)), ((2, 1, 4, 8), (3, 8, 5)),
             ((5, 4, 8), (8, 2)), ((0, 4, 8), (8, 2)), ((4, 0), (0, 3)), ((2, 4, 8), (3, 8, 5)), ((4, 8), (7, 3))]
    for a, b in cases:
        x, w = np.ones(a, np.float32), np.ones(b, np.float32)
        template = _output_template(matmul, {}, x, w)
        try:
            expected = np.matmul(x, w)
        except ValueError:
            assert template is None, (a, b)
            continue
        assert template.shape == expected.shape and template.dtype == expected.dtype, (a, b)
    gemm = onnx.helper.make_node("Gemm", ["a", "b"], ["y"], transA=1, transB=1)
    assert _output_template(gemm, {"transA": 1, "transB": 1}, np.ones((8, 4), np.float16),
                            np.ones((3, 8), np.float16)).shape == (4, 3)
