"""Every shipped MX config's generated unit: golden vectors through Icarus Verilog and
Verilator (vectors, mismatches) and a Yosys synthesis (cells, transistors, depth, processor
seconds), one row per distinct unit (docs/area.md's per-config table).

A config is an MX config when its first format pair has scales (E8M0 or UE4M3: the MX,
NVFP4 and bfp units) or elements of at most 8 bits (the FP8 tensor-core paths). Each takes
its first format pair at K = 32, or at its tree's size where a tree spans more than 32
elements (the group-sum units' 64); bfp-exact's K = 32 is two trees of 16. Configs whose
resolved parameters at that pair are equal generate the same unit (the RTL and the vectors
are functions of the parameters): the first in name order stands for the rest.

    python benchmarks/bench_rtl_configs.py --record benchmarks/results/rtl-configs.json
    python benchmarks/bench_rtl_configs.py --reference --record benchmarks/results/rtl-reference.json
    python benchmarks/docs_tables.py   # docs/area.md's tables from the results files

``--reference`` runs the reference units of docs/area.md's design-point comparison instead
(:data:`REFERENCES`): the same steps, one row each.

``--record`` rewrites the results file after every step (simulation, synthesis), and a rerun
skips the steps already recorded for the same unit and vector count. Run it ``nice``'d: a
K = 32 synthesis takes a minute or more of processor time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from bench_rtl_area import conditions

from mxsim.datapath import load_hwconfig
from mxsim.datapath.config import vary_hwconfig
from mxsim.errors import ConfigError
from mxsim.fileio import write_atomic
from mxsim.formats import get_format
from mxsim.golden import generate
from mxsim.rtl import check_covered, generate_unit
from mxsim.rtl.simulate import simulate
from mxsim.rtl.synth import _children_cpu, synthesize

REPO = Path(__file__).resolve().parent.parent
K = 32
#: docs/area.md's design-point comparison: generated units as published designs define theirs
#: (config, pair, K, changed keys, what the unit is).
REFERENCES = [
    {
        "config": "mi100",
        "pair": ["fp32", "fp32"],
        "k": 1,
        "changes": {"inputs.block_size": 1},  # no scales: it only sets the vectors' K
        "what": "an IEEE fp32 fused multiply-add: a·b + c rounded once to nearest even, "
        "subnormals kept (MI100's fp32 path at K = 1)",
    },
    {
        "config": "mxdotp",
        "pair": ["fp8_e4m3", "fp8_e4m3"],
        "k": 8,
        "changes": {"inputs.block_size": 8},
        "what": "one MXDOTP operation: 8 E4M3 products, one E8M0 scale per operand, the FP32 "
        "accumulator, one rounding (the mxdotp config with the scale over the operation's 8 "
        "elements)",
    },
]


def mx_units(patterns=None, skip=None) -> list[dict]:
    """One entry per distinct unit of the shipped MX configs: config, stands_for, pair, k."""
    units, seen = [], {}
    for path in sorted((REPO / "hwconfigs").glob("*.yaml")):
        hw = load_hwconfig(path)
        pair = hw.format_pairs[0]
        params = hw.params(*pair)
        if params.scales == "none" and max(get_format(f).bits for f in pair) > 8:
            continue
        k = K
        if params.scales != "none" and params.fused_terms % params.block_size == 0:
            k = max(k, params.fused_terms)
        k = -(-k // params.block_size) * params.block_size
        if (params, k) in seen:
            seen[params, k]["stands_for"].append(hw.name)
            continue
        entry = {"config": hw.name, "stands_for": [], "pair": list(pair), "k": k}
        try:
            check_covered(params, hw.source)
        except ConfigError as error:  # a refused key: listed, not run
            entry["refused"] = str(error)
        seen[params, k] = entry
        units.append(entry)
    if patterns:
        units = [u for u in units if any(p in u["config"] for p in patterns)]
    if skip:
        units = [u for u in units if not any(p in u["config"] for p in skip)]
    return units


def prove(hw, unit, pair, cases: int, simulator: str) -> dict:
    """Golden vectors (random and corners) through ``unit`` under ``simulator``."""
    with tempfile.TemporaryDirectory(prefix="mxsim-bench-rtl-") as tmp:
        manifest = generate(
            hw,
            Path(tmp) / "vectors",
            cases=cases,
            seed=11,
            kinds=["random", "corners"],
            pairs=[tuple(pair)],
            dot_length=unit.dot_length,
            progress=False,
        )
        files = sorted((Path(tmp) / "vectors").glob("*.hex"))
        expected = sum(e["count"] for u in manifest["units"] for e in u["files"].values())
        start, cpu = time.perf_counter(), _children_cpu()
        results = simulate(unit, files, simulator, work_dir=tmp, timeout=3600)
        passed = sum(r.passed for r in results.values())
        failed = sum(r.failed for r in results.values())
        if passed + failed != expected:
            raise SystemExit(f"{unit.name}: {passed + failed} vectors run, {expected} written")
        return {
            "vectors": passed + failed,
            "mismatches": failed,
            "first_failures": [f for r in results.values() for f in r.failures][:3],
            "simulator_cpu_seconds": round(_children_cpu() - cpu, 1),
            "seconds": round(time.perf_counter() - start, 1),
        }


def measure(args) -> None:
    record = Path(args.record) if args.record else None
    results = json.loads(record.read_text()) if record and record.is_file() else {"rows": []}
    rows = {r["config"]: r for r in results["rows"]}
    for entry in REFERENCES if args.reference else mx_units(args.only, args.skip):
        row = rows.setdefault(entry["config"], dict(entry))
        row.update({k: v for k, v in entry.items() if k != "refused"})
        if entry.get("refused"):
            row["refused"] = entry["refused"]
            continue
        hw = load_hwconfig(REPO / "hwconfigs" / f"{entry['config']}.yaml")
        if entry.get("changes"):
            hw = vary_hwconfig(hw, entry["changes"], f"{hw.name}-reference")
        unit = generate_unit(hw, *entry["pair"], entry["k"])
        for simulator in ("iverilog", "verilator"):
            if (
                simulator not in args.step
                or row.get(simulator, {}).get("random_cases") == args.cases
            ):
                continue
            outcome = prove(hw, unit, entry["pair"], args.cases, simulator)
            row[simulator] = {"random_cases": args.cases, **outcome, **conditions()}
            print(f"{entry['config']} K={entry['k']} {simulator}: {outcome}", flush=True)
            _save(record, results, rows, args.reference)
        for step in ("yosys", "yosys_hierarchical"):
            if step not in args.step or step in row:
                continue
            result = synthesize(unit, hierarchical=step == "yosys_hierarchical")
            row[step] = {
                "cells": result.cells,
                "transistors": result.transistors,
                "depth": result.depth,
                "cpu_seconds": result.cpu_seconds,
                "seconds": result.seconds,
                **conditions(),
            }
            print(f"{entry['config']} K={entry['k']} {step}: {row[step]}", flush=True)
            _save(record, results, rows, args.reference)


def _save(record, results, rows, reference=False) -> None:
    results["rows"] = sorted(rows.values(), key=lambda r: r["config"])
    if reference:
        results["setup"] = {"vectors": "mxsim golden random (seed 11) and corners"}
        if record:
            write_atomic(record, json.dumps(results, indent=1) + "\n")
        return
    results["setup"] = {
        "selection": "shipped configs whose first pair has scales or elements of at most 8 bits",
        "k": f"{K}, or the tree's size where a tree spans more (multiples of the block)",
        "vectors": "mxsim golden random (seed 11) and corners",
    }
    if record:
        write_atomic(record, json.dumps(results, indent=1) + "\n")


def table(results: dict) -> str:
    """docs/area.md's per-config table (dates and load stay in the results file)."""
    rows = list(results["rows"])
    recorded = {r["config"] for r in rows}
    rows += [dict(u, missing=True) for u in mx_units() if u["config"] not in recorded]
    rows.sort(key=lambda r: r["config"])
    steps = ("iverilog", "verilator", "yosys", "yosys_hierarchical")
    stamps = [r[s] for r in rows for s in steps if r.get(s)]
    loads = [float(s["load_average"].split()[0]) for s in stamps]
    lines = [
        f"First format pair of each config, K = {results['setup']['k']}; vectors: "
        f"{results['setup']['vectors']}, every output bit compared (Icarus / Verilator); Yosys: "
        "processor seconds of Yosys and ABC. Recorded at commit "
        f"{', '.join(sorted({s['commit'] for s in stamps}))}, shared 2-core machine "
        f"(load average {min(loads):.0f} to {max(loads):.0f}).",
        "",
        "| config (stands for) | pair | K | vectors | mismatches | cells | transistors | depth | Yosys s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = f"{r['config']} ({', '.join(r['stands_for'])})" if r["stands_for"] else r["config"]
        pair = " × ".join(r["pair"])
        if r.get("missing"):
            lines.append(f"| {name} | {pair} | {r['k']} | not run | | | | | |")
            continue
        if r.get("refused"):
            lines.append(
                f"| {name} | {pair} | {r['k']} | refused: {r['refused'].split(': ', 1)[1]} ||||||"
            )
            continue
        sims = [r.get(s) for s in ("iverilog", "verilator")]
        vectors = " / ".join(f"{s['vectors']:,}" if s else "–" for s in sims)
        mismatches = " / ".join(str(s["mismatches"]) if s else "–" for s in sims)
        y, h = r.get("yosys"), r.get("yosys_hierarchical")
        area = (
            f"{y['cells']:,} | {y['transistors']:,} | {y['depth']} | {y['cpu_seconds']:.0f}"
            if y
            else f"{h['cells']:,} ¹ | {h['transistors']:,} ¹ | {h['depth']} ¹ | {h['cpu_seconds']:.0f} ¹"
            if h
            else "– | – | – | –"
        )
        lines.append(f"| {name} | {pair} | {r['k']} | {vectors} | {mismatches} | {area} |")
    if any(r.get("yosys_hierarchical") and not r.get("yosys") for r in rows):
        lines += ["", "¹ " + hierarchical_note(rows)]
    return "\n".join(lines) + "\n"


def hierarchical_note(rows: list) -> str:
    """The footnote of units synthesized module by module, with the ratios of the two flows
    on the units that have both."""
    note = (
        "Synthesized module by module (`--step yosys_hierarchical`: the same flow without "
        "`-flatten`, each distinct module mapped once by ABC), then the mapped netlist "
        "flattened, with no further optimisation, and measured: the cells, transistors and "
        "depth of that mapping (the depth from its netlist, `mxsim.rtl.synth.blif_depth`), "
        "upper bounds on the flat flow's: nothing is optimised across module boundaries (a "
        "module's gates do not see the constants and the logic around its instances)."
    )
    both = [r for r in rows if r.get("yosys") and r.get("yosys_hierarchical")]
    for r in both:
        y, h = r["yosys"], r["yosys_hierarchical"]
        note += (
            f" On {r['config']}, synthesized both ways, the module-by-module figures are "
            f"{h['cells'] / y['cells']:.2f}, {h['transistors'] / y['transistors']:.2f} and "
            f"{h['depth'] / y['depth']:.2f} times the flat flow's cells, transistors and depth "
            f"({h['cells']:,}, {h['transistors']:,} and {h['depth']} against {y['cells']:,}, "
            f"{y['transistors']:,} and {y['depth']})."
        )
    return note


def reference_table(results: dict) -> str:
    """docs/area.md's reference units (dates and load stay in the results file)."""
    stamps = [s for r in results["rows"] for s in (r.get("iverilog"), r.get("yosys")) if s]
    lines = [
        f"Vectors: {results['setup']['vectors']} under Icarus; Yosys: the flow above, processor "
        f"seconds. Recorded at commit {', '.join(sorted({s['commit'] for s in stamps}))}.",
        "",
        "| unit | config, pair, K | vectors | mismatches | cells | transistors | depth | Yosys s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        sim, y = r.get("iverilog"), r.get("yosys")
        vectors = f"{sim['vectors']:,} | {sim['mismatches']}" if sim else "– | –"
        area = (
            f"{y['cells']:,} | {y['transistors']:,} | {y['depth']} | {y['cpu_seconds']:.0f}"
            if y
            else "– | – | – | –"
        )
        lines.append(
            f"| {r['what']} | {r['config']}, {' × '.join(r['pair'])}, {r['k']} | {vectors} | {area} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000, help="random vectors per unit")
    parser.add_argument(
        "--step",
        action="append",
        choices=["iverilog", "verilator", "yosys", "yosys_hierarchical"],
        help="steps to run (repeatable; default iverilog, verilator, yosys; yosys_hierarchical: "
        "each module mapped on its own, then flattened, for a unit whose flat synthesis takes "
        "too long)",
    )
    parser.add_argument("--only", action="append", help="configs whose name contains this")
    parser.add_argument(
        "--skip", action="append", help="leave out configs whose name contains this"
    )
    parser.add_argument("--list", action="store_true", help="print the units and exit")
    parser.add_argument(
        "--reference", action="store_true", help="the reference units (REFERENCES) instead"
    )
    parser.add_argument("--record", help="results JSON, rewritten after every step")
    args = parser.parse_args()
    args.step = args.step or ["iverilog", "verilator", "yosys"]
    if args.list:
        for entry in mx_units(args.only, args.skip):
            print(json.dumps(entry))
        return 0
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
