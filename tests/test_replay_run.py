"""Replay: layers equal mxsim.matmul bit for bit, conv equals a direct convolution, reports."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, fail_replay_of_layer
from mxsim import matmul
from mxsim.quantize import quantize
from mxsim.datapath import load_hwconfig
from mxsim.errors import MxsimError, TraceError
from mxsim.trace import Layer, MXQuant, Trace, conv2d_direct, load_trace
from mxsim.replay.operands import ideal_gemm, layer_operands
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


def test_an_added_operand_takes_a_format_that_pairs_with_the_other():
    """h100 mixes only its FP8 formats (inputs.format_groups): an E5M2 input with float weights
    gets E4M3 weights, the first of its B formats pairing with E5M2, not its first B format
    (fp16, a pair no instruction takes)."""
    h100 = load_hwconfig(REPO / "hwconfigs" / "h100.yaml")
    layer = linear_layer(np.random.default_rng(3), "fp8_e5m2")
    layer.quant["weight"] = None
    result = run_layer(layer, h100)
    assert (result.input.format, result.weight.format) == ("fp8_e5m2", "fp8_e4m3")
    assert result.weight.status == "added" and "fp8_e4m3, the first format pairing with the input's fp8_e5m2" in result.weight.note
    qa = quantize(layer.input, "fp8_e5m2", axis=1, per_tensor_scale=True)
    qb = quantize(layer.weight.T, "fp8_e4m3", axis=0, per_tensor_scale=True)
    np.testing.assert_array_equal(result.bits[0], matmul(h100, qa, qb).bits)
    with pytest.raises(MxsimError, match=r"^layer 'fc' on h100: takes no fp8_e4m3 x fp16 pair \(input x weight\) and "
                                         r"neither format is replay's to change; it takes fp16 x fp16, "):
        run_layer(layer, h100, element_format="fp8_e4m3", weight_format="fp16")


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


@pytest.fixture
def layer_calls(monkeypatch):
    """The layers replay computes (each call of replay_layer_on_units, by layer name)."""
    from mxsim.replay import run as run_module

    calls = []
    real = run_module.replay_layer_on_units

    def recording(layer, *args):
        calls.append(layer.name)
        return real(layer, *args)

    monkeypatch.setattr(run_module, "replay_layer_on_units", recording)
    return calls


def test_requests_that_cannot_be_met_are_refused_before_any_layer_runs(layer_calls):
    trace = Trace("t", [linear_layer(np.random.default_rng(3), "fp4_e2m1")])
    with pytest.raises(MxsimError, match="end to end needs a network with labels .* this trace has no network"):
        replay(trace, [HW["ocp-exact"]], end_to_end=True)
    with pytest.raises(MxsimError, match="layer 'fc' on h100-fp8: the unit cannot take fp4_e2m1 block 32.*strict"):
        replay(trace, [HW["ocp-exact"], HW["h100-fp8"]], strict=True)
    with pytest.raises(MxsimError, match="h100-fp8 does not take fp4_e2m1 for the input"):
        replay(trace, [HW["ocp-exact"], HW["h100-fp8"]], element_format="fp4_e2m1")
    with pytest.raises(MxsimError, match="conv order"):
        replay(trace, [HW["ocp-exact"]], conv_order="nchw")
    assert layer_calls == []
    replay(trace, [HW["ocp-exact"]], strict=True)  # ocp-exact takes the spec: strict passes
    assert layer_calls == ["fc"]


def test_strict_checked_before_work_agrees_with_the_rows_replay_marks():
    """The plan from the specs alone (before work) marks exactly the rows replay marks."""
    from mxsim.replay.operands import layer_operands, operand_plans

    from conftest import sample_trace

    trace = load_trace(REPO / "traces" / "digits-cnn")
    sample = load_trace(REPO / "traces" / "ppocr-cls")
    # hand-made: MX input with a BFP (MX6) conv weight, QDQ, a batched matmul, a grouped conv_transpose2d
    for layer in trace.layers + sample.layers + sample_trace().layers:
        for order in ("kh_kw_c", "c_kh_kw"):
            plans, operands = operand_plans(layer, order), layer_operands(layer, order)
            for name, operand in (("input", operands.a), ("weight", operands.b)):
                plan = plans[name]
                assert (plan.element_format, plan.quantized, plan.granule, plan.spec, plan.layout) == (
                    operand.element_format, operand.quantized, operand.granule, operand.spec, operand.layout)


def test_a_failure_after_work_keeps_the_finished_layers(monkeypatch):
    from mxsim.errors import IncompleteResultError

    rng = np.random.default_rng(4)
    good, bad = linear_layer(rng), linear_layer(rng)
    bad.name = "bad"
    fail_replay_of_layer(monkeypatch, "bad", "this layer fails")
    with pytest.raises(IncompleteResultError, match="1 of 2 replay tasks failed: layer bad: this layer fails") as caught:
        replay(Trace("t", [good, bad]), [HW["ocp-exact"]])
    partial = caught.value.partial
    assert [entry["layer"] for entry in partial["layers"]] == ["fc"]
    assert partial["failures"] == [{"task": "layer bad", "error": "this layer fails"}]
    assert "FAILED layer bad: this layer fails" in format_report(partial)


def test_totals_give_mean_and_median_layer_sqnr_and_what_was_replaced():
    rng = np.random.default_rng(5)
    layers = []
    for index, fmt in enumerate(("fp8_e4m3", "fp6_e2m3", "fp4_e2m1")):
        layer = linear_layer(rng, fmt)
        layer.name = f"fc{index}"
        layers.append(layer)
    report = replay(Trace("t", layers), [HW["ocp-exact"], HW["h100-fp8"]])
    for unit in ("ocp-exact", "h100-fp8"):
        sqnrs = [entry["results"][report["units"].index(unit)]["sqnr_vs_float_db"] for entry in report["layers"]]
        total = report["totals"][unit]
        assert total["mean_layer_sqnr_vs_float_db"] == pytest.approx(sum(sqnrs) / 3)
        assert total["median_layer_sqnr_vs_float_db"] == sorted(sqnrs)[1]
        assert total["worst_layer_sqnr_vs_float_db"] == min(sqnrs)
    assert report["totals"]["ocp-exact"]["replaced"] == []
    assert report["totals"]["h100-fp8"]["replaced"] == [  # no block scales: even fp8 blocks are re-quantized
        "fp4_e2m1 block 32 -> fp8_e4m3/pt", "fp6_e2m3 block 32 -> fp8_e4m3/pt", "fp8_e4m3 block 32 -> fp8_e4m3/pt"]
    totals_line = next(line for line in format_report(report).splitlines() if line.startswith("total h100-fp8"))
    assert "/ median" in totals_line and "/ mean" in totals_line
    assert "(* re-quantized by replay: fp4_e2m1 block 32 -> fp8_e4m3/pt; fp6_e2m3 block 32 -> fp8_e4m3/pt; " \
           "fp8_e4m3 block 32 -> fp8_e4m3/pt)" in totals_line


def test_select_layers_by_regular_expression():
    from mxsim.replay.run import select_layers

    trace = load_trace(REPO / "traces" / "digits-cnn")
    subset = select_layers(trace, r"^fc")
    assert [layer.name for layer in subset.layers] == ["fc1", "fc2"] and subset.network is None
    assert [layer.name for layer in trace.layers] == ["conv1", "conv2", "fc1", "fc2"]  # the trace is kept
    with pytest.raises(MxsimError, match="matches none of the trace's 4 layers"):
        select_layers(trace, "attention")
    with pytest.raises(MxsimError, match="not a regular expression"):
        select_layers(trace, "conv(")


def test_the_plot_ceiling_is_shared_by_every_unit():
    from mxsim.replay.run import plot_ceiling

    # one unit identical everywhere (inf), another with finite rows: inf is drawn above them all
    assert plot_ceiling([float("inf"), float("inf"), 40.0, 75.5]) == 85.5
    assert plot_ceiling([float("inf")]) == 200.0


def test_a_compact_trace_replays_bit_for_bit_and_says_which_reference_it_carries(tmp_path):
    """Residual reference outputs: the unit's bits are the full trace's; SQNR vs float moves by
    no more than the reconstruction bound allows (docs/trace-format.md, "Reference outputs")."""
    from mxsim.trace import save_trace

    rng = np.random.default_rng(23)
    layers = []
    for name in ("fc", "fc2"):
        layer = linear_layer(rng)
        layer.name = name
        layers.append(layer)
    trace = Trace("residual", layers)
    full = load_trace(save_trace(trace, tmp_path / "full"))
    compact = load_trace(save_trace(trace, tmp_path / "compact", floats=False))
    reports = [replay(t, [HW["mxdotp"]]) for t in (full, compact)]
    assert [r["references"] for r in reports] == [{"float32": 2}, {"residual8": 2}]
    assert [entry["reference"] for entry in reports[1]["layers"]] == ["residual8", "residual8"]
    assert "float reference outputs: 2 float32 (exact)" in format_report(reports[0])
    assert "float reference outputs: 2 residual8 (reconstructed within 2^-8 of the quantization error's RMS)" \
        in format_report(reports[1])
    for layer, got, rows in zip(full.layers, compact.layers, zip(*(r["_results"]["mxdotp"] for r in reports))):
        assert np.array_equal(rows[0].bits, rows[1].bits)
        unit = rows[0].errors_vs_float + layer.output.reshape(-1)  # the unit's outputs
        ideal = ideal_gemm(got, layer_operands(got))[0].reshape(-1)  # the residual: reference - exact product
        residual = np.linalg.norm(layer.output.reshape(-1) - ideal)
        moved = 2.0 ** -8 * residual + np.linalg.norm(np.spacing(np.abs(got.output)).astype(np.float64))
        noise, signal = np.linalg.norm(unit - layer.output.reshape(-1)), np.linalg.norm(layer.output)
        bound = 20 * np.log10((signal + moved) / signal) + 20 * np.log10(noise / (noise - moved))
        assert 0 < abs(rows[1].sqnr_vs_float_db - rows[0].sqnr_vs_float_db) <= bound < 0.05


def test_select_layers_bounds_a_backtracking_pattern_in_time(monkeypatch):
    """``^(a+)+$`` on a 40-character name backtracks for hours in Python's engine: the search
    runs in a child process stopped at the bound, one error naming the pattern cut short."""
    import dataclasses
    import time

    import mxsim.replay.run as run
    from mxsim.replay.run import select_layers

    trace = load_trace(REPO / "traces" / "digits-cnn")
    layer = dataclasses.replace(trace.layers[0], name="a" * 40 + "!")
    trace = dataclasses.replace(trace, layers=[layer])
    monkeypatch.setattr(run, "LAYERS_MATCH_SECONDS", 1.0)
    started = time.monotonic()
    with pytest.raises(MxsimError, match=r"took more than 1 s") as caught:
        select_layers(trace, "^(a+)+$|" + "b" * 10_000)
    assert time.monotonic() - started < 5 and len(str(caught.value)) < 300
    with pytest.raises(MxsimError) as caught:
        select_layers(trace, "(" * 10_000)
    assert len(str(caught.value)) < 300
