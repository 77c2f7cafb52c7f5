"""Area and logic depth of generated MX dot-product units versus their datapath keys, with the
SQNR each variant gives on a shipped trace (docs/area.md's table).

Each row is one variant of a base unit (default: B200's kind::mxf8f6f4 unit with 8-element
blocks, an 8-term tree, c in a 25-bit window, toward-zero rounding, K = 8) for one element
format: synthesized by Yosys (mxsim.rtl.synth: NAND/NOR/NOT cells, a transistor estimate,
gate levels on the longest path, cached per design) and replayed on a trace with every
operand quantized to that format (mxsim.sweep.replay_point: the worst layer's SQNR against
the ideal MX result, the same quantized operands multiplied exactly). The base row comes
first, so ratios between rows are what to read.

    python benchmarks/bench_rtl_area.py --format fp4_e2m1 --format fp8_e4m3 --record benchmarks/results/rtl-area.json
    python benchmarks/bench_rtl_area.py --render   # docs/area.md's table from the results file

``--record`` rewrites the results file after every row (a long run keeps what it finished, and
a rerun skips the rows already there for the same base, K and trace).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

from mxsim.datapath import load_hwconfig
from mxsim.datapath.config import vary_hwconfig
from mxsim.fileio import write_atomic
from mxsim.rtl import generate_unit
from mxsim.rtl.synth import synthesize
from mxsim.sweep import hardware_cost, replay_point
from mxsim.trace import load_trace

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "rtl-area.json"
DOC = REPO / "docs" / "area.md"
BLOCK = re.compile(r"(<!-- results: (rtl-area[\w-]*) -->\n)(.*?)(<!-- /results -->)", re.S)

VARIANTS = [
    ("base", {}),
    ("window 9 bits", {"adder.align_fraction_bits": 9}),
    ("window 13 bits", {"adder.align_fraction_bits": 13}),
    ("window 35 bits", {"adder.align_fraction_bits": 35}),
    ("exact tree (no window)", {"adder.align_fraction_bits": None}),
    ("products cut to 2 fraction bits", {"multiplier.product_fraction_bits": 2}),
    ("fp16 accumulator", {"accumulator.format": "fp16"}),
    ("bf16 accumulator", {"accumulator.format": "bf16"}),
]


def variants(k: int) -> list:
    """VARIANTS plus the smaller trees at the same K: K/2 and K/4 terms, chained through the
    accumulator (the labels give the tree size)."""
    trees = [(f"tree of {k // d}", {"adder.fused_terms": k // d}) for d in (2, 4) if k // d >= 1]
    return VARIANTS[:6] + trees + VARIANTS[6:]


def conditions() -> dict:
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
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "cores": os.cpu_count(),
    }


def base_config(path: str, block: int, terms: int):
    base = load_hwconfig(path)
    return vary_hwconfig(
        base, {"inputs.block_size": block, "adder.fused_terms": terms}, f"{base.name}-b{block}"
    )


def measure(args) -> None:
    base = base_config(args.hw, args.block, args.k)
    trace = load_trace(args.trace)
    setup = {
        "hw": args.hw,
        "block_size": args.block,
        "k": args.k,
        "fused_terms": args.k,
        "trace": args.trace,
    }
    old = (
        json.loads(Path(args.record).read_text())
        if args.record and Path(args.record).is_file()
        else None
    )
    results = old if old and old.get("setup") == setup else {"setup": setup, "rows": []}
    done = {(row["format"], row["variant"]) for row in results["rows"]}
    for fmt in args.format or ["fp4_e2m1"]:
        for label, changes in variants(args.k):
            if (args.only and changes and not any(part in label for part in args.only)) or (
                fmt,
                label,
            ) in done:
                continue
            hw = vary_hwconfig(base, changes, f"{base.name}-v") if changes else base
            result = synthesize(generate_unit(hw, fmt, fmt, args.k))
            sqnr = replay_point(trace, hw, fmt)["metrics"]["worst_layer_sqnr_vs_ideal_db"]
            row = {
                "format": fmt,
                "variant": label,
                "changes": changes,
                "cells": result.cells,
                "transistors": result.transistors,
                "depth": result.depth,
                "synthesis_seconds": result.seconds,
                "synthesis_cpu_seconds": result.cpu_seconds,
                "sqnr_vs_ideal_db": "inf" if math.isinf(sqnr) else round(sqnr, 2),
                **conditions(),
            }
            results["rows"].append(row)
            print(
                f"{fmt:10s} {label:34s} {result.cells:7d} cells {result.transistors:8d} transistors "
                f"depth {result.depth:4d} SQNR {row['sqnr_vs_ideal_db']} dB "
                f"({result.cpu_seconds:.0f} s processor, {result.seconds:.0f} s wall{', cached' if result.cached else ''})",
                flush=True,
            )
            if args.record:
                write_atomic(Path(args.record), json.dumps(results, indent=1) + "\n")


def table(results: dict) -> str:
    """docs/area.md's table of a results file (no dates: those stay in the file)."""
    s = results["setup"]
    # rows in the order of the variants within each format (a rerun appends what it adds)
    formats = list(dict.fromkeys(r["format"] for r in results["rows"]))
    labels = [label for label, _ in variants(s["k"])]
    rows = sorted(
        results["rows"], key=lambda r: (formats.index(r["format"]), labels.index(r["variant"]))
    )
    lines = [
        f"K = {s['k']}, {s['block_size']}-element blocks, base `{s['hw']}` with a tree of {s['fused_terms']} terms; "
        f"SQNR: worst layer of `{s['trace']}` vs the ideal MX result. Synthesized at commit "
        f"{', '.join(sorted({r['commit'] for r in rows}))}; Yosys: processor seconds (Yosys and ABC) on a "
        f"shared 2-core machine (load average {min(float(r['load_average'].split()[0]) for r in rows):.0f} to "
        f"{max(float(r['load_average'].split()[0]) for r in rows):.0f}).",
        "",
        "| elements | variant | cells | transistors | vs base | depth | SQNR (dB) | proxy bits | Yosys s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    bases = {r["format"]: r["transistors"] for r in rows if r["variant"] == "base"}
    base = base_config(str(REPO / s["hw"]), s["block_size"], s["fused_terms"])
    for r in rows:
        ratio = f"{r['transistors'] / bases[r['format']]:.2f}" if r["format"] in bases else ""
        sqnr = "exact" if r["sqnr_vs_ideal_db"] == "inf" else f"{r['sqnr_vs_ideal_db']:.1f}"
        only = {
            "inputs.a_formats": [r["format"]],
            "inputs.b_formats": [r["format"]],
        }  # the proxy counts the first pair
        proxy = hardware_cost(vary_hwconfig(base, {**r["changes"], **only}, "proxy"))["cost_bits"]
        lines.append(
            f"| {r['format']} | {r['variant']} | {r['cells']:,} | {r['transistors']:,} | {ratio} | "
            f"{r['depth']} | {sqnr} | {proxy} | {r['synthesis_cpu_seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def render(check: bool) -> int:
    """Every ``<!-- results: NAME -->`` block of docs/area.md from benchmarks/results/NAME.json."""
    text = DOC.read_text(encoding="utf-8")
    new = BLOCK.sub(
        lambda m: (
            m.group(1)
            + table(json.loads((RESULTS.parent / f"{m.group(2)}.json").read_text()))
            + m.group(4)
        ),
        text,
    )
    if check:
        return int(new != text)
    if new != text:
        write_atomic(DOC, new)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hw", default="hwconfigs/b200-tcgen05-mxf8f6f4.yaml")
    parser.add_argument(
        "--format", action="append", help="element format (repeatable; default fp4_e2m1)"
    )
    parser.add_argument(
        "--k", type=int, default=8, help="elements per dot product, and the base tree's size"
    )
    parser.add_argument("--block", type=int, default=8, help="inputs.block_size of the base unit")
    parser.add_argument("--trace", default="traces/digits-cnn")
    parser.add_argument(
        "--only", action="append", help="run only the variants whose label contains this"
    )
    parser.add_argument("--record", help="results JSON, rewritten after every row")
    parser.add_argument(
        "--render",
        action="store_true",
        help="rewrite docs/area.md's tables from benchmarks/results/rtl-area*.json",
    )
    parser.add_argument(
        "--check", action="store_true", help="with --render: exit 1 when docs/area.md is stale"
    )
    args = parser.parse_args()
    if args.render:
        return render(args.check)
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
