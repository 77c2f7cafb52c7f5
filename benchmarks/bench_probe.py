"""Queries and time per probe run: ``mxsim.probe.probe`` against mxsim's own configs, MMA-Sim's
models and the RTL example, beside the unit's own speed.

Usage: python benchmarks/bench_probe.py [--set mxsim,mmasim,rtl] [--only PATTERN ...] [--markdown]
                                       [--json OUT | --update RESULTS]
       python benchmarks/bench_probe.py --render RESULTS   (the table of docs/probe.md from a --json file)

Each run prints one line: the unit, its path (A x B -> output, K), the dot products the probe
asked (queries, validation included), the probe's wall seconds, its CPU seconds in this
process (the probe's own work and an in-process unit's; not a subprocess unit's), the seconds
spent inside the unit (wall), passes, and the validation's mismatches / vectors. The same-run baseline is
the unit alone: its rate on one batch of ``BASELINE_ROWS`` dot products (half realistic data,
half uniformly random codes; best of 10 or of those done in 2 s, at least 2, after a warm-up
call: on a loaded machine a short call preempted once takes tens of times longer), and the probe's overhead, its
wall time over the time the unit alone takes for as many dot products at that rate. Totals
per set follow. ``--markdown`` prints the same as table rows for docs/probe.md. Run it once
first where the kernel cache is empty: the first run's figures include Numba's compiles.

Sets (the tests' paths and validation sizes; docs/probe.md):
- ``mxsim``: the round-trip paths of tests/test_probe_core.py (``CI_PATHS`` and ``FP64_PATHS``,
  mi300's long-mode path included) through ``HwconfigUnit``, and each mxdotp config (one per
  rounding mode) at the unit's own width per element format (8 FP8, 11 FP6, 16 FP4), ids
  ``mxsim/CONFIG@FORMAT``; 1,024 + 256 validation vectors.
- ``mmasim``: the MMA-Sim families tests/test_probe_mmasim.py probes in CI, through a callable
  on MMA-Sim's instructions (the ``oracles`` extra; the set is skipped without it); 384 + 128
  validation vectors (the Ampere tf32 family: the default 2,048 + 512, as its test).
- ``rtl``: examples/rtl/mxdot_fp4.sv and its broken variants (parameter BUG) under Icarus
  Verilog through ``SubprocessUnit`` (skipped without iverilog and vvp); 768 + 512.

``--only`` takes shell-style patterns over the run ids (``set/name``, e.g. ``mxsim/h100*``,
``rtl/BUG=[0-3]``, ``mmasim/*Blackwell*``); ``--json OUT`` writes every figure (written
atomically); ``--update RESULTS`` puts the runs' rows into an existing results file instead
(a row of the same id replaced, a new id added at the end, the other rows kept; written
after each run), so a subset re-run refreshes its rows alone. Every row records when it was
measured: its date, the commit (``git describe --always --dirty``) and the load average
before it. The tables of paths are checked against the tests' own by tests/test_benchmarks.py.
"""

from __future__ import annotations

import datetime
import fnmatch
import importlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import mxsim
from _timing import OneLineParser, best_seconds, cpu_model
from mxsim._compile import compile_seconds
from mxsim.errors import MxsimError
from mxsim.fileio import json_text, write_atomic
from mxsim.probe import HwconfigUnit, SubprocessUnit, probe
from mxsim.probe.inputs import Batch, Context

REPO = Path(__file__).resolve().parent.parent
SETS = ("mxsim", "mmasim", "rtl")
BASELINE_ROWS = 1024

