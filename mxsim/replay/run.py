"""Replay a trace's layers through hardware datapaths and measure what they do to the numbers.

``docs/replay.md`` defines everything below precisely. Per layer:

* The model's operands (:mod:`mxsim.replay.operands`): each operand quantized by its recorded
  spec in its own layout and lowered to the GEMM the unit sees (conv: K ordered
  (kh, kw, C) with C blocked and padded per tap, by default); the bias through its
  recorded bias quantizer.
* The ideal: the exact sum of the products of the operands the unit got plus the bias,
  rounded once to fp32 (:func:`mxsim.replay.operands.ideal_gemm`) — on rows where the unit
  takes the model's operands, the model's own quantized computation.
* Per unit: the unit takes an operand as the model has it when it accepts the element
  format, has block scales, and its block size divides the model's scale runs along K.
  Otherwise replay quantizes the operand itself (the model's format if the unit takes it,
  else the unit's first; units without block scales get one power-of-two scale per tensor,
  ``mxsim.quantize_mx(..., per_tensor_scale=True)``) and marks the row: ``replaced`` when the
  model had a spec the unit cannot take, ``added`` when the model multiplied floats. The
  bias enters as the accumulator input c when it is exact in fp32 (else it is added in
  float64 after the GEMM). ``mxsim.matmul`` computes every output bit.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._compile import compile_seconds
from ..cycles import GemmLayer, estimate_layer, storage_for_format
from ..datapath import HardwareConfig, as_float, matmul_batched
from ..datapath.api import times_power_of_two
from ..errors import IncompleteResultError, MxsimError
from ..fileio import safe_file_stem, safe_output_path
from ..formats import get_format
from ..limits import shown
from ..parallel import InProcess, Task, raise_failures
from ..quantize import MXTensor, quantize, quantize_groups, resolve_options
from ..trace.model import Layer, Trace
from ..trace.quant import MXQuant
from ..trace.reference import REFERENCE_MODES
from .attribution import layer_attribution, output_channel_shares, top_shares
from .lowering import gemm_shape, lift_output
from .network import accuracy, layer_with_input
from .operands import (
    CONV_ORDERS,
    GemmOperand,
    LayerOperands,
    OperandPlan,
    accumulator_input,
    clip_counts,
    gemm_bias,
    ideal_gemm,
    layer_operands,
    operand_plans,
)

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
    :func:`choose_operand`); ``block_size``: the
    unit's block; ``status``: one of :data:`STATUSES`; ``spec``: the model's quantization;
    ``layout``: how the model's blocks lie in K; ``saturated``/``underflowed``: elements
    clipped to the largest magnitude / nonzero elements flushed to zero by the quantization
    the unit received (the model's, counted once per tensor element; or replay's, counted
    over the GEMM operand); ``note``: why, when not the model's.
    """

    format: str
    profile: str
    per_tensor_scale: bool
    note: str = ""
    tensor_scale_exponent: int | None = None
    block_size: int = 0
    status: str = "model"
    spec: str = ""
    layout: str = ""
    saturated: int | None = 0
    underflowed: int | None = 0


def _clipped(first: int | None, second: int | None) -> int | None:
    """The sum of two operands' clip counts; None (unknown) when either is."""
    return None if first is None or second is None else first + second


@dataclass
class LayerResult:
    """Numbers of one layer through one unit (see :func:`replay_layer` and docs/replay.md)."""

    layer: str
    hw: str
    macs: int
    input: OperandChoice
    weight: OperandChoice
    k: int
    bias: str
    sqnr_vs_float_db: float
    max_abs_error_vs_float: float
    max_rel_error_vs_float: float
    rel_rms_error_vs_float: float
    sqnr_vs_ideal_db: float
    max_abs_error_vs_ideal: float
    rel_rms_error_vs_ideal: float
    max_error_vs_ideal_ulps: float
    mean_error_vs_ideal_ulps: float
    identical_to_ideal_fraction: float
    ideal_rms: float
    ideal_exact: bool
    seconds: float
    compile_seconds: float = 0.0
    cycles: dict | None = None
    bits: np.ndarray | None = field(default=None, repr=False)
    errors_vs_float: np.ndarray | None = field(default=None, repr=False)
    errors_vs_ideal: np.ndarray | None = field(default=None, repr=False)
    attribution: dict | None = None
    channel_error_shares: np.ndarray | None = field(default=None, repr=False)

    @property
    def status(self) -> str:
        """The row's status: the most severe of its operands' (replaced > added > caller > model)."""
        for status in ("replaced", "added", "caller"):
            if status in (self.input.status, self.weight.status):
                return status
        return "model"

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        for key in ("bits", "errors_vs_float", "errors_vs_ideal", "channel_error_shares"):
            out.pop(key)
        out["status"] = self.status
        return out


def _sqnr_db(reference: np.ndarray, error: np.ndarray) -> float:
    noise = float(np.sum(np.square(error)))
    signal = float(np.sum(np.square(reference)))
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def _rel_rms(reference: np.ndarray, error: np.ndarray) -> float:
    signal = float(np.sum(np.square(reference)))
    noise = float(np.sum(np.square(error)))
    if noise == 0:
        return 0.0
    return math.sqrt(noise / signal) if signal > 0 else math.inf


def _requantize(values: np.ndarray, choice: OperandChoice, options: dict,
                count_clipped: bool = True) -> tuple[list[MXTensor], int, int]:
    """Replay's own quantization of a lowered operand (G, R, K) along K, each group a tensor
    of its own (:func:`mxsim.quantize.quantize_groups`: one kernel call for all groups); with
    ``count_clipped`` the saturated and underflowed elements too (else 0, 0)."""
    kwargs = dict(block_size=choice.block_size, profile=choice.profile, per_tensor_scale=choice.per_tensor_scale,
                  tensor_scale_exponent=choice.tensor_scale_exponent, **options)
    if resolve_options(choice.profile, **options).element_rounding == "stochastic":  # each group's own stream
        tensors = [quantize(matrix, choice.format, axis=1, **kwargs) for matrix in values]
    else:
        tensors = quantize_groups(values, choice.format, **kwargs)
    if not count_clipped:
        return tensors, 0, 0
    counts = [clip_counts(matrix, tensor) for matrix, tensor in zip(values, tensors)]
    return tensors, sum(c[0] for c in counts), sum(c[1] for c in counts)


