"""Sweep outputs: the terminal table, ``sweep.json``, ``sweep.csv`` and PNG plots.

The output directory is replaced as a whole (see :func:`write_outputs`). The JSON is the summary of
:func:`mxsim.sweep.run.run_sweep` (every point with its values, cost terms, metrics, layer
results and bit digest, or its error); the CSV has one row per point; the plots (with
matplotlib, the ``plots`` extra) show the worst-layer SQNR vs the ideal MX result (and
accuracy, when the trace has labels) against each knob, and the Pareto front of that error
against ``cost_bits``.
"""

from __future__ import annotations

import csv
import io
import math
import os
import shutil
from pathlib import Path

from ..fileio import check_output_directory, staged_directory, write_atomic
from .grid import point_label
from .run import is_sweep_output, to_json

METRICS = (
    "worst_layer_sqnr_vs_ideal_db",
    "max_rel_rms_error_vs_ideal",
    "max_error_vs_ideal_ulps",
    "worst_layer_sqnr_vs_float_db",
    "max_abs_error_vs_float",
    "accuracy",
    "float_accuracy",
)
COST_TERMS = (
    "cost_bits",
    "tree_bits",
    "adder_width_bits",
    "window_bits",
    "accumulator_bits",
    "product_range_bits",
)


def _cell(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def format_table(summary: dict) -> str:
    """One line per point: knob values, cost, errors vs ideal and float, accuracy, Pareto mark."""
    paths = [knob["key_path"] for knob in summary["knobs"]]
    accuracy = any(
        r.get("result") and r["result"]["metrics"]["accuracy"] is not None
        for r in summary["points"]
    )
    area = "pareto_area" in summary
    header = (
        [*paths, "cost bits"]
        + (["area (transistors)", "depth"] if area else [])
        + ["SQNR/ideal dB", "rel RMS/ideal", "SQNR/float dB"]
        + (["accuracy"] if accuracy else [])
        + ["pareto"]
        + (["pareto/area"] if area else [])
    )
    rows = []
    for index, record in enumerate(summary["points"]):
        row = [_cell(record["point"][path]) for path in paths] + [str(record["cost"]["cost_bits"])]
        row += [str(record["area"]["transistors"]), str(record["area"]["depth"])] if area else []
        if record.get("result"):
            m = record["result"]["metrics"]
            row += [
                f"{m['worst_layer_sqnr_vs_ideal_db']:.2f}",
                f"{m['max_rel_rms_error_vs_ideal']:.3g}",
                f"{m['worst_layer_sqnr_vs_float_db']:.2f}",
            ]
            row += [f"{100 * m['accuracy']:.2f}%"] if accuracy else []
            row.append("*" if index in summary["pareto"] else "")
            row += ["*" if index in summary["pareto_area"] else ""] if area else []
        else:
            row += ["failed: " + record.get("error", "")]
        rows.append(row)
    complete = [row for row in rows if len(row) == len(header)]
    widths = [max(len(cell) for cell in column) for column in zip(header, *complete)]
    lines = [
        f"sweep of {summary['base']} on trace {summary['trace']}: {len(rows)} points "
        f"({summary['resumed']} resumed, {summary['failed']} failed)",
        "  ".join(h.rjust(w) for h, w in zip(header, widths)),
    ]
    lines.append("-" * len(lines[-1]))
    for row in rows:  # a failed point's message runs past the metric columns
        lines.append(
            "  ".join(cell.rjust(w) for cell, w in zip(row, widths))
            if len(row) == len(header)
            else "  ".join([*(c.rjust(w) for c, w in zip(row[:-1], widths)), row[-1]])
        )
    if accuracy:
        first = next(r for r in summary["points"] if r.get("result"))
        lines.append(f"float accuracy {100 * first['result']['metrics']['float_accuracy']:.2f}%")
    return "\n".join(lines)


def csv_text(summary: dict) -> str:
    paths = [knob["key_path"] for knob in summary["knobs"]]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    area = "pareto_area" in summary
    writer.writerow(
        ["point", *paths, *COST_TERMS, *METRICS, "bits_sha256", "pareto", "error"]
        + (["area_cells", "area_transistors", "depth", "pareto_area"] if area else [])
    )
    for index, record in enumerate(summary["points"]):
        result = record.get("result")
        metrics = [_cell(result["metrics"][m]) for m in METRICS] if result else [""] * len(METRICS)
        writer.writerow(
            [
                point_label(record["point"]),
                *(_cell(record["point"][p]) for p in paths),
                *(record["cost"][t] for t in COST_TERMS),
                *metrics,
                result["bits_sha256"] if result else "",
                int(index in summary["pareto"]),
                record.get("error", ""),
            ]
            + (
                [
                    *(record["area"][t] for t in ("cells", "transistors", "depth")),
                    int(index in summary["pareto_area"]),
                ]
                if area
                else []
            )
        )
    return buffer.getvalue()


def write_outputs(summary: dict, out: str | Path, plots: bool = False) -> list[str]:
    """``out/sweep.json``, ``out/sweep.csv`` and, with ``plots``, ``out/plots/*.png`` (needs
    matplotlib: ImportError before anything is written); returns their paths.

    The whole output is replaced in one step: the stored points (``out/points``, linked, not
    copied), the summary files and the plots are written into a fresh directory beside ``out``
    that then takes its place (:func:`mxsim.fileio.staged_directory`), so a reader or a kill
    finds the old complete output or the new one, never a summary of one run beside the
    table of another."""
    if plots:
        import matplotlib  # noqa: F401 - refused before anything is written

    out = check_output_directory(out, is_sweep_output, "sweep: out")
    names = ["sweep.json", "sweep.csv"]
    with staged_directory(out) as staging:
        _link_points(out / "points", staging / "points")
        for name, text in (("sweep.json", to_json(summary)), ("sweep.csv", csv_text(summary))):
            write_atomic(staging / name, text)
        if plots:
            names += [
                str(Path(path).relative_to(staging)) for path in write_plots(summary, staging)
            ]
    return [str(out / name) for name in names]


def _link_points(source: Path, target: Path) -> None:
    """Every stored point of ``source`` in ``target`` (hard links where the file system has
    them; a point file is never rewritten in place, so a link is as good as a copy)."""
    target.mkdir()
    if not source.is_dir():
        return
    for path in source.iterdir():
        if path.name.startswith(".") or not path.is_file():
            continue  # a temporary left by a killed writer
        try:
            os.link(path, target / path.name)
        except OSError:
            shutil.copy2(path, target / path.name)


def _save(figure, path: Path) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    write_atomic(path, buffer.getvalue())
    return str(path)


def _finite_sqnr(values: list[float]) -> tuple[list[float], float | None]:
    """SQNRs with +inf (exact outputs) drawn 10 dB above the largest finite one."""
    finite = [v for v in values if math.isfinite(v)]
    ceiling = (max(finite) if finite else 0.0) + 10.0
    return [v if math.isfinite(v) else ceiling for v in values], ceiling if len(finite) < len(
        values
    ) else None


def write_plots(summary: dict, out: str | Path) -> list[str]:
    """PNG plots in ``out/plots``: error (and accuracy) vs each knob, Pareto front of error vs
    cost. Needs matplotlib (raises ImportError without it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(out) / "plots"
    directory.mkdir(parents=True, exist_ok=True)
    done = [r for r in summary["points"] if r.get("result")]
    if not done:
        return []
    sqnr, exact_at = _finite_sqnr(
        [r["result"]["metrics"]["worst_layer_sqnr_vs_ideal_db"] for r in done]
    )
    accuracy = [r["result"]["metrics"]["accuracy"] for r in done]
    paths = [knob["key_path"] for knob in summary["knobs"]]
    written = []
    for knob in summary["knobs"]:
        path = knob["key_path"]
        positions = {_cell(v): i for i, v in enumerate(knob["values"])}
        others = [p for p in paths if p != path]
        series: dict[str, list[tuple[int, float, float | None]]] = {}
        for record, s, a in zip(done, sqnr, accuracy):
            label = point_label({p: record["point"][p] for p in others}) or "all"
            series.setdefault(label, []).append((positions[_cell(record["point"][path])], s, a))
        panels = 2 if accuracy[0] is not None else 1
        figure, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
        for label, items in series.items():
            items.sort()
            x = [i[0] for i in items]
            axes[0][0].plot(x, [i[1] for i in items], marker="o", label=label)
            if panels == 2:
                axes[0][1].plot(x, [100 * i[2] for i in items], marker="o", label=label)
        for axis, ylabel in zip(axes[0], ["worst-layer SQNR vs ideal MX (dB)", "accuracy (%)"]):
            axis.set_xticks(
                range(len(positions)), list(positions), rotation=45 if len(positions) > 12 else 0
            )
            axis.set_xlabel(path)
            axis.set_ylabel(ylabel)
            axis.grid(alpha=0.3)
        if exact_at is not None:
            axes[0][0].axhline(exact_at, color="gray", linestyle=":", label="exact (inf dB)")
        if 1 < len(series) <= 12 or exact_at is not None:
            axes[0][0].legend(fontsize=7)
        figure.suptitle(f"{summary['base']} on {summary['trace']}: error vs {path}")
        figure.tight_layout()
        written.append(_save(figure, directory / f"error-vs-{path}.png"))
        plt.close(figure)
    fronts = [("pareto", "cost_bits", "cost proxy (bits, docs/sweep.md)", "cost")]
    if "pareto_area" in summary:
        fronts.append(
            ("pareto_area", "transistors", "area (transistors after Yosys, docs/area.md)", "area")
        )
    index_of = {id(r): i for i, r in enumerate(done)}
    for key, term, xlabel, name in fronts:
        figure, axis = plt.subplots(figsize=(6, 4))
        cost = [r["cost"][term] if key == "pareto" else r["area"][term] for r in done]
        axis.scatter(cost, sqnr, color="tab:gray", label="points")
        front = [index_of[id(summary["points"][i])] for i in summary[key]]
        axis.step(
            [cost[i] for i in front],
            [sqnr[i] for i in front],
            where="post",
            color="tab:red",
            marker="o",
            label="Pareto front",
        )
        axis.set_xlabel(xlabel)
        axis.set_ylabel("worst-layer SQNR vs ideal MX (dB)")
        axis.set_title(f"{summary['base']} on {summary['trace']}: error vs {name}")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
        figure.tight_layout()
        written.append(_save(figure, directory / f"{key.replace('_', '-')}.png"))
        plt.close(figure)
    return written
