"""mxsim.capture.onnx_quark: Quark's custom quantizer ops read as mxsim specs and computed like Quark's runtime."""

from __future__ import annotations

import numpy as np
import pytest

from mxsim import BFP_SPECS, fake_quantize, quantize_bfp
from mxsim.errors import MxsimError
from mxsim.trace import BFPQuant, MXQuant
from mxsim.replay.lowering import gemm_reference

from conftest import (
    assert_close_to,
    f32,
    layer_node_outputs,
    make_onnx_model,
    onnx_reference_values,
)


def quark_model(onnx, legacy=False):
    """MX and BFP custom nodes on activations and on weights (one from a Constant node), including a
    two-node chain (MX fp6 then BFP MX9) that needs three onnxruntime stages."""
    h = onnx.helper
    quark = "com.amd.quark"
    conv_weight = h.make_node(
        "Constant", [], ["conv_w"], value=onnx.numpy_helper.from_array(f32(8, 16, 3, 3), "v")
    )
    first_mx = ("MXFixNeuron", "com.vai.quantize") if legacy else ("MXQuantizeDequantize", quark)
    nodes = [
        h.make_node(
            first_mx[0],
            ["x"],
            ["x_mx"],
            name="mx_fp8_act",
            domain=first_mx[1],
            element_dtype="fp8_e4m3",
            axis=1,
            block_size=8,
            rounding_mode=2,
        ),
        conv_weight,
        h.make_node(
            "BFPQuantizeDequantize",
            ["conv_w"],
            ["conv_w_q"],
            name="mx6_weight",
            domain=quark,
            bfp_method="to_bfp_prime",
            bit_width=13,
            block_size=16,
            sub_block_size=2,
            sub_block_shift_bits=1,
            rounding_mode=2,
            axis=1,
        ),
        h.make_node("Conv", ["x_mx", "conv_w_q", "conv_b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c"], ["r"]),
        h.make_node("Flatten", ["r"], ["f"]),
        h.make_node(
            "MXQuantizeDequantize",
            ["f"],
            ["f_q"],
            name="mxint8_act",
            domain=quark,
            element_dtype="int8",
            axis=1,
            block_size=32,
            rounding_mode=1,
        ),
        h.make_node(
            "MXQuantizeDequantize",
            ["mm_w"],
            ["mm_w_q"],
            name="fp4_weight",
            domain=quark,
            element_dtype="fp4_e2m1",
            axis=0,
            block_size=32,
            rounding_mode=2,
        ),
        h.make_node("MatMul", ["f_q", "mm_w_q"], ["mm"], name="matmul"),
        h.make_node("Add", ["mm", "mm_b"], ["h"]),
        h.make_node(
            "MXQuantizeDequantize",
            ["h"],
            ["h_fp6"],
            name="fp6_act",
            domain=quark,
            element_dtype="fp6_e3m2",
            axis=1,
            block_size=32,
        ),
        h.make_node(
            "BFPQuantizeDequantize",
            ["h_fp6"],
            ["h_mx9"],
            name="mx9_act",
            domain=quark,
            bfp_method="to_bfp_prime",
            bit_width=16,
            block_size=16,
            sub_block_size=2,
            sub_block_shift_bits=1,
            axis=1,
        ),
        h.make_node(
            "BFPQuantizeDequantize",
            ["gemm_w"],
            ["gemm_w_q"],
            name="bfp16_weight",
            domain=quark,
            bfp_method="to_bfp",
            bit_width=16,
            block_size=8,
            axis=0,
        ),
        h.make_node("Gemm", ["h_mx9", "gemm_w_q"], ["y"], name="gemm"),
    ]
    inits = [
        ("conv_b", f32(8)),
        ("mm_w", f32(288, 10, scale=0.1)),
        ("mm_b", f32(10)),
        ("gemm_w", f32(10, 5)),
    ]
    model = make_onnx_model(
        onnx,
        nodes,
        [("x", [2, 16, 6, 6])],
        ["y"],
        inits,
        extra_domains=("com.vai.quantize",) if legacy else (quark,),
    )
    return model, {"x": f32(2, 16, 6, 6)}


