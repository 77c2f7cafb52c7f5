"""An ONNX image classifier's top-1 / top-5 accuracy: in float, as its own runtime computes the
quantized model, and with each unit x element format in the loop (``mxsim[onnx]``; image
folders need Pillow, ``mxsim[examples]``; Quark's custom ops need amd-quark, ``mxsim[oracles]``).

:func:`evaluate_onnx` checks the whole request first (the models, the units and formats, the
data, the output), then runs every batch of the data through each row: the float model
(``float_model``, onnxruntime), the quantized model in onnxruntime with Quark's custom-op
library registered when the model has Quark nodes (the ``runtime`` row), and the quantized
model with every MatMul/Gemm/Conv computed by a unit (:func:`mxsim.inloop.run_onnx_on_unit`).
Images are decoded once per batch and shared by the rows. A row that fails keeps its error
and the others go on.

Data (:func:`read_data`): an ImageNet-style folder (one sub-folder per class; classes sorted
by name are labels 0, 1, ...; each image: RGB, shorter side resized to ``resize`` with
Pillow's bilinear filter, centre crop ``crop`` x ``crop``, scaled to [0, 1], normalised with
ImageNet's mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225), NCHW float32), or an
``.npz`` holding exactly ``inputs`` (float32, first axis the images) and ``labels`` (integers,
one per image).

Top-k (:func:`top_k_hits`): an image counts when its label's logit is among the k largest
(ties broken toward the lower class index, as a stable sort of the negated logits does);
with fewer than k classes every image counts.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._optional import require
from ..capture.onnx_graph import Graph, load_graph
from ..capture.onnx_quark import QUARK_DOMAINS
from ..datapath import HardwareConfig, load_hwconfig
from ..errors import ArgumentError, InputFileError, MxsimError
from ..fileio import read_npz
from ..formats import get_format
from ..inloop import run_onnx_on_unit
from ..inloop.torch import check_scaling
from ..limits import check_int, check_path
from ..parallel import progress_bar
from ..trace.model import NUMERIC_DTYPES
from .models import _quiet
from .run import check_units_take

#: ImageNet's per-channel mean and standard deviation (RGB), as torchvision's models use them.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: The top-k accuracies reported.
TOP_K = (1, 5)
#: Most classes (the largest label + 1) an npz's labels may name.
MAX_CLASSES = 1 << 20


@dataclass
class Data:
    """The evaluation data: ``count`` images with ``labels``; ``batch(start, stop)`` gives the
    model inputs (float32, NCHW for a folder) of images ``start:stop``."""

    source: str
    labels: np.ndarray
    classes: list[str] | None
    batch: Callable[[int, int], np.ndarray]
    item_shape: tuple  # one image's shape

    @property
    def count(self) -> int:
        return int(self.labels.size)


def preprocess_image(image, resize: int = 256, crop: int = 224) -> np.ndarray:
    """A Pillow image as a (3, crop, crop) float32 array: RGB; the shorter side resized to
    ``resize`` (the longer one to ``int(resize * long / short)``, Pillow's bilinear filter);
    the centre ``crop`` x ``crop`` (top-left corner ``round((size - crop) / 2)``); divided by
    255; per channel minus :data:`IMAGENET_MEAN`, over :data:`IMAGENET_STD`."""
    pil = require("PIL.Image")
    image = image.convert("RGB")
    width, height = image.size
    if width <= height:
        size = (resize, int(resize * height / width))
    else:
        size = (int(resize * width / height), resize)
    image = image.resize(size, pil.BILINEAR)
    left, top = int(round((size[0] - crop) / 2.0)), int(round((size[1] - crop) / 2.0))
    image = image.crop((left, top, left + crop, top + crop))
    pixels = np.asarray(image, dtype=np.float32) / np.float32(255)
    pixels = (pixels - np.asarray(IMAGENET_MEAN, np.float32)) / np.asarray(IMAGENET_STD, np.float32)
    return np.ascontiguousarray(pixels.transpose(2, 0, 1), dtype=np.float32)


def _open_image(path: Path):
    """The image at ``path`` (header read, pixels not yet decoded); InputFileError otherwise."""
    pil = require("PIL.Image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pil.DecompressionBombWarning)
            return pil.open(path)
    except (OSError, ValueError, pil.DecompressionBombWarning, pil.DecompressionBombError) as error:
        raise InputFileError(
            f"{path}: not an image Pillow reads ({type(error).__name__}: {error})"
        ) from None


def read_image_folder(folder, resize: int = 256, crop: int = 224) -> Data:
    """An ImageNet-style folder: one sub-folder per class (sorted names -> labels 0, 1, ...),
    every file in it an image (names starting with ``.`` are skipped). Every image's header
    is read here, so a file that is not an image is refused before any model runs; the
    pixels are decoded per batch."""
    require("PIL.Image")
    resize = check_int(resize, "resize", 1, 1 << 14)
    crop = check_int(crop, "crop", 1, resize)
    path = check_path(folder, "data")
    entries = sorted(p for p in path.iterdir() if not p.name.startswith("."))
    strays = [p.name for p in entries if not p.is_dir()]
    if strays:
        raise InputFileError(
            f"{path}: {strays[0]!r} is not a class folder; an image folder holds one sub-folder "
            "per class and nothing else"
        )
    if not entries:
        raise InputFileError(
            f"{path}: no class folders (expected one sub-folder of images per class)"
        )
    files, labels = [], []
    for label, class_dir in enumerate(entries):
        for item in sorted(p for p in class_dir.iterdir() if not p.name.startswith(".")):
            if not item.is_file():
                raise InputFileError(f"{item}: not a file; a class folder holds images only")
            with _open_image(item):
                pass
            files.append(item)
            labels.append(label)
    if not files:
        raise InputFileError(f"{path}: no images in its {len(entries)} class folders")

    def batch(start: int, stop: int) -> np.ndarray:
        images = []
        for item in files[start:stop]:
            with _open_image(item) as image:
                try:
                    images.append(preprocess_image(image, resize, crop))
                except (OSError, ValueError, SyntaxError) as error:
                    raise InputFileError(
                        f"{item}: the image does not decode ({type(error).__name__}: {error})"
                    ) from None
        return np.stack(images)

    return Data(
        str(path), np.asarray(labels, np.int64), [p.name for p in entries], batch, (3, crop, crop)
    )


def read_npz_data(path) -> Data:
    """An ``.npz`` with exactly ``inputs`` (float32, shape (N, ...), N >= 1) and ``labels``
    (an integer dtype, shape (N,), each >= 0). Never unpickled."""
    path = check_path(path, "data")

    def fail(member, message):
        raise InputFileError(
            f"{path}: " + (message if member is None else f"array {member!r}: {message}")
        )

    arrays = read_npz(path, NUMERIC_DTYPES, fail, label=str(path))
    if set(arrays) != {"inputs", "labels"}:
        raise InputFileError(
            f"{path}: holds arrays {sorted(arrays)}; expected exactly 'inputs' (float32, images "
            "first) and 'labels' (integers, one per image)"
        )
    inputs, labels = arrays["inputs"], arrays["labels"]
    if inputs.dtype != np.float32 or inputs.ndim < 2:
        raise InputFileError(
            f"{path}: 'inputs' must be float32 with the images on its first axis (at least 2-d), "
            f"got {inputs.dtype} {inputs.shape}"
        )
    if labels.dtype.kind not in "iu" or labels.shape != inputs.shape[:1]:
        raise InputFileError(
            f"{path}: 'labels' must be integers of shape ({inputs.shape[0]},), one per input, got "
            f"{labels.dtype} {labels.shape}"
        )
    if labels.size == 0:
        raise InputFileError(f"{path}: no inputs ('inputs' has 0 rows)")
    if labels.min() < 0 or labels.max() >= MAX_CLASSES:
        raise InputFileError(
            f"{path}: 'labels' holds {labels.min() if labels.min() < 0 else labels.max()}; labels "
            f"are class indices 0..{MAX_CLASSES - 1}"
        )
    return Data(
        str(path),
        labels.astype(np.int64),
        None,
        lambda start, stop: inputs[start:stop],
        inputs.shape[1:],
    )


def read_data(data, resize: int = 256, crop: int = 224) -> Data:
    """:func:`read_image_folder` for a directory, :func:`read_npz_data` for a file."""
    path = check_path(data, "data")
    if path.is_dir():
        return read_image_folder(path, resize, crop)
    if not path.is_file():
        raise InputFileError(
            f"{path}: no such file or folder (expected an image folder or an .npz)"
        )
    return read_npz_data(path)


def top_k_hits(logits: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """Per row, whether ``labels[row]`` is among the ``k`` largest logits of the row (ties
    toward the lower index; NaN logits order as numpy's sort puts them, last)."""
    order = np.argsort(-np.asarray(logits, np.float64), axis=1, kind="stable")[:, :k]
    return (order == np.asarray(labels)[:, None]).any(axis=1)


@dataclass
class _Model:
    """A classifier file: its graph, input and output names, and whether it has Quark nodes."""

    path: Path
    graph: Graph
    input_name: str
    output_name: str
    size: int

    @property
    def has_quark_nodes(self) -> bool:
        return any(node.domain in QUARK_DOMAINS for node in self.graph.nodes)


def _dims(value_info) -> list | None:
    tensor = value_info.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return [
        d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
        for d in tensor.shape.dim
    ]


def check_classifier(model, what: str) -> _Model:
    """``model`` (a .onnx path) if it is a classifier this command runs: one float32 graph
    input, its first graph output declared (when declared at all) 2-d."""
    onnx = require("onnx")
    path = check_path(model, what)
    g = load_graph(path, what)
    if len(g.inputs) != 1:
        raise MxsimError(
            f"{what} {path}: {len(g.inputs)} graph inputs {[i.name for i in g.inputs]}; a classifier "
            "here takes one (the images)"
        )
    info = g.inputs[0]
    elem = info.type.tensor_type.elem_type
    if elem and elem != onnx.TensorProto.FLOAT:
        raise MxsimError(
            f"{what} {path}: input {info.name!r} is {onnx.TensorProto.DataType.Name(elem)}; the images "
            "are float32"
        )
    if not g.outputs:
        raise MxsimError(f"{what} {path}: the graph has no outputs")
    declared = next((o for o in g.model.graph.output if o.name == g.outputs[0]), None)
    dims = None if declared is None else _dims(declared)
    if dims is not None and len(dims) != 2:
        raise MxsimError(
            f"{what} {path}: output {g.outputs[0]!r} is {len(dims)}-d; a classifier's first output is "
            "its (batch, classes) logits"
        )
    return _Model(path, g, info.name, g.outputs[0], g.model.ByteSize())


def _check_input(model: _Model, data: Data, what: str) -> int | None:
    """The model's fixed batch size (None if free), after checking the data's image shape and
    labels against the model's declared input and output."""
    dims = _dims(model.graph.inputs[0])
    item = data.item_shape
    if dims is not None:
        if len(dims) != 1 + len(item):
            raise MxsimError(
                f"{what} {model.path}: input {model.input_name!r} is {len(dims)}-d; the data's images "
                f"come in {len(item) + 1}-d batches (N x {' x '.join(str(s) for s in item)})"
            )
        for axis, (dim, size) in enumerate(zip(dims[1:], item), start=1):
            if dim is not None and dim != size:
                hint = (
                    " (--crop sets an image folder's image size)"
                    if data.classes is not None and axis > 1
                    else ""
                )
                raise MxsimError(
                    f"{what} {model.path}: input {model.input_name!r} axis {axis} is {dim}, the "
                    f"data's is {size}{hint}"
                )
    declared = next(
        (o for o in model.graph.model.graph.output if o.name == model.output_name), None
    )
    out = None if declared is None else _dims(declared)
    classes = None if out is None else out[1]
    wanted = int(data.labels.max()) + 1 if data.classes is None else len(data.classes)
    if classes is not None and classes < wanted:
        raise MxsimError(
            f"{what} {model.path}: output {model.output_name!r} has {classes} classes; the data has "
            f"{'labels up to ' + str(wanted - 1) if data.classes is None else str(wanted) + ' classes'}"
        )
    return None if dims is None else dims[0]


def _quark_library() -> str:
    """The path of Quark's CPU custom-op library (amd-quark; compiled on first use). The
    banners and log lines of its import (Quark's, torch's, torchao's) are kept off stdout and
    stderr, so that the command's output is its table and its errors one line."""
    with _quiet(), contextlib.redirect_stderr(io.StringIO()):
        quark_onnx = require("quark.onnx")
        try:
            return quark_onnx.get_library_path("CPU")
        except Exception as error:  # Quark builds the library with a compiler on first use
            raise MxsimError(
                f"Quark's custom-op library is not available ({type(error).__name__}: {error})"
            ) from None


def ort_runner(model: _Model):
    """``run(outputs, feeds)`` of an onnxruntime CPU session of ``model`` (default graph
    optimizations), with Quark's custom-op library registered when the model has Quark nodes."""
    ort = require("onnxruntime")
    options = ort.SessionOptions()
    library = _quark_library() if model.has_quark_nodes else None
    try:
        if library is not None:
            options.register_custom_ops_library(library)
        session = ort.InferenceSession(str(model.path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own exception types
        raise MxsimError(
            f"onnxruntime cannot load {model.path}: {' '.join(str(error).split())}"
        ) from None

    def run(outputs, feeds):
        try:
            return session.run(outputs, feeds)
        except Exception as error:
            raise MxsimError(
                f"onnxruntime failed on {model.path}: {' '.join(str(error).split())}"
            ) from None

    return run


def _logits(values, model: _Model, rows: int) -> np.ndarray:
    logits = np.asarray(values)
    if logits.ndim != 2 or logits.shape[0] != rows:
        raise MxsimError(
            f"{model.path}: output {model.output_name!r} has shape {logits.shape} for {rows} images; a "
            "classifier's first output is its (batch, classes) logits"
        )
    return logits


class _Row:
    """One row of the table: a way of computing the logits, and its tallies."""

    def __init__(
        self,
        name: str,
        kind: str,
        model: _Model,
        compute,
        unit: str | None = None,
        fmt: str | None = None,
    ):
        self.name, self.kind, self.model, self.compute = name, kind, model, compute
        self.unit, self.format = unit, fmt
        self.hits = {k: 0 for k in TOP_K}
        self.agree: int | None = (
            0  # images whose top-1 class is the runtime row's (None: no runtime row)
        )
        self.count = 0
        self.max_diff = 0.0
        self.logits: np.ndarray | None = None  # the last batch's
        self.seconds = 0.0
        self.error: str | None = None

    def report(self) -> dict:
        out = {
            "name": self.name,
            "kind": self.kind,
            "model": str(self.model.path),
            "model_size": self.model.size,
        }
        if self.unit is not None:
            out.update(unit=self.unit, format=self.format)
        if self.error is not None:
            out["error"] = self.error
        else:
            out.update({f"top{k}": self.hits[k] / self.count for k in TOP_K})
            if self.kind == "unit":
                out["runtime_top1_agreement"] = (
                    None if self.agree is None else self.agree / self.count
                )
                out["runtime_logit_max_abs_diff"] = None if self.agree is None else self.max_diff
        out["seconds"] = self.seconds
        return out


def evaluate_onnx(
    model,
    data,
    hw,
    formats=None,
    *,
    float_model=None,
    batch_size: int = 32,
    resize: int = 256,
    crop: int = 224,
    scaling: str = "auto",
    bfp_kernel: str = "cpu",
    progress: bool = False,
) -> dict:
    """Top-1 / top-5 accuracy of the classifier ``model`` (a .onnx path) on ``data``.

    Args:
        model: the (quantized) classifier: one float32 input (the images), its first output
            the (batch, classes) logits.
        data: an image folder or an ``.npz`` (:func:`read_data`; ``resize``, ``crop`` for a folder).
        hw: a unit or a list of units (:class:`HardwareConfig` or config paths).
        formats: element formats of both operands on the units, each taken by every unit;
            None: per unit, the first format it takes for both operands.
        float_model: the float classifier, for the ``float`` row (None: no float row).
        batch_size: images per run (a model whose batch axis is fixed runs that many, the
            last batch padded by repeating its last image, whose results are dropped).
        scaling, bfp_kernel: as for :func:`mxsim.inloop.run_onnx_on_unit`.
        progress: a progress bar on stderr (a line per batch when stderr is not a terminal).

    Returns the report: ``model``, ``float_model``, ``data``, ``images``, ``classes``,
    ``rows`` (per row: ``name``, ``kind`` float / runtime / unit, ``model``, ``model_size``
    (bytes, the model serialized with its weights), ``top1``, ``top5``, and for unit rows
    ``unit``, ``format``, ``runtime_top1_agreement`` (the fraction of images whose top-1 class
    is the runtime row's) and ``runtime_logit_max_abs_diff``; ``seconds``; or ``error``).
    """
    check_scaling(scaling)
    units = [
        h if isinstance(h, HardwareConfig) else load_hwconfig(h)
        for h in (hw if isinstance(hw, (list, tuple)) else [hw])
    ]
    if not units:
        raise ArgumentError("evaluate onnx: expected at least one unit")
    if formats:
        formats = [
            get_format(f).name
            for f in (formats if isinstance(formats, (list, tuple)) else [formats])
        ]
        check_units_take(units, formats, scaling)
        runs = [(unit, fmt) for unit in units for fmt in formats]
    else:
        check_units_take(units, [], scaling)
        runs = []
        for unit in units:
            both = [f for f in unit.a_formats if f in unit.b_formats]
            if not both:
                raise ArgumentError(
                    f"unit {unit.name} takes no format for both operands; give --format"
                )
            runs.append((unit, both[0]))
    batch_size = check_int(batch_size, "batch_size", 1, 1 << 16)
    if bfp_kernel not in ("cpu", "cuda"):
        raise ArgumentError(f"bfp_kernel must be cpu or cuda, got {bfp_kernel!r}")
    quantized = check_classifier(model, "model")
    reference = None if float_model is None else check_classifier(float_model, "float model")
    given = read_data(data, resize, crop)
    fixed = {
        _check_input(m, given, what)
        for m, what in ((quantized, "model"), (reference, "float model"))
        if m is not None
    } - {None}
    if len(fixed) > 1:
        raise MxsimError(f"the model and the float model fix different batch sizes {sorted(fixed)}")
    pad = bool(fixed)  # a fixed batch axis takes full batches only
    step = fixed.pop() if fixed else batch_size

    rows = [] if reference is None else [_Row("float", "float", reference, ort_runner(reference))]
    runtime = _Row("runtime", "runtime", quantized, None)
    try:
        runtime.compute = ort_runner(quantized)
    except MxsimError as error:
        runtime.error = str(error)
    rows.append(runtime)
    for unit, fmt in runs:

        def on_unit(outputs, feeds, _unit=unit, _fmt=fmt):
            return [
                run_onnx_on_unit(
                    quantized.path,
                    feeds,
                    _unit,
                    a_format=_fmt,
                    b_format=_fmt,
                    scaling=scaling,
                    outputs=outputs,
                    bfp_kernel=bfp_kernel,
                )[outputs[0]]
            ]

        rows.append(_Row(f"{unit.name} {fmt}", "unit", quantized, on_unit, unit.name, fmt))

    batches = range(0, given.count, step)
    bar = progress_bar(len(batches), "batch", progress and sys.stderr.isatty())
    started = time.perf_counter()
    try:
        for number, start in enumerate(batches, start=1):
            stop = min(start + step, given.count)
            images, labels = given.batch(start, stop), given.labels[start:stop]
            if pad and len(images) < step:
                images = np.concatenate(
                    [images, np.repeat(images[-1:], step - len(images), axis=0)]
                )
            for row in rows:
                if row.error is None:
                    _run_batch(
                        row, images, labels, runtime.logits if runtime.error is None else None
                    )
            if bar is not None:
                bar.update(1)
            elif progress:
                print(
                    f"mxsim evaluate onnx: batch {number}/{len(batches)}, {stop}/{given.count} images, "
                    f"{time.perf_counter() - started:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if bar is not None:
            bar.close()
    return {
        "model": str(quantized.path),
        "float_model": None if reference is None else str(reference.path),
        "data": given.source,
        "images": given.count,
        "classes": given.classes,
        "rows": [row.report() for row in rows],
    }


def _run_batch(
    row: _Row, images: np.ndarray, labels: np.ndarray, runtime_logits: np.ndarray | None
) -> None:
    """One batch through ``row``: its top-k hits, and for a unit row its agreement with the
    runtime row's logits of the batch (``runtime_logits``; None: the runtime failed)."""
    begin = time.perf_counter()
    try:
        values = row.compute([row.model.output_name], {row.model.input_name: images})[0]
    except MxsimError as error:
        row.error = str(error)
        return
    finally:
        row.seconds += time.perf_counter() - begin
    # the model's or the data's fault, not the row's: the command stops
    logits = _logits(values, row.model, len(images))[: len(labels)]
    if labels.max() >= logits.shape[1]:
        raise MxsimError(
            f"label {int(labels.max())} is out of range for the {logits.shape[1]} classes of output "
            f"{row.model.output_name!r} of {row.model.path}"
        )
    row.logits = logits
    for k in TOP_K:
        row.hits[k] += int(top_k_hits(logits, labels, k).sum())
    row.count += len(labels)
    if row.kind == "unit":
        if runtime_logits is None or row.agree is None:
            row.agree = None
        else:
            row.agree += int(np.sum(runtime_logits.argmax(axis=1) == logits.argmax(axis=1)))
            diff = np.abs(logits.astype(np.float64) - runtime_logits.astype(np.float64))
            row.max_diff = max(row.max_diff, float(diff.max(initial=0.0)))


def _size(size: int) -> str:
    return f"{size / 1e6:.2f} MB" if size >= 1e6 else f"{size / 1e3:.2f} kB"


def format_onnx_report(report: dict) -> str:
    """The report as the table of Quark's ResNet50 MX example: a row per model or unit x
    format, its model size, Top1 and Top5 in percent; unit rows add their top-1 agreement
    with the runtime row."""
    lines = [f"{Path(report['model']).name}: {report['images']} images from {report['data']}"]
    header = ["DataType / Config", "Model Size", "Top1", "Top5", "Top1 = runtime", "seconds"]
    table = []
    for row in report["rows"]:
        name = {
            "float": f"float ({Path(row['model']).name})",
            "runtime": f"runtime ({Path(row['model']).name})",
        }.get(row["kind"], row["name"])
        if "error" in row:
            table.append([name, _size(row["model_size"]), f"error: {row['error']}"])
            continue
        agree = row.get("runtime_top1_agreement")
        table.append(
            [
                name,
                _size(row["model_size"]),
                f"{100 * row['top1']:.3f} %",
                f"{100 * row['top5']:.3f} %",
                "" if agree is None else f"{100 * agree:.3f} %",
                f"{row['seconds']:.1f}",
            ]
        )
    widths = [
        max(len(r[i]) for r in [header] + table if len(r) == len(header))
        for i in range(len(header))
    ]
    for cells in [header] + table:
        if len(cells) == len(header):
            lines.append(
                "  ".join(
                    c.ljust(w) if i == 0 else c.rjust(w)
                    for i, (c, w) in enumerate(zip(cells, widths))
                ).rstrip()
            )
        else:
            lines.append(
                "  ".join([cells[0].ljust(widths[0]), cells[1].rjust(widths[1]), cells[2]])
            )
    return "\n".join(lines)
