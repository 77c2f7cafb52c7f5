"""NVFP4 quantization: FP4 (E2M1) elements, a UE4M3 scale per block of 16, an fp32 tensor scale.

Unlike OCP MX, the block scale is a floating-point number (UE4M3: E4M3 without its sign
bit), not a power of two, so the elements are scaled by a float32 reciprocal and rounded.
The two-level recipe adds one float32 scale ``t`` per tensor: the block scales are stored
relative to it.

Per block of 16 (all arithmetic in float32, each step rounded to nearest even, as torchao's
``nvfp4_quantize`` computes it on CPU), with E the element format (max 6) and S the scale
format (max 448, smallest normal 2^-6):

1. ``amax`` = max |x| over the block; ``d = fl(amax / max_E)``;
2. without ``t``: ``s = S(clamp(d, min_normal_S, max_S))``; with ``t``:
   ``s = S(clamp(fl(d / t), min_normal_S, max_S))``, S(.) rounding with ``scale_rounding``;
3. the reciprocal ``r = fl(1 / s)`` (without ``t``) or ``fl(fl(1 / t) / s)``;
4. each element ``E(clamp(fl(x * r), -max_E, max_E))``, E(.) rounding with ``element_rounding``.

An all-zero block gets the scale 2^-6 (the clamp) and zero elements of x's sign. ±Inf in a
block makes amax Inf, so its scale is 448 and the Inf element saturates to ±6. NaN inputs are
refused: neither E2M1 nor a finite recipe has a place for them; so is a tensor scale so
small that a block's float32 reciprocal overflows (torchao would make NaN and Inf there). Dequantization follows
torchao's ``NVFP4Tensor.dequantize``: ``fl(e * fl(t * s))`` (``fl(e * s)`` without ``t``),
float32; :meth:`NVFP4Tensor.exact_values` gives e * s * t exactly instead.

:func:`quantize_nvfp4_grouped` quantizes a batch of tensors in one pass, each with its own
tensor scale. Where both roundings are to nearest even (the profile's), a Numba kernel
(:mod:`mxsim.quantize._nvfp4_kernels`) computes the steps; other roundings take the format
table's encoder. The twin of this module is
:func:`mxsim.quantize.reference.quantize_nvfp4_reference`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError, MxsimError, UnknownNameError
from ..formats import get_format
from ..formats.rounding import ROUNDING_MODES
from .._threads import SERIAL_QUANTIZE_BELOW, run_in_threads, threads_for
from ..limits import check_array_budget, shown
from . import _nvfp4_kernels as K

NVFP4_BLOCK_SIZE = 16
#: The recipe's amax of a tensor per unit of its tensor scale: UE4M3's largest value times
#: E2M1's (448 x 6), so that the largest block's scale can reach 448.
AMAX_PER_TENSOR_SCALE = np.float32(448.0 * 6.0)
#: Roundings an NVFP4 scale or element may take (stochastic needs a seed plan of its own).
NVFP4_ROUNDINGS = tuple(mode for mode in ROUNDING_MODES if mode != "stochastic")


@dataclass(frozen=True)
class NVFP4Options:
    """The named choices of NVFP4 quantization (see the module docstring for the steps).

    Attributes:
        element_format: the element format (a table name; NVFP4: ``fp4_e2m1``).
        scale_format: the block scale format (a table name of role ``scale`` with a
            significand; NVFP4: ``ue4m3``).
        block_size: elements per block (NVFP4: 16).
        scale_rounding: rounding of the clamped float32 block scale into ``scale_format``.
        element_rounding: rounding of each scaled, clamped element into ``element_format``.
    """

    element_format: str = "fp4_e2m1"
    scale_format: str = "ue4m3"
    block_size: int = NVFP4_BLOCK_SIZE
    scale_rounding: str = "nearest_even"
    element_rounding: str = "nearest_even"

    def __post_init__(self):
        for name in ("scale_rounding", "element_rounding"):
            if getattr(self, name) not in NVFP4_ROUNDINGS:
                raise UnknownNameError(
                    f"value for option {name}", getattr(self, name), NVFP4_ROUNDINGS
                )
        element, scale = get_format(self.element_format), get_format(self.scale_format)
        if element.role != "element" or not element.signed:
            raise MxsimError(
                f"NVFP4 options: element_format must be a signed element format, got {self.element_format!r}"
            )
        if scale.role != "scale" or scale.mantissa_bits == 0 or not scale.has_zero:
            raise MxsimError(
                f"NVFP4 options: scale_format must be a scale format with a significand (ue4m3), "
                f"got {self.scale_format!r}"
            )
        if (
            isinstance(self.block_size, bool)
            or not isinstance(self.block_size, int)
            or not 1 <= self.block_size <= 4096
        ):
            raise MxsimError(
                f"NVFP4 options: block_size must be an integer 1..4096, got {self.block_size!r}"
            )


#: Named bundles of options; each value's source is in docs/profiles.md.
NVFP4_PROFILES: dict[str, NVFP4Options] = {
    # torchao 0.18 prototype mx_formats nvfp4_tensor.nvfp4_quantize (eager, CPU).
    "torchao": NVFP4Options(),
}


@dataclass(frozen=True, eq=False)
class NVFP4Tensor:
    """An NVFP4-quantized tensor, blocked along its last axis.

    Attributes:
        codes: element codes (uint8, one per element), the input's shape.
        scales: block scale codes of ``options.scale_format`` (uint8), shape
            ``(*x.shape[:-1], x.shape[-1] // block_size)``.
        tensor_scale: the float32 tensor scale ``t``, or None (single-level scaling).
        options: the :class:`NVFP4Options` used.
    """

    codes: np.ndarray
    scales: np.ndarray
    tensor_scale: float | None
    options: NVFP4Options

    def _parts(self):
        element = get_format(self.options.element_format)
        scale = get_format(self.options.scale_format)
        blocked = element.decode(self.codes).reshape(*self.scales.shape, self.options.block_size)
        return blocked, scale.decode(self.scales)[..., None]

    def dequantize(self) -> np.ndarray:
        """float32 values as torchao computes them: ``fl(e * fl(t * s))`` (``e * s`` exact
        without ``t``); a NaN scale code gives NaN."""
        elements, scales = self._parts()
        scales = scales.astype(np.float32)
        if self.tensor_scale is not None:
            scales = np.float32(self.tensor_scale) * scales
        return (elements.astype(np.float32) * scales).reshape(self.codes.shape)

    def exact_values(self) -> np.ndarray:
        """e * s * t exactly, as float64 (2 + 4 + 24 significant bits fit)."""
        elements, scales = self._parts()
        values = elements * scales * (1.0 if self.tensor_scale is None else self.tensor_scale)
        return values.reshape(self.codes.shape)


def _float32_input(x, name: str) -> np.ndarray:
    """``x`` as float32, after the budget check (the copy is 4 bytes an element; the steps
    after it take about 8)."""
    if type(x) is not np.ndarray or x.dtype not in (
        np.float16,
        np.float32,
    ):  # subclasses: a masked array's mask would be dropped
        raise ArgumentError(
            f"{name}: expected a float32 (or float16) numpy array (not a subclass such as a masked "
            f"array), got {type(x).__name__}"
        )
    if x.ndim < 1:
        raise ArgumentError(f"{name}: expected at least one dimension")
    check_array_budget(x.shape, 8, name)
    return x.astype(np.float32)  # float16 widens exactly


def _positive_float32(value, name: str) -> np.float32:
    """``value`` (a real Python or numpy number, not a bool, string or array) as a positive
    finite float32; else ArgumentError naming ``name``."""
    real = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )
    try:
        number = float(value) if real else None
    except OverflowError:  # an int beyond any float
        number = math.inf
    with np.errstate(over="ignore"):
        converted = np.float32(number) if number is not None else None
    if converted is None or not np.isfinite(converted) or converted <= 0:
        raise ArgumentError(
            f"{name}: expected a positive finite float32 number, got {shown(value)}"
        )
    return converted


def tensor_scale_from_amax(amax) -> float:
    """The NVFP4 recipe's tensor scale from a tensor's amax: ``fl(amax / (448 * 6))`` in
    float32 (torchao ``per_tensor_amax_to_scale``), so the largest block's scale can reach
    UE4M3's largest value. ``amax`` is rounded to float32 first; an amax whose scale
    underflows float32 to 0 (below about 3.8e-42) is refused, since no tensor scale 0 exists."""
    value = _positive_float32(amax, "tensor_scale_from_amax: amax")
    scale = value / AMAX_PER_TENSOR_SCALE
    if scale == 0:
        raise ArgumentError(
            f"tensor_scale_from_amax: amax {shown(amax)} is so small that amax / 2688 underflows "
            "float32 to 0; such a tensor needs no tensor scale (pass None)"
        )
    return float(scale)


def quantize_nvfp4(x, tensor_scale=None, profile: str = "torchao", **options) -> NVFP4Tensor:
    """Quantize ``x`` (float32 or float16, last axis a multiple of the block size) to NVFP4.

    ``tensor_scale``: None (single-level scaling) or a positive finite float32 ``t`` (a Python
    or numpy real number holding a float32 value exactly; the two-level recipe; see
    :func:`tensor_scale_from_amax`). ``x``: a plain ndarray (a masked array is refused, its
    mask has no place in NVFP4); an empty ``x`` (a 0-length axis) gives empty codes and
    scales. The memory budget is checked before ``x`` is copied. ``profile``: a name of
    :data:`NVFP4_PROFILES`; ``options`` override its fields. Exact steps: module docstring.
    """
    opts = _options(profile, options, "quantize_nvfp4")
    t = _tensor_scale(tensor_scale, "quantize_nvfp4: tensor_scale")
    values = _float32_input(x, "quantize_nvfp4: x")
    codes, scale_codes = _recipe(
        values, np.float32(1.0) if t is None else t, opts, "quantize_nvfp4"
    )
    return NVFP4Tensor(codes, scale_codes, None if t is None else float(t), opts)


def _recipe(values: np.ndarray, t, opts: NVFP4Options, who: str) -> tuple:
    """(element codes, scale codes) of float32 ``values`` by the module docstring's steps,
    ``t`` a float32, or one per group (the first axis) shaped to broadcast against the block
    scales. A tensor scale of 1 computes what single-level scaling does: d / 1 and
    (1 / 1) / s are d and 1 / s exactly."""
    block = opts.block_size
    if values.shape[-1] % block:
        raise ArgumentError(
            f"{who}: the last axis ({values.shape[-1]}) must be a multiple of {block}"
        )
    if np.isnan(values).any():
        raise ArgumentError(f"{who}: x has NaN, which NVFP4 cannot hold")
    by_kernel = _kernel_recipe(values, t, opts, who)
    if by_kernel is not None:
        return by_kernel
    element, scale = get_format(opts.element_format), get_format(opts.scale_format)
    blocks = values.reshape(
        *values.shape[:-1], values.shape[-1] // block, block
    )  # an empty x: empty blocks
    e_max = np.float32(element.max_finite)
    with np.errstate(over="ignore", invalid="ignore"):  # Inf inputs saturate (documented)
        descale = np.abs(blocks).max(axis=-1, initial=np.float32(0)) / e_max / t
        clamped = np.clip(descale, np.float32(scale.min_normal), np.float32(scale.max_finite))
        scale_codes = scale.encode(clamped, opts.scale_rounding).astype(np.uint8)
    return _encode_at_scales(blocks, scale_codes, t, opts, who, values.shape), scale_codes


@dataclass(frozen=True, eq=False)
class NVFP4Groups:
    """A batch of G NVFP4 tensors of one shape and options, each blocked along its last axis
    and with its own tensor scale (attention heads, conv groups: each a tensor of its own),
    held as stacked arrays: :func:`quantize_nvfp4_grouped` makes one.

    Attributes:
        codes: element codes (uint8), (G, ..., K).
        scales: block scale codes (uint8), (G, ..., K // block_size).
        tensor_scales: G entries, each a float32 tensor scale or None (single-level).
        options: the :class:`NVFP4Options` used.
    """

    codes: np.ndarray
    scales: np.ndarray
    tensor_scales: tuple
    options: NVFP4Options

    def __len__(self) -> int:
        return self.codes.shape[0]

    def group(self, g: int) -> NVFP4Tensor:
        """Group ``g`` as an NVFP4Tensor (its arrays are views of this one's)."""
        return NVFP4Tensor(self.codes[g], self.scales[g], self.tensor_scales[g], self.options)

    def tensors(self) -> list[NVFP4Tensor]:
        """Every group as an NVFP4Tensor, in order."""
        return [self.group(g) for g in range(len(self))]

    def tensor_scale_array(self) -> np.ndarray:
        """(G,) float64: each group's tensor scale, 1.0 where it has none."""
        return np.array([1.0 if t is None else t for t in self.tensor_scales], dtype=np.float64)

    def exact_values(self, with_tensor_scales: bool = True) -> np.ndarray:
        """e * s (* t with ``with_tensor_scales``) of every element, exactly, as float64
        (G, ..., K): 2 + 4 (+ 24) significant bits fit."""
        values = NVFP4Tensor(self.codes, self.scales, None, self.options).exact_values()
        if with_tensor_scales:
            values = values * self.tensor_scale_array().reshape((-1,) + (1,) * (values.ndim - 1))
        return values


def quantize_nvfp4_grouped(
    x, tensor_scales=None, profile: str = "torchao", **options
) -> NVFP4Groups:
    """``[quantize_nvfp4(x[g], tensor_scales[g], ...) for g in range(G)]`` in one pass, as one
    :class:`NVFP4Groups`, every code the same as the group-by-group calls'.

    ``x``: float32 or float16, (G, ..., K), K a multiple of the block size.
    ``tensor_scales``: None (single-level for every group), ``"amax"`` (each group's
    two-level tensor scale from its own largest finite magnitude,
    :func:`tensor_scale_from_amax`; single-level for a group with none above 0 or too small
    for a tensor scale), or a sequence of G entries, each None or a float32 value as
    :func:`quantize_nvfp4` takes it. ``profile`` and ``options`` as in :func:`quantize_nvfp4`."""
    who = "quantize_nvfp4_grouped"
    opts = _options(profile, options, who)
    values = _float32_input(x, f"{who}: x")
    if values.ndim < 2:
        raise ArgumentError(f"{who}: x must be (groups, ..., K), got shape {values.shape}")
    groups = values.shape[0]
    if tensor_scales is None:
        scales = [None] * groups
    elif isinstance(tensor_scales, str) and tensor_scales == "amax":
        scales = _amax_tensor_scales(values)
    elif isinstance(tensor_scales, str) or not hasattr(tensor_scales, "__len__"):
        raise ArgumentError(
            f"{who}: tensor_scales must be None, 'amax' or a sequence of {groups} float32 "
            f"values or None, got {shown(tensor_scales)}"
        )
    elif len(tensor_scales) != groups:
        raise ArgumentError(
            f"{who}: tensor_scales has {len(tensor_scales)} entries for {groups} groups"
        )
    else:
        scales = [
            _tensor_scale(t, f"{who}: tensor_scales[{g}]") for g, t in enumerate(tensor_scales)
        ]
    t = np.array([1.0 if v is None else v for v in scales], dtype=np.float32).reshape(
        (-1,) + (1,) * (values.ndim - 1)
    )
    codes, scale_codes = _recipe(values, t, opts, who)
    return NVFP4Groups(
        codes, scale_codes, tuple(None if v is None else float(v) for v in scales), opts
    )


def _amax_tensor_scales(values: np.ndarray) -> list:
    """Per group (first axis) of float32 ``values``, :func:`tensor_scale_from_amax` of its
    largest finite magnitude, or None where there is no such tensor scale (that magnitude 0,
    or so small that the scale underflows to 0)."""
    magnitudes = np.abs(values).reshape(len(values), -1)
    amax = magnitudes.max(axis=1, initial=np.float32(0))
    if not np.isfinite(amax).all():  # (NaN was refused before): groups holding ±Inf
        finite = np.where(np.isfinite(magnitudes), magnitudes, np.float32(0))
        amax = finite.max(axis=1, initial=np.float32(0))
    scales = amax / AMAX_PER_TENSOR_SCALE  # float32, as tensor_scale_from_amax divides
    return [scale if scale > 0 else None for scale in scales]


def _encode_at_scales(
    blocks: np.ndarray, scale_codes: np.ndarray, t, opts: NVFP4Options, who: str, shape: tuple
) -> np.ndarray:
    """Steps 3 and 4 of the recipe: the element codes of the float32 ``blocks`` (..., n,
    block) encoded at the block ``scale_codes`` (..., n) and tensor scale ``t`` (a float32, an
    array of them broadcasting against ``scale_codes``, or None), in ``shape``."""
    element, scale = get_format(opts.element_format), get_format(opts.scale_format)
    e_max = np.float32(element.max_finite)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        scale_values = scale.decode(scale_codes).astype(np.float32)
        one = np.float32(1.0)
        reciprocal = one / scale_values if t is None else (one / t) / scale_values
        if not np.isfinite(reciprocal).all():
            raise ArgumentError(
                f"{who}: 1 / (tensor_scale * block scale) overflows float32 (a tensor_scale far "
                "below the blocks' amax / 2688); choose it with tensor_scale_from_amax"
            )
        scaled = np.clip(blocks * reciprocal[..., None], -e_max, e_max)
    return element.encode(scaled, opts.element_rounding).astype(np.uint8).reshape(shape)


#: The most element magnitudes the kernel counts through (FP4's 8); larger element formats
#: take the encode path.
KERNEL_ELEMENT_MAGNITUDES = 16


@functools.lru_cache(maxsize=None)
def _kernel_tables(element_format: str, scale_format: str) -> tuple | None:
    """(element magnitudes, the midpoints between them as a tuple, scale magnitudes, the
    elements' sign bit) as the kernel reads them (float64, ascending from 0, the index the
    code), or None where a format is not so laid out (a two's-complement element, magnitudes
    not increasing with the code) or the elements have more than
    :data:`KERNEL_ELEMENT_MAGNITUDES` magnitudes."""
    element, scale = get_format(element_format), get_format(scale_format)
    if element.twos_complement or scale.signed:
        return None
    tables = []
    for fmt, count in ((element, 1 << (element.bits - 1)), (scale, 1 << scale.bits)):
        values = fmt.decode(np.arange(count))
        finite = (
            values[: np.argmin(np.isfinite(values))] if not np.isfinite(values).all() else values
        )
        if finite[0] != 0 or not (np.diff(finite) > 0).all():
            return None
        finite.setflags(write=False)
        tables.append(finite)
    elements, scales = tables
    if len(elements) > KERNEL_ELEMENT_MAGNITUDES:
        return None
    middles = tuple(float(m) for m in (elements[:-1] + elements[1:]) / 2)  # exact in float64
    return elements, middles, scales, 1 << (element.bits - 1)


def _kernel_recipe(
    values: np.ndarray, t, opts: NVFP4Options, who: str, given_scales=None
) -> tuple | None:
    """(element codes, scale codes) by the kernel (:mod:`mxsim.quantize._nvfp4_kernels`),
    where both roundings are to nearest even and the formats are laid out as it reads them;
    else None. ``t``: as :func:`_recipe` takes it; ``given_scales``: scale codes to encode at
    (step 2 skipped), or None."""
    tables = _kernel_tables(opts.element_format, opts.scale_format)
    if tables is None or (opts.scale_rounding, opts.element_rounding) != ("nearest_even",) * 2:
        return None
    element_values, middles, scale_values, sign = tables
    k, n_rows = values.shape[-1], math.prod(values.shape[:-1])
    rows = np.ascontiguousarray(values.reshape(n_rows, k))
    per_group = np.asarray(t, dtype=np.float32).reshape(-1)  # one, or one per group (axis 0)
    row_scales = np.repeat(per_group, n_rows // len(per_group) if n_rows else 0)
    codes = np.empty(rows.shape, dtype=np.uint8)
    blocks = k // opts.block_size
    if given_scales is None:
        scale_codes = np.empty((n_rows, blocks), dtype=np.uint8)
    else:
        scale_codes = np.ascontiguousarray(given_scales.reshape(n_rows, blocks))
    smallest = np.float32(get_format(opts.scale_format).min_normal)
    overflowed = []  # (appends are atomic: the chunks run on several threads)

    def run(start, stop):
        if not K.quantize_rows(
            rows,
            row_scales,
            middles,
            element_values[-1],
            scale_values,
            smallest,
            sign,
            given_scales is not None,
            scale_codes,
            codes,
            start,
            stop,
        ):
            overflowed.append(start)

    with threads_for(codes.size, SERIAL_QUANTIZE_BELOW):
        run_in_threads(run, len(rows))
    if overflowed:
        raise ArgumentError(
            f"{who}: 1 / (tensor_scale * block scale) overflows float32 (a tensor_scale far "
            "below the blocks' amax / 2688); choose it with tensor_scale_from_amax"
        )
    return codes.reshape(values.shape), scale_codes.reshape(*values.shape[:-1], blocks)


def _options(profile, options: dict, who: str) -> NVFP4Options:
    if not isinstance(profile, str) or profile not in NVFP4_PROFILES:
        raise UnknownNameError("NVFP4 profile", profile, NVFP4_PROFILES)
    try:
        return NVFP4Options(**{**NVFP4_PROFILES[profile].__dict__, **options})
    except TypeError:
        raise UnknownNameError(
            "NVFP4 option",
            next(iter(set(options) - set(NVFP4Options.__dataclass_fields__))),
            NVFP4Options.__dataclass_fields__,
        ) from None


def _tensor_scale(tensor_scale, name: str):
    """``tensor_scale`` (None, or a positive finite number holding a float32 exactly) as a
    float32; errors name it ``name``."""
    if tensor_scale is None:
        return None
    t = _positive_float32(tensor_scale, name)
    if float(t) != float(tensor_scale):
        raise ArgumentError(f"{name}: must be exactly a float32 value, got {shown(tensor_scale)}")
    return t


def quantize_nvfp4_at_scales(
    x, scales, tensor_scale=None, profile: str = "torchao", **options
) -> NVFP4Tensor:
    """``x`` quantized to NVFP4 at the given block scale codes (steps 3 and 4 of the module
    docstring; step 2's choice replaced by ``scales``): a library that stores its NVFP4
    tensors fixes the scales, which its dequantized values alone may not (a block whose
    largest element is below 6 holds the values of a block at a smaller scale).
    ``scales``: uint8 codes of the profile's scale format, shape
    ``(*x.shape[:-1], x.shape[-1] // block_size)``; a NaN code (0x7F, 0xFF) is refused.
    ``x``, ``tensor_scale``, ``profile`` and ``options`` as in :func:`quantize_nvfp4`."""
    who = "quantize_nvfp4_at_scales"
    opts = _options(profile, options, who)
    t = _tensor_scale(tensor_scale, f"{who}: tensor_scale")
    values = _float32_input(x, f"{who}: x")
    block = opts.block_size
    if values.shape[-1] % block:
        raise ArgumentError(
            f"{who}: the last axis ({values.shape[-1]}) must be a multiple of {block}"
        )
    if np.isnan(values).any():
        raise ArgumentError(f"{who}: x has NaN, which NVFP4 cannot hold")
    want = (*values.shape[:-1], values.shape[-1] // block)
    if not isinstance(scales, np.ndarray) or scales.dtype != np.uint8 or scales.shape != want:
        raise ArgumentError(
            f"{who}: scales must be a uint8 array of shape {want}, got "
            f"{getattr(scales, 'dtype', type(scales).__name__)} {getattr(scales, 'shape', '')}"
        )
    if np.isnan(get_format(opts.scale_format).decode(scales)).any():
        raise ArgumentError(f"{who}: scales hold a NaN code, which no NVFP4 block scale is")
    by_kernel = _kernel_recipe(values, np.float32(1.0) if t is None else t, opts, who, scales)
    if by_kernel is not None:
        codes = by_kernel[0]
    else:
        codes = _encode_at_scales(values.reshape(*want, block), scales, t, opts, who, values.shape)
    return NVFP4Tensor(codes, scales.copy(), None if t is None else float(t), opts)
