"""AMD Quark's torch quantizers (``quark.torch``, amd-quark 0.13) read as mxsim specs.

Quark's ``ModelQuantizer`` replaces each Linear/Conv with a quantized module (``QuantLinear``,
``QuantConv2d``...) holding ``_input_quantizer``, ``_weight_quantizer``, ``_bias_quantizer`` and
``_output_quantizer`` submodules (``FakeQuantizeBase`` subclasses). :func:`quantizer_spec`
reads one quantizer's configuration:

* OCP MX (``OCP_MXFP8E4M3Spec`` ... ``OCP_MXFP4Spec``: a scaled per-group quantizer with
  Quark's ``PerBlockMXObserver``; ``OCP_MXINT8Spec``: Quark's ``fake_quantize_mx``) ->
  :class:`~mxsim.trace.quant.MXQuant` with the ``quark`` / ``quark-floor`` / ``quark-ceil``
  profile for the scale calculation mode ``even`` / ``floor`` / ``ceil``; block axis
  ``ch_axis``, block size ``group_size``.
* ``MX6Spec`` / ``MX9Spec`` -> :class:`~mxsim.trace.quant.BFPQuant` MX6/MX9 (``to_bfp_prime``)
  with Quark's block size, round half to even (``torch.round``), CPU kernel semantics, and
  zero and subnormal inputs +0 (Quark torch replaces them by +0.0 before quantizing).
* ``BFP16Spec`` (Quark torch's own ``fake_quantize_bfp16``, not its ONNX kernel's) ->
  :class:`~mxsim.trace.quant.MXQuant` MX INT8 in blocks of 8 along ``ch_axis`` at the scales
  :func:`bfp16_scales` computes from the float operand (stored with the spec): elements
  ``q * 2^(X-6)``, q = round half to even of ``x * 2^(6-X)`` clamped to [-128, 127] (zeros
  +0). Quark's ``BFP16Spec`` has no stored scale; X is its block exponent.
* Static per-tensor / per-channel int8, uint8, fp8 (``Int8PerTensorSpec``,
  ``FP8E4M3PerTensorSpec``, ``FP8E4M3PerChannelSpec``...) ->
  :class:`~mxsim.trace.quant.QDQQuant` with the quantizer's stored float32 scale and zero
  point (FP8: ``x / scale`` in float32, clamped, rounded to FP8, times ``scale``; integers:
  ``x * (1 / scale)`` as torch's fake quantizers compute it, ``reciprocal``).

A spec is a reading of Quark's configuration, not yet a fact: the capture keeps Quark's own
quantized values beside the float and keeps the spec only where the spec reproduces them bit
for bit (:func:`reproduces`). Quark's other quantizers (dynamic per-tensor scales, NVFP4's
two-level ``SequentialQuantize``, TQT/LSQ observers, ...) give :data:`UNREAD`: their values
are recorded, with a note, and no spec.
"""

from __future__ import annotations

import sys

import numpy as np

from ..errors import MxsimError
from ..formats import get_format
from ..quantize import BFP_SPECS, quantize
from ..trace.quant import QDQ_FLOAT_ELEMENTS, BFPQuant, MXQuant, QDQQuant

#: The attribute names under which Quark's quantized modules hold each operand's quantizer.
QUANTIZER_OPERANDS = {
    "_input_quantizer": "input",
    "_weight_quantizer": "weight",
    "_bias_quantizer": "bias",
    "_output_quantizer": "output",
}
#: Quark ``scale_calculation_mode`` -> mxsim profile (docs/profiles.md, "quark").
SCALE_MODE_PROFILES = {"even": "quark", "floor": "quark-floor", "ceil": "quark-ceil"}
#: Quark element dtype names mxsim spells differently.
ELEMENT_NAMES = {"fp4": "fp4_e2m1"}
#: Quark non-scaled block dtypes -> mxsim BFP spec name.
BFP_DTYPES = {"mx6": "MX6", "mx9": "MX9"}
#: Quark torch's BFP16 dtype (:func:`bfp16_scales`).
BFP16_DTYPE = "bfp16"
#: Quark QDQ dtypes -> the ONNX-style names of :class:`~mxsim.trace.quant.QDQQuant`.
QDQ_DTYPES = {
    "int8": "int8",
    "uint8": "uint8",
    "int16": "int16",
    "uint16": "uint16",
    "int4": "int4",
    "uint4": "uint4",
    "fp8_e4m3": "float8e4m3fn",
    "fp8_e5m2": "float8e5m2",
}
#: Quark torch BFP16 as mxsim reads it: MX INT8 elements (-128 kept) in blocks of 8, the
#: block exponent by Quark's floor rule (float32 log2, see docs/profiles.md "quark-floor").
BFP16_BLOCK = 8
BFP16_PROFILE = "quark-floor"
BFP16_OPTIONS = (("int8_minus_two", True),)
#: Returned for a quantizer mxsim does not read (its values are recorded instead).
UNREAD = "unread"

