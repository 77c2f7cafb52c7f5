"""mxsim.trace.onnx_import: ONNX capture of float, QDQ and Quark-quantized models, and a real model."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import numpy as np
import pytest

from mxsim import BFP_SPECS, fake_quantize, quantize_bfp
from mxsim.errors import MxsimError
from mxsim.trace import BFPQuant, MXQuant, QDQQuant, load_trace
from mxsim.trace.lowering import gemm_reference

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "trace"
PPOCR_MODEL = DATA / "ppocr_cls" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
IR_VERSION = 10  # onnxruntime 1.2x reads IR <= 10/11; onnx.helper would stamp a newer one


def _require(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is required when CI is set: pip install 'mxsim[onnx]'", pytrace=False)
        pytest.skip(f"{name} is not installed (pip install 'mxsim[onnx]')")


@pytest.fixture(scope="module")
def onnx():
    _require("onnxruntime")
    return _require("onnx")


@pytest.fixture(scope="module")
def ort(onnx):
    return _require("onnxruntime")


@pytest.fixture(scope="module")
def capture(onnx):
    from mxsim.trace.onnx_import import capture_onnx

    return capture_onnx


RNG = np.random.default_rng(5)


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def make_model(onnx, nodes, inputs, outputs, initializers=(), opset=17, extra_domains=()):
    helper = onnx.helper
    graph = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape) for name, shape in inputs],
        [onnx.ValueInfoProto(name=name) for name in outputs],
        initializer=[onnx.numpy_helper.from_array(array, name) for name, array in initializers])
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in extra_domains]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def reference_values(onnx, ort, model, names, feeds):
    """The named tensors from one plain onnxruntime session (default optimisations) over the whole model."""
    probe = onnx.ModelProto.FromString(model.SerializeToString())
    existing = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in existing)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(list(names), feeds)))


def assert_close_to(actual, expected, rtol=1e-5):
    scale = max(float(np.abs(expected).max()), 1e-30)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=rtol * scale)


# ----------------------------------------------------------------------------- float models


def float_model(onnx):
    h = onnx.helper
    conv_w = f32(6, 2, 3, 2)
    const_w = h.make_node("Constant", [], ["w_same"], value=onnx.numpy_helper.from_array(f32(5, 6, 2, 2), "v"))
    nodes = [
        h.make_node("Conv", ["x", "conv_w", "conv_b"], ["c1"], name="conv_asym", group=2, strides=[2, 1],
                    pads=[1, 0, 0, 1], dilations=[1, 2]),
        h.make_node("Relu", ["c1"], ["r1"]),
        const_w,
        h.make_node("Conv", ["r1", "w_same"], ["c2"], name="conv_same_upper", auto_pad="SAME_UPPER", strides=[2, 2]),
        h.make_node("Conv", ["r1", "w_same"], ["c3"], name="conv_same_lower", auto_pad="SAME_LOWER"),
        h.make_node("Flatten", ["c2"], ["flat"]),
        h.make_node("Gemm", ["flat", "gemm_w", "gemm_c"], ["g1"], name="gemm_kn", alpha=0.5, beta=2.0),
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
    inits = [("conv_w", conv_w), ("conv_b", f32(6)), ("gemm_w", f32(flat, 7)), ("gemm_c", f32(7)),
             ("gemm2_w", f32(4, 7)), ("mm_w", f32(4, 3)), ("mm_b", f32(3)), ("vec_w", f32(4, 3)),
             ("conv1d_w", f32(2, 2, 3))]
    inputs = [("x", [2, 4, 7, 6]), ("y", [2, 3, 4]), ("v", [4]), ("seq", [1, 2, 5])]
    model = make_model(onnx, nodes, inputs, ["logits", "scores", "vec", "seq_out", "c3"], inits)
    feeds = {"x": f32(2, 4, 7, 6), "y": f32(2, 3, 4), "v": f32(4), "seq": f32(1, 2, 5)}
    return model, feeds


def test_float_model_layers_and_attributes(onnx, capture):
    model, feeds = float_model(onnx)
    trace = capture(model, feeds, name="float")
    by_name = {layer.name: layer for layer in trace.layers}
    assert list(by_name) == ["conv_asym", "conv_same_upper", "conv_same_lower", "gemm_kn", "gemm_transposed",
                             "matmul_bias", "batched", "vector", "conv1d"]
    assert "skipped" not in trace.source
    # a 1-d MatMul operand is a 1-row matrix; a 1-d convolution is a 2-d one of height 1
    assert by_name["vector"].input.shape == (1, 4) and by_name["vector"].output.shape == (1, 3)
    assert by_name["vector"].source["promoted"] == "row"
    assert by_name["conv1d"].input.shape == (1, 2, 1, 5) and by_name["conv1d"].weight.shape == (2, 2, 1, 3)
    assert by_name["conv_asym"].attrs == {"stride": [2, 1], "padding": [[1, 0], [0, 1]], "dilation": [1, 2], "groups": 2}
    # input 4x3 (after conv_asym), kernel 2x2: SAME_UPPER stride 2 pads 0 before, 1 after (rows: total 1; cols: 1)
    assert by_name["conv_same_upper"].attrs["padding"] == [[0, 1], [0, 1]]
    assert by_name["conv_same_lower"].attrs["padding"] == [[1, 0], [1, 0]]
    gemm = by_name["gemm_kn"]
    assert gemm.op == "linear" and gemm.attrs == {"alpha": 0.5, "beta": 2.0}
    assert np.array_equal(gemm.weight, onnx.numpy_helper.to_array(model.graph.initializer[2]).T)  # stored (N, K)
    transposed = by_name["gemm_transposed"]
    assert transposed.input.shape == (2, 7) and transposed.source["transA"] == 1
    fused = by_name["matmul_bias"]
    assert fused.op == "matmul" and fused.source["fused_add"] == "bias_add" and fused.bias.shape == (3,)
    assert by_name["batched"].source["weight_is_constant"] is False
    assert by_name["conv_same_upper"].source["weight_is_constant"] is True  # from a Constant node


def test_float_model_outputs_equal_onnxruntime_and_the_gemm_view(onnx, ort, capture):
    model, feeds = float_model(onnx)
    trace = capture(model, feeds)
    outputs = {"conv_asym": "c1", "conv_same_upper": "c2", "conv_same_lower": "c3", "gemm_kn": "g1",
               "gemm_transposed": "g2", "matmul_bias": "logits", "batched": "scores", "vector": "vec",
               "conv1d": "seq_out"}
    reference = reference_values(onnx, ort, model, list(outputs.values()), feeds)
    for layer in trace.layers:
        expected = reference[outputs[layer.name]]
        assert_close_to(layer.output.reshape(expected.shape), expected)
        assert_close_to(gemm_reference(layer), layer.output)


def test_digits_onnx_export_captures_like_the_torch_trace(capture):
    torch_trace = load_trace(REPO / "traces" / "digits-cnn")
    trace = capture(DATA / "digits_cnn.onnx", {"image": torch_trace.dataset["inputs"]})
    assert [layer.op for layer in trace.layers] == [layer.op for layer in torch_trace.layers]
    for ours, theirs in zip(trace.layers, torch_trace.layers):
        assert ours.attrs == theirs.attrs
        assert np.array_equal(ours.weight, theirs.weight) and np.array_equal(ours.bias, theirs.bias)
        assert_close_to(ours.input, theirs.input)
        assert_close_to(ours.output, theirs.output)
    assert trace.source["sha256"] and trace.source["inputs"] == {"image": {"shape": [360, 1, 8, 8], "dtype": "float32"}}


# ----------------------------------------------------------------------------- standard QDQ


def qdq_model(onnx):
    h = onnx.helper
    weight_int8 = RNG.integers(-127, 128, (8, 4)).astype(np.int8)
    nodes = [
        h.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"], name="quant_x"),
        h.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"], name="dequant_x"),
        h.make_node("DequantizeLinear", ["w_int8", "w_scale", "w_zero"], ["w_dq"], name="dequant_w", axis=1),
        h.make_node("MatMul", ["x_dq", "w_dq"], ["h"], name="per_axis_matmul"),
        h.make_node("QuantizeLinear", ["w2", "w2_scale", "w2_zero"], ["w2_q"], axis=1, block_size=3),
        h.make_node("DequantizeLinear", ["w2_q", "w2_scale", "w2_zero"], ["w2_dq"], name="dequant_w2", axis=1,
                    block_size=3),
        h.make_node("Gemm", ["h", "w2_dq"], ["y"], name="blocked_gemm", transB=1),
    ]
    inits = [("x_scale", np.array(0.02, np.float32)), ("x_zero", np.array(128, np.uint8)),
             ("w_int8", weight_int8), ("w_scale", np.array([0.01, 0.02, 0.03, 0.04], np.float32)),
             ("w_zero", np.zeros(4, np.int8)), ("w2", f32(6, 4)),
             ("w2_scale", np.array([[0.02, 0.05]] * 6, np.float32)), ("w2_zero", np.zeros((6, 2), np.int8))]
    return make_model(onnx, nodes, [("x", [3, 8])], ["y"], inits, opset=21), {"x": f32(3, 8)}


def test_qdq_specs_are_recognised(onnx, capture):
    model, feeds = qdq_model(onnx)
    trace = capture(model, feeds)
    matmul, gemm = trace.layers
    x_spec, w_spec = matmul.quant["input"], matmul.quant["weight"]
    assert isinstance(x_spec, QDQQuant) and (x_spec.dtype, x_spec.axis, x_spec.block_size) == ("uint8", None, 0)
    assert float(x_spec.scale) == np.float32(0.02) and int(x_spec.zero_point) == 128
    assert np.array_equal(matmul.input, feeds["x"])  # the float value before QuantizeLinear
    assert (w_spec.dtype, w_spec.axis, w_spec.block_size) == ("int8", 1, 0)
    assert "weight_quantized" not in matmul.tensors  # stored int8 weight: the operand is already dequantized
    blocked = gemm.quant["weight"]
    assert (blocked.dtype, blocked.axis, blocked.block_size, blocked.scale.shape) == ("int8", 1, 3, (6, 2))
    assert matmul.source["quant_nodes"] == {"input": "quant_x", "weight": "dequant_w"}


def test_qdq_fake_quantize_reproduces_onnxruntime_bit_for_bit(onnx, capture):
    model, feeds = qdq_model(onnx)
    trace = capture(model, feeds)
    for layer in trace.layers:
        for operand in ("input", "weight"):
            quantized = layer.quantized(operand)
            if quantized is not None:
                assert np.array_equal(layer.quant[operand].fake_quantize(layer.tensors[operand]), quantized)
        assert_close_to(gemm_reference(layer), layer.output)
    assert trace.layers[0].quantized("input") is not None and trace.layers[1].quantized("weight") is not None


# ----------------------------------------------------------------------------- Quark custom ops


def quark_model(onnx, legacy=False):
    """MX and BFP custom nodes on activations and on weights (one from a Constant node), including a
    two-node chain (MX fp6 then BFP MX9) that needs three onnxruntime stages."""
    h = onnx.helper
    quark = "com.amd.quark"
    conv_weight = h.make_node("Constant", [], ["conv_w"], value=onnx.numpy_helper.from_array(f32(8, 16, 3, 3), "v"))
    first_mx = ("MXFixNeuron", "com.vai.quantize") if legacy else ("MXQuantizeDequantize", quark)
    nodes = [
        h.make_node(first_mx[0], ["x"], ["x_mx"], name="mx_fp8_act", domain=first_mx[1], element_dtype="fp8_e4m3",
                    axis=1, block_size=8, rounding_mode=2),
        conv_weight,
        h.make_node("BFPQuantizeDequantize", ["conv_w"], ["conv_w_q"], name="mx6_weight", domain=quark,
                    bfp_method="to_bfp_prime", bit_width=13, block_size=16, sub_block_size=2, sub_block_shift_bits=1,
                    rounding_mode=2, axis=1),
        h.make_node("Conv", ["x_mx", "conv_w_q", "conv_b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c"], ["r"]),
        h.make_node("Flatten", ["r"], ["f"]),
        h.make_node("MXQuantizeDequantize", ["f"], ["f_q"], name="mxint8_act", domain=quark, element_dtype="int8",
                    axis=1, block_size=32, rounding_mode=1),
        h.make_node("MXQuantizeDequantize", ["mm_w"], ["mm_w_q"], name="fp4_weight", domain=quark,
                    element_dtype="fp4_e2m1", axis=0, block_size=32, rounding_mode=2),
        h.make_node("MatMul", ["f_q", "mm_w_q"], ["mm"], name="matmul"),
        h.make_node("Add", ["mm", "mm_b"], ["h"]),
        h.make_node("MXQuantizeDequantize", ["h"], ["h_fp6"], name="fp6_act", domain=quark, element_dtype="fp6_e3m2",
                    axis=1, block_size=32),
        h.make_node("BFPQuantizeDequantize", ["h_fp6"], ["h_mx9"], name="mx9_act", domain=quark,
                    bfp_method="to_bfp_prime", bit_width=16, block_size=16, sub_block_size=2, sub_block_shift_bits=1,
                    axis=1),
        h.make_node("BFPQuantizeDequantize", ["gemm_w"], ["gemm_w_q"], name="bfp16_weight", domain=quark,
                    bfp_method="to_bfp", bit_width=16, block_size=8, axis=0),
        h.make_node("Gemm", ["h_mx9", "gemm_w_q"], ["y"], name="gemm"),
    ]
    inits = [("conv_b", f32(8)), ("mm_w", f32(288, 10, scale=0.1)), ("mm_b", f32(10)), ("gemm_w", f32(10, 5))]
    model = make_model(onnx, nodes, [("x", [2, 16, 6, 6])], ["y"], inits,
                       extra_domains=("com.vai.quantize",) if legacy else (quark,))
    return model, {"x": f32(2, 16, 6, 6)}


@pytest.mark.parametrize("legacy", [False, True])
def test_quark_custom_ops_import_with_their_formats(onnx, capture, legacy):
    model, feeds = quark_model(onnx, legacy)
    conv, matmul, gemm = capture(model, feeds).layers
    assert conv.quant["input"] == MXQuant("fp8_e4m3", 1, 8, "quark-onnx", bypass_single_element=True)
    assert conv.quant["weight"] == BFPQuant(BFP_SPECS["MX6"].replace(rounding_mode=2), 1, bypass_single_element=True)
    assert conv.quant["weight"].name == "MX6" and conv.quant["bias"] is None
    assert matmul.quant["input"] == MXQuant("int8", 1, 32, "quark-onnx", {"element_rounding": "nearest_toward_positive"},
                                            bypass_single_element=True)
    assert matmul.quant["weight"] == MXQuant("fp4_e2m1", 0, 32, "quark-onnx", bypass_single_element=True)
    assert gemm.quant["input"] == BFPQuant("MX9", 1, bypass_single_element=True)
    # Gemm with transB=0: the (K, N) weight is stored as (N, K), so its block axis 0 (K) becomes 1
    assert gemm.quant["weight"] == BFPQuant("BFP16", 1, bypass_single_element=True)
    assert gemm.weight.shape == (5, 10) and gemm.quant["weight"].spec.kernel == "cpu"
    assert conv.source["quant_nodes"] == {"input": "mx_fp8_act", "weight": "mx6_weight"}


def test_quark_quantized_operands_are_mxsims_quantizers_applied_to_the_captured_floats(onnx, capture):
    model, feeds = quark_model(onnx)
    conv, matmul, gemm = capture(model, feeds).layers
    assert np.array_equal(conv.input, feeds["x"])
    assert np.array_equal(conv.quantized("input"),
                          fake_quantize(feeds["x"], "fp8_e4m3", axis=1, block_size=8, profile="quark-onnx").astype(np.float32))
    assert np.array_equal(conv.quantized("weight"),
                          quantize_bfp(conv.weight, BFP_SPECS["MX6"].replace(rounding_mode=2), axis=1).dequantize())
    for layer in (conv, matmul, gemm):
        for operand in ("input", "weight"):
            spec = layer.quant[operand]
            assert np.array_equal(np.float32(spec.fake_quantize(layer.tensors[operand])), layer.quantized(operand))
    # the chain before the Gemm: fp6 MX (first custom node) then MX9 (the one next to the Gemm)
    fp6 = fake_quantize(matmul.output, "fp6_e3m2", axis=1, block_size=32, profile="quark-onnx").astype(np.float32)
    assert np.array_equal(gemm.input, fp6)
    # every stage boundary carries the exact values: relu/flatten of the conv output feed the matmul
    assert np.array_equal(matmul.input, np.maximum(conv.output, 0).reshape(2, -1))


def test_quark_model_outputs_equal_the_gemm_view_of_the_quantized_operands(onnx, capture):
    model, feeds = quark_model(onnx)
    for layer in capture(model, feeds).layers:
        assert_close_to(layer.output, gemm_reference(layer))


def test_shipped_quark_style_digits_model_replays_with_its_own_formats(capture):
    from mxsim.trace.onnx_import import load_inputs_npz

    trace = capture(DATA / "digits_cnn_quark.onnx", load_inputs_npz(DATA / "digits_inputs.npz"))
    mxfp8 = MXQuant("fp8_e4m3", 1, 32, "quark-onnx", bypass_single_element=True)
    mx6 = BFPQuant(BFP_SPECS["MX6"].replace(rounding_mode=2), 1, bypass_single_element=True)
    mxint8 = MXQuant("int8", 1, 32, "quark-onnx", {"element_rounding": "nearest_even"}, bypass_single_element=True)
    assert [(layer.quant["input"], layer.quant["weight"]) for layer in trace.layers] == [
        (mxfp8, mx6), (mxfp8, mx6), (mxfp8, mxint8), (mxfp8, mxint8)]
    for layer in trace.layers:
        for operand in ("input", "weight"):
            spec = layer.quant[operand]
            assert np.array_equal(np.float32(spec.fake_quantize(layer.tensors[operand])), layer.quantized(operand))
    labels = load_trace(REPO / "traces" / "digits-cnn").dataset["labels"][:16]
    assert np.sum(trace.layers[-1].output.argmax(axis=1) == labels) >= 15  # quantized, still a digit classifier


def test_subgraphs_reading_outer_values_run_in_the_right_stage(onnx, ort, capture):
    # If's branches read "x_q" (made by a custom node, stage 1) and "w" (an initializer)
    h = onnx.helper
    then_branch = h.make_graph([h.make_node("MatMul", ["x_q", "w"], ["t"], name="in_branch")], "then", [],
                               [h.make_tensor_value_info("t", onnx.TensorProto.FLOAT, None)])
    else_branch = h.make_graph([h.make_node("Neg", ["x_q"], ["e"])], "else", [],
                               [h.make_tensor_value_info("e", onnx.TensorProto.FLOAT, None)])
    nodes = [h.make_node("MXQuantizeDequantize", ["x"], ["x_q"], name="mx", domain="com.amd.quark",
                         element_dtype="fp8_e5m2", axis=1, block_size=4),
             h.make_node("If", ["flag"], ["branch"], then_branch=then_branch, else_branch=else_branch),
             h.make_node("MatMul", ["branch", "w2"], ["y"], name="after")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
                         [onnx.ValueInfoProto(name="y")],
                         initializer=[onnx.numpy_helper.from_array(f32(4, 4), "w"),
                                      onnx.numpy_helper.from_array(f32(4, 3), "w2"),
                                      onnx.numpy_helper.from_array(np.array(True), "flag")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.amd.quark", 1)],
                         ir_version=IR_VERSION)
    x = f32(2, 4)
    (after,) = capture(model, {"x": x}).layers  # MatMuls inside subgraphs are not layers
    x_q = fake_quantize(x, "fp8_e5m2", axis=1, block_size=4, profile="quark-onnx").astype(np.float32)
    w = onnx.numpy_helper.to_array(model.graph.initializer[0])
    assert_close_to(after.input, x_q.astype(np.float64) @ w)


def test_bfp_kernel_choice_is_recorded(onnx, capture):
    model, feeds = quark_model(onnx)
    conv = capture(model, feeds, bfp_kernel="cuda").layers[0]
    assert conv.quant["weight"].spec.kernel == "cuda"  # rounding_mode 2 reads as stochastic there


def test_single_element_tensors_bypass_quark_quantizers_like_quark(onnx):
    from mxsim.trace.onnx_import import _evaluate_quark

    node = onnx.helper.make_node("MXQuantizeDequantize", ["a"], ["b"], domain="com.amd.quark",
                                 element_dtype="fp4_e2m1", block_size=1)
    assert _evaluate_quark(node, np.array([7.0], np.float32), "cpu").tolist() == [7.0]
    assert _evaluate_quark(node, np.array([7.0, 7.0], np.float32), "cpu").tolist() == [6.0, 6.0]


def test_unsupported_quark_op_is_named(onnx, capture):
    h = onnx.helper
    nodes = [h.make_node("ExtendedQuantizeLinear", ["x", "s", "z"], ["q"], name="ext", domain="com.amd.quark"),
             h.make_node("MatMul", ["q", "w"], ["y"])]
    model = make_model(onnx, nodes, [("x", [2, 3])], ["y"],
                       [("s", np.array(1.0, np.float32)), ("z", np.array(0, np.int8)), ("w", f32(3, 2))],
                       extra_domains=("com.amd.quark",))
    with pytest.raises(MxsimError, match="node 'ext': com.amd.quark::ExtendedQuantizeLinear needs Quark"):
        capture(model, {"x": f32(2, 3)})


def test_invalid_quark_attributes_are_named(onnx, capture):
    h = onnx.helper
    nodes = [h.make_node("MXQuantizeDequantize", ["x"], ["q"], name="bad", domain="com.amd.quark",
                         element_dtype="fp5_e2m2"),
             h.make_node("MatMul", ["q", "w"], ["y"])]
    model = make_model(onnx, nodes, [("x", [2, 3])], ["y"], [("w", f32(3, 2))], extra_domains=("com.amd.quark",))
    with pytest.raises(MxsimError, match="node 'bad'.*unknown format 'fp5_e2m2'"):
        capture(model, {"x": f32(2, 3)})


# ----------------------------------------------------------------------------- inputs and files


def test_inputs_are_checked_against_the_graph(onnx, capture):
    model, feeds = qdq_model(onnx)
    with pytest.raises(MxsimError, match=r"missing \['x'\], unexpected \['z'\]"):
        capture(model, {"z": feeds["x"]})
    with pytest.raises(MxsimError, match="input 'x' must be float32, got float64"):
        capture(model, {"x": feeds["x"].astype(np.float64)})
    with pytest.raises(MxsimError, match="input 'x' axis 1 must be 8"):
        capture(model, {"x": f32(3, 7)})


def test_layer_selection_by_name(onnx, capture):
    model, feeds = float_model(onnx)
    trace = capture(model, feeds, layers=["gemm_kn", "batched"])
    assert [layer.name for layer in trace.layers] == ["gemm_kn", "batched"]
    assert trace.source["selected_layers"] == ["gemm_kn", "batched"]
    with pytest.raises(MxsimError, match=r"no MatMul/Gemm/Conv node named \['nope'\]"):
        capture(model, feeds, layers=["nope"])


def test_missing_or_broken_model_file(capture, tmp_path):
    with pytest.raises(MxsimError, match="no such model file"):
        capture(tmp_path / "absent.onnx", {})
    (tmp_path / "junk.onnx").write_bytes(b"\x07not a protobuf")
    with pytest.raises(MxsimError, match="not a readable ONNX model"):
        capture(tmp_path / "junk.onnx", {})


def test_load_inputs_npz_never_unpickles(capture, tmp_path):
    from mxsim.trace.onnx_import import load_inputs_npz

    assert set(load_inputs_npz(DATA / "digits_inputs.npz")) == {"image"}
    np.savez(tmp_path / "evil.npz", image=np.array([object()], dtype=object))
    with pytest.raises(MxsimError, match=r"is a pickled \(object\) array in .*; mxsim never unpickles"):
        load_inputs_npz(tmp_path / "evil.npz")
    np.save(tmp_path / "single.npy", np.zeros(2))
    with pytest.raises(MxsimError, match="is a single .npy array, not an NPZ archive"):
        load_inputs_npz(tmp_path / "single.npy")


# ----------------------------------------------------------------------------- a real model


@pytest.fixture(scope="module")
def ppocr(capture):
    shipped = load_trace(REPO / "traces" / "ppocr-cls")
    images = shipped.layer("Conv@0").input  # the model input: two rendered text lines
    return shipped, images, capture(PPOCR_MODEL, {"x": images})


def test_real_model_weights_come_from_constant_nodes(onnx, ppocr):
    _, _, trace = ppocr
    model = onnx.load(str(PPOCR_MODEL))
    assert len(model.graph.initializer) == 0
    assert len(trace.layers) == 54 and not trace.source.get("skipped")
    assert all(layer.source["weight_is_constant"] for layer in trace.layers)
    assert sum(layer.op == "conv2d" and layer.attrs["groups"] > 1 for layer in trace.layers) == 11  # depthwise
    assert trace.layers[-1].op == "matmul" and trace.layers[-1].source["fused_add"]


def test_real_model_layers_equal_the_gemm_view_and_onnxruntime(onnx, ort, ppocr):
    shipped, images, trace = ppocr
    for layer in trace.layers:
        assert_close_to(gemm_reference(layer), layer.output, rtol=2e-5)
    session = ort.InferenceSession(str(PPOCR_MODEL), providers=["CPUExecutionProvider"])
    probabilities = session.run(None, {"x": images})[0]
    logits = trace.layers[-1].output.astype(np.float64)
    softmax = np.exp(logits - logits.max(axis=1, keepdims=True))
    softmax /= softmax.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(softmax, probabilities, rtol=0, atol=1e-5)
    assert [shipped.metadata["labels"][i] for i in probabilities.argmax(axis=1)] == ["0", "180"]


def test_shipped_real_model_trace_matches_a_fresh_capture(ppocr):
    shipped, _, trace = ppocr
    assert shipped.source["sha256"] == trace.source["sha256"]
    for layer in shipped.layers:
        fresh = trace.layer(layer.name)
        assert layer.attrs == fresh.attrs
        assert np.array_equal(layer.weight, fresh.weight)
        assert_close_to(layer.input, fresh.input)
        assert_close_to(layer.output, fresh.output)


# ----------------------------------------------------------------------------- coverage: transformers, ConvTranspose, Einsum


def quark_runtime_values(onnx, ort, model, names, feeds):
    """The named tensors computed by onnxruntime with Quark's own custom-op library (amd-quark)."""
    quark_onnx = pytest.importorskip("quark.onnx")
    probe = onnx.ModelProto.FromString(model.SerializeToString())
    existing = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in existing)
    options = ort.SessionOptions()
    options.register_custom_ops_library(quark_onnx.get_library_path("CPU"))
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(list(names), feeds)))


