"""MX block quantization (OCP Microscaling): shared E8M0 scales over blocks of elements."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..errors import MxsimError
from ..formats import FormatInfo, get_format
from ..formats.rounding import overflow_code, rounding_code
from ..formats.table import E8M0_BIAS, E8M0_NAN, INPUT_FLOATS, as_float_array
from . import _kernels as K
from .options import QuantOptions, resolve_options

_RULES = {"floor": K.RULE_FLOOR, "ceil": K.RULE_CEIL, "even": K.RULE_EVEN, "rceil": K.RULE_RCEIL}
_SOURCES = {"bits": K.SOURCE_EXACT, "field": K.SOURCE_FIELD, "log2": K.SOURCE_LOG2}
_NONFINITE = {"nan_block": K.NONFINITE_NAN_BLOCK, "propagate": K.NONFINITE_PROPAGATE, "inf_scale_max": K.NONFINITE_INF_SCALE_MAX}
_UNDERFLOW = {"clamp": K.UNDERFLOW_CLAMP, "unclamped": K.UNDERFLOW_UNCLAMPED, "unclamped_eps": K.UNDERFLOW_UNCLAMPED_EPS}


@dataclass(frozen=True, eq=False)
class MXTensor:
    """An MX-quantized tensor: element codes plus one E8M0 scale code per block.

    Attributes:
        element_format: the element format.
        codes: element codes (uint8), shape ``(*other_dims, n_blocks * block_size)``: the
            quantized axis moved last and zero-padded to whole blocks.
        scales: E8M0 scale codes (uint8), shape ``(*other_dims, n_blocks)``; the block's scale
            is 2^(code - 127), 0xFF is NaN (the block decodes to NaN).
        shape: the original tensor's shape.
        axis: the quantized axis of the original tensor (non-negative).
        block_size: elements per block.
        padding: zero elements appended to the quantized axis to fill the last block.
        options: the semantic options used.
    """

    element_format: FormatInfo
    codes: np.ndarray
    scales: np.ndarray
    shape: tuple
    axis: int
    block_size: int
    padding: int
    options: QuantOptions

    @property
    def scale_exponents(self) -> np.ndarray:
        """Unbiased int32 scale exponents ``code - 127``; a NaN scale (0xFF) is SCALE_NAN."""
        return scale_exponents_of_codes(self.scales)

    def dequantize(self, dtype=np.float64) -> np.ndarray:
        """Values in the original shape: element value × 2^X, exact in float64.

        ``dtype=np.float32`` rounds the exact values to float32 (nearest-even).
        """
        values = _dequantize_blocked(self.element_format, self.codes, self.scale_exponents, self.block_size, dtype)
        return _from_blocks(values, self.shape, self.axis, self.padding)

    def block_values(self, index: tuple[int, ...]) -> list[Fraction] | None:
        """Exact values of one block's elements (``index`` into ``scales``); None if its scale is NaN."""
        *outer, block = index
        scale_code = int(self.scales[tuple(index)])
        if scale_code == E8M0_NAN:
            return None
        codes = self.codes[tuple(outer)][block * self.block_size : (block + 1) * self.block_size]
        scale = Fraction(2) ** (scale_code - E8M0_BIAS)
        return [self.element_format.value_of(int(c)) * scale for c in codes]


def scale_exponents_of_codes(scales: np.ndarray) -> np.ndarray:
    """Unbiased int32 exponents of E8M0 scale codes; 0xFF (NaN) becomes ``SCALE_NAN``."""
    exponents = scales.astype(np.int32) - E8M0_BIAS
    exponents[scales == E8M0_NAN] = K.SCALE_NAN
    return exponents


def quantize(x, fmt, axis: int = -1, block_size: int = 32, profile: str = "ocp", **options) -> MXTensor:
    """Quantize ``x`` to MX: blocks of ``block_size`` along ``axis`` share one E8M0 scale.

    Args:
        x: float16, float32 or float64 numpy array (read exactly; no rounding through float32).
        fmt: element format: a table name (``fp8_e4m3``, ...) or a Quark config name
            (``MXFP8E4M3``, ...), or a FormatInfo.
        axis: the axis along which blocks are formed. A partial last block is zero-padded.
        block_size: elements per block (OCP: 32).
        profile: a name of :data:`mxsim.quantize.options.PROFILES`; ``options`` override its
            fields (see :class:`~mxsim.quantize.options.QuantOptions`).

    The scale exponent X of a block comes from its amax by ``scale_rule``; each element is
    then ``x * 2^-X`` rounded once into the element format (``element_rounding``,
    ``element_overflow``). Raises MxsimError for options an MXTensor cannot hold
    (scales below 2^-127 with ``scale_underflow="unclamped"``, NaN elements of formats
    without NaN under ``nonfinite="propagate"``): use :func:`fake_quantize` for those.
    """
    element_format, opts, values = _prepare(x, fmt, profile, options)
    codes, exponents, axis, padding = _quantize_blocked(values, element_format, opts, axis, block_size)
    if (exponents < K.E8M0_MIN_EXPONENT).any():
        raise MxsimError("quantize: a scale below 2^-127 is not an E8M0 code (scale_underflow='unclamped'); use fake_quantize")
    if opts.nonfinite == "propagate" and not element_format.has_nan and np.isnan(values).any():
        raise MxsimError(f"quantize: {element_format.name} has no NaN code to propagate; use fake_quantize")
    scales = np.where(exponents == K.SCALE_NAN, E8M0_NAN, exponents + E8M0_BIAS).astype(np.uint8)
    return MXTensor(element_format, codes, scales, values.shape, axis, block_size, padding, opts)


