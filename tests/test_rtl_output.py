"""`mxsim rtl`: files written atomically into a new, empty or earlier output directory; every bad
argument one line on stderr and exit 2."""

from __future__ import annotations

import json

import pytest

from conftest import REPO
from mxsim.cli import main
from mxsim.rtl import generate_unit
from mxsim.rtl.output import MANIFEST, write_unit

OCP = str(REPO / "hwconfigs" / "ocp-exact.yaml")


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["rtl", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_writes_the_unit_its_test_benches_and_manifest(tmp_path, capsys):
    out = tmp_path / "unit"
    code, stdout, err = run(
        capsys, "--hw", OCP, "--a-format", "fp4_e2m1", "--b-format", "fp4_e2m1", "--out", str(out)
    )
    assert code == 0, err
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        [
            "mxdot_ocp_exact_fp4_e2m1xfp4_e2m1_k32.sv",
            "mxsim_rtl_lib.sv",
            "tb.sv",
            "probe_tb.sv",
            MANIFEST,
        ]
    )
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["top"] == "mxdot_ocp_exact_fp4_e2m1xfp4_e2m1_k32" and manifest["k"] == 32
    assert [p["name"] for p in manifest["ports"]] == ["a", "b", "scale_a", "scale_b", "c", "d"]
    # an earlier output is replaced as a whole
    code, _, err = run(
        capsys,
        "--hw",
        OCP,
        "--a-format",
        "fp8_e4m3",
        "--b-format",
        "fp8_e4m3",
        "--k",
        "64",
        "--out",
        str(out),
    )
    assert code == 0, err
    assert not (out / "mxdot_ocp_exact_fp4_e2m1xfp4_e2m1_k32.sv").exists()
    assert (out / "mxdot_ocp_exact_fp8_e4m3xfp8_e4m3_k64.sv").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--a-format", "fp4_e2m1", "--b-format", "fp4_e2m1", "--k", "0"], "--k"),
        (["--a-format", "fp4_e2m1", "--b-format", "fp4_e2m1", "--k", "100000000000"], "--k"),
        (["--a-format", "fp4_e2m1", "--b-format", "fp4_e2m1", "--k", "48"], "multiple"),
        (["--a-format", "fp4_e2m1", "--b-format", "fp4_e2m1", "--pipeline", "99"], "--pipeline"),
        (["--a-format", "nope", "--b-format", "fp4_e2m1"], "nope"),
        (["--a-format", "fp16", "--b-format", "fp4_e2m1"], "a_formats"),
        (["--a-format", "fp4_e2m1", "--b-format", "fp4_e2m1", "--name", "1bad"], "module name"),
    ],
)
def test_bad_arguments_are_one_line(tmp_path, capsys, argv, words):
    out = tmp_path / "unit"
    code, _, err = run(capsys, "--hw", OCP, *argv, "--out", str(out))
    assert code == 2
    assert err.count("\n") == 1 and words in err and "Traceback" not in err
    assert not out.exists()


def test_bad_configs_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "mxsim_hwconfig: 1\nname: bad\ninputs: {a_formats: [fp4_e2m1], b_formats: [fp4_e2m1], "
        "block_size: 16, scales: group_sum, scale_format: ue4m3}\n"
        # leading-bit alignment of group-sum terms: refused
        "adder: {fused_terms: 16, align_fraction_bits: 25, align_reference: leading_bit}\n"
    )
    for hw, words in (
        (bad, "adder.align_reference"),
        (tmp_path / "missing.yaml", "missing.yaml"),
        (tmp_path, str(tmp_path)),
    ):
        code, _, err = run(
            capsys,
            "--hw",
            str(hw),
            "--a-format",
            "fp4_e2m1",
            "--b-format",
            "fp4_e2m1",
            "--out",
            str(tmp_path / "unit"),
        )
        assert code == 2 and err.count("\n") == 1 and words in err, err


def test_output_directory_rules(tmp_path, capsys, monkeypatch):
    args = ["--hw", OCP, "--a-format", "fp4_e2m1", "--b-format", "fp4_e2m1", "--out"]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    link = tmp_path / "link"
    link.symlink_to(foreign)
    for target, words in ((foreign, "not empty"), (a_file, "not a directory"), (link, "symlink")):
        code, _, err = run(capsys, *args, str(target))
        assert code == 2 and words in err and err.count("\n") == 1, err
    assert (foreign / "keep.txt").read_text() == "mine"
    monkeypatch.chdir(foreign)
    code, _, err = run(capsys, *args, ".")
    assert code == 2 and err.count("\n") == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run(capsys, *args, str(empty))[0] == 0


def test_a_failed_write_leaves_the_earlier_output(tmp_path, monkeypatch):
    unit = generate_unit(OCP, "fp4_e2m1", "fp4_e2m1")
    out = write_unit(unit, tmp_path / "unit")
    before = {p.name: p.read_text() for p in out.iterdir()}

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("mxsim.rtl.output.testbench", broken)
    with pytest.raises(OSError, match="disk full"):
        write_unit(generate_unit(OCP, "fp8_e4m3", "fp8_e4m3"), out)
    assert {p.name: p.read_text() for p in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
