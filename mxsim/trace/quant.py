"""Quantization specs recorded for each GEMM operand of a trace layer.

A spec says how the source model quantized (or how the user wants replay to quantize) one
operand tensor of a layer, in that tensor's own layout (``axis`` indexes the operand as
stored in the trace, not the GEMM view; :mod:`mxsim.replay.lowering` maps it):

* :class:`MXQuant` — OCP MX block quantization by :func:`mxsim.quantize_mx` (element format,
  block axis and size, profile and option overrides).
* :class:`BFPQuant` — Quark block floating point / microexponents (MX4, MX6, MX9, BFP16)
  by :func:`mxsim.quantize_bfp`.
* :class:`NVFP4Quant` — NVFP4 (FP4 elements, a UE4M3 scale per 16, a float32 tensor scale)
  by :func:`mxsim.quantize_nvfp4`, at the library's stored scales.
* :class:`QDQQuant` — ONNX ``QuantizeLinear``/``DequantizeLinear`` (per-tensor, per-axis or
  blocked scale and zero point).

Each spec serialises to a plain mapping (``to_manifest``) for the trace manifest; QDQ scale
and zero-point arrays travel in the layer's NPZ file. ``fake_quantize(x)`` applies the spec
and returns the dequantized values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..errors import MxsimError
from ..formats import get_format
from ..limits import is_integer
from ..quantize import (
    BFP_SPECS,
    BFPSpec,
    MXTensor,
    fake_quantize,
    quantize,
    quantize_at_scales,
    quantize_bfp,
    quantize_nvfp4,
    quantize_nvfp4_at_scales,
)
from ..quantize.nvfp4 import NVFP4_PROFILES
from ..quantize.mx import UNDERFLOW_ZERO_SIGNS, sign_zeros
from ..quantize.options import resolve_options

SPEC_KINDS = ("mx", "bfp", "qdq", "nvfp4")
#: The dtypes an NVFP4 spec's library dequantizes into (its float32 values, rounded once).
NVFP4_DEQUANTIZED = ("float32", "bfloat16")

#: ONNX QuantizeLinear integer output types and their [min, max].
QDQ_INTEGER_RANGES = {
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int16": (-32768, 32767),
    "uint16": (0, 65535),
    "int32": (-(2**31), 2**31 - 1),
    "int4": (-8, 7),
    "uint4": (0, 15),
    "int2": (-2, 1),
    "uint2": (0, 3),
}
#: ONNX QuantizeLinear float output types (recorded; fake_quantize is modelled for those in
#: QDQ_FLOAT_ELEMENTS only).
QDQ_FLOAT_TYPES = (
    "float8e4m3fn",
    "float8e4m3fnuz",
    "float8e5m2",
    "float8e5m2fnuz",
    "float4e2m1",
    "float8e8m0",
)
#: ONNX float QDQ types whose values are an mxsim element format's (OCP FP8: E4M3 without
#: Inf, largest 448; E5M2 with Inf, largest 57344).
QDQ_FLOAT_ELEMENTS = {"float8e4m3fn": "fp8_e4m3", "float8e5m2": "fp8_e5m2"}


def _plain_option(value):
    """Option values as hashable Python data (YAML gives lists where QuantOptions wants tuples)."""
    if isinstance(value, list):
        return tuple(_plain_option(v) for v in value)
    return value


def _check_axis(axis, what: str) -> None:
    if axis is not None and not is_integer(axis):
        raise MxsimError(f"{what}: axis must be an int or None, got {axis!r}")


class _BlockSpec:
    """What MX and BFP specs share: an operand axis set later, and Quark's one-element bypass.
    ``_WHAT`` names the spec in errors; ``_BYPASS_DTYPE`` is the dtype a bypassed tensor is
    returned in (the subclass's ``fake_quantize`` output dtype)."""

    _WHAT = ""
    _BYPASS_DTYPE = np.float64

    def with_axis(self, axis: int):
        return dataclasses.replace(self, axis=axis)

    def _bypassed(self, x: np.ndarray) -> np.ndarray | None:
        """``x`` unchanged where the spec leaves it so (one element, bypass set), else None;
        an unresolved axis is refused."""
        if self.axis is None:
            raise MxsimError(
                f"{self._WHAT}: axis is unresolved (None); attach the spec to a layer first"
            )
        if self.bypass_single_element and x.size == 1:
            return np.asarray(x, dtype=self._BYPASS_DTYPE).copy()
        return None


@dataclass(frozen=True)
class MXQuant(_BlockSpec):
    """MX quantization of one operand: ``mxsim.quantize_mx(x, format, axis, block_size, profile, **options)``.

    * ``format``: element format name (canonical, as :func:`mxsim.get_format` names it).
    * ``axis``: the operand's axis the blocks run along; None means "the operand's reduction
      axis" and is resolved when a capture attaches the spec to a layer.
    * ``block_size``: elements per block; ``profile``: a key of ``mxsim.PROFILES``;
      ``options``: overrides of the profile's fields, as sorted (name, value) pairs.
    * ``bypass_single_element``: a tensor with exactly one element is left unquantized
      (Quark's ONNX op wrapper does this; see docs/profiles.md).
    * ``scales``: None, or the model's own E8M0 scale codes (uint8, in the quantized layout
      of :class:`mxsim.MXTensor`: the operand's shape with ``axis`` moved last, one code per
      block), used instead of the profile's scale rule (:func:`mxsim.quantize.quantize_at_scales`):
      a library that stores its quantized weights (torchao) may hold values whose scale the
      rule, applied to the values, would choose differently. Stored in the layer's NPZ;
      not compared by ``==``.
    """

    format: str
    axis: int | None = None
    block_size: int = 32
    profile: str = "ocp"
    options: tuple = ()
    bypass_single_element: bool = False
    scales: np.ndarray | None = field(default=None, compare=False)

    kind = "mx"
    _WHAT = "MX spec"

    def __post_init__(self):
        object.__setattr__(self, "format", get_format(self.format).name)
        _check_axis(self.axis, "MX spec")
        if not is_integer(self.block_size) or self.block_size < 1:
            raise MxsimError(f"MX spec: block_size must be a positive int, got {self.block_size!r}")
        options = self.options.items() if isinstance(self.options, dict) else self.options
        pairs = tuple(sorted((str(k), _plain_option(v)) for k, v in options))
        object.__setattr__(self, "options", pairs)
        resolve_options(self.profile, **dict(pairs))  # validates profile and option names/values
        if self.scales is not None and (
            not isinstance(self.scales, np.ndarray) or self.scales.dtype != np.uint8
        ):
            raise MxsimError("MX spec: scales must be a uint8 numpy array of E8M0 codes, or None")

    def quantize(self, x: np.ndarray) -> MXTensor:
        """``x`` quantized along ``axis`` (at the given ``scales``, if any)."""
        if self.axis is None:
            raise MxsimError(
                f"{self._WHAT}: axis is unresolved (None); attach the spec to a layer first"
            )
        if self.scales is not None:
            return quantize_at_scales(
                x,
                self.format,
                self.scales,
                axis=self.axis,
                block_size=self.block_size,
                profile=self.profile,
                **dict(self.options),
            )
        return quantize(
            x,
            self.format,
            axis=self.axis,
            block_size=self.block_size,
            profile=self.profile,
            **dict(self.options),
        )

    def fake_quantize(self, x: np.ndarray) -> np.ndarray:
        """Quantize then dequantize along ``axis`` (float64, exact values; see mxsim.fake_quantize;
        with ``scales``, the given scales' :meth:`quantize` dequantized)."""
        bypassed = self._bypassed(x)
        if bypassed is not None:
            return bypassed
        if self.scales is not None:
            return self._zero_signs(x, self.quantize(x).dequantize(np.float64))
        return fake_quantize(
            x,
            self.format,
            axis=self.axis,
            block_size=self.block_size,
            profile=self.profile,
            **dict(self.options),
        )

    def _zero_signs(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out`` (``x`` quantized at ``scales``, dequantized) with its zeros signed as the
        ``zero_signs`` option says for the format (as :func:`mxsim.fake_quantize` does)."""
        opts = resolve_options(self.profile, **dict(self.options))
        rule = dict(opts.zero_signs).get(self.format, "code")
        if rule == "code":
            return out
        values = np.asarray(x, dtype=np.float64)
        exponents = None
        if rule in UNDERFLOW_ZERO_SIGNS:
            exponents = np.repeat(self.scales.astype(np.int64) - 127, self.block_size, axis=-1)
            exponents = np.moveaxis(exponents[..., : values.shape[self.axis]], -1, self.axis)
        return sign_zeros(out, values, exponents, rule, get_format(self.format))

    def to_manifest(self, operand: str | None = None) -> dict:
        """The manifest mapping; a spec with ``scales`` names its NPZ array, which needs the operand."""
        entry = {
            "kind": "mx",
            "format": self.format,
            "axis": self.axis,
            "block_size": int(self.block_size),
            "profile": self.profile,
            "options": {k: _yaml_option(v) for k, v in self.options},
        }
        if self.bypass_single_element:
            entry["bypass_single_element"] = True
        if self.scales is not None:
            if operand is None:
                raise MxsimError("MX spec: a spec with scales is written with its operand's name")
            entry["scales"] = f"quant.{operand}.scales"
        return entry

    def arrays(self, operand: str) -> dict[str, np.ndarray]:
        """The arrays this spec stores in its layer's NPZ, by NPZ key."""
        return {} if self.scales is None else {f"quant.{operand}.scales": self.scales}


def _yaml_option(value):
    if isinstance(value, tuple):
        return [_yaml_option(v) for v in value]
    return value


@dataclass(frozen=True)
class BFPQuant(_BlockSpec):
    """Quark BFP / microexponent quantization of one operand: ``mxsim.quantize_bfp(x, spec, axis)``.

    ``spec`` is a :class:`mxsim.BFPSpec` (method, bit width, block and sub-block sizes,
    shift bits, rounding mode, which Quark kernel's semantics). ``axis`` as in :class:`MXQuant`.
    """

    spec: BFPSpec
    axis: int | None = None
    bypass_single_element: bool = False

    kind = "bfp"
    _WHAT = "BFP spec"
    _BYPASS_DTYPE = np.float32

    def __post_init__(self):
        if isinstance(self.spec, str):
            name = self.spec.upper()
            if name not in BFP_SPECS:
                raise MxsimError(
                    f"BFP spec: unknown name {self.spec!r}; accepted: {', '.join(BFP_SPECS)}"
                )
            object.__setattr__(self, "spec", BFP_SPECS[name])
        if not isinstance(self.spec, BFPSpec):
            raise MxsimError(
                f"BFP spec: expected a BFPSpec or a name, got {type(self.spec).__name__}"
            )
        _check_axis(self.axis, "BFP spec")

    @property
    def name(self) -> str | None:
        """MX4/MX6/MX9/BFP16 when the layout parameters match a named spec (rounding mode,
        kernel and seed aside), else None."""
        for name, named in BFP_SPECS.items():
            if (
                named.method,
                named.bit_width,
                named.block_size,
                named.sub_block_size,
                named.sub_block_shift_bits,
            ) == (
                self.spec.method,
                self.spec.bit_width,
                self.spec.block_size,
                self.spec.sub_block_size,
                self.spec.sub_block_shift_bits,
            ):
                return name
        return None

    def fake_quantize(self, x: np.ndarray) -> np.ndarray:
        """Quantize then dequantize (float32, bit-identical to Quark's op output)."""
        bypassed = self._bypassed(x)
        if bypassed is not None:
            return bypassed
        return quantize_bfp(np.asarray(x), self.spec, axis=self.axis).dequantize()

    def to_manifest(self) -> dict:
        s = self.spec
        entry = {
            "kind": "bfp",
            "name": self.name,
            "axis": self.axis,
            "method": s.method,
            "bit_width": s.bit_width,
            "block_size": s.block_size,
            "sub_block_size": s.sub_block_size,
            "sub_block_shift_bits": s.sub_block_shift_bits,
            "rounding_mode": s.rounding_mode,
            "kernel": s.kernel,
            "seed": s.seed,
        }
        if s.flushed_zero_sign != "input":
            entry["flushed_zero_sign"] = s.flushed_zero_sign
        if self.bypass_single_element:
            entry["bypass_single_element"] = True
        return entry


@dataclass(frozen=True, eq=False)
class QDQQuant:
    """ONNX ``QuantizeLinear`` → ``DequantizeLinear`` of one operand.

    ``y = (saturate(round_half_even(x / scale) + zero_point) - zero_point) * scale`` with the
    scale and zero point broadcast per ONNX: ``axis`` None = per-tensor (scalar scale);
    ``block_size`` 0 = per-axis (1-d scale along ``axis``); ``block_size`` b > 0 = blocked
    (scale has x's shape with ``ceil(dim/b)`` along ``axis``; element i uses scale i // b).
    ``dtype`` is the quantized type's ONNX name in lower case (``int8``, ``uint8``,
    ``float8e4m3fn``...). ``zero_point`` is None when the model gave none (0).
    ``reciprocal`` (integer types): ``round_half_even(x * fl(1 / scale))`` instead of
    ``x / scale``, in float32, as torch's ``fake_quantize_per_tensor_affine`` /
    ``_per_channel_affine`` (and Quark torch's integer quantizers) compute it; the two differ
    where the product rounds across a half.
    """

    dtype: str
    scale: np.ndarray
    zero_point: np.ndarray | None = None
    axis: int | None = None
    block_size: int = 0
    saturate: bool = True
    reciprocal: bool = False

    kind = "qdq"

    def __post_init__(self):
        if self.dtype not in QDQ_INTEGER_RANGES and self.dtype not in QDQ_FLOAT_TYPES:
            raise MxsimError(
                f"QDQ spec: unknown quantized type {self.dtype!r}; accepted: "
                f"{', '.join([*QDQ_INTEGER_RANGES, *QDQ_FLOAT_TYPES])}"
            )
        _check_axis(self.axis, "QDQ spec")
        if not is_integer(self.block_size) or self.block_size < 0:
            raise MxsimError(f"QDQ spec: block_size must be an int >= 0, got {self.block_size!r}")
        if not isinstance(self.scale, np.ndarray) or self.scale.dtype.kind != "f":
            raise MxsimError("QDQ spec: scale must be a float numpy array")
        if self.zero_point is not None and (
            not isinstance(self.zero_point, np.ndarray) or self.zero_point.shape != self.scale.shape
        ):
            raise MxsimError("QDQ spec: zero_point must be a numpy array with the scale's shape")
        if self.scale.size > 1 and self.axis is None:
            raise MxsimError("QDQ spec: a scale with more than one element needs an axis")
        if not isinstance(self.reciprocal, bool) or (
            self.reciprocal and self.dtype not in QDQ_INTEGER_RANGES
        ):
            raise MxsimError(
                f"QDQ spec: reciprocal must be true or false, and true only for integer types, "
                f"got {self.reciprocal!r} for {self.dtype}"
            )

    def with_axis(self, axis: int) -> QDQQuant:
        return dataclasses.replace(self, axis=axis)

    def _broadcast(self, values: np.ndarray, x: np.ndarray) -> np.ndarray:
        if values.size == 1 and self.block_size == 0:
            return values.reshape(())
        axis = self.axis % x.ndim
        if self.block_size == 0:
            shape = [1] * x.ndim
            shape[axis] = -1
            return values.reshape(shape)
        return np.repeat(values, self.block_size, axis=axis).take(
            np.arange(x.shape[axis]), axis=axis
        )

    def fake_quantize(self, x: np.ndarray) -> np.ndarray:
        """Quantize-dequantize (float32 values) as onnxruntime computes it for integer types:
        float32 division (``x * fl(1 / scale)`` with ``reciprocal``), round half to even,
        saturate, then (q - zero_point) * scale in float32. For the FP8 types of
        :data:`QDQ_FLOAT_ELEMENTS` as Quark torch's FP8 fake quantizer and onnxruntime compute
        it: float32 division ``x / scale``, clamped to ±the format's largest value when
        ``saturate`` (else IEEE overflow: E4M3 NaN, E5M2 ±Inf), rounded once to the format
        (nearest even; subnormals kept; a zero keeps the sign of ``x / scale``), times
        ``scale`` in float32. NaN stays NaN."""
        return self.levels(x)[1]

    def levels(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The quantized levels of ``x`` (float64: ``q - zero_point`` for integer types, the
        FP8 value for FP8 types) and the dequantized float32 values, levels times the scale
        (:meth:`fake_quantize`). An FP8 type needs a zero point of 0 (as ONNX requires)."""
        x32 = np.asarray(x, dtype=np.float32)
        scale = self._broadcast(self.scale.astype(np.float32), x32)
        if self.dtype in QDQ_FLOAT_ELEMENTS:
            if self.zero_point is not None and self.zero_point.any():
                raise MxsimError(f"QDQ spec: {self.dtype} needs a zero point of 0")
            fmt = get_format(QDQ_FLOAT_ELEMENTS[self.dtype])
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                scaled = (x32 / scale).astype(np.float32)
                if self.saturate:
                    top = np.float32(fmt.max_finite)
                    scaled = np.clip(scaled, -top, top)
                overflow = "saturate" if self.saturate else "inf_nan"
                levels = fmt.decode(fmt.encode(scaled, "nearest_even", overflow))
                return levels, (levels.astype(np.float32) * scale).astype(np.float32)
        if self.dtype not in QDQ_INTEGER_RANGES:
            raise MxsimError(f"QDQ spec: fake_quantize is not modelled for {self.dtype}")
        low, high = QDQ_INTEGER_RANGES[self.dtype]
        zero = (
            0 if self.zero_point is None else self._broadcast(self.zero_point.astype(np.int64), x32)
        )
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            scaled = x32 * (np.float32(1) / scale) if self.reciprocal else x32 / scale
            q = np.clip(np.rint(scaled).astype(np.float64) + zero, low, high)
            levels = q - zero
            return levels, (levels.astype(np.float32) * scale).astype(np.float32)

    def to_manifest(self, operand: str) -> dict:
        entry = {
            "kind": "qdq",
            "dtype": self.dtype,
            "axis": self.axis,
            "block_size": int(self.block_size),
            "saturate": bool(self.saturate),
            "scale": f"quant.{operand}.scale",
            "zero_point": None if self.zero_point is None else f"quant.{operand}.zero_point",
        }
        if self.reciprocal:  # written only when set: an older mxsim refuses the key by name
            entry["reciprocal"] = True
        return entry

    def arrays(self, operand: str) -> dict[str, np.ndarray]:
        """The arrays this spec stores in its layer's NPZ, by NPZ key."""
        out = {f"quant.{operand}.scale": self.scale}
        if self.zero_point is not None:
            out[f"quant.{operand}.zero_point"] = self.zero_point
        return out


@dataclass(frozen=True, eq=False)
class NVFP4Quant:
    """NVFP4 quantization of one operand, as a library that stores NVFP4 tensors made it.

    * ``axis``: the operand's axis the blocks of 16 run along (None: the reduction axis,
      resolved when a capture attaches the spec to a layer).
    * ``scales``: None, or the stored UE4M3 block scale codes (uint8, the operand's shape with
      ``axis`` moved last and divided by the block size), used instead of the recipe's scale
      choice (:func:`mxsim.quantize.quantize_nvfp4_at_scales`); stored in the layer's NPZ.
    * ``tensor_scale``: the float32 tensor scale ``t`` (a positive finite float32 value), or
      None (single-level scaling).
    * ``profile``: a key of ``mxsim.NVFP4_PROFILES`` (element and scale formats, block size,
      roundings).
    * ``dequantized``: the dtype the library's dequantization rounds its float32 values
      ``fl(e * fl(t * s))`` into once (nearest even): ``float32`` or ``bfloat16``.
    """

    axis: int | None = None
    scales: np.ndarray | None = None
    tensor_scale: float | None = None
    profile: str = "torchao"
    dequantized: str = "float32"

    kind = "nvfp4"
    bypass_single_element = False

    def __post_init__(self):
        _check_axis(self.axis, "NVFP4 spec")
        if not isinstance(self.profile, str) or self.profile not in NVFP4_PROFILES:
            raise MxsimError(
                f"NVFP4 spec: unknown profile {self.profile!r}; accepted: {', '.join(NVFP4_PROFILES)}"
            )
        if self.dequantized not in NVFP4_DEQUANTIZED:
            raise MxsimError(
                f"NVFP4 spec: dequantized must be one of {', '.join(NVFP4_DEQUANTIZED)}, "
                f"got {self.dequantized!r}"
            )
        if self.scales is not None and (
            not isinstance(self.scales, np.ndarray) or self.scales.dtype != np.uint8
        ):
            raise MxsimError(
                "NVFP4 spec: scales must be a uint8 numpy array of UE4M3 codes, or None"
            )
        if self.tensor_scale is not None:
            t = self.tensor_scale
            real = isinstance(t, (int, float, np.floating)) and not isinstance(t, bool)
            if not real or not np.isfinite(t) or t <= 0 or float(np.float32(t)) != float(t):
                raise MxsimError(
                    f"NVFP4 spec: tensor_scale must be a positive finite float32 value or None, "
                    f"got {t!r}"
                )
            object.__setattr__(self, "tensor_scale", float(t))

    @property
    def block_size(self) -> int:
        return NVFP4_PROFILES[self.profile].block_size

    def with_axis(self, axis: int) -> NVFP4Quant:
        return dataclasses.replace(self, axis=axis)

    def quantize(self, x: np.ndarray):
        """``x`` (float32) quantized along ``axis`` (moved last): a :class:`mxsim.NVFP4Tensor`."""
        if self.axis is None:
            raise MxsimError(
                "NVFP4 spec: axis is unresolved (None); attach the spec to a layer first"
            )
        rows = np.moveaxis(np.asarray(x, dtype=np.float32), self.axis, -1)
        if self.scales is None:
            return quantize_nvfp4(rows, self.tensor_scale, self.profile)
        return quantize_nvfp4_at_scales(rows, self.scales, self.tensor_scale, self.profile)

    def fake_quantize(self, x: np.ndarray) -> np.ndarray:
        """Quantize, then dequantize as the library does: float32 ``fl(e * fl(t * s))``, rounded
        once to ``dequantized`` (returned as float32 values), in ``x``'s layout."""
        values = self.quantize(x).dequantize()
        if self.dequantized == "bfloat16":
            bf16 = get_format("bf16")
            values = bf16.decode(bf16.encode(values, "nearest_even")).astype(np.float32)
        return np.moveaxis(values, -1, self.axis % values.ndim)

    def to_manifest(self, operand: str | None = None) -> dict:
        entry = {
            "kind": "nvfp4",
            "axis": self.axis,
            "profile": self.profile,
            "tensor_scale": self.tensor_scale,
            "dequantized": self.dequantized,
        }
        if self.scales is not None:
            if operand is None:
                raise MxsimError(
                    "NVFP4 spec: a spec with scales is written with its operand's name"
                )
            entry["scales"] = f"quant.{operand}.scales"
        return entry

    def arrays(self, operand: str) -> dict[str, np.ndarray]:
        """The arrays this spec stores in its layer's NPZ, by NPZ key."""
        return {} if self.scales is None else {f"quant.{operand}.scales": self.scales}


QuantSpec = MXQuant | BFPQuant | QDQQuant | NVFP4Quant


def _stored_scales(entry: dict, arrays: dict[str, np.ndarray], operand: str) -> np.ndarray | None:
    """The stored scale codes an entry names (``quant.<operand>.scales``), or None."""
    if entry.get("scales") is None:
        return None
    if entry["scales"] != f"quant.{operand}.scales" or entry["scales"] not in arrays:
        raise MxsimError(
            f"scales must name the layer's array quant.{operand}.scales, got {entry['scales']!r}"
        )
    return arrays[entry["scales"]]


def spec_from_manifest(entry: dict, arrays: dict[str, np.ndarray], operand: str) -> QuantSpec:
    """Rebuild ``operand``'s spec from its manifest mapping (``arrays``: the layer's QDQ arrays).

    Raises MxsimError (or KeyError/TypeError for missing/mistyped keys, which the loader
    turns into TraceError) on anything invalid.
    """
    if not isinstance(entry, dict):
        raise MxsimError(f"expected a mapping, got {type(entry).__name__}")
    kind = entry.get("kind")
    if kind == "mx":
        unknown = set(entry) - {
            "kind",
            "format",
            "axis",
            "block_size",
            "profile",
            "options",
            "bypass_single_element",
            "scales",
        }
        if unknown:
            raise MxsimError(f"unknown keys {sorted(unknown, key=str)}")
        options = entry.get("options") or {}
        if not isinstance(options, dict):
            raise MxsimError("options must be a mapping")
        scales = _stored_scales(entry, arrays, operand)
        return MXQuant(
            entry["format"],
            entry["axis"],
            entry["block_size"],
            entry.get("profile", "ocp"),
            tuple(options.items()),
            bool(entry.get("bypass_single_element", False)),
            scales,
        )
    if kind == "bfp":
        unknown = set(entry) - {
            "kind",
            "name",
            "axis",
            "method",
            "bit_width",
            "block_size",
            "sub_block_size",
            "sub_block_shift_bits",
            "rounding_mode",
            "kernel",
            "seed",
            "flushed_zero_sign",
            "bypass_single_element",
        }
        if unknown:
            raise MxsimError(f"unknown keys {sorted(unknown, key=str)}")
        spec = BFPSpec(
            entry["method"],
            entry["bit_width"],
            entry["block_size"],
            entry["sub_block_size"],
            entry["sub_block_shift_bits"],
            entry.get("rounding_mode", 0),
            entry.get("kernel", "cpu"),
            entry.get("seed", 0),
            entry.get("flushed_zero_sign", "input"),
        )
        built = BFPQuant(spec, entry["axis"], bool(entry.get("bypass_single_element", False)))
        if entry.get("name") is not None and entry["name"] != built.name:
            raise MxsimError(
                f"name {entry['name']!r} does not match the parameters (which are {built.name!r})"
            )
        return built
    if kind == "qdq":
        unknown = set(entry) - {
            "kind",
            "dtype",
            "axis",
            "block_size",
            "saturate",
            "scale",
            "zero_point",
            "reciprocal",
        }
        if unknown:
            raise MxsimError(f"unknown keys {sorted(unknown, key=str)}")
        scale_key = entry["scale"]
        if scale_key != f"quant.{operand}.scale" or scale_key not in arrays:
            raise MxsimError(
                f"scale must name the array quant.{operand}.scale in the layer's file, got {scale_key!r}"
            )
        zero_key = entry.get("zero_point")
        if zero_key is not None and (
            zero_key != f"quant.{operand}.zero_point" or zero_key not in arrays
        ):
            raise MxsimError(
                f"zero_point must be null or name the array quant.{operand}.zero_point in the "
                f"layer's file, got {zero_key!r}"
            )
        return QDQQuant(
            entry["dtype"],
            arrays[scale_key],
            None if zero_key is None else arrays[zero_key],
            entry.get("axis"),
            entry.get("block_size", 0),
            bool(entry.get("saturate", True)),
            entry.get("reciprocal", False),
        )
    if kind == "nvfp4":
        unknown = set(entry) - {"kind", "axis", "profile", "tensor_scale", "dequantized", "scales"}
        if unknown:
            raise MxsimError(f"unknown keys {sorted(unknown, key=str)}")
        scales = _stored_scales(entry, arrays, operand)
        return NVFP4Quant(
            entry["axis"],
            scales,
            entry.get("tensor_scale"),
            entry.get("profile", "torchao"),
            entry.get("dequantized", "float32"),
        )
    raise MxsimError(f"unknown kind {kind!r}; accepted: {', '.join(SPEC_KINDS)}")