@pytest.mark.parametrize("legacy", [False, True])
def test_quark_custom_ops_import_with_their_formats(onnx, capture, legacy):
    model, feeds = quark_model(onnx, legacy)
    conv, matmul, gemm = capture(model, feeds).layers
    assert conv.quant["input"] == MXQuant(
        "fp8_e4m3", 1, 8, "quark-onnx", bypass_single_element=True
    )
    assert conv.quant["weight"] == BFPQuant(
        BFP_SPECS["MX6"].replace(rounding_mode=2), 1, bypass_single_element=True
    )
    assert conv.quant["weight"].name == "MX6" and conv.quant["bias"] is None
    assert matmul.quant["input"] == MXQuant(
        "int8",
        1,
        32,
        "quark-onnx",
        {"element_rounding": "nearest_toward_positive", "zero_signs": (("int8", "input"),)},
        bypass_single_element=True,
    )
    assert matmul.quant["weight"] == MXQuant(
        "fp4_e2m1", 0, 32, "quark-onnx", bypass_single_element=True
    )
    assert gemm.quant["input"] == BFPQuant("MX9", 1, bypass_single_element=True)
    # Gemm with transB=0: the (K, N) weight is stored as (N, K), so its block axis 0 (K) becomes 1
    assert gemm.quant["weight"] == BFPQuant("BFP16", 1, bypass_single_element=True)
    assert gemm.weight.shape == (5, 10) and gemm.quant["weight"].spec.kernel == "cpu"
    assert conv.source["quant_nodes"] == {"input": "mx_fp8_act", "weight": "mx6_weight"}


def test_quark_quantized_operands_are_mxsims_quantizers_applied_to_the_captured_floats(
    onnx, capture
):
    model, feeds = quark_model(onnx)
    conv, matmul, gemm = capture(model, feeds).layers
    assert np.array_equal(conv.input, feeds["x"])
    assert np.array_equal(
        conv.quantized("input"),
        fake_quantize(feeds["x"], "fp8_e4m3", axis=1, block_size=8, profile="quark-onnx").astype(
            np.float32
        ),
    )
    assert np.array_equal(
        conv.quantized("weight"),
        quantize_bfp(conv.weight, BFP_SPECS["MX6"].replace(rounding_mode=2), axis=1).dequantize(),
    )
    for layer in (conv, matmul, gemm):
        for operand in ("input", "weight"):
            spec = layer.quant[operand]
            assert np.array_equal(
                np.float32(spec.fake_quantize(layer.tensors[operand])), layer.quantized(operand)
            )
    # the chain before the Gemm: fp6 MX (first custom node) then MX9 (the one next to the Gemm)
    fp6 = fake_quantize(
        matmul.output, "fp6_e3m2", axis=1, block_size=32, profile="quark-onnx"
    ).astype(np.float32)
    assert np.array_equal(gemm.input, fp6)
    # every stage boundary carries the exact values: relu/flatten of the conv output feed the matmul
    assert np.array_equal(matmul.input, np.maximum(conv.output, 0).reshape(2, -1))


def test_quark_model_outputs_equal_the_gemm_view_of_the_quantized_operands(onnx, capture):
    model, feeds = quark_model(onnx)
    for layer in capture(model, feeds).layers:
        assert_close_to(layer.output, gemm_reference(layer))


def test_bfp_kernel_choice_is_recorded(onnx, capture):
    model, feeds = quark_model(onnx)
    conv = capture(model, feeds, bfp_kernel="cuda").layers[0]
    assert conv.quant["weight"].spec.kernel == "cuda"  # rounding_mode 2 reads as stochastic there


