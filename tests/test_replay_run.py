"""Replay: layers equal mxsim.matmul bit for bit, conv equals a direct convolution, reports."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from mxsim import matmul
from mxsim.quantize import quantize
from mxsim.datapath import load_hwconfig
from mxsim.errors import MxsimError, TraceError
from mxsim.trace import Layer, MXQuant, Trace, conv2d_direct, load_trace
from mxsim.replay.run import format_report, replay, replay_layer, run_layer, write_plots

HW = {name: load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml") for name in ("ocp-exact", "h100-fp8", "kulisch", "mxdotp")}


def linear_layer(rng, spec_format="fp8_e4m3") -> Layer:
    x = rng.standard_normal((6, 70)).astype(np.float32)
    w = rng.standard_normal((5, 70)).astype(np.float32)
    tensors = {"input": x, "weight": w, "output": (x.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32)}
    quant = {"input": MXQuant(spec_format, axis=1, block_size=32), "weight": MXQuant(spec_format, axis=1, block_size=32),
             "bias": None}
    return Layer("fc", "linear", tensors, {}, quant, {})


def test_linear_layer_replays_as_matmul_bit_for_bit():
    layer = linear_layer(np.random.default_rng(1), "fp6_e2m3")
    result = replay_layer(layer, HW["ocp-exact"])
    qa = quantize(layer.input, "fp6_e2m3", axis=1)
    qb = quantize(layer.weight.T, "fp6_e2m3", axis=0)
    expected = matmul(HW["ocp-exact"], qa, qb).bits
    np.testing.assert_array_equal(result.bits[0], expected)
    assert result.input.format == "fp6_e2m3" and result.input.note == ""


def test_a_spec_the_unit_cannot_take_is_replaced_and_marked():
    layer = linear_layer(np.random.default_rng(2), "fp4_e2m1")
    result = replay_layer(layer, HW["h100-fp8"])
    assert result.input.format == "fp8_e4m3" and result.input.per_tensor_scale
    assert result.status == "replaced" and "cannot take fp4_e2m1 block 32" in result.input.note
    assert "no block scales" in result.input.note
    # the unit's operands are the public per-tensor quantization of the model's float operands
    qa = quantize(layer.input, "fp8_e4m3", axis=1, per_tensor_scale=True)
    qb = quantize(layer.weight.T, "fp8_e4m3", axis=0, per_tensor_scale=True)
    expected = matmul(HW["h100-fp8"], qa, qb)
    np.testing.assert_array_equal(result.bits[0], expected.bits)
    trace = Trace("t", [layer])
    report = replay(trace, [HW["ocp-exact"], HW["h100-fp8"]])
    text = format_report(report)
    row = next(line for line in text.splitlines() if "h100-fp8" in line and "fp8_e4m3/pt" in line)
    assert row.startswith("* fc") and "legend: * the unit cannot take" in text
    assert report["totals"]["h100-fp8"]["rows"]["replaced"] == 1
    assert report["layers"][0]["results"][1]["status"] == "replaced"
    with pytest.raises(MxsimError, match="cannot take fp4_e2m1.*strict"):
        replay(trace, [HW["ocp-exact"], HW["h100-fp8"]], strict=True)
    assert replay(trace, [HW["ocp-exact"]], strict=True)["totals"]["ocp-exact"]["rows"]["model"] == 1


def test_a_unit_that_takes_the_spec_equals_the_exact_ideal():
    # ocp-exact rounds once per block into fp32, kulisch once per output: on the model's own
    # operands kulisch is the ideal, bit for bit.
    layer = linear_layer(np.random.default_rng(8), "fp6_e3m2")
    exact = replay_layer(layer, HW["kulisch"])
    assert exact.status == "model" and exact.identical_to_ideal_fraction == 1.0 and exact.ideal_exact
    assert exact.sqnr_vs_ideal_db == float("inf") and exact.max_error_vs_ideal_ulps == 0
    blockwise = replay_layer(layer, HW["ocp-exact"])
    assert blockwise.max_error_vs_ideal_ulps <= 3 and blockwise.rel_rms_error_vs_ideal < 2.0**-20


@pytest.mark.parametrize("unit", ["kulisch", "ocp-exact", "mxdotp"])
def test_conv_layer_equals_an_independent_direct_convolution(unit):
    # Small integers (|v| <= 7) are exact fp8_e4m3 values under any block scale, so MX
    # quantization is the identity in every layout, and the float64 direct convolution is
    # exact: an exact unit must return it bit for bit (plus the bias, added in float64).
    rng = np.random.default_rng(3)
    x = rng.integers(-7, 8, size=(2, 6, 7, 7)).astype(np.float32)
    w = rng.integers(-7, 8, size=(4, 3, 3, 3)).astype(np.float32)
    bias = np.array([0.5, -1.0, 0.25, 2.0], dtype=np.float32)
    attrs = {"stride": [2, 1], "padding": [[1, 0], [2, 1]], "dilation": [1, 2], "groups": 2}
    probe = Layer("conv", "conv2d", {"input": x, "weight": w, "output": np.zeros(1, np.float32)}, attrs,
                  {"input": None, "weight": None, "bias": None}, {})
    expected = conv2d_direct(x, w, bias, probe.conv_geometry())
    layer = Layer("conv", "conv2d", {"input": x, "weight": w, "bias": bias, "output": expected.astype(np.float32)},
                  attrs, {"input": None, "weight": None, "bias": None}, {})
    values = run_layer(layer, HW[unit]).values
    np.testing.assert_array_equal(values, expected)
    assert replay_layer(layer, HW[unit]).sqnr_vs_float_db == float("inf")


def test_digits_sample_replays_end_to_end(tmp_path):
    trace = load_trace(REPO / "traces" / "digits-cnn")
    report = replay(trace, [HW["ocp-exact"], HW["h100-fp8"], HW["mxdotp"]], end_to_end=True)
    assert [entry["layer"] for entry in report["layers"]] == [layer.name for layer in trace.layers]
    e2e = report["end_to_end"]
    assert e2e["float_accuracy"] == pytest.approx(trace.metadata["float_accuracy"])
    for name in ("ocp-exact", "h100-fp8", "mxdotp"):
        assert abs(e2e["accuracy"][name] - e2e["float_accuracy"]) < 0.05
        assert report["totals"][name]["worst_layer_sqnr_vs_float_db"] > 20
    assert report["totals"]["mxdotp"]["cycles"] > 0 and report["totals"]["ocp-exact"]["cycles"] is None
    pair = next(p for p in report["agreement"] if p["units"] == ["ocp-exact", "mxdotp"])
    assert 0.9 < pair["bit_identical_fraction"] <= 1.0
    text = format_report(report)
    assert "end to end: float accuracy" in text and "bit-identical outputs" in text
    plots = write_plots(report, tmp_path / "plots")
    assert len(plots) == 1 + 4 and all(open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n" for p in plots)
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "000-conv1.png", "001-conv2.png", "002-fc1.png", "003-fc2.png", "overview.png"]
    report.pop("_results")
    json.dumps(report, default=str)


def test_report_names_formats_and_plot_paths(tmp_path):
    # ONNX names start with "/" and repeat their prefix: the table shows them whole, the
    # plots take sanitised names inside the directory, and worst layers are ranked.
    rng = np.random.default_rng(9)
    layers = []
    for suffix in ("q", "k"):
        layer = linear_layer(rng)
        layers.append(Layer(f"/m/transformer/h.0/attn/{suffix}_proj/MatMul", layer.op, layer.tensors, layer.attrs,
                            layer.quant, {}))
    report = replay(Trace("onnx", layers), [HW["ocp-exact"]])
    text = format_report(report)
    for layer in layers:
        assert any(line.startswith(f"  {layer.name} ") for line in text.splitlines())
    assert "fp8_e4m3/32 x fp8_e4m3/32" in text and "worst layers on ocp-exact" in text
    worst = report["worst"]["ocp-exact"]
    assert [w["k"] for w in worst] == [70, 70] and worst[0]["sqnr_vs_float_db"] <= worst[1]["sqnr_vs_float_db"]
    directory = tmp_path / "plots"
    written = write_plots(report, directory)
    assert all(Path(p).parent == directory.resolve() for p in written)
    assert sorted(p.name for p in directory.iterdir()) == [
        "000-m_transformer_h.0_attn_q_proj_MatMul.png", "001-m_transformer_h.0_attn_k_proj_MatMul.png",
        "overview.png"]


def test_replay_errors():
    trace = load_trace(REPO / "traces" / "digits-cnn")
    with pytest.raises(MxsimError, match="at least one"):
        replay(trace, [])
    with pytest.raises(MxsimError, match="distinct names"):
        replay(trace, [HW["kulisch"], HW["kulisch"]])
    with pytest.raises(TraceError):
        load_trace(REPO / "traces" / "no-such-trace")
    assert isinstance(trace, Trace)


def test_real_model_replays_under_several_units():
    # PaddleOCR's text-direction classifier, shipped in the rapidocr_onnxruntime wheel.
    trace = load_trace(REPO / "traces" / "ppocr-cls")
    report = replay(trace, [HW["ocp-exact"], HW["h100-fp8"]])
    assert len(report["layers"]) == len(trace.layers) >= 5
    for name in ("ocp-exact", "h100-fp8"):
        assert report["totals"][name]["worst_layer_sqnr_vs_float_db"] > 10


def test_element_format_override():
    trace = load_trace(REPO / "traces" / "digits-cnn")
    report = replay(trace, [HW["ocp-exact"]], element_format="fp4_e2m1")
    assert {r["input"]["format"] for entry in report["layers"] for r in entry["results"]} == {"fp4_e2m1"}
    with pytest.raises(MxsimError, match="does not take fp4_e2m1"):
        replay(trace, [HW["h100-fp8"]], element_format="fp4_e2m1")


@pytest.mark.parametrize("fmt, least_db", [("bf16", 45.0), ("fp16", 60.0), ("tf32", 60.0)])
def test_wide_formats_on_a_unit_without_block_scales_are_cast_not_scaled(fmt, least_db):
    """fp16/bf16/tf32 operands of an H100 take the values rounded straight in (label ``cast``):
    scaled up to bf16's or tf32's largest values, the products would overflow the fp32 sums.
    A cast of a few-bit-mantissa format keeps about 6 dB per bit of the float result."""
    trace = load_trace(REPO / "traces" / "digits-cnn")
    report = replay(trace, [load_hwconfig(REPO / "hwconfigs" / "h100.yaml")], element_format=fmt)
    rows = [r for entry in report["layers"] for r in entry["results"]]
    assert {(r["input"]["tensor_scale_exponent"], r["weight"]["tensor_scale_exponent"]) for r in rows} == {(0, 0)}
    assert min(r["sqnr_vs_float_db"] for r in rows) > least_db


def test_bfp_spec_replays_with_microexponents():
    from mxsim import quantize_bfp
    from mxsim.trace import BFPQuant

    layer = linear_layer(np.random.default_rng(4))
    layer = Layer(layer.name, layer.op, layer.tensors, layer.attrs,
                  {"input": BFPQuant("MX9", axis=1), "weight": BFPQuant("MX6", axis=1), "bias": None}, {})
    unit = load_hwconfig(REPO / "hwconfigs" / "bfp-exact.yaml")
    result = replay_layer(layer, unit)
    assert (result.input.format, result.weight.format) == ("mx9", "mx6") and result.status == "model"
    qa = quantize_bfp(layer.input, "MX9", axis=1).as_mx_tensor()
    qb = quantize_bfp(layer.weight.T, "MX6", axis=0).as_mx_tensor()
    np.testing.assert_array_equal(result.bits[0], matmul(unit, qa, qb).bits)


def test_the_ideal_of_a_row_is_that_of_the_operands_the_unit_got():
    # digits-cnn is a float model: every unit gets replay's quantization ("added" rows), and the
    # ideal is the exact result of those operands, so an exact unit equals it bit for bit and
    # the per-tensor FP8 unit (whose adder keeps about 13 fraction bits) stays within a relative
    # RMS error of 2^-10 of it.
    trace = load_trace(REPO / "traces" / "digits-cnn")
    for layer in trace.layers:
        exact = replay_layer(layer, HW["kulisch"])
        assert exact.status == "added" and exact.identical_to_ideal_fraction == 1.0 and exact.ideal_exact
        fp8 = replay_layer(layer, HW["h100-fp8"])
        assert fp8.input.per_tensor_scale and fp8.max_error_vs_ideal_ulps > 0 and fp8.rel_rms_error_vs_ideal < 2**-10
        assert fp8.sqnr_vs_ideal_db > fp8.sqnr_vs_float_db + 30  # arithmetic error far below quantization error


def test_a_finer_model_block_than_the_unit_block_is_replaced():
    layer = linear_layer(np.random.default_rng(10), "fp4_e2m1")
    spec = MXQuant("fp4_e2m1", axis=1, block_size=16)
    layer = Layer(layer.name, layer.op, layer.tensors, layer.attrs, {"input": spec, "weight": spec}, {})
    result = replay_layer(layer, HW["ocp-exact"])
    assert result.status == "replaced" and "blocks of 32 do not fit" in result.input.note
    assert result.input.format == "fp4_e2m1" and not result.input.per_tensor_scale
    coarse = MXQuant("fp4_e2m1", axis=1, block_size=64)  # whole unit blocks inside each model block
    layer = Layer(layer.name, layer.op, layer.tensors, layer.attrs, {"input": coarse, "weight": coarse}, {})
    result = replay_layer(layer, HW["ocp-exact"])
    assert result.status == "model"
    assert result.input.saturated + result.input.underflowed > 0
    assert replay_layer(layer, HW["kulisch"]).identical_to_ideal_fraction == 1.0


def test_compile_time_is_reported_apart_from_run_time(monkeypatch):
    """A layer's seconds leave out the time spent compiling kernels, which is reported apart."""
    import time

    import mxsim.replay.run as replay_module

    compiled = [0.0]
    real_run_layer = replay_module.run_layer

    def compiling_run_layer(*args, **kwargs):
        time.sleep(0.3)  # stands for a compile, as the compile-event listener would count it
        compiled[0] += 0.3
        return real_run_layer(*args, **kwargs)

    monkeypatch.setattr(replay_module, "run_layer", compiling_run_layer)
    monkeypatch.setattr(replay_module, "compile_seconds", lambda: compiled[0])
    trace = Trace("t", [linear_layer(np.random.default_rng(2))])
    start = time.perf_counter()
    report = replay(trace, [HW["ocp-exact"]])
    wall = time.perf_counter() - start
    result = report["_results"]["ocp-exact"][0]
    assert result.compile_seconds == pytest.approx(0.3)
    assert 0.0 < result.seconds <= wall - 0.3  # the sleep is not in the run time
    assert report["totals"]["ocp-exact"]["compile_seconds"] == pytest.approx(0.3)
    assert "(+ 0.3 s compiling kernels)" in format_report(report)
    monkeypatch.setattr(replay_module, "run_layer", real_run_layer)
    quiet = replay(trace, [HW["ocp-exact"]])
    assert quiet["totals"]["ocp-exact"]["compile_seconds"] == 0.0 and "compiling" not in format_report(quiet)