def _weight_quantization_key(layer: Layer, conv_order: str, floats: np.ndarray, choice: OperandChoice, options: dict,
                             count_clipped: bool) -> tuple | None:
    """What :func:`_requantize` of a lowered weight ``floats`` depends on besides the weight's
    values: the layer's lowering (op, attributes, both operands' specs, which set the K
    padding, the conv order), the lowered array's shape and dtype, and the quantization chosen;
    None for stochastic rounding (each call draws its own stream)."""
    if resolve_options(choice.profile, **options).element_rounding == "stochastic":
        return None
    return (layer.op, repr(sorted(layer.attrs.items())), repr(layer.quant.get("input")), repr(layer.quant.get("weight")),
            conv_order, floats.shape, floats.dtype.str, choice.format, choice.profile, choice.per_tensor_scale,
            choice.tensor_scale_exponent, choice.block_size, repr(sorted(options.items())), count_clipped)


def _pair_choices(choices: dict, options: dict, operands: dict, layer: Layer, hw: HardwareConfig,
                  per_tensor_scale: bool | None) -> None:
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
            pairing = [fmt for fmt in (hw.a_formats if name == "input" else hw.b_formats)
                       if ((fmt, fixed) if name == "input" else (fixed, fmt)) in pairs]
            if pairing:
                choice, options[name] = choose_operand(operands[name], name, layer.quant.get(name), hw, pairing[0],
                                                       per_tensor_scale)
                choices[name] = dataclasses.replace(
                    choice, status=choices[name].status,
                    note=f"{choices[name].note}; {pairing[0]}, the first format pairing with the {other}'s {fixed}")
                return
    raise MxsimError(f"{hw.name}: takes no {choices['input'].format} x {choices['weight'].format} pair (input x "
                     f"weight) and neither format is replay's to change; it takes "
                     f"{', '.join(f'{a} x {b}' for a, b in pairs)}")


