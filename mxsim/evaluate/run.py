"""From a model directory to a verdict: the model in float and with each unit x format in the loop.

:func:`evaluate_hf` checks the whole request first (task, formats, every unit taking every
format, extras, inputs, the model directory, labels), then runs the model in float32 and once
per unit x format under :func:`mxsim.inloop.torch_unit`, and compares each run with the float
one by the task's metrics (:mod:`.metrics`). A run that fails keeps its row (with the error)
and the other runs go on: no finished work is lost.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from .._optional import require
from ..datapath import HardwareConfig, load_hwconfig
from ..errors import ArgumentError, MxsimError
from ..formats import get_format
from ..inloop import torch_unit
from ..inloop.torch import check_scaling
from ..limits import check_int, shown
from ..parallel import progress_bar
from . import metrics
from . import quantizers as library_quantizers
from .models import (
    check_model_dir,
    check_task,
    library_error,
    load_hf,
    read_inputs,
    read_pooling,
    tokenize,
)

#: Most inputs of an embedding evaluation (its order agreement compares every triple).
MAX_EMBEDDING_INPUTS = 512
#: The metrics each task's table shows, in order: (key, column heading, decimals).
COLUMNS = {
    "embedding": (
        ("cosine_min", "cos min", 6),
        ("cosine_mean", "cos mean", 6),
        ("neighbour_agreement", "nn agree", 4),
        ("order_agreement", "order agree", 4),
        ("spearman_mean", "spearman", 4),
    ),
    "causal-lm": (("perplexity", "perplexity", 4), ("top1_agreement", "top-1 agree", 4)),
    "classification": (
        ("accuracy", "accuracy", 4),
        ("top1_agreement", "top-1 agree", 4),
        ("logit_max_abs_diff", "max |dlogit|", 6),
    ),
}


def check_units_take(
    units: list[HardwareConfig], formats: list[str], scaling: str = "auto"
) -> None:
    """Every unit takes every format for both operands, and block scales if ``scaling`` is
    ``"block"``; else one error naming the unit and what it takes."""
    check_scaling(scaling)
    for hw in units:
        if scaling == "block" and hw.sections[("inputs", "scales")] == "none":
            raise ArgumentError(
                f"unit {hw.name} has no block scales; its operands take scaling auto or tensor"
            )
        for fmt in formats:
            if fmt not in hw.a_formats or fmt not in hw.b_formats:
                takes = sorted(set(hw.a_formats) & set(hw.b_formats), key=hw.a_formats.index)
                raise ArgumentError(
                    f"unit {hw.name} does not take {fmt} for both operands; it takes "
                    f"{', '.join(takes)}"
                )


def _labels(model, labels: list) -> np.ndarray | None:
    """Label strings -> class indices: ASCII digits (a class index, no sign), or a name of the
    config's ``id2label``; anything else is refused, echoed cut short."""
    if labels[0] is None:
        return None
    names = {str(name): int(index) for index, name in (model.config.id2label or {}).items()}
    classes = int(model.config.num_labels)
    out = []
    for label in labels:
        label = label.strip()
        index = int(label) if label.isascii() and label.isdigit() else names.get(label)
        if index is None or not 0 <= index < classes:
            listed = ", ".join(
                name if len(name) <= 20 else name[:17] + "..." for name in list(names)[:8]
            ) + (f", ... ({len(names)} names)" if len(names) > 8 else "")
            raise ArgumentError(
                f"inputs: label {shown(label)} is neither a class index 0..{classes - 1} nor one of "
                f"{listed or 'the config id2label names (none)'}"
            )
        out.append(index)
    return np.asarray(out)


def _forward(torch, model, task: str, batches: list[dict], pooling: str | None, tick):
    """The task's per-input result of ``model`` over ``batches`` (see :mod:`.metrics`)."""
    parts = []
    with torch.no_grad():
        for batch in batches:
            output = model(**batch)
            mask = batch["attention_mask"].numpy()
            if task != "embedding" and getattr(output, "logits", None) is None:
                raise MxsimError(
                    f"the {task} model's output has no logits ({type(output).__name__})"
                )
            if task == "embedding":
                parts.append(metrics.pool(output[0].float().numpy(), mask, pooling))
            elif task == "causal-lm":
                parts.append(
                    metrics.next_token_results(
                        output.logits.float().numpy(), batch["input_ids"].numpy(), mask
                    )
                )
            else:
                parts.append(output.logits.float().numpy().astype(np.float64))
            tick()
    if task == "causal-lm":
        return tuple(np.concatenate(arrays) for arrays in zip(*parts))
    return np.concatenate(parts)


