"""mxsim.capture.onnx_layers: which ONNX nodes are layers and how their tensors map to the layer layout."""

from __future__ import annotations

import numpy as np
import pytest

from mxsim.errors import MxsimError
from mxsim.replay.lowering import gemm_reference

from conftest import (
    assert_close_to,
    f32,
    layer_node_outputs,
    make_onnx_model,
    onnx_reference_values,
)


def float_model(onnx):
    h = onnx.helper
    conv_w = f32(6, 2, 3, 2)
    const_w = h.make_node(
        "Constant", [], ["w_same"], value=onnx.numpy_helper.from_array(f32(5, 6, 2, 2), "v")
    )
    nodes = [
        h.make_node(
            "Conv",
            ["x", "conv_w", "conv_b"],
            ["c1"],
            name="conv_asym",
            group=2,
            strides=[2, 1],
            pads=[1, 0, 0, 1],
            dilations=[1, 2],
        ),
        h.make_node("Relu", ["c1"], ["r1"]),
        const_w,
        h.make_node(
            "Conv",
            ["r1", "w_same"],
            ["c2"],
            name="conv_same_upper",
            auto_pad="SAME_UPPER",
            strides=[2, 2],
        ),
        h.make_node(
            "Conv", ["r1", "w_same"], ["c3"], name="conv_same_lower", auto_pad="SAME_LOWER"
        ),
        h.make_node("Flatten", ["c2"], ["flat"]),
        h.make_node(
            "Gemm", ["flat", "gemm_w", "gemm_c"], ["g1"], name="gemm_kn", alpha=0.5, beta=2.0
        ),
        h.make_node("Transpose", ["g1"], ["g1t"], perm=[1, 0]),
        h.make_node("Gemm", ["g1t", "gemm2_w"], ["g2"], name="gemm_transposed", transA=1, transB=1),
        h.make_node("MatMul", ["g2", "mm_w"], ["mm"], name="matmul_bias"),
        h.make_node("Add", ["mm", "mm_b"], ["logits"], name="bias_add"),
        h.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1]),
        h.make_node("MatMul", ["y", "yt"], ["scores"], name="batched"),
        h.make_node("MatMul", ["v", "vec_w"], ["vec"], name="vector"),
        h.make_node("Conv", ["seq", "conv1d_w"], ["seq_out"], name="conv1d"),
    ]
    flat = 5 * 2 * 3  # c2: (2, 5, 2, 3)
    inits = [
        ("conv_w", conv_w),
        ("conv_b", f32(6)),
        ("gemm_w", f32(flat, 7)),
        ("gemm_c", f32(7)),
        ("gemm2_w", f32(4, 7)),
        ("mm_w", f32(4, 3)),
        ("mm_b", f32(3)),
        ("vec_w", f32(4, 3)),
        ("conv1d_w", f32(2, 2, 3)),
    ]
    inputs = [("x", [2, 4, 7, 6]), ("y", [2, 3, 4]), ("v", [4]), ("seq", [1, 2, 5])]
    model = make_onnx_model(
        onnx, nodes, inputs, ["logits", "scores", "vec", "seq_out", "c3"], inits
    )
    feeds = {"x": f32(2, 4, 7, 6), "y": f32(2, 3, 4), "v": f32(4), "seq": f32(1, 2, 5)}
    return model, feeds


def test_float_model_layers_and_attributes(onnx, capture):
    model, feeds = float_model(onnx)
    trace = capture(model, feeds, name="float")
    by_name = {layer.name: layer for layer in trace.layers}
    assert list(by_name) == [
        "conv_asym",
        "conv_same_upper",
        "conv_same_lower",
        "gemm_kn",
        "gemm_transposed",
        "matmul_bias",
        "batched",
        "vector",
        "conv1d",
    ]
    assert "skipped" not in trace.source
    # a 1-d MatMul operand is a 1-row matrix; a 1-d convolution is a 2-d one of height 1
    assert by_name["vector"].input.shape == (1, 4) and by_name["vector"].output.shape == (1, 3)
    assert by_name["vector"].source["promoted"] == "row"
    assert by_name["conv1d"].input.shape == (1, 2, 1, 5) and by_name["conv1d"].weight.shape == (
        2,
        2,
        1,
        3,
    )
    assert by_name["conv_asym"].attrs == {
        "stride": [2, 1],
        "padding": [[1, 0], [0, 1]],
        "dilation": [1, 2],
        "groups": 2,
    }
    # input 4x3 (after conv_asym), kernel 2x2: SAME_UPPER stride 2 pads 0 before, 1 after (rows: total 1; cols: 1)
    assert by_name["conv_same_upper"].attrs["padding"] == [[0, 1], [0, 1]]
    assert by_name["conv_same_lower"].attrs["padding"] == [[1, 0], [1, 0]]
    gemm = by_name["gemm_kn"]
    assert gemm.op == "linear" and gemm.attrs == {"alpha": 0.5, "beta": 2.0}
    assert np.array_equal(
        gemm.weight, onnx.numpy_helper.to_array(model.graph.initializer[2]).T
    )  # stored (N, K)
    transposed = by_name["gemm_transposed"]
    assert transposed.input.shape == (2, 7) and transposed.source["transA"] == 1
    fused = by_name["matmul_bias"]
    assert (
        fused.op == "matmul"
        and fused.source["fused_add"] == "bias_add"
        and fused.bias.shape == (3,)
    )
    assert by_name["batched"].source["weight_is_constant"] is False
    assert by_name["conv_same_upper"].source["weight_is_constant"] is True  # from a Constant node