#: mxsim configs and the path probed: (A, B, output, K) -- tests/test_probe_core.py's CI_PATHS
#: (mi300's only in its long mode) and FP64_PATHS.
MXSIM_PATHS = {
    "v100": ("fp16", "fp16", "fp32", 16),
    "a100": ("tf32", "tf32", "fp16", 16),
    "ada": ("fp8_e4m3", "fp8_e4m3", "fp32", 64),
    "h100": ("fp8_e4m3", "fp8_e5m2", "fp16", 32),
    "h200": ("fp8_e5m2", "fp8_e4m3", "fp32", 64),
    "h200-cublas": ("bf16", "bf16", "fp16", 32),
    "b200": ("fp8_e5m2", "fp8_e5m2", "fp32", 64),
    "h100-fp8-promoted": ("fp8_e4m3", "fp8_e4m3", "fp32", 160),
    "h200-cublaslt-fp8": ("fp8_e4m3", "fp8_e4m3", "fp32", 160),
    "h200-cublaslt-fp8-fast": ("fp8_e4m3", "fp8_e5m2", "bf16", 64),
    "bfp-exact": ("mx6", "mx9", "fp32", 32),
    "kulisch": ("int8", "fp8_e4m3", "fp32", 64),
    "mxdotp": ("fp6_e2m3", "fp6_e2m3", "fp32", 64),
    "mxdotp-paper": ("fp6_e2m3", "fp4_e2m1", "fp32", 32),
    "mxdotp-rtz": ("fp8_e4m3", "fp8_e4m3", "fp32", 64),
    "mxdotp-rdn": ("fp4_e2m1", "fp4_e2m1", "fp32", 64),
    "mxdotp-rup": ("fp8_e5m2", "fp8_e5m2", "fp32", 64),
    "mxdotp-rmm": ("fp6_e3m2", "fp6_e3m2", "fp32", 64),
    "ocp-exact": ("fp8_e5m2", "fp6_e3m2", "fp32", 64),
    "h100-wgmma": ("fp8_e4m3", "fp8_e5m2", "fp16", 32),
    "b200-tcgen05": ("fp6_e3m2", "fp4_e2m1", "fp32", 64),
    "b200-tcgen05-mxf8f6f4": ("fp8_e4m3", "fp6_e2m3", "fp32", 64),
    "b200-tcgen05-mxf4nvf4": ("fp4_e2m1", "fp4_e2m1", "fp32", 64),
    "b200-tcgen05-mxf4": ("fp4_e2m1", "fp4_e2m1", "fp32", 64),
    "b200-tcgen05-mxf4nvf4-e8m0-block16": ("fp4_e2m1", "fp4_e2m1", "fp32", 64),
    "mi100": ("fp16", "fp16", "fp32", 16),
    "mi250": ("bf16", "bf16", "fp32", 16),
    "mi250-bf16-legacy": ("bf16", "bf16", "fp32", 16),
    "mi300": ("fp8_e4m3fnuz", "fp8_e5m2fnuz", "fp32", 32),
    "a100-dmma": ("fp64", "fp64", "fp64", 4),
}

#: MMA-Sim instructions tests/test_probe_mmasim.py probes in CI: (module, instruction class,
#: architecture, instruction, A, B, c, output, K, scale block, scale format).
MMASIM_FAMILIES = [
    (
        "mmasim.nv_ptx",
        "MMA",
        "RTX Blackwell",
        "m16n8k32.kind::f8f6f4.f16.e2m3.e3m2.f16",
        "fp6_e2m3",
        "fp6_e3m2",
        "fp16",
        "fp16",
        32,
        None,
        None,
    ),
    (
        "mmasim.nv_ptx",
        "MMABlockScale",
        "RTX Blackwell",
        "m16n8k32.kind::mxf8f6f4.block32.f32.e2m1.e2m1.f32.ue8m0",
        "fp4_e2m1",
        "fp4_e2m1",
        "fp32",
        "fp32",
        32,
        32,
        "e8m0",
    ),
    (
        "mmasim.nv_ptx",
        "MMABlockScale",
        "RTX Blackwell",
        "m16n8k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.f32.ue4m3",
        "fp4_e2m1",
        "fp4_e2m1",
        "fp32",
        "fp32",
        64,
        16,
        "ue4m3",
    ),
    (
        "mmasim.nv_ptx",
        "WGMMA",
        "Hopper",
        "m64n8k8.f32.tf32.tf32",
        "tf32",
        "tf32",
        "fp32",
        "fp32",
        8,
        None,
        None,
    ),
    (
        "mmasim.nv_ptx",
        "TCGen05MMA",
        "Blackwell",
        "m64n8k32.kind::f8f6f4.f32.e3m2.e3m2",
        "fp6_e3m2",
        "fp6_e3m2",
        "fp32",
        "fp32",
        32,
        None,
        None,
    ),
    (
        "mmasim.nv_ptx",
        "TCGen05MMABlockScale",
        "Blackwell",
        "m128n8k32.kind::mxf8f6f4.block32.f32.e2m3.e4m3.ue8m0",
        "fp6_e2m3",
        "fp8_e4m3",
        "fp32",
        "fp32",
        32,
        32,
        "e8m0",
    ),
    (
        "mmasim.nv_ptx",
        "TCGen05MMABlockScale",
        "Blackwell",
        "m128n8k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.ue4m3",
        "fp4_e2m1",
        "fp4_e2m1",
        "fp32",
        "fp32",
        64,
        16,
        "ue4m3",
    ),
    (
        "mmasim.nv_ptx",
        "MMA",
        "Volta",
        "m8n8k4.f32.f16.f16.f32",
        "fp16",
        "fp16",
        "fp32",
        "fp32",
        4,
        None,
        None,
    ),
    (
        "mmasim.nv_ptx",
        "MMA",
        "Volta",
        "m8n8k4.f32.f16.f16.f16",
        "fp16",
        "fp16",
        "fp16",
        "fp32",
        4,
        None,
        None,
    ),
    (
        "mmasim.nv_ptx",
        "MMA",
        "Ampere",
        "m16n8k8.f32.tf32.tf32.f32",
        "tf32",
        "tf32",
        "fp32",
        "fp32",
        8,
        None,
        None,
    ),
    (
        "mmasim.nv_ptx",
        "MMA",
        "RTX Blackwell",
        "m8n8k4.f64.f64.f64.f64",
        "fp64",
        "fp64",
        "fp64",
        "fp64",
        4,
        None,
        None,
    ),
    (
        "mmasim.amd",
        "MFMA",
        "CDNA1",
        "f32_32x32x8f16",
        "fp16",
        "fp16",
        "fp32",
        "fp32",
        8,
        None,
        None,
    ),
    (
        "mmasim.amd",
        "MFMA",
        "CDNA2",
        "f32_32x32x8bf16_1k",
        "bf16",
        "bf16",
        "fp32",
        "fp32",
        8,
        None,
        None,
    ),
]
#: Families whose test probes with the default validation sizes.
MMASIM_DEFAULT_SIZES = {"Ampere/MMA/m16n8k8.f32.tf32.tf32.f32"}