_QUANTIZE_MODULE = "quark.torch.quantization.tensor_quantize"


def quark_quantizer_class():
    """Quark's ``FakeQuantizeBase`` and ``SequentialQuantize`` if Quark is imported, else None
    (a model quantized by Quark has imported it; mxsim never imports Quark itself)."""
    module = sys.modules.get(_QUANTIZE_MODULE)
    if module is None:
        return None
    return module.FakeQuantizeBase, module.SequentialQuantize


def is_quark_quantizer(module) -> bool:
    classes = quark_quantizer_class()
    return classes is not None and isinstance(module, classes)


def _value(field):
    return getattr(field, "value", field)


def _element(name: str) -> str:
    return get_format(ELEMENT_NAMES.get(name, name)).name


def bfp16_scales(values: np.ndarray, axis: int) -> np.ndarray:
    """The E8M0 codes of Quark torch BFP16's block scales for ``values`` (float32) in blocks of
    8 along ``axis`` (the layout of :class:`mxsim.MXTensor`): X = floor(log2(amax)) with the
    log2 rounded to float32 (the ``quark-floor`` rule for MX INT8), plus 1 where an element
    of the block rounds (half to even) to +128 at X; the amax of an all-zero block gives
    X = -127 (Quark's own scale there, 2^-23 per step, leaves the same zeros)."""
    tensor = quantize(values, "int8", axis=axis, block_size=BFP16_BLOCK, profile=BFP16_PROFILE)
    codes = tensor.scales.astype(np.int64)
    moved = np.moveaxis(np.asarray(values, dtype=np.float64), axis, -1)
    padded = np.zeros((*moved.shape[:-1], codes.shape[-1] * BFP16_BLOCK))
    padded[..., : moved.shape[-1]] = moved
    steps = np.repeat(codes - 127 - 6, BFP16_BLOCK, axis=-1)
    carries = np.rint(np.ldexp(padded, -steps)) >= 128
    carried = carries.reshape(*codes.shape, BFP16_BLOCK).any(axis=-1)
    return (codes + carried).astype(np.uint8)


