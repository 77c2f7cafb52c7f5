"""MX block quantization (OCP Microscaling): shared E8M0 scales over blocks of elements."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..errors import ArgumentError, MxsimError
from ..formats import FormatInfo, format_names, get_format
from ..formats.rounding import overflow_code, rounding_code
from ..formats import _kernels as FK
from ..formats.table import E8M0_BIAS, E8M0_NAN, INPUT_FLOATS, as_float_array
from .._threads import SERIAL_QUANTIZE_BELOW, run_in_threads, threads_for
from ..limits import check_array_budget, check_axis, check_block_size, check_int
from . import _kernels as K
from .options import QuantOptions, resolve_options

_RULES = {"floor": K.RULE_FLOOR, "ceil": K.RULE_CEIL, "even": K.RULE_EVEN, "rceil": K.RULE_RCEIL}
_SOURCES = {"bits": K.SOURCE_EXACT, "field": K.SOURCE_FIELD, "log2": K.SOURCE_LOG2}
_NONFINITE = {
    "nan_block": K.NONFINITE_NAN_BLOCK,
    "propagate": K.NONFINITE_PROPAGATE,
    "inf_scale_max": K.NONFINITE_INF_SCALE_MAX,
    "inf_field": K.NONFINITE_INF_FIELD,
}
_UNDERFLOW = {
    "clamp": K.UNDERFLOW_CLAMP,
    "unclamped": K.UNDERFLOW_UNCLAMPED,
    "unclamped_eps": K.UNDERFLOW_UNCLAMPED_EPS,
}


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
        tensor_scale_exponent: T of a per-tensor scaled tensor (``quantize(...,
            per_tensor_scale=True)``): every value is additionally multiplied by 2^T, which
            lives outside the blocks (all block scales are then 1); 0 otherwise.
    """

    element_format: FormatInfo
    codes: np.ndarray
    scales: np.ndarray
    shape: tuple
    axis: int
    block_size: int
    padding: int
    options: QuantOptions
    tensor_scale_exponent: int = 0

    @property
    def scale_exponents(self) -> np.ndarray:
        """Unbiased int32 scale exponents ``code - 127``; a NaN scale (0xFF) is SCALE_NAN."""
        return scale_exponents_of_codes(self.scales)

    def dequantize(self, dtype=np.float64) -> np.ndarray:
        """Values in the original shape: element value × 2^X, exact in float64.

        ``dtype=np.float32`` rounds the exact values to float32 (nearest-even).
        """
        exponents = self.scale_exponents
        if self.tensor_scale_exponent:
            exponents = np.where(
                exponents == K.SCALE_NAN, exponents, exponents + self.tensor_scale_exponent
            )
        values = _dequantize_blocked(
            self.element_format, self.codes, exponents, self.block_size, dtype
        )
        return _from_blocks(values, self.shape, self.axis, self.padding)

    def block_values(self, index: tuple[int, ...]) -> list[Fraction | float] | None:
        """Exact values of one block's elements (``index`` into ``scales``); None if its scale is NaN."""
        *outer, block = index
        scale_code = int(self.scales[tuple(index)])
        if scale_code == E8M0_NAN:
            return None
        codes = self.codes[tuple(outer)][block * self.block_size : (block + 1) * self.block_size]
        scale = Fraction(2) ** (scale_code - E8M0_BIAS)
        return [self.element_format.value_of(int(c)) * scale for c in codes]


def scale_exponents_of_codes(scales: np.ndarray) -> np.ndarray:
    """Unbiased int32 exponents of E8M0 scale codes; 0xFF (NaN) becomes ``SCALE_NAN``.
    uint8 codes (an MX tensor's) in one kernel pass (a batch of attention heads converts
    its scales on every call), other integer arrays by numpy."""
    if scales.dtype == np.uint8:
        exponents = np.empty(scales.size, dtype=np.int32)
        flat = scales.reshape(-1) if scales.flags.c_contiguous else scales.flatten()
        K.e8m0_exponents(flat, E8M0_BIAS, E8M0_NAN, exponents)
        return exponents.reshape(scales.shape)
    exponents = scales.astype(np.int32) - E8M0_BIAS
    exponents[scales == E8M0_NAN] = K.SCALE_NAN
    return exponents


