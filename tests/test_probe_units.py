"""The probe's unit adapters: the line protocol, a subprocess that dies, hangs or prints
garbage, a callable that raises or answers nonsense, module:function loading, and the CLI
(one line, exit status 2, atomic output)."""

from __future__ import annotations

import json
import re
import sys
import textwrap

import numpy as np
import pytest

from mxsim.cli import main
from mxsim.datapath import dot, load_hwconfig
from mxsim.probe import CountingUnit, HwconfigUnit, ProbeError, SubprocessUnit, load_callable
from mxsim.probe.units import format_request, parse_request
from mxsim.errors import ArgumentError

from conftest import REPO

OCP = REPO / "hwconfigs" / "ocp-exact.yaml"
K = 4


def _rows(n=3, k=K):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 16, (n, k)).astype(np.uint64)
    b = rng.integers(0, 16, (n, k)).astype(np.uint64)
    scale = rng.integers(120, 135, (n, 1)).astype(np.uint8)
    c = np.array([0x3F800000, 0, 0xC0000000][:n], dtype=np.uint32)
    return a, b, scale, scale.copy(), c


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "unit.py"
    path.write_text(textwrap.dedent(body))
    return f"{sys.executable} {path}"


# A unit in Python speaking the protocol: the ocp-exact fp4 unit through mxsim itself.
SERVER = f"""
    import sys
    import numpy as np
    sys.path.insert(0, {str(REPO)!r})
    from mxsim.datapath import dot, load_hwconfig
    from mxsim.probe.units import parse_request
    hw = load_hwconfig({str(OCP)!r})
    for line in sys.stdin:
        a, b, sa, sb, c = parse_request(line, {K}, 1, 4, 4)
        out = dot(hw, np.array([a]), np.array([b]), a_format="fp4_e2m1", b_format="fp4_e2m1",
                  scale_a=np.array([sa]), scale_b=np.array([sb]), c=np.array([c], np.uint32).view(np.float32))
        print(format(int(out[0]), "08x"), flush=True)
"""


def test_request_format_places_element_i_in_its_bits():
    a = np.array([0x1, 0x2, 0x3, 0xF], dtype=np.uint64)
    line = format_request(
        a, a, np.array([0x7F], np.uint8), np.array([0x80], np.uint8), 0x3F800000, 4, 4
    )
    assert line == "f321 f321 7f 80 3f800000"
    assert parse_request(line, 4, 1, 4, 4) == (
        [1, 2, 3, 15],
        [1, 2, 3, 15],
        [0x7F],
        [0x80],
        0x3F800000,
    )


def test_subprocess_unit_answers_as_mxsim(tmp_path):
    a, b, sa, sb, c = _rows()
    # mxsim's answer first: its kernels are then in the cache the unit loads them from, so the
    # unit's first answer is not held up by compiling past the timeout on a cold cache
    want = dot(
        load_hwconfig(OCP),
        a,
        b,
        a_format="fp4_e2m1",
        b_format="fp4_e2m1",
        scale_a=sa,
        scale_b=sb,
        c=c.view(np.float32),
    )
    unit = SubprocessUnit(_script(tmp_path, SERVER), "fp4_e2m1", "fp4_e2m1", chunk=2)
    try:
        got = unit(a, b, sa, sb, c)
    finally:
        unit.close()
    assert got.tolist() == want.tolist()
    assert unit.requests == 3


