"""mxsim export c: the files it writes, its refusals and hostile input (bit-exactness is
tests/test_cmodel_check.py's)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from conftest import REPO
from mxsim.cli import main
from mxsim.cmodel import export
from mxsim.cmodel.export import export_c, generate
from mxsim.errors import ConfigError

OCP = str(REPO / "hwconfigs" / "ocp-exact.yaml")
NAME = "mxc_ocp_exact_fp4_e2m1_fp4_e2m1"


def run(capsys, *argv):
    try:
        status = main(list(argv))
    except SystemExit as exit_:  # argparse usage errors
        status = exit_.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_files_manifest_and_dpi_declarations(capsys, tmp_path):
    status, out, err = run(
        capsys,
        "export",
        "c",
        "--hw",
        OCP,
        "--a-format",
        "fp4_e2m1",
        "--b-format",
        "fp4_e2m1",
        "--out",
        str(tmp_path / "m"),
    )
    assert status == 0, err
    manifest = json.loads((tmp_path / "m" / "cmodel.json").read_text())
    assert manifest["c_function"] == f"{NAME}_dot" and manifest["k"] == 32
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == sorted(
        manifest["files"] + ["cmodel.json"]
    )
    svh = (tmp_path / "m" / f"{NAME}_dpi.svh").read_text()
    # the golden vector's buses: 32 fp4 codes, one E8M0 scale each, FP32 c and d
    assert (
        f'import "DPI-C" function void {NAME}_dpi(input bit [127:0] a, input bit [127:0] b, '
        "input bit [7:0] scale_a, input bit [7:0] scale_b, input bit [31:0] c, output bit [31:0] d);"
    ) in svh
    assert f"{NAME}.c" in out


def test_no_floating_point_type_in_the_model():
    files = generate(OCP, "fp4_e2m1", "fp4_e2m1")
    for name in (f"{NAME}.c", f"{NAME}.h"):
        words = set(files[name].replace("(", " ").replace(")", " ").replace("*", " ").split())
        assert not words & {"float", "double"}, name


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_compiles_as_strict_c99(tmp_path):
    export_c(str(REPO / "hwconfigs" / "h100-fp8.yaml"), tmp_path / "m", "fp8_e4m3", "fp8_e5m2")
    source = next((tmp_path / "m").glob("*fp8_e5m2.c"))
    subprocess.run(
        [
            "cc",
            "-std=c99",
            "-pedantic",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-O1",
            "-c",
            str(source),
            "-o",
            str(tmp_path / "m.o"),
        ],
        check=True,
        timeout=120,
    )


def test_output_replaced_atomically_and_only_its_own(capsys, tmp_path):
    out = tmp_path / "m"
    export_c(OCP, out, "fp4_e2m1", "fp4_e2m1")
    (out / "stale.txt").write_text("x")
    export_c(OCP, out, "fp8_e4m3", "fp8_e4m3")  # an earlier export is replaced as a whole
    assert not (out / "stale.txt").exists() and any(
        p.name.endswith("fp8_e4m3.c") for p in out.iterdir()
    )
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    status, _, err = run(
        capsys,
        "export",
        "c",
        "--hw",
        OCP,
        "--a-format",
        "fp4_e2m1",
        "--b-format",
        "fp4_e2m1",
        "--out",
        str(foreign),
    )
    assert status == 2 and "is not empty and holds no earlier output" in err
    assert (foreign / "notes.txt").read_text() == "mine"


def test_a_key_the_engine_does_not_read_is_refused(monkeypatch, tmp_path):
    text = export.engine_text().replace("CFG_parity_windows", "CFG_other")
    monkeypatch.setattr(export, "engine_text", lambda: text)
    with pytest.raises(ConfigError, match="parity_windows: this key is not covered by the C model"):
        export_c(OCP, tmp_path / "m", "fp4_e2m1", "fp4_e2m1")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--hw", "{tmp}/none.yaml"], "none.yaml"),
        (
            ["--hw", OCP],
            "the unit takes 36 format pairs; choose one with --a-format and --b-format among fp8_e4m3,fp8_e4m3",
        ),
        (
            ["--hw", OCP, "--a-format", "fp4_e2m1"],
            "give both --a-format and --b-format, or neither",
        ),
        (["--hw", OCP, "--a-format", "fp99", "--b-format", "fp4_e2m1"], "fp99"),
        (
            [
                "--hw",
                str(REPO / "hwconfigs/h100-fp8.yaml"),
                "--a-format",
                "fp4_e2m1",
                "--b-format",
                "fp4_e2m1",
            ],
            "the unit does not take fp4_e2m1 x fp4_e2m1; accepted: fp8_e4m3,fp8_e4m3",
        ),
        (
            ["--hw", OCP, "--a-format", "fp4_e2m1", "--b-format", "fp4_e2m1", "--k", "0"],
            "--k must be an integer 1..4096",
        ),
        (
            ["--hw", OCP, "--a-format", "fp4_e2m1", "--b-format", "fp4_e2m1", "--k", "8192"],
            "--k must be an integer 1..4096",
        ),
        (
            ["--hw", OCP, "--a-format", "fp4_e2m1", "--b-format", "fp4_e2m1", "--k", "48"],
            "--k (48) must be a multiple of the unit's block size (32)",
        ),
        (
            ["--hw", OCP, "--a-format", "fp4_e2m1", "--b-format", "fp4_e2m1", "--k", "x"],
            "invalid int value: 'x'",
        ),
        (
            [
                "--hw",
                OCP,
                "--a-format",
                "fp4_e2m1",
                "--b-format",
                "fp4_e2m1",
                "--out",
                "{tmp}/file",
            ],
            "is not a directory",
        ),
        (
            ["--hw", OCP, "--a-format", "fp4_e2m1", "--b-format", "fp4_e2m1", "--out", "."],
            "is the current directory",
        ),
        (["--hw", "{tmp}/file"], "file"),
    ],
)
def test_bad_input_is_one_line_status_2(capsys, tmp_path, monkeypatch, argv, message):
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # empty: --out . names it
    (tmp_path / "file").write_text("not: [a config")
    argv = [arg.format(tmp=tmp_path) for arg in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    status, _, err = run(capsys, "export", "c", *argv)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert message.format(tmp=tmp_path) in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_the_c_api_refuses_codes_out_of_range(tmp_path):
    import numpy as np

    from mxsim.cmodel.harness import CModel
    from mxsim.errors import MxsimError

    manifest = export_c(OCP, tmp_path / "m", "fp4_e2m1", "fp4_e2m1")
    model = CModel(tmp_path / "m", manifest, tmp_path)
    codes = np.zeros((1, 32), dtype=np.uint64)
    scales = np.full((1, 1), 127, dtype=np.uint64)
    got, _ = model.run(codes, codes, scales, scales, np.zeros(1, dtype=np.uint64))
    assert got.tolist() == [0]  # +0 + sum of +0 products
    for a, scale, c in (
        (codes + 16, scales, 0),
        (codes, scales + 129, 0),
        (codes, scales, 1 << 32),
    ):
        with pytest.raises(MxsimError, match="exit 3"):
            model.run(a, codes, scale, scales, np.array([c], dtype=np.uint64))
