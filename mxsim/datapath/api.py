"""Public datapath API: ``dot``, ``matmul``, ``matmul_batched``, ``explain`` and bit/float views of outputs."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ArgumentError
from ..formats import FormatInfo, get_format
from ..formats.table import as_float_array, native_float_dtype
from .._threads import SERIAL_GEMM_BELOW, run_in_threads, threads_for
from ..limits import check_array_budget, check_choice, check_int
from ..quantize import (
    MXGroups,
    MXTensor,
    NVFP4Groups,
    NVFP4Tensor,
    quantize,
    quantize_grouped,
)
from ..quantize._kernels import E8M0_MAX_EXPONENT, E8M0_MIN_EXPONENT
from ..quantize.mx import per_tensor_exponent, scale_exponents_of_codes
from . import _kernels as K
from .batch import (
    exact_tiles_apply,
    exact_tiles_matmul,
    exact_tiles_outrun_blas,
    small_groups_apply,
    small_groups_matmul,
    window_groups_apply,
    window_groups_matmul,
)
from .blas import batch_passes, blas_matmul, blas_route, subnormals_work
from .config import HardwareConfig, check_wide_products, load_hwconfig
from .fma import fma_applies, fma_dot, fma_matmul
from .fp32_steps import fp32_steps_apply, fp32_steps_dot, fp32_steps_matmul
from .groups import groups_apply, groups_matmul
from .reference import dot_reference
from .schema import FLOAT32_FORMATS, DatapathParams, kernel_record
from .tables import element_operand, products_fit_float64, scale_tables, sum_format
from .window import window_applies, window_dot, window_matmul

#: Longest dot product :func:`explain` takes (its reference twin runs in pure Python).
EXPLAIN_MAX_LENGTH = 1 << 16


def _as_config(hw) -> HardwareConfig:
    if isinstance(hw, HardwareConfig):
        return hw
    if isinstance(hw, (str, Path)):
        return load_hwconfig(hw)
    raise ArgumentError(
        f"expected a HardwareConfig or a path to a hwconfig YAML file, got {type(hw).__name__}"
    )


@functools.lru_cache(maxsize=4096)
def _kernel_config(params: DatapathParams) -> tuple[np.ndarray, np.ndarray, tuple]:
    """The kernel record (``schema.kernel_record``), the term-order array and the kernel_params
    of the accumulator, tree-sum, output and fp32 formats (cached per params, read-only: the
    kernels only read them)."""
    order = np.array(params.term_order or [0], dtype=np.int64)
    order.setflags(write=False)
    fp32 = get_format("fp32")
    acc = fp32 if params.accumulator_format == "exact" else get_format(params.accumulator_format)
    sums = sum_format(params.sum_significant_bits or 24)
    formats = (
        acc.kernel_params,
        sums.kernel_params,
        get_format(params.output_format).kernel_params,
        fp32.kernel_params,
    )
    return kernel_record(params), order, formats


def _codes(array, name: str, fmt: FormatInfo, fields_given: bool = False) -> np.ndarray:
    """Validated codes as the field codes (padding removed) that index the element tables;
    ``fields_given``: ``array`` already holds field codes (an MXTensor's codes)."""
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "iu":  # (numpy's integers)
        raise ArgumentError(f"{name}: expected an integer numpy array of {fmt.name} codes")
    if array.ndim != 2:
        raise ArgumentError(f"{name}: expected shape (n, K), got {array.shape}")
    fields = array if fields_given else fmt.field_codes(array, name)
    # Unsigned codes of up to 32 bits keep their width (an MXTensor's uint8 codes: the BLAS
    # route decodes them tile by tile, so the GEMM holds no widened copy); the kernels take
    # uint32 or uint64 only (``_kernel_codes``), each signature costing seconds to compile.
    narrow = fields.dtype.kind == "u" and fields.dtype.itemsize <= 4 and fmt.field_bits <= 32
    dtype = fields.dtype if narrow else np.uint32 if fmt.field_bits <= 32 else np.uint64
    return np.ascontiguousarray(fields, dtype=dtype)


def _same_width(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both code arrays in the wider of their dtypes: mixed formats add no kernel signature."""
    if a.dtype == b.dtype:  # (the common case, at no cost)
        return a, b
    dtype = np.promote_types(a.dtype, b.dtype)
    return a.astype(dtype, copy=False), b.astype(dtype, copy=False)


def _kernel_codes(codes: np.ndarray) -> np.ndarray:
    """Codes in the kernels' code type: uint32, or uint64 for codes wider than 32 bits."""
    return codes.astype(np.uint64 if codes.dtype.itemsize > 4 else np.uint32, copy=False)


def _one_row(values, name: str) -> np.ndarray:
    """A list or 1-D array as a (1, K) array (no conversion of its dtype)."""
    try:
        array = np.asarray(values)
    except (TypeError, ValueError):
        raise ArgumentError(f"{name}: expected a list or 1-D array of integer codes") from None
    if array.ndim != 1:
        raise ArgumentError(
            f"{name}: expected a list or 1-D array of integer codes, got shape {array.shape}"
        )
    return array.reshape(1, -1).astype(np.int64) if array.size == 0 else array.reshape(1, -1)


def _scale_exponents(
    scales, name: str, rows: int, blocks: int, params: DatapathParams
) -> np.ndarray:
    """The kernel's scale array: E8M0 exponents (0xFF as SCALE_NAN), or with ``scales:
    group_sum`` the codes of ``scale_format`` themselves (the kernel reads their tables)."""
    if params.scales == "none":
        if scales is not None:
            raise ArgumentError(f"{name}: this unit takes no scales (inputs.scales: none)")
        return np.zeros((rows, blocks), dtype=np.int32)
    fmt = get_format(params.scale_format)
    label = fmt.name.upper()
    if scales is None:  # every scale 1.0
        one = 0 if params.scales != "group_sum" else int(fmt.encode(np.array([1.0]))[0])
        return np.full((rows, blocks), one, dtype=np.int32)
    if not isinstance(scales, np.ndarray) or not np.issubdtype(scales.dtype, np.integer):
        raise ArgumentError(f"{name}: expected an integer numpy array of {label} codes")
    if scales.shape != (rows, blocks):
        raise ArgumentError(
            f"{name}: expected shape {(rows, blocks)} (one {label} code per block of {params.block_size}), got {scales.shape}"
        )
    top = (1 << fmt.bits) - 1
    if scales.size and (scales.min() < 0 or scales.max() > top):
        raise ArgumentError(f"{name}: {label} codes must lie in [0, {top}]")
    if params.scales == "group_sum":
        return np.ascontiguousarray(scales, dtype=np.int32)
    return scale_exponents_of_codes(scales)


#: The formats of the float dtypes c may be given in.
C_DTYPE_FORMATS = {
    np.dtype(np.float16): "fp16",
    np.dtype(np.float32): "fp32",
    np.dtype(np.float64): "fp64",
}


def kernel_c_dtype(c_format: str) -> np.dtype:
    """The dtype the kernels read c in: float32 where the format's values are float32 values
    (one kernel signature for fp32, fp16 and bf16 c), float64 for fp64."""
    return np.dtype(np.float64) if c_format not in FLOAT32_FORMATS else np.dtype(np.float32)


def _accumulator_inputs(
    c, shape: tuple, c_format: str = "fp32", repeats_from: int | None = None
) -> np.ndarray:
    """c as the kernels read it: +0 for None; otherwise a float32 array, or one of the
    format's own dtype (float16 for fp16, float64 for fp64), whose values are all values of
    ``c_format`` (NaN and ±Inf included), in :func:`kernel_c_dtype`. ``repeats_from``: an
    axis from which on the axes a broadcast ``c`` repeats (stride 0) are kept at length 1
    (:func:`_distinct`), the result broadcasting back to ``shape``."""
    if c is None:
        return np.zeros(shape, dtype=kernel_c_dtype(c_format))
    accepted = sorted(
        {"float32"} | {str(dtype) for dtype, name in C_DTYPE_FORMATS.items() if name == c_format}
    )
    try:
        c = np.asarray(c)
    except (TypeError, ValueError):
        raise ArgumentError(
            f"c: expected a {' or '.join(accepted)} numpy array of shape {shape} or None"
        ) from None
    if str(c.dtype) not in accepted:
        raise ArgumentError(
            f"c: expected a {' or '.join(accepted)} array of {c_format} values (inputs.c_format), "
            f"got dtype {c.dtype}"
        )
    if c.shape != shape:
        raise ArgumentError(f"c: expected shape {shape}, got {c.shape}")
    if repeats_from is not None:
        c = _distinct(c, repeats_from)
    given, fmt = get_format(C_DTYPE_FORMATS[c.dtype]), get_format(c_format)
    if (
        given.exponent_bits > fmt.exponent_bits or given.mantissa_bits > fmt.mantissa_bits
    ):  # values to check
        if not np.array_equal(fmt.round(c, overflow="inf"), c.astype(np.float64), equal_nan=True):
            raise ArgumentError(
                f"c: every value must be a {c_format} value (inputs.c_format); round c into it first"
            )
    return np.ascontiguousarray(
        c, dtype=kernel_c_dtype(c_format)
    )  # the kernels widen each value exactly


def _distinct(array: np.ndarray, first_axis: int = 0) -> np.ndarray:
    """``array`` with each axis from ``first_axis`` on along which it repeats (stride 0, as
    ``np.broadcast_to`` makes) cut to length 1: a view that broadcasts back to ``array``."""
    cut = tuple(
        slice(0, 1) if axis >= first_axis and stride == 0 else slice(None)
        for axis, stride in enumerate(array.strides)
    )
    return array[cut]


def times_power_of_two(x: np.ndarray, exponents) -> np.ndarray:
    """``x * 2^exponents`` (float32 or float64 ``x``; integer exponents broadcasting against
    it), rounded once into x's dtype exactly as ``np.ldexp`` rounds it: a vectorised
    multiplication by the powers of two (a product by a normal power of two is the correctly
    rounded scaled value, subnormal or overflowing results included) where every power is a
    normal number of the dtype and the floating point keeps subnormals, else ``np.ldexp``."""
    exponents = np.asarray(exponents)
    info = np.finfo(x.dtype)
    if (
        exponents.size
        and info.minexp <= exponents.min()
        and exponents.max() < info.maxexp
        and subnormals_work()
    ):
        return x * np.ldexp(1.0, exponents).astype(x.dtype)
    return np.ldexp(x, exponents)


def output_dtype(out_format: str) -> np.dtype:
    """The unsigned dtype of output bit patterns: uint64 for fp64, uint32 for fp32, uint16 for fp16/bf16."""
    return get_format(out_format).code_dtype


@functools.lru_cache(maxsize=64)
def _output_dtype_of(out_format: str) -> np.dtype:
    """:func:`output_dtype` of a resolved unit's output format (a name), once per name."""
    return output_dtype(out_format)


def kernel_output_dtype(out_format: str) -> np.dtype:
    """The dtype the kernels write output codes in: uint32 for every format of at most 32 bits
    (one kernel signature for fp32, fp16 and bf16), uint64 for fp64."""
    return np.dtype(np.uint32) if out_format in FLOAT32_FORMATS else np.dtype(np.uint64)


def as_float(bits: np.ndarray, out_format: str = "fp32") -> np.ndarray:
    """Output bit patterns as exact float64 values (fp16/bf16 widen exactly; NaN codes give
    the canonical quiet NaN, as ``FormatInfo.decode``)."""
    fmt = get_format(out_format)
    bits = np.asarray(bits)
    native = native_float_dtype(fmt)
    if native is None or bits.dtype != fmt.code_dtype or not subnormals_work():
        return fmt.decode(bits)
    # numpy's own widening of the same IEEE layout: exact, subnormals included (checked above)
    with np.errstate(invalid="ignore"):  # signalling NaNs: replaced below
        values = bits.view(native).astype(np.float64)
    _canonical_nans(values)
    return values


def _canonical_nans(values: np.ndarray) -> None:
    """Every NaN of the float64 ``values`` made the canonical quiet NaN, in place (a minimum
    over the array, which a NaN propagates, looks for them without a mask of every value)."""
    if values.size and np.isnan(values.min()):
        values[np.isnan(values)] = np.nan


def as_float_times_power_of_two(bits: np.ndarray, out_format: str, exponents) -> np.ndarray:
    """``times_power_of_two(as_float(bits, out_format), exponents)`` bit for bit (``as_float``
    alone where every exponent is 0). Where ``as_float`` takes numpy's own widening and every
    power is a normal float64, the widened values are multiplied by their powers in place: one
    float64 array, no second one for the scaled values."""
    exponents = np.asarray(exponents)
    if not exponents.any():
        return as_float(bits, out_format)
    fmt = get_format(out_format)
    bits = np.asarray(bits)
    native = native_float_dtype(fmt)
    info = np.finfo(np.float64)
    if (
        native is None
        or bits.dtype != fmt.code_dtype
        or not subnormals_work()
        or not (info.minexp <= exponents.min() and exponents.max() < info.maxexp)
    ):
        return times_power_of_two(as_float(bits, out_format), exponents)
    # A float64 product by a normal power of two rounds as np.ldexp (times_power_of_two).
    powers = np.ldexp(1.0, exponents)
    with np.errstate(invalid="ignore"):  # signalling NaNs: replaced below
        values = bits.view(native).astype(np.float64)
        if np.broadcast_shapes(values.shape, powers.shape) == values.shape:
            values *= powers  # in place: faster than a product of mixed dtypes
        else:
            values = values * powers
    _canonical_nans(values)
    return values


@functools.lru_cache(maxsize=4096)
def _kernel_arguments(params: DatapathParams) -> tuple[FormatInfo, FormatInfo, tuple]:
    """(A format, B format, kernel arguments): the element tables (empty for formats the
    kernel decodes itself, see ``tables.element_operand``), the kernel record, the term
    order, the formats' parameters and the scale tables (cached per params, as the parts
    are: the kernels only read them; a probe predicts each candidate on many batches)."""
    a_fmt, b_fmt = get_format(params.a_format), get_format(params.b_format)
    if not products_fit_float64(
        a_fmt, b_fmt
    ):  # resolved params skip the loader: the kernel cannot cut them
        check_wide_products(params, "<params>")
    a_values, a_exponents = element_operand(a_fmt, params.input_subnormals)
    b_values, b_exponents = element_operand(b_fmt, params.input_subnormals)
    cfg, order, formats = _kernel_config(params)
    scale_arguments = scale_tables(get_format(params.scale_format))
    return (
        a_fmt,
        b_fmt,
        (
            a_values,
            a_exponents,
            b_values,
            b_exponents,
            cfg,
            order,
            *formats,
            *scale_arguments,
            a_fmt.kernel_params,
            b_fmt.kernel_params,
        ),
    )


def _operands_and_arguments(
    params: DatapathParams, fields_a: np.ndarray, fields_b: np.ndarray, narrow: bool = False
) -> tuple[np.ndarray, np.ndarray, tuple]:
    """(A codes, B codes, kernel arguments): the field codes in one dtype (mixed formats add no
    kernel signature), the kernels' (``_kernel_codes``) unless ``narrow`` (GEMMs: the routes
    widen what they give the kernels), and :func:`_kernel_arguments`."""
    codes_a, codes_b = _same_width(fields_a, fields_b)
    if not narrow:
        codes_a, codes_b = _kernel_codes(codes_a), _kernel_codes(codes_b)
    return codes_a, codes_b, _kernel_arguments(params)[2]


def _check_method(method: str, caller: str) -> None:
    check_choice(method, f"{caller}: method", ("auto", "kernel"))


def dot(
    hw,
    a,
    b,
    *,
    a_format,
    b_format,
    scale_a=None,
    scale_b=None,
    c=None,
    out_format=None,
    c_format=None,
    method: str = "auto",
) -> np.ndarray:
    """Row-wise dot products through the unit ``hw``: out[i] = c[i] + sum_k a[i,k] b[i,k].

    Args:
        hw: a HardwareConfig or the path of a hwconfig YAML file.
        a, b: (n, K) integer arrays of element codes of ``a_format`` / ``b_format``.
        scale_a, scale_b: (n, ceil(K / block_size)) codes of the unit's ``inputs.scale_format``
            (E8M0: 0xFF = NaN; UE4M3: 0x7F = NaN); None means every scale is 1. Units with ``inputs.scales: none`` accept only None.
        c: (n,) accumulator inputs: a float16/32/64 array of values of ``c_format``; None means +0.
        out_format: fp32, fp16, bf16 or fp64; None: the config's ``output.format``.
        c_format: the format of c (as mma's C type); None: the config's ``inputs.c_format``.
        method: ``"kernel"`` always runs the generic datapath kernel; ``"auto"`` (default)
            uses the vectorised window route (:mod:`mxsim.datapath.window`) where it applies.

    Returns the output bit patterns: uint64 for fp64, uint32 for fp32, uint16 for fp16/bf16 (see
    :func:`as_float`). NaN results are the canonical quiet NaN.

    Empty inputs: n = 0 gives an empty output; K = 0 gives each c rounded to the output
    format (the empty sum is +0). Bad arguments raise :class:`~mxsim.errors.MxsimError`
    subclasses naming the argument.
    """
    params = _as_config(hw).params(a_format, b_format, out_format, c_format)
    return dot_with_params(params, a, b, scale_a=scale_a, scale_b=scale_b, c=c, method=method)


def dot_with_params(
    params: DatapathParams, a, b, *, scale_a=None, scale_b=None, c=None, method: str = "auto"
) -> np.ndarray:
    """:func:`dot` for already-resolved parameters (what-if studies, tests)."""
    _check_method(method, "dot")
    a = _codes(a, "a", get_format(params.a_format))
    b = _codes(b, "b", get_format(params.b_format))
    if a.shape != b.shape:
        raise ArgumentError(f"a and b must have the same shape (n, K), got {a.shape} and {b.shape}")
    a, b, kernel_args = _operands_and_arguments(params, a, b)
    rows, length = a.shape
    blocks = -(-length // params.block_size)
    exponents_a = _scale_exponents(scale_a, "scale_a", rows, blocks, params)
    exponents_b = _scale_exponents(scale_b, "scale_b", rows, blocks, params)
    c_values = _accumulator_inputs(c, (rows,), params.c_format)
    with threads_for(a.size):
        return _dot_routed(params, a, b, exponents_a, exponents_b, c_values, kernel_args, method)


def dot_with_each_params(
    params_list, a, b, *, scale_a=None, scale_b=None, c=None, method: str = "auto"
) -> list[np.ndarray]:
    """``[dot_with_params(params, a, b, ...) for params in params_list]``, bit for bit, with
    the operands validated and converted once per element formats, scale layout and c format
    rather than once per params (a probe predicts hundreds of candidate units on one batch).
    A bad argument raises what the first ``dot_with_params`` call to refuse it would raise."""
    _check_method(method, "dot")
    memo: dict = {}

    def once(key, make):
        if key not in memo:
            memo[key] = make()
        return memo[key]

    outs: list[np.ndarray] = []
    with contextlib.ExitStack() as small_work:
        for params in params_list:
            codes_a = once(
                ("a", params.a_format),
                lambda: _kernel_codes(_codes(a, "a", get_format(params.a_format))),
            )
            codes_b = once(
                ("b", params.b_format),
                lambda: _kernel_codes(_codes(b, "b", get_format(params.b_format))),
            )
            if codes_a.shape != codes_b.shape:
                raise ArgumentError(
                    f"a and b must have the same shape (n, K), got {codes_a.shape} and {codes_b.shape}"
                )
            codes_a, codes_b, kernel_args = _operands_and_arguments(params, codes_a, codes_b)
            rows, length = codes_a.shape
            blocks = -(-length // params.block_size)
            # _scale_exponents reads only these fields of params
            layout = (params.scales, params.scale_format, params.block_size)
            exponents_a = once(
                ("scale_a", layout),
                lambda: _scale_exponents(scale_a, "scale_a", rows, blocks, params),
            )
            exponents_b = once(
                ("scale_b", layout),
                lambda: _scale_exponents(scale_b, "scale_b", rows, blocks, params),
            )
            c_values = once(
                ("c", params.c_format), lambda: _accumulator_inputs(c, (rows,), params.c_format)
            )
            if not outs:  # one threads_for block for all: setting Numba's thread count is not free
                small_work.enter_context(threads_for(codes_a.size))
            outs.append(
                _dot_routed(
                    params,
                    codes_a,
                    codes_b,
                    exponents_a,
                    exponents_b,
                    c_values,
                    kernel_args,
                    method,
                )
            )
    return outs


def _dot_routed(
    params, a, b, exponents_a, exponents_b, c_values, kernel_args, method: str
) -> np.ndarray:
    """The output bits of :func:`dot_with_params` from its validated operands (read only),
    inside the caller's ``threads_for`` block."""
    out = np.empty(a.shape[0], dtype=kernel_output_dtype(params.output_format))
    route_dot = None
    if method == "auto" and fma_applies(params):
        route_dot = fma_dot
    elif method == "auto" and fp32_steps_apply(params):
        route_dot = fp32_steps_dot
    elif method == "auto" and window_applies(params):
        route_dot = window_dot
    if route_dot is not None:
        left = route_dot(params, a, b, exponents_a, exponents_b, c_values, out)
        if left.size:  # specials, out-of-range values, NaN results: the generic kernel
            part = np.empty(left.size, dtype=out.dtype)
            _dot_rows(
                a[left],
                b[left],
                exponents_a[left],
                exponents_b[left],
                c_values[left],
                *kernel_args,
                part,
            )
            out[left] = part
        return out.astype(output_dtype(params.output_format), copy=False)
    _dot_rows(a, b, exponents_a, exponents_b, c_values, *kernel_args, out)
    return out.astype(output_dtype(params.output_format), copy=False)


@dataclass(frozen=True)
class MatmulResult:
    """Output bit patterns of a GEMM and their exact values.

    ``bits`` are what the unit produced. ``scale_exponent`` is Ta + Tb of per-tensor scaled
    operands (0 otherwise): the unit computed ``2^-(Ta+Tb) (c + A @ B)`` and :attr:`values`
    multiplies by 2^(Ta+Tb) exactly (float64, no rounding). ``tensor_scale`` is ta * tb of
    NVFP4 operands' float32 tensor scales (exact in float64; 1.0 otherwise): the GEMM
    epilogue's alpha, outside the unit; :attr:`values` multiplies by it, rounding once to
    float64 (to nearest even) where the product needs more than 53 bits.
    """

    bits: np.ndarray
    out_format: str
    scale_exponent: int = 0
    tensor_scale: float = 1.0

    @property
    def values(self) -> np.ndarray:
        values = as_float_times_power_of_two(self.bits, self.out_format, self.scale_exponent)
        return values * self.tensor_scale if self.tensor_scale != 1.0 else values


def _operand(
    x,
    name: str,
    fmt_name: str | None,
    default_formats,
    block_size: int,
    axis: int,
    per_tensor_scale: bool,
) -> MXTensor:
    if isinstance(x, MXTensor):
        _check_tensor(x, name, block_size)
        return x
    fmt = default_formats[0] if fmt_name is None else fmt_name
    x = as_float_array(x, name) if isinstance(x, (list, tuple)) else x
    if not isinstance(x, np.ndarray) or x.ndim != 2:
        raise ArgumentError(
            f"{name}: expected a 2-D float array or an MXTensor, got {type(x).__name__}"
        )
    return quantize(
        x,
        fmt,
        axis=axis,
        block_size=block_size,
        per_tensor_scale=per_tensor_scale,
        tensor_scale_exponent=per_tensor_exponent(fmt) if per_tensor_scale else None,
    )


def _scaled_accumulator_input(c, shift: int, shape: tuple, c_format: str):
    """c * 2^-shift in c's dtype, refusing a shift that would round it (under/overflow) in ``c_format``."""
    if c is None or not shift:
        return c
    c = _accumulator_inputs(c, shape, c_format)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        scaled = times_power_of_two(
            c, -shift
        )  # c's kernel dtype; power-of-two scaling rounds only on under/overflow,
        back = times_power_of_two(
            scaled, shift
        )  # which scaling back reveals (NaN compared only when present)
        exact = np.array_equal(back, c) or np.array_equal(back, c, equal_nan=True)
        if (
            exact and scaled.dtype.itemsize * 8 != get_format(c_format).bits
        ):  # fp16/bf16 c held in float32: its range
            exact = np.array_equal(
                get_format(c_format).round(scaled, overflow="inf"), scaled, equal_nan=True
            )
        if not exact:
            raise ArgumentError(
                f"c: scaling by the operands' per-tensor 2^-{shift} is not exact in {c_format}"
            )
    return scaled


def matmul(
    hw,
    A,
    B,
    *,
    a_format=None,
    b_format=None,
    c=None,
    out_format=None,
    c_format=None,
    progress=None,
    tile_rows: int = 256,
    method: str = "auto",
    per_tensor_scale: bool = False,
) -> MatmulResult:
    """C + A @ B through the unit ``hw``, every output bit exact.

    ``A`` (M, K) and ``B`` (K, N) are MXTensors quantized along K (A on axis 1, B on axis 0)
    with the unit's block size, or float arrays, which are quantized here with the OCP
    profile into ``a_format``/``b_format`` (default: the config's first accepted format).
    ``c`` is an (M, N) accumulator input (None: +0) of ``c_format`` (None: the config's
    ``inputs.c_format``), given as :func:`dot` takes it.

    ``per_tensor_scale=True`` quantizes float operands with one power-of-two scale per tensor
    instead of block scales (``mxsim.quantize_mx(..., per_tensor_scale=True)``: the scaling FP8
    inference uses, which units without block scales — ``inputs.scales: none``, e.g. H100 or
    B200 FP8 tensor cores — need; operands of fp16, bf16, tf32, fp32 or fp64 are cast, scale
    1, as replay casts them: scaled up to their largest values, products would overflow the
    unit's sums). MXTensors may carry such a scale too. The unit multiplies
    the scaled elements (its block scales all 1); ``c`` enters scaled by 2^-(Ta+Tb) (an error
    if that is not exact in float32), and the result's :attr:`MatmulResult.values` are the
    unit's outputs times 2^(Ta+Tb), exactly. With ``progress``, the kernel runs on tiles of
    ``tile_rows`` rows of A, calling ``progress(rows_done, rows_total)`` after each; memory
    stays at the operands' codes plus the output bits (plus ``c`` if given).

    ``method``: ``"kernel"`` always runs the generic datapath kernel; ``"auto"`` (default)
    uses the float64-BLAS route of :mod:`mxsim.datapath.blas` where it is provably
    bit-identical (exact trees into an RNE fp32 accumulator, or a fixed-point grid's fp32
    accumulator in any mode, with formats whose tree sums fit float64), the vectorised route
    of :mod:`mxsim.datapath.window` for truncating-window units, or the group-sum route of
    :mod:`mxsim.datapath.groups` for ``scales: group_sum`` units; outputs a route leaves are
    computed by the generic kernel.

    Empty operands: M = 0 or N = 0 gives an empty (M, N) result; K = 0 gives ``c`` rounded
    to the output format (the empty sum is +0). The (M, N) output must fit the memory
    budget (docs/limits.md). Bad arguments raise :class:`~mxsim.errors.MxsimError`
    subclasses naming the argument.
    """
    _check_method(method, "matmul")
    tile_rows = check_int(tile_rows, "matmul: tile_rows", 1)
    if progress is not None and not callable(progress):
        raise ArgumentError(
            f"matmul: progress must be None or a callable (rows_done, rows_total), got {progress!r}"
        )
    config = _as_config(hw)
    if isinstance(A, NVFP4Tensor) or isinstance(B, NVFP4Tensor):
        return _matmul_float_scaled(
            config, A, B, c, out_format, c_format, progress, tile_rows, method
        )
    block_size = config.sections[("inputs", "block_size")]
    tensor_a = _operand(A, "A", a_format, config.a_formats, block_size, 1, per_tensor_scale)
    tensor_b = _operand(B, "B", b_format, config.b_formats, block_size, 0, per_tensor_scale)
    if tensor_a.axis != 1 or tensor_b.axis != 0:
        raise ArgumentError(
            "matmul: A must be quantized along axis 1 and B along axis 0 (the K axis)"
        )
    if tensor_a.shape[1] != tensor_b.shape[0]:
        raise ArgumentError(
            f"matmul: inner dimensions differ: A is {tensor_a.shape}, B is {tensor_b.shape}"
        )
    params = config.params(
        tensor_a.element_format.name, tensor_b.element_format.name, out_format, c_format
    )
    rows, columns = tensor_a.shape[0], tensor_b.shape[1]
    shift = tensor_a.tensor_scale_exponent + tensor_b.tensor_scale_exponent
    c = _scaled_accumulator_input(c, shift, (rows, columns), params.c_format)
    check_array_budget((rows, columns), 8, "matmul: the (M, N) output")
    bits_dtype = output_dtype(params.output_format)
    if rows * columns == 0:
        return MatmulResult(
            np.empty((rows, columns), dtype=bits_dtype), params.output_format, shift
        )
    c_values = _c_values(c, (rows, columns), params.c_format)
    codes_a, codes_b, kernel_args = _operands_and_arguments(
        params,
        _codes(
            tensor_a.codes.reshape(rows, tensor_a.codes.shape[-1]),
            "A",
            tensor_a.element_format,
            fields_given=True,
        ),
        _codes(
            tensor_b.codes.reshape(columns, tensor_b.codes.shape[-1]),
            "B",
            tensor_b.element_format,
            fields_given=True,
        ),
        narrow=True,
    )
    out = _gemm_groups(
        params,
        codes_a[None],
        codes_b[None],
        _scales_for_unit(tensor_a.scales, params)[None],
        _scales_for_unit(tensor_b.scales, params)[None],
        c_values,
        kernel_args,
        method,
        progress,
        tile_rows,
    )
    return MatmulResult(out[0].astype(bits_dtype, copy=False), params.output_format, shift)


@dataclass(frozen=True)
class BatchedMatmulResult:
    """Output bit patterns (G, M, N) of a batch of GEMMs and their exact values.

    ``scale_exponents`` (G,) holds each group's Ta + Tb (as :attr:`MatmulResult.scale_exponent`);
    :attr:`values` multiplies group g's outputs by 2^scale_exponents[g] exactly (float64).
    ``tensor_scales``: None, or (G,) float64, each group's ta * tb of NVFP4 operands (as
    :attr:`MatmulResult.tensor_scale`), by which :attr:`values` multiplies its outputs too.
    """

    bits: np.ndarray
    out_format: str
    scale_exponents: np.ndarray
    tensor_scales: np.ndarray | None = None

    @property
    def values(self) -> np.ndarray:
        values = as_float_times_power_of_two(
            self.bits, self.out_format, self.scale_exponents[:, None, None]
        )
        if self.tensor_scales is not None and (self.tensor_scales != 1.0).any():
            values = values * self.tensor_scales[:, None, None]
        return values


def _group_operands(
    x,
    name: str,
    fmt_name: str | None,
    default_formats,
    block_size: int,
    axis: int,
    per_tensor_scale: bool,
) -> MXGroups:
    """The operand as one :class:`~mxsim.quantize.MXGroups` of 2-D groups quantized along
    ``axis`` (their K axis): ``x`` a (G, rows, cols) float array, quantized along K group by
    group (one kernel call; each group a tensor of its own, as :func:`matmul` quantizes it),
    an MXGroups (checked once), or a sequence of 2-D MXTensors (checked as :func:`matmul`
    checks its operands, then stacked)."""
    if isinstance(x, np.ndarray):
        if x.ndim != 3:
            raise ArgumentError(
                f"{name}: expected a (G, rows, columns) float array, an MXGroups or a sequence "
                f"of MXTensors, got shape {x.shape}"
            )
        fmt = default_formats[0] if fmt_name is None else fmt_name
        along_k = x if axis == 1 else x.transpose(0, 2, 1)  # quantize_grouped blocks the last axis
        grouped = quantize_grouped(
            along_k,
            fmt,
            block_size,
            per_tensor_scale=per_tensor_scale,
            tensor_scale_exponent=per_tensor_exponent(fmt) if per_tensor_scale else None,
        )
        if axis == 1:
            return grouped
        return dataclasses.replace(grouped, shape=grouped.shape[::-1], axis=0)
    if isinstance(x, MXGroups):
        _check_groups(x, name, block_size, axis)
        return x
    if not isinstance(x, (list, tuple)) or not all(isinstance(t, MXTensor) for t in x):
        raise ArgumentError(
            f"{name}: expected a (G, rows, columns) float array, an MXGroups or a list of "
            f"MXTensors, got {type(x).__name__}"
        )
    if not x:
        raise ArgumentError(
            f"{name}: an empty list of MXTensors (give a (0, rows, columns) array for no groups)"
        )
    for g, t in enumerate(x):
        _check_tensor(t, f"{name}[{g}]", block_size)
    first = x[0]
    expected = (first.element_format.name, first.shape, first.axis, first.codes.shape)
    for g, t in enumerate(x):
        if t.axis != axis:
            raise ArgumentError(
                f"{name}[{g}]: expected an MXTensor quantized along axis {axis} (the K axis), got {t.axis}"
            )
        if (t.element_format.name, t.shape, t.axis, t.codes.shape) != expected:
            raise ArgumentError(
                f"{name}[{g}]: {t.element_format.name} {t.shape} along axis {t.axis} differs from "
                f"{name}[0]'s {first.element_format.name} {first.shape} along axis {first.axis}"
            )
    return MXGroups.of(list(x))


def _check_tensor(x: MXTensor, name: str, block_size: int) -> None:
    """Refuse an MXTensor whose parts do not describe a 2-D tensor in blocks of
    ``block_size`` with codes of its format."""
    if x.block_size != block_size:
        raise ArgumentError(
            f"{name}: block size {x.block_size} differs from the unit's {block_size}"
        )
    if len(x.shape) != 2 or x.axis not in (0, 1):
        raise ArgumentError(f"{name}: expected a 2-D MXTensor")
    length, other = x.shape[x.axis] + x.padding, x.shape[1 - x.axis]
    codes, scales = x.codes, x.scales
    if (
        not isinstance(codes, np.ndarray)
        or not isinstance(scales, np.ndarray)
        or scales.dtype.kind not in "iu"
        or x.padding < 0
        or length % block_size
        or codes.shape != (other, length)
        or scales.shape != (other, length // block_size)
    ):
        raise ArgumentError(
            f"{name}: an MXTensor of shape {x.shape} along axis {x.axis}, padded by "
            f"{x.padding}, needs codes ({other}, {length}) and integer scales "
            f"({other}, {length // block_size}) ({length} a multiple of {block_size})"
        )
    if scales.dtype != np.uint8 and scales.size and (scales.min() < 0 or scales.max() > 255):
        raise ArgumentError(f"{name}: scale codes must lie in [0, 255]")
    _check_field_codes(codes, x.element_format, name)


def _check_field_codes(codes, fmt, name: str) -> None:
    """Refuse element codes that the kernels would read outside their per-code tables: an
    MXTensor's codes are field codes (stored codes without their padding bits, as the
    quantizers write them: tf32's 19 bits, not its fp32 pattern), in [0, 2^(bits -
    padding_bits))."""
    if not isinstance(codes, np.ndarray) or codes.dtype.kind not in "iu":
        raise ArgumentError(f"{name}: codes must be an integer numpy array")
    top = 1 << (fmt.bits - fmt.padding_bits)
    if codes.dtype.kind == "u" and np.iinfo(codes.dtype).max < top:
        return  # (every code of the dtype is one: no pass over the codes)
    if codes.size and ((codes.dtype.kind == "i" and codes.min() < 0) or int(codes.max()) >= top):
        raise ArgumentError(
            f"{name}: {fmt.name} codes must lie in [0, {top}) (field codes, as quantize writes "
            f"them), got {int(codes.min())} to {int(codes.max())}"
        )


def _check_groups(x: MXGroups, name: str, block_size: int, axis: int) -> None:
    """Refuse an MXGroups whose parts do not describe G 2-D groups quantized along ``axis``
    in blocks of ``block_size`` (each array checked once for the whole batch)."""
    if x.block_size != block_size:
        raise ArgumentError(
            f"{name}: block size {x.block_size} differs from the unit's {block_size}"
        )
    if len(x.shape) != 2 or x.axis != axis:
        raise ArgumentError(
            f"{name}: expected an MXGroups of 2-D groups quantized along axis {axis} (the K "
            f"axis), got groups of shape {x.shape} along axis {x.axis}"
        )
    codes, scales, shifts = x.codes, x.scales, x.tensor_scale_exponents
    _check_field_codes(codes, x.element_format, name)
    if not isinstance(scales, np.ndarray) or scales.dtype != np.uint8:
        raise ArgumentError(f"{name}: scales must be a uint8 numpy array")
    if not isinstance(shifts, np.ndarray) or shifts.dtype.kind not in "iu":
        raise ArgumentError(f"{name}: tensor_scale_exponents must be an integer numpy array")
    groups, k = len(codes), x.shape[axis]
    length, other = k + x.padding, x.shape[1 - axis]
    if (
        codes.ndim != 3
        or x.padding < 0
        or length % block_size
        or codes.shape != (groups, other, length)
        or scales.shape != (groups, other, length // block_size)
        or shifts.shape != (groups,)
    ):
        raise ArgumentError(
            f"{name}: an MXGroups of {x.shape} groups padded by {x.padding} in blocks of "
            f"{block_size} needs codes (G, {other}, {length}) ({length} a multiple of "
            f"{block_size}), scales (G, {other}, {length // block_size}) and "
            f"tensor_scale_exponents (G,); got {codes.shape}, {scales.shape} and {shifts.shape}"
        )
    # (count_nonzero: numpy's cheapest test of a small array, which is most often all 0)
    if np.count_nonzero(shifts) and (
        shifts.min() < E8M0_MIN_EXPONENT or shifts.max() > E8M0_MAX_EXPONENT
    ):
        raise ArgumentError(
            f"{name}: tensor_scale_exponents must lie in [{E8M0_MIN_EXPONENT}, {E8M0_MAX_EXPONENT}]"
        )


def matmul_batched(
    hw,
    A,
    B,
    *,
    a_format=None,
    b_format=None,
    c=None,
    out_format=None,
    c_format=None,
    progress=None,
    tile_rows: int = 256,
    method: str = "auto",
    per_tensor_scale: bool = False,
    b_memo: dict | None = None,
) -> BatchedMatmulResult:
    """C[g] + A[g] @ B[g] for every group g of a batch through the unit ``hw``: every output
    bit that of :func:`matmul` on the group (``matmul(hw, A[g], B[g], c=c[g], ...)``), the
    batch computed by one kernel or BLAS pass (attention heads: no call per head).

    ``A``: a (G, M, K) float array, quantized along K group by group (each group a tensor of
    its own: with ``per_tensor_scale``, one exponent per group), an
    :class:`~mxsim.quantize.MXGroups` of G (M, K) groups quantized along axis 1
    (:func:`mxsim.quantize.quantize_grouped` makes one; checked once for the batch, the
    cheapest form for many small groups), or a list of G MXTensors (M, K) quantized along
    axis 1; ``B``: a (G, K, N) float array, an MXGroups of (K, N) groups quantized along axis
    0 (its codes (G, N, K'): the same layout as the (N, K) groups of B^T quantized along axis
    1, so ``dataclasses.replace(rows, shape=(K, N), axis=0)`` turns one into the other), or a
    list of G MXTensors (K, N) quantized along axis 0. Every group has the same shapes and
    element formats. ``c``:
    (G, M, N) values of ``c_format`` as :func:`matmul` takes them, or None (+0); each group's
    enters scaled by its 2^-(Ta+Tb), as in :func:`matmul`. ``a_format``, ``b_format``,
    ``out_format``, ``c_format``, ``method``, ``tile_rows``
    (rows of all groups per kernel call, with ``progress``) and ``progress(rows_done,
    rows_total)`` (rows of all groups) as in :func:`matmul`. NVFP4 operands: A an
    :class:`~mxsim.quantize.NVFP4Groups` of G (M, K) tensors and B one of G (N, K) tensors of
    B^T (:func:`mxsim.quantize.quantize_nvfp4_grouped`), on a unit with their scale format;
    their tensor scales are :attr:`BatchedMatmulResult.tensor_scales`.

    ``b_memo``: None, or a dict the caller keeps for one B (the same MXTensors, their codes
    and scales unchanged, from call to call: a model's weight): B's validated codes and the
    BLAS or window route's decoded B are kept there per unit and formats, and later calls
    skip that work (results the same bits). It holds up to 14 bytes per element of B; the
    caller drops it to free them.

    Returns a :class:`BatchedMatmulResult`. G = 0 (float arrays, MXGroups) gives an empty result. Bad
    arguments raise :class:`~mxsim.errors.MxsimError` subclasses naming the argument.
    """
    _check_method(method, "matmul_batched")
    tile_rows = check_int(tile_rows, "matmul_batched: tile_rows", 1)
    if b_memo is not None and not isinstance(b_memo, dict):
        raise ArgumentError(
            f"matmul_batched: b_memo must be None or a dict, got {type(b_memo).__name__}"
        )
    if progress is not None and not callable(progress):
        raise ArgumentError(
            f"matmul_batched: progress must be None or a callable (rows_done, rows_total), got {progress!r}"
        )
    config = _as_config(hw)
    if isinstance(A, NVFP4Groups) or isinstance(B, NVFP4Groups):
        if per_tensor_scale or a_format or b_format:
            raise ArgumentError(
                "matmul_batched: NVFP4 groups take no per_tensor_scale, a_format or b_format "
                "(their formats and scales are their own)"
            )
        return _batched_float_scaled(
            config,
            A,
            B,
            c,
            out_format,
            c_format,
            progress,
            tile_rows,
            method,
            b_memo,
        )
    block_size = config.sections[("inputs", "block_size")]
    if (
        isinstance(A, np.ndarray)
        and isinstance(B, np.ndarray)
        and A.ndim == B.ndim == 3
        and 0 in (A.shape[0], B.shape[0])
    ):
        if A.shape[0] != B.shape[0] or A.shape[2] != B.shape[1]:
            raise ArgumentError(
                f"matmul_batched: A {A.shape} and B {B.shape} are not (G, M, K) and (G, K, N)"
            )
        params = config.params(
            a_format or config.a_formats[0], b_format or config.b_formats[0], out_format, c_format
        )
        return BatchedMatmulResult(
            np.empty((0, A.shape[1], B.shape[2]), output_dtype(params.output_format)),
            params.output_format,
            np.zeros(0, dtype=np.int64),
        )
    group_a = _group_operands(A, "A", a_format, config.a_formats, block_size, 1, per_tensor_scale)
    group_b = _group_operands(B, "B", b_format, config.b_formats, block_size, 0, per_tensor_scale)
    groups = len(group_a)
    if len(group_b) != groups:
        raise ArgumentError(f"matmul_batched: A has {groups} groups, B has {len(group_b)}")
    if group_a.shape[1] != group_b.shape[0]:
        raise ArgumentError(
            f"matmul_batched: inner dimensions differ: A is {group_a.shape}, B is {group_b.shape}"
        )
    if group_a.codes.shape[-1] != group_b.codes.shape[-1]:
        raise ArgumentError(
            f"matmul_batched: A and B are padded along K to {group_a.codes.shape[-1]} and "
            f"{group_b.codes.shape[-1]} elements; quantize them alike"
        )
    params = config.params(
        group_a.element_format.name, group_b.element_format.name, out_format, c_format
    )
    rows, columns = group_a.shape[0], group_b.shape[1]
    shifts = group_a.tensor_scale_exponents + group_b.tensor_scale_exponents
    check_array_budget((groups, rows, columns), 8, "matmul_batched: the (G, M, N) output")
    if c is not None:
        # Checked and scaled on its distinct values (a bias row broadcast over the rows: once,
        # not per row), then written out whole for the kernels.
        c = _accumulator_inputs(c, (groups, rows, columns), params.c_format, repeats_from=1)
        if shifts.any():  # (unshifted, each group's c is unchanged)
            c = np.stack(
                [
                    _scaled_accumulator_input(c[g], int(shifts[g]), c.shape[1:], params.c_format)
                    for g in range(groups)
                ]
            )
        if c.shape != (groups, rows, columns):
            whole = np.empty((groups, rows, columns), dtype=c.dtype)
            whole[...] = c
            c = whole
    bits_dtype = _output_dtype_of(params.output_format)
    if groups * rows * columns == 0:
        return BatchedMatmulResult(
            np.empty((groups, rows, columns), dtype=bits_dtype), params.output_format, shifts
        )
    c_values = np.zeros((1, 1, 1), dtype=kernel_c_dtype(params.c_format)) if c is None else c
    length = group_a.codes.shape[-1]
    fields_a = _codes(
        group_a.codes.reshape(groups * rows, length), "A", group_a.element_format, fields_given=True
    )
    fields_b, scales_b, memo = _kept_b(
        b_memo,
        params,
        lambda: (
            _codes(
                group_b.codes.reshape(groups * columns, length),
                "B",
                group_b.element_format,
                fields_given=True,
            ),
            _scales_for_unit(group_b.scales, params),
        ),
    )
    codes_a, codes_b, kernel_args = _operands_and_arguments(params, fields_a, fields_b, narrow=True)
    scales_a = _scales_for_unit(group_a.scales, params)
    out = _gemm_groups(
        params,
        codes_a.reshape(groups, rows, length),
        codes_b.reshape(groups, columns, length),
        scales_a,
        scales_b,
        c_values,
        kernel_args,
        method,
        progress,
        tile_rows,
        memo,
        terms=group_a.shape[1],
    )
    return BatchedMatmulResult(out.astype(bits_dtype, copy=False), params.output_format, shifts)


def _kept_b(b_memo: dict | None, params: DatapathParams, make) -> tuple:
    """(B's validated codes, its kernel scales, the routes' memo of it): from ``b_memo``'s
    entry for ``params`` where kept, else ``make()``'s pair, kept there (with an empty routes'
    memo) when ``b_memo`` is a dict; without one the routes' memo is None."""
    memo = None if b_memo is None else b_memo.setdefault(params, {})
    if memo is None:
        return (*make(), None)
    if "codes" not in memo:
        # The kept B (here and in the routes' memos) stays writable, unlike the kept tables:
        # the kernels take it beside a B that is not kept, and a read-only array is a type of
        # its own to Numba (a second compile of each kernel). No code writes into it (tests
        # compare it byte for byte across calls).
        codes, scales = make()
        memo.update(codes=codes, scales=scales, route={})
    return memo["codes"], memo["scales"], memo["route"]


def _gemm_groups(params: DatapathParams, *arguments, terms: int | None = None) -> np.ndarray:
    """:func:`_small_groups_routes` or :func:`_gemm_routes` (``arguments`` as it takes them),
    on one thread when the GEMMs hold few products (below ``SERIAL_GEMM_BELOW``); ``terms``:
    K where the codes are K padded to whole scale blocks, or None."""
    codes_a, codes_b, *_, method, progress = arguments[:8]
    products = codes_a.size * codes_b.shape[1]
    if method == "auto" and progress is None and codes_a.shape[0] > 1:
        out = _small_groups_routes(params, arguments[:5], arguments[5], products, terms)
        if out is not None:
            return out
    with threads_for(products, SERIAL_GEMM_BELOW):
        return _gemm_routes(params, *arguments)


def _small_groups_routes(
    params: DatapathParams, tile: tuple, kernel_args, products: int, terms: int | None = None
) -> np.ndarray | None:
    """The output bits (as :func:`_gemm_routes`) of a batch of several GEMMs by a small-groups
    route (``datapath.batch``: attention heads, the whole batch in a few calls), or None
    where none applies; ``tile``: codes A, codes B, their scale exponents and c, as
    :func:`_gemm_routes` takes them; ``terms``: K before the codes' padding, or None. Below
    ``SERIAL_GEMM_BELOW`` ``products`` the kernel runs on the calling thread alone, as do the
    generic kernel's outputs (``threads_for``)."""
    codes_a, codes_b, exponents_a, exponents_b, c_values = tile
    groups, rows, length = codes_a.shape
    columns = codes_b.shape[1]
    exact = small_groups_apply(params, rows, columns, length)
    if not (exact or window_groups_apply(params, rows, columns, length)):
        return None
    out = np.empty((groups, rows, columns), dtype=kernel_output_dtype(params.output_format))
    serial = products < SERIAL_GEMM_BELOW
    operands = (codes_a, codes_b, exponents_a, exponents_b, c_values)
    if exact:
        g, m, n = small_groups_matmul(params, kernel_args, *operands, out, serial)
    else:
        g, m, n = window_groups_matmul(params, *operands, out, serial, terms)
    if m.size:  # specials, NaN scales, wide exact sums, out-of-range values: the generic kernel
        with threads_for(products, SERIAL_GEMM_BELOW):
            _recompute(g, m, n, *operands, kernel_args, out)
    return out


def _gemm_routes(
    params: DatapathParams,
    codes_a,
    codes_b,
    exponents_a,
    exponents_b,
    c_values,
    kernel_args,
    method: str,
    progress,
    tile_rows: int,
    memo: dict | None = None,
) -> np.ndarray:
    """The output bits (uint32, (G, M, N)) of the GEMMs of codes A[g] (M, K) times B[g] given
    as (N, K), scale exponents (G, rows, blocks), c (G, M, N) or (1, 1, 1): by the BLAS or the
    window route where ``method`` and the unit allow, the generic kernel elsewhere. With a
    ``progress`` callable the kernels run on ``tile_rows`` rows at a time (whole groups
    together when a group has fewer), reporting after each; without, in one call. ``memo``:
    the BLAS route's kept work on this B (:func:`~mxsim.datapath.blas.blas_matmul`), or the
    window route's (:func:`~mxsim.datapath.window.window_matmul`) and B's codes in the
    kernels' code type (``_kernel_codes``; 4 bytes per element where they widen)."""
    groups, rows = codes_a.shape[:2]
    out = np.empty(
        (groups, rows, codes_b.shape[1]), dtype=kernel_output_dtype(params.output_format)
    )
    operands = (codes_a, codes_b, exponents_a, exponents_b, c_values)
    if (
        method == "auto"
        and exact_tiles_apply(params, rows, codes_b.shape[1], codes_a.shape[2])
        and exact_tiles_outrun_blas(params, kernel_args)
    ):
        g, m, n = exact_tiles_matmul(params, kernel_args, *operands, out, progress)
        if m.size:  # specials, NaN scales, bad c: the generic kernel
            _recompute(g, m, n, *operands, kernel_args, out)
        return out
    route = (
        blas_route(params, kernel_args, *operands, memo, defer_fold=True)
        if method == "auto"
        else None
    )
    leftovers = None  # None: the route is refused (by blas_matmul too: folded sums too wide)
    if route is not None:
        leftovers = blas_matmul(params, kernel_args, *operands, out, progress, route[0], memo)
    if leftovers is not None:
        if leftovers:  # exact sums wider than two float64s: the kernel computes those outputs
            g, m, n = (np.array(index) for index in zip(*leftovers))
            _recompute(
                g, m, n, codes_a, codes_b, exponents_a, exponents_b, c_values, kernel_args, out
            )
        return out
    # The other routes' kernels take the kernels' code type: B whole (kept in the memo, as
    # B's codes do not change from call to call), A a pass at a time.
    if memo is None:
        codes_b = _kernel_codes(codes_b)
    else:
        if "kernel codes" not in memo:
            memo["kernel codes"] = _kernel_codes(codes_b)
        codes_b = memo["kernel codes"]
    if method == "auto" and groups_apply(params):  # the whole batch in one call
        g, m, n = groups_matmul(
            params,
            _kernel_codes(codes_a),
            codes_b,
            exponents_a,
            exponents_b,
            c_values,
            out,
            progress,
            memo,
        )
        if m.size:  # specials and out-of-range values: the generic kernel
            _recompute(
                g, m, n, codes_a, codes_b, exponents_a, exponents_b, c_values, kernel_args, out
            )
        return out
    route_matmul = None
    if method == "auto" and fma_applies(params):
        route_matmul = fma_matmul
    elif method == "auto" and fp32_steps_apply(params):
        route_matmul = fp32_steps_matmul
    elif method == "auto" and window_applies(params):
        route_matmul = window_matmul
    for g0, g1, r0, r1 in batch_passes(
        groups, rows, tile_rows if progress is not None else max(groups * rows, 1)
    ):
        c_tile = c_values if c_values.shape == (1, 1, 1) else c_values[g0:g1, r0:r1]
        tile = (
            _kernel_codes(codes_a[g0:g1, r0:r1]),
            codes_b[g0:g1],
            exponents_a[g0:g1, r0:r1],
            exponents_b[g0:g1],
            c_tile,
        )
        if route_matmul is not None:
            whole_b = g0 == 0 and g1 == groups  # the memo holds B's tiles of every group
            g, m, n = route_matmul(params, *tile, out[g0:g1, r0:r1], memo if whole_b else None)
            if m.size:  # specials, out-of-range values, NaN results: the generic kernel
                _recompute(g, m, n, *tile, kernel_args, out[g0:g1, r0:r1])
        else:
            matmul_groups(*tile, *kernel_args, out[g0:g1, r0:r1])
        if progress is not None:
            progress((g1 - 1) * rows + r1, groups * rows)
    return out


def _matmul_float_scaled(
    config: HardwareConfig, A, B, c, out_format, c_format, progress, tile_rows: int, method: str
) -> MatmulResult:
    """:func:`matmul` of NVFP4 operands: A an (M, K) NVFP4Tensor and B given as the (N, K)
    NVFP4Tensor of B^T (both blocked along K, as NVFP4 weights are stored): a batch of one
    (:func:`_batched_float_scaled`)."""
    for name, tensor in (("A", A), ("B", B)):
        if not isinstance(tensor, NVFP4Tensor) or tensor.codes.ndim != 2:
            raise ArgumentError(
                f"matmul: {name}: with NVFP4 operands both must be 2-D NVFP4Tensors (B as B^T, (N, K))"
            )
    one_a, one_b = (
        NVFP4Groups(t.codes[None], t.scales[None], (t.tensor_scale,), t.options) for t in (A, B)
    )
    batch = _batched_float_scaled(
        config, one_a, one_b, c, out_format, c_format, progress, tile_rows, method, single=True
    )
    tensor_scale = (A.tensor_scale or 1.0) * (B.tensor_scale or 1.0)  # exact: 24 + 24 bits
    return MatmulResult(batch.bits[0], batch.out_format, tensor_scale=tensor_scale)


def _batched_float_scaled(
    config: HardwareConfig,
    A,
    B,
    c,
    out_format,
    c_format,
    progress,
    tile_rows: int,
    method: str,
    b_memo: dict | None = None,
    single: bool = False,
) -> BatchedMatmulResult:
    """A batch of GEMMs of NVFP4 operands: A an NVFP4Groups of G (M, K) tensors and B one of G
    (N, K) tensors of B^T (both blocked along K), through a unit whose ``inputs.scale_format``
    is theirs, by the group-sum route where it applies (:mod:`mxsim.datapath.groups`), else
    the generic kernel; c: None, or (G, M, N) values ((M, N) with ``single``), only where no
    group has tensor scales; ``b_memo`` as :func:`matmul_batched` takes it; ``single``: the
    batch is :func:`matmul`'s one GEMM (errors name matmul). Each group's tensor scales
    multiply its :attr:`BatchedMatmulResult.values`, as the GEMM epilogue's alpha does."""
    who = "matmul" if single else "matmul_batched"
    for name, groups in (("A", A), ("B", B)):
        if not isinstance(groups, NVFP4Groups) or groups.codes.ndim != 3:
            raise ArgumentError(
                f"{who}: {name}: with NVFP4 operands both must be NVFP4 groups of 2-D tensors "
                "(B as B^T, (N, K))"
            )
    if len(A) != len(B):
        raise ArgumentError(f"{who}: A has {len(A)} groups, B has {len(B)}")
    if A.codes.shape[2] != B.codes.shape[2]:
        raise ArgumentError(
            f"{who}: inner dimensions differ: A is {A.codes.shape[1:]}, B^T is {B.codes.shape[1:]}"
        )
    params = config.params(A.options.element_format, B.options.element_format, out_format, c_format)
    for name, groups in (("A", A), ("B", B)):
        if (groups.options.scale_format, groups.options.block_size) != (
            params.scale_format,
            params.block_size,
        ):
            raise ArgumentError(
                f"{who}: {name}: {groups.options.scale_format} scales per {groups.options.block_size} "
                f"differ from the unit's {params.scale_format} per {params.block_size}"
            )
    tensor_scales = A.tensor_scale_array() * B.tensor_scale_array()
    if c is not None and any(t is not None for t in A.tensor_scales + B.tensor_scales):
        raise ArgumentError(
            f"{who}: c with NVFP4 tensor scales is not modelled (the epilogue scales A @ B, not c)"
        )
    count, rows, length = A.codes.shape
    columns = B.codes.shape[1]
    check_array_budget((count, rows, columns), 8, f"{who}: the output")
    blocks = A.scales.shape[2]
    scales_a = _scale_exponents(
        A.scales.reshape(count * rows, blocks), "A scales", count * rows, blocks, params
    )
    fields_b, scales_b, memo = _kept_b(
        b_memo,
        params,
        lambda: (
            _codes(
                B.codes.reshape(count * columns, length),
                "B",
                get_format(params.b_format),
                fields_given=True,
            ),
            _scale_exponents(
                B.scales.reshape(count * columns, blocks),
                "B scales",
                count * columns,
                blocks,
                params,
            ),
        ),
    )
    codes_a, codes_b, kernel_args = _operands_and_arguments(
        params,
        _codes(
            A.codes.reshape(count * rows, length),
            "A",
            get_format(params.a_format),
            fields_given=True,
        ),
        fields_b,
    )
    if single or c is None:
        c_values = _c_values(c, (rows, columns), params.c_format)
    else:
        c_values = _accumulator_inputs(c, (count, rows, columns), params.c_format)
    out = _gemm_groups(
        params,
        codes_a.reshape(count, rows, length),
        codes_b.reshape(count, columns, length),
        scales_a.reshape(count, rows, blocks),
        scales_b.reshape(count, columns, blocks),
        c_values,
        kernel_args,
        method,
        progress,
        tile_rows,
        memo,
    )
    return BatchedMatmulResult(
        out.astype(output_dtype(params.output_format), copy=False),
        params.output_format,
        np.zeros(count, dtype=np.int64),
        tensor_scales,
    )


def _c_values(c, shape: tuple, c_format: str) -> np.ndarray:
    """The kernels' (1, M, N) c of one GEMM, or (1, 1, 1) +0 for None."""
    if c is None:
        return np.zeros((1, 1, 1), dtype=kernel_c_dtype(c_format))
    return _accumulator_inputs(c, shape, c_format)[None]


def matmul_groups(*arguments) -> None:
    """out[g, m, n] = the generic kernel's output code of row m of A[g] (M, K) dotted with row
    n of B[g] given as (N, K), for every group g of a (G, M, K) x (G, N, K) batch: G
    independent GEMMs, one call; arguments as the kernels ``_kernels.matmul_rows`` returns
    take them, less ``start`` and ``stop``. Row-wise dot products are the batch of n GEMMs
    of one row each: one kernel to compile per signature.

    The (group, row) pairs are shared out among Numba's thread count of Python threads, each
    running the GIL-free ``matmul_rows`` on its own rows: a ``prange`` loop would compile
    the kernel a second time, as Numba's parallel gufunc, which tripled its compile time."""
    a_codes = arguments[0]
    kernel = K.matmul_rows(K.kernel_features(arguments[9], arguments[17], arguments[18]))
    run_in_threads(
        lambda start, stop: kernel(*arguments, start, stop),
        a_codes.shape[0] * a_codes.shape[1],
    )


def _dot_rows(a, b, exponents_a, exponents_b, c_values, *kernel_args_and_out) -> None:
    """out[i] = the generic kernel's output code of row i of ``a`` dotted with row i of ``b``
    (``kernel_args_and_out``: the kernel arguments, then out), run as n GEMMs of one row each:
    the kernel compiled for matmul serves dot too."""
    *kernel_args, out = kernel_args_and_out
    matmul_groups(
        a[:, None],
        b[:, None],
        exponents_a[:, None],
        exponents_b[:, None],
        c_values[:, None, None],
        *kernel_args,
        out[:, None, None],
    )


def _recompute(
    g, m, n, codes_a, codes_b, exponents_a, exponents_b, c_values, kernel_args, out
) -> None:
    """out[g, m, n] = the generic kernel's outputs for the listed (group, row, column) triples."""
    c_triples = (
        np.full(m.size, c_values.flat[0]) if c_values.shape == (1, 1, 1) else c_values[g, m, n]
    )
    triples = np.empty(m.size, dtype=out.dtype)
    _dot_rows(
        _kernel_codes(codes_a[g, m]),
        _kernel_codes(codes_b[g, n]),
        exponents_a[g, m],
        exponents_b[g, n],
        c_triples.astype(c_values.dtype),
        *kernel_args,
        triples,
    )
    out[g, m, n] = triples


def _scales_for_unit(scales: np.ndarray, params: DatapathParams) -> np.ndarray:
    """The kernels' scale array of an operand's E8M0 block-scale codes (any shape)."""
    if params.scales == "group_sum":  # the kernel reads E8M0 codes themselves there
        if params.scale_format != "e8m0":
            raise ArgumentError(
                f"this unit takes {params.scale_format} scales: give NVFP4Tensor operands"
            )
        return np.ascontiguousarray(scales, dtype=np.int32)
    if params.scales == "none":
        if np.count_nonzero(scales != 127):
            raise ArgumentError(
                "this unit takes no scales (inputs.scales: none) but the operand's block scales are not "
                "all 1: quantize it with one scale per tensor (quantize(..., per_tensor_scale=True)), "
                "or give matmul float operands and per_tensor_scale=True"
            )
        return np.zeros(scales.shape, dtype=np.int32)
    return scale_exponents_of_codes(scales)


def explain(
    hw,
    a,
    b,
    *,
    a_format,
    b_format,
    scale_a=None,
    scale_b=None,
    c=0.0,
    out_format=None,
    c_format=None,
) -> dict:
    """Every stage of one dot product (1-D codes ``a``, ``b``), from the reference twin.

    ``a``, ``b``: integer codes (lists or 1-D arrays) of equal length K, at most
    EXPLAIN_MAX_LENGTH (the reference twin is pure Python); ``scale_a``, ``scale_b``:
    ceil(K / block_size) E8M0 codes or None; ``c``: a real number, rounded (to nearest even,
    ±Inf beyond the range) into ``c_format`` (None: the config's ``inputs.c_format``).
    K = 0 explains the empty sum (the result is c rounded to the output format).
    Returns {"params": ..., "stages": [...], "value": float, "bits": int}; the bits equal
    :func:`dot`'s for the same inputs.
    """
    config = _as_config(hw)
    params = config.params(a_format, b_format, out_format, c_format)
    a_fmt, b_fmt = get_format(params.a_format), get_format(params.b_format)
    a, b = _one_row(a, "a"), _one_row(b, "b")
    _codes(a, "a", a_fmt)  # validated; the twin takes the stored codes (tf32: padding included)
    _codes(b, "b", b_fmt)
    if a.shape != b.shape:
        raise ArgumentError(f"a and b must have the same length, got {a.shape[1]} and {b.shape[1]}")
    check_int(a.shape[1], "explain: the length of a and b", 0, EXPLAIN_MAX_LENGTH)
    blocks = -(-a.shape[1] // params.block_size)
    scales = []
    for name, scale in (("scale_a", scale_a), ("scale_b", scale_b)):
        scale = None if scale is None else _one_row(scale, name)
        _scale_exponents(scale, name, 1, blocks, params)
        scales.append(None if scale is None else scale.reshape(-1).tolist())
    if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, float, np.integer, np.floating)):
        raise ArgumentError(f"c: expected a real number, got {type(c).__name__}")
    stages: list[dict] = []
    try:
        c_value = float(c)
    except OverflowError:  # an integer beyond float64
        c_value = math.inf if c > 0 else -math.inf
    c_value = float(get_format(params.c_format).round(np.array([c_value]), overflow="inf")[0])
    value = dot_reference(
        params, a[0].tolist(), b[0].tolist(), scales[0], scales[1], c_value, stages
    )
    # The value is exact in the output format; IEEE overflow keeps ±Inf as ±Inf.
    bits = int(get_format(params.output_format).encode(np.array([value]), overflow="inf_nan")[0])
    return {
        "config": config.name,
        "params": params.__dict__,
        "stages": stages,
        "value": value,
        "bits": bits,
    }