def test_float_model_outputs_equal_onnxruntime_and_the_gemm_view(onnx, ort, capture):
    model, feeds = float_model(onnx)
    trace = capture(model, feeds)
    outputs = {
        "conv_asym": "c1",
        "conv_same_upper": "c2",
        "conv_same_lower": "c3",
        "gemm_kn": "g1",
        "gemm_transposed": "g2",
        "matmul_bias": "logits",
        "batched": "scores",
        "vector": "vec",
        "conv1d": "seq_out",
    }
    reference = onnx_reference_values(onnx, ort, model, list(outputs.values()), feeds)
    for layer in trace.layers:
        expected = reference[outputs[layer.name]]
        assert_close_to(layer.output.reshape(expected.shape), expected)
        assert_close_to(gemm_reference(layer), layer.output)


def test_layer_selection_by_name(onnx, capture):
    model, feeds = float_model(onnx)
    trace = capture(model, feeds, layers=["gemm_kn", "batched"])
    assert [layer.name for layer in trace.layers] == ["gemm_kn", "batched"]
    assert trace.source["selected_layers"] == ["gemm_kn", "batched"]
    with pytest.raises(MxsimError, match=r"no MatMul/Gemm/Conv node named \['nope'\]"):
        capture(model, feeds, layers=["nope"])


def test_conv_transpose_nodes_equal_onnxruntime_and_the_direct_scatter(onnx, ort, capture):
    from mxsim.trace.conv import conv_transpose2d_direct

    h = onnx.helper
    nodes = [
        h.make_node(
            "ConvTranspose",
            ["x", "w", "b"],
            ["up"],
            name="asym",
            strides=[2, 3],
            pads=[1, 0, 0, 2],
            output_padding=[1, 1],
            dilations=[1, 2],
            group=2,
        ),
        h.make_node(
            "ConvTranspose",
            ["x", "w"],
            ["same"],
            name="same_upper",
            strides=[2, 2],
            auto_pad="SAME_UPPER",
            group=2,
        ),
        h.make_node(
            "ConvTranspose",
            ["x", "w"],
            ["shaped"],
            name="output_shape",
            strides=[2, 2],
            output_shape=[8, 7],
            group=2,
        ),
        h.make_node(
            "ConvTranspose", ["seq", "w1"], ["seq_up"], name="one_d", strides=[3], pads=[1, 0]
        ),
    ]
    inits = [("w", f32(4, 3, 3, 2)), ("b", f32(6)), ("w1", f32(2, 5, 4))]
    model = make_onnx_model(
        onnx,
        nodes,
        [("x", [2, 4, 4, 4]), ("seq", [1, 2, 6])],
        ["up", "same", "shaped", "seq_up"],
        inits,
    )
    feeds = {"x": f32(2, 4, 4, 4), "seq": f32(1, 2, 6)}
    trace = capture(model, feeds)
    assert [layer.op for layer in trace.layers] == ["conv_transpose2d"] * 4
    asym = trace.layers[0]
    assert asym.attrs == {
        "stride": [2, 3],
        "padding": [[1, 0], [0, 2]],
        "dilation": [1, 2],
        "groups": 2,
        "output_padding": [1, 1],
    }
    reference = onnx_reference_values(onnx, ort, model, ["up", "same", "shaped", "seq_up"], feeds)
    for layer, name in zip(trace.layers, ["up", "same", "shaped", "seq_up"]):
        expected = reference[name]
        assert_close_to(layer.output.reshape(expected.shape), expected)
        direct = conv_transpose2d_direct(
            layer.input, layer.weight, layer.bias, layer.conv_geometry()
        )
        assert_close_to(direct.reshape(expected.shape), expected)
        assert_close_to(gemm_reference(layer), direct)