@pytest.mark.parametrize(
    "body, message",
    [
        ("import sys; sys.stdin.readline(); sys.exit(3)", "exited (status 3)"),
        ("import sys, time\nfor line in sys.stdin: time.sleep(30)", "gave no answer within 0.5 s"),
        (
            "import sys\nfor line in sys.stdin: print('hello world', flush=True)",
            "not 8 hexadecimal digits",
        ),
        (
            "import sys\nfor line in sys.stdin: print('1' * 9, flush=True)",
            "not 8 hexadecimal digits",
        ),
        ("import sys\nsys.stderr.write('boom: no licence'); sys.exit(1)", "boom: no licence"),
        (
            "import sys\nfor line in sys.stdin: print('x' * 10000, flush=True)",
            "longer than 4096 bytes",
        ),
    ],
)
def test_subprocess_failures_are_one_line_probe_errors(tmp_path, body, message):
    unit = SubprocessUnit(_script(tmp_path, body), "fp4_e2m1", "fp4_e2m1", timeout=0.5)
    with pytest.raises(ProbeError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
        unit(*_rows())
    assert "\n" not in str(caught.value)
    assert unit._process is None  # stopped


def test_missing_command_and_bad_quoting():
    with pytest.raises(ProbeError, match="cannot start"):
        SubprocessUnit("/nonexistent/unit-binary", "fp4_e2m1", "fp4_e2m1")(*_rows())
    with pytest.raises(ArgumentError, match="cannot split"):
        SubprocessUnit("vvp 'unclosed", "fp4_e2m1", "fp4_e2m1")
    with pytest.raises(ArgumentError, match="non-empty"):
        SubprocessUnit("  ", "fp4_e2m1", "fp4_e2m1")


@pytest.mark.parametrize(
    "answer, message",
    [
        (lambda a, b, sa, sb, c: 1 / 0, "raised ZeroDivisionError"),
        (lambda a, b, sa, sb, c: np.zeros(len(a) + 1, np.uint32), "expected 3 integer"),
        (lambda a, b, sa, sb, c: np.full(len(a), 1 << 33), "outside 0..2"),
        (lambda a, b, sa, sb, c: np.zeros(len(a)), "expected 3 integer"),
        (lambda a, b, sa, sb, c: ["x"] * len(a), "expected 3 integer"),
    ],
)
def test_counting_unit_checks_answers(answer, message):
    with pytest.raises(ProbeError, match=message):
        CountingUnit(answer, "fp32", 100)(*_rows())


def test_counting_unit_budget():
    unit = CountingUnit(lambda a, b, sa, sb, c: np.zeros(len(a), np.uint32), "fp32", 5)
    unit(*_rows())
    assert unit.queries == 3
    with pytest.raises(ProbeError, match="budget of 5"):
        unit(*_rows())


def test_hwconfig_unit_matches_dot_and_ignores_scales_of_a_scaleless_unit():
    unit = HwconfigUnit(REPO / "hwconfigs" / "h100.yaml", "fp8_e4m3", "fp8_e4m3", "fp16")
    a, b, sa, sb, c = _rows()
    want = dot(
        load_hwconfig(REPO / "hwconfigs" / "h100.yaml"),
        a,
        b,
        a_format="fp8_e4m3",
        b_format="fp8_e4m3",
        c=c.view(np.float32),
        out_format="fp16",
    )
    assert unit(a, b, sa, sb, c).tolist() == want.tolist()


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nocolon", "expected module:function"),
        ("a:b:c", "expected module:function"),
        (":f", "expected module:function"),
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
        ("json:no_such_function", "has no callable 'no_such_function'"),
        ("missing_file.py:f", "no such file"),
    ],
)
def test_load_callable_errors(spec, message):
    with pytest.raises(ArgumentError, match=message):
        load_callable(spec)


