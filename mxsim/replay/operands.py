"""A layer's GEMM operands quantized in the model's own layout, and its exact ideal result.

A trace records how the model quantized each operand (:mod:`mxsim.trace.quant`): the block
axis, block size and element format of an MX spec, or a BFP spec. Replay quantizes every
operand exactly that way, *in the operand's own layout*, and only then lowers it to the GEMM
view (:mod:`mxsim.replay.lowering`): the element codes and a scale per element travel
through the lowering together, so every value the GEMM multiplies is the model's own value.

Conv lowering (``conv_order``):

* ``"kh_kw_c"`` (default, as NHWC accelerators lower a convolution): K is ordered
  (kh, kw, C) and the channels of each filter tap are padded with zeros to whole blocks of
  the model's quantizer, so that each tap contributes ``ceil(C / L) * L`` columns (L: the
  least common multiple of both operands' block lengths along C). A model block (a channel
  group of one pixel or one filter tap) is then one aligned run of K, which a unit whose
  block size divides the model's can take unchanged. Grouped convolutions are padded the
  same way when every block lies inside one group (``C/groups`` a multiple of L); blocks
  that straddle groups stay as the model made them (one scale per element, unpadded).
* ``"c_kh_kw"`` (the NCHW ``unfold`` order): K is ordered (C, kh, kw); a channel block is
  then spread over K with a stride of kh*kw, so no unit block can hold it.

Linear and matmul layers have K contiguous; their operands are padded to whole blocks at
the end of K. An operand whose blocks run along another GEMM axis (M, N) keeps one scale
per element.

An FP8 or INT8 QDQ operand (``float8e4m3fn``/``float8e5m2``/``int8``, zero point 0) whose
float scale is one per tensor, or, for a linear layer's weight, one per output feature, is
*tensor-scaled*: its levels (FP8 values, integers q as MX INT8 codes q/64 under scale 2^6) go
to the unit with a power-of-two scale and the float scale multiplies the GEMM result
afterwards, in float64 (``GemmOperand.tensor_scale``), as an FP8 or INT8 GEMM's epilogue
does; one scale for all of K, so any unit block takes it.

Any other operand without an MX/BFP spec (float, or ONNX QDQ with another float scale) is
represented exactly by up to three bf16 pieces per element (a float32 value's 24-bit
significand in three 8-bit parts): x = x1 + x2 + x3 with every x_i a bf16.

The ideal (:func:`ideal_gemm`): the exact sum of the products of the dequantized operands
plus the model's (quantized) bias, rounded once to fp32 (nearest even). It is that of an
exact (Kulisch) accumulator unit — the ``kulisch`` hardware config with the operands' formats
and a block size that divides every scale run: one float64 GEMM of the operands' values where
the data shows every sum exact in float64 (:func:`exact_sums_to_fp32`: no kernel to compile,
whatever the formats' ranges), else through :func:`mxsim.matmul`, which takes its exact
float64-BLAS route where the formats' ranges allow and the exact kernel elsewhere.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..datapath import matmul
from ..datapath.api import times_power_of_two
from ..datapath.blas import subnormals_work
from ..datapath.config import exact_unit
from ..errors import MxsimError
from ..formats import E8M0_ONE, FormatInfo, get_format
from ..quantize import MXTensor, quantize_bfp
from ..quantize.options import QuantOptions
from ..trace.model import CONV_OPS, Layer
from ..trace.quant import BFPQuant, MXQuant, NVFP4Quant, QDQQuant
from .lowering import GemmShape, GemmView, gemm_axis, gemm_view

CONV_ORDERS = ("kh_kw_c", "c_kh_kw")
BF16 = get_format("bf16")


@dataclass
class GemmOperand:
    """One GEMM operand (rows of A, or rows of B = columns of the GEMM's B) as the model has it.

    * ``pieces``: element-code arrays (G, R, K), each of ``element_format``; the operand's
      value is the sum over pieces of code value × 2^(scale - 127). Quantized operands have
      one piece; float operands up to three bf16 pieces.
    * ``scales``: uint8 (G, R, K): the E8M0 scale code of every element (127 where none).
    * ``granule``: the length of the runs of K that share one scale (the model's block along
      K, aligned to K's start); 1 when scales vary per element (blocks not along K, or
      straddling conv groups); 0 for an unquantized or tensor-scaled operand (any run
      length works).
    * ``quantized``: the model's quantizer is represented here (MX or mappable BFP spec).
    * ``spec``: a short description of the model's quantization (``int8 block 32``).
    * ``layout``: how the operand's blocks lie in the GEMM's K.
    * ``saturated``, ``underflowed``: elements the quantizer clipped to its largest
      magnitude, and nonzero elements it flushed to zero (counted in the operand's own
      layout, each element once); None when the trace keeps no float for the operand
      (``Layer.codes_only``).
    * ``exact``: False when a float operand could not be split exactly (non-finite values,
      float64 values that are not float32).
    * ``tensor_scale``: None, or the float scale of a tensor-scaled operand (module
      docstring): float64 of shape () (per tensor), (N,) (a weight's per output feature) or
      (G, 1, 1) (replay's NVFP4 quantization: each group's own); the operand's value is its
      pieces' times this scale.
    """

    element_format: FormatInfo
    pieces: list
    scales: np.ndarray | None
    granule: int
    quantized: bool
    spec: str
    layout: str
    saturated: int | None = 0
    underflowed: int | None = 0
    exact: bool = True
    tensor_scale: np.ndarray | None = None

    @property
    def k(self) -> int:
        return self.scales.shape[-1]

    def unit_tensor(self, group: int, block_size: int) -> MXTensor:
        """Group ``group`` as an MXTensor (R, K) with blocks of ``block_size`` along K (axis 1).

        Valid only when ``block_size`` divides ``granule`` (every block has one scale) and the
        operand has one piece."""
        if len(self.pieces) != 1 or (self.granule and self.granule % block_size):
            raise MxsimError(f"operand ({self.layout}) cannot be cut into blocks of {block_size}")
        codes = pad_k(self.pieces[0][group], block_size)
        scales = pad_k(self.scales[group], block_size, fill=E8M0_ONE)[:, ::block_size]
        k = self.pieces[0].shape[-1]  # K as lowered; a tensor-scaled operand's last block padded
        return MXTensor(
            self.element_format,
            np.ascontiguousarray(codes),
            np.ascontiguousarray(scales),
            (codes.shape[0], k),
            1,
            block_size,
            codes.shape[1] - k,
            QuantOptions(),
        )


def _pad_to(array: np.ndarray, length: int, fill: int = 0) -> np.ndarray:
    """``array`` with its last axis padded with ``fill`` to ``length``."""
    extra = length - array.shape[-1]
    if extra <= 0:
        return array
    return np.pad(array, [(0, 0)] * (array.ndim - 1) + [(0, extra)], constant_values=fill)


def pad_k(array: np.ndarray, multiple: int, fill: int = 0) -> np.ndarray:
    """``array`` with its last axis padded with ``fill`` to a multiple of ``multiple``
    (``array`` itself where it is one)."""
    return _pad_to(array, -(-array.shape[-1] // multiple) * multiple, fill)


# ----------------------------------------------------------------------------- quantizing


@dataclass
class _Quantized:
    """One operand quantized in its own layout: codes and per-element scale codes in the
    operand's shape (the block axis padded to whole blocks); ``block_size``: elements per
    scale; ``pad_unit``: the quantizer's block (a BFP block holds several sub-block scales)."""

    element_format: FormatInfo
    codes: np.ndarray
    scales: np.ndarray
    axis: int
    block_size: int
    pad_unit: int
    spec: str
    saturated: int
    underflowed: int


def clip_counts(x: np.ndarray, tensor: MXTensor, largest: float | None = None) -> tuple[int, int]:
    """(elements clipped to the largest element magnitude ``largest`` — default the element
    format's max — and nonzero elements flushed to zero) of ``x`` quantized as ``tensor``."""
    largest = tensor.element_format.max_finite if largest is None else largest
    values = np.asarray(x, dtype=np.float64)
    dequantized = tensor.dequantize()
    elements = np.abs(tensor.element_format.decode_fields(tensor.codes))
    moved = elements.reshape(tuple(np.delete(tensor.shape, tensor.axis)) + (-1,))
    if tensor.padding:
        moved = moved[..., : -tensor.padding]
    elements = np.moveaxis(moved, -1, tensor.axis)
    finite = np.isfinite(values) & np.isfinite(dequantized)
    saturated = finite & (elements >= largest) & (np.abs(values) > np.abs(dequantized))
    underflowed = finite & (values != 0) & (dequantized == 0)
    return int(saturated.sum()), int(underflowed.sum())


def _spec_description(spec) -> str:
    """``fp8_e4m3 block 32``, ``MX6 block 16/2``, ``float8e4m3fn per tensor``: an MX, BFP or
    tensor-scaled QDQ spec in a few words."""
    if isinstance(spec, MXQuant):
        return f"{spec.format} block {spec.block_size}"
    if isinstance(spec, QDQQuant):
        return f"{spec.dtype} per {'tensor' if spec.scale.size == 1 else 'channel'}"
    description = f"{spec.name or 'BFP'} block {spec.spec.block_size}"
    if spec.spec.has_microexponents:
        description += f"/{spec.spec.sub_block_size}"
    return description


#: BFP mantissa widths with an element-code form (``BFPTensor.as_mx_tensor``) and its format.
_BFP_CODE_FORMATS = {2: "mx4", 4: "mx6", 7: "mx9"}


#: QDQ types whose levels a unit takes as element codes: (mxsim element format, the exponent
#: e of the E8M0 scale 2^e under which a code's value is the level; INT8's q is q/64 x 2^6).
TENSOR_SCALED_TYPES = {
    "float8e4m3fn": ("fp8_e4m3", 0),
    "float8e5m2": ("fp8_e5m2", 0),
    "int8": ("int8", 6),
}


def _tensor_scaled(layer: Layer, operand: str, spec) -> str | None:
    """The element format of a tensor-scaled QDQ operand (module docstring), else None: an
    FP8 or INT8 QDQ spec with zero point 0 and one scale per tensor, or per output feature of
    a linear layer's weight (axis 0)."""
    if (
        not isinstance(spec, QDQQuant)
        or spec.dtype not in TENSOR_SCALED_TYPES
        or spec.block_size
        or (spec.zero_point is not None and spec.zero_point.any())
    ):
        return None
    per_feature = (
        layer.op == "linear"
        and operand == "weight"
        and spec.axis is not None
        and spec.axis % layer.weight.ndim == 0
        and spec.scale.size == layer.weight.shape[0]
    )
    return TENSOR_SCALED_TYPES[spec.dtype][0] if spec.scale.size == 1 or per_feature else None


def _tensor_scale(layer: Layer, operand: str) -> np.ndarray | None:
    """The float scale of a tensor-scaled operand (GemmOperand.tensor_scale), else None."""
    spec = layer.quant.get(operand)
    if _tensor_scaled(layer, operand, spec) is None:
        return None
    scale = spec.scale.astype(np.float32).astype(np.float64)
    return scale.reshape(()) if scale.size == 1 else scale.reshape(-1)


def _quantize_spec(
    x: np.ndarray, spec, layer: Layer | None = None, operand: str = ""
) -> _Quantized | None:
    """The operand quantized by its MX or BFP spec in its own layout, or, tensor-scaled, its
    QDQ levels as element codes (:data:`TENSOR_SCALED_TYPES`; block size 0: one scale for all
    of K; needs ``layer`` and ``operand``); None if the spec has no element-code form (other
    specs, bypassed one-element tensors, unmappable BFP)."""
    name = None if layer is None else _tensor_scaled(layer, operand, spec)
    if name is not None:
        fmt, exponent = get_format(name), TENSOR_SCALED_TYPES[spec.dtype][1]
        levels, values = spec.levels(x)
        with np.errstate(invalid="ignore"):
            codes = fmt.encode(np.ldexp(levels, -exponent))  # exact: the format holds each level
            largest = np.abs(levels) >= fmt.max_finite * 2.0**exponent
        saturated = np.isfinite(values) & (np.abs(np.asarray(x)) > np.abs(values)) & largest
        underflowed = (np.asarray(x) != 0) & (values == 0)
        return _Quantized(
            fmt,
            codes,
            np.full(codes.shape, E8M0_ONE + exponent, dtype=np.uint8),
            _reduction_axis(layer, operand),
            0,
            1,
            _spec_description(spec),
            int(saturated.sum()),
            int(underflowed.sum()),
        )
    if not isinstance(spec, (MXQuant, BFPQuant)) or (spec.bypass_single_element and x.size == 1):
        return None
    if isinstance(spec, MXQuant):
        tensor = spec.quantize(x)
        largest = tensor.element_format.max_finite
        pad_unit = spec.block_size
    else:
        try:
            tensor = quantize_bfp(np.asarray(x), spec.spec, axis=spec.axis).as_mx_tensor()
        except MxsimError:
            return None
        m = spec.spec.mantissa_bits
        largest = (2**m - 1) * 2.0 ** (1 - m)
        pad_unit = spec.spec.block_size
    saturated, underflowed = clip_counts(x, tensor, largest)
    axis = tensor.axis
    codes = np.moveaxis(tensor.codes, -1, axis)
    scales = np.moveaxis(np.repeat(tensor.scales, tensor.block_size, axis=-1), -1, axis)
    if scales.shape != codes.shape:  # BFP: the last block's sub-blocks cover its padding too
        raise MxsimError("internal: scale and code layouts differ")
    return _Quantized(
        tensor.element_format,
        codes,
        scales,
        axis,
        tensor.block_size,
        pad_unit,
        _spec_description(spec),
        saturated,
        underflowed,
    )


def _bf16_pieces(values: np.ndarray) -> tuple[list[np.ndarray], bool]:
    """bf16 codes of x1, x2, x3 with x1 + x2 + x3 == x exactly (float32 x); trailing all-zero
    pieces dropped. The bool is False when x is not exactly three bf16s (non-finite, float64
    values that are not float32, or a remainder below bf16's range)."""
    as32 = values.astype(np.float32)
    exact = bool(np.isfinite(as32).all()) and np.array_equal(as32.astype(values.dtype), values)
    rest = np.where(np.isfinite(as32), as32, np.float32(0))
    pieces = []
    for _ in range(3):
        head = (rest.view(np.uint32) & np.uint32(0xFFFF0000)).view(
            np.float32
        )  # truncated: rest - head is exact
        pieces.append((head.view(np.uint32) >> np.uint32(16)).astype(np.uint16))
        rest = rest - head
    if rest.any():
        exact = False
    while len(pieces) > 1 and not pieces[-1].any():
        pieces.pop()
    return pieces, exact


# ----------------------------------------------------------------------------- lowering


def _reduction_axis(layer: Layer, operand: str) -> int:
    """The axis of ``operand`` that lowers to K runs (conv: channels; else the contraction)."""
    if (
        layer.op in CONV_OPS
    ):  # NCHW input; conv2d weight (O, C/g, kh, kw), transposed (C, O/g, kh, kw)
        return 0 if (layer.op, operand) == ("conv_transpose2d", "weight") else 1
    if operand == "input":
        return layer.input.ndim - 1
    return 1 if layer.op == "linear" else layer.weight.ndim - 2


def _pad_axis(array: np.ndarray, axis: int, length: int, fill=0) -> np.ndarray:
    extra = length - array.shape[axis]
    if extra <= 0:
        return array
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, extra)
    if fill == "edge":
        return np.pad(array, widths, mode="edge")
    return np.pad(array, widths, constant_values=fill)


def _reorder_taps(lowered: np.ndarray, taps: int) -> np.ndarray:
    """(G, R, taps*C) in (tap, channel) order -> (channel, tap) order."""
    g, r, k = lowered.shape
    return np.ascontiguousarray(
        lowered.reshape(g, r, taps, k // taps).transpose(0, 1, 3, 2)
    ).reshape(g, r, k)


@dataclass
class LayerOperands:
    """Both GEMM operands of a layer and its bias as the model quantized them.

    ``a``: rows of A (G, M, K'); ``b``: rows of B (G, N, K') with the same K' layout;
    ``bias``: the bias after the model's bias quantizer, float64 (None without a bias);
    ``bias_spec``: a description of that quantizer; ``order``: the conv order used;
    ``a_float``/``b_float``: what replay quantizes itself for a unit that cannot take the
    model's operand, in the same GEMM layout: the float before the model's quantizer where
    the operand has a block code form here, else (no code form, or tensor-scaled) the values
    the model multiplied (its quantizer's recorded output, or the float when none is
    recorded);
    ``gemm``: the layer lowered (:class:`LayerGemm`), which everything after reads.
    """

    a: GemmOperand
    b: GemmOperand
    bias: np.ndarray | None
    bias_spec: str
    order: str
    a_float: np.ndarray
    b_float: np.ndarray
    gemm: LayerGemm


def _float_values(layer: Layer, operand: str) -> np.ndarray:
    """What the model fed the GEMM for an operand without an MX/BFP code form."""
    recorded = layer.quantized(operand)
    return layer.tensors[operand] if recorded is None else recorded


def quantized_bias(layer: Layer) -> tuple[np.ndarray | None, str]:
    """The bias after the model's recorded bias quantizer (float64), and its description."""
    if layer.bias is None:
        return None, "none"
    spec = layer.quant.get("bias")
    if isinstance(spec, (MXQuant, BFPQuant)):
        quantized = _quantize_spec(layer.bias, spec)
        name = quantized.spec if quantized is not None else "bypassed"
        return np.asarray(spec.fake_quantize(layer.bias), dtype=np.float64), name
    recorded = layer.quantized("bias")
    if recorded is not None:
        return recorded.astype(
            np.float64
        ), f"recorded ({type(spec).__name__ if spec else 'unknown'})"
    return layer.bias.astype(np.float64), "float"


@dataclass(frozen=True)
class _Blocks:
    """Where an operand's scale blocks lie in its own layout: ``axis`` (non-negative),
    ``block_size`` (elements per scale; 0: one scale for the whole operand) and ``pad_unit``
    (the quantizer's whole block)."""

    axis: int
    block_size: int
    pad_unit: int


@dataclass(frozen=True)
class LayerGemm:
    """A layer lowered once (:func:`lower_layer`): the one GEMM description that operand
    quantization, the ideal and the units' kernels then only read.

    ``view``: the layer's GEMM (dimensions, conv geometry, lifting results back);
    ``operand_view``: the same GEMM over the operands as laid out along K, each run of
    ``k_run`` padded to ``padded_run`` columns (``view`` itself when nothing is padded);
    ``order``: the conv K order; ``taps``: runs per K; per operand (``input``, ``weight``),
    ``granule`` and ``layout`` as in :class:`GemmOperand`.
    """

    view: GemmView
    operand_view: GemmView
    order: str
    taps: int
    padded_run: int
    granule: dict
    layout: dict

    @property
    def shape(self) -> GemmShape:
        """The layer's GEMM dimensions."""
        return self.view.shape

    def lower(self, op: str, array: np.ndarray) -> np.ndarray:
        """``array`` (operand ``op`` in its own layout, its reduction axis padded to
        ``padded_run``) as GEMM rows (G, R, K') in the K order."""
        lowered = (
            self.operand_view.lower_input(array)
            if op == "input"
            else self.operand_view.lower_weight(array)
        )
        return (
            _reorder_taps(lowered, self.taps)
            if self.order == "c_kh_kw" and self.taps > 1
            else lowered
        )


def lower_layer(
    layer: Layer, conv_order: str, blocks: dict, view: GemmView | None = None
) -> LayerGemm:
    """``layer`` lowered, given where each operand's blocks lie (``_Blocks``; None: no code
    form); ``view``: its GEMM view when already worked out (:func:`mxsim.replay.lowering.gemm_view`)."""
    operands = ("input", "weight")
    view = gemm_view(layer) if view is None else view
    along_k = {
        op: b is not None and b.axis == _reduction_axis(layer, op) for op, b in blocks.items()
    }
    shape = view.shape
    run, taps = (
        shape.k_run,
        shape.k // shape.k_run if shape.k_run else 1,
    )  # K = 0: no taps to reorder
    groups = view.conv.groups if layer.op == "conv2d" else 1
    unit = math.lcm(*(b.pad_unit for op, b in blocks.items() if along_k[op]))
    # Every quantized operand blocked along K, and no block straddling a conv group.
    aligned = all(along_k[op] or blocks[op] is None for op in operands) and (
        groups == 1 or run % unit == 0
    )
    padded_run = -(-run // unit) * unit if aligned else run
    if padded_run != run and groups != 1:
        raise MxsimError(
            "internal: grouped layers are padded only when their groups hold whole blocks"
        )
    granule, layout = {}, {}
    for op in operands:
        b = blocks[op]
        if b is None:
            granule[op], layout[op] = 0, "unquantized"
            continue
        contiguous = aligned and (conv_order == "kh_kw_c" or taps == 1)
        granule[op] = b.block_size if contiguous or not b.block_size else 1
        if not along_k[op]:
            layout[op] = f"blocks along {gemm_axis(layer, op, b.axis)}, not K"
        elif not aligned:
            layout[op] = (
                "blocks straddle conv groups"
                if groups > 1
                else "blocks not along K in the other operand"
            )
        elif taps > 1 and conv_order == "c_kh_kw":
            layout[op] = f"C blocked, K order (C, kh, kw): blocks strided by {taps}"
        elif taps > 1:
            layout[op] = (
                f"C blocked per tap, K order (kh, kw, C), C padded {run}->{padded_run} per tap"
            )
        else:
            layout[op] = "K blocked" + (
                f", padded {run}->{padded_run}" if padded_run != run else ""
            )
    padded = [
        _padded_shape(view.input_shape, _reduction_axis(layer, "input"), padded_run),
        _padded_shape(view.weight_shape, _reduction_axis(layer, "weight"), padded_run),
    ]
    operand_view = (
        view
        if padded == [view.input_shape, view.weight_shape]
        else view.with_operand_shapes(*padded)
    )
    return LayerGemm(view, operand_view, conv_order, taps, padded_run, granule, layout)


def _padded_shape(shape: tuple, axis: int, length: int) -> tuple:
    """``shape`` with ``axis`` grown to ``length`` (as :func:`_pad_axis` pads)."""
    return tuple(max(size, length) if i == axis else size for i, size in enumerate(shape))


@dataclass(frozen=True)
class OperandPlan:
    """What :func:`layer_operands` will make of an operand, known from the specs and shapes
    alone (no quantization run): the fields of :class:`GemmOperand` that decide what a unit
    can take. An operand whose BFP code form fails on its data (Inf/NaN under ``to_bfp``)
    is planned as quantized but turns out float."""

    element_format: FormatInfo
    quantized: bool
    granule: int
    spec: str
    layout: str
    saturated: int = 0
    underflowed: int = 0


def _spec_blocks(layer: Layer, operand: str) -> tuple[str, _Blocks] | None:
    """(element format, blocks) of an MX/BFP spec with a code form on the operand's shape, or
    of a tensor-scaled operand (block size 0), else None (NVFP4: :func:`_nvfp4_blocks`)."""
    spec, x = layer.quant.get(operand), layer.tensors[operand]
    fmt = _tensor_scaled(layer, operand, spec)
    if fmt is not None:
        return fmt, _Blocks(_reduction_axis(layer, operand), 0, 1)
    if not isinstance(spec, (MXQuant, BFPQuant)) or (spec.bypass_single_element and x.size == 1):
        return None
    axis = spec.axis % x.ndim
    if isinstance(spec, MXQuant):
        return spec.format, _Blocks(axis, spec.block_size, spec.block_size)
    name = _BFP_CODE_FORMATS.get(spec.spec.mantissa_bits)
    if name is None:
        return None
    return name, _Blocks(axis, spec.spec.sub_block_size, spec.spec.block_size)


def _nvfp4_blocks(layer: Layer, operand: str) -> _Blocks | None:
    """The blocks of an operand's NVFP4 spec along the reduction axis (its values replay reads
    as floats: its scales are no E8M0 codes), for the lowering to say whether they lie whole
    along K (``granule``, ``layout``: where a unit with the spec's scales takes the model's
    NVFP4 tensor); else None (blocks along another axis leave the other operand's as they
    are)."""
    spec = layer.quant.get(operand)
    if not isinstance(spec, NVFP4Quant) or spec.axis is None:
        return None
    axis = spec.axis % layer.tensors[operand].ndim
    if axis != _reduction_axis(layer, operand):
        return None
    return _Blocks(axis, spec.block_size, spec.block_size)


def operand_plans(layer: Layer, conv_order: str = "kh_kw_c") -> dict[str, OperandPlan]:
    """``{"input": plan, "weight": plan}``: each GEMM operand as :func:`layer_operands` will
    give it (format, quantized, granule, layout), from the specs alone: what a unit can take
    is decided before any work."""
    if conv_order not in CONV_ORDERS:
        raise MxsimError(f"conv order must be one of {', '.join(CONV_ORDERS)}, got {conv_order!r}")
    found = {op: _spec_blocks(layer, op) for op in ("input", "weight")}
    k = lower_layer(
        layer, conv_order, {op: f[1] if f else _nvfp4_blocks(layer, op) for op, f in found.items()}
    )
    plans = {}
    for op, f in found.items():
        spec = layer.quant.get(op)
        if f is None:
            name = "float" if spec is None else f"{spec.kind} (as recorded)"
            plans[op] = OperandPlan(BF16, False, k.granule[op], name, k.layout[op])
        else:
            plans[op] = OperandPlan(
                get_format(f[0]), True, k.granule[op], _spec_description(spec), k.layout[op]
            )
    return plans


def layer_operands(
    layer: Layer,
    conv_order: str = "kh_kw_c",
    float_pieces: bool = True,
    view: GemmView | None = None,
) -> LayerOperands:
    """Quantize ``layer``'s operands as its trace specs say, in their own layout, lower the
    layer once (:func:`lower_layer`) and the operands through it (module docstring). Raises
    MxsimError for an unknown order. ``view``: the layer's GEMM view when already worked out.

    ``float_pieces=False``: an operand without an MX/BFP code form gets no bf16 pieces and no
    scales (``pieces`` empty, ``scales`` None, ``exact`` False): enough to choose a unit's
    quantization and quantize the float operand, not for the ideal (:func:`ideal_gemm`)."""
    if conv_order not in CONV_ORDERS:
        raise MxsimError(f"conv order must be one of {', '.join(CONV_ORDERS)}, got {conv_order!r}")
    operands = ("input", "weight")
    quantized = {
        op: _quantize_spec(layer.tensors[op], layer.quant.get(op), layer, op) for op in operands
    }
    k = lower_layer(
        layer,
        conv_order,
        {
            op: _Blocks(q.axis, q.block_size, q.pad_unit) if q else _nvfp4_blocks(layer, op)
            for op, q in quantized.items()
        },
        view,
    )
    padded_run = k.padded_run
    arrays = {}
    for op in operands:
        q, axis = quantized[op], _reduction_axis(layer, op)
        if q is None:
            pieces, exact = (
                _bf16_pieces(np.asarray(_float_values(layer, op))) if float_pieces else ([], False)
            )
            scales = (  # (none without pieces: nothing reads them)
                _pad_axis(
                    np.full(layer.tensors[op].shape, E8M0_ONE, dtype=np.uint8),
                    axis,
                    padded_run,
                    127,
                )
                if float_pieces
                else None
            )
            arrays[op] = ([_pad_axis(p, axis, padded_run) for p in pieces], scales, exact)
            continue
        keep = np.arange(
            layer.tensors[op].shape[q.axis]
        )  # the model's own elements, its padding dropped
        codes, scales = np.take(q.codes, keep, axis=q.axis), np.take(q.scales, keep, axis=q.axis)
        arrays[op] = (
            [_pad_axis(codes, axis, padded_run)],
            _pad_axis(scales, axis, padded_run, "edge"),
            True,
        )

    result = {}
    for op in operands:
        q = quantized[op]
        pieces, scales, exact = arrays[op]
        if q is None:
            spec = layer.quant.get(op)
            fmt, name = BF16, "float" if spec is None else f"{spec.kind} (as recorded)"
            saturated = underflowed = 0
        else:
            fmt, name, saturated, underflowed = q.element_format, q.spec, q.saturated, q.underflowed
        if (
            op in layer.codes_only
        ):  # the float is not in the trace: what its quantizer clipped is unknown
            saturated = underflowed = None
        # im2col fills out-of-image positions with 0: lower (scale - 127) so that they get scale 1
        lowered_scales = (
            None
            if q is None and not float_pieces
            else (k.lower(op, scales.astype(np.int16) - E8M0_ONE) + E8M0_ONE).astype(np.uint8)
        )
        result[op] = GemmOperand(
            fmt,
            [k.lower(op, p) for p in pieces],
            lowered_scales,
            k.granule[op],
            q is not None,
            name,
            k.layout[op],
            saturated,
            underflowed,
            exact,
            None if q is None else _tensor_scale(layer, op),
        )
    # what replay quantizes itself: the float before the model's quantizer where the trace
    # reads it as blocks, else (no code form, or float scales) what the model multiplied
    floats = [
        k.lower(
            op,
            _pad_axis(
                layer.tensors[op]
                if quantized[op] and quantized[op].block_size
                else _float_values(layer, op),
                _reduction_axis(layer, op),
                padded_run,
            ),
        )
        for op in operands
    ]
    bias, bias_spec = quantized_bias(layer)
    return LayerOperands(result["input"], result["weight"], bias, bias_spec, conv_order, *floats, k)


def nvfp4_operand(layer: Layer, operand: str, gemm: LayerGemm) -> tuple:
    """The model's NVFP4 quantization of ``operand`` (its spec applied to the layer's float, as
    the library stored it) lowered through ``gemm``: element codes (G, R, K'), the UE4M3 code of
    each block of ``block_size`` along K (G, R, K' / block_size) and the tensor scale (or None).
    Valid where the lowering keeps the spec's blocks whole along K (``granule`` a multiple of
    the block)."""
    spec = layer.quant[operand]
    x = layer.tensors[operand]
    axis = spec.axis % x.ndim
    tensor = spec.quantize(x)
    block = spec.block_size
    codes = np.moveaxis(tensor.codes, -1, axis)
    scales = np.moveaxis(np.repeat(tensor.scales, block, axis=-1), -1, axis)
    lowered = [
        gemm.lower(operand, _pad_axis(array, axis, gemm.padded_run, fill))
        for array, fill in ((codes, 0), (scales, "edge"))
    ]
    return lowered[0], np.ascontiguousarray(lowered[1][..., ::block]), tensor.tensor_scale


def accumulator_input(c: np.ndarray | None, shift: int = 0) -> np.ndarray | None:
    """``c * 2^-shift`` as a float32 accumulator input, or None when that rounds (then the
    caller adds the bias after the GEMM, in float64)."""
    if c is None:
        return None
    with np.errstate(over="ignore", under="ignore"):
        narrowed = c.astype(np.float32)
        if np.array_equal(
            narrowed, c
        ):  # float32 values (the common bias): scaled in float32, half the bytes
            scaled = times_power_of_two(narrowed, -shift) if shift else narrowed
            # exact iff scaling back restores it (power-of-two scaling rounds only on under/overflow)
            return (
                scaled
                if not shift or np.array_equal(times_power_of_two(scaled, shift), narrowed)
                else None
            )
        scaled = np.ldexp(c, -shift)
        narrowed = scaled.astype(np.float32)
    return narrowed if np.array_equal(narrowed.astype(np.float64), scaled) else None


def _pieces_product(a: GemmOperand, b: GemmOperand, group: int, block: int):
    """A (R, K'') and B (N, K'') code and scale arrays whose exact dot products equal the
    operands' (every pair of pieces side by side along K)."""
    a_codes, a_scales, b_codes, b_scales = [], [], [], []
    length = -(-max(a.k, b.k) // block) * block  # the operands may end in different zero padding
    for piece_a in a.pieces:
        for piece_b in b.pieces:
            a_codes.append(_pad_to(piece_a[group], length))
            b_codes.append(_pad_to(piece_b[group], length))
            a_scales.append(_pad_to(a.scales[group], length, E8M0_ONE))
            b_scales.append(_pad_to(b.scales[group], length, E8M0_ONE))
    return (
        np.concatenate(a_codes, axis=1),
        np.concatenate(a_scales, axis=1),
        np.concatenate(b_codes, axis=1),
        np.concatenate(b_scales, axis=1),
    )


def tensor_scales(a: GemmOperand, b: GemmOperand) -> np.ndarray | None:
    """The product of both operands' tensor scales as a factor of the GEMM result (G, M, N)
    (float64, broadcastable), or None when neither is tensor-scaled."""
    if a.tensor_scale is None and b.tensor_scale is None:
        return None
    scale_a = 1.0 if a.tensor_scale is None else a.tensor_scale
    scale_b = 1.0 if b.tensor_scale is None else b.tensor_scale
    return np.multiply(scale_a, scale_b, dtype=np.float64)  # () or (N,): broadcasts over N


def group_factor(scaled: np.ndarray, group: int) -> np.ndarray:
    """Group ``group``'s share of :func:`tensor_scales`: the factor itself unless it holds one
    per group (an operand replay quantized to NVFP4, a tensor scale per group: (G, 1, N))."""
    return scaled[group] if scaled.ndim == 3 else scaled


def exact_block(a: GemmOperand, b: GemmOperand) -> int:
    """The largest block length over which both operands' scales are constant."""
    granules = [op.granule for op in (a, b) if op.granule]
    return functools.reduce(math.gcd, granules) if granules else 32


#: The most memory (bytes) a group's ideal may take as float64 arrays (the operands' values,
#: the sums, their bound and grid) to be computed by :func:`exact_sums_to_fp32`.
FLOAT64_IDEAL_BYTES = 256 << 20
#: float64 and fp32 limits for :func:`exact_sums_to_fp32`.
_FLOAT64_MIN_NORMAL = 2.0**-1022
_FP32_MAX = float(np.finfo(np.float32).max)


def _least_bits(x: np.ndarray) -> np.ndarray:
    """The largest power of two dividing each element of float64 ``x`` (exact), +inf for
    zeros: x = m 2^e with m in [0.5, 1) has the integer significand m 2^53, whose lowest set
    bit is that power times 2^(53 - e)."""
    significands, exponents = np.frexp(np.abs(x))
    integers = (significands * 2.0**53).astype(np.int64)
    lowest = np.ldexp((integers & -integers).astype(np.float64), exponents - 53)
    return np.where(x == 0, np.inf, lowest)


def exact_sums_to_fp32(a: np.ndarray, b: np.ndarray, c: np.ndarray | None) -> np.ndarray | None:
    """``c + a @ b`` computed exactly and rounded once to fp32 (nearest even), as float64
    ((M, N)), by float64 BLAS; None unless that is shown exact for every output and every
    output is a finite nonzero fp32 value (the exact unit's zeros, overflows and specials
    are left to it). ``a`` (M, K) and ``b`` (K, N): exact operand values (float64); ``c``
    (M, N) float32 or None.

    Why exact: let u[m, n] be the least of lsb(a[m, :]) lsb(b[:, n]) and lsb(c[m, n]) (lsb:
    the largest power of two dividing every nonzero value), at least 2^-1022. Every product
    a[m, k] b[k, n] and c[m, n] is an integer multiple of u[m, n], so is every partial sum of
    them, in any order, and each is at most sum |a| |b| + |c| in magnitude; where that bound
    (computed in float64, enlarged for its own rounding) stays below 2^53 u[m, n], every
    product and partial sum is an integer below 2^53 times a power of two of at least
    2^-1022: a float64 exactly, so the GEMM returns the exact sum whatever
    its summation order or use of fused multiply-adds, and one float64 -> float32 conversion
    rounds it as the unit does."""
    if not (np.isfinite(a).all() and np.isfinite(b).all()) or not subnormals_work():
        return None
    with np.errstate(over="ignore", under="ignore"):
        rows = np.min(_least_bits(a), axis=1, initial=np.inf)
        columns = np.min(_least_bits(b), axis=0, initial=np.inf)
        unit = np.multiply.outer(rows, columns)
        bound = np.abs(a) @ np.abs(b)
        sums = a @ b
        if c is not None:
            c64 = c.astype(np.float64)
            unit = np.minimum(unit, _least_bits(c64))
            bound += np.abs(c64)
            sums += c64
    # (the bound's rounding errors stay below K 2^-53 of it: K < 2^20 is far more than any GEMM)
    if (
        not (unit >= _FLOAT64_MIN_NORMAL).all()
        or not (bound * (1 + 2.0**-20) < 2.0**53 * unit).all()
    ):
        return None
    rounded = sums.astype(np.float32).astype(np.float64)
    if not (np.abs(rounded) <= _FP32_MAX).all() or not rounded.all():
        return None
    return rounded


def ideal_gemm(operands: LayerOperands) -> tuple[np.ndarray, bool]:
    """The exact GEMM result (G, M, N) of the model's quantized operands plus its quantized
    bias, rounded once to fp32 (module docstring), as float64; and whether it is exact (False
    when a float operand could not be split exactly or the bias could not enter the exact
    sum: then it is added in float64 afterwards, a second rounding). Tensor-scaled operands:
    the exact sum of their codes' products is rounded to fp32, times the scales in float64,
    plus the bias in float64 (not exact)."""
    a, b = operands.a, operands.b
    scaled = tensor_scales(a, b)
    block = exact_block(a, b)
    unit = exact_unit(a.element_format.name, b.element_format.name, block)
    view = operands.gemm.view
    scaled_linear = view.op == "linear" and view.alpha != 1.0
    bias = None if scaled_linear else view.gemm_bias(operands.bias)
    c = None if scaled is not None else accumulator_input(bias)
    exact = (
        a.exact
        and b.exact
        and scaled is None
        and (bias is None or c is not None)
        and not (scaled_linear and operands.bias is not None)
    )
    shape = view.shape
    out = np.empty((shape.groups, shape.m, shape.n), dtype=np.float64)
    for group in range(shape.groups):
        a_codes, a_scales, b_codes, b_scales = _pieces_product(a, b, group, block)
        k = a_codes.shape[1]
        tensor_a = MXTensor(
            a.element_format,
            a_codes,
            a_scales[:, ::block].copy(),
            a_codes.shape,
            1,
            block,
            0,
            QuantOptions(),
        )
        tensor_b = MXTensor(
            b.element_format,
            b_codes,
            b_scales[:, ::block].copy(),
            (k, b_codes.shape[0]),
            0,
            block,
            0,
            QuantOptions(),
        )
        c_group = None if c is None else c[group].astype(np.float32)
        values = None
        # float64 BLAS where it is exact (no kernel to compile), else the exact unit, which
        # holds no float64 copy of the operands
        if (a_codes.size + b_codes.size + 4 * shape.m * shape.n) * 8 <= FLOAT64_IDEAL_BYTES:
            values = exact_sums_to_fp32(
                tensor_a.dequantize(np.float64), tensor_b.dequantize(np.float64), c_group
            )
        if values is None:
            values = matmul(unit, tensor_a, tensor_b, c=c_group).values
        out[group] = values if scaled is None else values * group_factor(scaled, group)
        if bias is not None and c is None:
            out[group] += bias[group]
    return out, exact
