"""The replay report: the dict :func:`mxsim.replay.replay` returns (per layer and unit, totals,
the worst layers, bit agreement between units) and its terminal table (:func:`format_report`;
docs/replay.md explains every column)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..datapath import HardwareConfig
from ..trace.model import Trace
from ..trace.reference import REFERENCE_MODES
from .attribution import top_shares
from .choice import MARKS, STATUSES, has_float_scales
from .layer import LayerResult


def _clipped(first: int | None, second: int | None) -> int | None:
    """The sum of two operands' clip counts; None (unknown) when either is."""
    return None if first is None or second is None else first + second


def build_report(
    trace: Trace,
    units: Sequence[HardwareConfig],
    element_format: str | None,
    conv_order: str,
    done: dict,
    compiled_first: dict[str, float] | None = None,
) -> dict:
    """The report of the layers whose task finished (``done``: task key -> results).
    ``compiled_first``: seconds per unit name spent compiling its kernels before the tasks
    (:mod:`mxsim.replay.warmup`), added to the unit's compile seconds."""
    compiled_first = compiled_first or {}
    names = [hw.name for hw in units]
    finished = [layer for layer in trace.layers if f"layer {layer.name}" in done]
    results = {
        hw.name: [done[f"layer {layer.name}"][i] for layer in finished]
        for i, hw in enumerate(units)
    }
    report = {
        "trace": trace.name,
        "units": names,
        "element_format": element_format,
        "conv_order": conv_order,
        "layers": [],
        "totals": {},
        "worst": {},
        "agreement": [],
        "end_to_end": None,
        "legend": {MARKS[s]: s for s in STATUSES if MARKS[s]},
    }
    for index, layer in enumerate(finished):
        report["layers"].append(
            {
                "layer": layer.name,
                "op": layer.op,
                "reference": layer.reference,
                "results": [results[n][index].to_dict() for n in names],
            }
        )
    report["references"] = {
        mode: sum(layer.reference == mode for layer in finished)
        for mode in dict.fromkeys(layer.reference for layer in finished)
    }
    for name in names:
        rows = results[name]
        errors = np.concatenate([r.errors_vs_float for r in rows]) if rows else np.zeros(0)
        sqnrs = [r.sqnr_vs_float_db for r in rows]
        finite = [v for v in sqnrs if math.isfinite(v)]
        report["totals"][name] = {
            "macs": int(sum(r.macs for r in rows)),
            "seconds": float(sum(r.seconds for r in rows)),
            "compile_seconds": float(
                compiled_first.get(name, 0.0) + sum(r.compile_seconds for r in rows)
            ),
            "worst_layer_sqnr_vs_float_db": min(sqnrs, default=math.inf),
            "mean_layer_sqnr_vs_float_db": float(np.mean(finite)) if finite else math.inf,
            "median_layer_sqnr_vs_float_db": float(np.median(sqnrs)) if sqnrs else math.inf,
            "worst_layer_sqnr_vs_ideal_db": min(
                (r.sqnr_vs_ideal_db for r in rows), default=math.inf
            ),
            "max_abs_error_vs_float": float(np.max(np.abs(errors), initial=0.0)),
            "max_rel_rms_error_vs_ideal": max(
                (r.rel_rms_error_vs_ideal for r in rows), default=0.0
            ),
            "rows": {status: sum(r.status == status for r in rows) for status in STATUSES},
            "replaced": sorted(
                {
                    f"{c.spec} -> {_operand_label(c)}"
                    for r in rows
                    for c in (r.input, r.weight)
                    if c.status == "replaced"
                }
            ),
            "cycles": sum(r.cycles["total_cycles"] for r in rows)
            if all(r.cycles for r in rows) and rows
            else None,
        }
        report["worst"][name] = worst_layers(rows)
        for entry, row in zip(
            report["worst"][name], sorted(rows, key=lambda r: (r.sqnr_vs_float_db, r.layer))
        ):
            entry["output_channels"] = top_shares(row.channel_error_shares)
            entry["attribution"] = row.attribution
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            same = total = 0
            for a, b in zip(results[first], results[second]):
                if a.bits.dtype == b.bits.dtype:
                    same += int(np.sum(a.bits == b.bits))
                total += a.bits.size
            report["agreement"].append(
                {"units": [first, second], "bit_identical_fraction": same / total if total else 1.0}
            )
    report["_results"] = results
    return report