#: examples/rtl/mxdot_fp4.sv's parameter BUG: the correct unit (0) and each broken variant.
RTL_VARIANTS = {
    0: "correct",
    1: "truncates instead of rounding",
    2: "rounding ignores the sticky bit",
    3: "drops the alignment sticky of the block term",
    4: "flushes subnormal results to zero",
    5: "exact zeros always +0",
    6: "overflow saturates to max finite",
    7: "subnormal elements read as zero",
}
RTL_PAIR = ("fp4_e2m1", "fp4_e2m1")


@dataclass
class Run:
    set: str
    name: str
    a: str
    b: str
    out: str
    k: int
    sizes: dict
    block_size: int = 32
    c_format: str = "fp32"
    scale_format: str = "e8m0"
    make_unit: object = None  # () -> unit; called once the run is selected
    figures: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.set}/{self.name}"

    @property
    def path(self) -> str:
        return f"{self.a} x {self.b} -> {self.out}, K = {self.k}"


# ----------------------------------------------------------------------------- the sets


#: The MXDOTP unit's own width per element format (tests/test_probe_core.py's MXDOTP_OWN_K):
#: each config of MXDOTP_CONFIGS probed at one operation's K per format, ids ``mxsim/CONFIG@FORMAT``.
MXDOTP_OWN_K = {"fp8_e4m3": 8, "fp8_e5m2": 8, "fp6_e3m2": 11, "fp6_e2m3": 11, "fp4_e2m1": 16}
#: The MXDOTP configs, one per rounding mode (tests/test_probe_core.py's MXDOTP_CONFIGS).
MXDOTP_CONFIGS = ("mxdotp", "mxdotp-rtz", "mxdotp-rdn", "mxdotp-rup", "mxdotp-rmm")


def mxsim_runs() -> list[Run]:
    def make(name, a, b, out):
        return lambda: HwconfigUnit(REPO / "hwconfigs" / f"{name}.yaml", a, b, out)

    sizes = {"validation_vectors": 1024, "corner_vectors": 256}
    return [
        Run("mxsim", name, a, b, out, k, sizes, make_unit=make(name, a, b, out))
        for name, (a, b, out, k) in MXSIM_PATHS.items()
    ] + [
        Run(
            "mxsim",
            f"{name}@{element}",
            element,
            element,
            "fp32",
            k,
            sizes,
            make_unit=make(name, element, element, "fp32"),
        )
        for name in MXDOTP_CONFIGS
        for element, k in MXDOTP_OWN_K.items()
    ]


