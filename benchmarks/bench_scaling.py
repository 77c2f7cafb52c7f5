"""Scale-out: a sweep and a replay in-process, and on a Dask LocalCluster of 1 and 2 workers.

Times are wall clock after warming every worker (cluster start-up and kernel loading
excluded; the start-up is printed separately). The in-process run is the same-run baseline;
every distributed result is checked bit-identical to it.
Run: ``python benchmarks/bench_scaling.py [--points N] [--replay-trace NAME]`` (needs mxsim[dask]).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

import mxsim
from mxsim.parallel import DaskRunner, InProcess
from mxsim.sweep import parse_knobs, run_sweep
from mxsim.trace import load_trace
from mxsim.replay import replay

REPO = Path(__file__).resolve().parent.parent


def timed_sweep(trace, base, knobs, runner) -> tuple[float, list[str]]:
    with tempfile.TemporaryDirectory() as out:  # a fresh directory: nothing resumed
        start = time.perf_counter()
        summary = run_sweep(trace, base, knobs, out, runner=runner)
        seconds = time.perf_counter() - start
    return seconds, [point["result"]["bits_sha256"] for point in summary["points"]]


def timed_replay(trace, units, runner) -> tuple[float, list[np.ndarray]]:
    start = time.perf_counter()
    report = replay(trace, units, runner=runner)
    seconds = time.perf_counter() - start
    return seconds, [r.bits for name in report["units"] for r in report["_results"][name]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep-trace", default="digits-cnn")
    parser.add_argument(
        "--points", type=int, default=8, help="sweep points (align_fraction_bits 8, 9, ...)"
    )
    parser.add_argument("--replay-trace", default="ppocr-cls")
    parser.add_argument("--hw", default="h100-fp8")
    args = parser.parse_args()
    base = mxsim.load_hwconfig(REPO / "hwconfigs" / f"{args.hw}.yaml")
    sweep_trace = load_trace(REPO / "traces" / args.sweep_trace)
    replay_trace = load_trace(REPO / "traces" / args.replay_trace)
    knobs = parse_knobs([f"adder.align_fraction_bits=8:{7 + args.points}"])
    warm_knobs = parse_knobs(["adder.align_fraction_bits=20:21"])
    print(
        f"mxsim {mxsim.__version__}, numpy {np.__version__}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f} at start"
    )
    print(
        f"sweep: {args.sweep_trace} x {args.points} points of {args.hw}; replay: {args.replay_trace} through {args.hw}"
    )
    rows = []
    baseline = {}
    for workers in (None, 1, 2):
        start = time.perf_counter()
        runner = InProcess() if workers is None else DaskRunner(workers=workers, timeout=300)
        startup = time.perf_counter() - start
        try:
            timed_sweep(sweep_trace, base, warm_knobs, runner)  # every worker loads its kernels
            timed_replay(replay_trace, [base], runner)
            sweep_seconds, sweep_bits = timed_sweep(sweep_trace, base, knobs, runner)
            replay_seconds, replay_bits = timed_replay(replay_trace, [base], runner)
        finally:
            runner.close()
        if workers is None:
            baseline = {
                "sweep": (sweep_seconds, sweep_bits),
                "replay": (replay_seconds, replay_bits),
            }
        else:
            assert sweep_bits == baseline["sweep"][1], (
                "sweep results differ from the in-process run"
            )
            assert all(
                np.array_equal(a, b)
                for a, b in zip(replay_bits, baseline["replay"][1], strict=True)
            ), "replay bits differ from the in-process run"
        rows.append(
            (
                "in-process" if workers is None else f"{workers} worker{'s' * (workers > 1)}",
                startup,
                sweep_seconds,
                replay_seconds,
            )
        )
    print(
        f"\n{'runner':12s} {'start s':>8s} {'sweep s':>8s} {'vs in-proc':>10s} {'replay s':>9s} {'vs in-proc':>10s}"
    )
    for name, startup, sweep_seconds, replay_seconds in rows:
        print(
            f"{name:12s} {startup:8.2f} {sweep_seconds:8.2f} {baseline['sweep'][0] / sweep_seconds:9.2f}x "
            f"{replay_seconds:9.2f} {baseline['replay'][0] / replay_seconds:9.2f}x"
        )
    one, two = rows[1], rows[2]
    print(
        f"\n2 vs 1 worker: sweep {one[2] / two[2]:.2f}x, replay {one[3] / two[3]:.2f}x "
        "(results bit-identical to in-process)"
    )


if __name__ == "__main__":
    main()
