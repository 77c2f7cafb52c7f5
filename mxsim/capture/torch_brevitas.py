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
* any other enabled proxy (per-tensor OCP FP8, integer, MX INT) -> :data:`UNREAD`: its values
  are recorded, with a note, and no spec.

As for Quark, a spec is kept only where it reproduces Brevitas' values bit for bit
(:func:`mxsim.capture.torch_quark.reproduces`). Brevitas is never imported here: a model
built with it has imported it.
"""

from __future__ import annotations

import sys

from ..errors import MxsimError
from ..formats import get_format
from ..trace.quant import MXQuant

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
#: Returned for a proxy mxsim does not read (its values are recorded instead).
UNREAD = "unread"


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


def quantizer_spec(proxy, ndim: int, where: str):
    """The mxsim spec of Brevitas ``proxy`` applied to a rank-``ndim`` tensor, :data:`UNREAD`,
    or None when the proxy is disabled. ``where`` names it in errors."""
    if not proxy.is_quant_enabled:
        return None
    groupwise = _classes(GROUPWISE_FLOAT)
    if not groupwise or not isinstance(proxy, groupwise):
        return UNREAD
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
