"""run_onnx_on_unit: an ONNX graph with its MatMul/Gemm/Conv nodes computed by a unit."""

from __future__ import annotations

import numpy as np
import pytest

from mxsim import matmul
from mxsim.datapath import load_hwconfig
from mxsim.inloop import run_onnx_on_unit

from conftest import REPO, f32, make_onnx_model

OCP = load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml")


def test_exported_mlp_equals_matmul_by_hand(onnx, torch, tmp_path):
    """A torch MLP exported to ONNX (MatMul/Gemm + Relu): each layer = mxsim.matmul of the
    previous value and the weight, bias added in float64, rounded to float32."""
    model, x, path = _exported_mlp(torch, tmp_path, seed=0)
    got = run_onnx_on_unit(path, {"x": x}, OCP, a_format="fp8_e4m3")["y"]
    assert np.array_equal(got, _mlp_by_hand(model, x, "fp8_e4m3"))


def _exported_mlp(torch, tmp_path, seed: int):
    """(model, input, path): a torch MLP (Linear 64 -> 32, ReLU, Linear 32 -> 8) exported to
    ONNX, and a (5, 64) float32 input."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)
    ).eval()
    x = torch.randn(5, 64)
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(model, (x,), str(path), input_names=["x"], output_names=["y"], dynamo=False)
    return model, x.numpy(), path


def _mlp_by_hand(model, x: np.ndarray, fmt: str, gemm=None) -> np.ndarray:
    """Linear, ReLU, Linear: each layer ``gemm(value, weight)`` (float64 values; default:
    mxsim.matmul of the value and W^T on OCP in ``fmt``), bias added in float64, rounded to
    float32."""
    if gemm is None:
        gemm = lambda v, w: matmul(OCP, v, w.T, a_format=fmt, b_format=fmt).values  # noqa: E731
    value = x
    for index in (0, 2):
        w, b = model[index].weight.detach().numpy(), model[index].bias.detach().numpy()
        value = (gemm(value, w) + b.astype(np.float64)).astype(np.float32)
        if index == 0:
            value = np.maximum(value, 0)
    return value


def test_a_files_constant_weights_are_quantized_on_its_first_run_only(
    onnx, torch, tmp_path, counted_quantizations
):
    """The weights (initializers) of a file are quantized on its first run and kept with its
    graph: a later run quantizes only the inputs, with the bits of a first run; other formats
    get their own quantizations."""
    torch.manual_seed(10)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32)
    ).eval()
    x = torch.randn(5, 32).numpy()
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(
        model,
        (torch.from_numpy(x),),
        str(path),
        input_names=["x"],
        output_names=["y"],
        dynamo=False,
    )
    for fmt, inputs, quantized in (("fp8_e4m3", x, 4), ("fp8_e4m3", 3 * x, 6), ("fp8_e5m2", x, 10)):
        got = run_onnx_on_unit(path, {"x": inputs}, OCP, a_format=fmt)["y"]
        assert (
            np.array_equal(got, _mlp_by_hand(model, inputs, fmt))
            and len(counted_quantizations) == quantized
        )


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
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)
    ).eval()
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(
        model,
        (torch.randn(2, 64),),
        str(path),
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
        dynamo=False,
    )
    got = run_onnx_on_unit(
        path, {"x": np.zeros((0, 64), dtype=np.float32)}, OCP, a_format="fp8_e4m3"
    )["y"]
    assert got.shape == (0, 4) and got.dtype == np.float32


def test_matmul_output_shapes_follow_numpy(onnx):
    """MatMul/Gemm nodes are not run for their shape: the shape numpy's matmul gives (1-d
    operands promoted and dropped, batch dims broadcast), None where numpy refuses."""
    from mxsim.inloop.onnx import _output_template

    matmul = onnx.helper.make_node("MatMul", ["a", "b"], ["y"])
    cases = [
        ((4, 8), (8, 3)),
        ((8,), (8, 3)),
        ((4, 8), (8,)),
        ((8,), (8,)),
        ((2, 1, 4, 8), (3, 8, 5)),
        ((5, 4, 8), (8, 2)),
        ((0, 4, 8), (8, 2)),
        ((4, 0), (0, 3)),
        ((2, 4, 8), (3, 8, 5)),
        ((4, 8), (7, 3)),
    ]
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
    assert _output_template(
        gemm, {"transA": 1, "transB": 1}, np.ones((8, 4), np.float16), np.ones((3, 8), np.float16)
    ).shape == (4, 3)


def _staged_model(onnx, w1, w2):
    """y = relu(x @ (w1 @ w2)) @ its transpose, per batch: a MatMul of two weights (computed
    before any stage), one of batched operands, and onnxruntime stages between them."""
    h = onnx.helper
    nodes = [
        h.make_node("MatMul", ["w1", "w2"], ["w"], name="weights"),
        h.make_node("MatMul", ["x", "w"], ["h"], name="project"),
        h.make_node("Relu", ["h"], ["p"]),
        h.make_node("Transpose", ["p"], ["pt"], perm=[0, 2, 1]),
        h.make_node("MatMul", ["p", "pt"], ["y"], name="scores"),
    ]
    return make_onnx_model(onnx, nodes, [("x", [2, 4, 16])], ["y"], [("w1", w1), ("w2", w2)])


def _staged_by_hand(x, w1, w2, fmt):
    def unit(a, b):
        return matmul(OCP, a, b, a_format=fmt, b_format=fmt).values.astype(np.float32)

    w = unit(w1, w2)
    p = [np.maximum(unit(rows, w), 0) for rows in x]
    return np.stack([unit(rows, rows.T) for rows in p])


def test_a_model_file_runs_again_on_its_kept_sessions(onnx, tmp_path, monkeypatch):
    """The second run of a file makes no onnxruntime session and computes its own unit's
    values (the weights' product too: it is not kept from the first run); a ModelProto, a
    changed file, a missing or broken file are read anew."""
    from mxsim.capture.onnx_graph import Graph
    from mxsim.errors import MxsimError

    w1, w2, x = f32(16, 16), f32(16, 8), f32(2, 4, 16)
    model = _staged_model(onnx, w1, w2)
    path = tmp_path / "staged.onnx"
    onnx.save(model, str(path))
    made = []
    session = Graph.session
    monkeypatch.setattr(
        Graph, "session", lambda g, sub_model: made.append(1) or session(g, sub_model)
    )
    first = run_onnx_on_unit(path, {"x": x}, OCP, a_format="fp8_e4m3")["y"]
    assert np.array_equal(first, _staged_by_hand(x, w1, w2, "fp8_e4m3")) and len(made) == 1
    again = run_onnx_on_unit(path, {"x": x}, OCP, a_format="fp8_e5m2")["y"]
    assert np.array_equal(again, _staged_by_hand(x, w1, w2, "fp8_e5m2")) and len(made) == 1
    assert np.array_equal(run_onnx_on_unit(model, {"x": x}, OCP, a_format="fp8_e5m2")["y"], again)
    assert len(made) == 2  # Relu and Transpose: one stage
    changed = tmp_path / "changed.onnx"
    onnx.save(_staged_model(onnx, w1, -w2), str(changed))
    changed.replace(path)
    assert np.array_equal(
        run_onnx_on_unit(path, {"x": x}, OCP, a_format="fp8_e5m2")["y"],
        _staged_by_hand(x, w1, -w2, "fp8_e5m2"),
    )
    with pytest.raises(MxsimError, match="no such model file"):
        run_onnx_on_unit(tmp_path / "absent.onnx", {"x": x}, OCP)
    (tmp_path / "junk.onnx").write_bytes(b"\x07not a protobuf")
    with pytest.raises(MxsimError, match="not a readable ONNX model"):
        run_onnx_on_unit(tmp_path / "junk.onnx", {"x": x}, OCP)


def test_one_constant_weight_of_two_nodes_is_kept_per_node(onnx, tmp_path):
    """A square initializer W used by two Gemm nodes, x @ W and x @ W^T (transB; the same layer
    op, attributes and shapes): each node keeps its own quantization of its own view."""
    w, x = f32(32, 32), f32(4, 32)
    nodes = [
        onnx.helper.make_node("Gemm", ["x", "w"], ["y"]),
        onnx.helper.make_node("Gemm", ["x", "w"], ["z"], transB=1),
    ]
    path = tmp_path / "shared.onnx"
    onnx.save(make_onnx_model(onnx, nodes, [("x", [4, 32])], ["y", "z"], [("w", w)]), str(path))
    expected = [
        matmul(OCP, x, b, a_format="fp8_e4m3", b_format="fp8_e4m3").values.astype(np.float32)
        for b in (w, w.T)
    ]
    for _ in range(2):
        got = run_onnx_on_unit(path, {"x": x}, OCP, a_format="fp8_e4m3")
        assert np.array_equal(got["y"], expected[0]) and np.array_equal(got["z"], expected[1])


def test_exported_mlp_on_an_nvfp4_unit_equals_nvfp4_by_hand(onnx, torch, tmp_path):
    """The same MLP on b200-nvfp4: each operand quantized by the two-level NVFP4 recipe (its
    tensor scale from its amax), mxsim.matmul of the two tensors (its values times both tensor
    scales), the bias added in float64, rounded to float32."""
    from mxsim.quantize import quantize_nvfp4
    from mxsim.quantize.nvfp4 import tensor_scale_from_amax

    nvfp4 = load_hwconfig(REPO / "hwconfigs" / "b200-nvfp4.yaml")
    model, x, path = _exported_mlp(torch, tmp_path, seed=1)
    got = run_onnx_on_unit(path, {"x": x}, nvfp4)["y"]

    def gemm(value, w):
        qa, qb = (quantize_nvfp4(v, tensor_scale_from_amax(np.abs(v).max())) for v in (value, w))
        return matmul(nvfp4, qa, qb).values

    value = _mlp_by_hand(model, x, "fp4_e2m1", gemm)
    assert np.array_equal(got.view(np.uint32), value.view(np.uint32))
