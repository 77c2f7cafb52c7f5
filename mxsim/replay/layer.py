"""One layer through one unit: :func:`run_layer` (its outputs, what :mod:`mxsim.inloop`
calls) and :func:`replay_layer` (a replay row: those outputs measured against the float
reference and the ideal, and the cycle estimate).

Per layer (docs/replay.md defines everything precisely):

* The model's operands (:mod:`mxsim.replay.operands`): each operand quantized by its recorded
  spec in its own layout and lowered to the GEMM the unit sees (conv: K ordered
  (kh, kw, C) with C blocked and padded per tap, by default); the bias through its
  recorded bias quantizer.
* The ideal: the exact sum of the products of the operands the unit got plus the bias,
  rounded once to fp32 (:func:`mxsim.replay.operands.ideal_gemm`) — on rows where the unit
  takes the model's operands, the model's own quantized computation.
* Per unit, what it gets for each operand (:func:`mxsim.replay.choice.choose_operand`);
  replay's own quantization along K where it is not the model's (per-tensor scaling through
  ``mxsim.quantize_mx(..., per_tensor_scale=True)``). The bias enters as the accumulator
  input c when it is exact in fp32 (else it is added in float64 after the GEMM).
  ``mxsim.matmul`` computes every output bit.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .._compile import compile_seconds
from ..cycles import GemmLayer, estimate_layer, storage_for_format
from ..datapath import HardwareConfig, matmul_batched
from ..datapath.api import as_float_times_power_of_two
from ..errors import MxsimError
from ..formats import E8M0_ONE, get_format
from ..quantize import (
    NVFP4_PROFILES,
    MXGroups,
    NVFP4Groups,
    NVFP4Options,
    quantize,
    quantize_bfp,
    quantize_grouped,
    quantize_nvfp4_grouped,
    resolve_options,
)
from ..trace.model import Layer
from .attribution import layer_attribution, output_channel_shares
from .choice import OperandChoice, choose_operand, pair_choices
from .lowering import gemm_view
from .network import layer_with_input
from .operands import (
    BF16,
    GemmOperand,
    pad_k,
    LayerOperands,
    accumulator_input,
    clip_counts,
    ideal_gemm,
    layer_operands,
    nvfp4_operand,
    tensor_scales,
)


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


def by_shared_exponents(choice: OperandChoice) -> bool:
    """Whether :func:`_requantize` quantizes to ``choice`` by its shared-microexponent format's
    own quantizer (:func:`mxsim.quantize.quantize_bfp`) rather than by MX blocks."""
    fmt = get_format(choice.format)
    return (
        fmt.role == "bfp_element"
        and fmt.subblock_size == choice.block_size
        and not choice.per_tensor_scale
    )


def _requantize(
    values: np.ndarray, choice: OperandChoice, options: dict, count_clipped: bool = True
) -> tuple[MXGroups, int, int]:
    """Replay's own quantization of a lowered operand (G, R, K) along K, each group a tensor
    of its own, held as one (:func:`mxsim.quantize.quantize_grouped`: one kernel call for all
    groups); with ``count_clipped`` the saturated and underflowed elements too (else 0, 0). A
    shared-microexponent format (MX4/6/9) on a unit whose blocks are its sub-blocks is
    quantized as that format defines it (:func:`mxsim.quantize.quantize_bfp`: one 8-bit
    exponent per block of 16, a microexponent per sub-block), not with a free scale per
    sub-block, which no such tensor has. A unit with UE4M3 block scales gets NVFP4
    (:func:`_requantize_nvfp4`)."""
    if choice.float_scales:
        return _requantize_nvfp4(values, choice, count_clipped)
    if by_shared_exponents(choice):
        whole = quantize_bfp(
            values, choice.format, axis=2
        ).as_mx_tensor()  # one call for all groups
        tensors = MXGroups(
            whole.element_format,
            whole.codes,
            whole.scales,
            values.shape[1:],
            1,
            whole.block_size,
            whole.padding,
            whole.options,
            np.zeros(len(values), dtype=np.int64),
        )
    else:
        tensors = _requantize_mx(values, choice, options)
    if not count_clipped:
        return tensors, 0, 0
    counts = [clip_counts(matrix, tensors.group(g)) for g, matrix in enumerate(values)]
    return tensors, sum(c[0] for c in counts), sum(c[1] for c in counts)


def placeholder_quantization(
    values: np.ndarray, choice: OperandChoice, options: dict, count_clipped: bool = True
) -> tuple[MXGroups, int, int]:
    """What :func:`_requantize` returns, of the same layout and types, every element code 0
    and every scale 1 (E8M0 127), with nothing compiled: for warming the kernels a unit's
    route calls on such operands (they compile per argument type, not per value) while
    another process compiles the quantizers (:mod:`mxsim.replay.warmup`). Not a quantization
    of ``values``. Shared-microexponent formats (:func:`by_shared_exponents`) are quantized
    (their MX view's layout is the quantizer's to say); NVFP4 gets scales of 1 and no tensor
    scales."""
    if by_shared_exponents(choice):
        return _requantize(values, choice, options, False)
    fmt = get_format(choice.format)
    groups, rows, k = values.shape
    if choice.float_scales:
        blocks = -(-k // choice.block_size)
        one = get_format(choice.scale_format).encode(np.array([1.0]))[0]
        nvfp4 = NVFP4Groups(
            np.zeros((groups, rows, blocks * choice.block_size), dtype=np.uint8),
            np.full((groups, rows, blocks), one, dtype=np.uint8),
            (None,) * groups,
            _nvfp4_options(choice),
        )
        return nvfp4, 0, 0
    blocks = -(-k // choice.block_size)
    exponent = choice.tensor_scale_exponent if choice.per_tensor_scale else None
    tensors = MXGroups(
        fmt,
        np.zeros((groups, rows, blocks * choice.block_size), dtype=fmt.code_dtype),
        np.full((groups, rows, blocks), E8M0_ONE, dtype=np.uint8),
        (rows, k),
        1,
        choice.block_size,
        blocks * choice.block_size - k,
        resolve_options(choice.profile, **options),
        np.full(groups, exponent or 0, dtype=np.int64),
    )
    return tensors, 0, 0


def _requantize_nvfp4(
    values: np.ndarray, choice: OperandChoice, count_clipped: bool
) -> tuple[NVFP4Groups, int, int]:
    """:func:`_requantize` into NVFP4 (:func:`mxsim.quantize.quantize_nvfp4_grouped`, the
    choice's profile, the unit's element and scale formats and block): each group along K, its
    float32 values (as torchao casts), K zero-padded to whole blocks; with
    ``choice.per_tensor_scale`` each group's tensor scale from its amax, else single-level."""
    floats = np.asarray(values, dtype=np.float32)
    k = floats.shape[-1]
    tensors = quantize_nvfp4_grouped(
        pad_k(floats, choice.block_size),
        "amax" if choice.per_tensor_scale else None,
        choice.profile,
        **dataclasses.asdict(_nvfp4_options(choice)),
    )
    if not count_clipped:
        return tensors, 0, 0
    element = get_format(choice.format)
    quantized = tensors.exact_values()[..., :k]
    finite = np.isfinite(floats)
    largest = np.abs(element.decode(tensors.codes[..., :k])) >= element.max_finite
    saturated = finite & largest & (np.abs(floats) > np.abs(quantized))
    underflowed = finite & (floats != 0) & (quantized == 0)
    return tensors, int(saturated.sum()), int(underflowed.sum())