def _task_metrics(task: str, reference, result, labels) -> dict:
    if task == "embedding":
        return metrics.embedding_metrics(reference, result)
    if task == "causal-lm":
        return metrics.causal_lm_metrics(reference, result)
    return metrics.classification_metrics(reference, result, labels)


class _Progress:
    """A bar (tqdm, when stderr is a terminal) or one log line per finished run."""

    def __init__(self, total_batches: int, enabled: bool):
        self.enabled = enabled
        self.bar = progress_bar(total_batches, "batch", enabled and sys.stderr.isatty())

    def tick(self):
        if self.bar is not None:
            self.bar.update(1)

    def log(self, message: str):
        if self.enabled and self.bar is None:
            print(f"mxsim evaluate: {message}", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def evaluate_hf(
    model_dir,
    hw,
    formats,
    task: str,
    inputs,
    *,
    max_length: int = 128,
    batch_size: int = 32,
    scaling: str = "auto",
    progress: bool = False,
    quantizer: str | None = None,
) -> dict:
    """Run the Hugging Face model in ``model_dir`` in float32 and with every matmul on each unit
    of ``hw`` in each element format of ``formats``; compare each run with the float one. With
    ``quantizer``, the library quantizes the model and the units compute with its operands.

    Args:
        model_dir: a directory ``from_pretrained`` loads (config, weights, tokenizer), read
            offline with the task's auto class: ``embedding`` (``AutoModel``; sentence
            embeddings pooled as the directory's sentence-transformers ``1_Pooling`` config
            says, mean pooling without one), ``causal-lm`` (``AutoModelForCausalLM``) or
            ``classification`` (``AutoModelForSequenceClassification``).
        hw: a unit or a list of units (:class:`HardwareConfig` or config paths).
        formats: an element format or a list; each unit must take each one for both operands.
        inputs: a UTF-8 text file, or a list of its lines: one input per non-blank line; for
            classification optionally ``LABEL<TAB>text`` on every line (LABEL: a class index or
            an ``id2label`` name).
        max_length: tokens per input (longer inputs are truncated); batch_size: inputs per forward.
        scaling: as for :func:`mxsim.inloop.torch_unit`.
        progress: a progress bar on stderr (a log line per run when stderr is not a terminal).
        quantizer: ``LIBRARY:SPEC`` (:data:`.quantizers.QUANTIZERS`, e.g. ``quark:mxfp8_e4m3``,
            ``torchao:mxfp4``) instead of ``formats`` (None or empty): after the float run
            the library quantizes the model in place (:func:`.quantizers.quantize_model`), the
            quantized model runs as the library computes it (its fake quantization: the
            ``library`` entry of the report), then once per unit with the layers the library
            quantized computed on the unit from the model's own quantized operands, and every
            other matmul (attention's) in torch as the library's model computes it
            (:func:`mxsim.inloop.torch_unit` with ``quantized_only``). Each unit must take the
            spec's element format for both operands with block scales; ``scaling`` must be
            ``"auto"``.

    Returns the report: ``model``, ``task``, ``inputs``, ``tokens``, ``pooling`` (embedding),
    ``float`` (the float run's perplexity or accuracy), and ``runs``: per unit x format the
    metrics of :mod:`.metrics`, ``seconds``, ``layers`` (matmuls computed on the unit per
    forward pass), ``skipped`` (matmul-like ops left to torch), or ``error``. With a
    quantizer: ``quantizer``, ``library`` (the library's run: ``library`` name and version,
    ``layers`` it quantized, its metrics against float, ``seconds``), and per unit row also
    ``in_torch`` (matmuls per forward pass left to torch: none of their operands was
    quantized by the library), ``not_read`` (operands whose quantization mxsim could not read
    from the model: the unit quantized their values itself), ``layer_sqnr_min_db`` and
    ``layer_sqnr_min_layer`` (the worst layer: SQNR of the unit's output of a layer against the
    library's own output of it from the same operands, over every layer and forward pass:
    :attr:`mxsim.inloop.torch.UnitInLoop.library_sqnr_db`), ``vs_library`` (the task's
    metrics against the library's run instead of float) and ``library_sqnr_db`` (SQNR of the
    unit's per-input results against the library's: :func:`.metrics.result_sqnr_db`).
    """
    check_task(task)
    library = None if quantizer is None else library_quantizers.parse_quantizer(quantizer)
    units = [
        h if isinstance(h, HardwareConfig) else load_hwconfig(h)
        for h in (hw if isinstance(hw, (list, tuple)) else [hw])
    ]
    if formats is None or isinstance(formats, (list, tuple)):
        formats = [get_format(f).name for f in formats or ()]
    else:
        formats = [get_format(formats).name]
    if library is not None:
        if formats:
            raise ArgumentError(
                f"formats: a quantizer ({library.name}) gives the operands' formats; give formats "
                "or a quantizer, not both"
            )
        if scaling != "auto":
            raise ArgumentError(
                f"scaling: with a quantizer ({library.name}) the unit takes the library's block "
                f"scales; scaling must be auto, got {shown(scaling)}"
            )
        if not units:
            raise ArgumentError("evaluate: expected at least one unit")
        library_quantizers.check_units_take(library, units)
    elif not units or not formats:
        raise ArgumentError("evaluate: expected at least one unit and one format (or a quantizer)")
    else:
        check_units_take(units, formats, scaling)
    max_length = check_int(max_length, "max_length", 2, 1 << 16)
    batch_size = check_int(batch_size, "batch_size", 1, 1 << 16)
    path = check_model_dir(model_dir)
    pooling = read_pooling(path) if task == "embedding" else None
    given = read_inputs(inputs, task)
    if task == "embedding" and not 2 <= len(given.texts) <= MAX_EMBEDDING_INPUTS:
        raise ArgumentError(
            f"inputs: embedding evaluation compares every pair of inputs; give 2..{MAX_EMBEDDING_INPUTS}"
            f" inputs, not {len(given.texts)}"
        )
    torch = require("torch")
    if library is not None:
        library_quantizers.import_library(library)
    model, tokenizer = load_hf(path, task)
    labels = _labels(model, given.labels) if task == "classification" else None
    batches = [
        tokenize(tokenizer, given.texts[i : i + batch_size], max_length, model)
        for i in range(0, len(given.texts), batch_size)
    ]
    report = {
        "model": str(path),
        "task": task,
        "inputs": len(given.texts),
        "tokens": int(sum(int(b["attention_mask"].sum()) for b in batches)),
        "pooling": pooling,
        "float": {},
        "runs": [],
    }
    runs = [(unit, fmt) for unit in units for fmt in formats or [None]]
    bar = _Progress(len(batches) * (1 + (library is not None) + len(runs)), progress)
    try:
        start = time.perf_counter()
        try:
            reference = _forward(torch, model, task, batches, pooling, bar.tick)
        except MxsimError:
            raise
        except (
            Exception
        ) as error:  # the model directory's model failing on its inputs is a bad input
            raise MxsimError(
                f"{path}: the model failed on the inputs in float32: {library_error(error)}"
            ) from None
        report["float"]["seconds"] = time.perf_counter() - start
        if task == "causal-lm":
            report["float"]["perplexity"] = metrics.perplexity(reference[0])
            report["float"]["predicted_tokens"] = int(reference[0].size)
        elif task == "classification":
            report["float"]["accuracy"] = metrics.accuracy(reference, labels)
        bar.log(f"float run: {report['float']['seconds']:.1f} s")
        quantized = None
        if library is not None:
            model, quantized = _library_run(
                torch, library, model, path, task, batches, pooling, reference, labels, report, bar
            )
        for unit, fmt in runs:
            row = {"unit": unit.name, "format": library.name if library else fmt}
            start = time.perf_counter()
            try:
                with torch_unit(
                    model,
                    unit,
                    a_format=fmt,
                    scaling=scaling,
                    quantized_only=library is not None,
                ) as loop:
                    result = _forward(torch, model, task, batches, pooling, bar.tick)
                row["layers"] = len(loop.computed_layers) // len(batches)
                row["skipped"] = len(loop.skipped)
                row.update(_task_metrics(task, reference, result, labels))
                if library is not None:
                    row["in_torch"] = len(loop.in_torch) // len(batches)
                    row["not_read"] = sorted(loop.not_read)
                    name, worst = min(
                        loop.library_sqnr_db, key=lambda item: item[1], default=(None, None)
                    )
                    row["layer_sqnr_min_db"], row["layer_sqnr_min_layer"] = worst, name
                    row["vs_library"] = _task_metrics(task, quantized, result, labels)
                    row["library_sqnr_db"] = metrics.result_sqnr_db(quantized, result)
            except MxsimError as error:
                row["error"] = str(error)
            row["seconds"] = time.perf_counter() - start
            report["runs"].append(row)
            bar.log(
                f"{unit.name} {row['format']}: {row['seconds']:.1f} s"
                + (" (failed)" if "error" in row else "")
            )
    finally:
        bar.close()
    return report


def _library_run(
    torch, library, model, path, task, batches, pooling, reference, labels, report, bar
):
    """The library quantizes ``model`` and runs it: (the quantized model, its results);
    ``report["quantizer"]`` and ``report["library"]`` filled in. A library that cannot
    quantize the model, or whose model fails on the inputs, is one MxsimError."""
    start = time.perf_counter()
    model, layers = library_quantizers.quantize_model(library, model, str(path))
    entered = []  # the module that failed is named in the error
    hooks = [
        module.register_forward_pre_hook(lambda _m, _i, name=name: entered.append(name))
        for name, module in model.named_modules()
    ]
    try:
        quantized = _forward(torch, model, task, batches, pooling, bar.tick)
    except MxsimError:
        raise
    except Exception as error:  # the library's own model failing on the inputs
        raise MxsimError(
            f"{path}: the model quantized by {library.name} failed on the inputs in module "
            f"{(entered or ['<model>'])[-1] or '<model>'!r}: {library_error(error)}"
        ) from None
    finally:
        for hook in hooks:
            hook.remove()
    report["quantizer"] = library.name
    report["library"] = {
        "library": library_quantizers.library_version(library),
        "layers": layers,
        **_task_metrics(task, reference, quantized, labels),
        "seconds": time.perf_counter() - start,
    }
    bar.log(f"{library.name} (the library's model): {report['library']['seconds']:.1f} s")
    return model, quantized


def _cell(value, decimals: int = 4) -> str:
    return "-" if value is None else f"{value:.{decimals}f}"


def format_report(report: dict) -> str:
    """The report as a text table: one row per unit x format. With a quantizer, the library's
    own model is the first row (its unit column the library) and a column ``vs lib dB`` gives
    each unit's :func:`.metrics.result_sqnr_db` against it."""
    task = report["task"]
    lines = [
        f"{Path(report['model']).name}: {task}, {report['inputs']} inputs, {report['tokens']} tokens"
        + (f", {report['pooling']} pooling" if report.get("pooling") else "")
    ]
    float_figures = {
        k: v
        for k, v in report["float"].items()
        if k in ("perplexity", "accuracy") and v is not None
    }
    if float_figures:
        lines.append("float32: " + ", ".join(f"{k} {_cell(v)}" for k, v in float_figures.items()))
    library = report.get("library")
    columns = COLUMNS[task] + (
        (("layer_sqnr_min_db", "layer dB", 1), ("library_sqnr_db", "vs lib dB", 1))
        if library
        else ()
    )
    runs = list(report["runs"])
    if library:
        lines.append(
            f"quantizer {report['quantizer']} ({library['library']}): {library['layers']} layers "
            "quantized by the library; the units compute them from its quantized operands, "
            "other matmuls in torch"
        )
        runs.insert(
            0, {"unit": library["library"].split()[0], "format": report["quantizer"], **library}
        )
    header = ["unit", "format"] + [title for _, title, _ in columns] + ["layers", "seconds"]
    rows = [
        [run["unit"], run["format"]]
        + (
            [f"error: {run['error']}"]
            if "error" in run
            else [_cell(run.get(key), decimals) for key, _, decimals in columns]
            + [str(run["layers"]), f"{run['seconds']:.1f}"]
        )
        for run in runs
    ]
    widths = [
        max(len(row[i]) for row in [header] + rows if len(row) == len(header))
        for i in range(len(header))
    ]
    for row in [header] + rows:
        cells = [
            cell.ljust(width) if i < 2 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths))
        ]
        lines.append("  ".join(cells if len(row) == len(header) else cells[:2] + row[2:]).rstrip())
    for run in report["runs"]:
        if run.get("not_read"):
            lines.append(
                f"{run['unit']}: {len(run['not_read'])} operands quantized by the unit, not as the "
                f"library did (mxsim does not read their quantizer): {', '.join(run['not_read'][:4])}"
                + (", ..." if len(run["not_read"]) > 4 else "")
            )
    return "\n".join(lines)
