"""Brevitas' quantizers (``brevitas.nn`` quantized layers, Brevitas 0.13) read as mxsim specs.

A Brevitas ``QuantLinear`` holds ``input_quant``, ``weight_quant``, ``bias_quant`` and
``output_quant`` proxies (``QuantProxyFromInjector`` subclasses). An enabled proxy returns a
``QuantTensor`` (its dequantized values in ``.value``) that the layer passes to ``F.linear``;
capture runs the proxies outside its interception (as Quark's quantizers), records each
operand as the proxy's float input with the QuantTensor's ``.value`` as
``<operand>_quantized``, and reads the proxy's configuration as a spec:

* a groupwise float proxy (the OCP MX quantizers of ``brevitas.quant.mx_quant_ocp``:
  ``MXFloat8e4m3Weight``, ``MXFloat8e4m3Act``...: power-of-two scales per group) ->
  :class:`~mxsim.trace.quant.MXQuant` with the element format of its exponent and mantissa
  widths, blocks of ``group_size`` along ``group_dim``, OCP profile;
* a groupwise integer proxy (``MXInt8Weight``, ``MXInt8Act``: signed 8-bit elements, one
  power-of-two scale per group) -> :class:`~mxsim.trace.quant.MXQuant` ``int8`` with the
  scale codes Brevitas chose (``MXQuant.scales``, read from the QuantTensor it returned): its
  scale rule is not OCP's (run, its step is one binade below OCP's rule in the tests' blocks,
  as ``2^floor(log2(amax / 127))`` would be, so a block's largest elements saturate at 127),
  and the elements
  are rounded half to even and clamped as mxsim's MX INT8 does (``int8_minus_two`` false for
  a narrow range), a zero keeping the input's sign except where ``x / s + 0.0`` is +0 (an
  input -0, a quotient that underflowed: ``input_unless_underflow``); an element step
  2^e is the E8M0 scale 2^(e + 6) of MX INT8's 1.6 codes;
* a float proxy whose QuantTensor has one scale (per tensor: ``Fp8e4m3OCPWeightPerTensorFloat``,
  ``Fp8e4m3OCPActPerTensorFloat``...), saturating, zero point 0, E4M3 or E5M2 elements ->
  :class:`~mxsim.trace.quant.QDQQuant` ``float8e4m3fn`` / ``float8e5m2`` with that float32
  scale (``x / scale`` clamped, rounded to FP8, times ``scale``; run, this is Brevitas'
  arithmetic);
* any other enabled proxy (other integer widths, ...) -> :data:`UNREAD`: its values are
  recorded, with a note, and no spec.

As for Quark, a spec is kept only where it reproduces Brevitas' values bit for bit
(:func:`mxsim.capture.torch_quark.reproduces`). Brevitas is never imported here: a model
built with it has imported it.
"""

from __future__ import annotations

import sys

import numpy as np

from ..errors import MxsimError
from ..formats import get_format
from ..trace.quant import MXQuant, QDQQuant

#: (exponent bits, mantissa bits) of Brevitas' minifloat elements -> mxsim element formats.
ELEMENTS = {
    (4, 3): "fp8_e4m3",
    (5, 2): "fp8_e5m2",
    (2, 3): "fp6_e2m3",
    (3, 2): "fp6_e3m2",
    (2, 1): "fp4_e2m1",
}
#: Brevitas' groupwise float proxies (module, class name): the OCP MX quantizers.
GROUPWISE_FLOAT = (
    (
        "brevitas.proxy.groupwise_float_parameter_quant",
        "GroupwiseWeightFloatQuantProxyFromInjector",
    ),
    ("brevitas.proxy.groupwise_float_runtime_quant", "GroupwiseActFloatQuantProxyFromInjector"),
)
#: Brevitas' groupwise integer proxies (module, class name): its MX INT quantizers.
GROUPWISE_INT = (
    (
        "brevitas.proxy.groupwise_int_parameter_quant",
        "GroupwiseWeightQuantProxyFromInjector",
    ),
    ("brevitas.proxy.groupwise_int_runtime_quant", "GroupwiseActQuantProxyFromInjector"),
)
#: Returned for a proxy mxsim does not read (its values are recorded instead).
UNREAD = "unread"
#: (exponent bits, mantissa bits) of Brevitas' per-tensor float elements -> QDQ float types.
PER_TENSOR_FLOAT = {(4, 3): "float8e4m3fn", (5, 2): "float8e5m2"}


def _classes(pairs) -> tuple:
    found = []
    for module, name in pairs:
        loaded = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, name):
            found.append(getattr(loaded, name))
    return tuple(found)


def is_brevitas_quantizer(module) -> bool:
    """Whether ``module`` is one of Brevitas' quantizer proxies."""
    classes = _classes([("brevitas.proxy.quant_proxy", "QuantProxyFromInjector")])
    return bool(classes) and isinstance(module, classes)


def is_quant_tensor(value) -> bool:
    """Whether ``value`` is a Brevitas ``QuantTensor`` (the output of an enabled proxy)."""
    classes = _classes([("brevitas.quant_tensor.base_quant_tensor", "QuantTensor")])
    return bool(classes) and isinstance(value, classes)


