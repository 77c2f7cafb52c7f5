"""The trace format: a directory with a versioned YAML manifest and NPZ tensor files.

Layout (``docs/trace-format.md`` is the full reference)::

    TRACE/
      manifest.yaml          format: mxsim-trace, version: 1, source, layers, ...
      layers/000-NAME.npz    one file per layer: input, weight, bias, output, ...
      dataset.npz            optional: arrays for end-to-end evaluation (inputs, labels)

Every NPZ member is read by :func:`mxsim.fileio.read_npz`: its ``.npy`` header is checked (dtype,
shape, stored size, memory budget) before anything is allocated, and nothing is ever unpickled.
:func:`load_trace` validates everything it reads (manifest structure, version, files, array
names, shapes, dtypes, op-specific shape rules, quantization specs) and raises
:class:`mxsim.errors.TraceError` naming the trace, the layer and the field.
:func:`save_trace` validates the same way, writes into a temporary sibling directory and
moves it into place with ``os.replace``, so a reader never sees a half-written trace.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from ..errors import BudgetError, MxsimError, TraceError
from ..fileio import load_yaml, read_npz, read_text, replace_directory, safe_file_stem
from ..limits import check_array_budget, check_path
from .conv import Conv2dGeometry, ConvTranspose2dGeometry
from .quant import BFPQuant, MXQuant, QDQQuant, QuantSpec, spec_from_manifest

FORMAT_NAME = "mxsim-trace"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
MANIFEST_NAME = "manifest.yaml"
DATASET_FILE = "dataset.npz"

OPS = ("linear", "matmul", "conv2d", "conv_transpose2d")
CONV_OPS = ("conv2d", "conv_transpose2d")
OPERANDS = ("input", "weight", "bias")
#: Tensor names a layer file may hold besides the QDQ arrays ``quant.<operand>.scale|zero_point``.
TENSOR_ROLES = ("input", "weight", "bias", "output", "input_quantized", "weight_quantized", "bias_quantized")
REQUIRED_TENSORS = ("input", "weight", "output")
FLOAT_DTYPES = ("float16", "float32", "float64")
#: dtypes allowed anywhere (QDQ zero points, dataset labels): plain numbers only.
NUMERIC_DTYPES = FLOAT_DTYPES + ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
NETWORK_OPS = {"relu": {}, "flatten": {"start_dim": 1}, "identity": {}}

_QUANT_ARRAY = re.compile(r"^quant\.(input|weight|bias)\.(scale|zero_point)$")


def trace_error(trace: str, message: str, layer: str | None = None, field: str | None = None) -> TraceError:
    """A TraceError whose message reads ``trace T: layer L: field F: message``.

    The parts are also attributes (``trace``, ``layer``, ``field``) for programs.
    """
    where = [f"trace {trace}"]
    if layer is not None:
        where.append(f"layer {layer!r}")
    if field is not None:
        where.append(f"field {field!r}")
    error = TraceError(": ".join(where) + ": " + message)
    error.trace, error.layer, error.field = trace, layer, field
    return error


@dataclass(eq=False)
class Layer:
    """One captured GEMM-like layer.

    * ``name``: unique within the trace.
    * ``op``: ``linear`` (``output = alpha * input @ weight.T + beta * bias``, weight (N, K)),
      ``matmul`` (``output = alpha * input @ weight + beta * bias``, numpy matmul semantics
      with batch broadcasting, weight (..., K, N), which may be an activation), ``conv2d`` or
      ``conv_transpose2d`` (weight (C, O/groups, kh, kw)) (:mod:`mxsim.trace.conv` conventions).
    * ``tensors``: ``input``, ``weight``, ``output`` always; ``bias`` optional. Operands are
      the float values *before* quantization; where the source model quantized an operand
      itself (QDQ or Quark nodes), ``<operand>_quantized`` holds what the layer actually
      consumed. ``output`` is the source framework's result (the float reference).
    * ``attrs``: conv2d: ``stride`` [sh, sw], ``padding`` [[top, bottom], [left, right]],
      ``dilation`` [dh, dw], ``groups``; conv_transpose2d: the same plus ``output_padding``
      [oh, ow]; linear and matmul: optional ``alpha``, ``beta`` (default 1.0).
    * ``quant``: operand name -> spec or None (not quantized / unknown).
    * ``source``: free-form provenance (module or node name, op type...).
    """

    name: str
    op: str
    tensors: dict[str, np.ndarray]
    attrs: dict = field(default_factory=dict)
    quant: dict[str, QuantSpec | None] = field(default_factory=dict)
    source: dict = field(default_factory=dict)

    @property
    def input(self) -> np.ndarray:
        return self.tensors["input"]

    @property
    def weight(self) -> np.ndarray:
        return self.tensors["weight"]

    @property
    def bias(self) -> np.ndarray | None:
        return self.tensors.get("bias")

    @property
    def output(self) -> np.ndarray:
        return self.tensors["output"]

    def quantized(self, operand: str) -> np.ndarray | None:
        """What the source model fed the GEMM for ``operand`` after its own quantizer, if recorded."""
        return self.tensors.get(f"{operand}_quantized")

    def conv_geometry(self, input_shape: tuple | None = None) -> Conv2dGeometry | ConvTranspose2dGeometry:
        """The geometry of a conv2d / conv_transpose2d layer (from its input/weight shapes and
        attrs; ``input_shape`` replaces the recorded input's shape, e.g. another batch size)."""
        if self.op not in CONV_OPS:
            raise MxsimError(f"layer {self.name!r} is {self.op}, not a convolution")
        a = self.attrs
        shape = self.input.shape if input_shape is None else tuple(input_shape)
        if self.op == "conv2d":
            return Conv2dGeometry.from_shapes(shape, self.weight.shape, a["stride"], a["padding"], a["dilation"],
                                              a["groups"])
        return ConvTranspose2dGeometry.from_shapes(shape, self.weight.shape, a["stride"], a["padding"],
                                                   a["output_padding"], a["dilation"], a["groups"])


@dataclass(frozen=True)
class Network:
    """A sequential recipe to run the captured layers end to end.

    ``input``: the dataset array fed to the first step. ``steps``: each either
    ``{"layer": NAME}`` (run that layer on the current value; its weights/bias from the
    trace) or ``{"op": OP, ...}`` with OP in ``relu``, ``flatten`` (``start_dim``, default 1:
    ``x.reshape(x.shape[:start_dim] + (-1,))``) or ``identity``. ``labels``: an optional
    dataset array of integer class labels for accuracy (argmax of the last value).

    A network that is not sequential is rebuilt instead: ``model`` is ``{"architecture":
    NAME, "config": {...}, "state": PREFIX}`` (NAME one of
    :data:`mxsim.inloop.charlm.ARCHITECTURES`; its parameters are the dataset arrays named
    PREFIX + parameter name) and ``steps`` is empty. ``targets``: an optional dataset array of
    integer next-token ids, as many as ``input`` has token ids, for perplexity.
    """

    input: str
    steps: tuple
    labels: str | None = None
    targets: str | None = None
    model: dict | None = None

    def to_manifest(self) -> dict:
        out = {"input": self.input, "steps": [dict(s) for s in self.steps], "labels": self.labels}
        if self.targets is not None:
            out["targets"] = self.targets
        if self.model is not None:
            out["model"] = {"architecture": self.model["architecture"], "config": dict(self.model["config"]),
                            "state": self.model["state"]}
        return out


@dataclass(eq=False)
class Trace:
    """A captured model: layers, plus optional dataset and network recipe.

    ``source``: where it came from (``framework``: torch / onnx, ``model``, free-form
    details). ``metadata``: free-form plain data (e.g. ``float_accuracy``). ``path``: the
    directory it was loaded from (None if built in memory).
    """

    name: str
    layers: list[Layer]
    source: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    dataset: dict[str, np.ndarray] | None = None
    network: Network | None = None
    path: Path | None = None

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        names = ", ".join(layer.name for layer in self.layers)
        raise MxsimError(f"trace {self.name!r} has no layer {name!r}; layers: {names}")


# ----------------------------------------------------------------------------- validation


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _int_pair(value) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_int(v) for v in value)