def _nvfp4_options(choice: OperandChoice) -> NVFP4Options:
    """The NVFP4 options of ``choice``: its profile's, with the unit's formats and block."""
    return dataclasses.replace(
        NVFP4_PROFILES[choice.profile],
        element_format=choice.format,
        scale_format=choice.scale_format,
        block_size=choice.block_size,
    )


def _model_nvfp4(layer: Layer, name: str, gemm) -> NVFP4Groups:
    """The model's NVFP4 operand ``name`` as the unit takes it: one NVFP4 tensor per group of
    the lowered GEMM (:func:`mxsim.replay.operands.nvfp4_operand`), all with its tensor scale."""
    spec = layer.quant[name]
    codes, scales, tensor_scale = nvfp4_operand(layer, name, gemm)
    return NVFP4Groups(codes, scales, (tensor_scale,) * len(codes), NVFP4_PROFILES[spec.profile])


def _requantize_mx(values: np.ndarray, choice: OperandChoice, options: dict) -> MXGroups:
    """:func:`_requantize` by the OCP block quantizer, with the choice's profile and options."""
    kwargs = dict(
        block_size=choice.block_size,
        profile=choice.profile,
        per_tensor_scale=choice.per_tensor_scale,
        tensor_scale_exponent=choice.tensor_scale_exponent,
        **options,
    )
    if (
        resolve_options(choice.profile, **options).element_rounding == "stochastic"
    ):  # each group's own stream
        return MXGroups.of([quantize(matrix, choice.format, axis=1, **kwargs) for matrix in values])
    return quantize_grouped(values, choice.format, **kwargs)