def layer_node_outputs(model, trace):
    """Each layer's ONNX output tensor name (a fused bias Add's output for a MatMul with bias)."""
    produced = {node.name: node.output[0] for node in model.graph.node}
    return {layer.name: produced[layer.source.get("fused_add") or layer.source["node"]] for layer in trace.layers}


@pytest.mark.parametrize("family", ["gpt2", "bert", "llama", "vit"])
def test_exported_transformers_capture_every_matmul_node(onnx, ort, capture, torch, family, tmp_path):
    from conftest import tiny_transformer

    model, sample = tiny_transformer(torch, family)
    path = tmp_path / f"{family}.onnx"
    torch.onnx.export(model, (sample,), str(path), dynamo=False, opset_version=17, input_names=["x"])
    graph = onnx.load(str(path))
    # independent count: the exported graph's GEMM nodes
    gemm_nodes = [node for node in graph.graph.node if node.op_type in ("MatMul", "Gemm", "Conv", "ConvTranspose")]
    feeds = {"x": sample.numpy()}
    trace = capture(str(path), feeds)
    assert len(trace.layers) == len(gemm_nodes) == {"gpt2": 13, "bert": 17, "llama": 19, "vit": 18}[family]
    assert "skipped" not in trace.source
    outputs = layer_node_outputs(graph, trace)
    reference = reference_values(onnx, ort, graph, sorted(set(outputs.values())), feeds)
    for layer in trace.layers:
        expected = reference[outputs[layer.name]]
        assert_close_to(layer.output.reshape(expected.shape), expected)
        assert_close_to(gemm_reference(layer), layer.output)
    batched = [layer for layer in trace.layers if layer.op == "matmul" and layer.weight.ndim == 4]
    assert len(batched) == 4 and batched[0].input.shape[:2] == (2, 4)  # (batch, heads) kept