#: Roles whose formats a per-tensor scale casts into (scale 1) rather than scales by the amax
#: rule: formats as wide as fp16, bf16 and tf32, which take values as a framework's cast does
#: (the amax rule is FP8 practice; scaled up to their largest values, products would overflow
#: a unit's sums).
CAST_ROLES = ("wide", "tensor_input")


def per_tensor_exponent(fmt) -> int | None:
    """The per-tensor scale exponent a quantization into ``fmt`` (a name or FormatInfo) takes
    where the caller asks for one scale per tensor: 0 (a plain cast) for the
    :data:`CAST_ROLES`' formats, None (the amax rule) for the others."""
    element_format = fmt if isinstance(fmt, FormatInfo) else get_format(fmt)
    return 0 if element_format.role in CAST_ROLES else None


def quantize(
    x,
    fmt,
    axis: int = -1,
    block_size: int = 32,
    profile: str = "ocp",
    *,
    per_tensor_scale: bool = False,
    tensor_scale_exponent: int | None = None,
    **options,
) -> MXTensor:
    """Quantize ``x`` to MX: blocks of ``block_size`` along ``axis`` share one E8M0 scale.

    Args:
        x: float16, float32 or float64 numpy array (read exactly; no rounding through float32).
        fmt: element format: a table name (``fp8_e4m3``, ...) or a Quark config name
            (``MXFP8E4M3``, ...), or a FormatInfo.
        axis: the axis along which blocks are formed. A partial last block is zero-padded.
        block_size: elements per block (OCP: 32), an integer 1..4096.
        profile: a name of :data:`mxsim.quantize.options.PROFILES`; ``options`` override its
            fields (see :class:`~mxsim.quantize.options.QuantOptions`).

    The scale exponent X of a block comes from its amax by ``scale_rule``; each element is
    then ``x * 2^-X`` rounded once into the element format (``element_rounding``,
    ``element_overflow``). Raises MxsimError for options an MXTensor cannot hold
    (scales below 2^-127 with ``scale_underflow="unclamped"``, NaN or ±Inf elements under
    ``nonfinite="propagate"`` unless the format has that code and, for Inf,
    ``element_overflow="inf_nan"``): use :func:`fake_quantize` for those.

    ``per_tensor_scale=True``: the per-tensor power-of-two scaling of FP8 inference, for units
    without block scales (``inputs.scales: none``). One exponent T is chosen for the whole
    tensor by the profile's ``scale_rule`` from the tensor's amax — exactly the exponent a
    single block holding every element would get (OCP floor rule: T = floor(log2 amax) -
    emax_elem) — and each element is ``x * 2^-T`` rounded once into the element format (the
    profile's element rounding and overflow). The result has blocks of ``block_size`` along
    ``axis`` whose scales are all 1 (code 127) and carries T as ``tensor_scale_exponent``;
    :meth:`MXTensor.dequantize` multiplies it back and :func:`mxsim.matmul` scales its
    output by 2^(Ta + Tb) exactly. Raises MxsimError when the tensor has NaN/Inf (no scale
    exists) or T lies outside E8M0's range.

    ``tensor_scale_exponent=T`` (an integer -127..127): per-tensor scaling with T given rather
    than chosen; T = 0 is the plain cast of fp16/bf16/tf32 GEMMs, whose formats need no
    scaling (and whose largest values, scaled up by the amax rule, would overflow the sums).

    An empty ``x`` (a dimension of length 0) is valid and gives an MXTensor with no
    elements (and no blocks if the quantized axis is empty; per-tensor exponent 0). Bad arguments raise
    :class:`~mxsim.errors.MxsimError` subclasses; a tensor whose padded float64 copy would
    exceed the memory budget raises :class:`~mxsim.errors.BudgetError` (docs/limits.md).
    """
    if per_tensor_scale or tensor_scale_exponent is not None:
        return _quantize_per_tensor(
            x, fmt, axis, block_size, profile, options, tensor_scale_exponent
        )
    element_format, opts, values = _prepare(x, fmt, profile, options)
    codes, exponents, axis, padding = _quantize_blocked(
        values, element_format, opts, axis, block_size
    )
    if (exponents < K.E8M0_MIN_EXPONENT).any():
        raise MxsimError(
            "quantize: a scale below 2^-127 is not an E8M0 code (scale_underflow='unclamped'); use fake_quantize"
        )
    if opts.nonfinite == "propagate" and not element_format.has_nan and np.isnan(values).any():
        raise MxsimError(
            f"quantize: {element_format.name} has no NaN code to propagate; use fake_quantize"
        )
    if (
        opts.nonfinite == "propagate"
        and np.isinf(values).any()
        and not (element_format.has_inf and opts.element_overflow == "inf_nan")
    ):
        raise MxsimError(
            f"quantize: ±Inf passes through unchanged under nonfinite='propagate', which {element_format.name} "
            f"codes with element_overflow={opts.element_overflow!r} cannot hold; use fake_quantize"
        )
    scales = np.where(exponents == K.SCALE_NAN, E8M0_NAN, exponents + E8M0_BIAS).astype(np.uint8)
    return MXTensor(element_format, codes, scales, values.shape, axis, block_size, padding, opts)