def _quantization_key(
    layer: Layer,
    conv_order: str,
    floats: np.ndarray,
    choice: OperandChoice,
    options: dict,
    count_clipped: bool,
) -> tuple | None:
    """What :func:`_requantize` of a lowered operand ``floats`` depends on besides the operand's
    values: the layer's lowering (op, attributes, both operands' specs, which set the K
    padding, the conv order), the lowered array's shape and dtype, and the quantization chosen;
    None for stochastic rounding (each call draws its own stream)."""
    if resolve_options(choice.profile, **options).element_rounding == "stochastic":
        return None
    return (
        layer.op,
        repr(sorted(layer.attrs.items())),
        repr(layer.quant.get("input")),
        repr(layer.quant.get("weight")),
        conv_order,
        floats.shape,
        floats.dtype.str,
        choice.format,
        choice.profile,
        choice.per_tensor_scale,
        choice.tensor_scale_exponent,
        choice.block_size,
        choice.scale_format,
        repr(sorted(options.items())),
        count_clipped,
    )


def _operand_of_tensors(tensors: MXGroups | NVFP4Groups, template: GemmOperand) -> GemmOperand:
    """A GemmOperand holding replay's own quantization of an operand (for the ideal of its row):
    NVFP4's e * s exactly as bf16 codes (2 and 4 significant bits), each group's tensor scale
    as the operand's (G, 1, 1) ``tensor_scale``."""
    if isinstance(tensors, NVFP4Groups):
        pieces = tensors.exact_values(with_tensor_scales=False)
        return dataclasses.replace(
            template,
            element_format=BF16,
            pieces=[BF16.encode(pieces)],
            scales=np.full(pieces.shape, E8M0_ONE, dtype=np.uint8),
            granule=0,
            quantized=True,
            exact=True,
            tensor_scale=tensors.tensor_scale_array().reshape(-1, 1, 1),
        )
    block = tensors.block_size
    scales = (
        np.repeat(tensors.scales.astype(np.int32), block, axis=2)
        + tensors.tensor_scale_exponents[:, None, None]
    )
    return dataclasses.replace(
        template,
        element_format=tensors.element_format,
        pieces=[tensors.codes],
        scales=scales.astype(np.uint8),
        granule=block,
        quantized=True,
        exact=True,
        tensor_scale=None,
    )


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


