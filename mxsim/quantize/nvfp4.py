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

The twin of this module is :func:`mxsim.quantize.reference.quantize_nvfp4_reference`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError, MxsimError, UnknownNameError
from ..formats import get_format
from ..formats.rounding import ROUNDING_MODES
from ..limits import check_array_budget, shown

NVFP4_BLOCK_SIZE = 16
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
    scale = value / np.float32(448.0 * 6.0)
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
    t = _tensor_scale(tensor_scale, "quantize_nvfp4")
    values = _float32_input(x, "quantize_nvfp4: x")
    block = opts.block_size
    if values.shape[-1] % block:
        raise ArgumentError(
            f"quantize_nvfp4: the last axis ({values.shape[-1]}) must be a multiple of {block}"
        )
    if np.isnan(values).any():
        raise ArgumentError("quantize_nvfp4: x has NaN, which NVFP4 cannot hold")
    element, scale = get_format(opts.element_format), get_format(opts.scale_format)
    blocks = values.reshape(
        *values.shape[:-1], values.shape[-1] // block, block
    )  # an empty x: empty blocks
    e_max = np.float32(element.max_finite)
    with np.errstate(over="ignore", invalid="ignore"):  # Inf inputs saturate (documented)
        descale = np.abs(blocks).max(axis=-1, initial=np.float32(0)) / e_max
        if t is not None:
            descale = descale / t
        clamped = np.clip(descale, np.float32(scale.min_normal), np.float32(scale.max_finite))
        scale_codes = scale.encode(clamped, opts.scale_rounding).astype(np.uint8)
    return _encode_at_scales(blocks, scale_codes, t, opts, "quantize_nvfp4", values.shape)


def _encode_at_scales(
    blocks: np.ndarray, scale_codes: np.ndarray, t, opts: NVFP4Options, who: str, shape: tuple
) -> NVFP4Tensor:
    """Steps 3 and 4 of the recipe: the float32 ``blocks`` (..., n, block) encoded at the
    block ``scale_codes`` (..., n) and tensor scale ``t`` (a float32, or None)."""
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
    codes = element.encode(scaled, opts.element_rounding).astype(np.uint8).reshape(shape)
    return NVFP4Tensor(codes, scale_codes, None if t is None else float(t), opts)


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


def _tensor_scale(tensor_scale, who: str):
    """``tensor_scale`` (None, or a positive finite number holding a float32 exactly) as a float32."""
    if tensor_scale is None:
        return None
    t = _positive_float32(tensor_scale, f"{who}: tensor_scale")
    if float(t) != float(tensor_scale):
        raise ArgumentError(
            f"{who}: tensor_scale must be exactly a float32 value, got {shown(tensor_scale)}"
        )
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
    t = _tensor_scale(tensor_scale, who)
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
    blocks = values.reshape(*want, block)
    return _encode_at_scales(blocks, scales.copy(), t, opts, who, values.shape)
