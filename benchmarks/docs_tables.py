"""docs/benchmarks.md's (and docs/area.md's) tables of current figures, generated from
``benchmarks/results/*.json``.

Each table sits between ``<!-- results: NAME -->`` and ``<!-- /results -->`` in
docs/benchmarks.md; NAME is a results file's stem (``guard``: bench_guard.py --record,
``matmul``/``matmul-fp4_e2m1``: bench_matmul.py --record). A script without ``--record``
has its run's figures written into a results file of the plain table form by hand: its
``command``, ``conditions`` (date, load average, cores, machine; commit, processor and
Numba's target where known), an
optional ``note`` on what the table shows, ``columns`` and ``rows`` of cells as the script
printed them. Earlier runs are kept in ``benchmarks/results/benchmark-runs.md``.
Run after recording: ``python benchmarks/docs_tables.py`` (rewrites the tables), ``--check``
(exit 1 when a table differs from its results file).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "benchmarks.md"
#: every document holding result tables; docs/area.md's rtl-area tables are rendered by
#: bench_rtl_area.py --render (they need the hardware configs' cost proxy), not here
DOCS = (DOC, REPO / "docs" / "area.md")
ELSEWHERE = {"rtl-area", "rtl-area-k32"}
#: results files with a table of their own shape: the script and its function that renders it
RENDERERS = {
    "rtl-configs": ("bench_rtl_configs", "table"),
    "rtl-reference": ("bench_rtl_configs", "reference_table"),
}
RESULTS = REPO / "benchmarks" / "results"
BLOCK = re.compile(r"(<!-- results: ([\w.-]+) -->\n)(.*?)(<!-- /results -->)", re.S)


def _recorded(name: str, results: dict) -> str:
    """Where the recorded run's conditions are: the machine (and its processor, where recorded)
    here, its commit, date and load in the results file (docs show the current figure, not a run log)."""
    c = results["conditions"]
    named = [c[key] for key in ("cpu", "numba_target") if c.get(key)]
    cpu = f" ({', '.join(named)})" if named else ""
    return (
        f"Measured on {c['cores']} cores, {c['machine']}{cpu}; the run's commit, date and load: "
        f"`benchmarks/results/{name}.json`."
    )


def table(name: str) -> str:
    """The markdown of results file ``name``."""
    results = json.loads((RESULTS / f"{name}.json").read_text())
    if name in RENDERERS:
        import importlib

        sys.path.insert(0, str(REPO / "benchmarks"))
        script, function = RENDERERS[name]
        return getattr(importlib.import_module(script), function)(results)
    if "columns" in results:  # the plain table of a script without --record
        note = f"{results['note']} " if results.get("note") else ""
        width = len(results["columns"])
        for row in results["rows"]:
            if len(row) != width:
                raise ValueError(
                    f"benchmarks/results/{name}.json: row {row!r} has {len(row)} cells, "
                    f"the columns {width}"
                )
        head = (
            f"`{results['command']}`. {note}{_recorded(name, results)}\n\n"
            f"| {' | '.join(results['columns'])} |\n|{'---|' * width}"
        )
        rows = [f"| {' | '.join(str(cell) for cell in row)} |" for row in results["rows"]]
    elif "ratios" in results:  # the short tier
        rows = [f"| {case} | {ratio:.3f}x |" for case, ratio in results["ratios"].items()]
        head = (
            f"{results['size']}³ GEMMs and batches of G × M × K × N, speed as a multiple of the same "
            f"run's numpy float64 matmul of the shape (best of 3 each). {_recorded(name, results)}"
            "\n\n| config, element format | vs numpy float64 |\n|---|---|"
        )
    else:
        rows = [
            f"| `{f['config']}` | {f['element']} | {f['route']} | {f['gmacs']:.2f} | {f['seconds']:.3f} s | "
            f"{f['ratio']:.3f}x |"
            for f in results["figures"]
        ]
        head = (
            f"{results['size']}³ GEMMs, best of N by {results['clock']} clock, every output bit exact. "
            f"{_recorded(name, results)}\n\n| config | elements | route | G MAC/s | time | vs DGEMM |\n"
            "|---|---|---|---|---|---|"
        )
    return head + "\n" + "\n".join(rows) + "\n"


def render(text: str) -> str:
    return BLOCK.sub(
        lambda m: (
            m.group(0) if m.group(2) in ELSEWHERE else m.group(1) + table(m.group(2)) + m.group(4)
        ),
        text,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a document's table is out of date"
    )
    args = parser.parse_args(argv)
    stale = False
    for doc in DOCS:
        text = doc.read_text()
        new = render(text)
        if new == text:
            continue
        stale = True
        if not args.check:
            from mxsim.fileio import write_atomic

            write_atomic(doc, new)
    if args.check and stale:
        print(
            "docs/benchmarks.md or docs/area.md differs from benchmarks/results: run python benchmarks/docs_tables.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
