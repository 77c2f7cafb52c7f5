"""Sweeps: each point equals a separate replay bit for bit (in-process and on Dask), resumability,
per-point failures, and the command line."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, without_compile_notice
from mxsim.cli import main
from mxsim.datapath import load_hwconfig
from mxsim.datapath.config import vary_hwconfig
from mxsim.errors import MxsimError
from mxsim.sweep import parse_knobs, run_sweep, trace_digest
from mxsim.sweep.run import bits_digest, pareto_front
from mxsim.trace import load_trace
from mxsim.replay import replay

BASE = load_hwconfig(REPO / "hwconfigs" / "h100-fp8.yaml")
TRACE = load_trace(REPO / "traces" / "digits-cnn")
KNOBS = ["adder.align_fraction_bits=6,13"]


@pytest.fixture(scope="module")
def separate_replays():
    """The two points replayed on their own: the varied config, and the base file itself for 13."""
    narrow = vary_hwconfig(BASE, {"adder.align_fraction_bits": 6}, name="narrow")
    return [replay(TRACE, [unit], end_to_end=True) for unit in (narrow, BASE)]


def check_equals_replays(summary, reports):
    assert [record["point"] for record in summary["points"]] == [
        {"adder.align_fraction_bits": 6},
        {"adder.align_fraction_bits": 13},
    ]
    for record, report in zip(summary["points"], reports, strict=True):
        (name,) = report["units"]
        result = record["result"]
        assert result["bits_sha256"] == bits_digest(report["_results"][name])
        for layer, entry in zip(result["layers"], report["layers"], strict=True):
            expected = dict(entry["results"][0])
            expected.pop("seconds")
            expected["hw"] = record["hw"]
            assert layer == expected
        assert result["metrics"]["accuracy"] == report["end_to_end"]["accuracy"][name]
        assert (
            result["metrics"]["max_rel_rms_error_vs_ideal"]
            == report["totals"][name]["max_rel_rms_error_vs_ideal"]
        )
    # The knob matters: the 6-bit window changes output bits.
    assert (
        summary["points"][0]["result"]["bits_sha256"]
        != summary["points"][1]["result"]["bits_sha256"]
    )


def test_two_point_sweep_equals_two_replays(tmp_path, separate_replays):
    summary = run_sweep(TRACE, BASE, parse_knobs(KNOBS), tmp_path)
    check_equals_replays(summary, separate_replays)
    assert summary["failed"] == summary["resumed"] == 0
    # The exact ideal-MX error of the 13-bit point beats the 6-bit one; both are on the front.
    sqnr = [r["result"]["metrics"]["worst_layer_sqnr_vs_ideal_db"] for r in summary["points"]]
    assert sqnr[1] > sqnr[0] and summary["pareto"] == [0, 1]


def test_two_point_sweep_on_a_cluster_equals_two_replays(tmp_path, separate_replays, dask_runner):
    summary = run_sweep(TRACE, BASE, parse_knobs(KNOBS), tmp_path, runner=dask_runner)
    check_equals_replays(summary, separate_replays)


def test_rerun_skips_finished_points(tmp_path):
    knobs = parse_knobs(["adder.align_fraction_bits=8,13", "accumulator.format=fp32,bf16"])
    first = run_sweep(TRACE, BASE, knobs, tmp_path)
    files = sorted((tmp_path / "points").glob("*.json"))
    assert len(files) == 4 and first["resumed"] == 0
    stamps = [f.stat().st_mtime_ns for f in files]
    files[0].unlink()
    second = run_sweep(TRACE, BASE, knobs, tmp_path)
    assert second["resumed"] == 3
    assert [f.stat().st_mtime_ns for f in files[1:]] == stamps[1:]
    strip = [{k: v for k, v in r.items() if k != "resumed"} for r in second["points"]]
    assert strip == [
        {k: v for k, v in r.items() if k != "resumed"}
        for r in json.loads(json.dumps(first["points"]))
    ]
    # Another element format is another key: nothing is reused.
    assert run_sweep(TRACE, BASE, knobs, tmp_path, element_format="fp8_e5m2")["resumed"] == 0


def test_a_format_a_point_does_not_take_is_refused_before_any_work(tmp_path):
    # Every operand in fp8_e5m2: the point whose unit takes only fp8_e4m3 for A would fail, as replay refuses it.
    knobs = parse_knobs(["inputs.a_formats=fp8_e4m3,fp8_e5m2"])
    with pytest.raises(MxsimError, match="does not take fp8_e5m2"):
        run_sweep(TRACE, BASE, knobs, tmp_path / "out", element_format="fp8_e5m2")
    assert not (tmp_path / "out").exists()


def test_failed_points_are_reported_and_retried(tmp_path, monkeypatch):
    import mxsim.sweep.run as sweep_run

    replay_point = sweep_run.replay_point

    def failing(trace, config, element_format=None):  # the 6-bit window's point fails while it runs
        if config.params("fp8_e4m3", "fp8_e4m3").align_fraction_bits == 6:
            raise MxsimError("this point failed")
        return replay_point(trace, config, element_format)

    monkeypatch.setattr(sweep_run, "replay_point", failing)
    summary = run_sweep(TRACE, BASE, parse_knobs(KNOBS), tmp_path)
    failed, finished = summary["points"]
    assert (
        summary["failed"] == 1
        and failed["result"] is None
        and "this point failed" in failed["error"]
    )
    assert finished["result"] is not None and summary["pareto"] == [1]
    assert len(list((tmp_path / "points").glob("*.json"))) == 1
    again = run_sweep(TRACE, BASE, parse_knobs(KNOBS), tmp_path)
    assert again["resumed"] == 1 and again["failed"] == 1


def test_trace_digest_sees_contents():
    other = load_trace(REPO / "traces" / "digits-cnn")
    assert trace_digest(other) == trace_digest(TRACE)
    other.layers[0].tensors["weight"] = other.layers[0].tensors["weight"] * 2
    assert trace_digest(other) != trace_digest(TRACE)


def test_pareto_front():
    def record(cost, sqnr):
        return {
            "cost": {"cost_bits": cost},
            "result": {"metrics": {"worst_layer_sqnr_vs_ideal_db": sqnr}},
        }

    records = [
        record(100, 30.0),
        record(50, 20.0),
        record(80, 10.0),
        {"cost": {"cost_bits": 1}, "result": None},
        record(200, float("inf")),
        record(150, 30.0),
    ]
    assert pareto_front(records) == [1, 0, 4]


def test_command_line_sweep(capsys, tmp_path):
    argv = [
        "sweep",
        str(REPO / "traces/digits-cnn"),
        "--hw",
        str(REPO / "hwconfigs/h100-fp8.yaml"),
        "--vary",
        "adder.align_fraction_bits=6,13",
        "--out",
        str(tmp_path),
        "--quiet",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2 points (0 resumed, 0 failed)" in out and "accuracy" in out
    summary = json.loads((tmp_path / "sweep.json").read_text())
    rows = (tmp_path / "sweep.csv").read_text().splitlines()
    assert len(summary["points"]) == 2 and len(rows) == 3
    assert rows[0].startswith("point,adder.align_fraction_bits,cost_bits")
    assert all(
        open(tmp_path / "plots" / name, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
        for name in ("error-vs-adder.align_fraction_bits.png", "pareto.png")
    )
    assert main(argv) == 0 and "2 points (2 resumed, 0 failed)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "vary, message",
    [
        ("adder.width=8", "adder.width: unknown key path; accepted: "),
        (
            "adder.align_fraction_bits=8,77",
            "adder.align_fraction_bits: expected an integer 0..50, got 77",
        ),
    ],
)
def test_command_line_errors(capsys, tmp_path, vary, message):
    status = main(
        [
            "sweep",
            str(REPO / "traces/digits-cnn"),
            "--hw",
            str(REPO / "hwconfigs/h100-fp8.yaml"),
            "--vary",
            vary,
            "--out",
            str(tmp_path / "out"),
        ]
    )
    err = without_compile_notice(capsys.readouterr().err)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_workers_without_dask_is_a_clear_error(capsys, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "distributed", None)
    status = main(
        [
            "replay",
            str(REPO / "traces/digits-cnn"),
            "--hw",
            str(REPO / "hwconfigs/ocp-exact.yaml"),
            "--workers",
            "2",
        ]
    )
    err = without_compile_notice(capsys.readouterr().err)
    assert status == 2 and "pip install 'mxsim[dask]'" in err