def mmasim_runs() -> list[Run]:
    runs = []
    for module, op, arch, instruction, a, b, c, out, k, block, scale in MMASIM_FAMILIES:
        name = f"{arch}/{op}/{instruction}".replace(" ", "_")
        sizes = (
            {}
            if name in MMASIM_DEFAULT_SIZES
            else {"validation_vectors": 384, "corner_vectors": 128}
        )
        runs.append(
            Run(
                "mmasim",
                name,
                a,
                b,
                out,
                k,
                sizes,
                block_size=block or 32,
                c_format=c,
                scale_format=scale or "e8m0",
                make_unit=lambda m=module, o=op, r=arch, i=instruction, s=scale is not None: (
                    mmasim_unit(m, o, r, i, s)
                ),
            )
        )
    return runs


def mmasim_unit(module: str, op_name: str, arch: str, instruction: str, scaled: bool):
    """MMA-Sim's instruction as a probe unit: element codes as the tensors it reads (FP6 in
    bits 5:0 and FP4 in bits 5:2 of a byte; packed FP4 two per byte, high nibble first; other
    formats viewed as the operand dtype), c in its type, scales as their codes."""
    import torch

    op = getattr(importlib.import_module(module), op_name)(arch, instruction)
    packed = getattr(op, "packing", 1) == 2
    sub_byte = {"e3m2": 0, "e2m3": 0, "e2m1": 2}  # PTX FP6 / FP4 types: the shift into their byte

    def operand(codes, ptx, dtype):
        if packed:
            return torch.from_numpy(((codes[:, 0::2] << 4) | codes[:, 1::2]).astype(np.uint8))
        if ptx in sub_byte:
            return torch.from_numpy((codes << sub_byte[ptx]).astype(np.uint8))
        bits = 8 * dtype.itemsize
        return torch.from_numpy(codes.astype(f"uint{bits}").view(f"int{bits}")).view(dtype)

    def unit(a, b, scale_a, scale_b, c):
        c_values = c.view(np.float64 if c.dtype == np.uint64 else np.float32).copy()
        args = [
            operand(a, getattr(op, "a_type_ptx", None), op.a_type),
            operand(b, getattr(op, "b_type_ptx", None), op.b_type),
            torch.from_numpy(c_values).to(op.c_type),
        ]
        if scaled:
            args += [
                torch.from_numpy(s.astype(np.uint8)).view(op.s_type) for s in (scale_a, scale_b)
            ]
        d = op.dpa(*args)
        bits = 8 * d.element_size()
        return d.view(getattr(torch, f"int{bits}")).numpy().view(f"uint{bits}")

    return unit


def rtl_runs(build: Path) -> list[Run]:
    return [
        Run(
            "rtl",
            f"BUG={bug}",
            *RTL_PAIR,
            "fp32",
            32,
            {"validation_vectors": 768, "corner_vectors": 512},
            make_unit=lambda bug=bug: rtl_unit(bug, build),
        )
        for bug in RTL_VARIANTS
    ]