def test_conv_transpose_nodes_equal_onnxruntime_and_the_direct_scatter(onnx, ort, capture):
    from mxsim.trace.conv import conv_transpose2d_direct

    h = onnx.helper
    nodes = [
        h.make_node("ConvTranspose", ["x", "w", "b"], ["up"], name="asym", strides=[2, 3], pads=[1, 0, 0, 2],
                    output_padding=[1, 1], dilations=[1, 2], group=2),
        h.make_node("ConvTranspose", ["x", "w"], ["same"], name="same_upper", strides=[2, 2], auto_pad="SAME_UPPER",
                    group=2),
        h.make_node("ConvTranspose", ["x", "w"], ["shaped"], name="output_shape", strides=[2, 2], output_shape=[8, 7],
                    group=2),
        h.make_node("ConvTranspose", ["seq", "w1"], ["seq_up"], name="one_d", strides=[3], pads=[1, 0]),
    ]
    inits = [("w", f32(4, 3, 3, 2)), ("b", f32(6)), ("w1", f32(2, 5, 4))]
    model = make_model(onnx, nodes, [("x", [2, 4, 4, 4]), ("seq", [1, 2, 6])], ["up", "same", "shaped", "seq_up"], inits)
    feeds = {"x": f32(2, 4, 4, 4), "seq": f32(1, 2, 6)}
    trace = capture(model, feeds)
    assert [layer.op for layer in trace.layers] == ["conv_transpose2d"] * 4
    asym = trace.layers[0]
    assert asym.attrs == {"stride": [2, 3], "padding": [[1, 0], [0, 2]], "dilation": [1, 2], "groups": 2,
                          "output_padding": [1, 1]}
    reference = reference_values(onnx, ort, model, ["up", "same", "shaped", "seq_up"], feeds)
    for layer, name in zip(trace.layers, ["up", "same", "shaped", "seq_up"]):
        expected = reference[name]
        assert_close_to(layer.output.reshape(expected.shape), expected)
        direct = conv_transpose2d_direct(layer.input, layer.weight, layer.bias, layer.conv_geometry())
        assert_close_to(direct.reshape(expected.shape), expected)
        assert_close_to(gemm_reference(layer), direct)