def test_load_callable_file_that_raises_on_import(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("raise SystemExit(4)\n")
    with pytest.raises(ArgumentError, match="SystemExit"):
        load_callable(f"{path}:f")


def test_load_callable_file_leaves_no_bytecode_beside_it(tmp_path, monkeypatch):
    """Python would cache the loaded file's bytecode in a __pycache__ beside it (where writes
    are allowed); the probe writes nothing into the user's directory."""
    import sys

    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    path = tmp_path / "unit.py"
    path.write_text("def f(*args):\n    return 0\n")
    assert load_callable(f"{path}:f")() == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["unit.py"]
    assert sys.dont_write_bytecode is False  # restored


# ----------------------------------------------------------------------------- 64-bit codes, c and outputs

DMMA = REPO / "hwconfigs" / "a100-dmma.yaml"

# An fp64 unit speaking the protocol in plain Python: checks each field's width (64-bit elements,
# 16-digit C) and answers a 64-bit pattern built from C and A's last element (16 digits).
FP64_SERVER = f"""
    import sys
    for line in sys.stdin:
        fields = line.split()
        assert [len(f) for f in fields] == [{16 * K}, {16 * K}, 2, 2, 16], fields
        print(format(int(fields[4], 16) ^ (int(fields[0], 16) >> {64 * (K - 1)}), "016x"), flush=True)
"""


def _fp64_rows(n=3, k=K):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((n, k)).view(np.uint64)
    b = rng.standard_normal((n, k)).view(np.uint64)
    c = np.array([1.0, -0.0, 2.0**-1074][:n]).view(np.uint64)
    ones = np.full((n, 1), 127, np.uint8)
    return a, b, ones, ones.copy(), c


def test_fp64_request_round_trips_and_refuses_oversized_fields():
    a, b, sa, sb, c = _fp64_rows(1)
    line = format_request(a[0], b[0], sa[0], sb[0], c[0], 64, 64, c_bits=64)
    fields = line.split()
    assert [len(f) for f in fields] == [64, 64, 2, 2, 16]
    assert parse_request(line, K, 1, 64, 64, c_bits=64) == (
        a[0].tolist(),
        b[0].tolist(),
        [127],
        [127],
        int(c[0]),
    )
    with pytest.raises(ValueError, match="field C does not fit in 64 bits"):
        parse_request(" ".join(fields[:4] + ["1" + fields[4]]), K, 1, 64, 64, c_bits=64)
    with pytest.raises(
        ValueError, match="field C does not fit in 32 bits"
    ):  # fp64 bits read as fp32 c
        parse_request(line, K, 1, 64, 64)
    with pytest.raises(ValueError, match="field A does not fit in 256 bits"):
        parse_request(" ".join(["1" + fields[0]] + fields[1:]), K, 1, 64, 64, c_bits=64)
    with pytest.raises(ValueError, match="field SB"):
        parse_request(" ".join(fields[:3] + ["-1", fields[4]]), K, 1, 64, 64, c_bits=64)
    assert format_request(a[0], b[0], sa[0], sb[0], 0x3F800000, 64, 64).endswith(
        " 3f800000"
    )  # 32-bit c as before


def test_fp64_subprocess_unit_sends_and_reads_64_bit_fields(tmp_path):
    unit = SubprocessUnit(
        _script(tmp_path, FP64_SERVER), "fp64", "fp64", "fp64", chunk=2, c_format="fp64"
    )
    a, b, sa, sb, c = _fp64_rows()
    try:
        got = unit(a, b, sa, sb, c)
    finally:
        unit.close()
    assert got.tolist() == (c ^ a[:, K - 1]).tolist() and unit.requests == 3


def test_hwconfig_unit_fp64_matches_dot():
    a, b, sa, sb, c = _fp64_rows()
    want = dot(load_hwconfig(DMMA), a, b, a_format="fp64", b_format="fp64", c=c.view(np.float64))
    assert HwconfigUnit(DMMA, "fp64", "fp64")(a, b, sa, sb, c).tolist() == want.tolist()


@pytest.mark.parametrize(
    "answer, message",
    [
        ("1" * 17, "not 16 hexadecimal digits"),
        ("-" + "1" * 15, "not 16 hexadecimal digits"),
        ("0x" + "1" * 14, "not 16 hexadecimal digits"),
        ("", "not 16 hexadecimal digits"),
    ],
)
def test_fp64_subprocess_malformed_answers(tmp_path, answer, message):
    unit = SubprocessUnit(
        _script(tmp_path, f"import sys\nfor line in sys.stdin: print({answer!r}, flush=True)"),
        "fp64",
        "fp64",
        "fp64",
        timeout=5,
        c_format="fp64",
    )
    with pytest.raises(ProbeError, match=message) as caught:
        unit(*_fp64_rows())
    assert "\n" not in str(caught.value) and unit._process is None


@pytest.mark.parametrize(
    "answer, message",
    [
        (lambda a, b, sa, sb, c: np.array([1 << 64] * len(a), dtype=object), "outside 0..2\\^64-1"),
        (lambda a, b, sa, sb, c: np.full(len(a), -1, np.int64), "outside 0..2\\^64-1"),
        (lambda a, b, sa, sb, c: c.view(np.float64), "expected 3 integer"),
    ],
)
def test_counting_unit_checks_64_bit_answers(answer, message):
    with pytest.raises(ProbeError, match=message):
        CountingUnit(answer, "fp64", 100)(*_fp64_rows())
    top = CountingUnit(
        lambda a, b, sa, sb, c: np.full(len(a), (1 << 64) - 1, np.uint64), "fp64", 100
    )(*_fp64_rows())
    assert top.tolist() == [(1 << 64) - 1] * 3


def test_hwconfig_unit_c_format():
    """c in another format than the config's (v100 taking fp16 c): a c no fp16 holds is refused."""
    unit = HwconfigUnit(REPO / "hwconfigs" / "v100.yaml", "fp16", "fp16", "fp32", c_format="fp16")
    assert unit.c_format == "fp16"
    a, b = np.zeros((1, 4), np.uint64), np.zeros((1, 4), np.uint64)
    ones = np.full((1, 1), 127, np.uint8)
    assert unit(a, b, ones, ones, np.array([0x3F800000], np.uint32)).tolist() == [0x3F800000]
    with pytest.raises(ArgumentError, match="fp16 value"):
        unit(a, b, ones, ones, np.array([0x3F800001], np.uint32))


# ----------------------------------------------------------------------------- CLI


def run(capsys, *argv):
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--unit", "nonexistent_module_q:f"], "cannot import"),
        (["--unit", "json:dumps", "--hw", str(OCP)], "exactly one of --unit, --hw, --command"),
        ([], "exactly one of"),
        (["--command", "/nonexistent/binary"], "cannot start"),
        (["--hw", str(OCP), "--timeout", "0"], "--timeout"),
        (["--hw", str(REPO / "hwconfigs" / "no-such.yaml")], "no-such.yaml"),
        (["--unit", "json:dumps"], "the unit raised"),
    ],
)
def test_cli_probe_bad_input_is_one_line(capsys, tmp_path, argv, message):
    out = tmp_path / "unit.yaml"
    status, _, err = run(
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
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("mxsim probe: error:") and message in err
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--c-format", "--out-format"])
@pytest.mark.parametrize("value", ["fp8_e4m3", "", "FP64", "fp64 ", "fp128", "e8m0", "fp32\x00"])
def test_cli_probe_bad_c_or_out_format_is_one_line(capsys, tmp_path, flag, value):
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "probe",
                "--hw",
                str(OCP),
                "--a-format",
                "fp4_e2m1",
                "--b-format",
                "fp4_e2m1",
                "--k",
                "8",
                "--out",
                str(tmp_path / "u.yaml"),
                flag,
                value,
            ]
        )
    err = capsys.readouterr().err
    assert (
        exit_info.value.code == 2
        and err.count("\n") == 1
        and flag in err
        and "invalid choice" in err
    )
    assert not (tmp_path / "u.yaml").exists()


