"""What a unit gets for each operand of a layer, and why (docs/replay.md, "Formats a unit
cannot take"): the one policy replay and the unit in the loop share.

A unit takes an operand as the model has it when it accepts the element format, has block
scales, and its block size divides the model's scale runs along K. Otherwise replay quantizes
the operand itself (the model's format if the unit takes it, else the unit's first; units
without block scales get one power-of-two scale per tensor) and marks the row: ``replaced``
when the model had a spec the unit cannot take, ``added`` when the model multiplied floats.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..datapath import HardwareConfig
from ..errors import MxsimError
from ..formats import get_format
from ..quantize import NVFP4_PROFILES
from ..quantize.mx import per_tensor_exponent
from ..trace.model import Layer
from ..trace.quant import MXQuant, NVFP4Quant

#: Row statuses: the unit multiplied the model's own operand values; replay re-quantized an
#: operand whose recorded spec the unit cannot take; replay quantized an operand the model
#: left in float; the caller chose the format (``element_format``).
STATUSES = ("model", "replaced", "added", "caller")
MARKS = {"model": "", "replaced": "*", "added": "+", "caller": "="}


@dataclass
class OperandChoice:
    """How one operand was quantized for one unit, and why.

    ``format``/``profile``/``per_tensor_scale``: what the unit received (per-tensor scaling:
    ``tensor_scale_exponent`` 0 for a wide format, a plain cast, else the amax rule; see
    :func:`choose_operand`); ``block_size``: the unit's block; ``scale_format``: its block
    scales' format (``inputs.scale_format``: ``e8m0``, MX; ``ue4m3``, NVFP4, whose
    ``per_tensor_scale`` is the float32 tensor scale of the two-level recipe); ``status``:
    one of :data:`STATUSES`; ``spec``: the model's quantization; ``layout``: how the model's
    blocks lie in K; ``saturated``/``underflowed``: elements clipped to the largest
    magnitude / nonzero elements flushed to zero by the quantization the unit received (the
    model's, counted once per tensor element; or replay's, counted over the GEMM operand);
    ``note``: why, when not the model's.
    """

    format: str
    profile: str
    per_tensor_scale: bool
    note: str = ""
    tensor_scale_exponent: int | None = None
    block_size: int = 0
    scale_format: str = "e8m0"
    status: str = "model"
    spec: str = ""
    layout: str = ""
    saturated: int | None = 0
    underflowed: int | None = 0

    @property
    def float_scales(self) -> bool:
        """Whether the unit's block scales have a significand (:func:`has_float_scales`)."""
        return has_float_scales(self.scale_format)


def has_float_scales(scale_format: str) -> bool:
    """Whether block scales of ``scale_format`` have a significand (UE4M3: NVFP4's recipe),
    not powers of two as MX's E8M0."""
    return get_format(scale_format).mantissa_bits > 0


def pair_choices(
    choices: dict,
    options: dict,
    operands: dict,
    layer: Layer,
    hw: HardwareConfig,
    per_tensor_scale: bool | None,
) -> None:
    """Where the two operands' formats are a pair ``hw`` does not take (``inputs.format_groups``:
    an fp8 input with fp16 weights on an FP8 tensor core), the operand replay quantizes itself
    (the weight first) is quantized again into the first format of its list that pairs with
    the other operand's; an operand the model or the caller fixed is never changed. No such
    operand: MxsimError naming the pair."""
    pairs = hw.format_pairs
    if (choices["input"].format, choices["weight"].format) in pairs:
        return
    for name, other in (("weight", "input"), ("input", "weight")):
        if choices[name].status in ("added", "replaced"):
            fixed = choices[other].format
            pairing = [
                fmt
                for fmt in (hw.a_formats if name == "input" else hw.b_formats)
                if ((fmt, fixed) if name == "input" else (fixed, fmt)) in pairs
            ]
            if pairing:
                choice, options[name] = choose_operand(
                    operands[name], name, layer.quant.get(name), hw, pairing[0], per_tensor_scale
                )
                choices[name] = dataclasses.replace(
                    choice,
                    status=choices[name].status,
                    note=f"{choices[name].note}; {pairing[0]}, the first format pairing with the {other}'s {fixed}",
                )
                return
    raise MxsimError(
        f"{hw.name}: takes no {choices['input'].format} x {choices['weight'].format} pair (input x "
        f"weight) and neither format is replay's to change; it takes "
        f"{', '.join(f'{a} x {b}' for a, b in pairs)}"
    )


def choose_operand(
    operand,
    name: str,
    spec,
    hw: HardwareConfig,
    element_format: str | None,
    per_tensor_scale: bool | None = None,
    strict: bool = False,
) -> tuple[OperandChoice, dict]:
    """What ``hw`` gets for one operand, and the quantize options: the one place that decides
    what happens to a format a unit cannot take (docs/replay.md, "Formats a unit cannot take"),
    for replay and for the unit in the loop alike.

    ``operand``: the model's operand (:class:`~mxsim.replay.operands.GemmOperand`, or its
    :class:`~mxsim.replay.operands.OperandPlan` to decide before any work). The policy:

    * a format the caller chose (``element_format``) that the unit does not take is refused
      (MxsimError): a request that cannot be met;
    * the model's recorded quantization, when the unit cannot take it as it is (element format
      not accepted, no block scales, or blocks that do not fit the model's), is re-quantized
      by replay into a format the unit takes (the model's if accepted, else the unit's first)
      and the row is marked ``replaced`` — or, with ``strict``, refused (MxsimError);
    * an operand the model left unquantized is quantized by replay (``added``).

    ``per_tensor_scale``: None follows the unit (per-tensor when it has no block scales; on a
    unit with UE4M3 block scales, NVFP4, the two-level recipe's float32 tensor scale from each
    tensor's amax, as torchao's NVFP4 and NVIDIA's recipes have it); True forces it; False on a
    unit without block scales is an error (on an NVFP4 unit: single-level scaling).
    Per-tensor scaling by the amax rule is FP8 practice; formats as wide as fp16, bf16 and
    tf32 take the values rounded straight in (scale 1, a framework's cast): scaled up to
    their largest values, products would overflow the unit's sums."""
    choice, options = _choose_scaling(operand, name, spec, hw, element_format, per_tensor_scale)
    if strict and choice.status == "replaced":
        raise MxsimError(f"{hw.name}: {choice.note} (strict)")
    cast = per_tensor_exponent(choice.format)
    if choice.per_tensor_scale and cast is not None:
        choice = dataclasses.replace(choice, tensor_scale_exponent=cast)
    return choice, options