def test_two_operand_einsums_are_batched_matmuls(onnx, ort, capture):
    h = onnx.helper
    equations = {"scores": "bhid,bhjd->bhij", "proj": "bik,nk->bin", "mixed": "ikb,kjb->bji", "outer": "i,j->ij"}
    nodes = [h.make_node("Einsum", ["q", "k"], ["scores"], name="scores", equation=equations["scores"]),
             h.make_node("Einsum", ["x", "w"], ["proj"], name="proj", equation=equations["proj"]),
             h.make_node("Einsum", ["a", "c"], ["mixed"], name="mixed", equation=equations["mixed"]),
             h.make_node("Einsum", ["u", "u"], ["outer"], name="outer", equation=equations["outer"]),
             h.make_node("Einsum", ["a"], ["trace_like"], name="unary", equation="ikb->b"),
             h.make_node("Einsum", ["x", "x"], ["diag"], name="diagonal", equation="bii,bjj->bij")]
    inputs = [("q", [2, 3, 4, 5]), ("k", [2, 3, 6, 5]), ("x", [2, 4, 4]), ("a", [3, 4, 2]), ("c", [4, 5, 2]),
              ("u", [3])]
    model = make_model(onnx, nodes, inputs, ["scores", "proj", "mixed", "outer", "trace_like", "diag"],
                       [("w", f32(7, 4))], opset=17)
    feeds = {name: f32(*shape) for name, shape in inputs}
    with pytest.warns(Warning, match="2 matmul-like node"):
        trace = capture(model, feeds)
    assert [layer.name for layer in trace.layers] == ["scores", "proj", "mixed", "outer"]
    assert {s["name"]: s["op"] for s in trace.source["skipped"]} == {"unary": "Einsum", "diagonal": "Einsum"}
    scores = trace.layers[0]
    assert scores.input.shape == (2, 3, 4, 5) and scores.weight.shape == (2, 3, 5, 6)
    assert trace.layers[2].input.shape == (2, 3, 4) and trace.layers[2].weight.shape == (2, 4, 5)
    reference = reference_values(onnx, ort, model, ["scores", "proj", "mixed", "outer"], feeds)
    # the layer output is the node's output in (batch..., M, N) order: "bji" becomes (b, i, j); in
    # "bik,nk->bin" b is a free index of the first operand only, so (b, i) is M
    rearranged = {"scores": lambda a: a, "proj": lambda a: a.reshape(8, 7), "mixed": lambda a: a.transpose(0, 2, 1),
                  "outer": lambda a: a}
    for layer in trace.layers:
        assert np.array_equal(layer.output, rearranged[layer.name](reference[layer.name]))
        np.testing.assert_allclose(gemm_reference(layer), layer.output, rtol=1e-5, atol=1e-5)
    # the operands are the node's inputs rearranged: "ikb" -> (b, i, k), "kjb" -> (b, k, j)
    assert np.array_equal(trace.layers[2].input, feeds["a"].transpose(2, 0, 1))
    assert np.array_equal(trace.layers[2].weight, feeds["c"].transpose(2, 0, 1))


