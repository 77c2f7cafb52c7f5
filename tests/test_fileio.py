"""Untrusted-file reading and atomic writing (mxsim.fileio), including kill safety."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import numpy as np
import pytest

from conftest import REPO
from mxsim.errors import MxsimError
from mxsim.fileio import (
    load_yaml,
    read_npy_file,
    read_npz,
    read_text,
    replace_directory,
    safe_output_path,
    write_atomic,
)
from mxsim.limits import MAX_YAML_DEPTH


def fail(message):
    raise MxsimError(message)


def fail_member(member, message):
    raise MxsimError(f"{member}: {message}")


def npy_bytes(descr, shape, data: bytes, fortran=False) -> bytes:
    header = repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode("latin1")
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + data


def test_read_text_refuses_latin1_and_names_the_offset(tmp_path):
    path = tmp_path / "hw.yaml"
    path.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(MxsimError, match=r"not UTF-8 text \(byte 0xe9 at offset 9\)"):
        read_text(path, fail)
    with pytest.raises(MxsimError, match="no such file"):
        read_text(tmp_path / "missing", fail)


@pytest.mark.parametrize(
    "text",
    [
        "[" * (MAX_YAML_DEPTH + 1) + "]" * (MAX_YAML_DEPTH + 1),
        "[" * 100000 + "]" * 100000,  # deep enough to overflow a recursive loader
    ],
)
def test_load_yaml_refuses_deep_nesting_without_recursing(text):
    with pytest.raises(MxsimError, match=f"nested deeper than {MAX_YAML_DEPTH} levels"):
        load_yaml(text, fail)


def test_load_yaml_counts_aliases_at_their_full_size():
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for level in range(1, 8):
        lines.append(
            f"{chr(97 + level)}: &{chr(97 + level)} ["
            + ", ".join([f"*{chr(96 + level)}"] * 10)
            + "]"
        )
    with pytest.raises(MxsimError, match="expands to more than"):
        load_yaml("\n".join(lines), fail)
    assert load_yaml("a: &x [1, 2]\nb: *x\n", fail) == {"a": [1, 2], "b": [1, 2]}


def test_load_yaml_reports_syntax_errors_on_one_line():
    with pytest.raises(MxsimError, match="not valid YAML") as error:
        load_yaml("a: [1, 2\nb: 3", fail)
    assert "\n" not in str(error.value)


def test_read_npy_checks_the_header_before_allocating(tmp_path):
    path = tmp_path / "x.npy"
    path.write_bytes(npy_bytes("<f4", (10**6, 10**6), b""))
    with pytest.raises(MxsimError, match=r"declares shape \(1000000, 1000000\)"):
        read_npy_file(path, ("float32",), fail)
    path.write_bytes(npy_bytes("<f4", (3,), b"\x00" * 8))  # truncated data
    with pytest.raises(MxsimError, match="truncated or corrupt"):
        read_npy_file(path, ("float32",), fail)
    path.write_bytes(npy_bytes("|O", (2,), b"\x00" * 16))
    with pytest.raises(
        MxsimError, match="pickled \\(object\\) array in the file; mxsim never unpickles"
    ):
        read_npy_file(path, ("float32",), fail)
    path.write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': 3}   \n")
    with pytest.raises(MxsimError, match="not a valid .npy array header"):
        read_npy_file(path, ("float32",), fail)


def test_read_npy_fits_the_budget(tmp_path, monkeypatch):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((64, 64), np.float64))
    monkeypatch.setenv("MXSIM_MAX_BYTES", "16K")
    with pytest.raises(
        MxsimError, match="more than the memory budget of 16 KiB; raise it with MXSIM_MAX_BYTES"
    ):
        read_npy_file(path, ("float64",), fail)
    monkeypatch.setenv("MXSIM_MAX_BYTES", "32K")
    assert read_npy_file(path, ("float64",), fail).shape == (64, 64)


def test_read_npy_reads_fortran_order_and_big_endian_exactly(tmp_path):
    values = np.arange(12, dtype=">f8").reshape(3, 4)
    path = tmp_path / "x.npy"
    np.save(path, np.asfortranarray(values))
    array = read_npy_file(path, ("float64",), fail)
    assert array.dtype == np.float64 and array.dtype.isnative and np.array_equal(array, values)


def test_read_npz_round_trips_and_checks_the_manifest(tmp_path):
    path = tmp_path / "x.npz"
    arrays = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.array([1, 2], dtype=np.int64),
    }
    np.savez_compressed(path, **arrays)
    out = read_npz(
        path, ("float32", "int64"), fail_member, {"a": ((2, 3), "float32"), "b": ((2,), "int64")}
    )
    assert all(
        np.array_equal(out[k], arrays[k]) and out[k].dtype == arrays[k].dtype for k in arrays
    )
    with pytest.raises(MxsimError, match=r"a: shape \(2, 3\) in x.npz, manifest says \(3, 2\)"):
        read_npz(
            path,
            ("float32", "int64"),
            fail_member,
            {"a": ((3, 2), "float32"), "b": ((2,), "int64")},
        )
    with pytest.raises(MxsimError, match="b: x.npz holds arrays the manifest does not list"):
        read_npz(path, ("float32", "int64"), fail_member, {"a": ((2, 3), "float32")})


def test_read_npz_refuses_broken_members(tmp_path):
    path = tmp_path / "x.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a.npy", b"\x93NUMPY\x01\x00garbage")
    with pytest.raises(
        MxsimError, match="a: truncated or corrupt in x.npz: not a valid .npy array header"
    ):
        read_npz(path, ("float32",), fail_member)
    buffer = io.BytesIO()
    np.save(buffer, np.array([None], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a.npy", buffer.getvalue())
    with pytest.raises(MxsimError, match="a: is a pickled \\(object\\) array in x.npz"):
        read_npz(path, ("float32",), fail_member)
    path.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(MxsimError, match="None: x.npz is truncated or corrupt: not a readable NPZ"):
        read_npz(path, ("float32",), fail_member)


def test_write_atomic_leaves_the_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "v.hex"
    target.write_text("old\n")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["v.hex"]


def test_write_atomic_file_mode_follows_umask(tmp_path):
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "x.txt", "x\n")
    finally:
        os.umask(old)
    assert (tmp_path / "x.txt").stat().st_mode & 0o777 == 0o644


def test_replace_directory_swaps_old_for_new(tmp_path):
    old, new = tmp_path / "trace", tmp_path / ".staging"
    old.mkdir()
    (old / "a").write_text("old")
    new.mkdir()
    (new / "b").write_text("new")
    replace_directory(new, old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace"]
    assert [p.name for p in old.iterdir()] == ["b"]


@pytest.mark.parametrize(
    "name, expected",
    [
        ("/model/conv/Conv", "model_conv_Conv.png"),
        ("../../etc/passwd", "etc_passwd.png"),
        ("..", "unnamed.png"),
        ("fc1", "fc1.png"),
    ],
)
def test_safe_output_path_stays_inside_the_directory(tmp_path, name, expected):
    path = safe_output_path(tmp_path, name, ".png")
    assert path.parent == tmp_path.resolve() and path.name == expected


# ----------------------------------------------------------------------------- kill safety

KILLS_PER_WRITER = 5

# Each driver writes one of two complete versions, alternately, forever, after printing
# "ready"; the test kills it with SIGKILL at random moments and checks what is left. The text
# before "ready" runs once in a server process; each writer is a fork of it (so the imports,
# most of a new process's cost, are paid once per driver, not once per kill).
DRIVERS = {
    "golden": """
        from mxsim.golden import generate
        print("ready", flush=True)
        for i in itertools.count():
            generate(HW, OUT, cases=200, seed=i % 2, kinds=["random"], progress=False)
    """,
    "sweep": """
        from mxsim.datapath import load_hwconfig
        from mxsim.sweep import parse_knobs, run_sweep, write_outputs
        from mxsim.trace import load_trace
        trace, base = load_trace(SMALL_TRACE), load_hwconfig(HW2)
        print("ready", flush=True)
        for i in itertools.count():
            knobs = parse_knobs([["adder.align_fraction_bits=6,13", "adder.align_fraction_bits=8,10,20"][i % 2]])
            write_outputs(run_sweep(trace, base, knobs, OUT), OUT)
    """,
    "replay-json": """
        from mxsim.cli import main
        print("ready", flush=True)
        for i in itertools.count():
            main(["replay", TRACE, "--hw", [HW, HW2][i % 2], "--json", OUT, "--quiet"])
    """,
    "save-trace": """
        from mxsim.trace import load_trace, save_trace
        trace = load_trace(TRACE)
        print("ready", flush=True)
        for i in itertools.count():
            trace.name = ["first", "second"][i % 2]
            save_trace(trace, OUT, overwrite=True, compress=False)
    """,
    "capture": """
        from mxsim.cli import main
        print("ready", flush=True)
        for i in itertools.count():
            main(["capture", "onnx", MODEL, "--inputs", INPUTS, "--out", OUT, "--force", "--name", ["first", "second"][i % 2]])
    """,
}


READY = 'print("ready", flush=True)\n'


def _start_driver(name: str, out, env: dict) -> subprocess.Popen:
    """The driver's server: it runs the driver's setup once, then forks a writer for every line
    it reads; the writer prints its pid, then writes what it prints to /dev/null; the server
    prints "dead" once the writer has been reaped."""
    header = textwrap.dedent(f"""
        import itertools, os, sys
        HW = {str(REPO / "hwconfigs/ocp-exact.yaml")!r}
        HW2 = {str(REPO / "hwconfigs/h100-fp8.yaml")!r}
        TRACE = {str(REPO / "traces/digits-cnn")!r}
        MODEL = {str(REPO / "tests/data/trace/digits_cnn.onnx")!r}
        INPUTS = {str(REPO / "tests/data/trace/digits_inputs.npz")!r}
        OUT = {str(out)!r}
        SMALL_TRACE = {str(out.parent / "small-trace")!r}
    """)
    setup, writer = textwrap.dedent(DRIVERS[name]).split(READY)
    server = (
        "while sys.stdin.readline():\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        try:\n"
        "            print('ready', os.getpid(), flush=True)\n"
        "            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the server's line stays its own\n"
        + textwrap.indent(writer, " " * 12)
        + "        finally:\n"
        "            os._exit(1)\n"
        "    os.waitpid(pid, 0)\n"
        "    print('dead', flush=True)\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", header + setup + server],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )


def _run_writer(server: subprocess.Popen, delay: float) -> None:
    """Fork a writer, let it run ``delay`` seconds, SIGKILL it and wait until it is gone."""
    server.stdin.write(b"go\n")
    server.stdin.flush()
    ready, pid = server.stdout.readline().split()
    assert ready == b"ready"
    try:
        time.sleep(delay)
    finally:
        os.kill(int(pid), signal.SIGKILL)
        assert server.stdout.readline().strip() == b"dead"


def _golden_versions(tmp_path):
    from mxsim.golden import generate

    versions = {}
    for seed in (0, 1):
        directory = tmp_path / f"golden-{seed}"
        generate(
            REPO / "hwconfigs/ocp-exact.yaml",
            directory,
            cases=200,
            seed=seed,
            kinds=["random"],
            progress=False,
        )
        versions[seed] = {p.name: p.read_bytes() for p in directory.iterdir()}
    return versions


def _initial_output(writer: str, out, tmp_path) -> None:
    from mxsim.cli import main
    from mxsim.trace import load_trace, save_trace

    if writer == "golden":
        shutil.copytree(tmp_path / "golden-0", out)
    elif writer == "sweep":
        from mxsim.datapath import load_hwconfig
        from mxsim.sweep import parse_knobs, run_sweep, write_outputs

        trace = _small_trace()
        save_trace(trace, tmp_path / "small-trace")
        write_outputs(
            run_sweep(
                trace,
                load_hwconfig(REPO / "hwconfigs/h100-fp8.yaml"),
                parse_knobs(["adder.align_fraction_bits=6,13"]),
                out,
            ),
            out,
        )
    elif writer == "replay-json":
        assert (
            main(
                [
                    "replay",
                    str(REPO / "traces/digits-cnn"),
                    "--hw",
                    str(REPO / "hwconfigs/ocp-exact.yaml"),
                    "--json",
                    str(out),
                    "--quiet",
                ]
            )
            == 0
        )
    elif writer == "save-trace":
        trace = load_trace(REPO / "traces/digits-cnn")
        trace.name = "first"
        save_trace(trace, out)
    else:
        assert (
            main(
                [
                    "capture",
                    "onnx",
                    str(REPO / "tests/data/trace/digits_cnn.onnx"),
                    "--inputs",
                    str(REPO / "tests/data/trace/digits_inputs.npz"),
                    "--out",
                    str(out),
                    "--name",
                    "first",
                ]
            )
            == 0
        )


def _small_trace():
    from mxsim.trace import Layer, Trace

    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 32)).astype(np.float32)
    w = rng.standard_normal((4, 32)).astype(np.float32)
    return Trace(
        "small",
        [Layer("fc", "linear", {"input": x, "weight": w, "output": x @ w.T})],
        {"framework": "numpy"},
        {},
        None,
        None,
    )


def check_whole_golden_output(out, versions) -> None:
    """Every file of one version (old or new), none of the other; the manifest's counts and
    sha256 match the vector files."""
    files = {
        path.name: path.read_bytes() for path in out.iterdir() if not path.name.startswith(".")
    }
    assert [seed for seed, version in versions.items() if files == version], sorted(files)
    manifest = json.loads(files["manifest.json"])
    for unit in manifest["units"]:
        for entry in unit["files"].values():
            text = files[entry["vectors"]]
            assert hashlib.sha256(text).hexdigest() == entry["sha256"]
            assert len(files[entry["labels"]].splitlines()) == entry["count"]


def check_whole_sweep_output(out) -> None:
    """sweep.json and sweep.csv of one run: the same points, each stored under points/."""
    summary = json.loads((out / "sweep.json").read_text())
    rows = (out / "sweep.csv").read_text().splitlines()[1:]
    values = [record["point"]["adder.align_fraction_bits"] for record in summary["points"]]
    assert values in ([6, 13], [8, 10, 20])
    assert [row.split(",")[0] for row in rows] == [f"adder.align_fraction_bits={v}" for v in values]
    assert all((out / "points" / f"{record['key']}.json").is_file() for record in summary["points"])


@pytest.fixture(scope="module")
def driver_env():
    return dict(os.environ, PYTHONPATH=str(REPO))


@pytest.mark.slow  # a process per writer, killed mid-write
@pytest.mark.parametrize("writer", sorted(DRIVERS))
def test_sigkill_leaves_the_old_or_the_new_complete_output(writer, tmp_path, driver_env):
    """SIGKILL at random moments while a writer rewrites its output: what is left is complete."""
    rng = random.Random(writer)
    out = tmp_path / ("out.json" if writer == "replay-json" else "out")
    golden = _golden_versions(tmp_path) if writer == "golden" else None
    _initial_output(
        writer, out, tmp_path
    )  # the old complete output every kill must leave or replace
    server = _start_driver(writer, out, driver_env)
    try:
        for _ in range(KILLS_PER_WRITER):
            _run_writer(server, rng.uniform(0.0, 3.0))
            _check_whole_output(writer, out, golden)
    finally:
        server.kill()
        server.wait()


def _check_whole_output(writer: str, out, golden) -> None:
    from mxsim.trace import load_trace

    assert out.exists()
    if writer == "golden":
        check_whole_golden_output(out, golden)
    elif writer == "sweep":
        check_whole_sweep_output(out)
    elif writer == "replay-json":
        report = json.loads(out.read_text())  # a partial file would not parse
        assert report["units"] in (["ocp-exact"], ["h100-fp8"]) and len(report["layers"]) == 4
    else:
        assert load_trace(out).name in ("first", "second")


def test_load_yaml_refuses_repeated_keys_but_allows_merge_overrides():
    with pytest.raises(
        MxsimError, match=r"a key repeats an earlier key of its mapping \(line 2, column 1\)"
    ):
        load_yaml("a: 1\na: 2\n", fail)
    assert load_yaml("b: &x {a: 1}\nc:\n  <<: *x\n  a: 2\n", fail) == {"b": {"a": 1}, "c": {"a": 2}}


@pytest.mark.parametrize(
    "text",
    [
        "key: [unclosed SECRET-TEXT\n",
        "SECRET-TEXT: !!bool x\n",
        "d: 2001-13-45 # SECRET-TEXT\n",
        "SECRET-TEXT: {a: 1\n",
    ],
)
def test_load_yaml_errors_never_quote_the_text(text):
    with pytest.raises(MxsimError, match="not valid YAML") as error:
        load_yaml(text, fail)
    assert "SECRET" not in str(error.value) and "\n" not in str(error.value)