def quantizer_spec(quantizer, ndim: int, where: str, values: np.ndarray | None = None):
    """The mxsim spec of Quark ``quantizer`` applied to a rank-``ndim`` tensor, :data:`UNREAD`,
    or None when the quantizer is switched off. ``values``: the float tensor it quantizes
    (needed for BFP16, whose scales are stored with the spec). ``where`` names it in errors
    (MxsimError for a configuration mxsim reads but cannot take, e.g. an unknown element type)."""
    module = sys.modules[_QUANTIZE_MODULE]
    if isinstance(quantizer, module.SequentialQuantize):
        return UNREAD if quantizer.is_fake_quant_enabled else None
    if not getattr(quantizer, "fake_quant_enabled", False):
        return None
    dtype = _value(getattr(quantizer, "dtype", None))
    try:
        if isinstance(quantizer, module.NonScaledFakeQuantize):
            axis = int(quantizer.axis) % ndim
            if dtype == "mx":
                profile = SCALE_MODE_PROFILES[quantizer.scale_calculation_mode]
                return MXQuant(
                    _element(_value(quantizer.mx_element_dtype)),
                    axis,
                    int(quantizer.group_size),
                    profile,
                )
            if dtype in BFP_DTYPES:
                named = BFP_SPECS[BFP_DTYPES[dtype]]
                return BFPQuant(
                    named.replace(
                        block_size=int(quantizer.group_size),
                        rounding_mode=2,
                        flushed_zero_sign="positive",
                    ),
                    axis,
                )
            if dtype == BFP16_DTYPE:
                if values is None:
                    return UNREAD
                return MXQuant(
                    "int8",
                    axis,
                    BFP16_BLOCK,
                    BFP16_PROFILE,
                    BFP16_OPTIONS,
                    scales=bfp16_scales(values, axis),
                )
            return UNREAD
        if not isinstance(quantizer, module.ScaledFakeQuantize):
            return UNREAD
        qscheme, observer = _value(quantizer.qscheme), quantizer.observer
        if type(observer).__name__ in ("PerBlockMXObserver", "PerBlockMXBufferReuseObserver"):
            if (
                observer.scale_format != "e8m0"
                or observer.scale_calculation_mode not in SCALE_MODE_PROFILES
            ):
                return UNREAD
            return MXQuant(
                _element(dtype),
                int(quantizer.ch_axis) % ndim,
                int(quantizer.group_size),
                SCALE_MODE_PROFILES[observer.scale_calculation_mode],
            )
        if (
            not isinstance(quantizer, module.StaticScaledFakeQuantize)
            or dtype not in QDQ_DTYPES
            or type(observer).__name__ in ("TQTObserver", "LSQObserver")
        ):
            return UNREAD
        scale = quantizer.scale.detach().float().cpu().numpy().astype(np.float32)
        zero = quantizer.zero_point.detach().cpu().numpy().astype(np.int64)
        zero = None if not zero.any() else zero
        reciprocal = QDQ_DTYPES[dtype] not in QDQ_FLOAT_ELEMENTS  # torch's x * (1 / scale)
        if qscheme == "per_tensor":
            return QDQQuant(
                QDQ_DTYPES[dtype],
                scale.reshape(()),
                None if zero is None else zero.reshape(()),
                reciprocal=reciprocal,
            )
        axis = int(quantizer.ch_axis) % ndim
        if qscheme == "per_channel":
            return QDQQuant(
                QDQ_DTYPES[dtype],
                scale.reshape(-1),
                None if zero is None else zero.reshape(-1),
                axis,
                reciprocal=reciprocal,
            )
        return UNREAD  # per-group scales: Quark's layout is not read
    except (KeyError, AttributeError, TypeError, ValueError, MxsimError) as error:
        raise MxsimError(
            f"{where}: Quark quantizer {type(quantizer).__name__} ({dtype}) is not supported: "
            f"{error}"
        ) from None


def reproduces(
    spec, float_values: np.ndarray, quark_values: np.ndarray, library: str = "Quark"
) -> tuple[bool, str]:
    """Whether ``spec.fake_quantize(float_values)`` in the library's dtype is ``quark_values``
    (the library's values) bit for bit (NaN equals NaN), and a note saying how many elements
    differ when not."""
    if isinstance(spec, QDQQuant) and spec.dtype not in (
        "int8",
        "uint8",
        "int16",
        "uint16",
        "int4",
        "uint4",
        *QDQ_FLOAT_ELEMENTS,
    ):
        return False, f"{spec.dtype} QDQ is recorded, not recomputed"
    ours = np.asarray(spec.fake_quantize(np.asarray(float_values, dtype=np.float32)))
    with np.errstate(over="ignore", invalid="ignore"):
        ours = ours.astype(quark_values.dtype)
    unsigned = f"u{quark_values.dtype.itemsize}"
    differ = (ours.view(unsigned) != quark_values.view(unsigned)) & ~(
        np.isnan(ours) & np.isnan(quark_values)
    )
    count = int(differ.sum())
    if count:
        return False, (
            f"mxsim's {spec.kind} reading differs from {library}'s values in {count} of "
            f"{differ.size} elements"
        )
    return True, ""
