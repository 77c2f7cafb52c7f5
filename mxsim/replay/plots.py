"""PNG plots of a replay report (needs matplotlib): SQNR of every layer on every unit, and
per layer the distribution of its errors vs the ideal."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import MxsimError
from ..fileio import safe_file_stem, safe_output_path


def _save(figure, path: Path) -> None:
    temporary = path.with_name(path.name + ".tmp")
    figure.savefig(temporary, format="png")
    temporary.replace(path)


def plot_ceiling(values) -> float:
    """Where the overview draws infinite SQNRs (no error): 10 dB above the largest finite value
    of every unit's rows (200 dB when none is finite)."""
    finite = [v for v in values if math.isfinite(v)]
    return max(finite) + 10 if finite else 200.0


def write_plots(report: dict, directory) -> list[str]:
    """PNG plots (needs matplotlib): ``overview.png`` (SQNR vs float and vs ideal of every layer
    on every unit) and per layer ``NNN-<layer>.png`` (histograms of |error vs ideal| relative to
    the layer's RMS output, one per unit, log axes). File names come from sanitised names and
    are checked to lie inside ``directory``; each file is written atomically."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MxsimError("--plots needs matplotlib: pip install 'mxsim[plots]'") from None
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    results = report["_results"]
    layers = [entry["layer"] for entry in report["layers"]]
    written = []
    figure, axes = plt.subplots(2, 1, figsize=(max(6, 0.35 * len(layers) + 3), 7), sharex=True)
    for axis, key in zip(axes, ("sqnr_vs_float_db", "sqnr_vs_ideal_db")):
        # one ceiling for every unit: an identical row (inf dB) is drawn above every finite one
        ceiling = plot_ceiling([getattr(r, key) for rows in results.values() for r in rows])
        for name, rows in results.items():
            values = [min(getattr(r, key), ceiling) for r in rows]
            axis.plot(range(len(rows)), values, marker="o", label=name)
    axes[0].set_ylabel("SQNR vs float (dB)")
    axes[1].set_ylabel("SQNR vs ideal (dB)\n(identical: plotted at the top)")
    axes[1].set_xticks(range(len(layers)))
    axes[1].set_xticklabels(
        [f"{i}: {n[-40:]}" for i, n in enumerate(layers)], rotation=90, fontsize=7
    )
    axes[0].legend(fontsize=8)
    axes[0].set_title(f"{report['trace']}: every layer on every unit")
    figure.tight_layout()
    path = safe_output_path(directory, "overview", ".png")
    _save(figure, path)
    plt.close(figure)
    written.append(str(path))
    for index, layer in enumerate(layers):
        figure, axis = plt.subplots(figsize=(6, 3.5))
        plotted = False
        for name, rows in results.items():
            errors = np.abs(rows[index].errors_vs_ideal)
            scale = rows[index].ideal_rms
            relative = errors[errors > 0] / scale if scale > 0 else np.zeros(0)
            exact = int(np.sum(errors == 0))
            if relative.size:
                bins = np.logspace(np.log10(relative.min()), np.log10(relative.max()) + 1e-9, 40)
                axis.hist(relative, bins=bins, histtype="step", label=f"{name} ({exact} exact)")
                plotted = True
            else:
                axis.plot([], [], label=f"{name}: all {exact} outputs equal the ideal")
        if plotted:  # log axes need data
            axis.set_xscale("log")
            axis.set_yscale("log")
        axis.set_xlabel("|output - ideal| / RMS(ideal output)")
        axis.set_ylabel("outputs")
        axis.set_title(f"{layer}"[-70:], fontsize=8)
        axis.legend(fontsize=7)
        figure.tight_layout()
        path = safe_output_path(
            directory, f"{index:03d}-{safe_file_stem(layer, default='layer')}", ".png"
        )
        _save(figure, path)
        plt.close(figure)
        written.append(str(path))
    return written