def test_matmul_like_nodes_that_are_not_layers_are_listed_and_warned_about(onnx, capture):
    from mxsim.errors import CaptureWarning

    h = onnx.helper
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             h.make_node("MatMulInteger", ["xq", "wq"], ["acc"], name="int_mm"),
             h.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    inits = [("s", np.array(0.1, np.float32)), ("z", np.array(0, np.uint8)), ("wq", np.ones((3, 2), np.uint8)),
             ("w", f32(3, 2))]
    model = make_model(onnx, nodes, [("x", [2, 3])], ["acc", "y"], inits)
    with pytest.warns(CaptureWarning, match="1 matmul-like node"):
        trace = capture(model, {"x": f32(2, 3)})
    assert [layer.name for layer in trace.layers] == ["mm"]
    assert trace.source["skipped"] == [{"name": "int_mm", "op": "MatMulInteger",
                                        "reason": "a matmul-like op that capture does not lower to a GEMM layer"}]


# ----------------------------------------------------------------------------- Quark: one-element tensors, real quantizer


def test_quark_quantizers_on_rank0_and_one_element_constants_pass_through_like_quarks_runtime(onnx, ort, capture):
    h = onnx.helper
    quark = "com.amd.quark"
    nodes = [h.make_node("MXQuantizeDequantize", ["three"], ["three_q"], name="Constant@1_DequantizeLinear",
                         domain=quark, element_dtype="fp4_e2m1", axis=0, block_size=32),
             h.make_node("MXQuantizeDequantize", ["sixes"], ["sixes_q"], name="one_element", domain=quark,
                         element_dtype="fp4_e2m1", axis=1, block_size=32),
             h.make_node("BFPQuantizeDequantize", ["half"], ["half_q"], name="bfp_rank0", domain=quark,
                         bfp_method="to_bfp", bit_width=12, block_size=8, axis=1),
             h.make_node("Add", ["x", "three_q"], ["shifted"]),
             h.make_node("Mul", ["shifted", "sixes_q"], ["scaled"]),
             h.make_node("Mul", ["scaled", "half_q"], ["halved"]),
             h.make_node("MXQuantizeDequantize", ["halved"], ["act_q"], name="act", domain=quark,
                         element_dtype="fp4_e2m1", axis=1, block_size=32),
             h.make_node("MatMul", ["act_q", "w"], ["y"], name="mm")]
    # values that fp4 / 12-bit BFP would change if they were quantized: 3.3 -> 3, 6.3 -> 6
    inits = [("three", np.array(3.3, np.float32)), ("sixes", np.full((1, 1), 6.3, np.float32)),
             ("half", np.array(0.5123456, np.float32)), ("w", f32(4, 3))]
    model = make_model(onnx, nodes, [("x", [2, 4])], ["y"], inits, extra_domains=(quark,))
    feeds = {"x": f32(2, 4)}
    trace = capture(model, feeds)  # used to fail: "axis 0 is out of range for a rank-0 input"
    quark_values = quark_runtime_values(onnx, ort, model, ["halved", "y"], feeds)
    layer = trace.layers[0]
    assert np.array_equal(layer.input, quark_values["halved"])
    assert np.array_equal(layer.input, (feeds["x"] + np.float32(3.3)) * np.float32(6.3) * np.float32(0.5123456))
    assert np.array_equal(layer.output, quark_values["y"])