def test_single_element_tensors_bypass_quark_quantizers_like_quark(onnx):
    from mxsim.capture.onnx_quark import evaluate_quark

    node = onnx.helper.make_node(
        "MXQuantizeDequantize",
        ["a"],
        ["b"],
        domain="com.amd.quark",
        element_dtype="fp4_e2m1",
        block_size=1,
    )
    assert evaluate_quark(node, np.array([7.0], np.float32), "cpu").tolist() == [7.0]
    assert evaluate_quark(node, np.array([7.0, 7.0], np.float32), "cpu").tolist() == [6.0, 6.0]


def test_unsupported_quark_op_is_named(onnx, capture):
    h = onnx.helper
    nodes = [
        h.make_node(
            "ExtendedQuantizeLinear", ["x", "s", "z"], ["q"], name="ext", domain="com.amd.quark"
        ),
        h.make_node("MatMul", ["q", "w"], ["y"]),
    ]
    model = make_onnx_model(
        onnx,
        nodes,
        [("x", [2, 3])],
        ["y"],
        [("s", np.array(1.0, np.float32)), ("z", np.array(0, np.int8)), ("w", f32(3, 2))],
        extra_domains=("com.amd.quark",),
    )
    with pytest.raises(
        MxsimError, match="node 'ext': com.amd.quark::ExtendedQuantizeLinear needs Quark"
    ):
        capture(model, {"x": f32(2, 3)})


def test_invalid_quark_attributes_are_named(onnx, capture):
    h = onnx.helper
    nodes = [
        h.make_node(
            "MXQuantizeDequantize",
            ["x"],
            ["q"],
            name="bad",
            domain="com.amd.quark",
            element_dtype="fp5_e2m2",
        ),
        h.make_node("MatMul", ["q", "w"], ["y"]),
    ]
    model = make_onnx_model(
        onnx, nodes, [("x", [2, 3])], ["y"], [("w", f32(3, 2))], extra_domains=("com.amd.quark",)
    )
    with pytest.raises(MxsimError, match="node 'bad'.*unknown format 'fp5_e2m2'"):
        capture(model, {"x": f32(2, 3)})


def test_quark_quantizers_on_rank0_and_one_element_constants_pass_through_like_quarks_runtime(
    onnx, ort, capture
):
    h = onnx.helper
    quark = "com.amd.quark"
    nodes = [
        h.make_node(
            "MXQuantizeDequantize",
            ["three"],
            ["three_q"],
            name="Constant@1_DequantizeLinear",
            domain=quark,
            element_dtype="fp4_e2m1",
            axis=0,
            block_size=32,
        ),
        h.make_node(
            "MXQuantizeDequantize",
            ["sixes"],
            ["sixes_q"],
            name="one_element",
            domain=quark,
            element_dtype="fp4_e2m1",
            axis=1,
            block_size=32,
        ),
        h.make_node(
            "BFPQuantizeDequantize",
            ["half"],
            ["half_q"],
            name="bfp_rank0",
            domain=quark,
            bfp_method="to_bfp",
            bit_width=12,
            block_size=8,
            axis=1,
        ),
        h.make_node("Add", ["x", "three_q"], ["shifted"]),
        h.make_node("Mul", ["shifted", "sixes_q"], ["scaled"]),
        h.make_node("Mul", ["scaled", "half_q"], ["halved"]),
        h.make_node(
            "MXQuantizeDequantize",
            ["halved"],
            ["act_q"],
            name="act",
            domain=quark,
            element_dtype="fp4_e2m1",
            axis=1,
            block_size=32,
        ),
        h.make_node("MatMul", ["act_q", "w"], ["y"], name="mm"),
    ]
    # values that fp4 / 12-bit BFP would change if they were quantized: 3.3 -> 3, 6.3 -> 6
    inits = [
        ("three", np.array(3.3, np.float32)),
        ("sixes", np.full((1, 1), 6.3, np.float32)),
        ("half", np.array(0.5123456, np.float32)),
        ("w", f32(4, 3)),
    ]
    model = make_onnx_model(onnx, nodes, [("x", [2, 4])], ["y"], inits, extra_domains=(quark,))
    feeds = {"x": f32(2, 4)}
    trace = capture(model, feeds)  # a rank-0 constant has no axis 0: passed through
    quark_values = onnx_reference_values(onnx, ort, model, ["halved", "y"], feeds, quark_ops=True)
    layer = trace.layers[0]
    assert np.array_equal(layer.input, quark_values["halved"])
    assert np.array_equal(
        layer.input, (feeds["x"] + np.float32(3.3)) * np.float32(6.3) * np.float32(0.5123456)
    )
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
    torch.onnx.export(
        Net().eval(), (x,), str(path), dynamo=False, opset_version=17, input_names=["x"]
    )
    return path, x.numpy()