def _check_conv_attrs(op: str, attrs: dict, fail) -> None:
    keys = ("stride", "padding", "dilation", "groups") + (("output_padding",) if op == "conv_transpose2d" else ())
    for key in keys:
        if key not in attrs:
            fail(f"attrs.{key}", f"missing ({op} needs {', '.join(keys)})")
    extra = set(attrs) - set(keys)
    if extra:
        fail(f"attrs.{sorted(extra, key=str)[0]}", f"not a {op} attribute")
    if op == "conv_transpose2d" and not (_int_pair(attrs["output_padding"]) and min(attrs["output_padding"]) >= 0):
        fail("attrs.output_padding", f"must be [oh, ow] with ints >= 0, got {attrs['output_padding']!r}")
    if not (_int_pair(attrs["stride"]) and min(attrs["stride"]) >= 1):
        fail("attrs.stride", f"must be [sh, sw] with ints >= 1, got {attrs['stride']!r}")
    if not (_int_pair(attrs["dilation"]) and min(attrs["dilation"]) >= 1):
        fail("attrs.dilation", f"must be [dh, dw] with ints >= 1, got {attrs['dilation']!r}")
    pad = attrs["padding"]
    if not (isinstance(pad, (list, tuple)) and len(pad) == 2 and all(_int_pair(p) and min(p) >= 0 for p in pad)):
        fail("attrs.padding", f"must be [[top, bottom], [left, right]] with ints >= 0, got {pad!r}")
    if not (_is_int(attrs["groups"]) and attrs["groups"] >= 1):
        fail("attrs.groups", f"must be an int >= 1, got {attrs['groups']!r}")


