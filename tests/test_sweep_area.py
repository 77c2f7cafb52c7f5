"""``mxsim sweep --area``: every point's unit synthesized (cells, transistors, depth) beside its
error, cached per design; bad uses refused in one line before any replay or output."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, without_compile_notice
from mxsim.cli import main
from mxsim.rtl.synth import have_yosys
from test_golden_rtl import require

TRACE = str(REPO / "traces/digits-cnn")
TINY = """mxsim_hwconfig: 1
name: tiny-fp4
inputs: {a_formats: [fp4_e2m1], b_formats: [fp4_e2m1], block_size: 1}
adder: {fused_terms: 1, accumulator_in_tree: true, align_fraction_bits: 4}
accumulator: {rounding: toward_zero}
output: {rounding: toward_zero}
"""


def sweep(tmp_path, *extra, hw=None, vary="adder.align_fraction_bits=4,8"):
    """The command's exit status (argparse's refusals exit through SystemExit)."""
    try:
        return main(
            [
                "sweep",
                TRACE,
                "--hw",
                hw or str(tiny_config(tmp_path)),
                "--vary",
                vary,
                "--out",
                str(tmp_path / "out"),
                *extra,
            ]
        )
    except SystemExit as exit_:
        return exit_.code


def tiny_config(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


@pytest.mark.rtl
@pytest.mark.slow
def test_area_and_depth_columns_from_yosys(capsys, tmp_path, monkeypatch):
    """Two 1-element FP4 units (c in a 4- and an 8-bit window): the wider one has more
    transistors; the table, CSV, JSON and plots carry area and depth; a rerun reads the cache."""
    require(have_yosys(), "Yosys")
    monkeypatch.setenv("MXSIM_SYNTH_CACHE", str(tmp_path / "cache"))
    assert sweep(tmp_path, "--area", "--format", "fp4_e2m1") == 0
    out, err = capsys.readouterr()
    assert "area (transistors)" in out and "pareto/area" in out
    assert "area 1/2: adder.align_fraction_bits=4: synthesizing" in err and "area 2/2:" in err
    summary = json.loads((tmp_path / "out/sweep.json").read_text())
    narrow, wide = (record["area"] for record in summary["points"])
    assert 0 < narrow["cells"] < narrow["transistors"] and narrow["depth"] > 0
    assert wide["transistors"] > narrow["transistors"]
    assert (narrow["a_format"], narrow["b_format"], narrow["k"]) == ("fp4_e2m1", "fp4_e2m1", 1)
    assert summary["pareto_area"] and set(summary["pareto_area"]) <= {0, 1}
    rows = (tmp_path / "out/sweep.csv").read_text().splitlines()
    assert rows[0].endswith(",area_cells,area_transistors,depth,pareto_area")
    assert rows[1].split(",")[-4:-1] == [
        str(narrow["cells"]),
        str(narrow["transistors"]),
        str(narrow["depth"]),
    ]
    assert (tmp_path / "out/plots/pareto-area.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2
    assert sweep(tmp_path, "--area", "--format", "fp4_e2m1") == 0
    assert capsys.readouterr().err.count("(cached)") == 2


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--area-k", "8"], "--area-k needs --area"),
        (["--area", "--area-k", "0"], "--area-k"),
        (["--area", "--area-k", "5000"], "--area-k"),
        (["--area", "--area-k", "x"], "--area-k: invalid int value"),
    ],
)
def test_bad_area_options_are_refused(capsys, tmp_path, extra, message):
    status = sweep(tmp_path, *extra)
    err = without_compile_notice(capsys.readouterr().err)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_k_the_units_do_not_take_is_refused(capsys, tmp_path):
    require(have_yosys(), "Yosys")
    status = sweep(
        tmp_path,
        "--area",
        "--area-k",
        "33",
        hw=str(REPO / "hwconfigs/b200-tcgen05-mxf8f6f4.yaml"),
        vary="adder.align_fraction_bits=13,25",
    )
    err = without_compile_notice(capsys.readouterr().err)
    assert (
        status == 2
        and "at point adder.align_fraction_bits=13" in err
        and "multiple of inputs.block_size" in err
    )
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_point_the_generator_does_not_cover_is_refused_before_any_replay(capsys, tmp_path):
    require(have_yosys(), "Yosys")
    status = sweep(
        tmp_path,
        "--area",
        # leading-bit alignment is built for product terms, not NVFP4's group-sum terms
        hw=str(REPO / "hwconfigs/b200-nvfp4.yaml"),
        vary="adder.align_reference=exponent_sum,leading_bit",
    )
    err = without_compile_notice(capsys.readouterr().err)
    assert (
        status == 2
        and "adder.align_reference: leading_bit" in err
        and "not covered by the RTL generator" in err
    )
    assert "at point adder.align_reference=leading_bit" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_without_yosys_area_is_a_clear_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    status = sweep(tmp_path, "--area")
    err = without_compile_notice(capsys.readouterr().err)
    assert status == 2 and "yosys is not installed" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_the_area_front_ranks_by_transistors():
    from mxsim.sweep.run import area_transistors, pareto_front

    def record(bits, transistors, sqnr):
        return {
            "cost": {"cost_bits": bits},
            "area": {"transistors": transistors},
            "result": {"metrics": {"worst_layer_sqnr_vs_ideal_db": sqnr}},
        }

    records = [
        record(10, 900, 40.0),
        record(20, 500, 30.0),
        record(30, 700, 50.0),
        record(5, 800, 20.0),
    ]
    assert pareto_front(records) == [3, 0, 2]
    assert pareto_front(records, area_transistors) == [1, 2]
