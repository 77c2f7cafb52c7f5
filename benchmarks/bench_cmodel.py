"""Exported C models (mxsim export c) against mxsim.dot: every shipped config's pairs.

For each (config, A x B): vectors compared (golden random + corners + exhaustive where small,
or random codes for tf32), mismatches (must be 0), and with --repeat the C model's dot products
per second (one thread, -O2) beside mxsim.dot's on the same vectors in the same run.
Run: ``python benchmarks/bench_cmodel.py [--hw NAME ...] [--cases N] [--repeat R] [--pairs all|first] [--kind K ...]``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import mxsim
from mxsim.cmodel.check import check_unit

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hw", action="append", help="config name (default: every hwconfigs/*.yaml)"
    )
    parser.add_argument(
        "--cases", type=int, default=1000, help="random vectors per pair (default 1000)"
    )
    parser.add_argument("--repeat", type=int, default=0, help="timed repeats (0: compare only)")
    parser.add_argument("--pairs", choices=["all", "first"], default="all")
    parser.add_argument(
        "--kind",
        action="append",
        choices=["random", "corners", "exhaustive"],
        help="case kinds (repeatable; default all three, exhaustive where small)",
    )
    args = parser.parse_args()
    names = args.hw or sorted(path.stem for path in (REPO / "hwconfigs").glob("*.yaml"))
    print(f"mxsim {mxsim.__version__}, {os.cpu_count()} cores")
    print(
        f"{'config':36s} {'pair':28s} {'vectors':>8s} {'mismatches':>10s} {'C dots/s':>10s} {'mxsim dots/s':>12s}"
    )
    failed = 0
    for name in names:
        config = mxsim.load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
        pairs = list(config.format_pairs)[: 1 if args.pairs == "first" else None]
        for a, b in pairs:
            start = time.perf_counter()
            result = check_unit(
                config,
                a,
                b,
                cases=args.cases,
                repeat=args.repeat,
                kinds=args.kind or ("random", "corners", "exhaustive"),
            )
            failed += result["mismatches"] != 0
            rates = (
                f"{result['c_dots_per_s']:10.3g} {result['mxsim_dots_per_s']:12.3g}"
                if args.repeat
                else ""
            )
            print(
                f"{name:36s} {a + 'x' + b:28s} {result['vectors']:8d} {result['mismatches']:10d} {rates}"
                f"  ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
            if result["mismatches"]:
                print("   first:", result["first"])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
