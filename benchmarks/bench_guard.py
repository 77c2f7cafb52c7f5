"""The short benchmark tier: a few GEMMs' and batches of GEMMs' speed as a ratio to the same
run's numpy float64 matmul of the same shape, checked against the ratios recorded in
``benchmarks/results/guard.json``.

Each GEMM case is a 512 x 512 x 512 GEMM (MXFP8, MXFP4 or MX9 operands, block scales from
standard normal data) through one shipped config, best of ``--repeats`` runs after a warm-up call,
divided into the best of as many DGEMMs of the same shape timed between the cases; each batch
case is one ``matmul_batched`` call on attention-shaped heads (``BATCH_CASES``: MiniLM's
14-token heads and 128-token ones, one case per small-groups route), beside numpy's float64
batched matmul of the shape (each timing a run of calls long enough for the clock). Both
sides are timed by the process's CPU time on one thread (Numba's and the BLAS library's
threads held to one):
a loaded, shared machine then moves a ratio far less than it moves wall-time ratios, whose
two-thread DGEMM loses most under load. The check fails (exit 1) when a case's ratio falls
below its recorded ratio divided by ``--margin`` (3 by default: a route lost, or gone back to
an old speed several times slower, not a few percent). It runs in a few seconds
once the kernels are compiled (CI runs it after the test suite, whose kernel cache it reuses).

Run: ``python benchmarks/bench_guard.py`` (check), ``--record`` (measure and record the
current figures, with the date, commit and load average).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np

import mxsim
from _timing import best_seconds, cpu_model
from mxsim.fileio import json_text, write_atomic
from mxsim.quantize import BFP_SPECS, MXGroups, quantize_bfp, quantize_grouped

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "guard.json"
SIZE = 512
MARGIN = 3.0


@dataclasses.dataclass(frozen=True)
class Case:
    config: str
    element: str

    @property
    def name(self) -> str:
        return f"{self.config} {self.element}"


CASES = [
    Case("ocp-exact", "fp8_e4m3"),
    Case("ocp-exact", "fp4_e2m1"),
    Case("kulisch", "fp8_e4m3"),
    Case("mxdotp-paper", "fp8_e4m3"),
    Case("mxdotp-paper", "fp4_e2m1"),
    Case("mxdotp", "fp8_e4m3"),
    Case("mxdotp", "fp4_e2m1"),
    Case("mxdotp-rtz", "fp8_e4m3"),
    Case("mxdotp-rtz", "fp4_e2m1"),
    Case("bfp-exact", "mx9"),
    Case("h100-fp8", "fp8_e4m3"),
    Case("b200-fp8", "fp8_e4m3"),
    Case("h200-cublaslt-fp8", "fp8_e4m3"),  # the window route's promotion
    Case("h200-fp8", "fp8_e4m3"),  # the window route's term order
    Case("a100-dmma", "fp64"),  # the FMA-chain route
    Case("mi300", "fp32"),  # the FMA-chain route in float32
    Case("mi250", "fp16"),  # the fp32-steps route, pairwise trees
    Case("mi100", "fp16"),  # the fp32-steps route, exact steps
    Case("a100", "tf32"),  # the window route's wide tables at an offset, trees of 4
    Case("mi300", "fp8_e4m3fnuz"),  # the window route's parity windows and second alignment
]


@dataclasses.dataclass(frozen=True)
class BatchCase:
    """``groups`` GEMMs of (M, K) x (K, N) through one config, one ``matmul_batched`` call."""

    config: str
    element: str
    groups: int
    m: int
    k: int
    n: int

    @property
    def name(self) -> str:
        return f"{self.config} {self.element}, {self.groups}x{self.m}x{self.k}x{self.n} batch"


#: One batch per small-groups route (``mxsim.datapath.batch``), the BLAS route's passes of
#: whole groups and the group-sum route's one pass of a batch: MiniLM's heads (12 x 16 of 14
#: tokens, head size 32) and 128-token ones.
BATCH_CASES = [
    BatchCase("ocp-exact", "fp8_e4m3", 192, 14, 32, 14),  # exact groups, q @ k^T
    BatchCase("kulisch", "fp8_e4m3", 192, 14, 14, 32),  # exact accumulator, P @ v
    BatchCase("mxdotp", "fp8_e4m3", 192, 14, 32, 14),  # a fixed-point grid
    BatchCase("bfp-exact", "mx9", 192, 14, 32, 14),  # the float32 kernel
    BatchCase("h100-fp8", "fp8_e4m3", 192, 14, 32, 14),  # narrow window groups
    BatchCase("ocp-exact", "fp8_e4m3", 24, 128, 64, 128),  # wide exact groups
    BatchCase("b200-fp8", "fp8_e4m3", 24, 128, 128, 64),  # wide window groups, transposed
    BatchCase("mxdotp-paper", "fp8_e4m3", 24, 128, 64, 128),  # the BLAS route's group passes
    BatchCase("b200-tcgen05-mxf4", "fp4_e2m1", 192, 14, 32, 14),  # the group-sum route's batch
    BatchCase("mi300", "fp8_e4m3fnuz", 192, 14, 32, 14),  # window groups in parity windows
]
#: CPU seconds that a batch case's timing runs at least (its calls repeated in one timing).
BATCH_TIMING = 0.005


def batch_operands(hw, element: str, groups: int, m: int, k: int, n: int, rng):
    """(A, B) of a batch through ``hw``: standard normal (G, M, K) and (G, K, N) data
    quantized along K group by group, B as its rows of B^T (as a model's weight arrives);
    MX4/MX6/MX9 through the BFP quantizer, one group at a time; one scale per group for
    units without block scales."""
    x = rng.standard_normal((groups, m, k)).astype(np.float32)
    y = rng.standard_normal((groups, k, n)).astype(np.float32)
    if element.upper() in BFP_SPECS:
        return tuple(
            MXGroups.of(
                [quantize_bfp(part, element.upper(), axis=axis).as_mx_tensor() for part in values]
            )
            for values, axis in ((x, 1), (y, 0))
        )
    block = hw.sections[("inputs", "block_size")]
    per_tensor = hw.sections[("inputs", "scales")] == "none"
    a = quantize_grouped(x, element, block, per_tensor_scale=per_tensor)
    rows = quantize_grouped(
        np.ascontiguousarray(y.transpose(0, 2, 1)), element, block, per_tensor_scale=per_tensor
    )
    return a, dataclasses.replace(rows, shape=(k, n), axis=0)


def operand_scaling(hw, element: str) -> dict:
    """quantize_mx's scaling keywords for a GEMM case's operands: block scales where the unit
    takes them; else one power-of-two scale per operand, which puts the data's largest value
    near the format's, or, for a format whose range far exceeds the data's (largest exponent
    64 or more: bf16, tf32, fp32, fp64), none: the data cast as it is, as a model's weights
    and activations are (scaled to near 2^127, products would overflow)."""
    if hw.sections[("inputs", "scales")] != "none":
        return {}
    if mxsim.get_format(element).emax >= 64:
        return {"per_tensor_scale": True, "tensor_scale_exponent": 0}
    return {"per_tensor_scale": True}


def numba_target() -> str:
    """The CPU Numba compiles the kernels for (``NUMBA_CPU_NAME``, else LLVM's name of the
    host, which sets the vector width LLVM prefers)."""
    import llvmlite.binding

    return numba.config.CPU_NAME or llvmlite.binding.get_host_cpu_name()


def processor_notice(recorded: dict, where: dict) -> str | None:
    """A line saying the recorded ratios come from another processor (or one not recorded)
    than this run's ``where`` (:func:`conditions`); None where they come from this one."""
    then = [recorded.get(key) for key in ("cpu", "numba_target")]
    now = [where[key] for key in ("cpu", "numba_target")]
    if then == now:
        return None
    named = ", ".join(x for x in then if x) or "a processor not recorded"
    return (
        f"the recorded ratios come from {named}, this run from {', '.join(now)}: a ratio "
        "may differ by the processor alone"
    )


def conditions() -> dict:
    """Where and when: date, commit, load average, machine, processor, library versions."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    try:
        load = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        load = [f"{x:.2f}" for x in os.getloadavg()] if hasattr(os, "getloadavg") else []
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "load_average": " ".join(load),
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "numba_target": numba_target(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "mxsim": mxsim.__version__,
    }


def measure(cases=CASES, size: int = SIZE, repeats: int = 3) -> dict[str, float]:
    """{case name: GEMM speed / same-run DGEMM speed} (ratio of best times, DGEMM / GEMM)."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((size, size)), rng.standard_normal((size, size))
    x @ y
    ratios = {}
    for case in cases:
        hw = mxsim.load_hwconfig(REPO / "hwconfigs" / f"{case.config}.yaml")
        if case.element.upper() in BFP_SPECS:  # MX4/MX6/MX9: Quark's BFP quantizer
            a = quantize_bfp(x, case.element.upper(), axis=1).as_mx_tensor()
            b = quantize_bfp(y, case.element.upper(), axis=0).as_mx_tensor()
        else:
            scaling = operand_scaling(hw, case.element)
            a = mxsim.quantize_mx(x.astype(np.float32), case.element, axis=1, **scaling)
            b = mxsim.quantize_mx(y.astype(np.float32), case.element, axis=0, **scaling)
        mxsim.matmul(hw, a, b)  # compiles or loads the kernels outside the timing
        with one_thread():
            gemm = best_seconds(lambda: mxsim.matmul(hw, a, b), repeats, time.process_time)
            dgemm = best_seconds(lambda: x @ y, repeats, time.process_time)
        ratios[case.name] = dgemm / gemm
    return ratios


def measure_batches(cases=BATCH_CASES, repeats: int = 3) -> dict[str, float]:
    """{case name: batch speed / same-run numpy float64 batched matmul speed of the shape}."""
    rng = np.random.default_rng(0)
    ratios = {}
    for case in cases:
        hw = mxsim.load_hwconfig(REPO / "hwconfigs" / f"{case.config}.yaml")
        shape = (case.groups, case.m, case.k, case.n)
        a, b = batch_operands(hw, case.element, *shape, rng)
        x = rng.standard_normal((case.groups, case.m, case.k))
        y = rng.standard_normal((case.groups, case.k, case.n))
        with one_thread():
            ratios[case.name] = _calls_seconds(lambda: np.matmul(x, y), repeats) / _calls_seconds(
                lambda: mxsim.matmul_batched(hw, a, b), repeats
            )
    return ratios


def _calls_seconds(run, repeats: int) -> float:
    """CPU seconds of one call of ``run``: the best of ``repeats`` timings of a run of calls
    lasting at least ``BATCH_TIMING`` (after a warm-up call, which compiles or loads the kernels,
    and a call that sizes the run)."""
    run()
    start = time.process_time()
    run()
    calls = max(1, int(BATCH_TIMING / max(time.process_time() - start, 1e-6)))

    def run_calls():
        for _ in range(calls):  # (each result dropped: kept ones would cost fresh pages)
            run()

    return best_seconds(run_calls, repeats, time.process_time) / calls


@contextlib.contextmanager
def one_thread():
    """Numba's and the BLAS library's threads held to one (threadpoolctl, the ``blas`` extra),
    so that the process's CPU time is what an idle core would take: other jobs on a shared
    machine slow both sides of a ratio alike instead of starving multithreaded DGEMM."""
    from threadpoolctl import threadpool_limits

    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        numba.set_num_threads(threads)


def regressions(
    recorded: dict[str, float], measured: dict[str, float], margin: float = MARGIN
) -> list[str]:
    """One line per case whose measured ratio fell below recorded / margin, or that is missing."""
    problems = []
    for name, ratio in recorded.items():
        if name not in measured:
            problems.append(f"{name}: not measured")
        elif measured[name] < ratio / margin:
            problems.append(
                f"{name}: {measured[name]:.3f}x numpy, recorded {ratio:.3f}x "
                f"({ratio / measured[name]:.1f}x slower; the margin is {margin:g}x)"
            )
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--record", action="store_true", help=f"write the figures to {RESULTS.relative_to(REPO)}"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--margin", type=float, default=MARGIN)
    args = parser.parse_args(argv)
    where = conditions()
    measured = measure(repeats=args.repeats) | measure_batches(repeats=args.repeats)
    print(f"{where['date']}, commit {where['commit']}, load average {where['load_average']}")
    results = {} if args.record else json.loads(RESULTS.read_text())
    recorded = results.get("ratios", {})
    notice = results and processor_notice(results.get("conditions", {}), where)
    if notice:
        print(notice)
    for name, ratio in measured.items():
        print(
            f"  {name:48s} {ratio:6.3f}x numpy float64"
            + (f"  (recorded {recorded[name]:.3f}x)" if name in recorded else "")
        )
    if args.record:
        write_atomic(
            RESULTS,
            json_text({"conditions": where, "size": SIZE, "ratios": measured}, indent=1) + "\n",
        )
        return 0
    problems = regressions(recorded, measured, args.margin)
    for line in problems:
        print(f"regression: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
