"""mxsim.capture.onnx_graph: the staged executor (subgraphs, custom nodes), model files and input checks, through capture_onnx."""

from __future__ import annotations

import numpy as np
import pytest

from mxsim import fake_quantize
from mxsim.errors import MxsimError

from conftest import ONNX_IR_VERSION, assert_close_to, f32, make_onnx_model


def test_subgraphs_reading_outer_values_run_in_the_right_stage(onnx, ort, capture):
    # If's branches read "x_q" (made by a custom node, stage 1) and "w" (an initializer)
    h = onnx.helper
    then_branch = h.make_graph(
        [h.make_node("MatMul", ["x_q", "w"], ["t"], name="in_branch")],
        "then",
        [],
        [h.make_tensor_value_info("t", onnx.TensorProto.FLOAT, None)],
    )
    else_branch = h.make_graph(
        [h.make_node("Neg", ["x_q"], ["e"])],
        "else",
        [],
        [h.make_tensor_value_info("e", onnx.TensorProto.FLOAT, None)],
    )
    nodes = [
        h.make_node(
            "MXQuantizeDequantize",
            ["x"],
            ["x_q"],
            name="mx",
            domain="com.amd.quark",
            element_dtype="fp8_e5m2",
            axis=1,
            block_size=4,
        ),
        h.make_node("If", ["flag"], ["branch"], then_branch=then_branch, else_branch=else_branch),
        h.make_node("MatMul", ["branch", "w2"], ["y"], name="after"),
    ]
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
        [onnx.ValueInfoProto(name="y")],
        initializer=[
            onnx.numpy_helper.from_array(f32(4, 4), "w"),
            onnx.numpy_helper.from_array(f32(4, 3), "w2"),
            onnx.numpy_helper.from_array(np.array(True), "flag"),
        ],
    )
    model = h.make_model(
        graph,
        opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.amd.quark", 1)],
        ir_version=ONNX_IR_VERSION,
    )
    x = f32(2, 4)
    (after,) = capture(model, {"x": x}).layers  # MatMuls inside subgraphs are not layers
    x_q = fake_quantize(x, "fp8_e5m2", axis=1, block_size=4, profile="quark-onnx").astype(
        np.float32
    )
    w = onnx.numpy_helper.to_array(model.graph.initializer[0])
    assert_close_to(after.input, x_q.astype(np.float64) @ w)


def test_inputs_are_checked_against_the_graph(onnx, capture):
    nodes = [onnx.helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    model, feeds = (
        make_onnx_model(onnx, nodes, [("x", [3, 8])], ["y"], [("w", f32(8, 2))]),
        {"x": f32(3, 8)},
    )
    with pytest.raises(MxsimError, match=r"missing \['x'\], unexpected \['z'\]"):
        capture(model, {"z": feeds["x"]})
    with pytest.raises(MxsimError, match="input 'x' must be float32, got float64"):
        capture(model, {"x": feeds["x"].astype(np.float64)})
    with pytest.raises(MxsimError, match="input 'x' axis 1 must be 8"):
        capture(model, {"x": f32(3, 7)})


def test_missing_or_broken_model_file(capture, tmp_path):
    with pytest.raises(MxsimError, match="no such model file"):
        capture(tmp_path / "absent.onnx", {})
    (tmp_path / "junk.onnx").write_bytes(b"\x07not a protobuf")
    with pytest.raises(MxsimError, match="not a readable ONNX model"):
        capture(tmp_path / "junk.onnx", {})


def test_custom_nodes_on_weights_are_computed_once_per_run(onnx, capture):
    """Two custom nodes in a row on a weight are computed before any stage; the layer's
    weight (the first one's output) counts as constant; running the graph again reuses its plan."""
    from mxsim.capture.onnx_graph import Graph, run_graph
    from mxsim.capture.onnx_quark import QUARK_DOMAINS, quark_node_function

    h = onnx.helper
    nodes = [
        h.make_node(
            "MXQuantizeDequantize",
            ["w"],
            ["w_a"],
            name="first",
            domain="com.amd.quark",
            element_dtype="fp8_e4m3",
            axis=0,
            block_size=4,
        ),
        h.make_node(
            "MXQuantizeDequantize",
            ["w_a"],
            ["w_b"],
            name="second",
            domain="com.amd.quark",
            element_dtype="fp8_e5m2",
            axis=0,
            block_size=4,
        ),
        h.make_node("MatMul", ["x", "w_b"], ["y"], name="mm"),
    ]
    w = f32(8, 3)
    model = make_onnx_model(
        onnx, nodes, [("x", [2, 8])], ["y"], [("w", w)], extra_domains=["com.amd.quark"]
    )
    (layer,) = capture(model, {"x": f32(2, 8)}).layers
    assert layer.source["weight_is_constant"] is True
    w_a = fake_quantize(w, "fp8_e4m3", axis=0, block_size=4, profile="quark-onnx").astype(
        np.float32
    )
    assert np.array_equal(layer.weight, w_a)
    g, hook = Graph(model), quark_node_function("cpu")
    first = run_graph(g, {"x": f32(2, 8)}, {"w_b", "y"}, hook, QUARK_DOMAINS)
    second = run_graph(g, {"x": f32(2, 8)}, {"w_b", "y"}, hook, QUARK_DOMAINS)
    assert len(g._plans) == 1 and np.array_equal(first["w_b"], second["w_b"])
    w_b = fake_quantize(w_a, "fp8_e5m2", axis=0, block_size=4, profile="quark-onnx").astype(
        np.float32
    )
    assert np.array_equal(second["w_b"], w_b)
