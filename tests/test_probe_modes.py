"""One unit under several rounding modes, one box per mode (mxsim.probe.modes): the base config
and each mode's view, written as files that load, give each box's bits, including on rows
where values alike under one mode differ under another; the CLI's --mode refuses bad input
in one line before asking anything."""

from __future__ import annotations

import numpy as np
import pytest

from mxsim.cli import main
from mxsim.datapath import dot, load_hwconfig
from mxsim.probe.inputs import Batch, Context
from mxsim.probe.modes import probe_modes
from mxsim.probe.units import HwconfigUnit

from conftest import REPO

HW = REPO / "hwconfigs"


def test_modes_give_a_base_and_exact_views(tmp_path):
    """cvfpu MXDOTP's E4M3 path at its own width (K = 8) under RNE and RTZ, each its own box
    (mxdotp.yaml and mxdotp-rtz.yaml): every probe exact, the base and the views load, and each
    view gives its box's bits on fresh rows, among them rows where a grid of 33 fraction bits
    (alike to 34 under RNE) differs from the boxes' 34 under RTZ."""
    boxes = {"rne": HW / "mxdotp.yaml", "rtz": HW / "mxdotp-rtz.yaml"}
    units = {mode: HwconfigUnit(path, "fp8_e4m3", "fp8_e4m3") for mode, path in boxes.items()}
    result = probe_modes(
        units, "fp8_e4m3", "fp8_e4m3", 8, validation_vectors=512, corner_vectors=128
    )
    assert result.exact and set(result.views) == set(boxes)
    assert all(
        set(view) <= {"accumulator.rounding", "output.rounding"} for view in result.views.values()
    ), result.views
    base = tmp_path / "unit.yaml"
    base.write_text(result.results[result.base].yaml)
    for mode in boxes:
        (tmp_path / f"unit-{mode}.yaml").write_text(
            result.view_yaml(mode, base.name, f"unit-{mode}")
        )
    ctx = Context("fp8_e4m3", "fp8_e4m3", 8, 32, "fp32", seed=9)
    rows = ctx.fit_c(
        Batch.join([ctx.grid(1024), ctx.ties(1024), ctx.realistic(512), ctx.uniform(512)])
    )
    kwargs = dict(
        a_format="fp8_e4m3",
        b_format="fp8_e4m3",
        scale_a=rows.scale_a,
        scale_b=rows.scale_b,
        c=rows.c.view(np.float32),
    )
    rtz = load_hwconfig(boxes["rtz"])
    (tmp_path / "mxdotp.yaml").write_text(boxes["rne"].read_text())
    (tmp_path / "rtz-33.yaml").write_text(
        "mxsim_hwconfig: 1\nextends: mxdotp.yaml\nname: rtz-33\n"
        "accumulator: {rounding: toward_zero}\noutput: {rounding: toward_zero}\n"
        "grid: {fraction_bits: 33}\n"
    )
    apart = dot(load_hwconfig(tmp_path / "rtz-33.yaml"), rows.a, rows.b, **kwargs) != dot(
        rtz, rows.a, rows.b, **kwargs
    )
    assert apart.any()  # the rows show a grid decided under RNE alone
    for mode, path in boxes.items():
        view = load_hwconfig(tmp_path / f"unit-{mode}.yaml")
        assert np.array_equal(
            dot(view, rows.a, rows.b, **kwargs), dot(load_hwconfig(path), rows.a, rows.b, **kwargs)
        ), mode


def run(capsys, *argv):
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize(
    "modes, message",
    [
        (["rne"], "expected NAME=COMMAND"),
        (["=python x"], "expected NAME=COMMAND"),
        (["rne="], "expected NAME=COMMAND"),
        (["rne=  "], "expected NAME=COMMAND"),
        (["../up=python x", "rtz=python y"], "expected NAME=COMMAND"),
        (["a b=python x", "rtz=python y"], "expected NAME=COMMAND"),
        (["rne\x00=python x", "rtz=python y"], "expected NAME=COMMAND"),
        (["r" * 33 + "=python x", "rtz=python y"], "expected NAME=COMMAND"),
        (["rne=python x", "rne=python y"], "given twice"),
        (["rne=python 'x", "rtz=python y"], "--mode rne: cannot split"),
        (["rne=python x"], "at least two modes"),
        (["rne=/nonexistent/binary", "rtz=/nonexistent/binary"], "cannot start"),
    ],
)
def test_cli_probe_bad_modes_are_one_line(capsys, tmp_path, modes, message):
    out = tmp_path / "unit.yaml"
    argv = [arg for mode in modes for arg in ("--mode", mode)]
    status, stdout, err = run(
        capsys,
        "probe",
        *argv,
        "--a-format",
        "fp4_e2m1",
        "--b-format",
        "fp4_e2m1",
        "--k",
        "8",
        "--out",
        str(out),
    )
    assert status == 2 and stdout == ""
    assert err.count("\n") == 1 and err.startswith("mxsim probe: error:") and message in err
    assert list(tmp_path.iterdir()) == []


def test_cli_probe_modes_exclude_the_other_sources_and_clashing_files(capsys, tmp_path):
    modes = ["--mode", "rne=python x", "--mode", "rtz=python y"]
    common = [
        "--a-format",
        "fp4_e2m1",
        "--b-format",
        "fp4_e2m1",
        "--k",
        "8",
        "--out",
        str(tmp_path / "unit.yaml"),
    ]
    status, _, err = run(capsys, "probe", *modes, "--hw", str(HW / "ocp-exact.yaml"), *common)
    assert status == 2 and "exactly one of --unit, --hw, --command, --mode" in err
    status, _, err = run(
        capsys, "probe", *modes, *common, "--report", str(tmp_path / "unit-rtz.yaml")
    )
    assert status == 2 and "--mode rtz" in err and "would overwrite" in err and err.count("\n") == 1
    (tmp_path / "unit-rne.yaml").mkdir()
    status, _, err = run(capsys, "probe", *modes, *common)
    assert status == 2 and "--mode rne" in err and err.count("\n") == 1
    assert [p.name for p in tmp_path.iterdir()] == ["unit-rne.yaml"]