@pytest.mark.parametrize("config", ["MXFP8E4M3", "MXFP4E2M1", "MXINT8"])
def test_amd_quark_quantized_model_captures_and_matches_quarks_runtime(
    onnx, ort, capture, hardswish_model, config, tmp_path, monkeypatch
):
    quark_onnx = pytest.importorskip("quark.onnx")
    monkeypatch.chdir(
        tmp_path
    )  # the quantizer writes a report (quantized_info.csv) into the working directory
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
    quark_onnx.ModelQuantizer(
        Config(global_quant_config=get_default_config(config))
    ).quantize_model(str(path), str(quantized), Reader())
    model = onnx.load(str(quantized))
    rank0 = {t.name for t in model.graph.initializer if not t.dims}
    rank0 |= {
        n.output[0]
        for n in model.graph.node
        if n.op_type == "Constant" and not onnx.numpy_helper.to_array(n.attribute[0].t).shape
    }
    assert any(
        n.domain == "com.amd.quark" and n.input[0] in rank0 for n in model.graph.node
    )  # hardswish's 3 and 6
    trace = capture(str(quantized), {"x": x})
    assert [layer.op for layer in trace.layers] == ["conv2d", "conv_transpose2d", "linear"]
    assert all(isinstance(layer.quant["weight"], MXQuant) for layer in trace.layers)
    outputs = layer_node_outputs(model, trace)
    quark_values = onnx_reference_values(
        onnx, ort, model, list(outputs.values()), {"x": x}, quark_ops=True
    )
    for layer in trace.layers:
        assert np.array_equal(layer.output, quark_values[outputs[layer.name]]), layer.name


@pytest.mark.parametrize("rounding_mode", [0, 1, 2])
def test_mxint8_zero_signs_follow_quarks_runtime_for_every_rounding_mode(
    onnx, ort, capture, rounding_mode
):
    # Elements far below a block's step round to zero: Quark's std::round (0) and dpu_round (1)
    # keep the input's sign there, its py3_round (2) gives +0.0.
    h = onnx.helper
    nodes = [
        h.make_node(
            "MXQuantizeDequantize",
            ["x"],
            ["x_q"],
            name="mxint8",
            domain="com.amd.quark",
            element_dtype="int8",
            axis=1,
            block_size=32,
            rounding_mode=rounding_mode,
        ),
        h.make_node("MatMul", ["x_q", "w"], ["y"], name="mm"),
    ]
    model = make_onnx_model(
        onnx, nodes, [("x", [4, 32])], ["y"], [("w", f32(32, 3))], extra_domains=("com.amd.quark",)
    )
    x = np.zeros((4, 32), np.float32)
    x[:, 0] = 100.0
    x[:, 1:] = np.linspace(-0.4, 0.4, 31, dtype=np.float32)
    x[1, 1:] *= -1
    (layer,) = capture(model, {"x": x}).layers
    quark = onnx_reference_values(onnx, ort, model, ["x_q"], {"x": x}, quark_ops=True)["x_q"]
    # step 2^0 (block max 100): 4 rows x 15 negative inputs round to zero, and row 1 holds one -0.0 input
    negative_zeros = int(((quark == 0) & np.signbit(quark)).sum())
    assert negative_zeros == (61 if rounding_mode < 2 else 1)
    assert np.array_equal(layer.quantized("input").view(np.uint32), quark.view(np.uint32))
