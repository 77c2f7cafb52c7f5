"""The command line: each subcommand's output, JSON, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, fail_replay_of_layer, without_compile_notice
from mxsim.cli import main


def run(capsys, *argv):
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, without_compile_notice(captured.err)


def test_formats_json(capsys):
    status, out, _ = run(capsys, "formats", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert status == 0 and rows["fp8_e4m3"]["max_finite"] == 448.0


def test_quantize_reports_every_format(capsys, tmp_path):
    np.save(tmp_path / "x.npy", np.linspace(-3, 3, 256, dtype=np.float32).reshape(8, 32))
    status, out, _ = run(
        capsys,
        "quantize",
        "--input",
        str(tmp_path / "x.npy"),
        "--json",
        "--profile",
        "microxcaling",
    )
    result = json.loads(out)
    assert status == 0 and result["profile"] == "microxcaling"
    assert {row["format"] for row in result["results"]} == {
        "fp8_e4m3",
        "fp8_e5m2",
        "fp6_e3m2",
        "fp6_e2m3",
        "fp4_e2m1",
        "int8",
    }


def test_dot_explain_shows_each_stage(capsys):
    status, out, _ = run(
        capsys,
        "dot",
        "--hw",
        str(REPO / "hwconfigs/h100-fp8.yaml"),
        "--a-format",
        "fp8_e4m3",
        "--b-format",
        "fp8_e4m3",
        "--a",
        "1,0.001953125,-2",
        "--b",
        "1,0.25,0.5",
        "--explain",
    )
    assert status == 0
    for stage in ("product", "tree", "normalise", "output"):
        assert stage in out
    assert out.strip().endswith("0x3a000000 = 0.00048828125")


def test_dot_explain_shows_the_group_stages_of_an_nvfp4_unit(capsys):
    # 16 products of 1 x 0.5 = 8 per group; scales UE4M3 2.0 (0x40) and 1.5 (0x3C): 8 * 3 = 24
    hw = str(REPO / "hwconfigs/b200-nvfp4.yaml")
    args = [
        "dot",
        "--hw",
        hw,
        "--a-format",
        "fp4_e2m1",
        "--b-format",
        "fp4_e2m1",
        "--a",
        ",".join(["1"] * 16),
        "--b",
        ",".join(["0.5"] * 16),
        "--scale-a",
        "0x40",
        "--scale-b",
        "0x3c",
    ]
    status, out, _ = run(capsys, *args, "--explain")
    assert status == 0 and "group" in out and "scale_a=2.0, scale_b=1.5" in out
    assert out.strip().endswith("0x41c00000 = 24.0")
    status, _, err = run(capsys, *args[:-1], "0x80")
    assert status == 2 and "UE4M3 codes must lie in [0, 127]" in err and "Traceback" not in err


def test_dot_explain_shows_the_second_alignment_of_a_matrix_core(capsys):
    # mi300 fp16: the tree sum 2^-24 + 2^-40 floored at 2^-32 beside c = 1: a tie, to even 1.0
    status, out, _ = run(
        capsys,
        "dot",
        "--hw",
        str(REPO / "hwconfigs/mi300.yaml"),
        "--a-format",
        "fp16",
        "--b-format",
        "fp16",
        "--a",
        f"{2.0**-12},{2.0**-20}",
        "--b",
        f"{2.0**-12},{2.0**-20}",
        "--c",
        "1",
        "--explain",
    )
    assert status == 0 and "second_alignment" in out and "tree_sum=5.960464477539063e-08" in out
    assert out.strip().endswith("0x3f800000 = 1.0")


def test_dot_json_with_scales(capsys):
    status, out, _ = run(
        capsys,
        "dot",
        "--hw",
        str(REPO / "hwconfigs/ocp-exact.yaml"),
        "--a-format",
        "fp4_e2m1",
        "--b-format",
        "fp4_e2m1",
        "--a",
        "1,2",
        "--b",
        "3,-0.5",
        "--scale-a",
        "128",
        "--json",
    )
    assert status == 0 and json.loads(out)["value"] == 4.0  # (1*3 - 2*0.5) * 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            [
                "dot",
                "--hw",
                "hwconfigs/h100-fp8.yaml",
                "--a-format",
                "fp8_e4m3",
                "--b-format",
                "fp8_e4m3",
                "--a",
                "1.1",
                "--b",
                "1",
            ],
            "not a fp8_e4m3 value",
        ),
        (
            [
                "dot",
                "--hw",
                "nope.yaml",
                "--a-format",
                "fp8_e4m3",
                "--b-format",
                "fp8_e4m3",
                "--a",
                "1",
                "--b",
                "1",
            ],
            "no such file",
        ),
        (["quantize", "--format", "fp9"], "unknown format"),
        (["quantize", "--profile", "nvidia"], "unknown profile"),
        (["replay", "traces/nothing", "--hw", "hwconfigs/ocp-exact.yaml"], "trace"),
        (["cycles", "traces/digits-cnn", "--hw", "hwconfigs/h100-fp8.yaml"], "no 'array:' section"),
    ],
)
def test_errors_are_one_line_with_status_2(argv, message):
    completed = subprocess.run(
        [sys.executable, "-m", "mxsim.cli", *argv], cwd=REPO, capture_output=True, text=True
    )
    assert completed.returncode == 2
    lines = without_compile_notice(completed.stderr).strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in completed.stderr


@pytest.mark.parametrize(
    "argv, loads_numba",
    [
        (["--version"], False),
        (["--help"], False),
        (["quantize", "--help"], False),
        (["formats"], True),
    ],
)
def test_only_subcommands_that_run_kernels_import_numba(argv, loads_numba):
    code = (
        f"import sys\nfrom mxsim.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print('numba' in sys.modules)"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines()[-1] == str(loads_numba)


def test_replay_writes_json_atomically(capsys, tmp_path):
    out_file = tmp_path / "report.json"
    status, out, _ = run(
        capsys,
        "replay",
        str(REPO / "traces/digits-cnn"),
        "--hw",
        str(REPO / "hwconfigs/kulisch.yaml"),
        "--json",
        str(out_file),
        "--quiet",
    )
    report = json.loads(out_file.read_text())
    assert status == 0 and report["units"] == ["kulisch"] and len(report["layers"]) == 4
    assert not list(tmp_path.glob("*.tmp")) and "conv1" in out


def test_cycles_on_a_scalesim_topology(capsys):
    status, out, _ = run(
        capsys,
        "cycles",
        str(REPO / "tests/data/scalesim/gemm_small.csv"),
        "--hw",
        str(REPO / "hwconfigs/mxdotp.yaml"),
        "--json",
    )
    data = json.loads(out)
    assert status == 0 and len(data["layers"]) == 5


def _fp4_trace(path):
    from mxsim.trace import Layer, MXQuant, Trace, save_trace

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    w = rng.standard_normal((3, 64)).astype(np.float32)
    spec = MXQuant("fp4_e2m1", axis=1, block_size=32)
    layer = Layer(
        "/m/fc/MatMul",
        "linear",
        {"input": x, "weight": w, "output": (x @ w.T).astype(np.float32)},
        {},
        {"input": spec, "weight": spec},
        {},
    )
    save_trace(Trace("fp4", [layer]), path)
    return path


def test_replay_strict_fails_in_one_line_when_a_unit_cannot_take_the_spec(capsys, tmp_path):
    trace = str(_fp4_trace(tmp_path / "trace"))
    status, out, _ = run(
        capsys, "replay", trace, "--hw", str(REPO / "hwconfigs/h100-fp8.yaml"), "--quiet"
    )
    assert status == 0 and "* /m/fc/MatMul" in out and "legend: *" in out
    status, _, err = run(
        capsys,
        "replay",
        trace,
        "--hw",
        str(REPO / "hwconfigs/h100-fp8.yaml"),
        "--quiet",
        "--strict",
    )
    assert (
        status == 2
        and len(err.strip().splitlines()) == 1
        and "cannot take fp4_e2m1 block 32" in err
    )


def test_replay_writes_table_and_json_before_plots(capsys, tmp_path):
    trace = str(_fp4_trace(tmp_path / "trace"))
    blocker = tmp_path / "plots"
    blocker.write_text("a file where the plot directory should go")
    out_file = tmp_path / "report.json"
    status, out, err = run(
        capsys,
        "replay",
        trace,
        "--hw",
        str(REPO / "hwconfigs/ocp-exact.yaml"),
        "--quiet",
        "--json",
        str(out_file),
        "--plots",
        str(blocker),
    )
    assert status == 2 and "/m/fc/MatMul" in out and len(err.strip().splitlines()) == 1
    assert json.loads(out_file.read_text())["layers"][0]["layer"] == "/m/fc/MatMul"
    status, out, _ = run(
        capsys,
        "replay",
        trace,
        "--hw",
        str(REPO / "hwconfigs/ocp-exact.yaml"),
        "--quiet",
        "--plots",
        str(tmp_path / "good"),
    )
    assert status == 0 and sorted(p.name for p in (tmp_path / "good").iterdir()) == [
        "000-m_fc_MatMul.png",
        "overview.png",
    ]


def _hostile_files(tmp_path):
    (tmp_path / "empty.npy").write_bytes(b"")
    np.save(tmp_path / "empty2d.npy", np.zeros((0, 4), np.float32))
    (tmp_path / "binary.csv").write_bytes(bytes(range(256)))
    (tmp_path / "latin1.yaml").write_bytes("name: caf\u00e9\n".encode("latin-1"))
    text = (REPO / "hwconfigs/ocp-exact.yaml").read_text()
    (tmp_path / "model").mkdir()
    (tmp_path / "model/config.json").write_text(
        '{"model_type": "bert"}'
    )  # a config and nothing else
    (tmp_path / "promoted.yaml").write_text(
        text + "overrides:\n  - accumulator: {promotion_interval: 1180591620717411303424}\n"
    )


RAISING_FACTORY = """
import sys
import torch


