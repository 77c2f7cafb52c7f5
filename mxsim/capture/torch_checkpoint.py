"""Quantized checkpoints read by mxsim itself: a model directory saved by AMD Quark's
exporter or a torchao MX state dict, loaded without the library and without re-quantizing.

Two layouts are read, from safetensors only (never a pickle):

* **Quark** (``quark.torch.export_safetensors``, ``weight_format="real_quantized"``):
  ``config.json`` holds ``quantization_config`` with ``quant_method: "quark"``; each quantized
  Linear stores ``<module>.weight`` (element codes: ``float8_e4m3fn`` / ``float8_e5m2``
  tensors, or two fp4 E2M1 codes a byte, element 0 in the low nibble) and
  ``<module>.weight_scale`` (one E8M0 code a block of ``group_size`` along the input axis).
  With ``weight_format="fake_quantized"`` the file holds the float weight and its scales
  as float powers of two instead (Quark 0.13 writes OCP MXFP8 weights only this way: its
  ``real_quantized`` export has no fp8 ``per_group`` packing); the codes are then the weight
  quantized at those scales by the profile's element rounding, as Quark's quantizer does.
  Read: ``global_quant_config`` with an OCP MX weight (``fp8_e4m3``, ``fp8_e5m2``, ``fp4``;
  ``per_group``, ``e8m0`` scales, static) and, optionally, a dynamic OCP MX input
  (:data:`QUARK_ELEMENTS`), its ``scale_calculation_mode`` giving the ``quark`` /
  ``quark-floor`` / ``quark-ceil`` profile; the Linears quantized are those with a
  ``weight_scale`` (Quark's ``exclude`` list leaves the others float).
* **torchao** (``quantize_(model, MXDynamicActivationMXWeightConfig(...))``, its state dict
  flattened by ``torchao.prototype.safetensors.flatten_tensor_state_dict`` and written with
  ``safetensors.torch.save_file(tensors, "model.safetensors", metadata=metadata)`` beside the
  model's ``config.json``): the file's metadata describes each ``MXTensor`` weight
  (element dtype, block size, the activation's ``QuantizeTensorToMXKwargs``) and its
  ``<module>._weight_qdata`` / ``<module>._weight_scale`` tensors (scales possibly in
  cuBLAS's blocked layout, undone here). The activation's scaling mode gives the profile
  (:data:`mxsim.capture.torch_torchao.SCALE_MODE_PROFILES`). Weight-only ``NVFP4Tensor``
  weights (``NVFP4WeightOnlyConfig``, written the same way) are read too: packed FP4 codes
  (``_weight_qdata``, element 0 in the low nibble), UE4M3 block scales of 16
  (``_weight_scale``, ``float8_e4m3fn``, plain or blocked) and the optional float32 tensor
  scale (``_weight_per_tensor_scale``); the weight is torchao's dequantization in its
  ``orig_dtype`` (:class:`~mxsim.trace.quant.NVFP4Quant`).

:func:`read_checkpoint` decodes every quantized weight to its exact values (element value x
2^(code - 127)), checked to re-encode to its codes at its scale codes; :func:`install` puts
:class:`StoredQuantizer` modules on each quantized Linear of the model transformers built,
so that the Linear computes ``F.linear(input quantized as the library does at each call,
the stored weight)``. Capture and the unit in the loop read those quantizers as they read a
library's (:mod:`mxsim.capture.torch`): each weight's spec carries the checkpoint's scale
codes (``MXQuant.scales``), so its codes in the trace are the checkpoint's. Anything else
(another ``quant_method``, a scale format, element type or option mxsim does not read, a
tensor of the wrong dtype or shape) is refused in one :class:`MxsimError` line naming the
file and key and what is accepted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._optional import require
from ..errors import MxsimError
from ..formats import get_format
from ..limits import shown
from ..quantize.mx import MXTensor
from ..quantize.nvfp4 import NVFP4_PROFILES, NVFP4Tensor
from ..quantize.options import resolve_options
from ..quantize.packing import unpack_codes
from ..trace.quant import MXQuant, NVFP4Quant
from .torch_quark import SCALE_MODE_PROFILES as QUARK_PROFILES
from .torch_torchao import NVFP4_DEQUANTIZED
from .torch_torchao import SCALE_MODE_PROFILES as TORCHAO_PROFILES

#: ``quantization_config.quant_method`` values read.
QUANT_METHODS = ("quark", "torchao")
#: Quark element dtype -> (mxsim format, the safetensors dtype of its stored codes).
QUARK_ELEMENTS = {
    "fp8_e4m3": ("fp8_e4m3", "F8_E4M3"),
    "fp8_e5m2": ("fp8_e5m2", "F8_E5M2"),
    "fp4": ("fp4_e2m1", "U8"),
}
#: torchao element dtype (torch dtype name) -> (mxsim format, safetensors dtype of qdata).
TORCHAO_ELEMENTS = {
    "float8_e4m3fn": ("fp8_e4m3", "F8_E4M3"),
    "float8_e5m2": ("fp8_e5m2", "F8_E5M2"),
    "float4_e2m1fn_x2": ("fp4_e2m1", "U8"),
}
#: Safetensors dtypes of E8M0 scale codes.
SCALE_DTYPES = ("U8", "F8_E8M0")
#: Float dtypes a checkpoint's other tensors may have (the model is built in that dtype).
FLOAT_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
WEIGHTS_FILE = "model.safetensors"


@dataclass
class StoredLinear:
    """One quantized Linear of a checkpoint: ``key`` (its module path in the file), the
    weight's spec (with the stored scale codes), its exact values, and the input's
    quantization (format, block size, profile, options) or None. ``origin`` says where it
    was read from."""

    key: str
    weight_spec: MXQuant | NVFP4Quant
    weight: np.ndarray
    input_quant: tuple | None
    origin: str

    def input_spec(self, ndim: int) -> MXQuant | None:
        if self.input_quant is None:
            return None
        fmt, block, profile, options = self.input_quant
        return MXQuant(fmt, ndim - 1, block, profile, options)


@dataclass
class Checkpoint:
    """A quantized checkpoint as read: ``library`` (quark or torchao), ``tensors`` (name ->
    torch tensor, every tensor of the file with each quantized weight replaced by its exact
    values under ``<module>.weight``), ``dtype`` (the float dtype of the model, a torch dtype
    name), ``linears`` (module key -> :class:`StoredLinear`)."""

    library: str
    tensors: dict
    dtype: str
    linears: dict


def _fail(where, message: str):
    raise MxsimError(f"{where}: {message}")


def _header(file: Path) -> tuple[dict, dict]:
    """(tensor name -> {dtype, shape}, metadata) of a safetensors file, from its JSON header."""
    safetensors = require("safetensors")
    try:
        with safetensors.safe_open(str(file), framework="pt") as handle:
            metadata = handle.metadata() or {}
            names = list(handle.keys())
            info = {}
            for name in names:
                sliced = handle.get_slice(name)
                info[name] = {"dtype": sliced.get_dtype(), "shape": tuple(sliced.get_shape())}
    except Exception as error:  # SafetensorError, OSError: an unreadable file
        _fail(file, f"unreadable safetensors weights ({type(error).__name__}: {error})")
    return info, metadata


def _load(file: Path) -> dict:
    safetensors_torch = require("safetensors.torch")
    return safetensors_torch.load_file(str(file), device="cpu")


def _is_torchao(metadata: dict) -> bool:
    return "tensor_names" in metadata


def read_checkpoint(path: Path, config: dict) -> Checkpoint | None:
    """The quantized checkpoint in model directory ``path`` (its ``config.json`` already read
    as ``config``), or None for a model that is not quantized (no ``quantization_config``, no
    torchao metadata in ``model.safetensors``). Raises MxsimError (one line naming the file
    and key) for a quantized checkpoint mxsim does not read."""
    quantization = config.get("quantization_config")
    file = path / WEIGHTS_FILE
    if quantization is None:
        if not file.is_file():
            return None
        _, metadata = _header(file)
        return _read_torchao(file) if _is_torchao(metadata) else None
    config_file = path / "config.json"
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    if method not in QUANT_METHODS:
        _fail(
            config_file,
            f"quantization_config.quant_method {shown(method)} is not read; accepted: "
            f"{', '.join(QUANT_METHODS)} (or a model without quantization_config)",
        )
    if not file.is_file():
        _fail(
            path,
            f"a {method} checkpoint is read from {WEIGHTS_FILE}; this directory has none "
            "(pickled torch checkpoints of quantized models are not read)",
        )
    if method == "torchao":
        _, metadata = _header(file)
        if not _is_torchao(metadata):
            _fail(
                file,
                "quant_method torchao, but the file has no torchao metadata (tensor_names); "
                "accepted: a state dict written with torchao's flatten_tensor_state_dict",
            )
        return _read_torchao(file)
    return _read_quark(path, config_file, quantization, file)


# ---------------------------------------------------------------------------- Quark


def _quark_spec(spec, key: str, config_file: Path, dynamic: bool):
    """(mxsim format, block size, profile) of a Quark quantization spec (a config mapping)."""
    where = f"{config_file}: quantization_config.global_quant_config.{key}"
    if not isinstance(spec, dict):
        _fail(where, f"expected a mapping, got {shown(spec)}")
    dtype = spec.get("dtype")
    checks = (
        ("dtype", dtype in QUARK_ELEMENTS, ", ".join(QUARK_ELEMENTS)),
        ("qscheme", spec.get("qscheme") == "per_group", "per_group"),
        ("scale_format", spec.get("scale_format") == "e8m0", "e8m0"),
        ("ch_axis", spec.get("ch_axis") in (-1, 1), "-1 (blocks along the input features)"),
        (
            "scale_calculation_mode",
            spec.get("scale_calculation_mode") in QUARK_PROFILES,
            ", ".join(QUARK_PROFILES),
        ),
        ("is_dynamic", spec.get("is_dynamic") is dynamic, str(dynamic).lower()),
        ("mx_element_dtype", spec.get("mx_element_dtype") is None, "null"),
    )
    for field, good, accepted in checks:
        if not good:
            _fail(
                where,
                f"{field} {shown(spec.get(field))} is not read; accepted: {accepted} "
                "(OCP MX fp8/fp4 with E8M0 scales)",
            )
    group = spec.get("group_size")
    if not isinstance(group, int) or isinstance(group, bool) or not 1 <= group <= 1 << 16:
        _fail(where, f"group_size must be a positive integer, got {shown(group)}")
    return QUARK_ELEMENTS[dtype][0], group, QUARK_PROFILES[spec["scale_calculation_mode"]]


def _read_quark(path: Path, config_file: Path, quantization: dict, file: Path) -> Checkpoint:
    export = quantization.get("export") or {}
    weight_format = export.get("weight_format") if isinstance(export, dict) else None
    if weight_format not in ("real_quantized", "fake_quantized"):
        _fail(
            config_file,
            f"quantization_config.export.weight_format {shown(weight_format)} is not read; "
            "accepted: real_quantized (export_safetensors' default), fake_quantized",
        )
    for key in ("layer_quant_config", "layer_type_quant_config", "kv_cache_quant_config"):
        if quantization.get(key):
            _fail(
                config_file,
                f"quantization_config.{key} is not read; accepted: one global_quant_config "
                "(with exclude)",
            )
    for key in ("algo_config", "softmax_quant_spec"):
        if quantization.get(key):
            _fail(config_file, f"quantization_config.{key} is not read; accepted: null")
    glob = quantization.get("global_quant_config")
    if not isinstance(glob, dict) or glob.get("weight") is None:
        _fail(
            config_file,
            "quantization_config.global_quant_config.weight is missing; accepted: an OCP MX "
            "weight spec",
        )
    for key in ("bias", "output_tensors"):
        if glob.get(key) is not None:
            _fail(
                config_file,
                f"quantization_config.global_quant_config.{key} is not read; accepted: null",
            )
    fmt, group, profile = _quark_spec(glob["weight"], "weight", config_file, dynamic=False)
    inputs = glob.get("input_tensors")
    input_quant = None
    if inputs is not None:
        in_fmt, in_group, in_profile = _quark_spec(inputs, "input_tensors", config_file, True)
        input_quant = (in_fmt, in_group, in_profile, {})
    info, _ = _header(file)
    code_dtype = (
        QUARK_ELEMENTS[glob["weight"]["dtype"]][1] if weight_format == "real_quantized" else None
    )
    for name in info:
        suffix = name.rsplit(".", 1)[-1]
        if suffix.endswith(("_scale", "_zero_point", "_scale_2")) and suffix != "weight_scale":
            _fail(
                file,
                f"tensor {shown(name)} is not read; accepted: <module>.weight and "
                "<module>.weight_scale of the quantized Linears",
            )
    tensors = _load(file)
    linears = {}
    for name in sorted(info):
        if not name.endswith(".weight_scale"):
            continue
        key = name[: -len(".weight_scale")]
        weight_name = f"{key}.weight"
        if weight_name not in info:
            _fail(file, f"{shown(name)} has no {shown(weight_name)}")
        linear = _decode(
            file,
            weight_name,
            name,
            info,
            tensors,
            fmt,
            code_dtype,
            group,
            profile,
            {},
            None,
            input_quant,
            "Quark",
        )
        linears[key] = linear
        del tensors[name]
        tensors[weight_name] = linear.weight
    if not linears:
        _fail(file, "quant_method quark, but no <module>.weight_scale tensor: nothing is quantized")
    return Checkpoint("quark", tensors, _float_dtype(file, info, tensors, linears), linears)


# ---------------------------------------------------------------------------- torchao


def _torchao_value(entry, where, key: str):
    """The plain value of a torchao metadata field (a torch dtype or enum: its ``_data``)."""
    value = entry.get(key) if isinstance(entry, dict) else None
    if isinstance(value, dict):
        value = value.get("_data")
    if value is None:
        _fail(where, f"metadata field {key} is missing")
    return value


def _read_torchao(file: Path) -> Checkpoint:
    info, metadata = _header(file)
    try:
        names = json.loads(metadata["tensor_names"])
        described = {name: json.loads(metadata[name]) for name in names}
    except (KeyError, TypeError, ValueError) as error:
        _fail(file, f"torchao metadata is unreadable ({type(error).__name__}: {error})")
    tensors = _load(file)
    linears = {}
    for name, entry in described.items():
        kind = entry.get("_type") if isinstance(entry, dict) else None
        if kind in ("Tensor", "torch.Tensor"):  # a plain tensor
            continue
        where = f"{file}: {shown(name)}"
        if kind not in ("MXTensor", "NVFP4Tensor"):
            _fail(
                where,
                f"a torchao {shown(kind)} is not read; accepted: MXTensor weights "
                "(MXDynamicActivationMXWeightConfig), weight-only NVFP4Tensor weights "
                "(NVFP4WeightOnlyConfig) and plain tensors",
            )
        data = entry.get("_data") or {}
        if kind == "NVFP4Tensor":
            linear = _read_nvfp4(file, name, data, info, tensors, where)
            linears[linear.key] = linear
            tensors[name] = linear.weight
            continue
        element = _torchao_value(data, where, "elem_dtype")
        if element not in TORCHAO_ELEMENTS:
            _fail(
                where,
                f"element dtype {shown(element)} is not read; accepted: {', '.join(TORCHAO_ELEMENTS)}",
            )
        block = _torchao_value(data, where, "block_size")
        act = data.get("act_quant_kwargs")
        if not isinstance(act, dict) or not isinstance(act.get("_data"), dict):
            _fail(where, "an MXTensor without activation quantization is not read")
        act = act["_data"]
        mode = str(_torchao_value(act, where, "scaling_mode")).lower()
        act_element = _torchao_value(act, where, "elem_dtype")
        if mode not in TORCHAO_PROFILES or act_element not in TORCHAO_ELEMENTS:
            _fail(
                where,
                f"activation quantization {shown(act_element)} {shown(mode)} is not read; "
                f"accepted: elements {', '.join(TORCHAO_ELEMENTS)}, scaling modes "
                f"{', '.join(m.upper() for m in TORCHAO_PROFILES)}",
            )
        profile, options = TORCHAO_PROFILES[mode]
        key, _, leaf = name.rpartition(".")
        qdata, scale = f"{key}._{leaf}_qdata", f"{key}._{leaf}_scale"
        if leaf != "weight":
            _fail(where, "an MXTensor that is not a Linear's weight is not read")
        swizzled = bool(data.get("is_swizzled_scales"))
        fmt, code_dtype = TORCHAO_ELEMENTS[element]
        act_fmt = TORCHAO_ELEMENTS[act_element][0]
        linear = _decode(
            file,
            qdata,
            scale,
            info,
            tensors,
            fmt,
            code_dtype,
            block,
            profile,
            options,
            swizzled,
            (act_fmt, int(_torchao_value(act, where, "block_size")), profile, options),
            "torchao",
        )
        linears[key] = linear
        del tensors[qdata], tensors[scale]
        tensors[name] = linear.weight
    if not linears:
        _fail(file, "torchao metadata, but no MXTensor or NVFP4Tensor weight: nothing is quantized")
    return Checkpoint("torchao", tensors, _float_dtype(file, info, tensors, linears), linears)


#: torchao NVFP4's block size (its UE4M3 scales, one per 16 inputs).
NVFP4_BLOCK = 16


def _read_nvfp4(file, name, data, info, tensors, where) -> StoredLinear:
    """A weight-only ``NVFP4Tensor`` Linear weight ``name``: its packed FP4 codes, UE4M3 scale
    codes (unblocked where swizzled) and optional float32 tensor scale, decoded to torchao's
    dequantization in the weight's ``orig_dtype``; the tensors read are removed from
    ``tensors``."""
    torch = require("torch")
    key, _, leaf = name.rpartition(".")
    if leaf != "weight":
        _fail(where, "an NVFP4Tensor that is not a Linear's weight is not read")
    if data.get("act_quant_kwargs") is not None:
        _fail(
            where,
            "an NVFP4Tensor with activation quantization is not read; accepted: weight-only "
            "NVFP4Tensor weights (NVFP4WeightOnlyConfig)",
        )
    block = _torchao_value(data, where, "block_size")
    dtype = str(_torchao_value(data, where, "orig_dtype")).removeprefix("torch.")
    if block != NVFP4_BLOCK or dtype not in NVFP4_DEQUANTIZED:
        _fail(
            where,
            f"NVFP4 block size {shown(block)}, orig_dtype {shown(dtype)} is not read; accepted: "
            f"block size {NVFP4_BLOCK}, orig_dtype {', '.join(NVFP4_DEQUANTIZED)}",
        )
    qdata, scale, tensor = (
        f"{key}._{leaf}_{part}" for part in ("qdata", "scale", "per_tensor_scale")
    )
    for needed in (qdata, scale):
        if needed not in info:
            _fail(file, f"{shown(needed)} is missing; an NVFP4Tensor weight stores it")
    weight_info, scale_info = info[qdata], info[scale]
    if weight_info["dtype"] != "U8" or len(weight_info["shape"]) != 2:
        _fail(
            file,
            f"{shown(qdata)} is {weight_info['dtype']} {list(weight_info['shape'])}; NVFP4 codes "
            "are a 2-d U8 tensor (two FP4 codes a byte)",
        )
    rows, cols = weight_info["shape"][0], 2 * weight_info["shape"][1]
    if cols % NVFP4_BLOCK:
        _fail(file, f"{shown(qdata)}: {cols} input features are not whole blocks of {NVFP4_BLOCK}")
    blocks = cols // NVFP4_BLOCK
    swizzled = bool(data.get("is_swizzled_scales"))
    expected = (32 * -(-rows // 128), 16 * -(-blocks // 4)) if swizzled else (rows, blocks)
    if scale_info["dtype"] != "F8_E4M3" or int(np.prod(scale_info["shape"])) != int(
        np.prod(expected)
    ):
        _fail(
            file,
            f"{shown(scale)} is {scale_info['dtype']} {list(scale_info['shape'])}; the scales of "
            f"{shown(name)} are UE4M3 codes (F8_E4M3) of shape {list(expected)}",
        )
    tensor_scale = None
    if tensor in info:
        if info[tensor]["dtype"] != "F32" or int(np.prod(info[tensor]["shape"])) != 1:
            _fail(file, f"{shown(tensor)} is not one F32 value (the NVFP4 tensor scale)")
        tensor_scale = float(tensors.pop(tensor).reshape(()).item())
    raw = tensors.pop(qdata).contiguous().view(torch.uint8).numpy()
    codes = unpack_codes(raw, 4, rows * cols).reshape(rows, cols)
    scales = tensors.pop(scale).contiguous().view(torch.uint8).numpy().copy()
    scales = unblock_scales(scales, rows, blocks) if swizzled else scales.reshape(rows, blocks)
    try:
        spec = NVFP4Quant(1, scales, tensor_scale, "torchao", NVFP4_DEQUANTIZED[dtype])
        options = NVFP4_PROFILES[spec.profile]
        exact = NVFP4Tensor(codes, scales, tensor_scale, options).dequantize()  # fl(e * fl(t * s))
        with np.errstate(invalid="ignore"):
            values = spec.fake_quantize(exact)  # rounded once to orig_dtype, as torchao's
            again = spec.quantize(values)
    except MxsimError as error:
        _fail(file, f"{shown(qdata)}: {error}")
    if not np.array_equal(again.codes, codes):
        count = int((again.codes != codes).sum())
        _fail(
            file,
            f"{shown(qdata)}: {count} element codes do not re-encode to themselves at the "
            "stored scales (NaN scales or non-canonical codes); not read",
        )
    origin = f"torchao checkpoint {file.name}: {qdata}, {scale}" + (
        f", {tensor}" if tensor_scale is not None else ""
    )
    return StoredLinear(key, spec, values.astype(np.float64), None, origin)


def unblock_scales(blocked: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Scale codes (rows, cols) from cuBLAS's block-scaling-factor layout (tiles of 128 rows x
    4 columns, padded, each tile's 512 bytes in the order row % 32, row // 32 (of its 4
    32-row quarters), column), which torchao's swizzled MXTensor scales use."""
    row_tiles, col_tiles = -(-rows // 128), -(-cols // 4)
    tiles = blocked.reshape(row_tiles, col_tiles, 32, 4, 4)
    padded = tiles.transpose(0, 3, 2, 1, 4).reshape(row_tiles * 128, col_tiles * 4)
    return np.ascontiguousarray(padded[:rows, :cols])


# ---------------------------------------------------------------------------- decoding


def _decode(
    file,
    weight_name,
    scale_name,
    info,
    tensors,
    fmt,
    code_dtype,
    block,
    profile,
    options,
    swizzled,
    input_quant,
    library,
) -> StoredLinear:
    """A quantized Linear weight's codes and scales checked against the spec and decoded
    (``code_dtype`` None: Quark's ``fake_quantized`` layout, float weights quantized here at
    the stored float scales)."""
    if code_dtype is None:
        return _fake_quantized(
            file, weight_name, scale_name, info, tensors, fmt, block, profile, input_quant
        )
    torch = require("torch")
    weight_info, scale_info = info[weight_name], info[scale_name]
    element = get_format(fmt)
    packed = element.bits < 8
    if weight_info["dtype"] != code_dtype or len(weight_info["shape"]) != 2:
        _fail(
            file,
            f"{shown(weight_name)} is {weight_info['dtype']} {list(weight_info['shape'])}; a "
            f"{library} {fmt} weight is a 2-d {code_dtype} tensor",
        )
    rows, stored_cols = weight_info["shape"]
    cols = stored_cols * (8 // element.bits) if packed else stored_cols
    if cols % block:
        _fail(file, f"{shown(weight_name)}: {cols} input features are not whole blocks of {block}")
    blocks = cols // block
    expected = (32 * -(-rows // 128), 16 * -(-blocks // 4)) if swizzled else (rows, blocks)
    scale_shape = scale_info["shape"]
    if scale_info["dtype"] not in SCALE_DTYPES or (
        tuple(scale_shape) != expected
        and not (swizzled and int(np.prod(scale_shape)) == expected[0] * expected[1])
    ):
        _fail(
            file,
            f"{shown(scale_name)} is {scale_info['dtype']} {list(scale_shape)}; the scales of "
            f"{shown(weight_name)} are E8M0 codes ({' or '.join(SCALE_DTYPES)}) of shape "
            f"{list(expected)}",
        )
    raw = tensors[weight_name].contiguous().view(torch.uint8).numpy()
    codes = (
        unpack_codes(raw, element.bits, rows * cols).reshape(rows, cols) if packed else raw.copy()
    )
    scales = tensors[scale_name].contiguous().view(torch.uint8).numpy().copy()
    scales = unblock_scales(scales, rows, blocks) if swizzled else scales.reshape(rows, blocks)
    opts = resolve_options(profile, **options)
    stored = MXTensor(element, codes, scales, (rows, cols), 1, block, 0, opts)
    values = stored.dequantize(np.float64)
    spec = MXQuant(fmt, 1, block, profile, options, scales=scales)
    # the trace's weight is these values at these scales: their codes must come back
    again = spec.quantize(values)
    if not np.array_equal(again.codes, codes):
        count = int((again.codes != codes).sum())
        _fail(
            file,
            f"{shown(weight_name)}: {count} element codes do not re-encode to themselves "
            f"at the stored scales (NaN or non-canonical codes); not read",
        )
    origin = f"{library} checkpoint {file.name}: {weight_name}, {scale_name}"
    return StoredLinear(weight_name.rpartition(".")[0], spec, values, input_quant, origin)


def _fake_quantized(
    file, weight_name, scale_name, info, tensors, fmt, block, profile, input_quant
) -> StoredLinear:
    """A weight of Quark's ``fake_quantized`` export: the float weight and its scales as float
    powers of two (2^-127..2^127, one per block); its codes are the weight quantized at those
    scales by the profile's element rounding (what Quark's quantizer computes with them)."""
    weight_info, scale_info = info[weight_name], info[scale_name]
    shape = weight_info["shape"]
    if weight_info["dtype"] not in FLOAT_DTYPES or len(shape) != 2 or shape[1] % block:
        _fail(
            file,
            f"{shown(weight_name)} is {weight_info['dtype']} {list(shape)}; a fake_quantized "
            f"weight is a 2-d float tensor of whole blocks of {block}",
        )
    rows, cols = shape
    if scale_info["dtype"] not in FLOAT_DTYPES or tuple(scale_info["shape"]) != (
        rows,
        cols // block,
    ):
        _fail(
            file,
            f"{shown(scale_name)} is {scale_info['dtype']} {list(scale_info['shape'])}; the scales "
            f"of a fake_quantized {shown(weight_name)} are floats of shape {[rows, cols // block]}",
        )
    mantissa, exponent = np.frexp(tensors[scale_name].double().numpy())
    if not ((mantissa == 0.5) & (exponent >= -126) & (exponent <= 128)).all():
        _fail(file, f"{shown(scale_name)}: scales are not powers of two 2^-127..2^127 (E8M0)")
    scales = (exponent - 1 + 127).astype(np.uint8)
    spec = MXQuant(fmt, 1, block, profile, scales=scales)
    try:
        quantized = spec.quantize(tensors[weight_name].float().numpy())
    except MxsimError as error:
        _fail(file, f"{shown(weight_name)}: {error}")
    origin = f"Quark checkpoint {file.name}: {weight_name}, {scale_name} (fake_quantized)"
    return StoredLinear(
        weight_name.rpartition(".")[0],
        spec,
        quantized.dequantize(np.float64),
        input_quant,
        origin,
    )


def _float_dtype(file, info, tensors, linears) -> str:
    """The float dtype of the checkpoint's other tensors (one), into which each decoded weight
    is put (exactly: refused where a value does not fit)."""
    torch = require("torch")
    dtypes = {
        info[name]["dtype"]
        for name in info
        if name in tensors and info[name]["dtype"] in FLOAT_DTYPES
    }
    if len(dtypes) > 1:
        _fail(file, f"float tensors of several dtypes ({', '.join(sorted(dtypes))}); one is read")
    dtype = FLOAT_DTYPES[dtypes.pop()] if dtypes else "float32"
    for linear in linears.values():
        name = f"{linear.key}.weight"
        value = torch.from_numpy(linear.weight).to(getattr(torch, dtype))
        if not np.array_equal(value.double().numpy(), linear.weight):
            _fail(file, f"{shown(name)}: decoded values do not fit {dtype} exactly; not read")
        tensors[name] = value
    return dtype


# ---------------------------------------------------------------------------- the model


_QUANTIZER_CLASS = None


def quantizer_class():
    """:class:`StoredQuantizer`, an ``nn.Module`` (defined on first use: torch is optional)."""
    global _QUANTIZER_CLASS
    if _QUANTIZER_CLASS is None:
        torch = require("torch")

        class StoredQuantizer(torch.nn.Module):
            """Quantizes one operand of a checkpoint's Linear as the library did: the weight at
            its stored scales (its values come back unchanged), the input by the library's
            dynamic rule. ``spec(ndim)`` is the operand's MXQuant; ``description`` says
            where it comes from."""

            def __init__(self, spec, description: str):
                super().__init__()
                self.spec, self.description = spec, description

            def forward(self, x):
                values = np.asarray(x.detach().float().cpu().numpy())
                quantized = self.spec(x.dim()).fake_quantize(values)
                return torch.from_numpy(np.asarray(quantized)).to(x.dtype)

            def __repr__(self) -> str:
                return f"StoredQuantizer({self.description})"

        _QUANTIZER_CLASS = StoredQuantizer
    return _QUANTIZER_CLASS


def is_stored_quantizer(module) -> bool:
    return _QUANTIZER_CLASS is not None and isinstance(module, _QUANTIZER_CLASS)


def _quantized_forward(module):
    functional = require("torch").nn.functional

    def forward(x):
        weight = module.mxsim_weight_quantizer(module.weight)
        if module.mxsim_input_quantizer is not None:
            x = module.mxsim_input_quantizer(x)
        return functional.linear(x, weight, module.bias)

    return forward


def install(model, checkpoint: Checkpoint, where) -> None:
    """Put the checkpoint's quantization on ``model`` (built by transformers from the decoded
    tensors): each quantized Linear (found by its key, or a key with a prefix such as
    ``bert.``) gets a weight and an input :class:`StoredQuantizer` and computes through
    them. Refused (one line naming ``where``): a key that is no Linear of the model, or a
    Linear whose weight is not the decoded weight."""
    torch = require("torch")
    quantizer = quantizer_class()
    modules = dict(model.named_modules())
    for key, linear in checkpoint.linears.items():
        found = [n for n in modules if n == key or n.endswith("." + key)]
        module = modules[found[0]] if len(found) == 1 else None
        if not isinstance(module, torch.nn.Linear):
            _fail(
                where,
                f"quantized weight {shown(key + '.weight')} is no Linear of the model "
                f"({len(found)} modules match); accepted: the quantized Linears of the model "
                "config.json builds",
            )
        decoded = torch.from_numpy(linear.weight).to(module.weight.dtype)
        if tuple(module.weight.shape) != tuple(decoded.shape) or not torch.equal(
            module.weight.detach(), decoded
        ):
            _fail(where, f"the model's {key}.weight is not the checkpoint's decoded weight")
        spec = linear.weight_spec
        module.mxsim_weight_quantizer = quantizer(
            lambda _ndim, spec=spec: spec, f"weight: {linear.origin}"
        )
        module.mxsim_input_quantizer = (
            None
            if linear.input_quant is None
            else quantizer(
                linear.input_spec,
                f"input: dynamic {checkpoint.library} {linear.input_quant[0]} block "
                f"{linear.input_quant[1]} ({linear.input_quant[2]})",
            )
        )
        module.forward = _quantized_forward(module)