def worst_layers(rows: Sequence[LayerResult], count: int = 5) -> list[dict]:
    """The ``count`` rows with the lowest SQNR vs float, with what made them bad."""
    ranked = sorted(rows, key=lambda r: (r.sqnr_vs_float_db, r.layer))[:count]
    return [
        {
            "layer": r.layer,
            "sqnr_vs_float_db": r.sqnr_vs_float_db,
            "sqnr_vs_ideal_db": r.sqnr_vs_ideal_db,
            "saturated": _clipped(r.input.saturated, r.weight.saturated),
            "underflowed": _clipped(r.input.underflowed, r.weight.underflowed),
            "k": r.k,
            "operands": f"{_operand_label(r.input)} x {_operand_label(r.weight)}",
            "layout": r.input.layout
            if r.input.layout == r.weight.layout
            else f"{r.input.layout} / {r.weight.layout}",
            "status": r.status,
        }
        for r in ranked
    ]


def _operand_label(choice) -> str:
    """``int8/32`` (format/block; ``pt`` per-tensor scale, ``cast`` scale 1; float block
    scales named: ``fp4_e2m1/16/ue4m3/pt``), from a choice or its dict."""
    get = choice.get if isinstance(choice, dict) else lambda key: getattr(choice, key)
    # (a report written before NVFP4 units ran in replay carries no scale format)
    scale_format = (
        choice.get("scale_format", "e8m0") if isinstance(choice, dict) else choice.scale_format
    )
    if has_float_scales(scale_format):
        tensor_scale = "/pt" if get("per_tensor_scale") else ""
        return f"{get('format')}/{get('block_size')}/{scale_format}{tensor_scale}"
    if get("per_tensor_scale"):
        return f"{get('format')}/{'cast' if get('tensor_scale_exponent') == 0 else 'pt'}"
    return f"{get('format')}/{get('block_size')}"


def _shares(entries: list[dict], kind: str) -> str:
    return ", ".join(f"{kind} {e['index']} {100 * e['share']:.1f}%" for e in entries) or "none"


def _attribution_lines(worst: dict) -> list[str]:
    """Where a worst layer's error is (docs/replay.md, "Where the error is")."""
    if "output_channels" not in worst:
        return []
    lines = [f"error by output channel: {_shares(worst['output_channels'], 'channel')}"]
    found = worst["attribution"]
    if found is None:
        return lines + [
            "input columns and input vs weight: unknown (the trace keeps no float operands)"
        ]
    lines.append(
        f"product error by {found['column_kind']}: {_shares(found['input_columns'], found['column_kind'].split()[-1])}"
    )
    lines.append(
        f"SQNR were only the input quantized {_number(found['sqnr_input_only_db'])} dB, only the weight "
        f"{_number(found['sqnr_weight_only_db'])} dB"
    )
    return lines


def reference_line(references: dict) -> str:
    """Which float reference the SQNR vs float is measured against (docs/trace-format.md,
    "Reference outputs"): ``{mode: layers}``."""
    parts = []
    for mode, count in references.items():
        bits = REFERENCE_MODES.get(mode)
        what = (
            "exact"
            if bits is None
            else f"reconstructed within 2^-{bits} of the quantization error's RMS"
        )
        parts.append(f"{count} {mode} ({what})")
    return "float reference outputs: " + ("; ".join(parts) or "none")


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _number(value: float, digits: int = 2) -> str:
    return "inf" if value == math.inf else "-inf" if value == -math.inf else f"{value:.{digits}f}"


