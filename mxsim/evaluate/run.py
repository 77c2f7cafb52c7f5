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
) -> dict:
    """Run the Hugging Face model in ``model_dir`` in float32 and with every matmul on each unit
    of ``hw`` in each element format of ``formats``; compare each run with the float one.

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

    Returns the report: ``model``, ``task``, ``inputs``, ``tokens``, ``pooling`` (embedding),
    ``float`` (the float run's perplexity or accuracy), and ``runs``: per unit x format the
    metrics of :mod:`.metrics`, ``seconds``, ``layers`` (matmuls computed on the unit per
    forward pass), ``skipped`` (matmul-like ops left to torch), or ``error``.
    """
    check_task(task)
    units = [
        h if isinstance(h, HardwareConfig) else load_hwconfig(h)
        for h in (hw if isinstance(hw, (list, tuple)) else [hw])
    ]
    formats = [
        get_format(f).name for f in (formats if isinstance(formats, (list, tuple)) else [formats])
    ]
    if not units or not formats:
        raise ArgumentError("evaluate: expected at least one unit and one format")
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
    bar = _Progress(len(batches) * (1 + len(units) * len(formats)), progress)
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
        for unit in units:
            for fmt in formats:
                row = {"unit": unit.name, "format": fmt}
                start = time.perf_counter()
                try:
                    with torch_unit(model, unit, a_format=fmt, scaling=scaling) as loop:
                        result = _forward(torch, model, task, batches, pooling, bar.tick)
                    row["layers"] = len(loop.computed_layers) // len(batches)
                    row["skipped"] = len(loop.skipped)
                    row.update(
                        metrics.embedding_metrics(reference, result)
                        if task == "embedding"
                        else metrics.causal_lm_metrics(reference, result)
                        if task == "causal-lm"
                        else metrics.classification_metrics(reference, result, labels)
                    )
                except MxsimError as error:
                    row["error"] = str(error)
                row["seconds"] = time.perf_counter() - start
                report["runs"].append(row)
                bar.log(
                    f"{unit.name} {fmt}: {row['seconds']:.1f} s"
                    + (" (failed)" if "error" in row else "")
                )
    finally:
        bar.close()
    return report


def _cell(value, decimals: int = 4) -> str:
    return "-" if value is None else f"{value:.{decimals}f}"


def format_report(report: dict) -> str:
    """The report as a text table: one row per unit x format."""
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
    columns = COLUMNS[task]
    header = ["unit", "format"] + [title for _, title, _ in columns] + ["layers", "seconds"]
    rows = [
        [run["unit"], run["format"]]
        + (
            [f"error: {run['error']}"]
            if "error" in run
            else [_cell(run.get(key), decimals) for key, _, decimals in columns]
            + [str(run["layers"]), f"{run['seconds']:.1f}"]
        )
        for run in report["runs"]
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
    return "\n".join(lines)
