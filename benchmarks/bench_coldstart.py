"""Cold start: a fresh install into a temporary venv, then the README's first command and
``mxsim dot`` with an empty kernel cache (first run: compiling) and again (cached).

Usage: python benchmarks/bench_coldstart.py [--venv DIR] [--skip-install] [--per-kernel] [--record]
       python benchmarks/bench_coldstart.py --per-config ocp-exact,h100-fp8,mxdotp|all [--shared-cache] [--record]

Prints wall and CPU seconds of each step (CPU time, user + system of the child, depends far
less on the machine's load than wall time) beside a same-run baseline, the cold compile of a
trivial Numba function in the same venv, and the load average. Needs network access or a local wheel cache
for the install. ``--per-kernel`` also runs the README replay once more in one process with an
empty cache and prints each kernel's compile seconds, exclusive of the kernels it calls
(from Numba's compile events; without the replay's warm-up child, so every kernel compiles in
that one process). The README replay's CPU seconds include its warm-up child's, which compiles
alongside on the other core where the load average leaves one free (``mxsim.replay.warmup``). ``--per-config`` instead measures each config's first use
alone: ``mxsim replay traces/digits-cnn --hw CONFIG`` from this checkout with an empty kernel
cache, its compile seconds (the replay's own report) and CPU seconds (its warm-up child's
included: one unit's route compiles there, alongside); ``all`` takes every
shipped config, and ``--shared-cache`` runs them in turn on one cache (what each adds to the
ones before it; the total is the cost of them all). ``--record`` writes the per-config table
to ``benchmarks/results/coldstart.json``, the README command's to ``coldstart-readme.json``,
with the date, commit and load average (docs/benchmarks.md shows them:
``benchmarks/docs_tables.py``).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
README_REPLAY = [
    "replay",
    "traces/digits-cnn",
    "--hw",
    "hwconfigs/ocp-exact.yaml",
    "--hw",
    "hwconfigs/h100-fp8.yaml",
    "--hw",
    "hwconfigs/mxdotp.yaml",
    "--end-to-end",
]
DOT = [
    "dot",
    "--hw",
    "hwconfigs/h100-fp8.yaml",
    "--a-format",
    "fp8_e4m3",
    "--b-format",
    "fp8_e4m3",
    "--a",
    "1,1,1",
    "--b",
    "1,1,1",
]
PER_KERNEL = """
import sys, time, collections
from numba.core import event
from mxsim.cli import main
stack, own, signatures = [], collections.Counter(), collections.Counter()
class Listener(event.Listener):
    def on_start(self, ev):
        stack.append([time.process_time(), 0.0])
    def on_end(self, ev):
        started, children = stack.pop()
        seconds = time.process_time() - started
        if stack:
            stack[-1][1] += seconds
        dispatcher = ev.data.get("dispatcher")
        name = getattr(getattr(dispatcher, "py_func", None), "__qualname__", str(dispatcher))
        own[name] += seconds - children
        signatures[name] += 1
event.register("numba:compile", Listener())
try:
    main(sys.argv[1:])
except SystemExit:
    pass
for name, seconds in own.most_common():
    print(f"PER_KERNEL {name} {signatures[name]} {seconds:.2f}")