def run_layer(
    layer: Layer,
    hw: HardwareConfig,
    x: np.ndarray | None = None,
    element_format: str | None = None,
    conv_order: str = "kh_kw_c",
    ideal=None,
    operands: LayerOperands | None = None,
    with_ideal: bool = True,
    matmul_fn: Callable | None = None,
    *,
    weight_format: str | None = None,
    per_tensor_scale: bool | None = None,
    out_format: str | None = None,
    strict: bool = False,
    count_clipped: bool = True,
    weight_quantizations: dict | None = None,
    input_quantizations: dict | None = None,
    weight_memo: dict | None = None,
    requantize: Callable | None = None,
) -> LayerRun:
    """``layer`` (its recorded input, or ``x``) through ``hw``.

    The ideal is that of the operands the unit got: the model's own (:func:`ideal_gemm` of
    ``operands``) when the unit took both, else with replay's quantization of the others.
    ``operands`` (from :func:`layer_operands`) and the model's ideal ``ideal`` (a tuple from
    :func:`ideal_gemm`, or a function returning it) may be passed in when already computed
    for this layer. ``with_ideal=False`` skips the ideal (``ideal`` and ``gemm_ideal`` are
    then None), as end-to-end runs do. The layer's groups (attention heads, conv groups) run
    in one :func:`mxsim.matmul_batched` call; ``matmul_fn`` stands in for :func:`mxsim.matmul`
    called per group (e.g. :class:`mxsim.parallel.TiledMatmul`, which splits large GEMMs into
    cluster tasks) on MX operands (NVFP4 groups always take the one batched call).
    ``weight_format``: the weight's format when it differs from ``element_format``;
    ``per_tensor_scale`` and ``strict`` as in :func:`choose_operand`; ``out_format`` overrides
    the unit's output.
    ``count_clipped=False`` leaves the saturated/underflowed counts of operands replay
    quantizes itself at 0 (in the loop nobody reads them).
    ``weight_quantizations``: replay's quantizations of this layer's weight kept across calls
    (the caller's, for one weight whose values it vouches unchanged since the mapping was
    filled): looked up, or filled, by everything else the quantization depends on
    (:func:`_quantization_key`); stochastic rounding is never kept.
    ``input_quantizations``: the same for this layer's input (several layers reading one
    activation, as attention's query, key and value projections do, quantize it once).
    ``weight_memo``: a mapping for :func:`mxsim.matmul_batched`'s ``b_memo`` of this layer's
    weight, one per quantization of it (the caller vouches for the weight as for
    ``weight_quantizations``; a weight the unit takes as the model quantized it, or one
    quantized stochastically, is not kept): its decoded forms kept across calls."""
    if operands is None:  # the layer lowered once, for the input it gets
        view = gemm_view(layer, None if x is None else np.shape(x))
        at = layer if x is None else layer_with_input(layer, x, view.output_shape)
        ops = layer_operands(at, conv_order, float_pieces=with_ideal, view=view)
    else:
        at, ops = layer if x is None else layer_with_input(layer, x), operands
    view, shape = ops.gemm.view, ops.gemm.shape
    gemm_operands = {"input": ops.a, "weight": ops.b}
    choices, tensors, quantize_options = {}, {}, {}
    b_memo = None
    try:
        for name, operand in gemm_operands.items():
            chosen_format = (
                (weight_format or element_format) if name == "weight" else element_format
            )
            choices[name], quantize_options[name] = choose_operand(
                operand, name, at.quant.get(name), hw, chosen_format, per_tensor_scale, strict
            )
        pair_choices(choices, quantize_options, gemm_operands, at, hw, per_tensor_scale)
    except MxsimError as error:
        raise MxsimError(f"layer {at.name!r} on {error}") from None
    for name, operand in gemm_operands.items():
        choice, options = choices[name], quantize_options[name]
        if choice.status == "model" and choice.float_scales:
            tensors[name] = _model_nvfp4(at, name, ops.gemm) if shape.groups else None
        elif choice.status == "model":
            tensors[name] = (
                MXGroups.of(
                    [operand.unit_tensor(g, choice.block_size) for g in range(shape.groups)]
                )
                if shape.groups
                else None
            )
        else:
            if name in at.codes_only:
                choice.note += "; from the model's quantized values (the trace keeps no float)"
            floats = ops.a_float if name == "input" else ops.b_float
            kept = weight_quantizations if name == "weight" else input_quantizations
            key = (
                None
                if kept is None
                else _quantization_key(at, conv_order, floats, choice, options, count_clipped)
            )
            quantized = None if key is None else kept.get(key)
            if quantized is None:
                quantized = (requantize or _requantize)(floats, choice, options, count_clipped)
                if key is not None:
                    kept[key] = quantized
            tensors[name], choice.saturated, choice.underflowed = quantized
            if name == "weight" and weight_memo is not None and key is not None:
                b_memo = weight_memo.setdefault(key, {})
    # the model's operand as layer_operands read it (an NVFP4 one's are its float values)
    as_read = {n: c.status == "model" and not c.float_scales for n, c in choices.items()}
    if not with_ideal:
        gemm_ideal, exact = None, False
    elif as_read["input"] and as_read["weight"]:
        gemm_ideal, exact = (
            ideal() if callable(ideal) else ideal if ideal is not None else ideal_gemm(ops)
        )
    else:  # the ideal of the operands this unit got
        unit_ops = dataclasses.replace(
            ops,
            a=ops.a if as_read["input"] else _operand_of_tensors(tensors["input"], ops.a),
            b=ops.b if as_read["weight"] else _operand_of_tensors(tensors["weight"], ops.b),
        )
        gemm_ideal, exact = ideal_gemm(unit_ops)
    scaled_linear = view.op == "linear" and view.alpha != 1.0
    bias = None if scaled_linear else view.gemm_bias(ops.bias)
    taken = {  # the model's operands as the unit got them (tensor scales of those taken)
        name: operand
        if choices[name].status == "model"
        else dataclasses.replace(operand, tensor_scale=None)
        for name, operand in gemm_operands.items()
    }
    scaled = tensor_scales(taken["input"], taken["weight"])
    matmul_options = {} if out_format is None else {"out_format": out_format}
    qa, rows = tensors["input"], tensors["weight"]
    nvfp4 = isinstance(qa, NVFP4Groups)
    # B as (K, N) quantized along axis 0 is the same data as B's rows (N, K) along axis 1.
    qb = (
        rows
        if rows is None or nvfp4  # NVFP4 takes B^T (N, K)
        else dataclasses.replace(rows, shape=rows.shape[::-1], axis=0)
    )
    shifts = (
        qa.tensor_scale_exponents + qb.tensor_scale_exponents
        if shape.groups and not nvfp4
        else np.zeros(shape.groups, dtype=np.int64)
    )
    # matmul scales c by 2^-shift itself; here only whether that is exact decides where the bias goes
    # NVFP4: the bias after the tensor scales, as the GEMM epilogue adds it
    cs = [
        None if bias is None or scaled is not None or nvfp4 else _bias_as_c(bias[g], shifts[g])
        for g in range(shape.groups)
    ]
    c_entered = [c is not None for c in cs]
    if not shape.groups:
        bits = np.empty((0, shape.m, shape.n), dtype=np.uint32)
        out = np.empty(bits.shape)
    elif matmul_fn is None or nvfp4:  # all groups (attention heads, conv groups) in one call
        if not any(c_entered):
            c = None
        elif len(cs) == 1:  # one group: its c as it is (no copy)
            c = cs[0][None]
        else:
            zero = np.zeros((shape.m, shape.n), dtype=np.float32)  # +0: a group without c
            c = np.stack([zero if c is None else c for c in cs])
        batch = matmul_batched(hw, qa, qb, c=c, b_memo=b_memo, **matmul_options)
        bits, out = batch.bits, batch.values
    else:
        results = [
            matmul_fn(hw, ta, tb, c=c, **matmul_options)
            for ta, tb, c in zip(qa.tensors(), qb.tensors(), cs)
        ]
        # decoded once for all groups: MatmulResult.values, group by group, in one call
        bits = np.stack([r.bits for r in results])
        exponents = np.array([r.scale_exponent for r in results], dtype=np.int32).reshape(-1, 1, 1)
        out = as_float_times_power_of_two(bits, results[0].out_format, exponents)
    if scaled is not None:  # tensor-scaled operands: the scales multiply the unit's sums
        out = out * scaled
    if bias is not None and not all(c_entered):
        late = ~np.array(c_entered)
        out[late] += bias[late]
    lift_bias = ops.bias if scaled_linear else None
    ideal_values = None if gemm_ideal is None else view.lift(gemm_ideal, lift_bias)
    attribution = None
    if with_ideal:  # a replay row (not the unit in the loop): where its error comes from
        a, b = ops.a_float.astype(np.float64), ops.b_float.astype(np.float64)
        attribution = layer_attribution(
            at,
            a,
            _unit_values(tensors["input"], a.shape, taken["input"].tensor_scale),
            b,
            _unit_values(tensors["weight"], b.shape, taken["weight"].tensor_scale),
            shape.k // shape.k_run,
            conv_order,
        )
    return LayerRun(
        view.lift(out, lift_bias),
        ideal_values,
        bits,
        out,
        gemm_ideal,
        choices["input"],
        choices["weight"],
        exact,
        ops,
        attribution,
    )