class Raising(torch.nn.Module):
    def __init__(self, error):
        super().__init__()
        self.error = error

    def forward(self, x):
        raise self.error


def make():
    return Raising(ZeroDivisionError("boom")), torch.ones(2, 4)


def make_exiting():
    return Raising(SystemExit(0)), torch.ones(2, 4)
"""


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["quantize", "--input", "{tmp}/empty.npy"],
            "--input {tmp}/empty.npy: the file is empty (0 bytes); expected a .npy array",
        ),
        (["quantize", "--input", "{tmp}/empty2d.npy"], "the array is empty (shape (0, 4))"),
        (
            ["quantize", "--block-size", "1000000000000"],
            "--block-size: expected an integer 1..4096, got 1000000000000",
        ),
        (["quantize", "--block-size", "0"], "--block-size: expected an integer 1..4096, got 0"),
        (
            ["golden", "--hw", "hwconfigs/ocp-exact.yaml", "--out", "{tmp}/g", "--seed", "-1"],
            "golden: seed: expected an integer 0..9223372036854775807, got -1",
        ),
        (["cycles", "{tmp}/binary.csv", "--hw", "hwconfigs/mxdotp.yaml"], "not UTF-8 text"),
        (
            ["cycles", "tests/data/scalesim/gemm_small.csv", "--hw", "{tmp}/latin1.yaml"],
            "not UTF-8 text (byte 0xe9",
        ),
        (
            [
                "dot",
                "--hw",
                "{tmp}/promoted.yaml",
                "--a-format",
                "fp4_e2m1",
                "--b-format",
                "fp4_e2m1",
                "--a",
                "1",
                "--b",
                "1",
            ],
            "overrides[0].accumulator.promotion_interval: expected an integer 1..1073741824",
        ),
        (
            [
                "dot",
                "--hw",
                "hwconfigs/h100-fp8.yaml",
                "--a-format",
                "fp8_e4m3",
                "--b-format",
                "fp8_e4m3",
                "--a-codes",
                "99999999999999999999",
                "--b-codes",
                "1",
            ],
            "--a-codes: expected comma-separated non-negative",
        ),
        (["golden", "--cases", "x"], "argument --cases: invalid int value: 'x'"),
        (
            [
                "dot",
                "--hw",
                "hwconfigs/a100-dmma.yaml",
                "--a-format",
                "fp64",
                "--b-format",
                "fp64",
                "--a-codes",
                "0x10000000000000000",
                "--b-codes",
                "1",
            ],
            "--a-codes: expected comma-separated non-negative",
        ),
        (
            [
                "dot",
                "--hw",
                "hwconfigs/a100-dmma.yaml",
                "--a-format",
                "fp64",
                "--b-format",
                "fp64",
                "--a",
                "1",
                "--b",
                "1",
                "--c-format",
                "fp8_e4m3",
            ],
            "argument --c-format: invalid choice: 'fp8_e4m3'",
        ),
        (
            [
                "dot",
                "--hw",
                "hwconfigs/v100.yaml",
                "--a-format",
                "fp16",
                "--b-format",
                "fp16",
                "--a",
                "1",
                "--b",
                "1",
                "--c",
                "0.1",
                "--c-format",
                "fp16",
            ],
            "--c: 0.1 is not an fp16 value (nearest: 0.0999755859375)",
        ),
        (
            [
                "dot",
                "--hw",
                "hwconfigs/a100-dmma.yaml",
                "--a-format",
                "fp64",
                "--b-format",
                "fp16",
                "--a",
                "1",
                "--b",
                "1",
            ],
            "operand B format 'fp16' is not supported by this unit; accepted: fp64",
        ),
        (
            [
                "golden",
                "--hw",
                "hwconfigs/a100-dmma.yaml",
                "--out",
                "{tmp}/g",
                "--kind",
                "exhaustive",
            ],
            "golden: exhaustive needs at most 65536 code pairs; fp64xfp64 has",
        ),
        (
            [
                "golden",
                "--hw",
                "hwconfigs/a100-dmma.yaml",
                "--out",
                "{tmp}/g",
                "--pair",
                "fp64,fp32",
            ],
            "format pair fp64 x fp32 is not accepted by this unit; accepted: fp64xfp64",
        ),
        (
            ["golden", "--hw", "hwconfigs/h100.yaml", "--out", "{tmp}/g"],
            "golden vectors do not hold element codes with padding bits (tf32); tf32 x tf32 do not fit: choose pairs (--pair A,B or pairs=) among fp16,fp16 bf16,bf16 fp8_e4m3,fp8_e4m3 fp8_e4m3,fp8_e5m2",
        ),
        (
            ["golden", "--hw", "hwconfigs/h100.yaml", "--out", "{tmp}/g", "--pair", "tf32,tf32"],
            "golden: a_format tf32 codes carry 13 padding bits, which the vectors do not hold",
        ),
        (
            ["golden", "--hw", "hwconfigs/h100.yaml", "--out", "{tmp}/g", "--pair", "fp16"],
            "golden --pair: expected A,B (two format names), got 'fp16'",
        ),
        (
            [
                "golden",
                "--hw",
                "hwconfigs/h100-fp8.yaml",
                "--out",
                "{tmp}/g",
                "--pair",
                "fp8_e4m3,fp4_e2m1",
            ],
            "format pair fp8_e4m3 x fp4_e2m1 is not accepted by this unit; accepted: fp8_e4m3xfp8_e4m3,",
        ),
        (["bogus"], "invalid choice: 'bogus'"),
        (
            [
                "evaluate",
                "hf",
                "{tmp}",
                "--hw",
                "hwconfigs/h100-fp8.yaml",
                "--format",
                "fp4_e2m1",
                "--task",
                "embedding",
                "--inputs",
                "examples/minilm/sentences.txt",
            ],
            "unit h100-fp8 does not take fp4_e2m1 for both operands; it takes",
        ),
        (
            [
                "evaluate",
                "hf",
                "{tmp}",
                "--hw",
                "hwconfigs/ocp-exact.yaml",
                "--format",
                "fp8_e4m3",
                "--task",
                "ner",
                "--inputs",
                "x",
            ],
            "argument --task: invalid choice: 'ner'",
        ),
        (
            [
                "evaluate",
                "hf",
                "{tmp}",
                "--hw",
                "hwconfigs/ocp-exact.yaml",
                "--format",
                "fp8_e4m3",
                "--task",
                "embedding",
                "--inputs",
                "examples/minilm/sentences.txt",
            ],
            "{tmp}: no config.json",
        ),
        (
            [
                "evaluate",
                "hf",
                "{tmp}/model",
                "--hw",
                "hwconfigs/ocp-exact.yaml",
                "--format",
                "fp8_e4m3",
                "--task",
                "embedding",
                "--inputs",
                "{tmp}/binary.csv",
            ],
            "not UTF-8 text",
        ),
        (
            [
                "evaluate",
                "hf",
                "{tmp}/model",
                "--hw",
                "hwconfigs/ocp-exact.yaml",
                "--format",
                "fp8_e4m3",
                "--task",
                "embedding",
                "--inputs",
                "examples/minilm/sentences.txt",
            ],
            "{tmp}/model: no tokenizer files",
        ),
        (
            [
                "evaluate",
                "hf",
                "{tmp}",
                "--hw",
                "hwconfigs/ocp-exact.yaml",
                "--format",
                "fp8_e4m3",
                "--task",
                "embedding",
                "--inputs",
                "examples/minilm/sentences.txt",
                "--max-length",
                "1",
            ],
            "max_length: expected an integer 2..65536",
        ),
        (
            [
                "evaluate",
                "hf",
                "{tmp}",
                "--hw",
                "hwconfigs/ocp-exact.yaml",
                "--format",
                "fp8_e4m3",
                "--task",
                "embedding",
                "--inputs",
                "examples/minilm/sentences.txt",
                "--json",
                "{tmp}/no/dir.json",
            ],
            "--json {tmp}/no/dir.json: expected a file in an existing directory",
        ),
        (
            [
                "evaluate",
                "hf",
                "{tmp}",
                "--hw",
                "hwconfigs/ocp-exact.yaml",
                "--task",
                "embedding",
                "--inputs",
                "x",
            ],
            "expected at least one unit and one format (or a quantizer)",
        ),
        (
            ["capture", "torch", "nomodule", "--out", "{tmp}/t"],
            "expected a Hugging Face model directory or module:factory",
        ),
        (["capture", "torch", "{tmp}", "--out", "{tmp}/t"], "a model directory needs --inputs"),
        (["capture", "torch", "json:loads", "--out", "{tmp}/t"], "the factory raised TypeError"),
        (
            ["capture", "torch", "json:loads", "--out", "{tmp}/t", "--task", "embedding"],
            "--task is for a model directory",
        ),
        (["capture", "torch", "json:loads", "--out", "{tmp}"], "already exists (pass --force"),
        (["capture", "torch", "sys:exit", "--out", "{tmp}/t"], "the factory raised SystemExit"),
        (
            ["capture", "torch", "cli_raising:make", "--out", "{tmp}/t"],
            "failed on its inputs: ZeroDivisionError: boom",
        ),
        (
            ["capture", "torch", "cli_raising:make_exiting", "--out", "{tmp}/t"],
            "failed on its inputs: SystemExit",
        ),
        (
            [
                "capture",
                "onnx",
                "tests/data/trace/digits_cnn_quark.onnx",
                "--inputs",
                "tests/data/trace/digits_inputs.npz",
                "--out",
                "{tmp}/t",
                "--reference",
                "float16",
            ],
            "reference must be one of float32, residual8, got 'float16'",
        ),
        (
            [
                "capture",
                "onnx",
                "tests/data/trace/digits_cnn_quark.onnx",
                "--inputs",
                "tests/data/trace/digits_inputs.npz",
                "--out",
                "{tmp}/t",
                "--reference",
                "residual8",
            ],
            "reference residual8 needs a compact version-2 trace",
        ),
        (
            [
                "evaluate",
                "hf",
                "{tmp}",
                "--hw",
                "hwconfigs/ocp-exact.yaml",
                "--quantizer",
                "quark:mxfp9",
                "--task",
                "embedding",
                "--inputs",
                "examples/minilm/sentences.txt",
            ],
            "quantizer: quark has no spec 'mxfp9'; accepted: quark:mxfp8_e4m3,",
        ),
        (
            [
                "evaluate",
                "hf",
                "{tmp}",
                "--hw",
                "hwconfigs/h100-fp8.yaml",
                "--quantizer",
                "quark:mxfp8_e4m3",
                "--task",
                "embedding",
                "--inputs",
                "examples/minilm/sentences.txt",
            ],
            "unit h100-fp8 cannot take quark:mxfp8_e4m3's operands",
        ),
    ],
)
def test_bad_input_is_one_line_status_2_in_process(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(REPO)
    _hostile_files(tmp_path)
    (tmp_path / "cli_raising.py").write_text(RAISING_FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = [arg.format(tmp=tmp_path) for arg in argv]
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse usage errors
        status = exit_.code
    err = without_compile_notice(capsys.readouterr().err)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, err
    assert message.format(tmp=tmp_path) in lines[0] and "Traceback" not in err


def test_evaluate_hf_prints_the_table_and_writes_json(capsys, tmp_path, torch):
    from conftest import tiny_hf_dir

    model = tiny_hf_dir(torch, tmp_path / "model", "embedding")
    (tmp_path / "inputs.txt").write_text("the cat sat on the mat\na dog ran in the park\nthe sun\n")
    status, out, err = run(
        capsys,
        "evaluate",
        "hf",
        str(model),
        "--hw",
        str(REPO / "hwconfigs/ocp-exact.yaml"),
        "--format",
        "fp8_e4m3",
        "--task",
        "embedding",
        "--inputs",
        str(tmp_path / "inputs.txt"),
        "--json",
        str(tmp_path / "report.json"),
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert (
        status == 0 and out.splitlines()[0] == "model: embedding, 3 inputs, 14 tokens, mean pooling"
    )
    assert (
        out.splitlines()[2].startswith("ocp-exact  fp8_e4m3") and report["runs"][0]["layers"] == 17
    )
    assert (
        "mxsim evaluate: ocp-exact fp8_e4m3: " in err
    )  # progress lines: stderr is not a terminal here


FACTORY = """
import torch