@pytest.mark.parametrize(
    "hw, element, flag, value, accepted",
    [
        ("v100.yaml", "fp16", "--out-format", "fp64", "fp32, fp16, bf16"),  # an fp32 accumulator
        ("v100.yaml", "fp16", "--c-format", "fp64", "fp32, fp16, bf16"),
        (
            "ocp-exact.yaml",
            "fp4_e2m1",
            "--out-format",
            "fp64",
            "fp32, fp16, bf16",
        ),  # an exact one, written as fp32
        ("a100-dmma.yaml", "fp64", "--out-format", "fp32", "fp64"),  # an fp64 FMA chain
        ("a100-dmma.yaml", "fp64", "--c-format", "bf16", "fp64"),
        ("mi250-f64.yaml", "fp64", "--out-format", "fp16", "fp64"),
    ],
)
def test_cli_probe_c_or_out_format_of_another_width_is_refused(
    capsys, tmp_path, hw, element, flag, value, accepted
):
    """--hw: a format of the other width than the config's accumulator is refused before any
    query, in one line naming the flag, the value and what the unit takes; nothing written."""
    out = tmp_path / "u.yaml"
    status, stdout, err = run(
        capsys,
        "probe",
        "--hw",
        str(REPO / "hwconfigs" / hw),
        "--a-format",
        element,
        "--b-format",
        element,
        "--k",
        "4",
        "--out",
        str(out),
        flag,
        value,
    )
    assert (
        status == 2
        and stdout == ""
        and err.count("\n") == 1
        and err.startswith("mxsim probe: error:")
    )
    assert f"{flag} {value}" in err and f"takes {accepted}" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_cli_probe_formats_of_the_config_width_pass_the_check():
    from mxsim.cli import _check_probe_widths

    for hw, element, formats in (
        ("v100.yaml", "fp16", ("fp32", "fp16", "bf16")),
        ("a100-dmma.yaml", "fp64", ("fp64",)),
        ("ocp-exact.yaml", "fp4_e2m1", ("fp32", "bf16")),
    ):
        for out_format in (None, *formats):
            for c_format in (None, *formats):
                unit = HwconfigUnit(REPO / "hwconfigs" / hw, element, element, out_format, c_format)
                _check_probe_widths(
                    unit, hw, out_format, c_format
                )  # raises ArgumentError otherwise


