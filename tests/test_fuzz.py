"""Fuzzing every public entry point as a hostile user would.

Five families of cases, each generated from one integer seed (hypothesis draws the seeds,
derandomized, so a run is reproducible; a failure prints the family and seed):

* ``hwconfig``: the shipped hardware configs mutated (values, keys, nesting, bytes,
  encodings), loaded, and run through ``dot``/``explain`` and a cycle estimate;
* ``manifest``: a small trace's manifest.yaml mutated, loaded and replayed;
* ``npz``: its NPZ files mutated (``.npy`` headers declaring huge shapes or odd dtypes,
  truncation, pickled members, zip damage), loaded and replayed;
* ``api``: public functions called with random and hostile arguments;
* ``cli``: random argument lists for every subcommand, with hostile files (model
  directories without a model and factories that fail, for ``capture torch`` and
  ``evaluate hf``: no case runs a model).

Every case must end in success or an mxsim error (the CLI: status 0 or 2, and for 2 exactly
one line on stderr), write nothing outside its output directory, keep the traced peak of
allocated memory under PEAK_LIMIT_BYTES with the memory budget set to FUZZ_BUDGET, and
finish within CASE_SECONDS (GOLDEN_CASE_SECONDS for golden runs). ``pytest --fuzz`` runs FUZZ_RELEASE_CASES per family instead of
the CI-sized count and prints a table of outcomes per family; with ``MXSIM_FUZZ_LOG=FILE``
every case's outcome is also appended to FILE as a JSON line.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import itertools
import json
import math
import os
import random
import shutil
import signal
import time
import tracemalloc
import traceback
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import mxsim
import mxsim.trace
import mxsim.replay.run
from conftest import FUZZ_OUTCOMES, REPO, without_compile_notice
from mxsim.errors import MxsimError
from mxsim.formats import get_format

FAMILIES = (
    "hwconfig",
    "manifest",
    "npz",
    "api",
    "cli",
    "sweep",
    "extends",
    "golden_pair",
    "scheduler",
    "files",
    "model_dir",
    "probe_box",
    "trace_v2",
    "datapath_bounds",
    "nvfp4",
)
CI_CASES = 40
#: CI-sized counts of the families whose cases take longer (seconds each: golden runs, sockets,
#: model loads, unit processes).
CI_CASES_OF = {
    "sweep": 25,
    "extends": 30,
    "golden_pair": 8,
    "scheduler": 15,
    "files": 25,
    "model_dir": 8,
    "probe_box": 15,
    "trace_v2": 20,
    "datapath_bounds": 20,
    "nvfp4": 30,
}
FUZZ_RELEASE_CASES = 2000
FUZZ_BUDGET = "32M"
PEAK_LIMIT_BYTES = 256 << 20
CASE_SECONDS = 30.0
#: Golden runs write a fixed corner set per format pair (about 45,000 vectors for a unit with 36
#: pairs and fp32 output, 7-30 s without tracemalloc on 2 cores): work set by the config, not by
#: a hostile input, so those cases get this bound instead.
GOLDEN_CASE_SECONDS = 150.0
HWCONFIGS = sorted((REPO / "hwconfigs").glob("*.yaml"))
OUTCOMES: dict[str, Counter] = {family: Counter() for family in FAMILIES}


class CaseTimeout(BaseException):
    """Raised in a case that ran past CASE_SECONDS (a BaseException: no handler swallows it)."""


# ----------------------------------------------------------------------------- hostile values


def hostile(rng: random.Random, depth: int = 0):
    """One value a careless or hostile user might put anywhere."""
    pool = [
        0,
        1,
        -1,
        2,
        7,
        31,
        32,
        33,
        4096,
        4097,
        2**31,
        2**32 + 1,
        2**63,
        10**30,
        -(10**30),
        0.5,
        1.5,
        -0.0,
        math.nan,
        math.inf,
        -math.inf,
        1e308,
        "",
        "x",
        "fp8_e4m3",
        "fp32",
        "exact",
        "nearest_even",
        "ocp",
        "../../outside",
        "/abs/name",
        "\x00",
        "é" * 3,
        "a" * 500,
        True,
        False,
        None,
    ]
    kind = rng.random()
    if kind < 0.7 or depth > 2:
        return rng.choice(pool)
    if kind < 0.8:
        return [hostile(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind < 0.9:
        return {
            rng.choice(["a", "name", "kind", "format", 1]): hostile(rng, depth + 1)
            for _ in range(rng.randint(0, 3))
        }
    if kind < 0.95:
        return list(range(rng.choice([100, 5000])))
    nested: list = []
    for _ in range(rng.choice([50, 200])):
        nested = [nested]
    return nested


def deep_yaml(rng: random.Random) -> str:
    levels = rng.choice([70, 1000, 20000])
    if rng.random() < 0.5:
        return "[" * levels + "]" * levels + "\n"
    return "".join(" " * i + "a:\n" for i in range(min(levels, 3000))) + " " * 3000 + "b: 1\n"


def billion_laughs() -> str:
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for level in range(1, 9):
        refs = ", ".join([f"*{chr(96 + level)}"] * 9)
        lines.append(f"{chr(97 + level)}: &{chr(97 + level)} [{refs}]")
    return "\n".join(lines) + "\n"


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value[:8]):
            yield from _paths(item, prefix + (index,))


def mutate_document(rng: random.Random, doc, rounds: int | None = None):
    """``doc`` (parsed YAML) with 1-3 structural mutations at random key paths."""
    doc = copy.deepcopy(doc)
    for _ in range(rounds or rng.randint(1, 3)):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            return hostile(rng)
        path = rng.choice(paths)
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        action = rng.random()
        if action < 0.55:
            parent[key] = hostile(rng)
        elif action < 0.7 and isinstance(parent, dict):
            del parent[key]
        elif action < 0.8 and isinstance(parent, dict):
            parent[rng.choice(["unknown", "x", 3, "layers", "inputs"])] = hostile(rng)
        elif action < 0.9:
            parent[key] = [parent[key]]
        else:
            value = parent[key]
            if isinstance(value, int) and not isinstance(value, bool):
                parent[key] = rng.choice(
                    [value * 1000, -value, value + 1, 10 ** rng.randint(3, 20), 0]
                )
            else:
                parent[key] = hostile(rng)
    return doc


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if not data:
            break
        position = rng.randrange(len(data))
        action = rng.random()
        if action < 0.4:
            data[position] = rng.randrange(256)
        elif action < 0.6:
            del data[position : position + rng.randint(1, 64)]
        elif action < 0.8:
            data[position:position] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        else:
            del data[position:]
    return bytes(data)


def mutate_text(rng: random.Random, text: str) -> bytes:
    """A YAML text mutated as bytes, re-encoded, nested deeply, or replaced."""
    action = rng.random()
    if action < 0.35:
        return mutate_bytes(rng, text.encode())
    if action < 0.5:
        return (text + "\ndescription: caf\u00e9\n").encode("latin-1", errors="replace")
    if action < 0.6:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 400)))
    if action < 0.75:
        return deep_yaml(rng).encode()
    if action < 0.8:
        return billion_laughs().encode()
    if action < 0.85:
        return text.encode("utf-16")
    return b""


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def fuzz_env(tmp_path_factory, request):
    """The base trace, the hostile files, warm kernels, and the fuzz budget."""
    root = tmp_path_factory.mktemp("fuzz-base")
    trace = _small_trace()
    mxsim.trace.save_trace(
        trace, root / "trace", floats=False
    )  # version 2: blobs, codes and scales
    hw = mxsim.load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml")
    warm_kernels()
    mxsim.replay.run.replay(mxsim.trace.load_trace(root / "trace"), [hw], end_to_end=True)
    previous = os.environ.get("MXSIM_MAX_BYTES")
    os.environ["MXSIM_MAX_BYTES"] = FUZZ_BUDGET
    release = request.config.getoption("--fuzz")
    env = {
        "root": root,
        "hw": hw,
        "release": release,
        "cases": int(os.environ.get("MXSIM_FUZZ_CASES", FUZZ_RELEASE_CASES)) if release else None,
    }
    yield env
    for sock in env.get("sockets", []):
        sock.close()
    if previous is None:
        del os.environ["MXSIM_MAX_BYTES"]
    else:
        os.environ["MXSIM_MAX_BYTES"] = previous
    request.config.stash[FUZZ_OUTCOMES] = {
        family: dict(counts) for family, counts in OUTCOMES.items() if counts
    }


def warm_kernels() -> None:
    """Compile (or load from Numba's cache) every kernel signature the cases reach.

    First-time compilation takes minutes on a loaded machine; it is done here, outside the
    per-case time bound, so the bound measures the work a case asks for.
    """
    for dtype in (np.float16, np.float32, np.float64):
        x = np.linspace(-3, 3, 80).astype(dtype).reshape(2, 40)
        mxsim.fake_quantize(x, "fp4_e2m1")
        for element in ("fp8_e4m3", "fp16", "tf32"):  # codes of 8, 16 and 32 bits
            tensor = mxsim.quantize_mx(x, element)
            tensor.dequantize(np.float32), tensor.dequantize(np.float64)
    for name in (
        "fp8_e4m3",
        "fp32",
        "fp16",
        "mx9",
    ):  # encode: the CLI's exact values, explain's outputs
        fmt = mxsim.get_format(name)
        fmt.decode(fmt.encode(np.linspace(-3, 3, 80)))
    for spec in mxsim.BFP_SPECS:
        mxsim.quantize_bfp(np.ones((2, 40), np.float32), spec).dequantize()
    for path in HWCONFIGS:
        hw = mxsim.load_hwconfig(path)
        for a_format in hw.a_formats:
            b_format = a_format if a_format in hw.b_formats else hw.b_formats[0]
            # codes of 1.0: valid in every format (tf32 codes keep their low 13 bits zero)
            a_codes, b_codes = (
                mxsim.get_format(name).encode(np.ones((1, 33))) for name in (a_format, b_format)
            )
            for out_format, method in itertools.product(
                ("fp32", "fp16", "bf16"), ("auto", "kernel")
            ):
                with contextlib.suppress(MxsimError):
                    mxsim.dot(
                        hw,
                        a_codes,
                        b_codes,
                        a_format=a_format,
                        b_format=b_format,
                        out_format=out_format,
                        method=method,
                    )
        b_format = hw.b_formats[0]
        unscaled = (
            hw.sections[("inputs", "scales")] == "none"
        )  # per-tensor operands reach the window route
        for method in ("auto", "kernel"):
            a = mxsim.quantize_mx(
                np.ones((2, 64)),
                hw.a_formats[0],
                axis=1,
                per_tensor_scale=unscaled,
                block_size=hw.params(hw.a_formats[0], b_format).block_size,
            )
            b = mxsim.quantize_mx(
                np.ones((64, 2)),
                b_format,
                axis=0,
                block_size=a.block_size,
                per_tensor_scale=unscaled,
            )
            with contextlib.suppress(MxsimError):  # units without scales refuse scaled operands
                mxsim.matmul(hw, a, b, method=method)


def _small_trace() -> mxsim.trace.Trace:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 40)).astype(np.float32)
    w1 = rng.standard_normal((6, 40)).astype(np.float32)
    h = x @ w1.T
    w2 = rng.standard_normal((6, 4)).astype(np.float32)
    layers = [
        mxsim.trace.Layer(
            "fc1",
            "linear",
            {"input": x, "weight": w1, "output": h},
            quant={
                "input": mxsim.trace.MXQuant("fp8_e4m3", -1, 32, "ocp", (), False),
                "weight": mxsim.trace.MXQuant("fp8_e4m3", 1, 32),
            },
        ),  # compact: a residual output
        mxsim.trace.Layer("mm", "matmul", {"input": h, "weight": w2, "output": h @ w2}),
    ]
    dataset = {"inputs": x, "labels": np.array([0, 1, 2], dtype=np.int64)}
    network = mxsim.trace.Network("inputs", ({"layer": "fc1"}, {"layer": "mm"}), "labels")
    return mxsim.trace.Trace("fuzz", layers, {"framework": "numpy"}, {}, dataset, network)


# ----------------------------------------------------------------------------- one case


def _snapshot(directory: Path) -> dict[str, tuple]:
    out = {}
    for path in directory.rglob("*"):
        with contextlib.suppress(OSError):
            stat = path.lstat()
            out[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return out


def run_case(family: str, seed: int, env: dict, sandbox: Path) -> str | None:
    """Run one case and count its outcome; return None, or a description of the failure."""
    rng = random.Random(f"{family}:{seed}")
    case = sandbox / f"{family}-{seed}"
    shutil.rmtree(case, ignore_errors=True)  # hypothesis may draw a seed twice
    inputs, outputs = case / "in", case / "out"
    inputs.mkdir(parents=True)
    outputs.mkdir()
    action = GENERATORS[family](rng, env, inputs, outputs)
    if env.get("release") and hasattr(
        action, "warm"
    ):  # first-use compiles outside the bound (not in CI: its cost)
        with contextlib.suppress(Exception):
            action.warm()
    before = _snapshot(sandbox)
    root_before = set(os.listdir("/"))

    fired = []

    def on_alarm(signum, frame):
        fired.append(
            True
        )  # recorded here: code that maps every BaseException to its error still counts as a hang
        raise CaseTimeout()

    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    bound = getattr(action, "seconds", CASE_SECONDS)
    signal.setitimer(signal.ITIMER_REAL, bound)
    tracemalloc.start()
    started = time.monotonic()
    failure = None
    try:
        action()
    except CaseTimeout:
        failure = ("timeout", f"ran past {bound} s")
    except CodeExecution as error:
        failure = ("code", str(error))
    except UnboundedEcho as error:
        failure = ("echo", str(error))
    except Disclosure as error:
        failure = ("disclosure", str(error))
    except SilentWrong as error:
        failure = ("wrong", str(error))
    except MxsimError:
        pass
    except Exception:  # anything else is a raw traceback for the user
        failure = ("traceback", traceback.format_exc(limit=-8))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        elapsed = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    if failure is None and fired:
        failure = ("timeout", f"ran past {bound} s (the alarm was caught)")
    if failure is None and elapsed > bound:
        failure = ("timeout", f"took {elapsed:.1f} s")
    if failure is None and peak > PEAK_LIMIT_BYTES:
        failure = ("memory", f"traced peak {peak >> 20} MiB")
    if failure is None:
        after = _snapshot(sandbox)
        changed = [
            p for p, v in after.items() if before.get(p) != v and not p.startswith(str(outputs))
        ]
        escaped = sorted(set(os.listdir("/")) - root_before)
        if changed or escaped:
            failure = ("escape", f"wrote outside the output directory: {(changed + escaped)[:3]}")
    shutil.rmtree(case, ignore_errors=True)
    OUTCOMES[family]["cases"] += 1
    OUTCOMES[family][failure[0] if failure else "ok"] += 1
    OUTCOMES[family]["seconds"] = round(OUTCOMES[family]["seconds"] + elapsed, 1)
    OUTCOMES[family]["max_seconds"] = round(max(OUTCOMES[family]["max_seconds"], elapsed), 2)
    if os.environ.get("MXSIM_FUZZ_LOG"):  # one JSON line per case, for long campaigns
        with open(os.environ["MXSIM_FUZZ_LOG"], "a", encoding="utf-8") as log:
            log.write(
                json.dumps(
                    {
                        "family": family,
                        "seed": seed,
                        "outcome": failure[0] if failure else "ok",
                        "seconds": round(elapsed, 3),
                        "peak_bytes": peak,
                        "detail": failure[1][-2000:] if failure else None,
                    }
                )
                + "\n"
            )
    return None if failure is None else f"{family} case seed={seed}: {failure[0]}: {failure[1]}"


# ----------------------------------------------------------------------------- generators


def _exercise_config(rng: random.Random, hw) -> None:
    """Run what a loaded config drives: one dot product, its explanation, a cycle estimate."""
    a_format, b_format = rng.choice(hw.format_pairs)
    params = hw.params(a_format, b_format)
    length = rng.choice([0, 1, params.block_size, 2 * params.block_size + 1])
    a_bits, b_bits = mxsim.get_format(a_format).bits, mxsim.get_format(b_format).bits
    # uint64: fp64 codes reach 2^64 - 1, past int64
    a = np.array([[rng.randrange(1 << a_bits) for _ in range(length)]], dtype=np.uint64)
    b = np.array([[rng.randrange(1 << b_bits) for _ in range(length)]], dtype=np.uint64)
    mxsim.dot(hw, a, b, a_format=a_format, b_format=b_format)
    short = min(length, 64)  # explain runs the pure-Python reference twin
    mxsim.explain(
        hw,
        a[0, :short],
        b[0, :short],
        a_format=a_format,
        b_format=b_format,
        c=rng.choice([0.0, -1.5, 1e30]),
    )
    if hw.array is not None:
        from mxsim.cycles import estimate_layers, storage_for_format
        from mxsim.cycles.layers import GemmLayer

        storage = storage_for_format(a_format)
        estimate_layers(
            hw.array,
            [GemmLayer("g", rng.choice([1, 64, 10**6]), 64, 256)],
            storage,
            storage,
            storage_for_format("fp32"),
        )


def gen_hwconfig(rng, env, inputs, outputs):
    base = rng.choice(HWCONFIGS)
    text = base.read_text()
    path = inputs / "hw.yaml"
    if rng.random() < 0.6:
        doc = mutate_document(rng, yaml.safe_load(text))
        try:
            path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        except (yaml.YAMLError, ValueError, RecursionError):
            path.write_bytes(b"name: [unclosed\n")
    else:
        path.write_bytes(mutate_text(rng, text))

    def action():
        _exercise_config(rng, mxsim.load_hwconfig(path))

    return action


def _copy_trace(env, inputs) -> Path:
    target = inputs / "trace"
    shutil.copytree(env["root"] / "trace", target)
    return target


def _load_and_replay(rng, env, trace_dir):
    from mxsim.replay import replay

    trace = mxsim.trace.load_trace(trace_dir)
    replay(trace, [env["hw"]], end_to_end=rng.random() < 0.5)


def _hostile_trace_edit(rng, trace_dir: Path, inputs: Path) -> None:
    """One of the known-hostile edits: a symlink out of the trace, a flatten past the rank,
    labels one short or long."""
    manifest = trace_dir / "manifest.yaml"
    doc = yaml.safe_load(manifest.read_text())
    choice = rng.randrange(3)
    if choice == 0:  # a symlink leading out of the trace
        victim = rng.choice(
            [
                manifest,
                trace_dir / "tensors",
                trace_dir / "dataset.npz",
                rng.choice(sorted((trace_dir / "tensors").iterdir())),
            ]
        )
        outside = inputs / "outside" / victim.name
        outside.parent.mkdir(exist_ok=True)
        victim.rename(outside)
        victim.symlink_to(outside)
        return
    if choice == 1:
        doc["network"]["steps"].insert(
            rng.randrange(len(doc["network"]["steps"]) + 1),
            {"op": "flatten", "start_dim": rng.choice([0, 1, 2, 3, 5, 2**40])},
        )
    else:
        with np.load(trace_dir / "dataset.npz") as npz:
            arrays = {key: npz[key] for key in npz.files}
        labels = arrays["labels"]
        arrays["labels"] = labels[:-1] if rng.random() < 0.5 else np.append(labels, labels[:1])
        np.savez(trace_dir / "dataset.npz", **arrays)
        doc["dataset"]["tensors"]["labels"]["shape"] = list(arrays["labels"].shape)
    manifest.write_text(yaml.safe_dump(doc, sort_keys=False))


def gen_manifest(rng, env, inputs, outputs):
    trace_dir = _copy_trace(env, inputs)
    manifest = trace_dir / "manifest.yaml"
    if rng.random() < 0.2:
        _hostile_trace_edit(rng, trace_dir, inputs)
    elif rng.random() < 0.75:
        doc = mutate_document(rng, yaml.safe_load(manifest.read_text()))
        try:
            manifest.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        except (yaml.YAMLError, ValueError, RecursionError):
            manifest.write_bytes(b"format: [\n")
    else:
        manifest.write_bytes(mutate_text(rng, manifest.read_text()))
    return lambda: _load_and_replay(rng, env, trace_dir)


def npy_bytes(descr, fortran, shape, data: bytes, version=(1, 0)) -> bytes:
    """A .npy file with an arbitrary (possibly lying) header."""
    header = repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode("latin1")
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    if version == (1, 0):
        prefix = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little")
    else:
        prefix = b"\x93NUMPY" + bytes(version) + len(header).to_bytes(4, "little")
    return prefix + header + data


def _mutated_member(rng: random.Random, original: np.ndarray) -> bytes:
    data = original.tobytes()
    descr = rng.choice(
        [
            "<f4",
            "<f8",
            ">f4",
            "|O",
            "<i8",
            "|b1",
            "V8",
            "<c16",
            [("a", "<f4")],
            "garbage",
            7,
            original.dtype.str,
        ]
    )
    shape = rng.choice(
        [
            original.shape,
            (2**40,),
            (2**31, 2**31),
            (-1,),
            (0,),
            (1, 2, 3),
            "x",
            (10**30,),
            original.shape[::-1],
            (original.size + 1,),
        ]
    )
    if rng.random() < 0.3:
        data = data[: rng.randrange(len(data) + 1)]
    elif rng.random() < 0.2:
        data += b"\x00" * rng.randint(1, 64)
    version = rng.choice([(1, 0), (1, 0), (2, 0), (3, 0), (9, 9)])
    raw = npy_bytes(descr, rng.random() < 0.2, shape, data, version)
    if rng.random() < 0.15:
        raw = mutate_bytes(rng, raw[:128]) + raw[128:]
    return raw


def gen_npz(rng, env, inputs, outputs):
    trace_dir = _copy_trace(env, inputs)
    files = sorted(trace_dir.rglob("*.npz"))
    target = rng.choice(files)
    with np.load(target, allow_pickle=False) as npz:
        arrays = {key: npz[key] for key in npz.files}
    action = rng.random()
    if action < 0.5:  # one member with a lying or broken header
        victim = rng.choice(sorted(arrays))
        with zipfile.ZipFile(
            target, "w", rng.choice([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
        ) as archive:
            for key, array in arrays.items():
                buffer = io.BytesIO()
                np.save(buffer, array)
                archive.writestr(
                    f"{key}.npy",
                    _mutated_member(rng, array) if key == victim else buffer.getvalue(),
                )
    elif action < 0.65:
        target.write_bytes(mutate_bytes(rng, target.read_bytes()))
    elif action < 0.75:  # a pickled object array
        buffer = io.BytesIO()
        np.save(buffer, np.array([{"x": 1}, None], dtype=object), allow_pickle=True)
        with zipfile.ZipFile(target, "a") as archive:
            archive.writestr(rng.choice(["input.npy", "extra.npy"]), buffer.getvalue())
    elif action < 0.85:  # odd members
        with zipfile.ZipFile(target, "a") as archive:
            archive.writestr(rng.choice(["notes.txt", "dir/", "input.npy", "../x.npy"]), b"hello")
    else:  # the manifest declares a huge shape that the file also claims
        manifest = trace_dir / "manifest.yaml"
        doc = yaml.safe_load(manifest.read_text())
        layer = rng.choice(doc["layers"])
        key = rng.choice(sorted(layer["tensors"]))
        huge = [rng.choice([2**20, 2**31, 10**12]), 40]
        entry = layer["tensors"][key]
        entry["shape"] = huge
        manifest.write_text(yaml.safe_dump(doc, sort_keys=False))
        blob = entry.get("blob") or entry.get("codes") or entry.get("residual")
        with zipfile.ZipFile(trace_dir / "tensors" / f"{blob}.npz", "a") as archive:
            archive.writestr("data.npy", npy_bytes("|u1", False, (4, huge[0] * huge[1]), b""))
    return lambda: _load_and_replay(rng, env, trace_dir)


def _random_array(rng: random.Random):
    shape = rng.choice(
        [(4, 40), (3, 32), (0, 32), (4, 0), (0,), (), (2, 3, 5), (1, 1), (64,), (2, 2, 0)]
    )
    dtype = rng.choice(
        [np.float32, np.float64, np.float16, np.int64, np.uint8, np.bool_, object, np.complex64]
    )
    nprng = np.random.default_rng(rng.randrange(2**32))
    array = np.asarray(
        (nprng.standard_normal(shape) * rng.choice([1, 1e-30, 1e30, 448])).astype(dtype)
    )
    if rng.random() < 0.2 and array.size and array.dtype.kind == "f":
        array.flat[0] = rng.choice([np.nan, np.inf, -np.inf])
    return array


def _arg(rng: random.Random, good):
    """Mostly a plausible value, sometimes a hostile one."""
    return good() if rng.random() < 0.7 else hostile(rng)


def _codes(rng: random.Random, bits: int):
    rows, length = rng.choice([(2, 32), (1, 5), (0, 8), (3, 0), (1, 64)])
    return np.array(
        [[rng.randrange(1 << bits) for _ in range(length)] for _ in range(rows)], dtype=np.int64
    ).reshape(rows, length)


def gen_api(rng, env, inputs, outputs):
    from mxsim.cycles import read_scalesim_topology
    from mxsim.golden import generate

    hw = env["hw"]
    formats = list(mxsim.FORMATS) + ["MXFP4E2M1"]
    option_names = [
        "scale_rule",
        "exponent_source",
        "element_rounding",
        "element_overflow",
        "nonfinite",
        "scale_underflow",
        "scale_overflow",
        "int8_minus_two",
        "even_fraction_bits",
        "seed",
        "bogus",
    ]
    option_values = [
        "floor",
        "even",
        "rceil",
        "bits",
        "log2",
        "nearest_even",
        "stochastic",
        "saturate",
        "inf_nan",
        "propagate",
        "clamp",
        "unclamped",
        True,
        (("int8", 8),),
        3,
    ]

    def options():
        return {
            rng.choice(option_names): _arg(rng, lambda: rng.choice(option_values))
            for _ in range(rng.randint(0, 2))
        }

    def quantize_like(fn):
        return lambda: fn(
            _arg(rng, lambda: _random_array(rng)),
            _arg(rng, lambda: rng.choice(formats)),
            axis=_arg(rng, lambda: rng.choice([-1, 0, 1, 2, -3])),
            block_size=_arg(rng, lambda: rng.choice([1, 2, 32, 33, 4096, 4097, 0, 10**12])),
            profile=_arg(rng, lambda: rng.choice(list(mxsim.PROFILES))),
            **options(),
        )

    def dot_call():
        a_format = _arg(rng, lambda: rng.choice(hw.a_formats))
        b_format = _arg(rng, lambda: rng.choice(hw.b_formats))
        a = _arg(rng, lambda: _codes(rng, 8))
        b = _arg(rng, lambda: a if isinstance(a, np.ndarray) else _codes(rng, 8))
        rows = a.shape[0] if isinstance(a, np.ndarray) and a.ndim == 2 else 1
        length = a.shape[1] if isinstance(a, np.ndarray) and a.ndim == 2 else 1
        scale = _arg(
            rng, lambda: np.full((rows, -(-length // 32)), rng.choice([0, 127, 254, 255]), np.int64)
        )
        c = _arg(rng, lambda: np.full(rows, rng.choice([0.0, np.nan, 3e38]), np.float32))
        mxsim.dot(
            _arg(rng, lambda: hw),
            a,
            b,
            a_format=a_format,
            b_format=b_format,
            scale_a=scale,
            scale_b=None if rng.random() < 0.5 else scale,
            c=c,
            out_format=_arg(rng, lambda: rng.choice([None, "fp32", "fp16", "bf16"])),
        )

    def matmul_call():
        shapes = rng.choice(
            [
                ((4, 64), (64, 3)),
                ((0, 32), (32, 2)),
                ((2, 32), (32, 0)),
                ((2, 0), (0, 2)),
                ((3, 5), (4, 2)),
                ((2, 33), (33, 2)),
            ]
        )
        a = _arg(rng, lambda: np.random.default_rng(rng.randrange(99)).standard_normal(shapes[0]))
        b = _arg(rng, lambda: np.random.default_rng(rng.randrange(99)).standard_normal(shapes[1]))
        if rng.random() < 0.2:
            a, b = b, a
        mxsim.matmul(
            _arg(rng, lambda: hw),
            a,
            b,
            a_format=_arg(rng, lambda: None),
            b_format=_arg(rng, lambda: None),
            c=_arg(rng, lambda: None),
            out_format=_arg(rng, lambda: None),
            progress=_arg(rng, lambda: None),
            tile_rows=_arg(rng, lambda: 2),
            method=_arg(rng, lambda: rng.choice(["auto", "kernel"])),
        )

    def matmul_batched_call():
        shapes = rng.choice(
            [
                ((3, 4, 64), (3, 64, 3)),
                ((0, 2, 32), (0, 32, 2)),
                ((2, 0, 32), (2, 32, 2)),
                ((2, 3, 5), (2, 4, 2)),
                ((2, 2, 33), (3, 33, 2)),
                ((4, 64), (64, 3)),
            ]
        )
        a = _arg(rng, lambda: np.random.default_rng(rng.randrange(99)).standard_normal(shapes[0]))
        b = _arg(rng, lambda: np.random.default_rng(rng.randrange(99)).standard_normal(shapes[1]))
        if rng.random() < 0.2 and isinstance(a, np.ndarray) and a.ndim == 3:
            a = [mxsim.quantize_mx(m, "fp8_e4m3", axis=rng.choice([0, 1])) for m in a]
        mxsim.matmul_batched(
            _arg(rng, lambda: hw),
            a,
            b,
            c=_arg(rng, lambda: None),
            out_format=_arg(rng, lambda: None),
            progress=_arg(rng, lambda: None),
            tile_rows=_arg(rng, lambda: 2),
            method=_arg(rng, lambda: rng.choice(["auto", "kernel"])),
            per_tensor_scale=_arg(rng, lambda: rng.random() < 0.5),
        )

    def explain_call():
        length = rng.choice([0, 1, 5, 32, 40])
        a = _arg(rng, lambda: [rng.randrange(256) for _ in range(length)])
        b = _arg(rng, lambda: [rng.randrange(256) for _ in range(length)])
        if rng.random() < 0.2:
            a = [float(v) for v in a if isinstance(v, (int, float))] if isinstance(a, list) else a
        if rng.random() < 0.1 and isinstance(b, list):
            b = b[:-1]
        mxsim.explain(
            hw,
            a,
            b,
            a_format="fp8_e4m3",
            b_format="fp8_e4m3",
            scale_a=_arg(rng, lambda: None),
            scale_b=_arg(rng, lambda: [127] * -(-length // 32)),
            c=_arg(rng, lambda: rng.choice([0.0, 1.5, -7])),
            out_format=_arg(rng, lambda: None),
        )

    def bfp_call():
        spec = _arg(rng, lambda: rng.choice(list(mxsim.BFP_SPECS)))
        if rng.random() < 0.3:
            spec = mxsim.BFPSpec(
                _arg(rng, lambda: "to_bfp"),
                _arg(rng, lambda: 16),
                _arg(rng, lambda: 8),
                _arg(rng, lambda: 8),
                _arg(rng, lambda: 0),
            )
        mxsim.quantize_bfp(_arg(rng, lambda: _random_array(rng)), spec, axis=_arg(rng, lambda: -1))

    def golden_call():
        generate(
            _arg(rng, lambda: REPO / "hwconfigs" / "ocp-exact.yaml"),
            outputs / "golden",
            cases=_arg(rng, lambda: rng.choice([0, 1, 5])),
            seed=_arg(rng, lambda: rng.choice([0, 7])),
            kinds=_arg(rng, lambda: rng.choice([["random"], ["corners"], "random"])),
            dot_length=_arg(rng, lambda: None),
        )

    def trace_io_call():
        trace = _small_trace()
        if rng.random() < 0.5:
            layer = trace.layers[0]
            choice = rng.random()
            if choice < 0.3:
                layer.name = hostile(rng)
            elif choice < 0.6:
                layer.tensors["input"] = _random_array(rng)
            else:
                layer.attrs = hostile(rng)
        target = outputs / rng.choice(["t", "nested/t", "t"])
        mxsim.trace.save_trace(trace, target, overwrite=rng.random() < 0.5)
        mxsim.trace.save_trace(trace, target, overwrite=rng.random() < 0.5)
        mxsim.trace.load_trace(_arg(rng, lambda: target))

    csv = inputs / "topology.csv"  # written here: the harness's inputs exist before the case starts

    def topology_call():
        from mxsim.cycles import estimate_layers, storage_for_format

        layers = read_scalesim_topology(csv)
        storage = storage_for_format("fp8_e4m3")
        estimate_layers(
            mxsim.load_hwconfig(REPO / "hwconfigs" / "mxdotp.yaml").array,
            layers,
            storage,
            storage,
            storage_for_format("fp32"),
        )

    def misc_call():
        choice = rng.random()
        if choice < 0.3:
            mxsim.get_format(hostile(rng))
        elif choice < 0.6:
            mxsim.custom_format(*(hostile(rng) for _ in range(rng.randint(2, 4))))
        elif choice < 0.8:
            mxsim.load_hwconfig(rng.choice([hostile(rng), inputs, inputs / "missing.yaml"]))
        else:
            mxsim.trace.load_trace(rng.choice([hostile(rng), inputs, inputs / "missing"]))

    text = rng.choice(
        [
            "Layer, M, N, K,\nfc, 64, 128, 256,\n",
            "Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, Num Filter, Strides,\n"
            f"DPconv, 8, 8, 3, 3, {rng.choice([3, 10**9])}, 1, 1,\n",
            f"Layer, M, N, K,\nfc, {10 ** rng.randint(1, 40)}, 1, -3,\n",
        ]
    ).encode()
    csv.write_bytes(
        mutate_bytes(rng, text)
        if rng.random() < 0.4
        else (text + "caf\u00e9".encode("latin-1"))
        if rng.random() < 0.3
        else text
    )
    calls = [
        quantize_like(mxsim.quantize_mx),
        quantize_like(mxsim.fake_quantize),
        dot_call,
        matmul_call,
        matmul_batched_call,
        explain_call,
        bfp_call,
        golden_call,
        trace_io_call,
        topology_call,
        misc_call,
    ]
    golden_call.seconds = GOLDEN_CASE_SECONDS
    return rng.choice(calls)


def _cli_files(rng: random.Random, env, inputs: Path) -> dict[str, list[str]]:
    np.save(inputs / "good.npy", np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32))
    (inputs / "empty.npy").write_bytes(b"")
    np.save(inputs / "empty2d.npy", np.zeros((0, 4), np.float32))
    (inputs / "huge.npy").write_bytes(npy_bytes("<f4", False, (10**6, 10**6), b""))
    np.save(inputs / "object.npy", np.array([None, {}], dtype=object), allow_pickle=True)
    (inputs / "latin1.yaml").write_bytes("name: caf\u00e9\n".encode("latin-1"))
    (inputs / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (inputs / "deep.yaml").write_text(deep_yaml(rng))
    (inputs / "topo.csv").write_text("Layer, M, N, K,\nfc, 64, 128, 256,\n")
    (inputs / "inputs.npz").write_bytes(
        mutate_bytes(rng, (REPO / "tests/data/trace/digits_inputs.npz").read_bytes())
    )
    (inputs / "inputs.txt").write_bytes(
        mutate_bytes(rng, "pos\tthe cat sat\n\n0\ta dog ran\n".encode())
    )
    shutil.copytree(env["root"] / "trace", inputs / "trace")
    bad = [
        str(inputs / name)
        for name in (
            "empty.npy",
            "huge.npy",
            "object.npy",
            "latin1.yaml",
            "binary.bin",
            "deep.yaml",
            "missing.file",
        )
    ] + [str(inputs), "", "-", "/"]
    return {
        "hw": [str(p) for p in HWCONFIGS] + bad,
        "npy": [str(inputs / "good.npy"), str(inputs / "empty2d.npy")] + bad,
        "source": [str(inputs / "topo.csv"), str(inputs / "trace")] + bad,
        "trace": [str(inputs / "trace")] + bad,
        "text": [str(inputs / "inputs.txt")] + bad,
    }


def _number_text(rng: random.Random) -> str:
    return rng.choice(
        [
            "0",
            "1",
            "-1",
            "32",
            "4096",
            "0x10",
            "1000000000000",
            "-5",
            "1.5",
            "nan",
            "inf",
            "",
            "abc",
            "9" * 40,
            "2147483648",
        ]
    )


def gen_cli(rng, env, inputs, outputs):
    from mxsim.cli import main

    files = _cli_files(rng, env, inputs)
    values = lambda: rng.choice(
        ["1,2,0.5", "0.001953125", "", "1e309", "nan", "x,y", ",,", "1," * 70, "-0"]
    )
    codes = lambda: rng.choice(
        ["0x38,0x40", "1", "", "300", "-1", "99999999999999999999", "0xzz", "1.5"]
    )
    fmt = lambda: rng.choice(["fp8_e4m3", "fp4_e2m1", "int8", "fp32", "bogus", "", "MXFP6E2M3"])
    specs = {
        "formats": {"--json": None},
        "quantize": {
            "--input": lambda: rng.choice(files["npy"]),
            "--format": fmt,
            "--profile": lambda: rng.choice(["ocp", "quark", "bogus"]),
            "--scale-rule": lambda: rng.choice(["floor", "x"]),
            "--axis": lambda: _number_text(rng),
            "--block-size": lambda: _number_text(rng),
            "--json": None,
        },
        "dot": {
            "--hw": lambda: rng.choice(files["hw"]),
            "--a-format": fmt,
            "--b-format": fmt,
            "--a": values,
            "--b": values,
            "--a-codes": codes,
            "--b-codes": codes,
            "--scale-a": codes,
            "--scale-b": codes,
            "--c": lambda: _number_text(rng),
            "--out-format": lambda: rng.choice(["fp32", "bf16", "x"]),
            "--explain": None,
            "--json": None,
        },
        "replay": {
            "": lambda: rng.choice(files["trace"]),
            "--hw": lambda: rng.choice(files["hw"]),
            "--end-to-end": None,
            "--format": fmt,
            "--json": lambda: str(outputs / "report.json"),
            "--quiet": None,
            "--plots": lambda: str(outputs / "plots"),
            "--conv-order": lambda: rng.choice(["kh_kw_c", "c_kh_kw", "x"]),
            "--strict": None,
            # never a usable --workers: a real cluster is seconds of start-up per case
            "--workers": lambda: rng.choice(["0", "-1", "5000", "abc", ""]),
            "--scheduler": lambda: rng.choice(
                ["127.0.0.1:abc", "tcp://", "", "localhost", "inproc://"]
            ),
        },
        "sweep": {
            "": lambda: rng.choice(files["trace"]),
            "--hw": lambda: rng.choice(files["hw"]),
            "--vary": lambda: _vary_option(rng) if rng.random() < 0.7 else "adder.fused_terms=8,16",
            "--out": lambda: rng.choice(
                [str(outputs / "sweep"), "", str(outputs / "sweep" / ("x" * 300))]
            ),
            "--format": fmt,
            "--quiet": None,
            "--workers": lambda: rng.choice(["0", "abc"]),
            "--scheduler": lambda: rng.choice(["127.0.0.1:abc", "tcp://", "localhost"]),
        },
        "cycles": {
            "": lambda: rng.choice(files["source"]),
            "--hw": lambda: rng.choice(files["hw"]),
            "--a-format": fmt,
            "--b-format": fmt,
            "--json": None,
        },
        "golden": {
            "--hw": lambda: rng.choice(files["hw"]),
            "--out": lambda: str(outputs / "golden"),
            "--cases": lambda: _number_text(rng),
            "--seed": lambda: _number_text(rng),
            "--kind": lambda: rng.choice(["random", "corners", "exhaustive", "x"]),
            "--pair": lambda: rng.choice(
                [
                    "fp8_e4m3,fp8_e4m3",
                    "fp4_e2m1,fp6_e2m3",
                    "fp16,bf16",
                    "fp8_e5m2,int8",
                    "fp16",
                    "tf32,fp16",
                    "x,y",
                    ",",
                    "fp8_e4m3,fp8_e4m3,fp4_e2m1",
                ]
            ),
            "--stages": None,
            "--quiet": None,
            "--json": None,
        },
        "capture": {
            "": lambda: rng.choice(["onnx", "torch"]),
            "--inputs": lambda: str(inputs / "inputs.npz"),
            "--out": lambda: str(outputs / "captured"),
            "--force": None,
            "--compact": None,
            "--reference": lambda: rng.choice(["float32", "residual8", "x", ""]),
            "--name": lambda: rng.choice(["n", "", "../x", "a" * 300]),
            "--bfp-kernel": lambda: rng.choice(["cpu", "cuda", "x"]),
        },
        "evaluate": {
            "": lambda: "hf",
            "--hw": lambda: rng.choice(files["hw"]),
            "--format": fmt,
            "--task": lambda: rng.choice(["embedding", "causal-lm", "classification", "ner", ""]),
            "--inputs": lambda: rng.choice(files["text"]),
            "--json": lambda: str(outputs / "report.json"),
            "--max-length": lambda: _number_text(rng),
            "--batch-size": lambda: _number_text(rng),
            "--scaling": lambda: rng.choice(["auto", "tensor", "x"]),
            "--quiet": None,
        },
    }
    command = rng.choice(list(specs))
    argv = [command]
    for option, value in specs[command].items():
        if rng.random() < (
            0.9
            if option in ("", "--hw", "--out", "--vary", "--a-format", "--b-format", "--inputs")
            else 0.4
        ):
            if option:
                argv.append(option)
            if value is not None:
                argv.append(value())
    if "--stages" in argv and "--pair" not in argv:
        # Stage dumps of every pair of a 36-pair config (1000 cases and the corner list each)
        # take minutes of work fixed by the config; one pair takes seconds.
        argv.remove("--stages")
    if command == "capture" and argv[1:2] == [
        "onnx"
    ]:  # the model (positional) after the subcommand name
        argv.insert(
            2,
            rng.choice(
                [str(REPO / "tests/data/trace/digits_cnn.onnx"), str(inputs / "binary.bin")]
            ),
        )
    elif command == "capture":  # module:factory specs that fail, and directories without a model
        argv.insert(
            2,
            rng.choice(
                ["json:loads", "nomodule", "mxsim:__version__", "a b:c", ":", str(inputs), "/"]
            ),
        )
    elif command == "evaluate":  # model directories without a config
        argv.insert(
            2, rng.choice([str(inputs / "trace"), str(inputs), str(inputs / "binary.bin"), "", "/"])
        )
    if rng.random() < 0.15:
        argv.insert(
            rng.randrange(len(argv) + 1),
            rng.choice(["--bogus", "-x", "--", "--help", "\x00", "%s"]),
        )
    if rng.random() < 0.05:
        argv = [hostile(rng) if not isinstance(hostile(rng), str) else "x" for _ in range(2)]
        argv = [str(a) for a in argv]

    def action():
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as exit_:  # argparse: --help (0) or a usage error (2)
                status = exit_.code
        shown = without_compile_notice(err.getvalue())
        lines = shown.strip("\n").split("\n") if shown.strip() else []
        assert status in ((0, 1, 2) if command == "sweep" else (0, 2)), (
            f"{argv}: exit status {status}"
        )
        if status == 2:
            assert len(lines) == 1 and "Traceback" not in lines[0], (
                f"{argv}: stderr {err.getvalue()!r}"
            )

    if "golden" in argv:
        action.seconds = GOLDEN_CASE_SECONDS
    return action


# ----------------------------------------------------------------------------- new surfaces


class Disclosure(Exception):
    """An error message showed text of a file that is not an input of the expected kind."""


class SilentWrong(Exception):
    """A run ended without error but its result is wrong (e.g. a manifest that does not match its files)."""


class CodeExecution(Exception):
    """Code planted in an input (a model directory's module, a pickle) ran."""


class UnboundedEcho(Exception):
    """An error message echoed a planted long input beyond the documented bound."""


def _vary_option(rng: random.Random) -> str:
    key = rng.choice(
        [
            "adder.fused_terms",
            "adder.align_fraction_bits",
            "accumulator.promotion_interval",
            "multiplier.product_fraction_bits",
            "inputs.block_size",
            "accumulator.format",
            "adder.sum_significant_bits",
            "adder.term_order",
            "accumulator.subnormals",
            "adder.nope",
            "",
            "x" * 300,
            "adder.",
            ".fused_terms",
        ]
    )
    number = lambda: rng.choice(
        [
            "0",
            "1",
            "2",
            "8",
            "16",
            "52",
            "4096",
            "4097",
            "1073741824",
            "99999999999999999999",
            "-1",
            "0x10",
            "1_000",
            "\u0661",
            "9" * rng.choice([40, 41, 5000]),
            "",
            " 3 ",
            "1e3",
        ]
    )
    item = lambda: rng.choice(
        [
            "8",
            "16",
            "null",
            "true",
            "fp32",
            "bf16",
            "!!bool x",
            "!!float x",
            "!!python/name:os.system",
            "2001-13-45",
            "2001-12-01",
            "&a 8",
            "*a",
            "[8]",
            "{a: 1}",
            "'8'",
            "1.5",
            ".inf",
            "~",
            "é",
            "a" * 300,
            "%TAG",
            "? x",
            "- 1",
            "@x",
            "|",
            "8 # c",
            number(),
        ]
    )
    shape = rng.random()
    if shape < 0.45:
        spec = ":".join(number() for _ in range(rng.choice([1, 2, 2, 3, 4])))
    elif shape < 0.9:
        spec = ",".join(item() for _ in range(rng.randint(1, 4)))
    else:
        spec = ",".join(map(str, range(rng.choice([100, 10_001]))))
    return rng.choice([f"{key}={spec}", f"{key}={spec}", key, f"={spec}", f"{key}=={spec}"])


def gen_sweep(rng, env, inputs, outputs):
    """The ``--vary`` grammar and grid bound (parsed and built, not run), and now and then a
    small sweep through the command line with a hostile ``--out``."""
    from mxsim.sweep import grid_configs, parse_knobs

    options = [_vary_option(rng) for _ in range(rng.choice([1, 1, 2, 3]))]
    if rng.random() < 0.1:
        options = ["multiplier.product_fraction_bits=0:52", "inputs.block_size=1:4096"]
    (inputs / "file").write_text("not a directory")
    (inputs / "full").mkdir()
    (inputs / "full" / "mine.txt").write_text("a user's file")

    def action():
        knobs = parse_knobs(options, "base.yaml")
        grid_configs(env["hw"], knobs)
        if rng.random() < 0.25:
            from mxsim.cli import main

            out = rng.choice(
                [
                    str(outputs / "sweep"),
                    "",
                    str(inputs / "file"),
                    str(inputs / "full"),
                    "-",
                    str(outputs / "sweep" / ("x" * 300)),
                ]
            )
            run_cli(
                main,
                [
                    "sweep",
                    str(env["root"] / "trace"),
                    "--hw",
                    str(REPO / "hwconfigs/ocp-exact.yaml"),
                    "--vary",
                    rng.choice(["adder.fused_terms=8,16", *options]),
                    "--out",
                    out,
                    "--quiet",
                ],
                allowed=(0, 1, 2),
            )
            if (inputs / "full" / "mine.txt").read_text() != "a user's file":
                raise SilentWrong("a sweep replaced a directory holding a user's file")

    return action


SECRET = "SECRET-7f3a9c"


def gen_extends(rng, env, inputs, outputs):
    """``extends:`` chains: symlink loops, links out of the config's directory, files that are
    no hwconfig (holding a secret that must never show in a message), deep chains, repeated
    keys, alias bombs. A base reached through a symlink out of the directory must be refused."""
    configs, outside = inputs / "configs", inputs / "outside"
    configs.mkdir()
    outside.mkdir()
    good = {
        "mxsim_hwconfig": 1,
        "name": "unit",
        "inputs": {"a_formats": ["fp8_e4m3"], "b_formats": ["fp8_e4m3"]},
    }
    (outside / "base.yaml").write_text(yaml.safe_dump({**good, "description": "OUTSIDE"}))
    (outside / "secret.txt").write_text(f"{SECRET}-line:\n  {SECRET}: [unclosed\n")
    (outside / "secret-map.txt").write_text(f"{SECRET}: 1\nname: {SECRET}\n")
    depth = rng.choice([1, 2, 3, 31, 32, 33, 200])
    names = [f"c{i}.yaml" for i in range(depth)]
    for index, name in enumerate(names):
        data = dict(good, name=f"c{index}")
        if index + 1 < depth:
            data["extends"] = names[index + 1]
        if index and rng.random() < 0.05:
            del data["mxsim_hwconfig"]
        (configs / name).write_text(yaml.safe_dump(data))
    (configs / "loop1.yaml").symlink_to("loop2.yaml")
    (configs / "loop2.yaml").symlink_to("loop1.yaml")
    (configs / "out.yaml").symlink_to(outside / "base.yaml")
    (configs / "up").symlink_to(outside)
    (configs / "secret.yaml").symlink_to(outside / "secret-map.txt")
    (configs / "inside.yaml").symlink_to(names[-1])
    (configs / "dup.yaml").write_text(
        "mxsim_hwconfig: 1\nname: a\nname: b\n"
        "inputs: {a_formats: [fp8_e4m3], b_formats: [fp8_e4m3]}\n"
    )
    (configs / "bomb.yaml").write_text(billion_laughs())
    targets = [
        names[0],
        "loop1.yaml",
        "out.yaml",
        "up/base.yaml",
        "secret.yaml",
        "inside.yaml",
        "dup.yaml",
        "bomb.yaml",
        "../outside/secret.txt",
        str(outside / "secret.txt"),
        str(outside / "secret-map.txt"),
        "../outside/base.yaml",
        "/etc/passwd",
        "/etc/shadow",
        "/proc/self/environ",
        "/dev/zero",
        "/",
        "missing.yaml",
        "\x00",
        "a" * 300,
        rng.choice(names),
    ]
    via_symlink = {"out.yaml", "up/base.yaml"}
    target = rng.choice(targets)
    top = configs / "top.yaml"
    top.write_text(
        yaml.safe_dump(
            {
                **{k: v for k, v in good.items() if k != "mxsim_hwconfig"},
                "name": "top",
                "extends": target,
            }
        )
    )

    def action():
        try:
            hw = mxsim.load_hwconfig(top)
        except MxsimError as error:
            if SECRET in str(error) or "root:" in str(error):
                raise Disclosure(str(error)[:300]) from None
            if len(str(error)) > 2000:
                raise SilentWrong(f"a {len(str(error))}-character error message") from None
            raise
        if target in via_symlink and hw.description == "OUTSIDE":
            raise SilentWrong(
                f"extends followed the symlink {target} out of the config's directory"
            )

    return action


def _golden_manifest_matches(out: Path, manifest: dict) -> None:
    """The manifest on disk equals the returned one, lists each pair once, and its counts and
    sha256 match the files."""
    on_disk = json.loads((out / "manifest.json").read_text())
    pairs = [(unit["a_format"], unit["b_format"]) for unit in on_disk["units"]]
    if on_disk != json.loads(json.dumps(manifest)) or len(set(pairs)) != len(pairs):
        raise SilentWrong(f"manifest differs from the run or repeats a pair: {pairs}")
    counts = Counter()
    for unit in on_disk["units"]:
        for kind, entry in unit["files"].items():
            text = (out / entry["vectors"]).read_bytes()
            labels = (out / entry["labels"]).read_text().splitlines()
            if hashlib.sha256(text).hexdigest() != entry["sha256"] or len(labels) != entry["count"]:
                raise SilentWrong(
                    f"{entry['vectors']}: sha256 or count does not match the manifest"
                )
            counts[kind] += entry["count"]
    if dict(counts) != {k: v for k, v in on_disk["counts"].items() if v or k in counts}:
        raise SilentWrong(f"manifest counts {on_disk['counts']} but its files hold {dict(counts)}")


def gen_golden_pair(rng, env, inputs, outputs):
    """``golden --pair``: repeated pairs, aliases, hostile names, exhaustive sets beyond the
    budget; a finished run's manifest must match its files."""
    from mxsim.cli import main

    block = rng.choice([1, 2, 32, 4096])
    hw = inputs / "hw.yaml"
    hw.write_text(
        yaml.safe_dump(
            {
                "mxsim_hwconfig": 1,
                "name": "g",
                "inputs": {
                    "a_formats": ["fp4_e2m1", "fp6_e2m3", "int8"],
                    "b_formats": ["fp4_e2m1", "int8"],
                    "block_size": block,
                },
                "adder": {"fused_terms": 1},
            }
        )
    )
    pair = lambda: rng.choice(
        [
            "fp4_e2m1,fp4_e2m1",
            "FP4_E2M1,fp4_e2m1",
            "fp6_e2m3,int8",
            "int8,int8",
            "e8m0,fp4_e2m1",
            "fp4_e2m1",
            "fp4_e2m1,fp4_e2m1,fp4_e2m1",
            ",",
            "x,y",
            "fp32,fp32",
            "fp4_e2m1 , int8",
            "\x00,a",
            "a" * 300 + ",b",
        ]
    )
    pairs = [pair() for _ in range(rng.choice([1, 1, 2, 3]))]
    if rng.random() < 0.3:
        pairs.append(pairs[0])
    argv = [
        "golden",
        "--hw",
        str(hw),
        "--out",
        str(outputs / "golden"),
        "--quiet",
        "--json",
        "--cases",
        rng.choice(["0", "1", "3"]),
        "--seed",
        rng.choice(["0", "5"]),
    ]
    for text in pairs:
        argv += ["--pair", text]
    kinds = rng.sample(["random", "exhaustive", "corners"], rng.choice([1, 1, 2]))
    if block > 2 and "corners" in kinds:
        kinds.remove("corners")  # the fixed corner list of a long block: seconds of config-set work
        kinds = kinds or ["random"]
    for kind in kinds:
        argv += ["--kind", kind]
    if (
        rng.random() < 0.3
    ):  # an earlier output the run must replace whole, or a foreign directory it must refuse
        (outputs / "golden").mkdir()
        (outputs / "golden" / rng.choice(["manifest.json", "mine.txt"])).write_text(
            '{"format": "mxsim-golden"}'
        )

    def action():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = run_cli(main, argv)
        if status == 0:
            _golden_manifest_matches(outputs / "golden", json.loads(out.getvalue()))

    action.seconds = GOLDEN_CASE_SECONDS
    return action


def gen_scheduler(rng, env, inputs, outputs):
    """``--scheduler`` addresses: parsed before connecting; loopback ones (a refused port, a
    silent peer) must fail within the connect bound."""
    import socket

    from mxsim.parallel import DaskRunner, parse_scheduler_address

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    port = silent.getsockname()[1]
    env.setdefault("sockets", []).append(silent)  # closed with the module's fixture
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    refused = closed.getsockname()[1]
    closed.close()
    address = rng.choice(
        [
            "127.0.0.1:abc",
            "tcp://",
            "",
            "localhost",
            "inproc://",
            "inproc://x/1/2",
            "tcp://h:" + "9" * 5000,
            "tcp://127.0.0.1:0",
            "tcp://127.0.0.1:65536",
            "tcp://:8786",
            "ucx://127.0.0.1:1",
            "tcp://a b:1",
            "tcp://[::1",
            "tcp://127.0.0.1:-1",
            "tcp://127.0.0.1:+80",
            "127.0.0.1:\u0661",
            "tcp://é:1",
            "\x00:1",
            "tcp://host:8786/x",
            f"127.0.0.1:{port}",
            f"tcp://127.0.0.1:{port}",
            f"127.0.0.1:{refused}",
            None,
            8786,
            ["tcp://a:1"],
        ]
    )
    loopback = isinstance(address, str) and address.rpartition(":")[2] in (str(port), str(refused))

    def action():
        if loopback:
            started = time.monotonic()
            try:
                DaskRunner(scheduler=address, connect_timeout=1, worker_timeout=1)
            finally:
                if time.monotonic() - started > 10:
                    raise CaseTimeout()
        elif rng.random() < 0.5:
            parse_scheduler_address(address)
        else:
            from mxsim.cli import main

            run_cli(
                main,
                [
                    "replay",
                    str(env["root"] / "trace"),
                    "--hw",
                    str(REPO / "hwconfigs/ocp-exact.yaml"),
                    "--scheduler",
                    str(address),
                    "--quiet",
                ],
            )

    return action


def gen_files(rng, env, inputs, outputs):
    """Hostile files for the readers not covered above: golden vector files, topology CSV,
    .npy tensors and ONNX input .npz archives."""
    from mxsim.cycles import read_scalesim_topology
    from mxsim.golden import generate, read_vector_file

    choice = rng.random()
    path = inputs / "file"
    if choice < 0.35:
        generate(
            REPO / "hwconfigs/ocp-exact.yaml",
            inputs / "g",
            cases=3,
            kinds=["random"],
            progress=False,
            pairs=[("fp4_e2m1", "fp4_e2m1")],
        )
        original = next((inputs / "g").glob("*.hex")).read_bytes()
        how = rng.random()
        if how < 0.5:
            path.write_bytes(mutate_bytes(rng, original))
        elif how < 0.7:
            path.write_bytes(original.decode().replace("//", "// caf\u00e9", 1).encode("latin-1"))
        elif how < 0.85:
            with open(path, "wb") as handle:
                handle.truncate(rng.choice([5 << 30, 100 << 20]))  # sparse: no disk used
        else:
            path.write_bytes(original)
        return lambda: read_vector_file(rng.choice([path, path, inputs, inputs / "missing", ""]))
    if choice < 0.7:
        header = rng.choice(
            [
                "Layer, M, N, K,\n",
                "Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, "
                "Channels, Num Filter, Strides,\n",
            ]
        )
        width = 3 if header.startswith("Layer,") else 7
        value = lambda: rng.choice(
            [
                "1",
                "64",
                "0",
                "-3",
                "1e400",
                "nan",
                "inf",
                "1_000",
                "\u0661\u0662",
                "0x10",
                "9" * rng.choice([10, 20, 5000]),
                "",
                "x",
                str(2**32),
                str(2**32 + 1),
            ]
        )
        rows = "".join(
            "fc, " + ", ".join(value() for _ in range(width)) + ",\n"
            for _ in range(rng.randint(1, 3))
        )
        text = (header + rows).encode()
        path.write_bytes(mutate_bytes(rng, text) if rng.random() < 0.3 else text)

        def topology():
            from mxsim.cycles import estimate_layers, storage_for_format

            storage = storage_for_format("fp8_e4m3")
            estimate_layers(
                mxsim.load_hwconfig(REPO / "hwconfigs/mxdotp.yaml").array,
                read_scalesim_topology(path),
                storage,
                storage,
                storage_for_format("fp32"),
            )

        return topology
    from mxsim.cli import main

    npy = inputs / "x.npy"
    data = npy_bytes(
        rng.choice(["<f4", "<f8", "|O", "<i8", ">f2"]),
        False,
        rng.choice([(2, 32), (10**6, 10**6), (0,), (-1,), (2**62,)]),
        b"\x00" * rng.choice([0, 256, 255]),
    )
    npy.write_bytes(mutate_bytes(rng, data) if rng.random() < 0.3 else data)
    return lambda: run_cli(
        main, ["quantize", "--input", str(npy), "--format", rng.choice(["fp8_e4m3", "e8m0"])]
    )


def run_cli(main, argv, allowed=(0, 2)) -> int:
    """``main(argv)``: its status must be in ``allowed`` and a status 2 must print exactly one
    line on stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exit_:  # argparse: --help (0) or a usage error (2)
            status = exit_.code
    shown = without_compile_notice(err.getvalue())
    lines = shown.strip("\n").split("\n") if shown.strip() else []
    assert status in allowed, f"{argv}: exit status {status}"
    if status == 2:
        assert len(lines) == 1 and "Traceback" not in lines[0], (
            f"{argv}: stderr {err.getvalue()[-500:]!r}"
        )
    return status


# ----------------------------------------------------------------------------- the newest surfaces

#: A long input planted where it may be echoed; an error showing ECHO_PROBE of it echoed it unbounded.
ECHO = "ECHO" * 256
ECHO_PROBE = ECHO[:160]


def _check_echo(text: str) -> None:
    if ECHO_PROBE in text:
        raise UnboundedEcho(f"an error echoed a planted input unbounded: {text[:200]!r}")


def _cli_case(argv, stdin_text: str = "y\n", allowed=(0, 1, 2)) -> int:
    """``main(argv)`` with ``stdin_text`` waiting on stdin (a 'y' for any prompt): its status
    in ``allowed``, a status 2 one line on stderr, and no planted input echoed unbounded."""
    import sys

    from mxsim.cli import main

    err = io.StringIO()
    saved = sys.stdin
    sys.stdin = io.StringIO(stdin_text)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                status = main(argv)
            except SystemExit as exit_:  # argparse
                status = exit_.code
    finally:
        sys.stdin = saved
    text = err.getvalue()
    _check_echo(text)
    lines = text.strip("\n").split("\n") if text.strip() else []
    assert status in allowed, f"{argv}: exit status {status}: {text[-500:]!r}"
    if status == 2:
        assert len(lines) == 1 and "Traceback" not in lines[0], f"{argv}: stderr {text[-500:]!r}"
    return status


def _tiny_model_dirs(env) -> dict | None:
    """The three tiny model directories (built once), or None without torch and transformers."""
    if "tiny" not in env:
        try:
            import torch

            from conftest import tiny_hf_dir

            env["tiny"] = {
                task: tiny_hf_dir(torch, env["root"] / "hf" / task, task)
                for task in ("embedding", "causal-lm", "classification")
            }
        except (ImportError, pytest.skip.Exception):
            env["tiny"] = None
        else:
            if env.get(
                "release"
            ):  # a long campaign; CI's few cases keep the 60 s bound's margin instead
                _warm_model_dirs(env)
    return env["tiny"]


def _warm_model_dirs(env) -> None:
    """Each clean tiny directory through ``evaluate hf`` and ``capture torch`` once, outside
    any case's bound: transformers imports each architecture's modules, and torch sets up its
    operators, on first use (tens of seconds on a loaded machine), which would otherwise be
    timed as the first case of each task."""
    warm = env["root"] / "hf-warm"
    warm.mkdir(exist_ok=True)
    (warm / "inputs.txt").write_text("0\tthe cat sat\n1\ta dog ran\n")
    for task, path in env["tiny"].items():
        _cli_case(
            [
                "evaluate",
                "hf",
                str(path),
                "--hw",
                str(REPO / "hwconfigs/ocp-exact.yaml"),
                "--format",
                "fp8_e4m3",
                "--task",
                task,
                "--inputs",
                str(warm / "inputs.txt"),
                "--quiet",
            ],
            allowed=(0,),
        )
        _cli_case(
            [
                "capture",
                "torch",
                str(path),
                "--task",
                task,
                "--inputs",
                str(warm / "inputs.txt"),
                "--out",
                str(warm / task),
            ],
            allowed=(0,),
        )


_EVIL_MODULE = "from pathlib import Path\nPath({marker!r}).write_text('ran')\n"


def _model_dir_edit(rng, path: Path, marker: Path) -> None:
    """One hostile edit of a model directory."""
    config_file = path / "config.json"
    choice = rng.randrange(9)
    if choice == 0:  # code in the directory, named by auto_map in a config
        (path / "evil.py").write_text(_EVIL_MODULE.format(marker=str(marker)))
        target = rng.choice(["config.json", "tokenizer_config.json"])
        doc = json.loads((path / target).read_text())
        doc["auto_map"] = {
            rng.choice(
                [
                    "AutoModel",
                    "AutoConfig",
                    "AutoModelForCausalLM",
                    "AutoTokenizer",
                    "AutoModelForSequenceClassification",
                ]
            ): rng.choice(["evil.Model", ["evil.T", None]])
        }
        (path / target).write_text(json.dumps(doc))
    elif choice == 1:  # a pickle that runs code, in place of the safetensors weights
        import pickle

        class Planted:
            def __reduce__(self):
                return (Path.write_text, (marker, "ran"))

        (path / "model.safetensors").unlink()
        (path / rng.choice(["pytorch_model.bin", "pytorch_model.bin"])).write_bytes(
            pickle.dumps({"w": Planted()})
        )
    elif choice == 2:
        (path / rng.choice(["tokenizer.json", "tokenizer_config.json"])).unlink()
    elif choice == 3:
        victim = path / rng.choice(
            ["config.json", "tokenizer.json", "model.safetensors", "tokenizer_config.json"]
        )
        victim.write_bytes(mutate_bytes(rng, victim.read_bytes()))
    elif choice == 4:
        doc = json.loads(config_file.read_text())
        key = rng.choice(
            sorted(doc)
            + [
                "quantization_config",
                "torch_dtype",
                "dtype",
                "pad_token_id",
                "vocab_size",
                "id2label",
                "max_position_embeddings",
                "model_type",
                "num_labels",
            ]
        )
        doc[key] = rng.choice(
            [
                hostile(rng),
                ECHO,
                {"quant_method": rng.choice(["bitsandbytes", "gptq", ECHO])},
                {str(i): ECHO for i in range(rng.choice([3, 300]))},
            ]
        )
        try:
            config_file.write_text(json.dumps(doc))
        except (TypeError, ValueError):
            config_file.write_text(json.dumps({**doc, key: None}))
    elif choice == 5:
        weights = path / "model.safetensors"
        data = weights.read_bytes()
        weights.write_bytes(data[: rng.randrange(len(data))])
    elif choice == 6:  # a token id past the model's embeddings
        doc = json.loads((path / "tokenizer.json").read_text())
        doc["model"]["vocab"]["cat"] = rng.choice([64, 100, 2**31])
        (path / "tokenizer.json").write_text(json.dumps(doc))
    elif choice == 7:
        doc = json.loads(config_file.read_text())
        for key in ("max_position_embeddings", "n_positions"):
            if key in doc:
                doc[key] = rng.choice([1, 2, 4])
        config_file.write_text(json.dumps(doc))
    else:  # a symlink out of the directory in place of the weights
        weights = path / "model.safetensors"
        outside = path.parent / "outside.safetensors"
        weights.rename(outside)
        weights.symlink_to(outside)


def gen_model_dir(rng, env, inputs, outputs):
    """``evaluate hf`` / ``capture torch`` on a tiny model directory edited hostilely: nothing
    planted in it may run (a 'y' waits on stdin), and every failure is one line."""
    dirs = _tiny_model_dirs(env)
    if dirs is None:
        return lambda: None
    task = rng.choice(sorted(dirs))
    path = inputs / "model"
    shutil.copytree(dirs[task], path)
    marker = inputs / "PLANTED_CODE_RAN"
    for _ in range(rng.choice([1, 1, 2])):
        with contextlib.suppress(
            OSError, ValueError, KeyError, TypeError
        ):  # an edit the first one made impossible
            _model_dir_edit(rng, path, marker)
    texts = [
        rng.choice(
            ["the cat sat on the mat", "a dog ran", "the cat " * 50, "é ² \u202e", ECHO[:40]]
        )
        for _ in range(rng.randint(2, 4))
    ]
    if task == "classification" and rng.random() < 0.7:
        texts = [
            f"{rng.choice(['0', '1', 'pos', '--1', '²', '-0', '3', ' 1', ECHO])}\t{text}"
            for text in texts
        ]
    (inputs / "inputs.txt").write_text("\n".join(texts) + "\n")
    if rng.random() < 0.5:
        argv = [
            "evaluate",
            "hf",
            str(path),
            "--hw",
            str(REPO / "hwconfigs/ocp-exact.yaml"),
            "--format",
            "fp8_e4m3",
            "--task",
            task,
            "--inputs",
            str(inputs / "inputs.txt"),
            "--quiet",
        ]
        argv += rng.choice(
            [[], ["--max-length", rng.choice(["2", "8", "1000"])], ["--batch-size", "1"]]
        )
    else:
        argv = [
            "capture",
            "torch",
            str(path),
            "--task",
            task,
            "--inputs",
            str(inputs / "inputs.txt"),
            "--out",
            str(outputs / "trace"),
        ]

    def action():
        try:
            _cli_case(argv)
        finally:
            if marker.exists():
                raise CodeExecution(f"{argv[:3]}: code planted in the model directory ran")

    action.seconds = 60.0  # a model load and up to two forward passes on 2 shared cores
    return action


_HOSTILE_ANSWERS = (
    lambda n: np.full(n, 1.5),
    lambda n: np.array([1.5] * n, dtype=object),
    lambda n: ["1"] * n,
    lambda n: [True] * n,
    lambda n: np.ones(n, bool),
    lambda n: [1 + 0j] * n,
    lambda n: np.array([2.0**70] * n, dtype=object),
    lambda n: [-1] * n,
    lambda n: [1 << 64] * n,
    lambda n: np.zeros(n + 1, np.uint32),
    lambda n: None,
    lambda n: iter(range(n)),
    lambda n: np.zeros((n, 1), np.uint32),
    lambda n: [ECHO] * n,
    lambda n: np.array([2.5, 1] * n, dtype=object)[:n],
    lambda n: {"bits": 0},
)
_HOSTILE_RAISES = (
    SystemExit(0),
    SystemExit(1),
    SystemExit(ECHO),
    KeyboardInterrupt(),
    BaseException("odd"),
    GeneratorExit(),
    RecursionError("deep"),
    ValueError(ECHO),
    MemoryError(),
)
#: Subprocess units (Python bodies): each fails at its first request in its own way.
_HOSTILE_BOXES = (
    "import sys; sys.stdin.readline(); sys.exit({code})",
    "import os, sys, time\nsys.stdin.readline(); os.close(1); time.sleep(60)",
    "import os, time\nos.close(0); time.sleep(60)",
    "import time\ntime.sleep(60)",
    "import sys\nsys.stderr.write({echo!r} * 20000); sys.stderr.flush(); sys.exit(3)",
    "import sys, time\nsys.stdin.readline(); sys.stdout.write('ab'); sys.stdout.flush(); time.sleep(60)",
    "import sys\nfor line in sys.stdin: print({echo!r}, flush=True)",
    "import sys\nfor line in sys.stdin: print('1.5', flush=True)",
    "import sys\nfor line in sys.stdin: print('-1', flush=True)",
    "import sys\nfor line in sys.stdin: print('0\\n' * 100000, flush=True)",
    "import sys, subprocess\nsubprocess.Popen(['sleep', '60'])\nsys.stdin.readline(); sys.exit(0)",
    "import sys\nsys.stdout.buffer.write(bytes(range(256)) * 100); sys.stdout.flush(); sys.exit(0)",
)


def _probe_rows(rng, n: int, k: int = 4):
    a = np.array([[rng.randrange(16) for _ in range(k)] for _ in range(n)], dtype=np.uint64)
    b = np.array([[rng.randrange(16) for _ in range(k)] for _ in range(n)], dtype=np.uint64)
    scale = np.array([[rng.choice([127, 126, 128, 0, 255])] for _ in range(n)], dtype=np.uint8)
    return a, b, scale, scale.copy(), np.zeros(n, np.uint32)


def gen_probe_box(rng, env, inputs, outputs):
    """Probe units that answer what is no bit pattern, raise anything, exit, hang, close
    their pipes, or flood stderr; and the CLI's seed and output checks."""
    import sys

    from mxsim.probe import CountingUnit, ProbeError, SubprocessUnit, probe

    kind = rng.randrange(4)
    n = rng.randint(1, 5)
    if kind == 0:  # a callable answering hostilely: never accepted
        make = rng.choice(_HOSTILE_ANSWERS)

        def action():
            try:
                got = CountingUnit(lambda a, b, sa, sb, c: make(len(a)), "fp32", 100)(
                    *_probe_rows(rng, n)
                )
            except ProbeError as error:
                _check_echo(str(error))
                return
            raise SilentWrong(f"a unit answer that is no {n} fp32 bit patterns was taken: {got!r}")

        return action
    if kind == 1:  # a callable raising anything, through the whole probe
        error = rng.choice(_HOSTILE_RAISES)

        def unit(a, b, sa, sb, c):
            raise error

        def action():
            try:
                probe(
                    unit,
                    "fp4_e2m1",
                    "fp4_e2m1",
                    8,
                    budget=rng.choice([10, 1000]),
                    seed=rng.choice([0, 7]),
                )
            except MxsimError as caught:
                _check_echo(str(caught))
                assert "\n" not in str(caught), str(caught)[:300]
                return
            raise SilentWrong("a probe of a unit that raised on every query gave a result")

        return action
    if kind == 2:  # a hostile process
        script = inputs / "box.py"
        script.write_text(
            rng.choice(_HOSTILE_BOXES).format(code=rng.choice([0, 1, 3, 255]), echo=ECHO[:200])
        )
        timeout = rng.choice([0.3, 0.5, 1.0])
        unit = SubprocessUnit(
            f"{sys.executable} {script}",
            "fp4_e2m1",
            "fp4_e2m1",
            timeout=timeout,
            chunk=rng.choice([1, 4, 64]),
        )
        rows = _probe_rows(rng, n)

        def action():
            started = time.monotonic()
            try:
                unit(*rows)
            except ProbeError as error:
                _check_echo(str(error))
                assert "\n" not in str(error) and len(str(error)) < 1000, str(error)[:300]
                return
            finally:
                unit.close()
                assert time.monotonic() - started < 4 * timeout + 5, (
                    "a unit wait ran past its timeout"
                )
            raise SilentWrong("a unit process that answers no bit patterns was taken")

        return action
    # the CLI: hostile seeds and output paths, checked before any query
    (inputs / "fuzz_probe_unit.py").write_text(
        f"def unit(a, b, sa, sb, c):\n    open({str(outputs / 'asked')!r}, 'w').close()\n    raise SystemExit(0)\n"
    )
    argv = [
        "probe",
        "--unit",
        f"{inputs / 'fuzz_probe_unit.py'}:unit",
        "--a-format",
        "fp4_e2m1",
        "--b-format",
        "fp4_e2m1",
        "--k",
        "4",
        "--budget",
        "50",
        "--out",
        str(outputs / "u.yaml"),
    ]
    argv += rng.choice(
        [
            ["--seed", rng.choice(["-1", str(2**63), "1.5", "0x10", ECHO])],
            [
                "--report",
                rng.choice(
                    [
                        str(outputs / "missing" / "r.json"),
                        str(outputs),
                        str(outputs / "u.yaml"),
                        str(outputs / ("r" * 300)),
                        ECHO,
                    ]
                ),
            ],
            [
                "--out",
                rng.choice([str(outputs / "missing" / "u.yaml"), str(outputs), ECHO, "\x00"]),
            ],
            ["--timeout", rng.choice(["0", "nan", "-1", "1e9"])],
            [],
        ]
    )

    def action():
        status = _cli_case(argv, allowed=(2,))
        assert status == 2
        if (outputs / "u.yaml").exists():
            raise SilentWrong("probe wrote --out though the run failed")

    return action


def gen_trace_v2(rng, env, inputs, outputs):
    """The compact (version 2) trace's content-addressed blobs edited: swapped, mutated,
    truncated, removed, duplicated, or members replaced; a trace that loads must hold the
    tensors it was saved with."""
    trace_dir = _copy_trace(env, inputs)
    blobs = sorted((trace_dir / "tensors").iterdir())
    victim = rng.choice(blobs)
    choice = rng.randrange(6)
    if choice == 0 and len(blobs) > 1:  # another blob's content under this blob's name
        other = rng.choice([blob for blob in blobs if blob != victim])
        victim.write_bytes(other.read_bytes())
    elif choice == 1:
        victim.write_bytes(mutate_bytes(rng, victim.read_bytes()))
    elif choice == 2:
        data = victim.read_bytes()
        victim.write_bytes(data[: rng.randrange(len(data))])
    elif choice == 3:
        victim.unlink()
    elif choice == 4:  # a member replaced by a hostile .npy
        with zipfile.ZipFile(victim) as archive:
            members = {name: archive.read(name) for name in archive.namelist()}
        name = rng.choice(sorted(members))
        with np.load(victim) as npz:
            original = npz[name[:-4]] if name.endswith(".npy") else np.zeros(1)
        members[name] = _mutated_member(rng, original)
        with zipfile.ZipFile(victim, "w") as archive:
            for member, data in members.items():
                archive.writestr(member, data)
    else:  # the manifest's blob references edited
        manifest = trace_dir / "manifest.yaml"
        text = manifest.read_text()
        names = [blob.name for blob in blobs]
        text = text.replace(
            victim.name, rng.choice(names + ["../dataset.npz", "x" * 300 + ".npz", ECHO[:60]])
        )
        manifest.write_text(text)
    original = mxsim.trace.load_trace(env["root"] / "trace")

    def action():
        try:
            trace = mxsim.trace.load_trace(trace_dir)
        except MxsimError as error:
            _check_echo(str(error))
            raise
        for want, got in zip(original.layers, trace.layers):
            for key in want.tensors:
                if not np.array_equal(
                    np.asarray(want.tensors[key]), np.asarray(got.tensors[key]), equal_nan=True
                ):
                    raise SilentWrong(
                        f"the edited trace loaded with other values in {want.name}.{key}"
                    )
        _load_and_replay(rng, env, trace_dir)

    return action


def _integer_keys():
    from mxsim.datapath.schema import SCHEMA

    return [
        (section, name, key)
        for section, keys in SCHEMA.items()
        for name, key in keys.items()
        if key.kind in ("int", "optional_int") and key.minimum is not None
    ]


def gen_datapath_bounds(rng, env, inputs, outputs):
    """A shipped unit with one to three integer keys drawn to their documented bounds (or
    next to them, or anywhere between): the kernel, the vectorised routes and the Fraction
    twin must give the same bits on realistic and corner inputs, and ``explain`` the same."""
    from mxsim.datapath import explain, parse_hwconfig
    from mxsim.datapath.api import dot_with_params
    from mxsim.datapath.reference import dot_reference

    raw = yaml.safe_load(rng.choice(HWCONFIGS).read_text())
    raw.pop("extends", None)
    for section, name, key in rng.sample(_integer_keys(), rng.randint(1, 3)):
        low, high = key.minimum, key.maximum if key.maximum is not None else key.minimum + 2**20
        value = rng.choice(
            [
                low,
                high,
                low + 1,
                high - 1,
                rng.randint(low, high),
                None if key.kind == "optional_int" else low,
            ]
        )
        raw.setdefault(section, {})[name] = value

    def action():
        hw = parse_hwconfig(raw, "fuzz")
        a_format = rng.choice(hw.a_formats)
        b_format = rng.choice(hw.b_formats)
        params = hw.params(a_format, b_format)
        fa, fb = get_format(params.a_format), get_format(params.b_format)
        k = rng.randint(0, 40)
        rows = 3
        np_rng = np.random.default_rng(rng.randrange(2**32))

        def operand(fmt):
            if rng.random() < 0.7:
                values = np_rng.standard_normal((rows, k)) * np.exp2(
                    np_rng.integers(-3, 4, (rows, 1))
                )
                values[np_rng.random((rows, k)) < 0.2] = 0
                return fmt.encode(np.clip(values, -fmt.max_finite, fmt.max_finite))
            field = np_rng.integers(0, 1 << fmt.field_bits, (rows, k), dtype=np.uint64)
            return (field << np.uint64(fmt.padding_bits)).astype(fmt.code_dtype)

        a, b = operand(fa), operand(fb)
        scale_a = scale_b = None
        if params.scales != "none":
            scale_fmt = get_format(params.scale_format)
            blocks = -(-k // params.block_size)
            one = int(scale_fmt.encode(np.array([1.0]))[0])
            scale_a, scale_b = (
                np_rng.integers(max(0, one - 6), one + 6, (rows, blocks)).astype(np.uint8)
                for _ in range(2)
            )
        c_fmt = get_format(params.c_format)
        c = c_fmt.round(
            np_rng.standard_normal(rows) * rng.choice([0, 1, 1e-30, 1e30]), overflow="inf"
        )
        c = c.astype(np.float64 if c_fmt.bits > 32 else np.float32)
        out_format = get_format(params.output_format)
        kernel = dot_with_params(
            params, a, b, scale_a=scale_a, scale_b=scale_b, c=c, method="kernel"
        )
        auto = dot_with_params(params, a, b, scale_a=scale_a, scale_b=scale_b, c=c, method="auto")
        for i in range(rows):
            value = dot_reference(
                params,
                a[i].tolist(),
                b[i].tolist(),
                None if scale_a is None else scale_a[i].tolist(),
                None if scale_b is None else scale_b[i].tolist(),
                float(c[i]),
            )
            want = int(out_format.encode(np.array([value]), overflow="inf_nan")[0])
            if int(kernel[i]) != want or int(auto[i]) != want:
                raise SilentWrong(
                    f"kernel {int(kernel[i]):#x}, auto {int(auto[i]):#x}, twin {want:#x} with "
                    f"{ {s: raw.get(s) for s in ('adder', 'accumulator')} }"
                )
        if k <= 16 and c_fmt.bits <= 32:
            shown = explain(
                hw,
                a[0],
                b[0],
                a_format=a_format,
                b_format=b_format,
                scale_a=None if scale_a is None else scale_a[0],
                scale_b=None if scale_b is None else scale_b[0],
                c=float(c[0]),
            )
            if shown["bits"] != int(kernel[0]):
                raise SilentWrong(f"explain {shown['bits']:#x} but dot {int(kernel[0]):#x}")

    def warm():
        """The kernel signatures this unit reaches (its code widths, tree and window routes, as
        its keys select them), compiled on zero operands per format pair: Numba compiles each on
        first use, tens of seconds under tracemalloc on a loaded machine, which is not the case's work."""
        hw = parse_hwconfig(raw, "fuzz")
        for a_format, b_format in itertools.product(hw.a_formats, hw.b_formats):
            with contextlib.suppress(MxsimError):
                params = hw.params(a_format, b_format)
                c = np.zeros(1, np.float64 if get_format(params.c_format).bits > 32 else np.float32)
                for k, method in itertools.product(
                    (1, 40), ("kernel", "auto")
                ):  # routes may depend on k
                    a, b = (
                        np.zeros((1, k), get_format(name).code_dtype)
                        for name in (params.a_format, params.b_format)
                    )
                    scales = (
                        None
                        if params.scales == "none"
                        else np.full((1, -(-k // params.block_size)), 127, np.uint8)
                    )
                    dot_with_params(
                        params, a, b, scale_a=scales, scale_b=scales, c=c, method=method
                    )

    action.warm = warm
    return action


def gen_nvfp4(rng, env, inputs, outputs):
    """NVFP4 quantization with hostile arrays and tensor scales; what it returns must match
    the Fraction twin block by block."""
    from mxsim.quantize.nvfp4 import quantize_nvfp4, tensor_scale_from_amax
    from mxsim.quantize.reference import quantize_nvfp4_reference

    np_rng = np.random.default_rng(rng.randrange(2**32))
    rows, cols = rng.choice([0, 1, 2, 3]), rng.choice([0, 16, 32, 48, 17, 64])
    x = (
        np_rng.standard_normal((rows, cols)) * np.exp2(np_rng.integers(-20, 20, (rows, 1)))
    ).astype(rng.choice([np.float32, np.float32, np.float16, np.float64]))
    if x.size and rng.random() < 0.3:
        x.flat[rng.randrange(x.size)] = rng.choice([np.inf, -np.inf, np.nan, 0.0, 3e38, 1e-45])
    if rng.random() < 0.1:
        x = np.ma.masked_array(x, mask=np_rng.random(x.shape) < 0.5)
    if rng.random() < 0.05:
        x = rng.choice(
            [x.tolist(), np.broadcast_to(np.float32(1), (1 << 20, 1 << 12)), x.astype(np.int32)]
        )

    def action():
        amax = rng.choice(
            [
                None,
                1.0,
                float(np.abs(np.asarray(x, dtype=np.float64)).max(initial=0))
                if isinstance(x, np.ndarray) and x.size < 10**6
                else 1.0,
                hostile(rng),
                1e-45,
                "0.5",
            ]
        )
        if amax is None:
            tensor_scale = rng.choice(
                [None, hostile(rng), np.float32(0.25), [0.5], 1 + 0j, 10**400]
            )
        else:
            tensor_scale = tensor_scale_from_amax(amax)
        tensor = quantize_nvfp4(x, tensor_scale)
        if not isinstance(x, np.ndarray) or type(x) is not np.ndarray:
            raise SilentWrong(f"quantize_nvfp4 took a {type(x).__name__}")
        element, scale = get_format("fp4_e2m1"), get_format("ue4m3")
        blocks = x.astype(np.float32).reshape(-1, 16) if x.size else np.zeros((0, 16), np.float32)
        codes = tensor.codes.reshape(-1, 16) if x.size else np.zeros((0, 16), np.uint8)
        for i, block in enumerate(blocks[:8]):
            want_scale, want_codes = quantize_nvfp4_reference(
                block.tolist(), tensor.tensor_scale, element, scale
            )
            if int(tensor.scales.reshape(-1)[i]) != want_scale or codes[i].tolist() != list(
                want_codes
            ):
                raise SilentWrong(
                    f"block {i}: scale {int(tensor.scales.reshape(-1)[i])} codes {codes[i].tolist()}, "
                    f"twin {want_scale} {list(want_codes)}"
                )

    return action


GENERATORS = {
    "hwconfig": gen_hwconfig,
    "manifest": gen_manifest,
    "npz": gen_npz,
    "api": gen_api,
    "cli": gen_cli,
    "sweep": gen_sweep,
    "extends": gen_extends,
    "golden_pair": gen_golden_pair,
    "scheduler": gen_scheduler,
    "files": gen_files,
    "model_dir": gen_model_dir,
    "probe_box": gen_probe_box,
    "trace_v2": gen_trace_v2,
    "datapath_bounds": gen_datapath_bounds,
    "nvfp4": gen_nvfp4,
}


# ----------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("family", FAMILIES)
def test_fuzz_family(family, fuzz_env, tmp_path):
    """CI_CASES (``--fuzz``: FUZZ_RELEASE_CASES) derandomized cases of one family.

    In CI the first failure stops the run; the release campaign runs every case and then
    lists every failure, so its outcome table counts them all.
    """
    failures = []
    cases = fuzz_env["cases"] or CI_CASES_OF.get(family, CI_CASES)
    if fuzz_env["release"]:  # MXSIM_FUZZ_CASES_<FAMILY>: one family's count in a long campaign
        cases = int(os.environ.get(f"MXSIM_FUZZ_CASES_{family.upper()}", cases))

    @settings(
        derandomize=True,
        database=None,
        deadline=None,
        max_examples=cases,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(seed=st.integers(0, 2**32 - 1))
    @example(seed=0)
    def check(seed):
        failure = run_case(family, seed, fuzz_env, tmp_path)
        if failure is not None:
            failures.append(failure)
            assert fuzz_env["release"], failure

    start = os.environ.get("MXSIM_FUZZ_SEED_START") if fuzz_env["release"] else None
    if start is not None:  # seeds start, start + 1, ...: a long campaign on seeds CI never draws
        for seed in range(int(start), int(start) + cases):
            check.hypothesis.inner_test(seed=seed)
    else:
        check()
    assert not failures, "\n".join(failures)
