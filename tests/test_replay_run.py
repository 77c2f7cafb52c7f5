"""Replay through units: end to end, checks before any work, failures keeping the finished
layers, layer selection, compact traces."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import REPO, fail_replay_of_layer, mx_linear_layer
from mxsim.datapath import load_hwconfig
from mxsim.errors import MxsimError, TraceError
from mxsim.replay.operands import ideal_gemm, layer_operands
from mxsim.replay.plots import write_plots
from mxsim.replay.report import format_report
from mxsim.replay.run import replay
from mxsim.trace import Trace, load_trace

HW = {
    name: load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
    for name in ("ocp-exact", "h100-fp8", "kulisch", "mxdotp")
}


def test_digits_sample_replays_end_to_end(tmp_path):
    trace = load_trace(REPO / "traces" / "digits-cnn")
    report = replay(trace, [HW["ocp-exact"], HW["h100-fp8"], HW["mxdotp"]], end_to_end=True)
    assert [entry["layer"] for entry in report["layers"]] == [layer.name for layer in trace.layers]
    e2e = report["end_to_end"]
    assert e2e["float_accuracy"] == pytest.approx(trace.metadata["float_accuracy"])
    for name in ("ocp-exact", "h100-fp8", "mxdotp"):
        assert abs(e2e["accuracy"][name] - e2e["float_accuracy"]) < 0.05
        assert report["totals"][name]["worst_layer_sqnr_vs_float_db"] > 20
    assert (
        report["totals"]["mxdotp"]["cycles"] > 0 and report["totals"]["ocp-exact"]["cycles"] is None
    )
    pair = next(p for p in report["agreement"] if p["units"] == ["ocp-exact", "mxdotp"])
    assert 0.9 < pair["bit_identical_fraction"] <= 1.0
    text = format_report(report)
    assert "end to end: float accuracy" in text and "bit-identical outputs" in text
    plots = write_plots(report, tmp_path / "plots")
    assert len(plots) == 1 + 4 and all(open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n" for p in plots)
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "000-conv1.png",
        "001-conv2.png",
        "002-fc1.png",
        "003-fc2.png",
        "overview.png",
    ]
    report.pop("_results")
    json.dumps(report, default=str)


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
    trace = Trace("t", [mx_linear_layer(np.random.default_rng(3), "fp4_e2m1")])
    with pytest.raises(
        MxsimError, match="end to end needs a network with labels .* this trace has no network"
    ):
        replay(trace, [HW["ocp-exact"]], end_to_end=True)
    with pytest.raises(
        MxsimError, match="layer 'fc' on h100-fp8: the unit cannot take fp4_e2m1 block 32.*strict"
    ):
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
                assert (
                    plan.element_format,
                    plan.quantized,
                    plan.granule,
                    plan.spec,
                    plan.layout,
                ) == (
                    operand.element_format,
                    operand.quantized,
                    operand.granule,
                    operand.spec,
                    operand.layout,
                )


def test_a_failure_after_work_keeps_the_finished_layers(monkeypatch):
    from mxsim.errors import IncompleteResultError

    rng = np.random.default_rng(4)
    good, bad = mx_linear_layer(rng), mx_linear_layer(rng)
    bad.name = "bad"
    fail_replay_of_layer(monkeypatch, "bad", "this layer fails")
    with pytest.raises(
        IncompleteResultError, match="1 of 2 replay tasks failed: layer bad: this layer fails"
    ) as caught:
        replay(Trace("t", [good, bad]), [HW["ocp-exact"]])
    partial = caught.value.partial
    assert [entry["layer"] for entry in partial["layers"]] == ["fc"]
    assert partial["failures"] == [{"task": "layer bad", "error": "this layer fails"}]
    assert "FAILED layer bad: this layer fails" in format_report(partial)


def test_select_layers_by_regular_expression():
    from mxsim.replay.run import select_layers

    trace = load_trace(REPO / "traces" / "digits-cnn")
    subset = select_layers(trace, r"^fc")
    assert [layer.name for layer in subset.layers] == ["fc1", "fc2"] and subset.network is None
    assert [layer.name for layer in trace.layers] == [
        "conv1",
        "conv2",
        "fc1",
        "fc2",
    ]  # the trace is kept
    with pytest.raises(MxsimError, match="matches none of the trace's 4 layers"):
        select_layers(trace, "attention")
    with pytest.raises(MxsimError, match="not a regular expression"):
        select_layers(trace, "conv(")


def test_a_compact_trace_replays_bit_for_bit_and_says_which_reference_it_carries(tmp_path):
    """Residual reference outputs: the unit's bits are the full trace's; SQNR vs float moves by
    no more than the reconstruction bound allows (docs/trace-format.md, "Reference outputs")."""
    from mxsim.trace import save_trace

    rng = np.random.default_rng(23)
    layers = []
    for name in ("fc", "fc2"):
        layer = mx_linear_layer(rng)
        layer.name = name
        layers.append(layer)
    trace = Trace("residual", layers)
    full = load_trace(save_trace(trace, tmp_path / "full"))
    compact = load_trace(save_trace(trace, tmp_path / "compact", floats=False))
    reports = [replay(t, [HW["mxdotp"]]) for t in (full, compact)]
    assert [r["references"] for r in reports] == [{"float32": 2}, {"residual8": 2}]
    assert [entry["reference"] for entry in reports[1]["layers"]] == ["residual8", "residual8"]
    assert "float reference outputs: 2 float32 (exact)" in format_report(reports[0])
    assert (
        "float reference outputs: 2 residual8 (reconstructed within 2^-8 of the quantization error's RMS)"
        in format_report(reports[1])
    )
    for layer, got, rows in zip(
        full.layers, compact.layers, zip(*(r["_results"]["mxdotp"] for r in reports))
    ):
        assert np.array_equal(rows[0].bits, rows[1].bits)
        unit = rows[0].errors_vs_float + layer.output.reshape(-1)  # the unit's outputs
        ideal = ideal_gemm(layer_operands(got))[0].reshape(
            -1
        )  # the residual: reference - exact product
        residual = np.linalg.norm(layer.output.reshape(-1) - ideal)
        moved = 2.0**-8 * residual + np.linalg.norm(
            np.spacing(np.abs(got.output)).astype(np.float64)
        )
        noise, signal = (
            np.linalg.norm(unit - layer.output.reshape(-1)),
            np.linalg.norm(layer.output),
        )
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
