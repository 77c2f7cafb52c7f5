"""mxsim.capture.onnx: capture_onnx end to end on shipped and real models, and load_inputs_npz."""

from __future__ import annotations

import numpy as np
import pytest

from mxsim import BFP_SPECS
from mxsim.errors import MxsimError
from mxsim.trace import BFPQuant, MXQuant, load_trace
from mxsim.replay.lowering import gemm_reference

from conftest import REPO, assert_close_to


DATA = REPO / "tests" / "data" / "trace"
PPOCR_MODEL = DATA / "ppocr_cls" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"


def test_digits_onnx_export_captures_like_the_torch_trace(capture):
    torch_trace = load_trace(REPO / "traces" / "digits-cnn")
    trace = capture(DATA / "digits_cnn.onnx", {"image": torch_trace.dataset["inputs"]})
    assert [layer.op for layer in trace.layers] == [layer.op for layer in torch_trace.layers]
    for ours, theirs in zip(trace.layers, torch_trace.layers):
        assert ours.attrs == theirs.attrs
        assert np.array_equal(ours.weight, theirs.weight) and np.array_equal(ours.bias, theirs.bias)
        assert_close_to(ours.input, theirs.input)
        assert_close_to(ours.output, theirs.output)
    assert trace.source["sha256"] and trace.source["inputs"] == {
        "image": {"shape": [360, 1, 8, 8], "dtype": "float32"}
    }


def test_shipped_quark_style_digits_model_replays_with_its_own_formats(capture):
    from mxsim.capture.onnx import load_inputs_npz

    trace = capture(DATA / "digits_cnn_quark.onnx", load_inputs_npz(DATA / "digits_inputs.npz"))
    mxfp8 = MXQuant("fp8_e4m3", 1, 32, "quark-onnx", bypass_single_element=True)
    mx6 = BFPQuant(BFP_SPECS["MX6"].replace(rounding_mode=2), 1, bypass_single_element=True)
    mxint8 = MXQuant(
        "int8",
        1,
        32,
        "quark-onnx",
        {"element_rounding": "nearest_even"},
        bypass_single_element=True,
    )
    assert [(layer.quant["input"], layer.quant["weight"]) for layer in trace.layers] == [
        (mxfp8, mx6),
        (mxfp8, mx6),
        (mxfp8, mxint8),
        (mxfp8, mxint8),
    ]
    for layer in trace.layers:
        for operand in ("input", "weight"):
            spec = layer.quant[operand]
            assert np.array_equal(
                np.float32(spec.fake_quantize(layer.tensors[operand])), layer.quantized(operand)
            )
    labels = load_trace(REPO / "traces" / "digits-cnn").dataset["labels"][:16]
    assert (
        np.sum(trace.layers[-1].output.argmax(axis=1) == labels) >= 15
    )  # quantized, still a digit classifier


def test_load_inputs_npz_never_unpickles(capture, tmp_path):
    from mxsim.capture.onnx import load_inputs_npz

    assert set(load_inputs_npz(DATA / "digits_inputs.npz")) == {"image"}
    np.savez(tmp_path / "evil.npz", image=np.array([object()], dtype=object))
    with pytest.raises(
        MxsimError, match=r"is a pickled \(object\) array in .*; mxsim never unpickles"
    ):
        load_inputs_npz(tmp_path / "evil.npz")
    np.save(tmp_path / "single.npy", np.zeros(2))
    with pytest.raises(MxsimError, match="is a single .npy array, not an NPZ archive"):
        load_inputs_npz(tmp_path / "single.npy")


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
    assert (
        sum(layer.op == "conv2d" and layer.attrs["groups"] > 1 for layer in trace.layers) == 11
    )  # depthwise
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