def _bias_as_c(bias: np.ndarray, shift: int) -> np.ndarray | None:
    """A group's bias (float64) as matmul's float32 c, which matmul scales by 2^-shift
    itself; None when that value is not exact (:func:`accumulator_input`: the bias is then
    added after the GEMM). Unshifted, accumulator_input's value is that c already."""
    if bias.ndim == 2 and len(bias) > 1 and bias.strides[0] == 0:  # one row, broadcast
        row = _bias_as_c(bias[:1], shift)  # (a linear layer's: worked on once, not per row)
        return None if row is None else np.broadcast_to(row, bias.shape)
    c = accumulator_input(bias, shift)
    return c if c is None or not shift else bias.astype(np.float32)


def _unit_values(
    tensors: MXGroups | NVFP4Groups | None, shape: tuple, tensor_scale: np.ndarray | None = None
) -> np.ndarray:
    """The values (float64) of a unit's operand, G groups (R, K') (None: no groups), cut or
    zero-padded along K to ``shape`` (G, R, K), times its tensor scale (() or (R,)), if any."""
    values = np.zeros(shape, dtype=np.float64)
    if tensors is not None:
        got = (
            tensors.exact_values()
            if isinstance(tensors, NVFP4Groups)
            else tensors.dequantize(np.float64)
        )
        k = min(got.shape[-1], shape[-1])
        values[:, :, :k] = got[:, :, :k]
    if tensor_scale is not None:
        values *= np.reshape(tensor_scale, (-1, 1))
    return values