def quantize_at_scales(
    x, fmt, scales, axis: int = -1, block_size: int = 32, profile: str = "ocp", **options
) -> MXTensor:
    """``x`` quantized to MX against given E8M0 scale codes instead of the profile's scale rule
    (a model's stored scales, where one set of values has several encodings).

    ``scales``: uint8 codes in the result's layout (``x``'s shape with ``axis`` moved last,
    one per block of ``block_size``, the last block zero-padded). Each element is ``x * 2^-X``
    (X = code - 127; exact in float64 for float16/float32 inputs) rounded once into the
    element format by the profile's ``element_rounding`` and ``element_overflow``; a block
    whose code is 0xFF is NaN (its element codes 0). The profile's scale options do not apply.
    Raises MxsimError for a scales array of another dtype or shape, or a NaN/±Inf element in a
    block whose scale is not NaN.
    """
    element_format, opts, values = _prepare(x, fmt, profile, options)
    moved, axis, padding = _to_blocks(values, axis, block_size)
    scales = np.asarray(scales)
    shape = moved.shape[:-1] + (moved.shape[-1] // block_size,)
    if scales.dtype != np.uint8 or scales.shape != shape:
        raise MxsimError(
            f"quantize_at_scales: scales must be uint8 of shape {shape}, "
            f"got {scales.dtype} {scales.shape}"
        )
    nan_block = np.repeat(scales == E8M0_NAN, block_size, axis=-1)
    wide = np.where(nan_block, 0.0, moved.astype(np.float64))
    if not np.isfinite(wide).all():
        raise MxsimError(
            "quantize_at_scales: a NaN or Inf element in a block whose given scale is not NaN"
        )
    exponents = np.repeat(scales.astype(np.int32) - E8M0_BIAS, block_size, axis=-1)
    stored = element_format.encode(
        np.ldexp(wide, -exponents), opts.element_rounding, opts.element_overflow
    )
    codes = (stored >> element_format.padding_bits).astype(element_format.code_dtype)
    return MXTensor(
        element_format, codes, scales.copy(), values.shape, axis, block_size, padding, opts
    )


def _quantize_per_tensor(
    x, fmt, axis, block_size, profile, options, fixed_exponent=None
) -> MXTensor:
    element_format, opts, values = _prepare(x, fmt, profile, options)
    block_size = check_block_size(block_size, "quantize: block_size")
    if fixed_exponent is not None:
        exponent = check_int(
            fixed_exponent,
            "quantize: tensor_scale_exponent",
            K.E8M0_MIN_EXPONENT,
            K.E8M0_MAX_EXPONENT,
        )
        table = _options_table(element_format, opts, values.dtype)[0]
        if not table.size:  # stochastic (the encoder's own draws), or formats the table lacks
            stored = element_format.encode(
                values if exponent == 0 else np.ldexp(values.astype(np.float64), -exponent),
                opts.element_rounding,
                opts.element_overflow,
            )  # x * 2^-T rounded once (exact scaling; a cast reads x in its own dtype)
            codes = (stored >> element_format.padding_bits).astype(element_format.code_dtype)
        else:  # the kernel's table at scale T: each x * 2^-T rounded once, read as it is
            flat = np.ascontiguousarray(values).reshape(1, -1)
            codes = _quantize_blocked(
                flat, element_format, opts, 1, max(flat.size, 1), True, exponent
            )[0]
            codes = codes[:, : values.size].reshape(values.shape)
    else:
        if not np.isfinite(values).all():
            raise MxsimError(
                "quantize: per_tensor_scale needs a finite tensor (NaN/Inf have no per-tensor scale)"
            )
        # The whole tensor as one block: its scale exponent is T, its codes are x * 2^-T rounded.
        flat = np.ascontiguousarray(values).reshape(1, -1)
        codes, exponents, _, _ = _quantize_blocked(
            flat, element_format, opts, 1, max(flat.size, 1), whole_tensor=True
        )
        exponent = int(exponents[0, 0]) if values.size else 0  # no elements: a plain cast
        if exponent < K.E8M0_MIN_EXPONENT:
            raise MxsimError(
                "quantize: the per-tensor scale is below 2^-127 (scale_underflow='unclamped')"
            )
        codes = codes[:, : values.size].reshape(values.shape)
    moved, axis, padding = _to_blocks(codes, axis, block_size)
    scales = np.full(moved.shape[:-1] + (moved.shape[-1] // block_size,), E8M0_BIAS, dtype=np.uint8)
    return MXTensor(
        element_format, moved, scales, values.shape, axis, block_size, padding, opts, exponent
    )


@dataclass(frozen=True, eq=False)
class MXGroups:
    """G MX tensors of one shape, element format and block layout held as one (attention
    heads, conv groups: one object and one validation, not G): group g is :meth:`group` (g),
    the MXTensor ``MXTensor(element_format, codes[g], scales[g], shape, axis, block_size,
    padding, options, tensor_scale_exponents[g])``.

    Attributes as :class:`MXTensor`'s, with a leading group axis on the arrays: ``codes``
    (G, *other_dims, n_blocks * block_size), ``scales`` (G, *other_dims, n_blocks);
    ``shape``, ``axis``: one group's shape and quantized axis; ``tensor_scale_exponents``:
    (G,) int64, each group's T (0 without per-tensor scaling).
    """

    element_format: FormatInfo
    codes: np.ndarray
    scales: np.ndarray
    shape: tuple
    axis: int
    block_size: int
    padding: int
    options: QuantOptions
    tensor_scale_exponents: np.ndarray

    def __len__(self) -> int:
        return self.codes.shape[0]

    @classmethod
    def of(cls, tensors: list[MXTensor]) -> MXGroups:
        """A non-empty list of MXTensors of one element format, shape, axis and layout (not
        checked: the first one's are taken) stacked into one."""
        first = tensors[0]
        return cls(
            first.element_format,
            np.stack([t.codes for t in tensors]),
            np.stack([t.scales for t in tensors]),
            first.shape,
            first.axis,
            first.block_size,
            first.padding,
            first.options,
            np.array([t.tensor_scale_exponent for t in tensors], dtype=np.int64),
        )

    def group(self, g: int) -> MXTensor:
        """Group ``g`` as an MXTensor (its arrays are views of this one's)."""
        return MXTensor(
            self.element_format,
            self.codes[g],
            self.scales[g],
            self.shape,
            self.axis,
            self.block_size,
            self.padding,
            self.options,
            int(self.tensor_scale_exponents[g]),
        )

    def tensors(self) -> list[MXTensor]:
        """Every group as an MXTensor, in order."""
        return [self.group(g) for g in range(len(self))]

    def dequantize(self, dtype=np.float64) -> np.ndarray:
        """Values (G, *shape): each group's :meth:`MXTensor.dequantize`."""
        exponents = scale_exponents_of_codes(self.scales)
        shifts = self.tensor_scale_exponents.reshape((-1,) + (1,) * (exponents.ndim - 1))
        if shifts.any():
            exponents = np.where(exponents == K.SCALE_NAN, exponents, exponents + shifts)
        values = _dequantize_blocked(
            self.element_format, self.codes, exponents, self.block_size, dtype
        )
        moved = values.reshape(
            (len(self),) + tuple(np.delete(self.shape, self.axis)) + (values.shape[-1],)
        )
        if self.padding:
            moved = moved[..., : -self.padding]
        return np.moveaxis(moved, -1, self.axis + 1)


def quantize_groups(
    x,
    fmt,
    block_size: int = 32,
    profile: str = "ocp",
    *,
    per_tensor_scale: bool = False,
    tensor_scale_exponent: int | None = None,
    **options,
) -> list[MXTensor]:
    """``[quantize(x[g], fmt, axis=1, ...) for g in range(G)]`` for a (G, R, K) array, in one
    kernel call: :func:`quantize_grouped` (whose docstring says more) as a list of MXTensors."""
    return quantize_grouped(
        x,
        fmt,
        block_size,
        profile,
        per_tensor_scale=per_tensor_scale,
        tensor_scale_exponent=tensor_scale_exponent,
        **options,
    ).tensors()


def quantize_grouped(
    x,
    fmt,
    block_size: int = 32,
    profile: str = "ocp",
    *,
    per_tensor_scale: bool = False,
    tensor_scale_exponent: int | None = None,
    **options,
) -> MXGroups:
    """A (G, R, K) array quantized along K group by group, in one kernel call, as one
    :class:`MXGroups`: group g is ``quantize(x[g], fmt, axis=1, ...)`` (with
    ``per_tensor_scale``, one exponent per group, chosen from the group's amax). The element
    codes and scales are identical to the group-by-group calls' except under stochastic
    rounding, whose random stream runs on over the groups instead of restarting at each (so
    this refuses it). Arguments and errors as :func:`quantize`."""
    element_format, opts, values = _prepare(x, fmt, profile, options)
    if values.ndim != 3:
        raise MxsimError(f"quantize_groups: x must be (groups, rows, K), got shape {values.shape}")
    if opts.element_rounding == "stochastic":
        raise MxsimError(
            "quantize_groups: stochastic rounding draws depend on the layout; quantize each group"
        )
    groups, rows, k = values.shape
    if not (per_tensor_scale and tensor_scale_exponent is None):
        whole = quantize(
            values.reshape(groups * rows, k),
            fmt,
            1,
            block_size,
            profile,
            per_tensor_scale=per_tensor_scale,
            tensor_scale_exponent=tensor_scale_exponent,
            **options,
        )
        exponents = np.full(groups, whole.tensor_scale_exponent, dtype=np.int64)
    else:
        if not np.isfinite(values).all():
            raise MxsimError(
                "quantize: per_tensor_scale needs a finite tensor (NaN/Inf have no per-tensor scale)"
            )
        block_size = check_block_size(block_size, "quantize: block_size")
        # Each group as one block: its scale exponent is the group's T, its codes x * 2^-T rounded.
        flat = np.ascontiguousarray(values).reshape(groups, rows * k)
        if flat.size:
            codes, chosen, _, _ = _quantize_blocked(
                flat, element_format, opts, 1, rows * k, whole_tensor=True
            )
            exponents = chosen[:, 0].astype(np.int64)
        else:  # no elements: a plain cast, as quantize gives it
            codes, exponents = flat.astype(element_format.code_dtype), np.zeros(groups, np.int64)
        if (exponents < K.E8M0_MIN_EXPONENT).any():
            raise MxsimError(
                "quantize: the per-tensor scale is below 2^-127 (scale_underflow='unclamped')"
            )
        moved, _, padding = _to_blocks(codes.reshape(groups * rows, k), 1, block_size)
        scales = np.full((groups * rows, moved.shape[-1] // block_size), E8M0_BIAS, dtype=np.uint8)
        whole = MXTensor(
            element_format, moved, scales, (groups * rows, k), 1, block_size, padding, opts
        )
    return MXGroups(
        whole.element_format,
        whole.codes.reshape(groups, rows, whole.codes.shape[-1]),
        whole.scales.reshape(groups, rows, whole.scales.shape[-1]),
        (rows, k),
        1,
        whole.block_size,
        whole.padding,
        whole.options,
        exponents,
    )


def fake_quantize(
    x, fmt, axis: int = -1, block_size: int = 32, profile: str = "ocp", **options
) -> np.ndarray:
    """Quantize then dequantize in one step, as float64 in ``x``'s shape.

    Accepts every option, including those an MXTensor cannot hold: scales below 2^-127
    (``scale_underflow="unclamped"``) and NaN/Inf passed through (``nonfinite="propagate"``:
    the output holds the input's NaN and ±Inf). Zero results take the sign ``zero_signs``
    names for the format.

    Arguments are checked as in :func:`quantize`; an empty ``x`` gives an empty float64
    array of the same shape.
    """
    element_format, opts, values = _prepare(x, fmt, profile, options)
    codes, exponents, axis, padding = _quantize_blocked(
        values, element_format, opts, axis, block_size
    )
    blocked = _dequantize_blocked(element_format, codes, exponents, block_size)
    out = _from_blocks(blocked, values.shape, axis, padding)
    zero_sign = dict(opts.zero_signs).get(element_format.name, "code")
    if zero_sign != "code":
        element_exponents = None
        if zero_sign in UNDERFLOW_ZERO_SIGNS:  # (a NaN scale leaves no zero)
            blocked_exponents = np.minimum(exponents, K.E8M0_MAX_EXPONENT + 1)
            element_exponents = _from_blocks(
                np.repeat(blocked_exponents, block_size, axis=-1), values.shape, axis, padding
            )
        out = sign_zeros(out, values, element_exponents, zero_sign, element_format)
    if opts.nonfinite == "propagate":
        out = np.where(np.isfinite(values), out, values.astype(np.float64))
    return out


#: Zero-sign rules that read each element's block scale exponent.
UNDERFLOW_ZERO_SIGNS = ("input_if_underflow", "input_unless_underflow")


def sign_zeros(out, values, exponents, rule: str, element_format: FormatInfo) -> np.ndarray:
    """``out`` (``values`` quantized, dequantized) with its zeros signed by the zero-sign
    ``rule`` (:class:`QuantOptions` ``zero_signs``, other than ``code``); ``exponents``: each
    element's block scale exponent X in ``values``' shape (read by
    :data:`UNDERFLOW_ZERO_SIGNS` only)."""
    negative = np.signbit(values) & (rule != "positive")
    if rule == "input_if_underflow":  # |x| * 2^-X <= 2^-150
        negative &= np.abs(values) <= np.ldexp(1.0, exponents - 150)
    elif rule == "input_unless_underflow":  # |x| / step > 2^-150, step 2^(X-p) the element's
        step = exponents - element_format.top_fraction_bits
        negative &= np.abs(values) > np.ldexp(1.0, step - 150)
    return np.where(out == 0, np.where(negative, -0.0, 0.0), out)


def _prepare(x, fmt, profile, options):
    element_format = get_format(fmt)
    if element_format.role == "scale" or not element_format.signed:
        accepted = format_names("element", "bfp_element", "wide", "tensor_input")
        raise ArgumentError(
            f"quantize: {element_format.name} is not an element format (it is "
            f"{'a block scale format' if element_format.role == 'scale' else 'unsigned'}); "
            f"accepted: {', '.join(accepted)} or a signed custom format"
        )
    opts = resolve_options(profile, **options)
    values = as_float_array(x, "quantize")
    if values.ndim == 0:
        raise MxsimError("quantize: x must have at least one dimension")
    if element_format.twos_complement:
        element_format = dataclasses.replace(
            element_format, allow_min_twos_complement=opts.int8_minus_two
        )
    if opts.element_overflow == "inf_nan" and not element_format.has_nan:
        raise MxsimError(
            f"quantize: element_overflow='inf_nan' needs a format with Inf or NaN; {element_format.name} has neither"
        )
    if opts.nonfinite == "raise" and not np.isfinite(values).all():
        raise MxsimError("quantize: input has NaN or Inf (nonfinite='raise')")
    return element_format, opts, values


def _to_blocks(values: np.ndarray, axis: int, block_size: int, whole_tensor: bool = False):
    """``values`` with ``axis`` moved last and zero-padded to whole blocks. ``whole_tensor``:
    the block is the whole (flattened) tensor, chosen here, not a user's block size."""
    axis = check_axis(axis, values.ndim, "quantize: axis")
    if not whole_tensor:
        block_size = check_block_size(block_size, "quantize: block_size")
    moved = np.moveaxis(values, axis, -1)
    padding = -moved.shape[-1] % block_size
    # the largest array made is the float64 result (fake_quantize, dequantize), padded
    check_array_budget(
        moved.shape[:-1] + (moved.shape[-1] + padding,), 8, "quantize: the blocked tensor"
    )
    if padding:
        moved = np.concatenate(
            [moved, np.zeros(moved.shape[:-1] + (padding,), dtype=moved.dtype)], axis=-1
        )
    return np.ascontiguousarray(moved), axis, padding


def _from_blocks(blocked: np.ndarray, shape: tuple, axis: int, padding: int) -> np.ndarray:
    moved = blocked.reshape(tuple(np.delete(shape, axis)) + (blocked.shape[-1],))
    if padding:
        moved = moved[..., :-padding]
    return np.moveaxis(moved, -1, axis)


@functools.lru_cache(maxsize=None)
def _max_ratio_q52(max_finite: float, emax: int) -> int:
    """max_finite / 2^emax * 2^52, truncated (the rceil rule's threshold; exact Fractions)."""
    return int(Fraction(max_finite) / Fraction(2) ** emax * 2**52)


def _quantize_blocked(
    values,
    element_format: FormatInfo,
    opts: QuantOptions,
    axis: int,
    block_size: int,
    whole_tensor: bool = False,
    fixed_exponent: int | None = None,
):
    """(codes, scale exponents, axis, padding) of ``values`` in blocks of ``block_size``
    along ``axis`` (moved last, zero-padded to whole blocks: ``_to_blocks``), by
    ``_kernels.quantize_blocks``. An axis shorter than one block (attention's P @ V over
    a few tokens) is quantized as blocks of its own length, then its codes padded with
    the code the kernel gives +0 (0 in a block of NaN scale): the same result, as the
    padding's zeros leave a block's amax, and so its scale, as they are and code alike at
    every scale, but without the padding's work; not under stochastic rounding, whose
    draws are indexed by position in whole blocks. ``fixed_exponent``: every block's scale
    exponent, given (``_kernels.quantize_blocks``), for a whole-tensor cast."""
    axis = check_axis(axis, values.ndim, "quantize: axis")
    short = values.shape[axis]
    if (
        not whole_tensor
        and 0 < short < check_block_size(block_size, "quantize: block_size")
        and opts.element_rounding != "stochastic"
    ):
        shape = values.shape[:axis] + values.shape[axis + 1 :] + (block_size,)
        check_array_budget(shape, 8, "quantize: the blocked tensor")
        codes, exponents, axis, _ = _quantize_blocked(values, element_format, opts, axis, short)
        padded = np.empty(codes.shape[:-1] + (block_size,), dtype=codes.dtype)
        padded[..., :short] = codes
        padded[..., short:] = np.where(
            exponents == K.SCALE_NAN, 0, _zero_code(element_format, opts)
        )
        return padded, exponents, axis, block_size - short
    moved, axis, padding = _to_blocks(values, axis, block_size, whole_tensor)
    exponent_bits, mantissa_bits, bit_view = INPUT_FLOATS[values.dtype]
    # One kernel signature for every input width: the kernel reads the bits as uint64.
    bits = moved.view(bit_view).reshape(-1, block_size).astype(np.uint64, copy=False)
    codes = np.empty(bits.shape, dtype=element_format.code_dtype)
    exponents = np.empty(bits.shape[0], dtype=np.int32)
    emax = element_format.scale_emax
    max_ratio_q52 = _max_ratio_q52(element_format.max_finite, emax)
    even_fraction_bits = dict(opts.even_fraction_bits).get(
        element_format.name, element_format.top_fraction_bits
    )
    rounding, overflow = rounding_code(opts.element_rounding), overflow_code(opts.element_overflow)
    table, table_low, table_high, top_bits = _options_table(element_format, opts, values.dtype)
    arguments = (
        bits,
        exponent_bits,
        mantissa_bits,
        element_format.kernel_params,
        _RULES[opts.scale_rule],
        _SOURCES[opts.exponent_source],
        emax,
        even_fraction_bits,
        max_ratio_q52,
        rounding,
        overflow,
        _NONFINITE.get(opts.nonfinite, K.NONFINITE_NAN_BLOCK),
        _UNDERFLOW[opts.scale_underflow],
        opts.scale_overflow == "clamp",
        _min_exponent(element_format, opts),
        K.NO_EXPONENT
        if opts.min_scale_element_exponent is None
        else opts.min_scale_element_exponent,
        K.NO_EXPONENT if fixed_exponent is None else fixed_exponent,
        opts.seed,
        table,
        table_low,
        table_high,
        top_bits,
        codes,
        exponents,
    )
    with threads_for(bits.size, SERIAL_QUANTIZE_BELOW):
        run_in_threads(
            lambda start, stop: K.quantize_blocks(
                *arguments, np.empty(min(block_size, K.ENTRY_RUN), np.int64), start, stop
            ),
            len(bits),
        )
    return (
        codes.reshape(moved.shape),
        exponents.reshape(moved.shape[:-1] + (moved.shape[-1] // block_size,)),
        axis,
        padding,
    )


@functools.lru_cache(maxsize=64)
def _zero_code(element_format: FormatInfo, opts: QuantOptions) -> int:
    """The code ``_kernels.quantize_blocks`` gives +0 under these options (at any scale)."""
    codes = _quantize_blocked(np.zeros((1, 1), dtype=np.float32), element_format, opts, 1, 1)[0]
    return int(codes[0, 0])


def _options_table(element_format: FormatInfo, opts: QuantOptions, dtype) -> tuple:
    """:func:`_encode_table` of the options' element rounding and overflow, for inputs of the
    float ``dtype``."""
    rounding, overflow = rounding_code(opts.element_rounding), overflow_code(opts.element_overflow)
    return _encode_table(element_format, rounding, overflow, INPUT_FLOATS[dtype][1])


MAX_TABLE_ENTRIES = 1 << 20  # codes of the encode table (uint16: 2 MiB)
_NO_TABLE = np.zeros(0, dtype=np.uint16)
_NO_TABLE.setflags(write=False)  # read-only as the tables: one kernel signature


@functools.lru_cache(maxsize=64)
def _encode_table(element_format: FormatInfo, rounding: int, overflow: int, in_mantissa_bits: int):
    """(table, lowest exponent, highest exponent, top bits) of ``quantize_blocks``'s table path
    (``_kernels.encode_table``), or an empty table where it does not apply: stochastic
    rounding (each element draws), codes over 16 bits, inputs with fewer mantissa bits than
    the table reads, or a table over MAX_TABLE_ENTRIES.

    The table reads ``top_bits`` bits below the leading one: enough that the format's rounding
    point (its quantum at the value's binade) lies among them for every exponent up to emax,
    so those bits and one sticky bit decide the rounding. Its exponents run from low, where a
    value lies below half the format's smallest quantum (every lower one rounds alike), to
    emax + 1 (every higher one overflows alike)."""
    params = element_format.kernel_params
    bias, mantissa_bits, emax = (
        int(params[FK.P_BIAS]),
        int(params[FK.P_MANTISSA_BITS]),
        int(params[FK.P_EMAX]),
    )
    if (
        params[FK.P_EXPONENT_BITS] == 0
    ):  # fixed point: one quantum 2^(1 - bias - m) at every exponent
        top_bits = max(mantissa_bits + 1, emax - (1 - bias - mantissa_bits) + 1)
    else:  # the quantum of a binade e is at least 2^(e - m)
        top_bits = mantissa_bits + 1
    low, high = -bias - mantissa_bits - 2, emax + 1
    entries = 2 * (high - low + 1) << (top_bits + 1)
    if (
        rounding == FK.ROUND_STOCHASTIC
        or element_format.field_bits > 16
        or top_bits > in_mantissa_bits
        or entries > MAX_TABLE_ENTRIES
    ):
        return _NO_TABLE, 0, 0, 0
    table = np.empty(entries, dtype=np.uint16)
    K.encode_table(params, rounding, overflow, low, top_bits, table)
    table.setflags(write=False)
    return table, low, high, top_bits


def _min_exponent(element_format: FormatInfo, opts: QuantOptions) -> int:
    """The floor on X from ``int8_min_step_exponent`` (INT8's step is 2^X times its smallest value)."""
    if opts.int8_min_step_exponent is None or not element_format.twos_complement:
        return int(K.NO_EXPONENT)
    return opts.int8_min_step_exponent - math.frexp(element_format.min_subnormal)[1] + 1


def _dequantize_blocked(element_format, codes, exponents, block_size, dtype=np.float64):
    if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise MxsimError(f"dequantize: dtype must be float32 or float64, got {np.dtype(dtype)}")
    if (
        element_format.decode_table is None
    ):  # fields over 16 bits (tf32, fp32): decoded without a table
        values = element_format.decode_fields(codes.reshape(-1, block_size))
        nan_scale = exponents.reshape(-1, 1) == K.SCALE_NAN
        scaled = np.ldexp(
            values, np.where(nan_scale, 0, exponents.reshape(-1, 1))
        )  # exact in float64
        return np.where(nan_scale, np.nan, scaled).reshape(codes.shape).astype(dtype, copy=False)
    # Written in the requested dtype: each value is exact in float64 and rounded once on the
    # store. A float32 signature of its own (a small kernel, under a second to compile) saves a
    # float64 copy and a second pass, about 3x on large tensors.
    out = np.empty(codes.shape, dtype=dtype)
    arguments = (
        codes.reshape(-1, block_size),
        exponents.reshape(-1),
        element_format.decode_table,
        out.reshape(-1, block_size),
    )
    with threads_for(codes.size):
        run_in_threads(
            lambda start, stop: K.dequantize_blocks(*arguments, start, stop), len(arguments[0])
        )
    return out
