"""Reading and writing trace directories (layout in :mod:`.model`, ``docs/trace-format.md``).

Every NPZ member is read by :func:`mxsim.fileio.read_npz`: its ``.npy`` header is checked (dtype,
shape, stored size, memory budget) before anything is allocated, and nothing is ever unpickled.
:func:`load_trace` validates everything it reads (manifest structure, version, files, array
names, shapes, dtypes, then the whole trace by :func:`mxsim.trace.validate.validate_trace`)
and raises :class:`mxsim.errors.TraceError` naming the trace, the layer and the field.
:func:`save_trace` validates the same way, writes into a temporary sibling directory and
moves it into place with ``os.replace``, so a reader never sees a half-written trace.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
from pathlib import Path

import numpy as np
import yaml

from ..errors import ArgumentError, MxsimError
from ..fileio import load_yaml, read_npz, read_text, replace_directory, safe_file_stem
from ..limits import check_path, is_integer
from .model import (
    BLOB_DIR,
    DATASET_FILE,
    FLOAT_DTYPES,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    NUMERIC_DTYPES,
    SUPPORTED_VERSIONS,
    Layer,
    Network,
    Trace,
)
from ..formats import get_format
from ..quantize import MXTensor
from ..quantize.options import QuantOptions
from .quant import MXQuant, NVFP4Quant, QDQQuant, QuantSpec, spec_from_manifest
from .reference import (
    COMPACT_REFERENCE,
    REFERENCE_MODES,
    RESIDUAL_DTYPE,
    decode_residual,
    encode_residual,
    mx_prediction,
)
from .validate import trace_error, validate_trace

_QUANT_ARRAY = re.compile(r"^quant\.(input|weight|bias)\.(scale|zero_point|scales)$")


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
    for kind in (
        int,
        float,
        str,
    ):  # plain types, also for subclasses such as torch's version string
        if isinstance(value, kind):
            return kind(value)
    raise MxsimError(
        f"{where}: {type(value).__name__} is not plain data (mapping, list, str, number, bool, None)"
    )


def _tensor_entry(array: np.ndarray) -> dict:
    return {"shape": [int(v) for v in array.shape], "dtype": array.dtype.name}


_BLOB_ID = re.compile(r"^[0-9a-f]{32}$")


def content_id(array: np.ndarray) -> str:
    """The name of ``array``'s blob: the first 32 hex digits of the SHA-256 of its dtype name,
    shape and little-endian bytes (equal arrays share one blob)."""
    digest = hashlib.sha256(f"{array.dtype.name}{tuple(int(v) for v in array.shape)}".encode())
    digest.update(_little_endian(array).tobytes())
    return digest.hexdigest()[:32]


def _little_endian(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=np.dtype(array.dtype.name).newbyteorder("<"))


def _shuffled(array: np.ndarray) -> np.ndarray:
    """The blob of ``array``: its bytes as uint8 (itemsize, size), byte j of every element in
    row j (a lossless byte shuffle: deflate then finds the repeats in the sign and exponent
    bytes of floats)."""
    return np.ascontiguousarray(
        _little_endian(array).view(np.uint8).reshape(-1, array.dtype.itemsize).T
    )


def _unshuffled(stored: np.ndarray, shape: tuple, dtype: str) -> np.ndarray:
    little = np.dtype(dtype).newbyteorder("<")
    return (
        np.ascontiguousarray(stored.T)
        .view(little)
        .reshape(shape)
        .astype(np.dtype(dtype), copy=False)
    )


def _layer_arrays(layer: Layer) -> dict[str, np.ndarray]:
    arrays = dict(layer.tensors)
    for operand, spec in layer.quant.items():
        if isinstance(spec, (QDQQuant, MXQuant, NVFP4Quant)):
            arrays.update(spec.arrays(operand))
    return arrays


def _spec_manifest(operand: str, spec: QuantSpec | None):
    if spec is None:
        return None
    if isinstance(spec, (QDQQuant, MXQuant, NVFP4Quant)):
        return spec.to_manifest(operand)
    return spec.to_manifest()


def _quantize_by(spec: MXQuant, x: np.ndarray) -> MXTensor:
    return spec.quantize(x)


def _as_codes(layer: Layer, operand: str) -> MXTensor | None:
    """The operand as its MX spec's codes and scales, when they hold everything replay takes
    from it for the model's own rows: the decoded values are exact in the operand's dtype and
    quantize to the same codes again (a profile whose rule moves them keeps the float)."""
    spec, x = layer.quant.get(operand), layer.tensors[operand]
    if not isinstance(spec, MXQuant) or (spec.bypass_single_element and x.size == 1):
        return None
    tensor = _quantize_by(spec, x)
    exact = tensor.dequantize(np.float64)
    decoded = exact.astype(x.dtype)
    if not np.array_equal(decoded.astype(np.float64), exact, equal_nan=True):
        return None
    if operand in layer.codes_only and not np.array_equal(decoded, x, equal_nan=True):
        return None  # claimed to be decoded codes, but other values
    again = _quantize_by(spec, decoded)
    if not (
        np.array_equal(again.codes, tensor.codes) and np.array_equal(again.scales, tensor.scales)
    ):
        return None
    return tensor


def _coded_tensor(spec: MXQuant, codes: np.ndarray, scales: np.ndarray, shape: tuple) -> MXTensor:
    """The MXTensor stored as ``codes`` and ``scales`` by :func:`_as_codes`."""
    axis = spec.axis % len(shape)
    padding = codes.shape[-1] - shape[axis]
    return MXTensor(
        get_format(spec.format),
        codes,
        scales,
        shape,
        axis,
        spec.block_size,
        padding,
        QuantOptions(),
    )


def _code_shapes(spec: MXQuant, shape: tuple) -> tuple[tuple, tuple]:
    """The shapes of the codes and scales :func:`mxsim.quantize` gives for ``shape``."""
    axis = spec.axis % len(shape)
    others = shape[:axis] + shape[axis + 1 :]
    blocks = -(-shape[axis] // spec.block_size)
    return others + (blocks * spec.block_size,), others + (blocks,)


def _blob(files: dict, array: np.ndarray) -> str:
    blob = content_id(array)
    files.setdefault(f"{BLOB_DIR}/{blob}.npz", {"data": _shuffled(array)})
    return blob


def _layer_file(index: int, name: str) -> str:
    return f"layers/{index:03d}-{safe_file_stem(name, 60, 'layer')}.npz"


def reference_mode(reference: str | None, floats: bool, version: int) -> str:
    """The reference mode ``save_trace`` asked for (None: float32 with floats, else the compact default);
    ArgumentError for an unknown mode or a residual one without a compact version-2 trace."""
    mode = (
        (COMPACT_REFERENCE if not floats and version == 2 else "float32")
        if reference is None
        else reference
    )
    if mode not in REFERENCE_MODES:
        raise ArgumentError(
            f"reference must be one of {', '.join(REFERENCE_MODES)}, got {reference!r}"
        )
    if mode != "float32" and (floats or version != 2):
        raise ArgumentError(
            f"reference {mode} needs a compact version-2 trace (floats=False, --compact): the "
            "residual is taken from the operands' codes"
        )
    return mode


def _output_entry(
    files: dict, layer: Layer, coded: dict[str, MXTensor], mode: str, label: str
) -> dict:
    """The manifest entry of a layer's output: a ``residualN`` residual (:mod:`.reference`)
    where ``mode`` (or the layer's own, for a layer that already holds a reconstructed
    reference) asks for one and the residual encodes, else the float reference whole."""
    output = layer.output
    mode = layer.reference if layer.reference != "float32" else mode
    if mode != "float32" and {"input", "weight"} <= set(coded):
        prediction = mx_prediction(
            layer.op, layer.attrs, coded["input"], coded["weight"], layer.bias
        )
        encoded = encode_residual(output, prediction, mode)
        if encoded is not None:
            return {
                **_tensor_entry(output),
                "reference": mode,
                "residual": _blob(files, encoded[0]),
                "step_exponent": encoded[1],
            }
    if layer.reference != "float32":  # never let a reconstructed reference pass for the exact one
        raise trace_error(
            label,
            f"the output is a {layer.reference} reconstruction and cannot be stored as one again",
            layer.name,
            "reference",
        )
    return {**_tensor_entry(output), "blob": _blob(files, output)}


def build_manifest(
    trace: Trace, floats: bool = True, version: int = FORMAT_VERSION, reference: str | None = None
) -> tuple[dict, dict[str, dict[str, np.ndarray]]]:
    """The manifest mapping and the arrays of each file (relative path -> {key: array}).

    Version 2: every layer array as a content-addressed blob ``tensors/ID.npz`` (member
    ``data``, :func:`_shuffled`), stored once however many layers hold it; ``floats=False``:
    an input or weight with an MX spec is stored as its element codes and scales only, where
    :func:`_as_codes` allows (the layer's ``codes_only``, which stay codes whatever ``floats``),
    and the float reference output as ``reference`` says (:data:`.reference.REFERENCE_MODES`;
    default for ``floats=False`` :data:`.reference.COMPACT_REFERENCE`, else ``float32``):
    a ``residualN`` output is stored as its residual from the exact MX product where both
    operands are codes and it encodes (:func:`_output_entry`), else whole.
    Version 1: one NPZ per layer, every array whole (refused for ``codes_only`` operands, whose
    decoded values would pass for floats).

    Validates the trace first (raises TraceError naming the layer and field).
    """
    label = trace.name
    validate_trace(trace, label)
    if version not in SUPPORTED_VERSIONS:
        raise ArgumentError(
            f"save_trace: version must be one of {SUPPORTED_VERSIONS}, got {version!r}"
        )
    mode = reference_mode(reference, floats, version)
    files: dict[str, dict[str, np.ndarray]] = {}
    layers = []
    for index, layer in enumerate(trace.layers):
        entries = {}
        if version == 1:
            if layer.codes_only:  # its decoded values would pass for the floats
                raise trace_error(
                    label,
                    "a compact trace (operands kept as codes only) cannot be written in version 1",
                    layer.name,
                    "codes_only",
                )
            path = _layer_file(index, layer.name)
            files[path] = _layer_arrays(layer)
            entries = {k: _tensor_entry(v) for k, v in files[path].items()}
        coded = {}
        for key, array in _layer_arrays(layer).items() if version == 2 else ():
            tensor = (
                None
                if floats and key not in layer.codes_only
                else _as_codes(layer, key)
                if key in ("input", "weight")
                else None
            )
            if (
                tensor is None and key in layer.codes_only
            ):  # never let decoded values pass for floats
                raise trace_error(
                    label,
                    f"the {key} is kept as codes only, but its values are not those of its MX spec",
                    layer.name,
                    "codes_only",
                )
            if key == "output":
                continue  # after the operands: its residual is taken from their codes
            if tensor is None:
                entries[key] = {**_tensor_entry(array), "blob": _blob(files, array)}
            else:
                coded[key] = tensor
                entries[key] = {
                    **_tensor_entry(array),
                    "codes": _blob(files, tensor.codes),
                    "scales": _blob(files, tensor.scales),
                }
        if version == 2:
            entries["output"] = _output_entry(files, layer, coded, mode, label)
        layers.append(
            {
                "name": layer.name,
                "op": layer.op,
                **({"file": _layer_file(index, layer.name)} if version == 1 else {}),
                "attrs": _plain(layer.attrs, f"layer {layer.name}: attrs"),
                "tensors": entries,
                "quant": {k: _spec_manifest(k, v) for k, v in layer.quant.items()},
                "source": _plain(layer.source, f"layer {layer.name}: source"),
            }
        )
    manifest = {
        "format": FORMAT_NAME,
        "version": version,
        "name": trace.name,
        "source": _plain(trace.source, "source"),
        "metadata": _plain(trace.metadata, "metadata"),
        "layers": layers,
    }
    if trace.dataset is not None:
        files[DATASET_FILE] = dict(trace.dataset)
        manifest["dataset"] = {
            "file": DATASET_FILE,
            "tensors": {k: _tensor_entry(v) for k, v in trace.dataset.items()},
        }
    if trace.network is not None:
        manifest["network"] = trace.network.to_manifest()
    return _plain(manifest, "manifest"), files


# ----------------------------------------------------------------------------- saving


def _write_npz(path: Path, arrays: dict[str, np.ndarray], compress: bool) -> None:
    with open(path, "wb") as handle:
        (np.savez_compressed if compress else np.savez)(handle, **arrays)
        handle.flush()
        os.fsync(handle.fileno())


def save_trace(
    trace: Trace,
    path,
    *,
    overwrite: bool = False,
    compress: bool = True,
    floats: bool = True,
    version: int = FORMAT_VERSION,
    reference: str | None = None,
) -> Path:
    """Write ``trace`` as a directory at ``path``, set ``trace.path`` and return the path.

    Everything is written into a new temporary directory beside ``path`` and then moved
    into place. With ``overwrite=True`` an existing trace directory (one holding a
    manifest.yaml) is replaced by :func:`mxsim.fileio.replace_directory`: on Linux the two
    directories are swapped atomically, so a reader, a crash or SIGKILL at any moment leaves
    the old complete trace or the new one (elsewhere there is a moment with neither, never a
    mixture). A directory that is not a trace is never replaced. A staging directory left by
    a killed writer (``.NAME.tmp-*`` beside ``path``) can be deleted.

    ``floats=False`` writes a compact trace: inputs and weights with an MX spec as their codes
    and scales, without the floats before quantization (:func:`build_manifest`;
    docs/trace-format.md says which reports need those floats), and by default its float
    reference outputs as ``residual8`` residuals (``reference``: :func:`build_manifest`;
    ``"float32"`` keeps them exact). ``version=1`` writes the
    previous format (one NPZ per layer), which older mxsim versions read.
    """
    target = check_path(path, "save_trace: path")
    label = str(target)
    if target.exists() and not overwrite:
        raise trace_error(label, "already exists (pass overwrite=True to replace it)")
    if target.exists() and not (target / MANIFEST_NAME).is_file():
        raise trace_error(
            label, "exists and is not a trace directory (no manifest.yaml); refusing to replace it"
        )
    manifest, files = build_manifest(trace, floats, version, reference)
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


def _check_inside(
    root: Path, path: Path, relative: str, label: str, layer: str | None, field_name: str
) -> None:
    """Refuse a file that resolves outside the trace directory (a symlink, at any level,
    pointing out of it): a trace reads only its own files."""
    try:
        inside = path.resolve(strict=True).is_relative_to(root.resolve(strict=True))
    except (OSError, RuntimeError):  # a symlink loop
        inside = False
    if not inside:
        raise trace_error(
            label,
            f"{relative} leads out of the trace directory (a symlink); refused",
            layer,
            field_name,
        )


def _read_npz(
    label: str, layer: str | None, root: Path, relative, expected
) -> dict[str, np.ndarray]:
    """Read the arrays listed in ``expected`` ({key: {shape, dtype}}) from one NPZ, checking each.

    The manifest entries are checked first, then every member's ``.npy`` header (dtype,
    shape, stored size, memory budget; see :func:`mxsim.fileio.read_npz`) before any array
    memory is allocated.
    """
    file_field = "file"
    if not isinstance(relative, str) or not relative:
        raise trace_error(label, f"must be a relative path, got {relative!r}", layer, file_field)
    try:
        rel = check_path(relative, "file")
    except ArgumentError as error:
        raise trace_error(label, str(error), layer, file_field) from None
    if rel.is_absolute() or ".." in rel.parts:
        raise trace_error(
            label, f"{relative!r} must be a relative path inside the trace", layer, file_field
        )
    path = root / rel
    if not path.is_file():
        raise trace_error(label, f"missing file {relative}", layer, file_field)
    _check_inside(root, path, relative, label, layer, file_field)
    declared = {
        key: shape_dtype for key, (shape_dtype, _) in _declared(label, layer, expected).items()
    }

    def fail(member, message):
        raise trace_error(label, message, layer, file_field if member is None else member)

    return read_npz(path, NUMERIC_DTYPES, fail, declared, label=relative)


def _declared(
    label: str, layer: str | None, expected, extra_keys: tuple = ((),)
) -> dict[str, tuple[tuple, dict]]:
    """The manifest's ``tensors`` mapping checked: {name: ((shape, dtype), entry)}; each entry
    has exactly shape, dtype and one of the key sets ``extra_keys``."""
    if not isinstance(expected, dict) or not expected:
        raise trace_error(
            label, "must list the layer's arrays with shape and dtype", layer, "tensors"
        )
    accepted = [{"shape", "dtype", *extra} for extra in extra_keys]
    declared = {}
    for key, entry in expected.items():
        where = f"tensors.{key}"
        if not isinstance(key, str):
            raise trace_error(label, f"array names must be strings, got {key!r}", layer, "tensors")
        if not isinstance(entry, dict) or set(entry) not in accepted:
            keys = " or ".join(", ".join(sorted(k)) for k in accepted)
            raise trace_error(label, f"manifest entry must have exactly {keys}", layer, where)
        shape, dtype = entry["shape"], entry["dtype"]
        if not isinstance(shape, list) or not all(is_integer(v) and v >= 0 for v in shape):
            raise trace_error(
                label, f"manifest shape must be a list of ints >= 0, got {shape!r}", layer, where
            )
        if not isinstance(dtype, str) or dtype not in NUMERIC_DTYPES:
            raise trace_error(
                label,
                f"manifest dtype must be one of {', '.join(NUMERIC_DTYPES)}, got {dtype!r}",
                layer,
                where,
            )
        declared[key] = ((tuple(shape), dtype), entry)
    return declared


#: The largest |step exponent| a residual reference may name: past float64's exponent range
#: (2^±1100 turns every step into 0 or inf), so nothing valid is refused.
_STEP_EXPONENT_LIMIT = 1100


class _Blobs:
    """The blobs of one version-2 trace, each read once (checked as any NPZ member, then
    against its content id) and shared by every layer that names it."""

    def __init__(self, label: str, root: Path):
        self.label, self.root, self.cache = label, root, {}

    def read(self, blob, shape: tuple, dtype: str, layer: str, where: str) -> np.ndarray:
        label = self.label
        if not isinstance(blob, str) or not _BLOB_ID.match(blob):
            raise trace_error(
                label,
                f"blob must be 32 lower-case hex digits, got {str(blob)[:40]!r}",
                layer,
                where,
            )
        relative = f"{BLOB_DIR}/{blob}.npz"
        if blob not in self.cache:
            path = self.root / relative
            if not path.is_file():
                raise trace_error(label, f"missing file {relative}", layer, where)
            _check_inside(self.root, path, relative, label, layer, where)
            stored_shape = (np.dtype(dtype).itemsize, int(np.prod(shape, dtype=object)))

            def fail(member, message):
                raise trace_error(label, message, layer, where)

            stored = read_npz(
                path, ("uint8",), fail, {"data": (stored_shape, "uint8")}, label=relative
            )["data"]
            array = _unshuffled(stored, shape, dtype)
            if content_id(array) != blob:
                raise trace_error(
                    label,
                    f"{relative} does not hold the array its name says (corrupt or edited)",
                    layer,
                    where,
                )
            # (writable, though layers with the same content share it: read-only values
            # would be a Numba type of their own to the quantizers' kernels, which take
            # them as they are; nothing writes into a layer's tensors)
            self.cache[blob] = array
        array = self.cache[blob]
        if array.shape != shape or array.dtype.name != dtype:
            raise trace_error(
                label,
                f"blob {blob} holds {array.dtype.name} {array.shape}, the manifest says "
                f"{dtype} {shape}",
                layer,
                where,
            )
        return array

    def layer_arrays(self, layer: str, expected) -> tuple[dict[str, np.ndarray], dict[str, tuple]]:
        """A layer's arrays stored whole, and those stored otherwise (name -> (shape, dtype,
        entry)): operands as codes, decoded by :meth:`decode` once the specs are known, and an
        output as a residual, reconstructed by :meth:`reconstruct` from the decoded operands."""
        arrays, coded = {}, {}
        forms = (("blob",), ("codes", "scales"), ("reference", "residual", "step_exponent"))
        for key, ((shape, dtype), entry) in _declared(self.label, layer, expected, forms).items():
            if "blob" in entry:
                arrays[key] = self.read(entry["blob"], shape, dtype, layer, f"tensors.{key}")
            else:
                coded[key] = (shape, dtype, entry)
        return arrays, coded

    def decode(self, layer: str, key: str, shape: tuple, dtype: str, entry: dict, spec) -> MXTensor:
        """An operand stored as codes and scales, as its MXTensor (checked: an MX spec, a float
        dtype, codes and scales of the shapes the spec gives, codes of the element format)."""
        where = f"tensors.{key}"
        if (
            key not in ("input", "weight")
            or "codes" not in entry
            or not isinstance(spec, MXQuant)
            or dtype not in FLOAT_DTYPES
        ):
            raise trace_error(
                self.label,
                "only a float input or weight with an MX spec is stored as codes and scales",
                layer,
                where,
            )
        if not shape or not -len(shape) <= spec.axis < len(shape):
            raise trace_error(
                self.label,
                f"the spec's axis {spec.axis} does not fit the shape {shape}",
                layer,
                where,
            )
        code_shape, scale_shape = _code_shapes(spec, shape)
        codes = self.read(entry["codes"], code_shape, "uint8", layer, f"{where}.codes")
        scales = self.read(entry["scales"], scale_shape, "uint8", layer, f"{where}.scales")
        try:
            get_format(spec.format).field_codes(codes, "codes")
        except MxsimError as error:
            raise trace_error(self.label, str(error), layer, f"{where}.codes") from None
        return _coded_tensor(spec, codes, scales, shape)

    def residual_mode(self, layer: str, shape: tuple, dtype: str, entry: dict) -> str:
        """The reference mode of an output stored as a residual, its entry checked (a known
        residual mode, float32, an integer step exponent in range)."""
        label, where = self.label, "tensors.output"
        mode, exponent = entry["reference"], entry["step_exponent"]
        if not isinstance(mode, str) or mode not in REFERENCE_MODES or mode == "float32":
            modes = ", ".join(m for m in REFERENCE_MODES if m != "float32")
            raise trace_error(
                label,
                f"unknown residual reference {str(mode)[:40]!r}; accepted: {modes}",
                layer,
                f"{where}.reference",
            )
        if dtype != "float32":
            raise trace_error(
                label,
                f"a residual reference output is float32, not {dtype}",
                layer,
                f"{where}.dtype",
            )
        if (
            not is_integer(exponent)
            or not -_STEP_EXPONENT_LIMIT <= exponent <= _STEP_EXPONENT_LIMIT
        ):
            raise trace_error(
                label,
                f"must be an integer in [-{_STEP_EXPONENT_LIMIT}, {_STEP_EXPONENT_LIMIT}], got "
                f"{str(exponent)[:40]!r}",
                layer,
                f"{where}.step_exponent",
            )
        return mode

    def reconstruct(
        self, layer: Layer, shape: tuple, entry: dict, coded: dict[str, MXTensor]
    ) -> np.ndarray:
        """An output stored as a residual (entry checked by :meth:`residual_mode`, ``layer``
        validated): the reference reconstructed from the prediction of the decoded operands
        (:mod:`.reference`); refused unless both operands are codes blocked along K, the
        residual is int16 of the output's shape and the result is finite."""
        label, where = self.label, "tensors.output"
        prediction = None
        if {"input", "weight"} <= set(coded):
            prediction = mx_prediction(
                layer.op, layer.attrs, coded["input"], coded["weight"], layer.bias
            )
        if prediction is None or prediction.shape != shape:
            raise trace_error(
                label,
                "a residual reference needs a linear or matmul layer whose input and weight are "
                "both stored as codes blocked along K",
                layer.name,
                where,
            )
        steps = self.read(entry["residual"], shape, RESIDUAL_DTYPE, layer.name, f"{where}.residual")
        output = decode_residual(prediction, steps, int(entry["step_exponent"]))
        if not np.all(np.isfinite(output)):
            raise trace_error(
                label,
                "the reconstructed reference is not finite (corrupt or edited residual, step "
                "exponent or operands)",
                layer.name,
                where,
            )
        return output