def test_cli_probe_hanging_command_times_out(capsys, tmp_path):
    command = _script(tmp_path, "import sys, time\nfor line in sys.stdin: time.sleep(30)")
    status, _, err = run(
        capsys,
        "probe",
        "--command",
        command,
        "--timeout",
        "0.5",
        "--a-format",
        "fp4_e2m1",
        "--b-format",
        "fp4_e2m1",
        "--k",
        "8",
        "--out",
        str(tmp_path / "u.yaml"),
    )
    assert status == 2 and "gave no answer within 0.5 s" in err and err.count("\n") == 1


def test_cli_probe_unknown_format_and_bad_k(capsys, tmp_path):
    status, _, err = run(
        capsys,
        "probe",
        "--hw",
        str(OCP),
        "--a-format",
        "fp9",
        "--b-format",
        "fp4_e2m1",
        "--k",
        "8",
        "--out",
        str(tmp_path / "u.yaml"),
    )
    assert status == 2 and "fp9" in err
    status, _, err = run(
        capsys,
        "probe",
        "--hw",
        str(OCP),
        "--a-format",
        "fp4_e2m1",
        "--b-format",
        "fp4_e2m1",
        "--k",
        "0",
        "--out",
        str(tmp_path / "u.yaml"),
    )
    assert status == 2 and "k" in err


def test_cli_probe_writes_a_loadable_config(capsys, tmp_path):
    out = tmp_path / "unit.yaml"
    out.write_text("old contents\n")
    status, stdout, err = run(
        capsys,
        "probe",
        "--hw",
        str(OCP),
        "--a-format",
        "fp4_e2m1",
        "--b-format",
        "fp4_e2m1",
        "--k",
        "32",
        "--out",
        str(out),
        "--validation",
        "256",
        "--corners",
        "64",
        "--report",
        str(tmp_path / "report.json"),
    )
    assert status == 0, err
    line = re.search(
        r"validation: 0 mismatches in (\d+) vectors \(256 random, 64 corners, (\d+) targeted\)",
        stdout,
    )
    assert line and int(line[1]) == 256 + 64 + int(line[2]), stdout
    config = load_hwconfig(out)
    assert config.params("fp4_e2m1", "fp4_e2m1").fused_terms == 32
    assert (tmp_path / "report.json").read_text().startswith("{")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_cli_probe_json_prints_the_report(capsys, tmp_path):
    status, stdout, err = run(
        capsys,
        "probe",
        "--hw",
        str(OCP),
        "--a-format",
        "fp4_e2m1",
        "--b-format",
        "fp4_e2m1",
        "--k",
        "8",
        "--out",
        str(tmp_path / "unit.yaml"),
        "--validation",
        "64",
        "--corners",
        "16",
        "--json",
    )
    assert status == 0, err
    assert json.loads(stdout)["validation"]["mismatches"] == 0


def test_cli_probe_fp64_unit(capsys, tmp_path):
    """--hw an fp64 config: output and c formats default to the config's (fp64), 64-bit codes throughout."""
    out = tmp_path / "dmma.yaml"
    status, stdout, err = run(
        capsys,
        "probe",
        "--hw",
        str(DMMA),
        "--a-format",
        "fp64",
        "--b-format",
        "fp64",
        "--k",
        "4",
        "--out",
        str(out),
        "--validation",
        "128",
        "--corners",
        "32",
    )
    assert status == 0, err
    assert "validation: 0 mismatches in 160 vectors" in stdout
    params = load_hwconfig(out).params("fp64", "fp64")
    assert (params.output_format, params.c_format, params.accumulator_format) == (
        "fp64",
        "fp64",
        "fp64",
    )


# ----------------------------------------------------------------------------- hostile units