def fake_quantize(x, fmt, axis: int = -1, block_size: int = 32, profile: str = "ocp", **options) -> np.ndarray:
    """Quantize then dequantize in one step, as float64 in ``x``'s shape.

    Accepts every option, including those an MXTensor cannot hold: scales below 2^-127
    (``scale_underflow="unclamped"``) and NaN/Inf passed through elements of formats
    without NaN/Inf codes (``nonfinite="propagate"``: the output holds the input's NaN, and
    ±Inf where ``element_overflow="inf_nan"``).
    """
    element_format, opts, values = _prepare(x, fmt, profile, options)
    codes, exponents, axis, padding = _quantize_blocked(values, element_format, opts, axis, block_size)
    blocked = _dequantize_blocked(element_format, codes, exponents, block_size)
    out = _from_blocks(blocked, values.shape, axis, padding)
    if opts.nonfinite == "propagate":
        out = np.where(np.isnan(values), np.nan, out)
        if opts.element_overflow == "inf_nan":
            out = np.where(np.isinf(values), values.astype(np.float64), out)
    return out


def _prepare(x, fmt, profile, options):
    element_format = get_format(fmt)
    opts = resolve_options(profile, **options)
    values = as_float_array(x, "quantize")
    if values.ndim == 0:
        raise MxsimError("quantize: x must have at least one dimension")
    if element_format.twos_complement:
        element_format = dataclasses.replace(element_format, allow_min_twos_complement=opts.int8_minus_two)
    if opts.element_overflow == "inf_nan" and not element_format.has_nan:
        raise MxsimError(f"quantize: element_overflow='inf_nan' needs a format with Inf or NaN; {element_format.name} has neither")
    if opts.nonfinite == "raise" and not np.isfinite(values).all():
        raise MxsimError("quantize: input has NaN or Inf (nonfinite='raise')")
    return element_format, opts, values


def _to_blocks(values: np.ndarray, axis: int, block_size: int):
    if not isinstance(axis, (int, np.integer)) or not -values.ndim <= axis < values.ndim:
        raise MxsimError(f"quantize: axis {axis!r} is out of range for an array of {values.ndim} dimensions")
    if not isinstance(block_size, (int, np.integer)) or isinstance(block_size, bool) or block_size < 1:
        raise MxsimError(f"quantize: block_size must be a positive integer, got {block_size!r}")
    axis = int(axis) % values.ndim
    moved = np.moveaxis(values, axis, -1)
    padding = -moved.shape[-1] % block_size
    if padding:
        moved = np.concatenate([moved, np.zeros(moved.shape[:-1] + (padding,), dtype=moved.dtype)], axis=-1)
    return np.ascontiguousarray(moved), axis, padding


def _from_blocks(blocked: np.ndarray, shape: tuple, axis: int, padding: int) -> np.ndarray:
    moved = blocked.reshape(tuple(np.delete(shape, axis)) + (-1,))
    if padding:
        moved = moved[..., :-padding]
    return np.moveaxis(moved, -1, axis)


def _quantize_blocked(values, element_format: FormatInfo, opts: QuantOptions, axis: int, block_size: int):
    moved, axis, padding = _to_blocks(values, axis, block_size)
    exponent_bits, mantissa_bits, bit_view = INPUT_FLOATS[values.dtype]
    bits = moved.view(bit_view).reshape(-1, block_size)
    codes = np.empty(bits.shape, dtype=element_format.code_dtype)
    exponents = np.empty(bits.shape[0], dtype=np.int32)
    emax = element_format.scale_emax
    max_ratio_q52 = int(Fraction(element_format.max_finite) / Fraction(2) ** emax * 2**52)
    even_fraction_bits = dict(opts.even_fraction_bits).get(element_format.name, element_format.top_fraction_bits)
    K.quantize_blocks(
        bits, exponent_bits, mantissa_bits,
        element_format.kernel_params, _RULES[opts.scale_rule], _SOURCES[opts.exponent_source],
        emax, even_fraction_bits, max_ratio_q52,
        rounding_code(opts.element_rounding), overflow_code(opts.element_overflow),
        _NONFINITE.get(opts.nonfinite, K.NONFINITE_NAN_BLOCK), _UNDERFLOW[opts.scale_underflow],
        opts.scale_overflow == "clamp", opts.seed,
        codes, exponents,
    )
    return codes.reshape(moved.shape), exponents.reshape(moved.shape[:-1] + (-1,)), axis, padding


def _dequantize_blocked(element_format, codes, exponents, block_size, dtype=np.float64):
    if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise MxsimError(f"dequantize: dtype must be float32 or float64, got {np.dtype(dtype)}")
    out = np.empty(codes.shape, dtype=dtype)
    K.dequantize_blocks(
        codes.reshape(-1, block_size), exponents.reshape(-1), element_format.decode_table, out.reshape(-1, block_size)
    )
    return out