def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).eval(), torch.ones(3, 8)

def kwargs_model():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x, scale):
            return self.fc(x) * scale

    return Scaled()
"""


def test_capture_torch_refuses_what_it_cannot_see_through_in_one_line(
    capsys, tmp_path, torch, monkeypatch
):
    (tmp_path / "cli_compiled.py").write_text(
        "import torch\n\ndef compiled():\n    return torch.compile(torch.nn.Linear(8, 4)), torch.ones(3, 8)\n"
    )
    monkeypatch.chdir(tmp_path)
    status, _, err = run(
        capsys, "capture", "torch", "cli_compiled:compiled", "--out", str(tmp_path / "t")
    )
    assert status == 2 and err.count("\n") == 1
    assert (
        "capture_torch: module '<model>' is compiled by torch.compile, which is not supported"
        in err
    )


def test_capture_torch_from_a_factory_and_from_a_model_directory(
    capsys, tmp_path, torch, monkeypatch
):
    from conftest import tiny_hf_dir
    from mxsim.trace import load_trace

    (tmp_path / "cli_factory.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    status, out, _ = run(
        capsys, "capture", "torch", "cli_factory:mlp", "--out", str(tmp_path / "mlp")
    )
    trace = load_trace(tmp_path / "mlp")
    assert (
        status == 0
        and [layer.name for layer in trace.layers] == ["0", "2"]
        and trace.name == "cli_factory.mlp"
    )
    status, _, err = run(
        capsys, "capture", "torch", "cli_factory:kwargs_model", "--out", str(tmp_path / "kw")
    )
    assert status == 2 and "returned no example inputs; pass --inputs FILE.npz" in err
    np.savez(tmp_path / "kw.npz", x=np.ones((2, 8), np.float32), scale=np.float32(2.0))
    status, _, _ = run(
        capsys,
        "capture",
        "torch",
        "cli_factory:kwargs_model",
        "--inputs",
        str(tmp_path / "kw.npz"),
        "--out",
        str(tmp_path / "kw"),
    )
    assert status == 0 and [layer.name for layer in load_trace(tmp_path / "kw").layers] == ["fc"]
    model = tiny_hf_dir(torch, tmp_path / "bert", "embedding")
    (tmp_path / "inputs.txt").write_text("the cat sat\na dog ran in the park\n")
    status, out, _ = run(
        capsys,
        "capture",
        "torch",
        str(model),
        "--inputs",
        str(tmp_path / "inputs.txt"),
        "--out",
        str(tmp_path / "bert-trace"),
    )
    trace = load_trace(tmp_path / "bert-trace")
    assert status == 0 and len(trace.layers) == 17 and trace.name == "bert"
    assert trace.layers[0].tensors["input"].shape == (
        2,
        6,
        32,
    )  # two inputs padded to 6 tokens, hidden 32


def test_golden_pairs_of_a_config_with_tf32(capsys, tmp_path):
    """A config whose tf32 pairs golden vectors cannot hold still gives its other pairs."""
    status, out, err = run(
        capsys,
        "golden",
        "--hw",
        str(REPO / "hwconfigs/h100.yaml"),
        "--out",
        str(tmp_path),
        "--cases",
        "4",
        "--kind",
        "random",
        "--pair",
        "bf16,bf16",
        "--pair",
        "fp8_e4m3, fp8_e5m2",
    )
    assert status == 0, err
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [(u["a_format"], u["b_format"]) for u in manifest["units"]] == [
        ("bf16", "bf16"),
        ("fp8_e4m3", "fp8_e5m2"),
    ]
    assert "h100.bf16xbf16.random.hex: 4 vectors" in out


def test_golden_fp64_unit(capsys, tmp_path):
    status, out, err = run(
        capsys,
        "golden",
        "--hw",
        str(REPO / "hwconfigs/a100-dmma.yaml"),
        "--out",
        str(tmp_path),
        "--cases",
        "3",
    )
    assert status == 0, err
    unit = json.loads((tmp_path / "manifest.json").read_text())["units"][0]
    assert (unit["c_format"], unit["out_format"], unit["layout"]["word_bits"]) == (
        "fp64",
        "fp64",
        2 * 32 * 64 + 128,
    )
    assert "a100-dmma.fp64xfp64.random.hex: 3 vectors" in out


def test_replay_plots_stay_inside_the_output_directory(capsys, tmp_path):
    from mxsim.trace import load_trace, save_trace

    trace = load_trace(REPO / "traces/digits-cnn")
    trace.layers[0].name = "/mxsim-fuzz-escape/conv1"
    trace.network = None
    save_trace(trace, tmp_path / "trace")
    plots, report = tmp_path / "plots", tmp_path / "report.json"
    status, _, err = run(
        capsys,
        "replay",
        str(tmp_path / "trace"),
        "--hw",
        str(REPO / "hwconfigs/ocp-exact.yaml"),
        "--plots",
        str(plots),
        "--json",
        str(report),
        "--quiet",
    )
    assert not Path("/mxsim-fuzz-escape").exists()
    assert status == 0, err
    assert json.loads(report.read_text())["units"] == ["ocp-exact"]
    assert all(path.resolve().parent == plots.resolve() for path in plots.iterdir())


def test_replay_end_to_end_without_labels_fails_before_work(capsys):
    status, out, err = run(
        capsys,
        "replay",
        str(REPO / "traces/ppocr-cls"),
        "--hw",
        str(REPO / "hwconfigs/kulisch.yaml"),
        "--quiet",
        "--end-to-end",
    )
    assert (
        status == 2
        and out == ""
        and len(err.strip().splitlines()) == 1
        and "end to end needs a network" in err
    )


def test_replay_layers_selects_by_regex(capsys, tmp_path):
    status, out, _ = run(
        capsys,
        "replay",
        str(REPO / "traces/digits-cnn"),
        "--hw",
        str(REPO / "hwconfigs/kulisch.yaml"),
        "--quiet",
        "--layers",
        "fc2$",
    )
    assert (
        status == 0
        and "1 layers through kulisch" in out
        and re.search(r"^. fc2 +kulisch", out, re.M)
    )
    assert "conv1" not in out
    for argv, message in (
        (["--layers", "("], "not a regular expression"),
        (["--layers", "zzz"], "matches none"),
        (["--layers", "fc", "--end-to-end"], "exclude each other"),
    ):
        status, out, err = run(
            capsys,
            "replay",
            str(REPO / "traces/digits-cnn"),
            "--hw",
            str(REPO / "hwconfigs/kulisch.yaml"),
            "--quiet",
            *argv,
        )
        assert status == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1


def test_replay_failure_after_work_prints_table_and_json_first(capsys, tmp_path, monkeypatch):
    fail_replay_of_layer(monkeypatch, "fc2", "fc2 fails")
    out_file = tmp_path / "report.json"
    status, out, err = run(
        capsys,
        "replay",
        str(REPO / "traces/digits-cnn"),
        "--hw",
        str(REPO / "hwconfigs/kulisch.yaml"),
        "--quiet",
        "--json",
        str(out_file),
    )
    assert (
        status == 2
        and re.search(r"^. fc1 +kulisch", out, re.M)
        and "FAILED layer fc2: fc2 fails" in out
    )
    assert len(err.strip().splitlines()) == 1 and "fc2 fails" in err
    saved = json.loads(out_file.read_text())
    assert [entry["layer"] for entry in saved["layers"]] == ["conv1", "conv2", "fc1"]
    assert saved["failures"] == [{"task": "layer fc2", "error": "fc2 fails"}]


def test_capture_onnx_compact_keeps_mx_operands_as_codes(capsys, tmp_path):
    """The Quark-style digits model: MXFP8 activations become codes; replay's model rows agree."""
    from mxsim.trace import load_trace

    model, inputs = (
        REPO / "tests/data/trace/digits_cnn_quark.onnx",
        REPO / "tests/data/trace/digits_inputs.npz",
    )
    for flag, name in (
        ([], "full"),
        (["--compact"], "compact"),
        (["--compact", "--reference", "float32"], "exact"),
    ):
        status, _, _ = run(
            capsys,
            "capture",
            "onnx",
            str(model),
            "--inputs",
            str(inputs),
            "--out",
            str(tmp_path / name),
            *flag,
        )
        assert status == 0
    full, compact = load_trace(tmp_path / "full"), load_trace(tmp_path / "compact")
    # the layer with both operands as codes gets the residual reference by default, or float32 when asked
    assert [layer.reference for layer in compact.layers] == ["float32"] * 3 + ["residual8"]
    assert all(layer.reference == "float32" for layer in load_trace(tmp_path / "exact").layers)
    assert all(not layer.codes_only for layer in full.layers)
    assert any("input" in layer.codes_only for layer in compact.layers)
    size = {
        name: sum(p.stat().st_size for p in (tmp_path / name).rglob("*") if p.is_file())
        for name in ("full", "compact")
    }
    assert size["compact"] < size["full"]
    for a, b in zip(full.layers, compact.layers):
        for key in ("weight", "output"):
            if key not in b.codes_only and (key, b.reference) != ("output", "residual8"):
                assert np.array_equal(a.tensors[key], b.tensors[key])
    from mxsim.datapath import load_hwconfig
    from mxsim.replay import replay

    unit = load_hwconfig(REPO / "hwconfigs/ocp-exact.yaml")
    reports = [replay(trace, [unit]) for trace in (full, compact)]
    for a, b in zip(*(report["layers"] for report in reports)):
        row_a, row_b = a["results"][0], b["results"][0]
        if (
            row_a["status"] == "model"
        ):  # the unit multiplies the model's operands: every output bit equal
            assert row_b["status"] == "model"
            same = row_a["sqnr_vs_float_db"] == row_b["sqnr_vs_float_db"]
            # a residual reference moves SQNR vs float within docs/trace-format.md's bound
            assert same or (
                b["reference"] == "residual8"
                and abs(row_a["sqnr_vs_float_db"] - row_b["sqnr_vs_float_db"]) < 0.04
            )
    rows = [report["_results"]["ocp-exact"] for report in reports]
    assert sum(r.status == "model" for r in rows[0]) >= 1
    for a, b in zip(*rows):
        if a.status == "model":
            assert np.array_equal(a.bits, b.bits)