def _require(mapping: dict, key: str, kind, label: str, layer: str | None, field_name: str):
    if key not in mapping:
        raise trace_error(label, "missing", layer, field_name)
    value = mapping[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise trace_error(label, f"must be {names}, got {type(value).__name__}", layer, field_name)
    return value


_TOP_KEYS = {"format", "version", "name", "source", "metadata", "layers", "dataset", "network"}
#: Layer keys by format version: version 1 names one NPZ file per layer, version 2 a blob per array.
_LAYER_KEYS = {
    1: {"name", "op", "file", "attrs", "tensors", "quant", "source"},
    2: {"name", "op", "attrs", "tensors", "quant", "source"},
}


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
    _check_inside(root, manifest_path, MANIFEST_NAME, label, None, MANIFEST_NAME)

    def fail_manifest(message):
        raise trace_error(label, f"{MANIFEST_NAME}: {message}", field=MANIFEST_NAME)

    doc = load_yaml(read_text(manifest_path, fail_manifest), fail_manifest)
    if not isinstance(doc, dict):
        raise trace_error(label, f"{MANIFEST_NAME} must be a mapping", field=MANIFEST_NAME)
    if doc.get("format") != FORMAT_NAME:
        raise trace_error(
            label, f"expected {FORMAT_NAME!r}, got {doc.get('format')!r}", field="format"
        )
    version = doc.get("version")
    if not is_integer(version) or version not in SUPPORTED_VERSIONS:
        raise trace_error(
            label,
            f"unknown trace format version {version!r} (this mxsim reads "
            f"{', '.join(map(str, SUPPORTED_VERSIONS))})",
            field="version",
        )
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
    layers, residuals = [], []
    blobs = _Blobs(label, root)
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise trace_error(label, "must be a mapping", field=f"layers[{index}]")
        layer_name = _require(entry, "name", str, label, None, f"layers[{index}].name")
        unknown = set(entry) - _LAYER_KEYS[version]
        if unknown:
            raise trace_error(
                label,
                f"unknown layer key (format version {version})",
                layer_name,
                sorted(unknown, key=str)[0],
            )
        op = _require(entry, "op", str, label, layer_name, "op")
        coded = {}
        if version == 1:
            arrays = _read_npz(label, layer_name, root, entry.get("file"), entry.get("tensors"))
        else:
            arrays, coded = blobs.layer_arrays(layer_name, entry.get("tensors"))
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
                raise trace_error(
                    label, f"invalid quantization spec: {detail}", layer_name, f"quant.{operand}"
                ) from None
        used = {
            k
            for operand, spec in quant.items()
            if isinstance(spec, (QDQQuant, MXQuant, NVFP4Quant))
            for k in spec.arrays(operand)
        }
        for key in sorted(set(quant_arrays) - used, key=str):
            raise trace_error(
                label, "a spec array that no spec of this layer uses", layer_name, key
            )
        tensors = {k: v for k, v in arrays.items() if k not in quant_arrays}
        residual = (
            coded.pop("output") if "residual" in coded.get("output", ((), "", {}))[2] else None
        )
        decoded = {
            key: blobs.decode(layer_name, key, shape, dtype, coded_entry, quant.get(key))
            for key, (shape, dtype, coded_entry) in coded.items()
        }
        for key, tensor in decoded.items():
            tensors[key] = tensor.dequantize(np.float64).astype(coded[key][1])
        reference = "float32"
        if residual is not None:  # reconstructed once the whole trace is checked (shapes, attrs)
            reference = blobs.residual_mode(layer_name, *residual)
            tensors["output"] = np.zeros(residual[0], dtype=np.float32)
        if not isinstance(entry.get("source") or {}, dict):
            raise trace_error(label, "must be a mapping", layer_name, "source")
        layers.append(
            Layer(
                layer_name,
                op,
                tensors,
                attrs,
                quant,
                entry.get("source") or {},
                frozenset(coded),
                reference,
            )
        )
        if residual is not None:
            residuals.append((layers[-1], residual, decoded))
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
            raise trace_error(
                label,
                "must be a mapping with input, steps and optional labels, targets, model",
                field="network",
            )
        if not isinstance(spec["steps"], list):
            raise trace_error(label, "must be a list", field="network.steps")
        network = Network(
            spec["input"],
            tuple(spec["steps"]),
            spec.get("labels"),
            spec.get("targets"),
            spec.get("model"),
        )
    trace = Trace(name, layers, source, metadata, dataset, network, root)
    validate_trace(trace, label)
    for layer, (shape, _, residual_entry), decoded in residuals:
        layer.tensors["output"] = blobs.reconstruct(layer, shape, residual_entry, decoded)
    return trace
