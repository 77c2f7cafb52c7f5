"""Block floating point with shared microexponents (MX4/MX6/MX9) and plain BFP, as AMD Quark.

Bit-exact model of Quark's ONNX custom op ``BFPQuantizeDequantize`` (``bfp_method`` =
``"to_bfp_prime"`` for MX4/MX6/MX9, ``"to_bfp"`` for plain BFP), reproducing either its CPU or
its CUDA kernel.  Sources, line references and deviations from the OCP/paper descriptions are
in ``docs/bfp.md``.  Notation: a float32 element has biased exponent field ``e`` (0 for
zeros/subnormals, 255 for Inf/NaN) and 24-bit significand ``sig = 2**23 + fraction`` (normal);
``m = bit_width - 9`` is the number of magnitude bits per element (1 sign bit and the 8-bit
shared exponent make up the rest of ``bit_width``).

``to_bfp_prime`` (block of ``block_size``, sub-blocks of ``sub_block_size``)
    * E = the largest ``e`` in the block, Inf/NaN included.  E == 255 makes the *whole block*
      NaN (each output element is the float32 bit pattern 0x7FFFFFFF).
    * Per sub-block, d = min(E - (largest ``e`` in the sub-block), 2**sub_block_shift_bits - 1).
    * Subnormal inputs are flushed to zero.  Every other element has the exact magnitude
      ``q = |x| / 2**(E - 127 - d + 1 - m)`` (q < 2**m), rounded to an integer M:

      - ``kernel="cpu"``: round to nearest; ties by ``rounding_mode`` 0 away from zero,
        1 toward +inf, 2 to even; then M = min(M, 2**m - 1): a rounding that would carry out
        of the sub-block's top keeps the largest mantissa (MX6 1.97 -> 1.875), as Quark's
        CPU runtime does.
      - ``kernel="cuda"``: Quark's CUDA kernel reads ``rounding_mode`` differently:
        0 truncate (floor q), 1 round half away from zero but never above 2**m - 1
        (MX6 1.97 -> 1.875), 2 stochastic: floor(q) + 1 with probability
        (low k bits of the raw float32 encoding) / 2**k, k = bits of the significand below M,
        only when k <= 24 and floor(2q) != 2**(m+1) - 1.  This is unbiased only when k <= 23
        and the input is normal; it can still produce 2**m (with E = 254 and d = 0 that is
        2**128, output as +-Inf); and a subnormal input can become M = 1 (no flush).  Random bits come from ``numpy.random.default_rng(seed)``; Quark's
        own stream is clock-seeded curand and cannot be reproduced.

    * Value = (-1)**s * M * 2**(E - 127 - d + 1 - m).  The sign is the input's, so negative
      inputs that round to 0 give -0.0; a zero or subnormal input's per ``flushed_zero_sign``.

``to_bfp`` (no microexponents)
    * E = the largest ``e`` among the *finite* elements (0 if none); Inf/NaN elements are passed
      through bit for bit and do not affect their block.
    * Every finite element, subnormals included, becomes M = round(|x| / 2**(E - 126 - m)), ties
      by ``rounding_mode`` as on the CPU above (the CPU and CUDA kernels agree), clamped to
      2**m - 1, so values saturate at +-(2**(E - 126) - 2**(E - 126 - m)).
    * Value = (-1)**s * M * 2**(E - 126 - m).  The sign is the input's, except that with
      ``rounding_mode`` 2 a negative input that rounds to 0 gives +0.0 (Quark's ``py3_round``
      returns floor(q) + 1), unless |x| / scale already underflowed to -0.0 in float32.

Not modelled (see docs): Quark's ``use_compiler_version_cpu_kernel`` and
``convert_to_bfloat_before_bfp`` options, float16 inputs, and its op wrapper's special case of
returning single-element tensors unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..errors import MxsimError, UnknownNameError
from ..limits import MAX_BLOCK_SIZE, check_array_budget, is_integer
from . import _bfp_kernels

__all__ = [
    "BFP_METHODS",
    "BFP_KERNELS",
    "FLUSHED_ZERO_SIGNS",
    "BFP_SPECS",
    "BFPAxisError",
    "BFPInputError",
    "BFPSpec",
    "BFPSpecError",
    "BFPTensor",
    "get_bfp_spec",
    "quantize_bfp",
]

BFP_METHODS = ("to_bfp", "to_bfp_prime")
BFP_KERNELS = ("cpu", "cuda")
FLUSHED_ZERO_SIGNS = ("input", "positive")
#: Biased shared exponent that marks a NaN block (``to_bfp_prime`` only).
NAN_BLOCK_EXPONENT = 255
#: The float32 Quark writes for every element of a NaN block.
NAN_BLOCK_BITS = 0x7FFFFFFF

MIN_MANTISSA_BITS = 1
MAX_MANTISSA_BITS = 23  # m <= 23 keeps every kernel shift non-negative and every scale a float32
MAX_SHIFT_BITS = 8  # d <= E <= 255, so more shift bits change nothing


class BFPSpecError(MxsimError, ValueError):
    """A BFP/MX parameter outside the range this model (and Quark) supports."""


class BFPInputError(MxsimError, TypeError):
    """The tensor to quantize is not a float32/float64 numpy array with at least one axis."""


class BFPAxisError(MxsimError, ValueError):
    """The block axis does not exist in the tensor."""


def _require_int(name: str, value: object, low: int, high: int | None = None) -> None:
    if not is_integer(value):
        raise BFPSpecError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise BFPSpecError(f"{name} must be {bound}, got {value}")


@dataclass(frozen=True)
class BFPSpec:
    """Parameters of one Quark ``BFPQuantizeDequantize`` configuration (validated on creation).

    * ``method``: ``"to_bfp_prime"`` (shared exponent + microexponents: MX4/MX6/MX9) or
      ``"to_bfp"`` (plain block floating point).
    * ``bit_width``: Quark's attribute; ``mantissa_bits = bit_width - 9`` (1 sign bit and the
      8-bit shared exponent are counted in it), 1..23 here, so bit_width 10..32.
    * ``block_size``: elements sharing one 8-bit exponent (1..4096).
    * ``sub_block_size`` / ``sub_block_shift_bits``: elements sharing one microexponent and its
      width (0..8).  ``to_bfp`` has no microexponents: it requires ``sub_block_size ==
      block_size`` and ``sub_block_shift_bits == 0``.  ``sub_block_size`` must divide
      ``block_size`` (Quark leaves the remainder of a block unwritten otherwise).
    * ``rounding_mode``: Quark's integer, 0/1/2; what it means depends on ``method`` and
      ``kernel`` (module docstring).
    * ``kernel``: ``"cpu"`` or ``"cuda"``: whose semantics to reproduce.
    * ``seed``: seeds the random bits of CUDA stochastic rounding; same seed, same tensor
      shape and axis give the same result.
    * ``flushed_zero_sign`` (``to_bfp_prime`` only): the sign of the zero that a zero or
      subnormal input becomes (it is flushed): ``"input"`` its own (Quark's op kernels, so
      -0.0 stays -0.0), ``"positive"`` +0.0 (``quark.torch``'s ``fake_quantize_mx6_mx9``,
      which replaces such inputs by +0.0 before quantizing).
    """

    method: Literal["to_bfp", "to_bfp_prime"]
    bit_width: int
    block_size: int
    sub_block_size: int
    sub_block_shift_bits: int
    rounding_mode: int = 0
    kernel: Literal["cpu", "cuda"] = "cpu"
    seed: int = 0
    flushed_zero_sign: Literal["input", "positive"] = "input"

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or self.method not in BFP_METHODS:
            raise UnknownNameError("BFP method", self.method, BFP_METHODS)
        if not isinstance(self.kernel, str) or self.kernel not in BFP_KERNELS:
            raise UnknownNameError("BFP kernel", self.kernel, BFP_KERNELS)
        _require_int("bit_width", self.bit_width, MIN_MANTISSA_BITS + 9, MAX_MANTISSA_BITS + 9)
        _require_int("block_size", self.block_size, 1, MAX_BLOCK_SIZE)
        _require_int("sub_block_size", self.sub_block_size, 1, MAX_BLOCK_SIZE)
        _require_int("sub_block_shift_bits", self.sub_block_shift_bits, 0, MAX_SHIFT_BITS)
        _require_int("rounding_mode", self.rounding_mode, 0, 2)
        _require_int("seed", self.seed, 0, 2**63 - 1)
        if not isinstance(self.flushed_zero_sign, str) or (
            self.flushed_zero_sign not in FLUSHED_ZERO_SIGNS
        ):
            raise UnknownNameError(
                "BFP flushed_zero_sign", self.flushed_zero_sign, FLUSHED_ZERO_SIGNS
            )
        if self.flushed_zero_sign != "input" and (
            self.method != "to_bfp_prime" or self.kernel != "cpu"
        ):
            raise BFPSpecError(
                "flushed_zero_sign 'positive' is quark.torch's MX6/MX9 rule (to_bfp_prime with "
                f"kernel 'cpu'), got method {self.method!r}, kernel {self.kernel!r}"
            )
        if self.method == "to_bfp":
            if self.sub_block_size != self.block_size or self.sub_block_shift_bits != 0:
                raise BFPSpecError(
                    "to_bfp has no microexponents: sub_block_size must equal block_size "
                    f"({self.block_size}) and sub_block_shift_bits must be 0, got "
                    f"{self.sub_block_size} and {self.sub_block_shift_bits}"
                )
        elif self.block_size % self.sub_block_size != 0:
            raise BFPSpecError(
                f"sub_block_size {self.sub_block_size} must divide block_size {self.block_size}"
            )

    @property
    def mantissa_bits(self) -> int:
        """m: magnitude bits of each element (its sign bit is extra)."""
        return self.bit_width - 9

    @property
    def has_microexponents(self) -> bool:
        return self.method == "to_bfp_prime"

    @property
    def bits_per_element(self) -> float:
        """Nominal storage: sign + m, plus the 8-bit shared exponent and the microexponents
        amortised over their blocks (MX4 4, MX6 6, MX9 9, BFP16 9).

        The CUDA kernel's stochastic rounding can produce M == 2**m, which needs one more bit
        than this nominal format has; this count does not include it.
        """
        micro = self.sub_block_shift_bits / self.sub_block_size if self.has_microexponents else 0
        return 1 + self.mantissa_bits + 8 / self.block_size + micro

    def replace(self, **changes) -> BFPSpec:
        """A copy with some fields changed (validated), e.g. ``kernel="cuda"``."""
        return dataclasses.replace(self, **changes)


#: Named configurations.  MX4/MX6/MX9 are Quark's bit_width 11/13/16 with block 16, sub-block 2
#: and 1 shift bit (the Microexponents paper's formats); BFP16 is Quark's op default
#: (to_bfp, bit_width 16, block 8).  rounding_mode 0 and the CPU kernel are Quark's defaults.
BFP_SPECS: dict[str, BFPSpec] = {
    "MX4": BFPSpec(
        "to_bfp_prime", bit_width=11, block_size=16, sub_block_size=2, sub_block_shift_bits=1
    ),
    "MX6": BFPSpec(
        "to_bfp_prime", bit_width=13, block_size=16, sub_block_size=2, sub_block_shift_bits=1
    ),
    "MX9": BFPSpec(
        "to_bfp_prime", bit_width=16, block_size=16, sub_block_size=2, sub_block_shift_bits=1
    ),
    "BFP16": BFPSpec(
        "to_bfp", bit_width=16, block_size=8, sub_block_size=8, sub_block_shift_bits=0
    ),
}


def get_bfp_spec(spec_or_name: BFPSpec | str) -> BFPSpec:
    """The spec itself, or the named one from ``BFP_SPECS`` (name case-insensitive)."""
    if isinstance(spec_or_name, BFPSpec):
        return spec_or_name
    if isinstance(spec_or_name, str) and spec_or_name.upper() in BFP_SPECS:
        return BFP_SPECS[spec_or_name.upper()]
    raise UnknownNameError("BFP format", spec_or_name, BFP_SPECS)


@dataclass(frozen=True, eq=False)
class BFPTensor:
    """A tensor quantized by ``quantize_bfp``: the codes, plus enough to rebuild values exactly.

    Layout of the code arrays ("blocked layout"): the block axis is moved last, padded with
    zeros by ``padding`` elements to a multiple of ``block_size``, and split into blocks, so with
    ``outer`` = ``shape`` without ``axis``:

    * ``shared_exponents``: uint8 ``(*outer, n_blocks)``, the biased E.  For ``to_bfp_prime``,
      255 marks a NaN block (every element dequantizes to NaN, bits 0x7FFFFFFF); the
      microexponents, mantissas and sign bits of a NaN block are all 0.  ``to_bfp`` never
      stores 255 (it ignores Inf/NaN when choosing E).
    * ``microexponents``: uint8 ``(*outer, n_blocks, n_sub_blocks)``, the d values
      (``to_bfp``: one sub-block per block, d = 0).
    * ``mantissas``: int32 ``(*outer, n_blocks, block_size)``, the signed significand +-M
      (0 <= M <= 2**m; 2**m only from CUDA stochastic rounding).
    * ``sign_bits``: uint8, same shape; 1 where the output is negative, which keeps -0.0.
    * ``special_bits``: ``to_bfp`` only (else None), uint32, same shape: the input's bits where
      it was Inf/NaN (passed through unchanged), else 0.

    Padding elements are zeros and are quantized like zeros; they are dropped by every
    ``element_*`` method and by ``dequantize``.
    """

    spec: BFPSpec
    shape: tuple[int, ...]
    axis: int
    padding: int
    shared_exponents: np.ndarray
    microexponents: np.ndarray
    mantissas: np.ndarray
    sign_bits: np.ndarray
    special_bits: np.ndarray | None

    @property
    def bits_per_element(self) -> float:
        """Nominal storage cost per element (see ``BFPSpec.bits_per_element``)."""
        return self.spec.bits_per_element

    @property
    def nan_blocks(self) -> np.ndarray:
        """bool ``(*outer, n_blocks)``: blocks that dequantize to all-NaN (prime only)."""
        if not self.spec.has_microexponents:
            return np.zeros(self.shared_exponents.shape, bool)
        return self.shared_exponents == NAN_BLOCK_EXPONENT

    def _blocked_lsb_exponents(self) -> np.ndarray:
        m = self.spec.mantissa_bits
        e = self.shared_exponents.astype(np.int32)[..., None]
        if self.spec.has_microexponents:
            d = np.repeat(self.microexponents.astype(np.int32), self.spec.sub_block_size, axis=-1)
        else:
            d = np.zeros(1, np.int32)
        return e - 127 - d + 1 - m

    def _blocked_nonfinite(self) -> np.ndarray:
        mask = np.broadcast_to(self.nan_blocks[..., None], self.mantissas.shape)
        if self.special_bits is not None:
            mask = mask | ((self.special_bits & 0x7F800000) == 0x7F800000)
        return mask

    def _to_input_layout(self, blocked: np.ndarray) -> np.ndarray:
        length = self.shape[self.axis]
        n_blocks, block_size = blocked.shape[-2:]
        flat = blocked.reshape(*blocked.shape[:-2], n_blocks * block_size)[..., :length]
        return np.ascontiguousarray(np.moveaxis(flat, -1, self.axis))

    def element_significands(self) -> np.ndarray:
        """int32 in the input's shape: +-M of each element (0 in NaN blocks and for Inf/NaN)."""
        return self._to_input_layout(self.mantissas)

    def element_lsb_exponents(self) -> np.ndarray:
        """int32 in the input's shape: k with element value == significand * 2**k exactly.

        k = E - 127 - d + 1 - m.  Meaningless where ``element_nonfinite_mask()`` is True.
        The exact product may be 2**128 (CUDA stochastic rounding, E = 254), which float32
        cannot hold; ``dequantize`` returns Inf there, as Quark's double-to-float store does.
        """
        return self._to_input_layout(
            np.broadcast_to(self._blocked_lsb_exponents(), self.mantissas.shape)
        )

    def element_nonfinite_mask(self) -> np.ndarray:
        """bool in the input's shape: elements whose output is NaN/Inf by rule (NaN blocks,
        passed-through Inf/NaN), not by float32 overflow."""
        return self._to_input_layout(self._blocked_nonfinite())

    def as_mx_tensor(self):
        """The same values as an MXTensor a datapath reads (``mxsim.dot``/``matmul``).

        Elements become the ``mx4``/``mx6``/``mx9`` formats (sign and M, valued M·2^(1-m));
        each sub-block carries the scale 2^(E - 127 - d) as the code E - d (0xFF for a NaN
        block), with the MXTensor's block size = the sub-block size. So element × scale is
        exactly ±M·2^(E-127-d+1-m), and a unit with ``inputs.block_size`` equal to the
        sub-block size multiplies BFP operands exactly. Tensors with m = 2, 4 or 7 map to
        these formats: ``to_bfp_prime`` (MX4, MX6, MX9) and plain ``to_bfp`` with 7 mantissa
        bits (BFP16: one scale 2^(E - 127) per block, block size = the BFP block), the latter
        only without Inf/NaN inputs (which it passes through and no element code holds).
        """
        from ..formats import get_format
        from .mx import MXTensor
        from .options import QuantOptions

        names = {2: "mx4", 4: "mx6", 7: "mx9"}
        m = self.spec.mantissa_bits
        if m not in names:
            raise BFPSpecError(
                f"as_mx_tensor needs 2, 4 or 7 mantissa bits (MX4/6/9, BFP16), got {self.spec}"
            )
        if self.special_bits is not None and self.special_bits.any():
            raise BFPSpecError(
                "as_mx_tensor: the tensor holds Inf/NaN passed through by to_bfp; no element code holds them"
            )
        fmt = get_format(names[m])
        magnitude = np.abs(self.mantissas).astype(np.uint16)
        codes = (self.sign_bits.astype(np.uint16) << (fmt.bits - 1)) | magnitude
        codes = codes.reshape(*codes.shape[:-2], -1)
        sub = self.spec.sub_block_size
        exponents = self.shared_exponents.astype(np.int32)[..., None] - self.microexponents.astype(
            np.int32
        )
        scale_codes = np.where(self.nan_blocks[..., None], 255, exponents).astype(np.uint8)
        scale_codes = scale_codes.reshape(*scale_codes.shape[:-2], -1)
        padding = codes.shape[-1] - self.shape[self.axis]
        return MXTensor(
            fmt,
            codes.astype(fmt.code_dtype, copy=False),
            scale_codes,
            self.shape,
            self.axis,
            sub,
            padding,
            QuantOptions(),
        )

    def dequantize(self) -> np.ndarray:
        """float32 in the input's shape, bit-identical to Quark's output.

        Each element is (-1)**sign * M * 2**(E - 127 - d + 1 - m), which float32 holds exactly
        (the smallest possible LSB, E - d = 0 with m = 23, is 2**-149, float32's smallest
        subnormal; M < 2**(m+1) fits the rest), except M * 2**k == 2**128, which
        overflows to Inf as Quark's double-to-float store does.  NaN blocks give 0x7FFFFFFF;
        ``to_bfp`` Inf/NaN inputs come back bit for bit.
        """
        magnitude = np.ldexp(
            np.abs(self.mantissas).astype(np.float64), self._blocked_lsb_exponents()
        )
        with np.errstate(over="ignore"):
            values = magnitude.astype(np.float32)
        values = np.where(self.sign_bits.astype(bool), -values, values)
        bits = values.view(np.uint32)
        bits = np.where(self.nan_blocks[..., None], np.uint32(NAN_BLOCK_BITS), bits)
        if self.special_bits is not None:
            bits = np.where(self._blocked_nonfinite(), self.special_bits, bits)
        return self._to_input_layout(bits.astype(np.uint32).view(np.float32))