def strict_json(text: str):
    """json.loads refusing the non-standard NaN, Infinity and -Infinity literals."""

    def refuse(literal):
        raise ValueError(f"non-standard JSON literal {literal}")

    return json.loads(text, parse_constant=refuse)


def test_replay_json_is_strict_with_non_finite_numbers_as_strings(capsys, tmp_path):
    out_file = tmp_path / "report.json"
    status, _, _ = run(
        capsys,
        "replay",
        str(REPO / "traces/digits-cnn"),
        "--hw",
        str(REPO / "hwconfigs/kulisch.yaml"),
        "--json",
        str(out_file),
        "--quiet",
    )
    report = strict_json(out_file.read_text())  # an exact unit's SQNR is +inf: "Infinity" before
    assert status == 0 and report["layers"][0]["results"][0]["sqnr_vs_ideal_db"] == "inf"


def test_dot_json_is_strict(capsys):
    status, out, _ = run(
        capsys,
        "dot",
        "--hw",
        str(REPO / "hwconfigs/ocp-exact.yaml"),
        "--a-format",
        "fp8_e4m3",
        "--b-format",
        "fp8_e4m3",
        "--a",
        "1",
        "--b",
        "1",
        "--c",
        "inf",
        "--json",
    )
    assert status == 0 and strict_json(out)["value"] == "inf"