def format_report(report: dict) -> str:
    """The replay report as a terminal table (docs/replay.md explains every column)."""
    lines = [
        f"trace {report['trace']}: {len(report['layers'])} layers through {', '.join(report['units'])}"
        f" (conv K order {report.get('conv_order', 'kh_kw_c')})"
    ]
    name_width = max([len("layer")] + [len(entry["layer"]) for entry in report["layers"]])
    unit_width = max([len("unit")] + [len(u) for u in report["units"]])
    columns = [
        ("operands", 22),
        ("K", 6),
        ("SQNR/float", 10),
        ("SQNR/ideal", 10),
        ("relRMS/ideal", 12),
        ("ulps@rms", 9),
        ("sat", 6),
        ("uflow", 7),
        ("cycles", 10),
    ]
    header = f"  {'layer':{name_width}s}  {'unit':{unit_width}s}  " + " ".join(
        f"{c:>{w}s}" for c, w in columns
    )
    lines.append(reference_line(report.get("references", {})))
    lines += [header, "-" * len(header)]
    for entry in report["layers"]:
        for r in entry["results"]:
            cycles = r["cycles"]["total_cycles"] if r["cycles"] else "-"
            operands = f"{_operand_label(r['input'])} x {_operand_label(r['weight'])}"
            cells = [
                operands,
                str(r["k"]),
                _number(r["sqnr_vs_float_db"]),
                _number(r["sqnr_vs_ideal_db"]),
                f"{r['rel_rms_error_vs_ideal']:.2e}",
                f"{r['max_error_vs_ideal_ulps']:.3g}",
                _count(_clipped(r["input"]["saturated"], r["weight"]["saturated"])),
                _count(_clipped(r["input"]["underflowed"], r["weight"]["underflowed"])),
                str(cycles),
            ]
            mark = MARKS[r["status"]] or " "
            lines.append(
                f"{mark} {entry['layer']:{name_width}s}  {r['hw']:{unit_width}s}  "
                + " ".join(f"{cell:>{w}s}" for cell, (_, w) in zip(cells, columns))
            )
    lines.append("")
    lines.append(
        "legend: * the unit cannot take the model's recorded quantization: replay re-quantized the operand; "
        "+ the model multiplies this operand unquantized: replay quantized it; = format chosen by the caller. "
        "operands: format/block for input x weight (pt: per-tensor scale; a block scale format "
        "with a significand named after the block: NVFP4's ue4m3). ulps@rms: max |error vs ideal| "
        "in ulps of the unit's output format at the layer's RMS output. sat/uflow: operand elements clipped "
        "to the largest magnitude / flushed to zero. (docs/replay.md)"
    )
    marked = [
        f"{r['hw']}: {r['input']['note'] or r['weight']['note']}"
        for entry in report["layers"]
        for r in entry["results"]
        if r["status"] == "replaced"
    ]
    for note in dict.fromkeys(marked):
        lines.append(f"  * {note}")
    lines.append("")
    for name, total in report["totals"].items():
        cycles = f", {total['cycles']} cycles" if total["cycles"] is not None else ""
        compiling = (
            f" (+ {total['compile_seconds']:.1f} s compiling kernels)"
            if total["compile_seconds"]
            else ""
        )
        rows = ", ".join(f"{count} {status}" for status, count in total["rows"].items() if count)
        replaced = (
            f" (* re-quantized by replay: {'; '.join(total['replaced'])})"
            if total.get("replaced")
            else ""
        )
        lines.append(
            f"total {name}: {total['macs']} MACs in {total['seconds']:.2f} s{compiling}, layer SQNR vs float "
            f"worst {_number(total['worst_layer_sqnr_vs_float_db'])} / median "
            f"{_number(total['median_layer_sqnr_vs_float_db'])} / mean "
            f"{_number(total['mean_layer_sqnr_vs_float_db'])} dB, worst vs ideal "
            f"{_number(total['worst_layer_sqnr_vs_ideal_db'])} dB; rows: {rows}{replaced}{cycles}"
        )
    for name, worst in report.get("worst", {}).items():
        lines.append(f"worst layers on {name} (lowest SQNR vs float):")
        for w in worst:
            lines.append(
                f"  {w['layer']}: {_number(w['sqnr_vs_float_db'])} dB vs float, "
                f"{_number(w['sqnr_vs_ideal_db'])} dB vs ideal; {_count(w['saturated'])} saturated, "
                f"{_count(w['underflowed'])} underflowed to zero; K {w['k']}; {w['operands']}; {w['layout']}"
            )
            lines.extend(f"    {line}" for line in _attribution_lines(w))
    for pair in report["agreement"]:
        lines.append(
            f"bit-identical outputs {pair['units'][0]} vs {pair['units'][1]}: {100 * pair['bit_identical_fraction']:.2f}%"
        )
    for failure in report.get("failures", []):
        lines.append(f"FAILED {failure['task']}: {failure['error']}")
    if report["end_to_end"]:
        e2e = report["end_to_end"]
        if "perplexity" in e2e:
            lines.append(f"end to end: float perplexity {e2e['float_perplexity']:.4f}")
            lines += [
                f"  {name}: perplexity {value:.4f}" for name, value in e2e["perplexity"].items()
            ]
        else:
            lines.append(f"end to end: float accuracy {100 * e2e['float_accuracy']:.2f}%")
            for name, value in e2e["accuracy"].items():
                mark = (
                    " (* with re-quantized layers)"
                    if report["totals"][name]["rows"]["replaced"]
                    else ""
                )
                lines.append(f"  {name}: accuracy {100 * value:.2f}%{mark}")
    return "\n".join(lines)