def test_two_operand_einsums_are_batched_matmuls(onnx, ort, capture):
    h = onnx.helper
    equations = {
        "scores": "bhid,bhjd->bhij",
        "proj": "bik,nk->bin",
        "mixed": "ikb,kjb->bji",
        "outer": "i,j->ij",
    }
    nodes = [
        h.make_node("Einsum", ["q", "k"], ["scores"], name="scores", equation=equations["scores"]),
        h.make_node("Einsum", ["x", "w"], ["proj"], name="proj", equation=equations["proj"]),
        h.make_node("Einsum", ["a", "c"], ["mixed"], name="mixed", equation=equations["mixed"]),
        h.make_node("Einsum", ["u", "u"], ["outer"], name="outer", equation=equations["outer"]),
        h.make_node("Einsum", ["a"], ["trace_like"], name="unary", equation="ikb->b"),
        h.make_node("Einsum", ["x", "x"], ["diag"], name="diagonal", equation="bii,bjj->bij"),
    ]
    inputs = [
        ("q", [2, 3, 4, 5]),
        ("k", [2, 3, 6, 5]),
        ("x", [2, 4, 4]),
        ("a", [3, 4, 2]),
        ("c", [4, 5, 2]),
        ("u", [3]),
    ]
    model = make_onnx_model(
        onnx,
        nodes,
        inputs,
        ["scores", "proj", "mixed", "outer", "trace_like", "diag"],
        [("w", f32(7, 4))],
        opset=17,
    )
    feeds = {name: f32(*shape) for name, shape in inputs}
    with pytest.warns(Warning, match="2 matmul-like node"):
        trace = capture(model, feeds)
    assert [layer.name for layer in trace.layers] == ["scores", "proj", "mixed", "outer"]
    assert {s["name"]: s["op"] for s in trace.source["skipped"]} == {
        "unary": "Einsum",
        "diagonal": "Einsum",
    }
    scores = trace.layers[0]
    assert scores.input.shape == (2, 3, 4, 5) and scores.weight.shape == (2, 3, 5, 6)
    assert trace.layers[2].input.shape == (2, 3, 4) and trace.layers[2].weight.shape == (2, 4, 5)
    reference = onnx_reference_values(onnx, ort, model, ["scores", "proj", "mixed", "outer"], feeds)
    # the layer output is the node's output in (batch..., M, N) order: "bji" becomes (b, i, j); in
    # "bik,nk->bin" b is a free index of the first operand only, so (b, i) is M
    rearranged = {
        "scores": lambda a: a,
        "proj": lambda a: a.reshape(8, 7),
        "mixed": lambda a: a.transpose(0, 2, 1),
        "outer": lambda a: a,
    }
    for layer in trace.layers:
        assert np.array_equal(layer.output, rearranged[layer.name](reference[layer.name]))
        np.testing.assert_allclose(gemm_reference(layer), layer.output, rtol=1e-5, atol=1e-5)
    # the operands are the node's inputs rearranged: "ikb" -> (b, i, k), "kjb" -> (b, k, j)
    assert np.array_equal(trace.layers[2].input, feeds["a"].transpose(2, 0, 1))
    assert np.array_equal(trace.layers[2].weight, feeds["c"].transpose(2, 0, 1))


def test_matmul_like_nodes_that_are_not_layers_are_listed_and_warned_about(onnx, capture):
    from mxsim.errors import CaptureWarning

    h = onnx.helper
    nodes = [
        h.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        h.make_node("MatMulInteger", ["xq", "wq"], ["acc"], name="int_mm"),
        h.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
    ]
    inits = [
        ("s", np.array(0.1, np.float32)),
        ("z", np.array(0, np.uint8)),
        ("wq", np.ones((3, 2), np.uint8)),
        ("w", f32(3, 2)),
    ]
    model = make_onnx_model(onnx, nodes, [("x", [2, 3])], ["acc", "y"], inits)
    with pytest.warns(CaptureWarning, match="1 matmul-like node"):
        trace = capture(model, {"x": f32(2, 3)})
    assert [layer.name for layer in trace.layers] == ["mm"]
    assert trace.source["skipped"] == [
        {
            "name": "int_mm",
            "op": "MatMulInteger",
            "reason": "a matmul-like op that capture does not lower to a GEMM layer",
        }
    ]


@pytest.mark.parametrize("family", ["gpt2", "bert", "llama", "vit"])
def test_exported_transformers_capture_every_matmul_node(
    onnx, ort, capture, torch, family, tmp_path
):
    from conftest import tiny_transformer

    model, sample = tiny_transformer(torch, family)
    path = tmp_path / f"{family}.onnx"
    torch.onnx.export(
        model, (sample,), str(path), dynamo=False, opset_version=17, input_names=["x"]
    )
    graph = onnx.load(str(path))
    # independent count: the exported graph's GEMM nodes
    gemm_nodes = [
        node
        for node in graph.graph.node
        if node.op_type in ("MatMul", "Gemm", "Conv", "ConvTranspose")
    ]
    feeds = {"x": sample.numpy()}
    trace = capture(str(path), feeds)
    assert (
        len(trace.layers)
        == len(gemm_nodes)
        == {"gpt2": 13, "bert": 17, "llama": 19, "vit": 18}[family]
    )
    assert "skipped" not in trace.source
    outputs = layer_node_outputs(graph, trace)
    reference = onnx_reference_values(onnx, ort, graph, sorted(set(outputs.values())), feeds)
    for layer in trace.layers:
        expected = reference[outputs[layer.name]]
        assert_close_to(layer.output.reshape(expected.shape), expected)
        assert_close_to(gemm_reference(layer), layer.output)
    batched = [layer for layer in trace.layers if layer.op == "matmul" and layer.weight.ndim == 4]
    assert len(batched) == 4 and batched[0].input.shape[:2] == (2, 4)  # (batch, heads) kept