@pytest.mark.parametrize(
    "c, message",
    [
        ("3.5e38", "--c: 3.5e+38 is not an fp32 value (nearest: inf)"),  # silently +Inf before
        ("0.1", "--c: 0.1 is not an fp32 value (nearest: 0.10000000149011612)"),
    ],
)
def test_dot_c_must_be_an_exact_fp32_value_as_a_and_b_are(capsys, c, message):
    status, _, err = run(
        capsys,
        "dot",
        "--hw",
        str(REPO / "hwconfigs/ocp-exact.yaml"),
        "--a-format",
        "fp8_e4m3",
        "--b-format",
        "fp8_e4m3",
        "--a",
        "1",
        "--b",
        "1",
        "--c",
        c,
    )
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1


def test_dot_format_choices_are_the_tables_wide_formats():
    from mxsim.cli import OUTPUT_FORMATS
    from mxsim.formats import format_names

    assert OUTPUT_FORMATS == format_names("wide")


def test_dot_fp64_is_the_fma_chain_with_stages(capsys):
    # d = fma(a_k, b_k, d) in k order, each an exactly rounded binary64 (Python's float of a
    # Fraction rounds to nearest even): the 2^-1993 product vanishes into 1.1, 3 x 0.1 does not.
    a, b, c = [1.0, 1e-300, 3.0], [1.0, 1e-300, 0.1], 0.1
    want = c
    for x, y in zip(a, b):
        want = float(Fraction(x) * Fraction(y) + Fraction(want))
    status, out, _ = run(
        capsys,
        "dot",
        "--hw",
        str(REPO / "hwconfigs/a100-dmma.yaml"),
        "--a-format",
        "fp64",
        "--b-format",
        "fp64",
        "--a",
        ",".join(map(repr, a)),
        "--b",
        ",".join(map(repr, b)),
        "--c",
        repr(c),
        "--explain",
        "--json",
    )
    result = strict_json(out)
    assert (
        status == 0
        and result["value"] == want
        and result["bits"] == f"0x{np.float64(want).view(np.uint64):016x}"
    )
    assert [s["stage"] for s in result["stages"]].count("accumulate") == 3
    assert next(s for s in result["stages"] if s["stage"] == "product" and s["k"] == 1)[
        "product"
    ].endswith("*2^-1994")