def rtl_unit(bug: int, build: Path) -> SubprocessUnit:
    """The line-protocol bench around mxdot_fp4.sv with parameter BUG, compiled by Icarus."""
    rtl = REPO / "examples" / "rtl"
    target = build / f"mxdot_probe_tb_bug{bug}.vvp"
    subprocess.run(
        [
            "iverilog",
            "-g2012",
            f"-Pmxdot_probe_tb.BUG={bug}",
            "-o",
            str(target),
            str(rtl / "mxdot_fp4.sv"),
            str(rtl / "mxdot_probe_tb.sv"),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return SubprocessUnit(f"vvp -n {target}", *RTL_PAIR, timeout=60)


def missing(set_name: str) -> str | None:
    """Why a set cannot run here, or None."""
    if set_name == "mmasim":
        try:
            importlib.import_module("mmasim.nv_ptx")
            importlib.import_module("torch")
        except ImportError:
            return "mmasim set skipped: MMA-Sim is not installed (the oracles extra: pip install 'mxsim[oracles]')"
    if set_name == "rtl" and not (shutil.which("iverilog") and shutil.which("vvp")):
        return "rtl set skipped: Icarus Verilog (iverilog, vvp) is not on PATH"
    return None


# ----------------------------------------------------------------------------- measuring


def unit_alone(unit, run: Run) -> float:
    """Dot products per second of the unit alone on one batch of BASELINE_ROWS."""
    ctx = Context(
        run.a,
        run.b,
        run.k,
        run.block_size,
        run.out,
        seed=12345,
        scale_format=run.scale_format,
        c_format=run.c_format,
    )
    batch = ctx.fit_c(
        Batch.join(
            [ctx.realistic(BASELINE_ROWS // 2), ctx.uniform(BASELINE_ROWS - BASELINE_ROWS // 2)]
        )
    )
    fields = [getattr(batch, name) for name in ("a", "b", "scale_a", "scale_b", "c")]
    unit(*(x[:8] for x in fields))  # warm: a process started, kernels compiled
    return BASELINE_ROWS / best_seconds(lambda: unit(*fields), 10, budget=2.0)


def measure(run: Run) -> dict:
    """The probe run's figures (and the unit alone's), or {"error": message}."""
    import numba

    threads = numba.get_num_threads()
    unit = None
    try:
        unit = run.make_unit()
        if isinstance(unit, HwconfigUnit):
            run.block_size, run.c_format, run.scale_format = (
                unit.block_size,
                unit.c_format,
                unit.params.scale_format,
            )
        numba.set_num_threads(1)  # as the probe runs the unit
        rate = unit_alone(unit, run)
        numba.set_num_threads(threads)
        cpu, compiling = time.process_time(), compile_seconds()
        result = probe(
            unit,
            run.a,
            run.b,
            run.k,
            block_size=run.block_size,
            out_format=run.out,
            c_format=run.c_format,
            **run.sizes,
        )
        cpu, compiling = time.process_time() - cpu, compile_seconds() - compiling
    except (MxsimError, subprocess.CalledProcessError, OSError) as error:
        return {"error": " ".join(str(error).split())}
    finally:
        numba.set_num_threads(threads)
        if hasattr(unit, "close"):
            unit.close()
    v = result.validation
    return {
        "queries": result.queries,
        "seconds": result.seconds,
        "cpu_seconds": cpu,
        "compile_seconds": compiling,
        "unit_seconds": result.unit_seconds,
        "passes": result.passes,
        "mismatches": v.mismatches,
        "vectors": v.vectors,
        "targeted": v.targeted,
        "unit_rate": rate,
        "overhead": result.seconds / (result.queries / rate),
        "config": result.config,
    }


def keys_differing(config: dict, other: dict) -> list[str]:
    """``section.key`` of the datapath keys whose values differ between two emitted configs."""
    sections = [name for name, body in {**config, **other}.items() if isinstance(body, dict)]
    return sorted(
        f"{section}.{key}"
        for section in dict.fromkeys(sections)
        for key in {**config.get(section, {}), **other.get(section, {})}
        if config.get(section, {}).get(key) != other.get(section, {}).get(key)
    )


# ----------------------------------------------------------------------------- printing


COLUMNS = (
    "run",
    "path (A x B -> out, K)",
    "queries",
    "wall s",
    "CPU s",
    "in unit s",
    "passes",
    "mismatches",
    "unit alone dot/s",
    "probe / unit alone",
)


def cells(run: Run) -> list[str]:
    f = run.figures
    if "error" in f:
        return [run.id, run.path, f"error: {f['error']}"]
    compiling = f" ({f['compile_seconds']:.1f} compiling)" if f["compile_seconds"] >= 0.05 else ""
    return [
        run.id,
        run.path,
        f"{f['queries']:,}",
        f"{f['seconds']:.1f}{compiling}",
        f"{f['cpu_seconds']:.1f}",
        f"{f['unit_seconds']:.2f}",
        str(f["passes"]),
        f"{f['mismatches']:,} / {f['vectors']:,}",
        f"{f['unit_rate']:,.0f}",
        f"{f['overhead']:.{0 if f['overhead'] >= 10 else 1}f}x",
    ]


def totals(runs: list[Run]) -> list[list[str]]:
    rows = []
    for set_name in SETS:
        done = [r.figures for r in runs if r.set == set_name and "queries" in r.figures]
        if not done:
            continue
        failed = sum(1 for r in runs if r.set == set_name and "error" in r.figures)
        mismatched = sum(1 for f in done if f["mismatches"])
        rows.append(
            [
                f"total {set_name}: {len(done)} runs",
                f"{mismatched} with mismatches, {failed} failed",
                f"{sum(f['queries'] for f in done):,}",
                f"{sum(f['seconds'] for f in done):.1f}",
                f"{sum(f['cpu_seconds'] for f in done):.1f}",
                f"{sum(f['unit_seconds'] for f in done):.2f}",
                str(sum(f["passes"] for f in done)),
                f"{sum(f['mismatches'] for f in done):,} / {sum(f['vectors'] for f in done):,}",
                "",
                "",
            ]
        )
    return rows


def render(results: dict) -> str:
    """The markdown table of a results file written by ``--json`` (docs/probe.md holds it)."""
    runs = []
    for entry in results["runs"]:
        set_name, name = entry["id"].split("/", 1)
        a_b, rest = entry["path"].split(" -> ")
        a, b = a_b.split(" x ")
        out, k = rest.split(", K = ")
        run = Run(set_name, name, a, b, out, int(k), {})
        run.figures = {key: value for key, value in entry.items() if key not in ("id", "path")}
        runs.append(run)
    when = results["before"]
    if not any("measured" in run.figures for run in runs):
        rows = [list(COLUMNS), ["---"] * len(COLUMNS)] + [cells(run) for run in runs]
        head = (
            f"Measured with mxsim {when['mxsim']}, {when['cores']} cores, load average "
            f"{when['load_average']:.1f} before and {results['after']['load_average']:.1f} after."
        )
        rows += totals(runs)
    else:  # rows of several runs (--update): their commits and loads above the table
        rows = [list(COLUMNS), ["---"] * len(COLUMNS)] + [cells(run) for run in runs]
        rows += totals(runs)
        stamps = [
            run.figures.get("measured") or {"commit": None, "load_average": when["load_average"]}
            for run in runs
        ]
        loads = [s["load_average"] for s in stamps]
        commits = sorted({s["commit"] or "commit unknown" for s in stamps})
        head = (
            f"Measured with mxsim {when['mxsim']}, {when['cores']} cores, in several runs "
            f"({', '.join(commits)}; load average {min(loads):.1f} to {max(loads):.1f} before "
            "each row); the results file keeps each row's date, commit and load average."
        )
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join([head, "", *lines])


def show(row: list[str], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(row) + " |", flush=True)
    else:
        widths = (44, 40, 8, 8, 8, 9, 6, 13, 16, 18)
        print(
            " ".join(
                f"{cell:>{w}s}" if i > 1 else f"{cell:{w}s}"
                for i, (cell, w) in enumerate(zip(row, widths))
            ),
            flush=True,
        )


def conditions() -> dict:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "mxsim": mxsim.__version__,
        "numpy": np.__version__,
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "load_average": round(os.getloadavg()[0], 2),
    }


def commit() -> str | None:
    """The checkout's commit (``git describe --always --dirty``), or None outside one."""
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def read_results(path: str) -> dict:
    """A results file of ``--json`` (ValueError, KeyError or TypeError where it is not one)."""
    import json

    results = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(results, dict) or not isinstance(results["runs"], list):
        raise TypeError("no list of runs")
    for entry in results["runs"]:
        if not isinstance(entry, dict) or not isinstance(entry["id"], str):
            raise TypeError("a run without an id")
    if not {"date", "mxsim", "cores", "load_average"} <= results["before"].keys() or (
        "load_average" not in results["after"]
    ):
        raise KeyError("conditions")
    return results


def merged(results: dict, rows: list[dict], skipped: list[str], after: dict) -> dict:
    """``results`` with ``rows`` in place of its rows of the same ids, new ids at the end."""
    fresh = {row["id"]: row for row in rows}
    kept = [fresh.pop(entry["id"], entry) for entry in results["runs"]]
    return {
        **results,
        "after": after,
        "skipped": sorted({*results.get("skipped", []), *skipped}),
        "runs": kept + list(fresh.values()),
    }


def main(argv=None) -> None:
    parser = OneLineParser(prog="bench_probe.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--set",
        action="append",
        default=None,
        help=f"comma-separated, of {', '.join(SETS)} (default: all)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="PATTERN",
        help="shell-style pattern over run ids",
    )
    parser.add_argument(
        "--markdown", action="store_true", help="print table rows for docs/probe.md"
    )
    parser.add_argument("--json", metavar="OUT", help="write every figure to OUT (JSON)")
    parser.add_argument(
        "--update",
        metavar="RESULTS",
        help="put the runs' rows into RESULTS (a --json file), replacing rows of the same ids",
    )
    parser.add_argument(
        "--render",
        metavar="RESULTS",
        help="print the markdown table of a --json results file; probe nothing",
    )
    args = parser.parse_args(argv)
    if args.render is not None:
        import json

        try:
            print(render(json.loads(Path(args.render).read_text(encoding="utf-8"))))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            parser.error(
                f"--render: {args.render!r} is not a results file of --json ({type(error).__name__})"
            )
        return
    chosen = [s for arg in (args.set or [",".join(SETS)]) for s in arg.split(",")]
    unknown = [s for s in chosen if s not in SETS]
    if unknown:
        parser.error(f"--set: unknown set {unknown[0]!r}; known: {', '.join(SETS)}")
    if args.json is not None:
        out = Path(args.json)
        if not args.json or out.is_dir() or not out.parent.is_dir():
            parser.error(f"--json: {args.json!r} is not a file in an existing directory")
    previous = None
    if args.update is not None:
        if args.json is not None:
            parser.error("--update and --json: give one (--update rewrites its RESULTS file)")
        try:
            previous = read_results(args.update)
        except (OSError, ValueError, KeyError, TypeError) as error:
            parser.error(
                f"--update: {args.update!r} is not a results file of --json ({type(error).__name__})"
            )
    build = Path(tempfile.mkdtemp(prefix="mxsim-bench-probe-"))
    runs = [
        run
        for set_name in dict.fromkeys(chosen)
        for run in {"mxsim": mxsim_runs, "mmasim": mmasim_runs, "rtl": lambda: rtl_runs(build)}[
            set_name
        ]()
    ]
    for pattern in args.only or []:
        if not any(fnmatch.fnmatchcase(run.id, pattern) for run in runs):
            parser.error(
                f"--only: {pattern!r} matches no run of the sets {', '.join(dict.fromkeys(chosen))} "
                f"(ids are set/name, e.g. mxsim/h100, rtl/BUG=0)"
            )
    if args.only:
        runs = [run for run in runs if any(fnmatch.fnmatchcase(run.id, p) for p in args.only)]
    before = conditions()
    print(
        f"mxsim {before['mxsim']}, numpy {before['numpy']}, {before['cores']} cores, {before['date']}, "
        f"load average {before['load_average']:.1f}; one Numba thread (as the probe sets)",
        flush=True,
    )
    skipped = {}
    for set_name in dict.fromkeys(run.set for run in runs):
        skipped[set_name] = missing(set_name)
        if skipped[set_name]:
            print(skipped[set_name], flush=True)
    runs = [run for run in runs if not skipped[run.set]]
    show(list(COLUMNS), args.markdown)
    if args.markdown:
        print("|" + "---|" * len(COLUMNS), flush=True)
    revision = commit()
    reasons = [s for s in skipped.values() if s]
    for done, run in enumerate(runs, 1):
        stamp = conditions()
        run.figures = measure(run)
        run.figures["measured"] = {
            "date": stamp["date"],
            "commit": revision,
            "load_average": stamp["load_average"],
        }
        show(cells(run), args.markdown)
        if previous is not None:  # after each run: a run stopped early keeps the rows done
            rows = [{"id": r.id, "path": r.path, **r.figures} for r in runs[:done]]
            write_atomic(
                args.update,
                json_text(merged(previous, rows, reasons, conditions()), indent=1) + "\n",
            )
    for row in totals(runs):
        show(row, args.markdown)
    correct = next((run.figures.get("config") for run in runs if run.id == "rtl/BUG=0"), None)
    for run in runs:  # a broken variant: a key its fault touches, or mismatches (docs/probe.md)
        if run.set == "rtl" and run.name != "BUG=0" and correct and "config" in run.figures:
            differing = ", ".join(keys_differing(run.figures["config"], correct)) or "none"
            print(
                f"{'- ' if args.markdown else ''}{run.id} ({RTL_VARIANTS[int(run.name[4:])]}): keys other than "
                f"BUG=0's: {differing}; {run.figures['mismatches']:,} / {run.figures['vectors']:,} mismatches",
                flush=True,
            )
    after = conditions()
    print(
        f"load average before {before['load_average']:.1f}, after {after['load_average']:.1f}; "
        f"{after['date']}",
        flush=True,
    )
    shutil.rmtree(build, ignore_errors=True)
    if args.json is not None:
        rows = [{"id": run.id, "path": run.path, **run.figures} for run in runs]
        results = {"before": before, "after": after, "skipped": reasons, "runs": rows}
        write_atomic(args.json, json_text(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