def _broadcastable(shape: tuple, target: tuple) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == tuple(target)
    except ValueError:
        return False


def check_layer(layer: Layer, fail) -> None:
    """Check one layer's op, attrs, tensor names/dtypes/shapes and quant specs.

    ``fail(field, message)`` must raise; it is called for the first problem found.
    """
    if layer.op not in OPS:
        fail("op", f"unknown op {layer.op!r}; accepted: {', '.join(OPS)}")
    t = layer.tensors
    if not isinstance(t, dict):
        fail("tensors", f"must be a mapping of tensor name -> numpy array, got {type(t).__name__}")
    for name in REQUIRED_TENSORS:
        if name not in t:
            fail(name, "missing tensor")
    for name, array in t.items():
        if name not in TENSOR_ROLES:
            fail(name, f"unknown tensor name; accepted: {', '.join(TENSOR_ROLES)}")
        if not isinstance(array, np.ndarray):
            fail(name, f"must be a numpy array, got {type(array).__name__}")
        if array.dtype.name not in FLOAT_DTYPES:
            fail(name, f"dtype {array.dtype} is not allowed here (expected one of {', '.join(FLOAT_DTYPES)})")
        if array.size == 0:
            fail(name, f"shape {array.shape} is empty; a layer's tensors need at least one element")
    x, w, out = t["input"].shape, t["weight"].shape, t["output"].shape
    bias = t.get("bias")
    attrs = layer.attrs if isinstance(layer.attrs, dict) else fail("attrs", "must be a mapping")
    if layer.op in ("linear", "matmul"):
        extra = set(attrs) - {"alpha", "beta"}
        if extra:
            fail(f"attrs.{sorted(extra, key=str)[0]}", f"not a {layer.op} attribute (alpha, beta)")
        for key in ("alpha", "beta"):
            if key in attrs and (isinstance(attrs[key], bool) or not isinstance(attrs[key], (int, float))):
                fail(f"attrs.{key}", f"must be a number, got {attrs[key]!r}")
    if layer.op == "linear":
        if len(w) != 2:
            fail("weight", f"linear weight must be (N, K), got shape {w}")
        if len(x) < 1 or x[-1] != w[1]:
            fail("input", f"shape {x} does not end in K = {w[1]} (weight shape {w})")
        expected = x[:-1] + (w[0],)
        if out != expected:
            fail("output", f"shape {out} does not match input {x} x weight {w}: expected {expected}")
    elif layer.op == "matmul":
        if len(x) < 2 or len(w) < 2:
            fail("input" if len(x) < 2 else "weight", f"matmul operands must be at least 2-d, got {x} and {w}")
        if x[-1] != w[-2]:
            fail("weight", f"shape {w}: K = {w[-2]} does not match the input's K = {x[-1]} (input {x})")
        try:
            batch = np.broadcast_shapes(x[:-2], w[:-2])
        except ValueError:
            fail("weight", f"batch dimensions of {x} and {w} do not broadcast")
        expected = batch + (x[-2], w[-1])
        if out != expected:
            fail("output", f"shape {out} does not match input {x} @ weight {w}: expected {expected}")
    else:
        _check_conv_attrs(layer.op, attrs, fail)
        if len(x) != 4:
            fail("input", f"{layer.op} input must be (N, C, H, W), got shape {x}")
        if len(w) != 4:
            layout = "(O, C/groups, kh, kw)" if layer.op == "conv2d" else "(C, O/groups, kh, kw)"
            fail("weight", f"{layer.op} weight must be {layout}, got shape {w}")
        try:
            geometry = layer.conv_geometry()
        except MxsimError as error:
            fail("weight", str(error))
        if out != geometry.output_shape:
            fail("output", f"shape {out} does not match the convolution: expected {geometry.output_shape}")
        try:  # replay lowers the input to an (groups, M, K) im2col matrix of float64
            check_array_budget((geometry.groups, geometry.gemm_m, geometry.gemm_k), 8, "its im2col lowering")
        except BudgetError as error:
            fail("input", str(error))
        if bias is not None and bias.shape != (geometry.out_channels,):
            fail("bias", f"{layer.op} bias must be ({geometry.out_channels},), got shape {bias.shape}")
    if bias is not None and layer.op not in CONV_OPS and not _broadcastable(bias.shape, out):
        fail("bias", f"shape {bias.shape} does not broadcast to the output shape {out}")
    for operand in OPERANDS:
        quantized = t.get(f"{operand}_quantized")
        if quantized is not None:
            if operand not in t:
                fail(f"{operand}_quantized", f"present without {operand}")
            if quantized.shape != t[operand].shape:
                fail(f"{operand}_quantized", f"shape {quantized.shape} differs from {operand} {t[operand].shape}")
    if not isinstance(layer.quant, dict):
        fail("quant", "must be a mapping of operand -> spec or None")
    for operand, spec in layer.quant.items():
        if operand not in OPERANDS:
            fail(f"quant.{operand}", f"unknown operand; accepted: {', '.join(OPERANDS)}")
        if spec is None:
            continue
        if not isinstance(spec, (MXQuant, BFPQuant, QDQQuant)):
            fail(f"quant.{operand}", f"must be MXQuant, BFPQuant, QDQQuant or None, got {type(spec).__name__}")
        if operand not in t:
            fail(f"quant.{operand}", f"spec given but the layer has no {operand} tensor")
        rank = t[operand].ndim
        if spec.axis is None:
            if not (isinstance(spec, QDQQuant) and spec.scale.size == 1):
                fail(f"quant.{operand}.axis", "unresolved (None)")
        elif not -rank <= spec.axis < rank:
            fail(f"quant.{operand}.axis", f"{spec.axis} is out of range for the {rank}-d {operand}")
        if isinstance(spec, QDQQuant) and spec.axis is not None:
            dim = t[operand].shape[spec.axis]
            expected = (dim,) if spec.block_size == 0 else None
            if expected is not None and spec.scale.size > 1 and spec.scale.shape != expected:
                fail(f"quant.{operand}.scale", f"per-axis scale shape {spec.scale.shape}, expected {expected}")
            if spec.block_size:
                blocked = list(t[operand].shape)
                blocked[spec.axis] = -(-dim // spec.block_size)
                if spec.scale.shape != tuple(blocked):
                    fail(f"quant.{operand}.scale", f"blocked scale shape {spec.scale.shape}, expected {tuple(blocked)}")
        if isinstance(spec, QDQQuant):
            for key, array in spec.arrays(operand).items():
                if array.dtype.name not in NUMERIC_DTYPES:
                    fail(key, f"dtype {array.dtype} is not a plain numeric dtype")


def check_network(network: Network, layer_names: set[str], dataset: dict | None, fail) -> None:
    """Check a network recipe against the layers and the dataset; ``fail(field, message)`` raises."""
    if dataset is None:
        fail("network", "a network needs a dataset (its input array)")
    if not isinstance(network.input, str) or network.input not in dataset:
        fail("network.input", f"{network.input!r} is not a dataset array ({', '.join(sorted(dataset))})")
    if dataset[network.input].size == 0:
        fail("network.input", f"the dataset array {network.input!r} is empty")
    for key in ("labels", "targets"):
        name = getattr(network, key)
        if name is not None and (not isinstance(name, str) or name not in dataset):
            fail(f"network.{key}", f"{name!r} is not a dataset array ({', '.join(sorted(dataset))})")
        if name is not None and dataset[name].dtype.kind not in "iu":
            fail(f"network.{key}", f"{key} must be integers, got {dataset[name].dtype}")
    if network.targets is not None and dataset[network.targets].shape != dataset[network.input].shape:
        fail("network.targets", f"shape {dataset[network.targets].shape} differs from the input's "
                                f"{dataset[network.input].shape}")
    if network.model is not None:
        model = network.model
        if not isinstance(model, dict) or set(model) != {"architecture", "config", "state"}:
            fail("network.model", "must be a mapping with architecture, config and state")
        if not isinstance(model["config"], dict) or not isinstance(model["state"], str):
            fail("network.model", "config must be a mapping and state a dataset name prefix")
        if not any(name.startswith(model["state"]) for name in dataset):
            fail("network.model.state", f"no dataset array starts with {model['state']!r}")
        if network.steps:
            fail("network.steps", "must be empty when network.model rebuilds the network")
        return
    if not network.steps:
        fail("network.steps", "empty")
    for index, step in enumerate(network.steps):
        where = f"network.steps[{index}]"
        if not isinstance(step, dict):
            fail(where, f"must be a mapping, got {step!r}")
        if "layer" in step:
            if set(step) != {"layer"}:
                fail(where, f"a layer step has only the key 'layer', got {sorted(step)}")
            if not isinstance(step["layer"], str) or step["layer"] not in layer_names:
                fail(where, f"unknown layer {step['layer']!r}")
        elif "op" in step:
            op = step["op"]
            if not isinstance(op, str) or op not in NETWORK_OPS:
                fail(where, f"unknown op {op!r}; accepted: {', '.join(NETWORK_OPS)}")
            extra = set(step) - {"op"} - set(NETWORK_OPS[op])
            if extra:
                fail(where, f"op {op} takes no key {sorted(extra, key=str)[0]!r}")
            if op == "flatten" and not (_is_int(step.get("start_dim", 1)) and step.get("start_dim", 1) >= 0):
                fail(where, "flatten start_dim must be an int >= 0")
        else:
            fail(where, "must have a 'layer' or an 'op' key")


def _plain(value, where: str):
    """``value`` as YAML-safe plain data (numpy scalars become Python numbers)."""
    if isinstance(value, dict):
        return {str(k): _plain(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, bool):
        return value
    for kind in (int, float, str):  # plain types, also for subclasses such as torch's version string
        if isinstance(value, kind):
            return kind(value)
    raise MxsimError(f"{where}: {type(value).__name__} is not plain data (mapping, list, str, number, bool, None)")


def _tensor_entry(array: np.ndarray) -> dict:
    return {"shape": [int(v) for v in array.shape], "dtype": array.dtype.name}


def _layer_file(index: int, name: str) -> str:
    return f"layers/{index:03d}-{safe_file_stem(name, 60, 'layer')}.npz"


def _layer_arrays(layer: Layer) -> dict[str, np.ndarray]:
    arrays = dict(layer.tensors)
    for operand, spec in layer.quant.items():
        if isinstance(spec, QDQQuant):
            arrays.update(spec.arrays(operand))
    return arrays


def _spec_manifest(operand: str, spec: QuantSpec | None):
    if spec is None:
        return None
    if isinstance(spec, QDQQuant):
        return spec.to_manifest(operand)
    return spec.to_manifest()


def build_manifest(trace: Trace) -> tuple[dict, dict[str, dict[str, np.ndarray]]]:
    """The manifest mapping and the arrays of each file (relative path -> {key: array}).

    Validates the trace first (raises TraceError naming the layer and field).
    """
    label = trace.name
    validate_trace(trace, label)
    files: dict[str, dict[str, np.ndarray]] = {}
    layers = []
    for index, layer in enumerate(trace.layers):
        arrays = _layer_arrays(layer)
        path = _layer_file(index, layer.name)
        files[path] = arrays
        layers.append({
            "name": layer.name,
            "op": layer.op,
            "file": path,
            "attrs": _plain(layer.attrs, f"layer {layer.name}: attrs"),
            "tensors": {k: _tensor_entry(v) for k, v in arrays.items()},
            "quant": {k: _spec_manifest(k, v) for k, v in layer.quant.items()},
            "source": _plain(layer.source, f"layer {layer.name}: source"),
        })
    manifest = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "name": trace.name,
        "source": _plain(trace.source, "source"),
        "metadata": _plain(trace.metadata, "metadata"),
        "layers": layers,
    }
    if trace.dataset is not None:
        files[DATASET_FILE] = dict(trace.dataset)
        manifest["dataset"] = {"file": DATASET_FILE,
                               "tensors": {k: _tensor_entry(v) for k, v in trace.dataset.items()}}
    if trace.network is not None:
        manifest["network"] = trace.network.to_manifest()
    return _plain(manifest, "manifest"), files


def validate_trace(trace: Trace, label: str | None = None) -> None:
    """Raise TraceError for the first problem in an in-memory trace."""
    if not isinstance(trace, Trace):
        raise TraceError(f"expected a Trace, got {type(trace).__name__}")
    label = label or trace.name
    if not isinstance(trace.name, str) or not trace.name:
        raise trace_error(label, "must have a non-empty name", field="name")
    if not isinstance(trace.layers, list):
        raise trace_error(label, f"layers must be a list of Layer objects, got {type(trace.layers).__name__}",
                          field="layers")
    for key, value in (("source", trace.source), ("metadata", trace.metadata), ("dataset", trace.dataset or {})):
        if not isinstance(value, dict):
            raise trace_error(label, f"must be a mapping, got {type(value).__name__}", field=key)
    names = set()
    for layer in trace.layers:
        if not isinstance(layer, Layer):
            raise trace_error(label, f"layers must be Layer objects, got {type(layer).__name__}", field="layers")
        if not isinstance(layer.name, str) or not layer.name:
            raise trace_error(label, "a layer has an empty name", field="layers")
        if layer.name in names:
            raise trace_error(label, "duplicate layer name", layer=layer.name, field="name")
        names.add(layer.name)

        def fail(field_name, message, _layer=layer.name):
            raise trace_error(label, message, layer=_layer, field=field_name)

        check_layer(layer, fail)
    if trace.dataset is not None:
        for key, array in trace.dataset.items():
            if not isinstance(key, str):
                raise trace_error(label, f"dataset array names must be strings, got {key!r}", field="dataset")
            if not isinstance(array, np.ndarray) or array.dtype.name not in NUMERIC_DTYPES:
                raise trace_error(label, "dataset arrays must be plain numeric numpy arrays", field=f"dataset.{key}")

    def fail_network(field_name, message):
        raise trace_error(label, message, field=field_name)

    if trace.network is not None and not isinstance(trace.network, Network):
        raise trace_error(label, f"must be a Network or None, got {type(trace.network).__name__}", field="network")
    if trace.network is not None:
        check_network(trace.network, names, trace.dataset, fail_network)


# ----------------------------------------------------------------------------- saving


def _write_npz(path: Path, arrays: dict[str, np.ndarray], compress: bool) -> None:
    with open(path, "wb") as handle:
        (np.savez_compressed if compress else np.savez)(handle, **arrays)
        handle.flush()
        os.fsync(handle.fileno())


def save_trace(trace: Trace, path, *, overwrite: bool = False, compress: bool = True) -> Path:
    """Write ``trace`` as a directory at ``path``, set ``trace.path`` and return the path.

    Everything is written into a new temporary directory beside ``path`` and then moved
    into place. With ``overwrite=True`` an existing trace directory (one holding a
    manifest.yaml) is replaced by :func:`mxsim.fileio.replace_directory`: on Linux the two
    directories are swapped atomically, so a reader, a crash or SIGKILL at any moment leaves
    the old complete trace or the new one (elsewhere there is a moment with neither, never a
    mixture). A directory that is not a trace is never replaced. A staging directory left by
    a killed writer (``.NAME.tmp-*`` beside ``path``) can be deleted.
    """
    target = check_path(path, "save_trace: path")
    label = str(target)
    if target.exists() and not overwrite:
        raise trace_error(label, "already exists (pass overwrite=True to replace it)")
    if target.exists() and not (target / MANIFEST_NAME).is_file():
        raise trace_error(label, "exists and is not a trace directory (no manifest.yaml); refusing to replace it")
    manifest, files = build_manifest(trace)
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = parent / f".{target.name}.tmp-{secrets.token_hex(4)}"
    staging.mkdir()  # mode from the umask, unlike tempfile.mkdtemp's 0700
    try:
        for relative, arrays in files.items():
            file_path = staging / relative
            file_path.parent.mkdir(parents=True, exist_ok=True)
            _write_npz(file_path, arrays, compress)
        text = yaml.safe_dump(manifest, sort_keys=False, default_flow_style=None, width=100)
        with open(staging / MANIFEST_NAME, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        replace_directory(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    trace.path = target
    return target


# ----------------------------------------------------------------------------- loading


def _read_npz(label: str, layer: str | None, root: Path, relative, expected) -> dict[str, np.ndarray]:
    """Read the arrays listed in ``expected`` ({key: {shape, dtype}}) from one NPZ, checking each.

    The manifest entries are checked first, then every member's ``.npy`` header (dtype,
    shape, stored size, memory budget; see :func:`mxsim.fileio.read_npz`) before any array
    memory is allocated.
    """
    file_field = "file"
    if not isinstance(relative, str) or not relative:
        raise trace_error(label, f"must be a relative path, got {relative!r}", layer, file_field)
    rel = Path(relative)
    if rel.is_absolute() or ".." in rel.parts:
        raise trace_error(label, f"{relative!r} must be a relative path inside the trace", layer, file_field)
    path = root / rel
    if not path.is_file():
        raise trace_error(label, f"missing file {relative}", layer, file_field)
    if not isinstance(expected, dict) or not expected:
        raise trace_error(label, "must list the file's arrays with shape and dtype", layer, "tensors")
    declared = {}
    for key, entry in expected.items():
        where = f"tensors.{key}"
        if not isinstance(key, str):
            raise trace_error(label, f"array names must be strings, got {key!r}", layer, "tensors")
        if not isinstance(entry, dict) or set(entry) != {"shape", "dtype"}:
            raise trace_error(label, "manifest entry must have exactly shape and dtype", layer, where)
        shape, dtype = entry["shape"], entry["dtype"]
        if not isinstance(shape, list) or not all(_is_int(v) and v >= 0 for v in shape):
            raise trace_error(label, f"manifest shape must be a list of ints >= 0, got {shape!r}", layer, where)
        if not isinstance(dtype, str) or dtype not in NUMERIC_DTYPES:
            raise trace_error(label, f"manifest dtype must be one of {', '.join(NUMERIC_DTYPES)}, got {dtype!r}",
                              layer, where)
        declared[key] = (tuple(shape), dtype)

    def fail(member, message):
        raise trace_error(label, message, layer, file_field if member is None else member)

    return read_npz(path, NUMERIC_DTYPES, fail, declared, label=relative)


def _require(mapping: dict, key: str, kind, label: str, layer: str | None, field_name: str):
    if key not in mapping:
        raise trace_error(label, "missing", layer, field_name)
    value = mapping[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise trace_error(label, f"must be {names}, got {type(value).__name__}", layer, field_name)
    return value


_TOP_KEYS = {"format", "version", "name", "source", "metadata", "layers", "dataset", "network"}
_LAYER_KEYS = {"name", "op", "file", "attrs", "tensors", "quant", "source"}


def load_trace(path) -> Trace:
    """Read and validate the trace directory at ``path``.

    Raises TraceError (message ``trace PATH: layer NAME: field FIELD: problem``) for a
    missing directory, manifest or file; invalid YAML; an unknown format version; a
    truncated or corrupt NPZ; a pickled (object) array; arrays missing from or not listed
    in the manifest; shape or dtype mismatches with the manifest or between a layer's
    tensors; invalid attrs, quantization specs or network.
    """
    root = check_path(path, "load_trace: path")
    label = str(path)
    if not root.is_dir():
        raise trace_error(label, "no such trace directory")
    manifest_path = root / MANIFEST_NAME
    if not manifest_path.is_file():
        raise trace_error(label, f"missing {MANIFEST_NAME}", field=MANIFEST_NAME)

    def fail_manifest(message):
        raise trace_error(label, f"{MANIFEST_NAME}: {message}", field=MANIFEST_NAME)

    doc = load_yaml(read_text(manifest_path, fail_manifest), fail_manifest)
    if not isinstance(doc, dict):
        raise trace_error(label, f"{MANIFEST_NAME} must be a mapping", field=MANIFEST_NAME)
    if doc.get("format") != FORMAT_NAME:
        raise trace_error(label, f"expected {FORMAT_NAME!r}, got {doc.get('format')!r}", field="format")
    version = doc.get("version")
    if not _is_int(version) or version not in SUPPORTED_VERSIONS:
        raise trace_error(label, f"unknown trace format version {version!r} (this mxsim reads "
                                 f"{', '.join(map(str, SUPPORTED_VERSIONS))})", field="version")
    unknown = set(doc) - _TOP_KEYS
    if unknown:
        raise trace_error(label, "unknown manifest key", field=sorted(unknown, key=str)[0])
    name = _require(doc, "name", str, label, None, "name")
    source = doc.get("source") or {}
    metadata = doc.get("metadata") or {}
    if not isinstance(source, dict):
        raise trace_error(label, "must be a mapping", field="source")
    if not isinstance(metadata, dict):
        raise trace_error(label, "must be a mapping", field="metadata")
    entries = _require(doc, "layers", list, label, None, "layers")
    layers = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise trace_error(label, "must be a mapping", field=f"layers[{index}]")
        layer_name = _require(entry, "name", str, label, None, f"layers[{index}].name")
        unknown = set(entry) - _LAYER_KEYS
        if unknown:
            raise trace_error(label, "unknown layer key", layer_name, sorted(unknown, key=str)[0])
        op = _require(entry, "op", str, label, layer_name, "op")
        arrays = _read_npz(label, layer_name, root, entry.get("file"), entry.get("tensors"))
        attrs = entry.get("attrs") or {}
        quant_entries = entry.get("quant") or {}
        if not isinstance(quant_entries, dict):
            raise trace_error(label, "must be a mapping", layer_name, "quant")
        quant_arrays = {k: v for k, v in arrays.items() if _QUANT_ARRAY.match(k)}
        quant = {}
        for operand, spec_entry in quant_entries.items():
            if spec_entry is None:
                quant[operand] = None
                continue
            try:
                quant[operand] = spec_from_manifest(spec_entry, quant_arrays, str(operand))
            except (MxsimError, KeyError, TypeError, ValueError) as error:
                # UnknownNameError is a KeyError too, but its message is already complete
                missing = isinstance(error, KeyError) and not isinstance(error, MxsimError)
                detail = f"missing key {error}" if missing else str(error)
                raise trace_error(label, f"invalid quantization spec: {detail}", layer_name,
                                  f"quant.{operand}") from None
        used = {k for operand, spec in quant.items() if isinstance(spec, QDQQuant) for k in spec.arrays(operand)}
        for key in sorted(set(quant_arrays) - used, key=str):
            raise trace_error(label, "QDQ array that no qdq spec of this layer uses", layer_name, key)
        tensors = {k: v for k, v in arrays.items() if k not in quant_arrays}
        if not isinstance(entry.get("source") or {}, dict):
            raise trace_error(label, "must be a mapping", layer_name, "source")
        layers.append(Layer(layer_name, op, tensors, attrs, quant, entry.get("source") or {}))
    dataset = None
    if doc.get("dataset") is not None:
        spec = doc["dataset"]
        if not isinstance(spec, dict) or set(spec) != {"file", "tensors"}:
            raise trace_error(label, "must be a mapping with file and tensors", field="dataset")
        dataset = _read_npz(label, None, root, spec["file"], spec["tensors"])
    network = None
    if doc.get("network") is not None:
        spec = doc["network"]
        keys = {"input", "steps", "labels", "targets", "model"}
        if not isinstance(spec, dict) or not {"input", "steps"} <= set(spec) <= keys:
            raise trace_error(label, "must be a mapping with input, steps and optional labels, targets, model",
                              field="network")
        if not isinstance(spec["steps"], list):
            raise trace_error(label, "must be a list", field="network.steps")
        network = Network(spec["input"], tuple(spec["steps"]), spec.get("labels"), spec.get("targets"),
                          spec.get("model"))
    trace = Trace(name, layers, source, metadata, dataset, network, root)
    validate_trace(trace, label)
    return trace