def test_quantize_refuses_a_scale_format_as_element_format(capsys):
    status, _, err = run(capsys, "quantize", "--format", "e8m0")
    assert (
        status == 2
        and "e8m0 is not an element format (it is a block scale format); accepted: fp8_e4m3" in err
    )


def test_quantize_reports_nan_sqnr_beside_a_nan_error(capsys, tmp_path):
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
    x[0, 0] = np.nan
    np.save(tmp_path / "x.npy", x)
    status, out, _ = run(
        capsys, "quantize", "--input", str(tmp_path / "x.npy"), "--format", "fp8_e4m3", "--json"
    )
    (row,) = strict_json(out)["results"]
    assert (
        status == 0 and row["max_abs_error"] == "nan" and row["sqnr_db"] == "nan"
    )  # was inf beside a NaN error


def test_sweep_out_must_be_a_usable_directory(capsys, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("a user's file")
    for out, message in (
        ("", "--out: expected a file or directory path, got ''"),
        (str(tmp_path / "full"), "is not empty and holds no earlier output of this kind"),
    ):
        status, _, err = run(
            capsys,
            "sweep",
            str(REPO / "traces/digits-cnn"),
            "--hw",
            str(REPO / "hwconfigs/h100-fp8.yaml"),
            "--vary",
            "adder.fused_terms=8,16",
            "--out",
            out,
            "--quiet",
        )
        assert status == 2 and message in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "full" / "mine.txt").read_text() == "a user's file"