"""
BASELINE = "import numba\n@numba.njit\ndef f(x):\n    return x + 1\nf(1)\n"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], env: dict) -> tuple[tuple[float, float], str]:
    """(wall seconds, CPU seconds) of running ``command``, and its output."""
    start, cpu = time.perf_counter(), _children_cpu()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start, _children_cpu() - cpu
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{result.stderr}")
    return seconds, result.stdout


def record(name: str, command: str, note: str, load: tuple, columns: list, rows: list) -> None:
    """Write a results table (docs_tables' plain format) to benchmarks/results/NAME.json."""
    sys.path.insert(0, str(REPO))
    from benchmarks.bench_guard import conditions
    from mxsim.fileio import json_text, write_atomic

    where = conditions()
    where["load_average"] = f"{min(load):.1f}\u2013{max(load):.1f}"
    table = {"command": command, "note": note, "conditions": where, "columns": columns}
    write_atomic(RESULTS / f"{name}.json", json_text({**table, "rows": rows}, indent=1) + "\n")


def per_config(
    configs: list[str], shared_cache: bool = False, save: bool = False, label: str = ""
) -> None:
    """Each config's first use with an empty kernel cache: compile and CPU seconds. With
    ``shared_cache`` the configs run in turn on one cache, each compiling only what the
    ones before it did not (the total is every config's first use). ``label``: how the
    recorded command names the configs (default: their list). The caches are removed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    print(
        f"{'config (README replay, empty cache)':40s} {'compiling':>10s} {'CPU':>8s} {'wall':>8s}  load average"
    )
    shared = tempfile.mkdtemp(prefix="mxsim-cache-shared-")
    totals = [0.0, 0.0]
    rows, loads = [], [os.getloadavg()[0]]
    for name in configs:
        cache = shared if shared_cache else tempfile.mkdtemp(prefix=f"mxsim-cache-{name}-")
        command = [
            sys.executable,
            "-m",
            "mxsim.cli",
            *README_REPLAY[:2],
            "--hw",
            f"hwconfigs/{name}.yaml",
        ]
        (wall, cpu), output = timed(command, dict(env, NUMBA_CACHE_DIR=cache))
        compiling = next(
            (
                line.split("(+ ")[1].split(" s compiling")[0]
                for line in output.splitlines()
                if "s compiling kernels)" in line
            ),
            "0",
        )
        print(
            f"{name:40s} {float(compiling):8.1f} s {cpu:6.1f} s {wall:6.1f} s  {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        if not shared_cache:
            shutil.rmtree(cache, ignore_errors=True)
        totals[0] += float(compiling)
        totals[1] += cpu
        rows.append([f"`{name}`", f"{float(compiling):.1f} s", f"**{cpu:.1f} s**", f"{wall:.1f} s"])
        loads.append(os.getloadavg()[0])
    shutil.rmtree(shared, ignore_errors=True)
    print(f"{'total':40s} {totals[0]:8.1f} s {totals[1]:6.1f} s")
    if save:
        record(
            "coldstart",
            f"python benchmarks/bench_coldstart.py --per-config {label or ','.join(configs)}"
            + (" --shared-cache" if shared_cache else ""),
            "Each config's first use, `mxsim replay traces/digits-cnn --hw CONFIG` with an empty "
            "kernel cache; compiling: the wall seconds the replay report prints, CPU: user + "
            "system of the command and of its warm-up child, which compiles the unit's route "
            "on the other core where the load average leaves one free (mxsim.replay.warmup).",
            loads,
            ["config", "compiling", "CPU", "wall"],
            rows,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", help="venv directory (default: a temporary one)")
    parser.add_argument("--skip-install", action="store_true", help="reuse --venv as it is")
    parser.add_argument(
        "--per-kernel",
        action="store_true",
        help="also print the README replay's compile CPU seconds per kernel",
    )
    parser.add_argument(
        "--per-config",
        metavar="CONFIGS",
        help="comma-separated configs, or all (every hwconfigs/*.yaml): each one's first use alone",
    )
    parser.add_argument(
        "--record", action="store_true", help=f"write the figures to {RESULTS.relative_to(REPO)}"
    )
    parser.add_argument(
        "--shared-cache",
        action="store_true",
        help="with --per-config: the configs in turn on one kernel cache",
    )
    args = parser.parse_args()
    if args.per_config:
        configs = args.per_config.split(",")
        label = ""
        if configs == ["all"]:
            configs = sorted(path.stem for path in (REPO / "hwconfigs").glob("*.yaml"))
            label = "all"
        per_config(configs, args.shared_cache, args.record, label)
        return
    work = Path(tempfile.mkdtemp(prefix="mxsim-coldstart-"))
    venv = Path(args.venv) if args.venv else work / "venv"
    python, mxsim = venv / "bin" / "python", venv / "bin" / "mxsim"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "PYTHON"))}
    rows = []
    if not args.skip_install:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        seconds, _ = timed([str(python), "-m", "pip", "install", "--quiet", "."], env)
        rows.append(("pip install . (fresh venv)", seconds))
    load_before = os.getloadavg()
    for label, command in (("README replay", README_REPLAY), ("mxsim dot", DOT)):
        cache = work / f"cache-{label.split()[-1]}"
        run_env = dict(env, NUMBA_CACHE_DIR=str(cache))
        cold, output = timed([str(mxsim), *command], run_env)
        warm, _ = timed([str(mxsim), *command], run_env)
        rows.append((f"{label}, cold cache", cold))
        rows.append((f"{label}, cached", warm))
        print(
            f"{label}: cold {cold[0]:.1f} s wall, {cold[1]:.1f} s CPU; cached {warm[0]:.1f} s wall, {warm[1]:.1f} s CPU",
            file=sys.stderr,
            flush=True,
        )
        if label == "README replay":
            rows.append(
                (
                    "  (replay's own report)",
                    next(line for line in output.splitlines() if line.startswith("total ")),
                )
            )
    baseline, _ = timed(
        [str(python), "-c", BASELINE], dict(env, NUMBA_CACHE_DIR=str(work / "cache-baseline"))
    )
    rows.append(("baseline: trivial numba function, cold", baseline))
    load_after = os.getloadavg()
    print(f"{'step':42s} {'wall':>8s}   {'CPU':>8s}   CPU vs baseline")
    for label, value in rows:
        if isinstance(value, tuple):
            print(
                f"{label:42s} {value[0]:8.1f} s {value[1]:8.1f} s  {value[1] / baseline[1]:5.1f}x"
            )
        else:
            print(f"{label:42s} {value}")
    if args.record:
        install = next((value for label, value in rows if label.startswith("pip install")), None)
        replay = next(value for label, value in rows if label == "README replay, cold cache")
        record(
            "coldstart-readme",
            "python benchmarks/bench_coldstart.py" + (" --skip-install" if install is None else ""),
            "The README's first command on a fresh machine: `pip install .` into a fresh venv, "
            "then `mxsim replay traces/digits-cnn --hw ocp-exact --hw h100-fp8 --hw mxdotp "
            "--end-to-end` with an empty kernel cache; wall / CPU (user + system) seconds.",
            (load_before[0], os.getloadavg()[0]),
            ["pip install .", "README replay, empty cache", "install + replay"],
            [
                [
                    "-" if install is None else f"{install[0]:.1f} s / {install[1]:.1f} s",
                    f"{replay[0]:.1f} s / **{replay[1]:.1f} s**",
                    f"{replay[0] + (install[0] if install else 0):.1f} s / "
                    f"**{replay[1] + (install[1] if install else 0):.1f} s**",
                ]
            ],
        )
    if args.per_kernel:
        # every kernel in this one process: no warm-up child (mxsim/replay/warmup.py)
        per_kernel_env = dict(
            env, NUMBA_CACHE_DIR=str(work / "cache-per-kernel"), MXSIM_PARALLEL_COMPILE="0"
        )
        _, output = timed([str(python), "-c", PER_KERNEL, *README_REPLAY], per_kernel_env)
        rows = [line.split()[1:] for line in output.splitlines() if line.startswith("PER_KERNEL ")]
        print(
            f"{'kernel (README replay, exclusive compile CPU)':50s} {'signatures':>10s} {'CPU':>8s}"
        )
        for name, count, seconds in rows:
            print(f"{name:50s} {count:>10s} {float(seconds):8.1f} s")
        print(
            f"{'total':50s} {sum(int(c) for _, c, _ in rows):10d} {sum(float(s) for *_, s in rows):8.1f} s"
        )
    print(
        f"cores {os.cpu_count()}, load average before {load_before[0]:.1f}, after {load_after[0]:.1f}"
    )


if __name__ == "__main__":
    main()