@pytest.mark.parametrize(
    "answer",
    [
        lambda a, b, sa, sb, c: np.array(
            [1.5, 2**70, 3], dtype=object
        ),  # int() would take 1.5 as 1
        lambda a, b, sa, sb, c: np.array([1, 2.0, 3], dtype=object),
        lambda a, b, sa, sb, c: np.array(["1", 2, 3], dtype=object),
        lambda a, b, sa, sb, c: np.array([True, 1, 2], dtype=object),
        lambda a, b, sa, sb, c: [True, False, True],
        lambda a, b, sa, sb, c: np.ones(3, np.float32),
        lambda a, b, sa, sb, c: ["0x1", "2", "3"],
        lambda a, b, sa, sb, c: [1 + 0j, 2, 3],
    ],
)
def test_counting_unit_refuses_answers_that_are_no_integers(answer):
    with pytest.raises(ProbeError, match="integer output bit patterns"):
        CountingUnit(answer, "fp32", 100)(*_rows())


def test_counting_unit_takes_python_and_numpy_integers():
    unit = CountingUnit(
        lambda a, b, sa, sb, c: np.array([1, np.uint32(2), 2**32 - 1], dtype=object), "fp32", 100
    )
    assert unit(*_rows()).tolist() == [1, 2, 2**32 - 1]


@pytest.mark.parametrize(
    "error",
    [
        SystemExit(0),
        SystemExit(3),
        KeyboardInterrupt(),
        BaseException("odd"),
        GeneratorExit(),
        ValueError("x" * 100_000),
    ],
)
def test_counting_unit_turns_anything_raised_into_one_bounded_line(error):
    def unit(a, b, sa, sb, c):
        raise error

    with pytest.raises(ProbeError, match=f"the unit raised {type(error).__name__}") as caught:
        CountingUnit(unit, "fp32", 100)(*_rows())
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200


def test_load_callable_whose_import_exits_or_interrupts(tmp_path):
    for i, statement in enumerate(
        ("import sys; sys.exit(0)", "raise KeyboardInterrupt", "raise BaseException")
    ):
        path = tmp_path / f"unit{i}.py"
        path.write_text(statement + "\n")
        with pytest.raises(ArgumentError, match="cannot import"):
            load_callable(f"{path}:f")


@pytest.mark.parametrize(
    "body, message",
    [
        # closes its stdout but keeps running: bounded by the timeout, then killed
        (
            "import os, sys, time\nsys.stdin.readline(); os.close(1); time.sleep(60)",
            "closed its output and did not exit",
        ),
        # reads nothing: the requests fill the pipe and the write is bounded too
        ("import time\ntime.sleep(60)", "gave no answer within 0.5 s"),
        # closes its stdin and keeps running
        ("import os, time\nos.close(0); time.sleep(60)", "closed its output and did not exit"),
    ],
)
def test_subprocess_unit_every_wait_is_bounded(tmp_path, body, message):
    import time as time_

    unit = SubprocessUnit(_script(tmp_path, body), "fp16", "fp16", timeout=0.5)
    a = np.zeros((64, 1024), np.uint64)  # 64 requests of 8 KB: more than a pipe holds
    scale = np.full((64, 32), 127, np.uint8)
    started = time_.monotonic()
    with pytest.raises(ProbeError, match=message):
        unit(a, a, scale, scale, np.zeros(64, np.uint32))
    assert time_.monotonic() - started < 5
    assert unit._process is None


def test_subprocess_unit_keeps_head_and_tail_of_a_huge_stderr(tmp_path):
    body = (
        "import sys\nsys.stderr.write('FIRST ' + 'x' * 20_000_000 + ' LAST')\nsys.stderr.flush()\n"
        "sys.exit(5)"
    )
    unit = SubprocessUnit(_script(tmp_path, body), "fp4_e2m1", "fp4_e2m1", timeout=10)
    with pytest.raises(ProbeError, match="exited") as caught:
        unit(*_rows())
    message = str(caught.value)
    assert (
        "FIRST" in message
        and "LAST" in message
        and "20000011 bytes" in message
        and len(message) < 400
    )
    assert (
        unit._stderr.size == 20_000_011 and len(unit._stderr.head) + len(unit._stderr.tail) <= 8192
    )


