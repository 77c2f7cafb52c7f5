"""torchao's MX weight tensors (``torchao.prototype.mx_formats``, torchao 0.18) read as mxsim specs.

``quantize_(model, MXDynamicActivationMXWeightConfig(...))`` replaces each Linear's weight by
an ``MXTensor``: element codes (``qdata``), one E8M0 scale per block of ``block_size`` along
the reduction axis (``scale``, possibly swizzled), and ``act_quant_kwargs``, the
quantization torchao applies to the layer's input at each call (dynamic: ``MXTensor.to_mx``
of the input viewed as (rows, K)) before its GEMM. For each such Linear the capture records:

* input: the float activation, and torchao's own quantization of it (computed by torchao's
  ``MXTensor.to_mx`` with the weight's ``act_quant_kwargs``, outside the interception) as
  ``input_quantized``;
* weight: torchao's dequantized weight (its float before quantization is gone from the
  model) as both the float and ``weight_quantized``.

Each operand's spec is :class:`~mxsim.trace.quant.MXQuant` with the element format, blocks
of ``block_size`` along the last axis and the profile of torchao's ``scaling_mode``
(:data:`SCALE_MODE_PROFILES`, docs/profiles.md), kept only where it reproduces torchao's
values bit for bit (capture's check, as for Quark). The weight's scaling mode is not stored
on the tensor: the activation's is the config's, which ``quantize_`` applied to both.
The weight's spec carries torchao's stored scale codes (``MXQuant.scales``): its values alone
do not fix them, since under RCEIL (and CEIL) a block whose largest element rounded to half
the element's largest value (``max_pos / 2 * 2^X``) holds the same values as the block one
scale lower with that element at ``max_pos``. Replay then encodes torchao's codes.

``quantize_(model, NVFP4WeightOnlyConfig(...))`` replaces each Linear's weight by an
``NVFP4Tensor``: packed FP4 codes (``qdata``), one UE4M3 scale per 16 elements along K
(``scale``, swizzled), and the float32 ``per_tensor_scale`` (None without
``use_dynamic_per_tensor_scale``). torchao's linear then computes ``F.linear(x,
weight.dequantize(orig_dtype), bias)``: its dequantization is ``fl(e * fl(t * s))`` in
float32, rounded once to the weight's original dtype (bf16 for a bf16 model), which is what
the layer consumes. The capture records the input unquantized (torchao does not quantize it),
the weight's float32 dequantization as its float and the consumed values as
``weight_quantized``, with :class:`~mxsim.trace.quant.NVFP4Quant` carrying torchao's stored
UE4M3 scale codes (unswizzled), its tensor scale and the dequantized dtype. NVFP4 weights with
activation quantization (``NVFP4DynamicActivationNVFP4WeightConfig``: torchao runs their GEMM
only as an FP4 ``_scaled_mm`` on sm100 GPUs) are refused with one line naming the module.
torchao is never imported here: a model quantized by torchao has imported it.
"""

from __future__ import annotations

import sys

import numpy as np

from ..errors import MxsimError
from ..formats import get_format
from ..trace.quant import MXQuant, NVFP4Quant

_MX_MODULE = "torchao.prototype.mx_formats.mx_tensor"
_NVFP4_MODULE = "torchao.prototype.mx_formats.nvfp4_tensor"
#: torchao ``ScaleCalculationMode`` value -> (mxsim profile, option overrides).
SCALE_MODE_PROFILES = {
    "floor": ("torchao", {}),
    "rceil": ("torchao-rceil", {}),
    "ceil": ("torchao", {"scale_rule": "ceil"}),
    "even": ("torchao", {"scale_rule": "even"}),
}
#: torchao element dtypes (torch dtypes by name, or torchao's fp6 strings) -> mxsim formats.
ELEMENTS = {
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "float4_e2m1fn_x2": "fp4_e2m1",
    "fp6_e2m3": "fp6_e2m3",
    "fp6_e3m2": "fp6_e3m2",
}


def _class(module: str, name: str):
    loaded = sys.modules.get(module)
    return getattr(loaded, name, None) if loaded is not None else None


def is_mx_tensor(tensor) -> bool:
    cls = _class(_MX_MODULE, "MXTensor")
    return cls is not None and isinstance(tensor, cls)


def is_torchao_tensor(tensor) -> bool:
    """Whether ``tensor`` is one of torchao's MX or NVFP4 tensor subclasses."""
    classes = [
        c
        for c in (_class(_MX_MODULE, "MXTensor"), _class(_NVFP4_MODULE, "NVFP4Tensor"))
        if c is not None
    ]
    return bool(classes) and isinstance(tensor, tuple(classes))


#: torch dtype names of an NVFP4 weight's ``orig_dtype`` -> NVFP4Quant ``dequantized``.
NVFP4_DEQUANTIZED = {"bfloat16": "bfloat16", "float32": "float32"}


def check_supported(tensor, where: str) -> None:
    """Refuse (one line, ``where`` naming the module) a torchao tensor mxsim does not read."""
    name = type(tensor).__name__
    if not is_torchao_tensor(tensor):
        raise MxsimError(f"{where}: a torchao {name} weight is not supported")
    if tensor.dim() != 2:
        raise MxsimError(
            f"{where}: a {tensor.dim()}-d torchao {name} weight is not supported (2-d only)"
        )
    if is_mx_tensor(tensor):
        return
    if tensor.act_quant_kwargs is not None:
        raise MxsimError(
            f"{where}: a torchao NVFP4Tensor weight with activation quantization is not "
            "supported (torchao computes it only as an FP4 _scaled_mm on sm100 GPUs); "
            "NVFP4WeightOnlyConfig's weights are"
        )
    dtype = str(tensor.orig_dtype).removeprefix("torch.")
    if dtype not in NVFP4_DEQUANTIZED:
        raise MxsimError(
            f"{where}: a torchao NVFP4Tensor weight of original dtype {dtype} is not supported; "
            f"accepted: {', '.join(NVFP4_DEQUANTIZED)}"
        )