def choose_operand(operand, name: str, spec, hw: HardwareConfig, element_format: str | None,
                   per_tensor_scale: bool | None = None, strict: bool = False) -> tuple[OperandChoice, dict]:
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

    ``per_tensor_scale``: None follows the unit (per-tensor when it has no block scales);
    True forces it; False on a unit without block scales is an error. Per-tensor scaling by
    the amax rule is FP8 practice; formats as wide as fp16, bf16 and tf32 take the values
    rounded straight in (scale 1, a framework's cast): scaled up to their largest values,
    products would overflow the unit's sums."""
    choice, options = _choose_scaling(operand, name, spec, hw, element_format, per_tensor_scale)
    if strict and choice.status == "replaced":
        raise MxsimError(f"{hw.name}: {choice.note} (strict)")
    if choice.per_tensor_scale and get_format(choice.format).role in ("wide", "tensor_input"):
        choice = dataclasses.replace(choice, tensor_scale_exponent=0)
    return choice, options


def _choose_scaling(operand, name: str, spec, hw: HardwareConfig, element_format: str | None,
                    per_tensor_scale: bool | None) -> tuple[OperandChoice, dict]:
    """:func:`choose_operand` before the strict and wide-format rules."""
    accepted = hw.a_formats if name == "input" else hw.b_formats
    block = hw.sections[("inputs", "block_size")]
    per_tensor = hw.sections[("inputs", "scales")] == "none"
    if per_tensor_scale is not None:
        if per_tensor and not per_tensor_scale:
            raise MxsimError(f"{hw.name} has no block scales: its operands need per-tensor scaling")
        per_tensor = per_tensor_scale
    base = dict(block_size=block, spec=operand.spec, layout=operand.layout)
    if element_format is not None:
        fmt = get_format(element_format).name
        if fmt not in accepted:
            raise MxsimError(f"{hw.name} does not take {fmt} for the {name}; it takes {', '.join(accepted)}")
        return OperandChoice(fmt, "ocp", per_tensor, "format chosen by the caller", status="caller", **base), {}
    fmt = operand.element_format.name
    if operand.quantized:
        if fmt in accepted and not per_tensor and operand.granule and operand.granule % block == 0:
            return OperandChoice(fmt, getattr(spec, "profile", "bfp"), False, status="model",
                                 saturated=operand.saturated, underflowed=operand.underflowed, **base), {}
        reasons = []
        if fmt not in accepted:
            reasons.append(f"takes {', '.join(accepted)}, not {fmt}")
        if per_tensor:
            reasons.append("has no block scales")
        elif not operand.granule or operand.granule % block:
            reasons.append(f"blocks of {block} do not fit the model's blocks ({operand.layout})")
        note = f"the unit cannot take {operand.spec}: it {'; '.join(reasons)}"
        status = "replaced"
    else:
        note, status = f"the model multiplies {operand.spec} values; the unit needs a quantization", "added"
    if isinstance(spec, MXQuant) and spec.format in accepted:
        return OperandChoice(spec.format, spec.profile, per_tensor, note, status=status, **base), dict(spec.options)
    return OperandChoice(accepted[0], "ocp", per_tensor, note, status=status, **base), {}


def _operand_of_tensors(tensors: list[MXTensor], template: GemmOperand) -> GemmOperand:
    """A GemmOperand holding replay's own quantization of an operand (for the ideal of its row)."""
    block = tensors[0].block_size
    codes = np.stack([t.codes for t in tensors])
    scales = np.stack([np.repeat(t.scales.astype(np.int32), block, axis=1) + t.tensor_scale_exponent for t in tensors])
    return dataclasses.replace(template, element_format=tensors[0].element_format, pieces=[codes],
                               scales=scales.astype(np.uint8), granule=block, quantized=True, exact=True)


@dataclass
class LayerRun:
    """Everything one layer through one unit produced (see :func:`run_layer`).

    ``values``/``ideal``: outputs in the layer's layout (float64); ``gemm_values``/
    ``gemm_ideal``: (G, M, N) including the bias where it entered as c (ideal: None when
    skipped); ``bits``: the unit's
    raw output bits (G, M, N); ``operands``: the model's operands and bias; ``attribution``:
    :func:`mxsim.replay.attribution.layer_attribution` of the operands the unit got (None
    without the ideal).
    """

    values: np.ndarray
    ideal: np.ndarray | None
    bits: np.ndarray
    gemm_values: np.ndarray
    gemm_ideal: np.ndarray | None
    input: OperandChoice
    weight: OperandChoice
    ideal_exact: bool
    operands: LayerOperands
    attribution: dict | None = None


def run_layer(layer: Layer, hw: HardwareConfig, x: np.ndarray | None = None, element_format: str | None = None,
              conv_order: str = "kh_kw_c", ideal=None, operands: LayerOperands | None = None,
              with_ideal: bool = True, matmul_fn: Callable | None = None, *, weight_format: str | None = None,
              per_tensor_scale: bool | None = None, out_format: str | None = None, strict: bool = False,
              count_clipped: bool = True, weight_quantizations: dict | None = None) -> LayerRun:
    """``layer`` (its recorded input, or ``x``) through ``hw``.

    The ideal is that of the operands the unit got: the model's own (:func:`ideal_gemm` of
    ``operands``) when the unit took both, else with replay's quantization of the others.
    ``operands`` (from :func:`layer_operands`) and the model's ideal ``ideal`` (a tuple from
    :func:`ideal_gemm`, or a function returning it) may be passed in when already computed
    for this layer. ``with_ideal=False`` skips the ideal (``ideal`` and ``gemm_ideal`` are
    then None), as end-to-end runs do. The layer's groups (attention heads, conv groups) run
    in one :func:`mxsim.matmul_batched` call; ``matmul_fn`` stands in for :func:`mxsim.matmul`
    called per group (e.g. :class:`mxsim.parallel.TiledMatmul`, which splits large GEMMs into
    cluster tasks).
    ``weight_format``: the weight's format when it differs from ``element_format``;
    ``per_tensor_scale`` and ``strict`` as in :func:`choose_operand`; ``out_format`` overrides
    the unit's output.
    ``count_clipped=False`` leaves the saturated/underflowed counts of operands replay
    quantizes itself at 0 (in the loop nobody reads them).
    ``weight_quantizations``: replay's quantizations of this layer's weight kept across calls
    (the caller's, for one weight whose values it vouches unchanged since the mapping was
    filled): looked up, or filled, by everything else the quantization depends on
    (:func:`_weight_quantization_key`); stochastic rounding is never kept."""
    at = layer if x is None else layer_with_input(layer, x)
    ops = operands if operands is not None else layer_operands(at, conv_order, float_pieces=with_ideal)
    shape = gemm_shape(at)
    gemm_operands = {"input": ops.a, "weight": ops.b}
    choices, tensors, quantize_options = {}, {}, {}
    try:
        for name, operand in gemm_operands.items():
            chosen_format = (weight_format or element_format) if name == "weight" else element_format
            choices[name], quantize_options[name] = choose_operand(operand, name, at.quant.get(name), hw, chosen_format,
                                                                   per_tensor_scale, strict)
        _pair_choices(choices, quantize_options, gemm_operands, at, hw, per_tensor_scale)
    except MxsimError as error:
        raise MxsimError(f"layer {at.name!r} on {error}") from None
    for name, operand in gemm_operands.items():
        choice, options = choices[name], quantize_options[name]
        if choice.status == "model":
            tensors[name] = [operand.unit_tensor(g, choice.block_size) for g in range(shape.groups)]
        else:
            if name in at.codes_only:
                choice.note += "; from the model's quantized values (the trace keeps no float)"
            floats = ops.a_float if name == "input" else ops.b_float
            key = None if name == "input" or weight_quantizations is None else \
                _weight_quantization_key(at, conv_order, floats, choice, options, count_clipped)
            quantized = None if key is None else weight_quantizations.get(key)
            if quantized is None:
                quantized = _requantize(floats, choice, options, count_clipped)
                if key is not None:
                    weight_quantizations[key] = quantized
            tensors[name], choice.saturated, choice.underflowed = quantized
    if not with_ideal:
        gemm_ideal, exact = None, False
    elif choices["input"].status == choices["weight"].status == "model":
        gemm_ideal, exact = ideal() if callable(ideal) else ideal if ideal is not None else ideal_gemm(at, ops)
    else:  # the ideal of the operands this unit got
        unit_ops = dataclasses.replace(
            ops, a=ops.a if choices["input"].status == "model" else _operand_of_tensors(tensors["input"], ops.a),
            b=ops.b if choices["weight"].status == "model" else _operand_of_tensors(tensors["weight"], ops.b))
        gemm_ideal, exact = ideal_gemm(at, unit_ops)
    scaled_linear = at.op == "linear" and at.attrs.get("alpha", 1.0) != 1.0
    bias = None if scaled_linear else gemm_bias(at, ops.bias)
    matmul_options = {} if out_format is None else {"out_format": out_format}
    # B as (K, N) quantized along axis 0 is the same data as B's rows (N, K) along axis 1.
    qbs = [MXTensor(rows.element_format, rows.codes, rows.scales, (rows.shape[1], rows.shape[0]), 0, rows.block_size,
                    rows.padding, rows.options, rows.tensor_scale_exponent) for rows in tensors["weight"]]
    shifts = [qa.tensor_scale_exponent + qb.tensor_scale_exponent for qa, qb in zip(tensors["input"], qbs)]
    # matmul scales c by 2^-shift itself; here only whether that is exact decides where the bias goes
    cs = [None if bias is None or accumulator_input(bias[g], shifts[g]) is None else bias[g].astype(np.float32)
          for g in range(shape.groups)]
    c_entered = [c is not None for c in cs]
    if not shape.groups:
        bits = np.empty((0, shape.m, shape.n), dtype=np.uint32)
        out = np.empty(bits.shape)
    elif matmul_fn is None:  # all groups (attention heads, conv groups) in one batched call
        zero = np.zeros((shape.m, shape.n), dtype=np.float32)  # +0: the c of a group without one
        c = np.stack([zero if c is None else c for c in cs]) if any(c_entered) else None
        batch = matmul_batched(hw, tensors["input"], qbs, c=c, **matmul_options)
        bits, out = batch.bits, batch.values
    else:
        results = [matmul_fn(hw, qa, qb, c=c, **matmul_options) for qa, qb, c in zip(tensors["input"], qbs, cs)]
        # decoded once for all groups: MatmulResult.values, group by group, in one call
        bits = np.stack([r.bits for r in results])
        out = as_float(bits, results[0].out_format)
        exponents = np.array([r.scale_exponent for r in results], dtype=np.int32).reshape(-1, 1, 1)
        out = times_power_of_two(out, exponents) if exponents.any() else out
    if bias is not None and not all(c_entered):
        late = ~np.array(c_entered)
        out[late] += bias[late]
    lift_bias = ops.bias if scaled_linear else None
    ideal_values = None if gemm_ideal is None else lift_output(at, gemm_ideal, lift_bias)
    attribution = None
    if with_ideal:  # a replay row (not the unit in the loop): where its error comes from
        a, b = ops.a_float.astype(np.float64), ops.b_float.astype(np.float64)
        attribution = layer_attribution(at, a, _unit_values(tensors["input"], a.shape), b,
                                        _unit_values(tensors["weight"], b.shape), shape.k // shape.k_run, conv_order)
    return LayerRun(lift_output(at, out, lift_bias), ideal_values, bits, out, gemm_ideal, choices["input"],
                    choices["weight"], exact, ops, attribution)


def _unit_values(tensors: list[MXTensor], shape: tuple) -> np.ndarray:
    """The exact values (float64) of a unit's operand, one MXTensor (R, K') per group, cut or
    zero-padded along K to ``shape`` (G, R, K)."""
    values = np.zeros(shape, dtype=np.float64)
    for g, tensor in enumerate(tensors):
        got = tensor.dequantize(np.float64)
        k = min(got.shape[-1], shape[-1])
        values[g, :, :k] = got[:, :k]
    return values


def _output_ulp(rms: float, out_format: str) -> float:
    """The spacing of ``out_format`` at the layer's output magnitude ``rms`` (the RMS of the
    ideal outputs): the ulp of its binade, or of the smallest normal binade below that."""
    fmt = get_format(out_format)
    exponent = math.floor(math.log2(max(rms, fmt.min_normal)))
    return 2.0 ** (exponent - fmt.mantissa_bits)


def replay_layer(layer: Layer, hw: HardwareConfig, element_format: str | None = None, conv_order: str = "kh_kw_c",
                 ideal=None, operands: LayerOperands | None = None, matmul_fn: Callable | None = None,
                 strict: bool = False) -> LayerResult:
    """One layer through one unit, with its metrics and (if the config has ``array:``) cycles.

    ``seconds`` is the time it took without compiling kernels, ``compile_seconds`` the time
    spent compiling them (nonzero only on a first run; see :mod:`mxsim._compile`)."""
    start = time.perf_counter()
    compiled_before = compile_seconds()
    run = run_layer(layer, hw, element_format=element_format, conv_order=conv_order, ideal=ideal, operands=operands,
                    matmul_fn=matmul_fn, strict=strict)
    compiling = compile_seconds() - compiled_before
    seconds = time.perf_counter() - start - compiling
    values, ideal_values = run.values, run.ideal
    reference = layer.output.astype(np.float64)
    finite = np.isfinite(values) & np.isfinite(reference) & np.isfinite(ideal_values)
    error = (values - reference)[finite]
    error_ideal = (values - ideal_values)[finite]
    scale = np.maximum(np.abs(reference[finite]), np.finfo(np.float32).tiny)
    shape = gemm_shape(layer)
    out_format = hw.sections[("output", "format")]
    ideal_rms = math.sqrt(float(np.mean(np.square(ideal_values[finite])))) if finite.any() else 0.0
    ulp = _output_ulp(ideal_rms, out_format)
    cycles = None
    if hw.array is not None:
        estimate = estimate_layer(hw.array, GemmLayer(layer.name, shape.m, shape.n * shape.groups, shape.k),
                                  storage_for_format(run.input.format), storage_for_format(run.weight.format),
                                  storage_for_format(out_format))
        cycles = {"total_cycles": estimate.total_cycles, "compute_cycles": estimate.compute_cycles,
                  "memory_cycles": estimate.memory_cycles, "utilisation": estimate.utilisation}
    same = values == ideal_values
    return LayerResult(
        layer=layer.name, hw=hw.name, macs=shape.macs, input=run.input, weight=run.weight, k=shape.k,
        bias=run.operands.bias_spec,
        sqnr_vs_float_db=_sqnr_db(reference[finite], error),
        max_abs_error_vs_float=float(np.max(np.abs(error), initial=0.0)),
        max_rel_error_vs_float=float(np.max(np.abs(error) / scale, initial=0.0)),
        rel_rms_error_vs_float=_rel_rms(reference[finite], error),
        sqnr_vs_ideal_db=_sqnr_db(ideal_values[finite], error_ideal),
        max_abs_error_vs_ideal=float(np.max(np.abs(error_ideal), initial=0.0)),
        rel_rms_error_vs_ideal=_rel_rms(ideal_values[finite], error_ideal),
        max_error_vs_ideal_ulps=float(np.max(np.abs(error_ideal), initial=0.0)) / ulp,
        mean_error_vs_ideal_ulps=float(np.mean(np.abs(error_ideal))) / ulp if error_ideal.size else 0.0,
        identical_to_ideal_fraction=float(np.mean(same)) if same.size else 1.0, ideal_rms=ideal_rms,
        ideal_exact=run.ideal_exact, seconds=seconds, compile_seconds=compiling, cycles=cycles, bits=run.bits,
        errors_vs_float=error, errors_vs_ideal=error_ideal,
        attribution=run.attribution, channel_error_shares=output_channel_shares(layer, values - reference),
    )


def replay_layer_on_units(layer: Layer, units: Sequence[HardwareConfig], element_format: str | None = None,
                          conv_order: str = "kh_kw_c", strict: bool = False,
                          matmul_fn: Callable | None = None) -> list[LayerResult]:
    """:func:`replay_layer` through each unit, the layer's operands quantized and its ideal
    computed once for all of them. ``strict``: MxsimError for a ``replaced`` row (:func:`choose_operand`)."""
    operands = layer_operands(layer, conv_order)
    memo = {}

    def ideal():  # computed once, if a unit takes the model's operands
        if "ideal" not in memo:
            memo["ideal"] = ideal_gemm(layer, operands)
        return memo["ideal"]

    return [replay_layer(layer, hw, element_format, conv_order, ideal, operands, matmul_fn, strict) for hw in units]


def end_to_end_accuracy(trace: Trace, hw: HardwareConfig, element_format: str | None = None,
                        matmul_fn: Callable | None = None, conv_order: str = "kh_kw_c", strict: bool = False) -> float:
    """Top-1 accuracy of the trace's network with every layer computed by ``hw`` (no ideal)."""
    return accuracy(trace, layer_fn=lambda layer, x: run_layer(
        layer, hw, x, element_format, conv_order, with_ideal=False, matmul_fn=matmul_fn, strict=strict,
        count_clipped=False).values)


#: Seconds the layer-name search of :func:`select_layers` may take (a time bound: Python's
#: regular expressions backtrack, and a pattern such as ``^(a+)+$`` takes exponential time).
LAYERS_MATCH_SECONDS = 10.0


def _search_child(compiled, names, connection) -> None:
    connection.send_bytes(bytes(compiled.search(name) is not None for name in names))
    connection.close()


def _search_bounded(compiled, names: list[str], pattern: str, seconds: float) -> list[bool]:
    """``compiled.search`` over ``names`` in a forked child stopped after ``seconds`` (the
    answer comes back as bytes, never pickled)."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_search_child, args=(compiled, names, sender), daemon=True)
    child.start()
    sender.close()
    try:
        if not receiver.poll(seconds):
            raise MxsimError(f"--layers {shown(pattern)}: matching the layer names took more than {seconds:g} s "
                             "(a pattern that backtracks, such as nested repetition); simplify it")
        try:
            mask = receiver.recv_bytes()
        except EOFError:  # the child died (out of memory)
            raise MxsimError(f"--layers {shown(pattern)}: matching the layer names failed") from None
    finally:
        receiver.close()
        if child.is_alive():
            child.kill()
        child.join()
    return [bool(flag) for flag in mask]


def select_layers(trace: Trace, pattern: str) -> Trace:
    """``trace`` with only the layers whose name matches the regular expression ``pattern``
    (``re.search``); its network and dataset are dropped (a subset cannot run end to end).
    MxsimError for an invalid pattern, one that matches no layer, or a search of the names
    taking more than :data:`LAYERS_MATCH_SECONDS` (run in a child process that is then
    stopped; Python's engine backtracks)."""
    try:
        compiled = re.compile(pattern)
    except (re.error, TypeError, RecursionError, OverflowError, ValueError) as error:
        raise MxsimError(f"--layers {shown(pattern)}: not a regular expression: {shown(str(error))}") from None
    names = [layer.name for layer in trace.layers]
    mask = _search_bounded(compiled, names, pattern, LAYERS_MATCH_SECONDS)
    layers = [layer for layer, keep in zip(trace.layers, mask) if keep]
    if not layers:
        first = f" (first: {shown(trace.layers[0].name)})" if trace.layers else ""
        raise MxsimError(f"--layers {shown(pattern)} matches none of the trace's {len(trace.layers)} layers{first}")
    return dataclasses.replace(trace, layers=layers, network=None, dataset=None)


def check_replay(trace: Trace, units: Sequence[HardwareConfig], end_to_end: bool = False,
                 element_format: str | None = None, conv_order: str = "kh_kw_c", strict: bool = False,
                 perplexity_fn: Callable | None = None) -> None:
    """Every check :func:`replay` makes before it starts any work; MxsimError for a request
    that cannot be met: no units or two of one name, an unknown conv order, end to end on a
    trace whose network cannot give a metric, a caller's format a unit does not take, and,
    with ``strict``, a recorded spec a unit cannot take as it is (from the specs alone:
    :func:`mxsim.replay.operands.operand_plans`)."""
    if not units:
        raise MxsimError("replay needs at least one hardware config")
    if conv_order not in CONV_ORDERS:
        raise MxsimError(f"conv order must be one of {', '.join(CONV_ORDERS)}, got {conv_order!r}")
    names = [hw.name for hw in units]
    if len(set(names)) != len(names):
        raise MxsimError(f"hardware configs must have distinct names, got {names}")
    network = trace.network
    if end_to_end:
        if network is None or (network.labels is None and network.targets is None):
            raise MxsimError(f"trace {trace.name!r}: end to end needs a network with labels (accuracy) or targets "
                             "(perplexity); this trace has "
                             + ("no network" if network is None else "a network without labels or targets"))
        if network.targets is not None and perplexity_fn is None:
            raise MxsimError(f"trace {trace.name!r} is a language model: its end to end runs in PyTorch; pass "
                             "perplexity_fn=mxsim.inloop.network.perplexity")
    if element_format is not None:  # the caller's format for every operand: one check per unit
        blank = OperandPlan(get_format("bf16"), False, 0, "float", "unquantized")
        for hw in units:
            for name in ("input", "weight"):
                choose_operand(blank, name, None, hw, element_format)
    elif strict:
        for layer in trace.layers:
            plans = operand_plans(layer, conv_order)
            for hw in units:
                for name in ("input", "weight"):
                    try:
                        choose_operand(plans[name], name, layer.quant.get(name), hw, None, strict=True)
                    except MxsimError as error:
                        raise MxsimError(f"layer {layer.name!r} on {error}") from None


def replay(trace: Trace, units: Sequence[HardwareConfig], end_to_end: bool = False,
           progress: bool = False, on_layer: Callable[[LayerResult], None] | None = None,
           element_format: str | None = None, conv_order: str = "kh_kw_c", strict: bool = False, runner=None,
           perplexity_fn: Callable[..., float] | None = None) -> dict:
    """Replay every layer of ``trace`` through each unit; totals, the worst layers, pairwise bit
    agreement and, with ``end_to_end``, the task metric with every layer computed by each unit:
    accuracy for a network with labels, perplexity for one with targets. A language model runs
    in PyTorch with the unit in the loop, in this process, through ``perplexity_fn(trace)``
    (float) and ``perplexity_fn(trace, hw, a_format=element_format)``: pass
    :func:`mxsim.inloop.network.perplexity` (this package does not import the in-the-loop
    runner).

    ``element_format``: every operand quantized to it (OCP profile) instead of the trace's
    specs. ``conv_order``: one of :data:`mxsim.replay.operands.CONV_ORDERS`. ``strict``: raise
    MxsimError when a unit cannot take a recorded spec (a ``replaced`` row) instead of
    marking the row (:func:`choose_operand`).

    Every request that cannot be met is refused before any work (:func:`check_replay`).
    Each layer (through every unit, sharing its operands and ideal) and each unit's end-to-end
    run is one task of ``runner`` (default in-process; :class:`mxsim.parallel.DaskRunner`
    spreads them over a cluster, with the same results). When tasks fail, the others still
    finish, and :class:`mxsim.errors.IncompleteResultError` is raised with the report of the
    layers that succeeded as its ``partial`` (``report["failures"]`` lists what failed); an
    internal error is re-raised with the same ``partial`` attribute.
    """
    check_replay(trace, units, end_to_end, element_format, conv_order, strict, perplexity_fn)
    runner = runner or InProcess()
    language_model = trace.network is not None and trace.network.targets is not None
    tasks = [Task(f"layer {layer.name}", replay_layer_on_units, (layer, units, element_format, conv_order, strict,
                                                                 runner.matmul))
             for layer in trace.layers]
    if end_to_end and not language_model:
        shared = runner.share(trace)
        tasks += [Task(f"end to end on {hw.name}", end_to_end_accuracy,
                       (shared, hw, element_format, runner.matmul, conv_order, strict)) for hw in units]

    def layer_done(key, value):
        if on_layer and key.startswith("layer "):
            for result in value:
                on_layer(result)

    done, failures = runner.run(tasks, progress=progress, unit="task", on_result=layer_done)
    report = _report(trace, units, element_format, conv_order, done)
    try:
        raise_failures("replay", len(tasks), failures)
        if end_to_end and language_model:
            report["end_to_end"] = {"float_perplexity": perplexity_fn(trace), "perplexity": {
                hw.name: perplexity_fn(trace, hw, a_format=element_format) for hw in units}}
        elif end_to_end:
            report["end_to_end"] = {"float_accuracy": accuracy(trace),
                                    "accuracy": {hw.name: done[f"end to end on {hw.name}"] for hw in units}}
    except MxsimError as error:
        report["failures"] = [{"task": f.key, "error": f.message} for f in failures] or [{"task": "end to end",
                                                                                        "error": str(error)}]
        raise IncompleteResultError(str(error), report) from error
    except Exception as error:
        report["failures"] = [{"task": f.key, "error": f.message} for f in failures]
        error.partial = report
        raise
    return report


def _report(trace: Trace, units: Sequence[HardwareConfig], element_format: str | None, conv_order: str,
            done: dict) -> dict:
    """The report of the layers whose task finished (``done``: task key -> results)."""
    names = [hw.name for hw in units]
    finished = [layer for layer in trace.layers if f"layer {layer.name}" in done]
    results = {hw.name: [done[f"layer {layer.name}"][i] for layer in finished] for i, hw in enumerate(units)}
    report = {"trace": trace.name, "units": names, "element_format": element_format, "conv_order": conv_order,
              "layers": [], "totals": {}, "worst": {}, "agreement": [], "end_to_end": None,
              "legend": {MARKS[s]: s for s in STATUSES if MARKS[s]}}
    for index, layer in enumerate(finished):
        report["layers"].append({"layer": layer.name, "op": layer.op, "reference": layer.reference,
                                 "results": [results[n][index].to_dict() for n in names]})
    report["references"] = {mode: sum(layer.reference == mode for layer in finished)
                            for mode in dict.fromkeys(layer.reference for layer in finished)}
    for name in names:
        rows = results[name]
        errors = np.concatenate([r.errors_vs_float for r in rows]) if rows else np.zeros(0)
        sqnrs = [r.sqnr_vs_float_db for r in rows]
        finite = [v for v in sqnrs if math.isfinite(v)]
        report["totals"][name] = {
            "macs": int(sum(r.macs for r in rows)),
            "seconds": float(sum(r.seconds for r in rows)),
            "compile_seconds": float(sum(r.compile_seconds for r in rows)),
            "worst_layer_sqnr_vs_float_db": min(sqnrs, default=math.inf),
            "mean_layer_sqnr_vs_float_db": float(np.mean(finite)) if finite else math.inf,
            "median_layer_sqnr_vs_float_db": float(np.median(sqnrs)) if sqnrs else math.inf,
            "worst_layer_sqnr_vs_ideal_db": min((r.sqnr_vs_ideal_db for r in rows), default=math.inf),
            "max_abs_error_vs_float": float(np.max(np.abs(errors), initial=0.0)),
            "max_rel_rms_error_vs_ideal": max((r.rel_rms_error_vs_ideal for r in rows), default=0.0),
            "rows": {status: sum(r.status == status for r in rows) for status in STATUSES},
            "replaced": sorted({f"{c.spec} -> {_operand_label(c)}" for r in rows for c in (r.input, r.weight)
                                if c.status == "replaced"}),
            "cycles": sum(r.cycles["total_cycles"] for r in rows) if all(r.cycles for r in rows) and rows else None,
        }
        report["worst"][name] = worst_layers(rows)
        for entry, row in zip(report["worst"][name], sorted(rows, key=lambda r: (r.sqnr_vs_float_db, r.layer))):
            entry["output_channels"] = top_shares(row.channel_error_shares)
            entry["attribution"] = row.attribution
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            same = total = 0
            for a, b in zip(results[first], results[second]):
                if a.bits.dtype == b.bits.dtype:
                    same += int(np.sum(a.bits == b.bits))
                total += a.bits.size
            report["agreement"].append({"units": [first, second], "bit_identical_fraction": same / total if total else 1.0})
    report["_results"] = results
    return report


def worst_layers(rows: Sequence[LayerResult], count: int = 5) -> list[dict]:
    """The ``count`` rows with the lowest SQNR vs float, with what made them bad."""
    ranked = sorted(rows, key=lambda r: (r.sqnr_vs_float_db, r.layer))[:count]
    return [{"layer": r.layer, "sqnr_vs_float_db": r.sqnr_vs_float_db, "sqnr_vs_ideal_db": r.sqnr_vs_ideal_db,
             "saturated": _clipped(r.input.saturated, r.weight.saturated),
             "underflowed": _clipped(r.input.underflowed, r.weight.underflowed), "k": r.k,
             "operands": f"{_operand_label(r.input)} x {_operand_label(r.weight)}",
             "layout": r.input.layout if r.input.layout == r.weight.layout else f"{r.input.layout} / {r.weight.layout}",
             "status": r.status}
            for r in ranked]


def _operand_label(choice) -> str:
    """``int8/32`` (format/block; ``pt`` per-tensor scale, ``cast`` scale 1), from a choice or its dict."""
    get = choice.get if isinstance(choice, dict) else lambda key: getattr(choice, key)
    if get("per_tensor_scale"):
        return f"{get('format')}/{'cast' if get('tensor_scale_exponent') == 0 else 'pt'}"
    return f"{get('format')}/{get('block_size')}"


def _shares(entries: list[dict], kind: str) -> str:
    return ", ".join(f"{kind} {e['index']} {100 * e['share']:.1f}%" for e in entries) or "none"


def _attribution_lines(worst: dict) -> list[str]:
    """Where a worst layer's error is (docs/replay.md, "Where the error is")."""
    if "output_channels" not in worst:
        return []
    lines = [f"error by output channel: {_shares(worst['output_channels'], 'channel')}"]
    found = worst["attribution"]
    if found is None:
        return lines + ["input columns and input vs weight: unknown (the trace keeps no float operands)"]
    lines.append(f"product error by {found['column_kind']}: {_shares(found['input_columns'], found['column_kind'].split()[-1])}")
    lines.append(f"SQNR were only the input quantized {_number(found['sqnr_input_only_db'])} dB, only the weight "
                 f"{_number(found['sqnr_weight_only_db'])} dB")
    return lines


def reference_line(references: dict) -> str:
    """Which float reference the SQNR vs float is measured against (docs/trace-format.md,
    "Reference outputs"): ``{mode: layers}``."""
    parts = []
    for mode, count in references.items():
        bits = REFERENCE_MODES.get(mode)
        what = "exact" if bits is None else f"reconstructed within 2^-{bits} of the quantization error's RMS"
        parts.append(f"{count} {mode} ({what})")
    return "float reference outputs: " + ("; ".join(parts) or "none")


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _number(value: float, digits: int = 2) -> str:
    return "inf" if value == math.inf else "-inf" if value == -math.inf else f"{value:.{digits}f}"


def format_report(report: dict) -> str:
    """The replay report as a terminal table (docs/replay.md explains every column)."""
    lines = [f"trace {report['trace']}: {len(report['layers'])} layers through {', '.join(report['units'])}"
             f" (conv K order {report.get('conv_order', 'kh_kw_c')})"]
    name_width = max([len("layer")] + [len(entry["layer"]) for entry in report["layers"]])
    unit_width = max([len("unit")] + [len(u) for u in report["units"]])
    columns = [("operands", 22), ("K", 6), ("SQNR/float", 10), ("SQNR/ideal", 10), ("relRMS/ideal", 12),
               ("ulps@rms", 9), ("sat", 6), ("uflow", 7), ("cycles", 10)]
    header = f"  {'layer':{name_width}s}  {'unit':{unit_width}s}  " + " ".join(f"{c:>{w}s}" for c, w in columns)
    lines.append(reference_line(report.get("references", {})))
    lines += [header, "-" * len(header)]
    for entry in report["layers"]:
        for r in entry["results"]:
            cycles = r["cycles"]["total_cycles"] if r["cycles"] else "-"
            operands = f"{_operand_label(r['input'])} x {_operand_label(r['weight'])}"
            cells = [operands, str(r["k"]), _number(r["sqnr_vs_float_db"]), _number(r["sqnr_vs_ideal_db"]),
                     f"{r['rel_rms_error_vs_ideal']:.2e}", f"{r['max_error_vs_ideal_ulps']:.3g}",
                     _count(_clipped(r["input"]["saturated"], r["weight"]["saturated"])),
                     _count(_clipped(r["input"]["underflowed"], r["weight"]["underflowed"])), str(cycles)]
            mark = MARKS[r["status"]] or " "
            lines.append(f"{mark} {entry['layer']:{name_width}s}  {r['hw']:{unit_width}s}  "
                         + " ".join(f"{cell:>{w}s}" for cell, (_, w) in zip(cells, columns)))
    lines.append("")
    lines.append("legend: * the unit cannot take the model's recorded quantization: replay re-quantized the operand; "
                 "+ the model multiplies this operand unquantized: replay quantized it; = format chosen by the caller. "
                 "operands: format/block for input x weight (pt: per-tensor scale). ulps@rms: max |error vs ideal| "
                 "in ulps of the unit's output format at the layer's RMS output. sat/uflow: operand elements clipped "
                 "to the largest magnitude / flushed to zero. (docs/replay.md)")
    marked = [f"{r['hw']}: {r['input']['note'] or r['weight']['note']}" for entry in report["layers"]
              for r in entry["results"] if r["status"] == "replaced"]
    for note in dict.fromkeys(marked):
        lines.append(f"  * {note}")
    lines.append("")
    for name, total in report["totals"].items():
        cycles = f", {total['cycles']} cycles" if total["cycles"] is not None else ""
        compiling = f" (+ {total['compile_seconds']:.1f} s compiling kernels)" if total["compile_seconds"] else ""
        rows = ", ".join(f"{count} {status}" for status, count in total["rows"].items() if count)
        replaced = f" (* re-quantized by replay: {'; '.join(total['replaced'])})" if total.get("replaced") else ""
        lines.append(f"total {name}: {total['macs']} MACs in {total['seconds']:.2f} s{compiling}, layer SQNR vs float "
                     f"worst {_number(total['worst_layer_sqnr_vs_float_db'])} / median "
                     f"{_number(total['median_layer_sqnr_vs_float_db'])} / mean "
                     f"{_number(total['mean_layer_sqnr_vs_float_db'])} dB, worst vs ideal "
                     f"{_number(total['worst_layer_sqnr_vs_ideal_db'])} dB; rows: {rows}{replaced}{cycles}")
    for name, worst in report.get("worst", {}).items():
        lines.append(f"worst layers on {name} (lowest SQNR vs float):")
        for w in worst:
            lines.append(f"  {w['layer']}: {_number(w['sqnr_vs_float_db'])} dB vs float, "
                         f"{_number(w['sqnr_vs_ideal_db'])} dB vs ideal; {_count(w['saturated'])} saturated, "
                         f"{_count(w['underflowed'])} underflowed to zero; K {w['k']}; {w['operands']}; {w['layout']}")
            lines.extend(f"    {line}" for line in _attribution_lines(w))
    for pair in report["agreement"]:
        lines.append(f"bit-identical outputs {pair['units'][0]} vs {pair['units'][1]}: {100 * pair['bit_identical_fraction']:.2f}%")
    for failure in report.get("failures", []):
        lines.append(f"FAILED {failure['task']}: {failure['error']}")
    if report["end_to_end"]:
        e2e = report["end_to_end"]
        if "perplexity" in e2e:
            lines.append(f"end to end: float perplexity {e2e['float_perplexity']:.4f}")
            lines += [f"  {name}: perplexity {value:.4f}" for name, value in e2e["perplexity"].items()]
        else:
            lines.append(f"end to end: float accuracy {100 * e2e['float_accuracy']:.2f}%")
            for name, value in e2e["accuracy"].items():
                mark = " (* with re-quantized layers)" if report["totals"][name]["rows"]["replaced"] else ""
                lines.append(f"  {name}: accuracy {100 * value:.2f}%{mark}")
    return "\n".join(lines)


def _save(figure, path: Path) -> None:
    temporary = path.with_name(path.name + ".tmp")
    figure.savefig(temporary, format="png")
    temporary.replace(path)


def plot_ceiling(values) -> float:
    """Where the overview draws infinite SQNRs (no error): 10 dB above the largest finite value
    of every unit's rows (200 dB when none is finite)."""
    finite = [v for v in values if math.isfinite(v)]
    return max(finite) + 10 if finite else 200.0


def write_plots(report: dict, directory) -> list[str]:
    """PNG plots (needs matplotlib): ``overview.png`` (SQNR vs float and vs ideal of every layer
    on every unit) and per layer ``NNN-<layer>.png`` (histograms of |error vs ideal| relative to
    the layer's RMS output, one per unit, log axes). File names come from sanitised names and
    are checked to lie inside ``directory``; each file is written atomically."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MxsimError("--plots needs matplotlib: pip install 'mxsim[plots]'") from None
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    results = report["_results"]
    layers = [entry["layer"] for entry in report["layers"]]
    written = []
    figure, axes = plt.subplots(2, 1, figsize=(max(6, 0.35 * len(layers) + 3), 7), sharex=True)
    for axis, key in zip(axes, ("sqnr_vs_float_db", "sqnr_vs_ideal_db")):
        # one ceiling for every unit: an identical row (inf dB) is drawn above every finite one
        ceiling = plot_ceiling([getattr(r, key) for rows in results.values() for r in rows])
        for name, rows in results.items():
            values = [min(getattr(r, key), ceiling) for r in rows]
            axis.plot(range(len(rows)), values, marker="o", label=name)
    axes[0].set_ylabel("SQNR vs float (dB)")
    axes[1].set_ylabel("SQNR vs ideal (dB)\n(identical: plotted at the top)")
    axes[1].set_xticks(range(len(layers)))
    axes[1].set_xticklabels([f"{i}: {n[-40:]}" for i, n in enumerate(layers)], rotation=90, fontsize=7)
    axes[0].legend(fontsize=8)
    axes[0].set_title(f"{report['trace']}: every layer on every unit")
    figure.tight_layout()
    path = safe_output_path(directory, "overview", ".png")
    _save(figure, path)
    plt.close(figure)
    written.append(str(path))
    for index, layer in enumerate(layers):
        figure, axis = plt.subplots(figsize=(6, 3.5))
        plotted = False
        for name, rows in results.items():
            errors = np.abs(rows[index].errors_vs_ideal)
            scale = rows[index].ideal_rms
            relative = errors[errors > 0] / scale if scale > 0 else np.zeros(0)
            exact = int(np.sum(errors == 0))
            if relative.size:
                bins = np.logspace(np.log10(relative.min()), np.log10(relative.max()) + 1e-9, 40)
                axis.hist(relative, bins=bins, histtype="step", label=f"{name} ({exact} exact)")
                plotted = True
            else:
                axis.plot([], [], label=f"{name}: all {exact} outputs equal the ideal")
        if plotted:  # log axes need data
            axis.set_xscale("log")
            axis.set_yscale("log")
        axis.set_xlabel("|output - ideal| / RMS(ideal output)")
        axis.set_ylabel("outputs")
        axis.set_title(f"{layer}"[-70:], fontsize=8)
        axis.legend(fontsize=7)
        figure.tight_layout()
        path = safe_output_path(directory, f"{index:03d}-{safe_file_stem(layer, default='layer')}", ".png")
        _save(figure, path)
        plt.close(figure)
        written.append(str(path))
    return written


