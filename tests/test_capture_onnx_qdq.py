"""mxsim.capture.onnx_qdq: QuantizeLinear/DequantizeLinear patterns read as QDQ specs, checked against onnxruntime."""

from __future__ import annotations

import numpy as np

from mxsim.trace import QDQQuant
from mxsim.replay.lowering import gemm_reference

from conftest import ONNX_RNG, assert_close_to, f32, make_onnx_model


def qdq_model(onnx):
    h = onnx.helper
    weight_int8 = ONNX_RNG.integers(-127, 128, (8, 4)).astype(np.int8)
    nodes = [
        h.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"], name="quant_x"),
        h.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"], name="dequant_x"),
        h.make_node(
            "DequantizeLinear", ["w_int8", "w_scale", "w_zero"], ["w_dq"], name="dequant_w", axis=1
        ),
        h.make_node("MatMul", ["x_dq", "w_dq"], ["h"], name="per_axis_matmul"),
        h.make_node(
            "QuantizeLinear", ["w2", "w2_scale", "w2_zero"], ["w2_q"], axis=1, block_size=3
        ),
        h.make_node(
            "DequantizeLinear",
            ["w2_q", "w2_scale", "w2_zero"],
            ["w2_dq"],
            name="dequant_w2",
            axis=1,
            block_size=3,
        ),
        h.make_node("Gemm", ["h", "w2_dq"], ["y"], name="blocked_gemm", transB=1),
    ]
    inits = [
        ("x_scale", np.array(0.02, np.float32)),
        ("x_zero", np.array(128, np.uint8)),
        ("w_int8", weight_int8),
        ("w_scale", np.array([0.01, 0.02, 0.03, 0.04], np.float32)),
        ("w_zero", np.zeros(4, np.int8)),
        ("w2", f32(6, 4)),
        ("w2_scale", np.array([[0.02, 0.05]] * 6, np.float32)),
        ("w2_zero", np.zeros((6, 2), np.int8)),
    ]
    return make_onnx_model(onnx, nodes, [("x", [3, 8])], ["y"], inits, opset=21), {"x": f32(3, 8)}


def test_qdq_specs_are_recognised(onnx, capture):
    model, feeds = qdq_model(onnx)
    trace = capture(model, feeds)
    matmul, gemm = trace.layers
    x_spec, w_spec = matmul.quant["input"], matmul.quant["weight"]
    assert isinstance(x_spec, QDQQuant) and (x_spec.dtype, x_spec.axis, x_spec.block_size) == (
        "uint8",
        None,
        0,
    )
    assert float(x_spec.scale) == np.float32(0.02) and int(x_spec.zero_point) == 128
    assert np.array_equal(matmul.input, feeds["x"])  # the float value before QuantizeLinear
    assert (w_spec.dtype, w_spec.axis, w_spec.block_size) == ("int8", 1, 0)
    assert (
        "weight_quantized" not in matmul.tensors
    )  # stored int8 weight: the operand is already dequantized
    blocked = gemm.quant["weight"]
    assert (blocked.dtype, blocked.axis, blocked.block_size, blocked.scale.shape) == (
        "int8",
        1,
        3,
        (6, 2),
    )
    assert matmul.source["quant_nodes"] == {"input": "quant_x", "weight": "dequant_w"}


def test_qdq_fake_quantize_reproduces_onnxruntime_bit_for_bit(onnx, capture):
    model, feeds = qdq_model(onnx)
    trace = capture(model, feeds)
    for layer in trace.layers:
        for operand in ("input", "weight"):
            quantized = layer.quantized(operand)
            if quantized is not None:
                assert np.array_equal(
                    layer.quant[operand].fake_quantize(layer.tensors[operand]), quantized
                )
        assert_close_to(gemm_reference(layer), layer.output)
    assert (
        trace.layers[0].quantized("input") is not None
        and trace.layers[1].quantized("weight") is not None
    )