def test_cli_probe_a_config_that_is_not_exact_is_written_and_fails(capsys, tmp_path, monkeypatch):
    """A unit no key describes, failing after the first validation: the best config found is
    written (marked not exact) with its report, progress goes to stderr, and the exit is 1."""
    import types

    from mxsim.datapath import load_hwconfig

    monkeypatch.setitem(
        sys.modules, "flipping_unit_module", types.SimpleNamespace(unit=_flipping_unit(2000))
    )
    out, report = tmp_path / "unit.yaml", tmp_path / "report.json"
    status = main(
        [
            "probe",
            "--unit",
            "flipping_unit_module:unit",
            "--a-format",
            "fp4_e2m1",
            "--b-format",
            "fp4_e2m1",
            "--k",
            "8",
            "--out",
            str(out),
            "--report",
            str(report),
        ]
    )
    captured = capsys.readouterr()
    assert status == 1
    assert (
        "NOT EXACT" in out.read_text()
        and "NOT EXACT" in captured.out
        and "stopped early" in captured.out
    )
    assert json.loads(report.read_text())["exact"] is False
    assert "validation:" in captured.err and "probe [" in captured.err
    assert "the unit went away" in json.loads(report.read_text())["stopped"]
    load_hwconfig(out)  # what is written loads


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9"])
def test_cli_probe_bad_seconds_is_one_line(capsys, tmp_path, value):
    status = main(
        [
            "probe",
            "--hw",
            str(REPO / "hwconfigs" / "ocp-exact.yaml"),
            "--a-format",
            "fp4_e2m1",
            "--b-format",
            "fp4_e2m1",
            "--k",
            "8",
            "--out",
            str(tmp_path / "u.yaml"),
            "--seconds",
            value,
        ]
    )
    err = without_compile_notice(capsys.readouterr().err)
    assert status == 2 and err.count("\n") == 1 and "seconds" in err
    assert not (tmp_path / "u.yaml").exists()


def _flipping_unit(stop_after_rows: int):
    """ocp-exact's fp4 path with the last bit of the result flipped where c's lowest bit is set
    (no key describes it), raising on any call after one of ``stop_after_rows`` rows or more
    (the first validation's batch: the unit fails in a later step)."""
    from mxsim.probe import HwconfigUnit

    unit = HwconfigUnit(REPO / "hwconfigs" / "ocp-exact.yaml", "fp4_e2m1", "fp4_e2m1", "fp32")
    seen = []

    def flipping(a, b, sa, sb, c):
        if seen and max(seen) >= stop_after_rows:
            raise RuntimeError("the unit went away")
        seen.append(len(a))
        bits = unit(a, b, sa, sb, c).astype(np.uint64)
        odd = (c.astype(np.uint64) & 1) == 1
        bits[odd] ^= 1
        return bits

    return flipping