def _as_float32(x: object) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise BFPInputError(
            f"x must be a numpy array of float32 or float64, got {type(x).__name__}"
        )
    if x.dtype.kind != "f" or x.dtype.itemsize not in (4, 8):
        raise BFPInputError(f"x must have dtype float32 or float64, got {x.dtype}")
    if x.ndim == 0:
        raise BFPInputError("x must have at least one axis to block along, got a 0-d array")
    # float64 -> float32 is IEEE round-to-nearest-even (overflow to +-Inf); Quark only ever
    # sees float32 (it casts float16 inputs up, exactly).
    with np.errstate(over="ignore"):
        return x.astype(np.float32, copy=False)


def _normalise_axis(axis: object, ndim: int) -> int:
    if not is_integer(axis):
        raise BFPAxisError(f"axis must be an int, got {type(axis).__name__} {axis!r}")
    if not -ndim <= axis < ndim:
        raise BFPAxisError(f"axis {axis} is out of range for a {ndim}-d array")
    return int(axis) % ndim


def quantize_bfp(x: np.ndarray, spec_or_name: BFPSpec | str, axis: int = -1) -> BFPTensor:
    """Quantize ``x`` into blocks along ``axis`` exactly as Quark's BFP op (module docstring).

    ``x``: a numpy float32 array, or float64, which is first rounded to float32 with
    round-to-nearest-even (values beyond float32 range become +-Inf, tiny ones subnormal or 0),
    because Quark's kernels only read float32.  ``spec_or_name``: a ``BFPSpec`` or a key of
    ``BFP_SPECS``.  The last block along ``axis`` is padded with zeros (recorded as
    ``padding``); like Quark, padding never changes E or the values of real elements, but a
    sub-block made only of padding gets d = min(E, 2**shift_bits - 1).  An empty ``x`` gives an
    empty BFPTensor; a tensor beyond the memory budget raises BudgetError (docs/limits.md).
    """
    spec = get_bfp_spec(spec_or_name)
    x32 = _as_float32(x)
    axis = _normalise_axis(axis, x32.ndim)
    length = x32.shape[axis]
    n_blocks = -(-length // spec.block_size)
    padding = n_blocks * spec.block_size - length
    moved = np.moveaxis(x32, axis, -1)
    outer = moved.shape[:-1]
    # the largest arrays made are the int32 mantissas and the float32 dequantized copy
    check_array_budget((*outer, n_blocks * spec.block_size), 4, "quantize_bfp: the blocked tensor")
    if padding:
        padded = np.zeros((*outer, n_blocks * spec.block_size), np.float32)
        padded[..., :length] = moved
    else:
        padded = np.ascontiguousarray(moved)
    block_bits = padded.view(np.uint32).reshape(-1, spec.block_size)
    m = spec.mantissa_bits
    if spec.has_microexponents:
        cuda = spec.kernel == "cuda"
        if cuda and spec.rounding_mode == _bfp_kernels.CUDA_PRIME_STOCHASTIC:
            rng = np.random.default_rng(spec.seed)
            random_words = rng.integers(0, 2**32, size=block_bits.shape, dtype=np.uint32)
        else:
            random_words = np.zeros((0, 0), np.uint32)
        shared, micro, mant, sign = _bfp_kernels.bfp_prime_kernel(
            block_bits,
            m,
            spec.sub_block_size,
            spec.sub_block_shift_bits,
            spec.rounding_mode,
            cuda,
            random_words,
            spec.flushed_zero_sign == "input",
        )
        special = None
    else:
        shared, micro, mant, sign, special = _bfp_kernels.bfp_plain_kernel(
            block_bits, m, spec.rounding_mode
        )
        special = special.reshape(*outer, n_blocks, spec.block_size)
    return BFPTensor(
        spec=spec,
        shape=tuple(x32.shape),
        axis=axis,
        padding=padding,
        shared_exponents=shared.reshape(*outer, n_blocks),
        microexponents=micro.reshape(*outer, n_blocks, micro.shape[-1]),
        mantissas=mant.reshape(*outer, n_blocks, spec.block_size),
        sign_bits=sign.reshape(*outer, n_blocks, spec.block_size),
        special_bits=special,
    )