def _output_ulp(rms: float, out_format: str) -> float:
    """The spacing of ``out_format`` at the layer's output magnitude ``rms`` (the RMS of the
    ideal outputs): the ulp of its binade, or of the smallest normal binade below that."""
    fmt = get_format(out_format)
    exponent = math.floor(math.log2(max(rms, fmt.min_normal)))
    return 2.0 ** (exponent - fmt.mantissa_bits)


def replay_layer(
    layer: Layer,
    hw: HardwareConfig,
    element_format: str | None = None,
    conv_order: str = "kh_kw_c",
    ideal=None,
    operands: LayerOperands | None = None,
    matmul_fn: Callable | None = None,
    strict: bool = False,
) -> LayerResult:
    """One layer through one unit, with its metrics and (if the config has ``array:``) cycles.

    ``seconds`` is the time it took without compiling kernels, ``compile_seconds`` the time
    spent compiling them (nonzero only on a first run; see :mod:`mxsim._compile`)."""
    start = time.perf_counter()
    compiled_before = compile_seconds()
    run = run_layer(
        layer,
        hw,
        element_format=element_format,
        conv_order=conv_order,
        ideal=ideal,
        operands=operands,
        matmul_fn=matmul_fn,
        strict=strict,
    )
    compiling = compile_seconds() - compiled_before
    seconds = time.perf_counter() - start - compiling
    values, ideal_values = run.values, run.ideal
    reference = layer.output.astype(np.float64)
    finite = np.isfinite(values) & np.isfinite(reference) & np.isfinite(ideal_values)
    error = (values - reference)[finite]
    error_ideal = (values - ideal_values)[finite]
    scale = np.maximum(np.abs(reference[finite]), np.finfo(np.float32).tiny)
    shape = run.operands.gemm.shape
    out_format = hw.sections[("output", "format")]
    ideal_rms = math.sqrt(float(np.mean(np.square(ideal_values[finite])))) if finite.any() else 0.0
    ulp = _output_ulp(ideal_rms, out_format)
    cycles = None
    if hw.array is not None:
        estimate = estimate_layer(
            hw.array,
            GemmLayer(layer.name, shape.m, shape.n * shape.groups, shape.k),
            storage_for_format(run.input.format),
            storage_for_format(run.weight.format),
            storage_for_format(out_format),
        )
        cycles = {
            "total_cycles": estimate.total_cycles,
            "compute_cycles": estimate.compute_cycles,
            "memory_cycles": estimate.memory_cycles,
            "utilisation": estimate.utilisation,
        }
    same = values == ideal_values
    return LayerResult(
        layer=layer.name,
        hw=hw.name,
        macs=shape.macs,
        input=run.input,
        weight=run.weight,
        k=shape.k,
        bias=run.operands.bias_spec,
        sqnr_vs_float_db=_sqnr_db(reference[finite], error),
        max_abs_error_vs_float=float(np.max(np.abs(error), initial=0.0)),
        max_rel_error_vs_float=float(np.max(np.abs(error) / scale, initial=0.0)),
        rel_rms_error_vs_float=_rel_rms(reference[finite], error),
        sqnr_vs_ideal_db=_sqnr_db(ideal_values[finite], error_ideal),
        max_abs_error_vs_ideal=float(np.max(np.abs(error_ideal), initial=0.0)),
        rel_rms_error_vs_ideal=_rel_rms(ideal_values[finite], error_ideal),
        max_error_vs_ideal_ulps=float(np.max(np.abs(error_ideal), initial=0.0)) / ulp,
        mean_error_vs_ideal_ulps=float(np.mean(np.abs(error_ideal))) / ulp
        if error_ideal.size
        else 0.0,
        identical_to_ideal_fraction=float(np.mean(same)) if same.size else 1.0,
        ideal_rms=ideal_rms,
        ideal_exact=run.ideal_exact,
        seconds=seconds,
        compile_seconds=compiling,
        cycles=cycles,
        bits=run.bits,
        errors_vs_float=error,
        errors_vs_ideal=error_ideal,
        attribution=run.attribution,
        channel_error_shares=output_channel_shares(layer, values - reference),
    )