def is_quantization(quantizer) -> bool:
    return isinstance(quantizer, (Quantization, NVFP4Quantization))


class Quantization:
    """How torchao quantized one operand of a Linear, as read from its ``MXTensor`` weight:
    ``element`` (mxsim format), ``block_size``, ``scaling_mode`` (torchao's mode value) and,
    for the weight, the tensor itself (its stored scale codes go into the spec)."""

    def __init__(self, element: str, block_size: int, scaling_mode: str, weight=None):
        self.element, self.block_size, self.scaling_mode, self.weight = (
            element,
            block_size,
            scaling_mode,
            weight,
        )

    def __repr__(self) -> str:
        return f"torchao MX {self.element} block {self.block_size} {self.scaling_mode}"

    def spec(self, torch, ndim: int) -> MXQuant | None:
        """The operand's MX spec along its last axis (the weight's with torchao's stored scale
        codes), or None for a scaling mode mxsim has no profile for."""
        if self.scaling_mode not in SCALE_MODE_PROFILES:
            return None
        profile, options = SCALE_MODE_PROFILES[self.scaling_mode]
        return MXQuant(
            self.element,
            ndim - 1,
            self.block_size,
            profile,
            options,
            scales=None if self.weight is None else stored_scales(torch, self.weight),
        )


class NVFP4Quantization:
    """How torchao quantized a Linear's weight, read from its 2-d weight-only ``NVFP4Tensor``."""

    def __init__(self, weight):
        self.weight = weight

    def __repr__(self) -> str:
        t = self.weight.per_tensor_scale
        return f"torchao NVFP4 {'with' if t is not None else 'without'} tensor scale"

    def spec(self, torch, ndim: int) -> NVFP4Quant:
        """The weight's NVFP4 spec along its last axis, with torchao's scale codes and tensor scale."""
        weight = self.weight
        rows, cols = weight.shape
        scale = weight.scale
        if weight.is_swizzled_scales:
            scale = sys.modules["torchao.prototype.mx_formats.utils"].from_blocked(
                scale, rows, cols // weight.block_size
            )
        codes = scale.view(torch.uint8).cpu().numpy().reshape(rows, cols // weight.block_size)
        t = weight.per_tensor_scale
        return NVFP4Quant(
            ndim - 1,
            codes.copy(),
            None if t is None else float(t.float().item()),
            "torchao",
            NVFP4_DEQUANTIZED[str(weight.orig_dtype).removeprefix("torch.")],
        )


def _element(dtype) -> str:
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if name not in ELEMENTS:
        raise MxsimError(
            f"torchao element dtype {name} is not read; accepted: {', '.join(ELEMENTS)}"
        )
    return get_format(ELEMENTS[name]).name


def stored_scales(torch, weight) -> np.ndarray:
    """The E8M0 scale codes of torchao's 2-d MXTensor ``weight`` (N, K / block), unswizzled."""
    scale, (rows, cols) = weight.scale, weight.shape
    if weight.is_swizzled_scales:
        scale = sys.modules["torchao.prototype.mx_formats.utils"].from_blocked(
            scale, rows, cols // weight.block_size
        )
    return scale.view(torch.uint8).cpu().numpy().reshape(rows, cols // weight.block_size).copy()


def linear_operands(torch, x, weight, where: str) -> dict:
    """operand -> (torchao's quantized values (a tensor), their float before quantization,
    :class:`Quantization`) for ``F.linear(x, weight)`` with a torchao MXTensor ``weight``
    (for a weight-only NVFP4Tensor: the weight alone, with :class:`NVFP4Quantization`);
    call outside the interception modes. Raises MxsimError (one line, ``where``) for what
    mxsim does not read: a weight-only MX weight (torchao itself refuses it) or an unknown
    element dtype."""
    kwargs = weight.act_quant_kwargs
    if not is_mx_tensor(weight):  # a weight-only NVFP4Tensor (check_supported)
        consumed = weight.dequantize(weight.orig_dtype)
        return {"weight": (consumed, weight.dequantize(torch.float32), NVFP4Quantization(weight))}
    if kwargs is None:
        raise MxsimError(
            f"{where}: a torchao MXTensor weight without activation quantization is not supported"
        )
    try:
        weight_quantization = Quantization(
            _element(weight.elem_dtype),
            int(weight.block_size),
            str(getattr(kwargs.scaling_mode, "value", kwargs.scaling_mode)),
            weight,
        )
        input_quantization = Quantization(
            _element(kwargs.elem_dtype), int(kwargs.block_size), weight_quantization.scaling_mode
        )
    except MxsimError as error:
        raise MxsimError(f"{where}: {error}") from None
    mx_tensor = sys.modules[_MX_MODULE].MXTensor
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    quantized = mx_tensor.to_mx(
        rows,
        kwargs.elem_dtype,
        kwargs.block_size,
        kwargs.scaling_mode,
        kwargs.kernel_preference,
        kwargs.is_swizzled_scales,
    )
    input_values = quantized.dequantize(x.dtype).reshape(x.shape)
    weight_values = weight.dequantize(torch.float32)
    return {
        "input": (input_values, x, input_quantization),
        "weight": (weight_values, weight_values, weight_quantization),
    }
