"""Running a sweep: every grid point replays the trace under its config; resumable.

Each point is one task (in-process, or on a Dask cluster through :mod:`mxsim.parallel`)
that calls :func:`mxsim.replay.run.replay` with the point's config, plus end-to-end accuracy
when the trace's network has labels. A finished point is written at once, atomically, to
``OUT/points/<key>.json``, where ``key`` hashes the resolved config (every schema value,
the overrides, the array), the trace's contents, the element format and the mxsim version;
a rerun finds these files and skips their points. Failed points are reported with their error
and written nowhere, so a rerun retries them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..datapath import HardwareConfig
from ..fileio import NONFINITE_JSON, check_output_directory, json_text, write_atomic
from ..parallel import InProcess, Task
from ..trace import Trace
from ..replay import replay
from ..replay.run import check_replay
from .area import add_area, plan_units
from .cost import hardware_cost
from .grid import Knob, grid_configs, point_label

POINT_FORMAT = 1


def trace_digest(trace: Trace) -> str:
    """SHA-256 over everything replay reads from a trace: layers (name, op, attrs, quant
    specs, tensors' dtype, shape and bytes), dataset arrays and network recipe."""
    digest = hashlib.sha256()

    def add(text: str) -> None:
        digest.update(text.encode())
        digest.update(b"\0")

    def add_array(name: str, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        add(f"{name} {array.dtype.str} {array.shape}")
        digest.update(array.tobytes())

    add(trace.name)
    for layer in trace.layers:
        add(
            f"{layer.name} {layer.op} {json.dumps(layer.attrs, sort_keys=True, default=str)} {layer.quant!r}"
        )
        for name in sorted(layer.tensors):
            if layer.tensors[name] is not None:
                add_array(name, layer.tensors[name])
    for name in sorted(trace.dataset or {}):
        add_array(name, trace.dataset[name])
    add(repr(trace.network))
    return digest.hexdigest()


def resolved_config(config: HardwareConfig) -> dict:
    """Every value the unit runs with, as plain data (the name and description excluded)."""

    def plain(values: dict) -> dict:
        return {f"{section}.{key}": value for (section, key), value in sorted(values.items())}

    return {
        "sections": plain(config.sections),
        "overrides": [
            [dict(sorted(selectors.items())), plain(changes)]
            for selectors, changes in config.overrides
        ],
        "array": None if config.array is None else dataclasses.asdict(config.array),
    }


def point_key(config: HardwareConfig, digest_of_trace: str, element_format: str | None) -> str:
    payload = {
        "point_format": POINT_FORMAT,
        "mxsim": __version__,
        "trace": digest_of_trace,
        "element_format": element_format,
        "config": resolved_config(config),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=list).encode()).hexdigest()[
        :24
    ]


def has_labels(trace: Trace) -> bool:
    return trace.network is not None and trace.network.labels is not None


def bits_digest(results) -> str:
    """SHA-256 of every output bit of a unit's layer results, in layer order."""
    digest = hashlib.sha256()
    for result in results:
        digest.update(f"{result.layer} {result.bits.dtype.str} {result.bits.shape}".encode())
        digest.update(np.ascontiguousarray(result.bits).tobytes())
    return digest.hexdigest()


def point_metrics(report: dict) -> dict:
    """A one-unit replay report reduced to the sweep's per-point numbers: its layer results
    (without timings), the error vs the ideal MX result and vs float, end-to-end accuracy and
    a digest of every output bit."""
    (name,) = report["units"]
    results = report["_results"][name]
    totals = report["totals"][name]
    metrics = {
        "worst_layer_sqnr_vs_ideal_db": min(r.sqnr_vs_ideal_db for r in results),
        "max_rel_rms_error_vs_ideal": totals["max_rel_rms_error_vs_ideal"],
        "max_error_vs_ideal_ulps": max(r.max_error_vs_ideal_ulps for r in results),
        "worst_layer_sqnr_vs_float_db": totals["worst_layer_sqnr_vs_float_db"],
        "max_abs_error_vs_float": totals["max_abs_error_vs_float"],
        "accuracy": None,
        "float_accuracy": None,
    }
    if report["end_to_end"]:
        metrics["accuracy"] = report["end_to_end"]["accuracy"][name]
        metrics["float_accuracy"] = report["end_to_end"]["float_accuracy"]
    layers = []
    for entry in report["layers"]:
        layer = dict(entry["results"][0])
        layer.pop("seconds")
        layers.append(layer)
    return {"metrics": metrics, "layers": layers, "bits_sha256": bits_digest(results)}


def replay_point(trace: Trace, config: HardwareConfig, element_format: str | None = None) -> dict:
    """One sweep point (a task): the trace replayed through ``config`` alone, in this process."""
    report = replay(trace, [config], end_to_end=has_labels(trace), element_format=element_format)
    return point_metrics(report)


def to_json(data: Any) -> str:
    """Standard JSON (an exact point's SQNR, +inf, is written as the string "inf"; see
    :func:`mxsim.fileio.json_ready`)."""
    return json_text(data, indent=2)


def _is_metric(key: str) -> bool:
    return key.endswith(("_db", "_ulps", "_rms", "_fraction", "accuracy")) or key.startswith(
        ("max_", "mean_", "rel_")
    )


def _restore_floats(value, key: str = ""):
    """A stored record's numbers as floats again: the strings "inf", "-inf", "nan" that
    :func:`to_json` writes for non-finite metrics (only under metric keys: names stay strings)."""
    if isinstance(value, dict):
        return {k: _restore_floats(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore_floats(v, key) for v in value]
    if isinstance(value, str) and value in NONFINITE_JSON and _is_metric(key):
        return NONFINITE_JSON[value]
    return value


def _read_point(path: Path, key: str) -> dict | None:
    """A stored point, or None if absent or not a point of this key (it is then recomputed)."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (ValueError, OSError):
        return None
    if not (isinstance(record, dict) and record.get("key") == key and "result" in record):
        return None
    return _restore_floats(record)


#: What a sweep's output directory holds (docs/sweep.md).
OUTPUT_NAMES = ("points", "sweep.json", "sweep.csv", "plots")


def is_sweep_output(directory: Path) -> bool:
    """Whether ``directory`` holds an earlier sweep's output and nothing else (hidden files aside)."""
    names = [path.name for path in directory.iterdir() if not path.name.startswith(".")]
    return bool(names) and set(names) <= set(OUTPUT_NAMES) and (directory / "points").is_dir()


def cost_bits(record: dict) -> int:
    return record["cost"]["cost_bits"]


def area_transistors(record: dict) -> int:
    return record["area"]["transistors"]


def pareto_front(records: list[dict], cost=cost_bits) -> list[int]:
    """Indexes of the finished points no other point beats on both cost (fewer bits of the
    proxy, or ``cost(record)``) and error (higher worst-layer SQNR vs ideal): the Pareto
    front, cheapest first."""
    finished = [
        (cost(r), -r["result"]["metrics"]["worst_layer_sqnr_vs_ideal_db"], i)
        for i, r in enumerate(records)
        if r.get("result")
    ]
    front = []
    best = math.inf
    for cost, error, index in sorted(finished):
        if error < best:
            front.append(index)
            best = error
    return front


def run_sweep(
    trace: Trace,
    base: HardwareConfig,
    knobs: list[Knob],
    out: str | Path,
    runner=None,
    element_format: str | None = None,
    progress: bool = False,
    area: bool = False,
    area_k: int | None = None,
    report=None,
) -> dict:
    """Run (or resume) the sweep of ``base`` over ``knobs`` on ``trace``, storing each finished
    point under ``out/points``; the summary lists every point in grid order with its values,
    cost, metrics (or error), whether it was resumed, and the Pareto front. With ``area``,
    each point's unit (K = ``area_k`` elements) is also synthesized (:mod:`.area`; ``report``
    gets its progress lines): ``area`` in each record and ``pareto_area``, the front against
    transistors."""
    points = grid_configs(base, knobs)  # validates everything before any work
    for (
        _,
        config,
    ) in (
        points
    ):  # what replay would refuse at every point (a format a unit does not take) is refused now
        check_replay(trace, [config], end_to_end=has_labels(trace), element_format=element_format)
    units = (
        plan_units(points, element_format, area_k) if area else None
    )  # every point's RTL, before any replay
    out = check_output_directory(out, is_sweep_output, "sweep: out")
    store = out / "points"
    store.mkdir(parents=True, exist_ok=True)
    digest = trace_digest(trace)
    records, todo = [], {}
    for point, config in points:
        key = point_key(config, digest, element_format)
        stored = _read_point(store / f"{key}.json", key)
        if stored is not None:
            records.append(dict(stored, resumed=True))
            continue
        record = {
            "key": key,
            "point": point,
            "hw": config.name,
            "cost": hardware_cost(config),
            "result": None,
        }
        records.append(record)
        todo[point_label(point)] = (record, config)
    runner = runner or InProcess()
    shared = runner.share(trace) if todo else None

    def store_point(label: str, result: dict) -> None:
        record = todo[label][0]
        record["result"] = result
        write_atomic(store / f"{record['key']}.json", to_json(record))

    tasks = [
        Task(label, replay_point, (shared, config, element_format))
        for label, (_, config) in todo.items()
    ]
    _, failures = runner.run(tasks, on_result=store_point, progress=progress, unit="point")
    for failure in failures:
        todo[failure.key][0]["error"] = failure.message
        todo[failure.key][0]["traceback"] = failure.traceback
    for record in records:
        record.setdefault("resumed", False)
    summary = {
        "trace": trace.name,
        "base": base.name,
        "base_digest": base.digest,
        "element_format": element_format,
        "knobs": [{"key_path": k.key_path, "values": list(k.values)} for k in knobs],
        "points": records,
        "pareto": pareto_front(records),
        "failed": len(failures),
        "resumed": sum(r["resumed"] for r in records),
    }
    if units is not None:
        add_area(records, units, report)
        summary["pareto_area"] = pareto_front(records, area_transistors)
    return summary