def _nvfp4_taken(operand, spec, accepted, block: int, scale_format: str, per_tensor_scale):
    """None where a unit with float block scales takes an operand's NVFP4 spec as the model
    quantized it (its element format, scale format and block the unit's, its blocks whole
    along K, its tensor scale or none as the caller asks, if the caller asks), else why not."""
    options = NVFP4_PROFILES[spec.profile]
    if options.element_format not in accepted:
        return f"takes {', '.join(accepted)}, not {options.element_format}"
    if (options.scale_format, options.block_size) != (scale_format, block):
        return f"takes {scale_format} scales per {block}"
    if operand.granule % block or not operand.granule:
        return f"blocks of {block} do not fit the model's blocks ({operand.layout})"
    if per_tensor_scale is not None and per_tensor_scale != (spec.tensor_scale is not None):
        return f"was asked for {'two' if per_tensor_scale else 'single'}-level scaling"
    return None


def _choose_scaling(
    operand,
    name: str,
    spec,
    hw: HardwareConfig,
    element_format: str | None,
    per_tensor_scale: bool | None,
) -> tuple[OperandChoice, dict]:
    """:func:`choose_operand` before the strict and wide-format rules."""
    accepted = hw.a_formats if name == "input" else hw.b_formats
    block = hw.sections[("inputs", "block_size")]
    scale_format = hw.sections[("inputs", "scale_format")]
    float_scales = has_float_scales(scale_format)
    per_tensor = hw.sections[("inputs", "scales")] == "none" or float_scales
    if per_tensor_scale is not None:
        if per_tensor and not float_scales and not per_tensor_scale:
            raise MxsimError(f"{hw.name} has no block scales: its operands need per-tensor scaling")
        per_tensor = per_tensor_scale
    base = dict(
        block_size=block, scale_format=scale_format, spec=operand.spec, layout=operand.layout
    )
    recipe = "torchao" if float_scales else "ocp"  # NVFP4_PROFILES' recipe, or MX's
    if element_format is not None:
        fmt = get_format(element_format).name
        if fmt not in accepted:
            raise MxsimError(
                f"{hw.name} does not take {fmt} for the {name}; it takes {', '.join(accepted)}"
            )
        return OperandChoice(
            fmt, recipe, per_tensor, "format chosen by the caller", status="caller", **base
        ), {}
    fmt = operand.element_format.name
    if float_scales and isinstance(spec, NVFP4Quant):
        taken = _nvfp4_taken(operand, spec, accepted, block, scale_format, per_tensor_scale)
        if taken is None:
            return OperandChoice(
                NVFP4_PROFILES[spec.profile].element_format,
                spec.profile,
                spec.tensor_scale is not None,
                status="model",
                **base,
            ), {}
        note, status = f"the unit cannot take {operand.spec}: it {taken}", "replaced"
    elif operand.quantized:
        # granule 0: one scale for all of K (a tensor-scaled operand), which any block takes
        # (every spec replay reads has power-of-two scales: E8M0, or float tensor scales)
        if fmt in accepted and not per_tensor and not float_scales and operand.granule % block == 0:
            return OperandChoice(
                fmt,
                getattr(spec, "profile", None) or spec.kind,  # bfp, qdq: no MX profile
                False,
                status="model",
                saturated=operand.saturated,
                underflowed=operand.underflowed,
                **base,
            ), {}
        reasons = []
        if fmt not in accepted:
            reasons.append(f"takes {', '.join(accepted)}, not {fmt}")
        if float_scales:
            reasons.append(f"takes {scale_format} block scales")
        elif per_tensor:
            reasons.append("has no block scales")
        elif operand.granule % block:
            reasons.append(f"blocks of {block} do not fit the model's blocks ({operand.layout})")
        note = f"the unit cannot take {operand.spec}: it {'; '.join(reasons)}"
        status = "replaced"
        if not operand.granule:  # tensor-scaled (a float-scale QDQ): as any QDQ operand, the
            status = "added"  # unit gets replay's quantization of what the model multiplied
    else:
        note, status = (
            f"the model multiplies {operand.spec} values; the unit needs a quantization",
            "added",
        )
    if isinstance(spec, MXQuant) and spec.format in accepted and not float_scales:
        return OperandChoice(
            spec.format, spec.profile, per_tensor, note, status=status, **base
        ), dict(spec.options)
    fmt = spec.format if isinstance(spec, MXQuant) and spec.format in accepted else accepted[0]
    return OperandChoice(fmt, recipe, per_tensor, note, status=status, **base), {}