@pytest.fixture(scope="module")
def hardswish_model(torch, tmp_path_factory):
    """A small conv net with a hand-written hardswish (x * clamp(x + 3, 0, 6) / 6: rank-0
    constants), a ConvTranspose and a Linear, exported to ONNX; and a calibration batch."""
    torch.manual_seed(8)
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 3, padding=1)
            self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
            self.fc = nn.Linear(4, 6)

        def forward(self, x):
            y = self.conv(x)
            y = y * torch.clamp(y + 3.0, 0.0, 6.0) / 6.0
            return self.fc(self.up(y).mean((2, 3)))

    path = tmp_path_factory.mktemp("hardswish") / "net.onnx"
    x = torch.randn(2, 4, 8, 8)
    torch.onnx.export(Net().eval(), (x,), str(path), dynamo=False, opset_version=17, input_names=["x"])
    return path, x.numpy()


@pytest.mark.parametrize("config", ["MXFP8E4M3", "MXFP4E2M1", "MXINT8"])
def test_amd_quark_quantized_model_captures_and_matches_quarks_runtime(onnx, ort, capture, hardswish_model, config,
                                                                       tmp_path, monkeypatch):
    quark_onnx = pytest.importorskip("quark.onnx")
    monkeypatch.chdir(tmp_path)  # the quantizer writes a report (quantized_info.csv) into the working directory
    from onnxruntime.quantization import CalibrationDataReader
    from quark.onnx.quantization.config.config import Config
    from quark.onnx.quantization.config.custom_config import get_default_config

    path, x = hardswish_model

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": x}])

        def get_next(self):
            return next(self.batches, None)

    quantized = tmp_path / f"net_{config}.onnx"
    quark_onnx.ModelQuantizer(Config(global_quant_config=get_default_config(config))).quantize_model(
        str(path), str(quantized), Reader())
    model = onnx.load(str(quantized))
    rank0 = {t.name for t in model.graph.initializer if not t.dims}
    rank0 |= {n.output[0] for n in model.graph.node if n.op_type == "Constant"
              and not onnx.numpy_helper.to_array(n.attribute[0].t).shape}
    assert any(n.domain == "com.amd.quark" and n.input[0] in rank0 for n in model.graph.node)  # hardswish's 3 and 6
    trace = capture(str(quantized), {"x": x})
    assert [layer.op for layer in trace.layers] == ["conv2d", "conv_transpose2d", "linear"]
    assert all(isinstance(layer.quant["weight"], MXQuant) for layer in trace.layers)
    outputs = layer_node_outputs(model, trace)
    quark_values = quark_runtime_values(onnx, ort, model, list(outputs.values()), {"x": x})
    for layer in trace.layers:
        assert np.array_equal(layer.output, quark_values[outputs[layer.name]]), layer.name