class Applied:
    """A Brevitas quantizer proxy and the QuantTensor it returned at one call (None when that
    output was not seen): a groupwise integer proxy's scales are read from the tensor."""

    def __init__(self, proxy, quant_tensor):
        self.proxy, self.quant_tensor = proxy, quant_tensor

    def __repr__(self) -> str:
        return type(self.proxy).__name__

    def spec(self, ndim: int, where: str):
        """:func:`quantizer_spec` of the proxy, with the tensor's scales for an integer one."""
        return quantizer_spec(self.proxy, ndim, where, self.quant_tensor)


def quantizer_spec(proxy, ndim: int, where: str, quant_tensor=None):
    """The mxsim spec of Brevitas ``proxy`` applied to a rank-``ndim`` tensor, :data:`UNREAD`,
    or None when the proxy is disabled; ``quant_tensor``: the QuantTensor it returned (an
    integer proxy is read only with it). ``where`` names it in errors."""
    if not proxy.is_quant_enabled:
        return None
    integer = _classes(GROUPWISE_INT)
    if integer and isinstance(proxy, integer):
        return UNREAD if quant_tensor is None else _int_spec(proxy, quant_tensor, ndim, where)
    groupwise = _classes(GROUPWISE_FLOAT)
    if not groupwise or not isinstance(proxy, groupwise):
        return UNREAD if quant_tensor is None else _per_tensor_float_spec(quant_tensor, where)
    try:
        injector = proxy.quant_injector  # the quantizer class's configuration
        bits = (int(injector.exponent_bit_width), int(injector.mantissa_bit_width))
        if bits not in ELEMENTS:
            return UNREAD
        return MXQuant(
            get_format(ELEMENTS[bits]).name,
            int(injector.group_dim) % ndim,
            int(injector.group_size),
            "ocp",
        )
    except (AttributeError, TypeError, ValueError, RuntimeError, MxsimError) as error:
        raise MxsimError(
            f"{where}: Brevitas quantizer {type(proxy).__name__} is not supported: {error}"
        ) from None


def _per_tensor_float_spec(quant_tensor, where: str):
    """The FP8 QDQ spec of a per-tensor float ``quant_tensor`` (module docstring), or
    :data:`UNREAD` for any other QuantTensor."""
    if type(quant_tensor).__name__ != "FloatQuantTensor":
        return UNREAD
    try:
        bits = (int(quant_tensor.exponent_bit_width), int(quant_tensor.mantissa_bit_width))
        scale = quant_tensor.scale.detach().cpu().numpy()
        zero = quant_tensor.zero_point.detach().cpu().numpy()
        if (
            bits not in PER_TENSOR_FLOAT
            or scale.size != 1
            or zero.any()
            or not bool(quant_tensor.saturating)
        ):
            return UNREAD
        return QDQQuant(PER_TENSOR_FLOAT[bits], scale.astype(np.float32).reshape(()))
    except (AttributeError, TypeError, ValueError, RuntimeError, MxsimError) as error:
        raise MxsimError(
            f"{where}: Brevitas {type(quant_tensor).__name__} is not supported: {error}"
        ) from None


def _int_spec(proxy, quant_tensor, ndim: int, where: str):
    """MX INT8 with the scale codes of Brevitas' groupwise integer ``quant_tensor``, or
    :data:`UNREAD` for what MX INT8 cannot hold (another width, unsigned, a zero point,
    scales that are not powers of two or not one per group, outside E8M0's range)."""
    try:
        injector = proxy.quant_injector
        axis, block = int(quant_tensor.group_dim) % ndim, int(quant_tensor.group_size)
        narrow = bool(injector.narrow_range)
        zero_point = quant_tensor.zero_point.detach().cpu().numpy()
        if (
            float(quant_tensor.bit_width) != 8
            or not bool(quant_tensor.signed)
            or np.any(zero_point != 0)
        ):
            return UNREAD
        scale = np.moveaxis(quant_tensor.scale.detach().cpu().numpy().astype(np.float64), axis, -1)
        if scale.shape[-1] % block:
            return UNREAD
        blocks = scale.reshape(*scale.shape[:-1], -1, block)
        first = blocks[..., 0]
        if np.any(blocks != first[..., None]) or not np.all(first > 0):
            return UNREAD
        mantissa, exponent = np.frexp(first)
        codes = exponent.astype(np.int64) - 1 + 6 + 127  # step 2^e -> E8M0 code of 2^(e + 6)
        if np.any(mantissa != 0.5) or np.any(codes < 0) or np.any(codes > 254):
            return UNREAD
        return MXQuant(
            "int8",
            axis,
            block,
            "ocp",
            {"int8_minus_two": not narrow, "zero_signs": (("int8", "input_unless_underflow"),)},
            scales=codes.astype(np.uint8),
        )
    except (AttributeError, TypeError, ValueError, RuntimeError, MxsimError) as error:
        raise MxsimError(
            f"{where}: Brevitas quantizer {type(proxy).__name__} is not supported: {error}"
        ) from None