def test_subprocess_unit_kills_the_children_it_started(tmp_path):
    pid_file = tmp_path / "child.pid"
    body = (
        f"import subprocess, sys\np = subprocess.Popen(['sleep', '60'])\nopen({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "sys.stdin.readline(); print('zz', flush=True)\nimport time; time.sleep(60)"
    )
    unit = SubprocessUnit(_script(tmp_path, body), "fp4_e2m1", "fp4_e2m1", timeout=5)
    with pytest.raises(ProbeError, match="not 8 hexadecimal"):
        unit(*_rows())
    import os as os_
    import time as time_

    child = int(pid_file.read_text())
    for _ in range(50):  # killed with its group; reaped by init
        try:
            os_.kill(child, 0)
        except ProcessLookupError:
            break
        time_.sleep(0.1)
    else:
        pytest.fail("the unit's child outlived it")


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), "1", True, 1e9])
def test_subprocess_unit_timeout_is_checked(timeout):
    with pytest.raises(ArgumentError, match="--timeout"):
        SubprocessUnit("true", "fp4_e2m1", "fp4_e2m1", timeout=timeout)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--seed", "-1"], "--seed: expected an integer 0..9223372036854775807, got -1"),
        (["--seed", str(2**63)], "--seed: expected an integer"),
        (["--report", "{tmp}/no-such-dir/r.json"], "--report"),
        (["--report", "{tmp}"], "--report"),
        (["--report", "{tmp}/u.yaml"], "the same file as --out"),
        (["--out", "{tmp}/missing/u.yaml"], "--out"),
        (["--out", "{tmp}/" + "x" * 300], "--out"),
    ],
)
def test_cli_probe_seed_and_outputs_are_checked_before_any_query(capsys, tmp_path, extra, message):
    asked = tmp_path / "asked"
    (tmp_path / "unitmod.py").write_text(
        f"def unit(a, b, sa, sb, c):\n    open({str(asked)!r}, 'w').close()\n"
        "    raise SystemExit(0)\n"
    )
    argv = [
        "probe",
        "--unit",
        f"{tmp_path / 'unitmod.py'}:unit",
        "--a-format",
        "fp4_e2m1",
        "--b-format",
        "fp4_e2m1",
        "--k",
        "8",
        "--out",
        str(tmp_path / "u.yaml"),
    ] + [item.replace("{tmp}", str(tmp_path)) for item in extra]
    status, _, err = run(capsys, *argv)
    assert status == 2 and err.count("\n") == 1 and message in err
    assert not asked.exists() and not (tmp_path / "u.yaml").exists()


@pytest.mark.parametrize("seed", [-1, 1.5, "0", True, 2**63])
def test_probe_api_seed_is_checked(seed):
    from mxsim.probe import probe

    with pytest.raises(ArgumentError, match="probe: seed"):
        probe(
            lambda a, b, sa, sb, c: np.zeros(len(a), np.uint32),
            "fp4_e2m1",
            "fp4_e2m1",
            8,
            seed=seed,
        )


def test_cli_probe_unit_that_exits_is_one_line(capsys, tmp_path):
    (tmp_path / "exitmod.py").write_text("def unit(a, b, sa, sb, c):\n    raise SystemExit(0)\n")
    status, out, err = run(
        capsys,
        "probe",
        "--unit",
        f"{tmp_path / 'exitmod.py'}:unit",
        "--a-format",
        "fp4_e2m1",
        "--b-format",
        "fp4_e2m1",
        "--k",
        "8",
        "--out",
        str(tmp_path / "u.yaml"),
    )
    assert status == 2 and err.count("\n") == 1 and "the unit raised SystemExit" in err
    assert not (tmp_path / "u.yaml").exists()


def test_subprocess_unit_answering_more_lines_than_asked_is_refused(tmp_path):
    # one write(2) of both lines: a pipe delivers it whole, so the extra line is already there
    unit = SubprocessUnit(
        _script(tmp_path, "import os, sys\nfor line in sys.stdin: os.write(1, b'0\\n0\\n')"),
        "fp4_e2m1",
        "fp4_e2m1",
        timeout=2,
        chunk=1,
    )
    with pytest.raises(ProbeError, match="answered more lines than it was asked"):
        unit(*_rows())


def test_cli_usage_errors_echo_a_value_cut_short(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(
            [
                "probe",
                "--hw",
                str(OCP),
                "--a-format",
                "fp4_e2m1",
                "--b-format",
                "fp4_e2m1",
                "--k",
                "8",
                "--out",
                str(tmp_path / "u.yaml"),
                "--seed",
                "9" * 100 + "x" * 10_000,
            ]
        )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 250 and "--seed" in err and "9" * 77 + "..." in err
