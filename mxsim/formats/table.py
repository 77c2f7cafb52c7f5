"""The one table of number formats, and the public encode/decode functions.

A format is data (:class:`FormatInfo`): field widths, bias, signedness, how specials are
encoded. Every operation on formats reads these fields; nothing branches on a format name.
Modelled after gfloat's ``FormatInfo``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import ArgumentError, MxsimError, UnknownNameError
from .._threads import run_in_threads, subnormals_work, threads_for
from ..limits import check_choice, check_int
from . import _kernels as K
from .rounding import overflow_code, rounding_code

# What a format is for; consumers pick their format lists by role, never by name.
ROLES = {
    "element": "OCP MX element format (one E8M0 scale per block)",
    "bfp_element": "shared-microexponent (MX4/MX6/MX9) element, as the datapath sees it",
    "scale": "block scale format",
    "wide": "accumulator / output format (no block scale)",
    "tensor_input": "tensor-core input format that is neither an MX element nor an output (tf32)",
    "custom": "user-built format (custom_format)",
}

E8M0_BIAS = 127  # E8M0 code c is the scale 2^(c - 127)
E8M0_ONE = E8M0_BIAS  # the E8M0 code of the scale 2^0 = 1.0
E8M0_NAN = 0xFF  # the E8M0 code that marks a block's scale (and so the whole block) NaN

SPECIALS = {
    "none": K.SPECIALS_NONE,
    "ieee": K.SPECIALS_IEEE,
    "nan_at_max": K.SPECIALS_NAN_AT_MAX,
    "nan_at_negative_zero": K.SPECIALS_NAN_AT_NEGATIVE_ZERO,
}

# Float input dtypes accepted by encode, with their (exponent bits, mantissa bits, bit view).
INPUT_FLOATS = {
    np.dtype(np.float16): (5, 10, np.uint16),
    np.dtype(np.float32): (8, 23, np.uint32),
    np.dtype(np.float64): (11, 52, np.uint64),
}


@dataclass(frozen=True)
class FormatInfo:
    """Description of a binary number format.

    Attributes:
        name: the table key.
        bits: total width of a code.
        exponent_bits: width of the exponent field (0 for fixed-point formats).
        mantissa_bits: width of the trailing significand field (fraction bits).
        bias: exponent bias. For a fixed-point format (``exponent_bits == 0``) every code is
            ``integer * 2^(1 - bias - mantissa_bits)``.
        signed: whether the format has negative values.
        twos_complement: codes are two's-complement integers (MX INT8) rather than
            sign-magnitude.
        specials: ``"ieee"`` (top exponent reserved for ±Inf and NaN), ``"nan_at_max"`` (only
            the all-ones magnitude is NaN: fp8_e4m3, e8m0), ``"nan_at_negative_zero"`` (the
            code of -0 is the only NaN; zero is unsigned, no Inf: the "fnuz" FP8 formats) or
            ``"none"``.
        subnormals: whether exponent field 0 encodes subnormals (and zero). Without them the
            field value 0 is an ordinary binade and the format has no zero (E8M0).
        allow_min_twos_complement: for two's-complement formats, whether the most negative code
            (−2.0 in MX INT8) may be produced by encoding.
        scale_emax: the element's ``emax`` in the MX scale rule ``X = 2^(E - emax)``; by
            default ``floor(log2(max_finite))``.
        padding_bits: zero bits below the trailing significand in every stored code: the
            format travels in a wider container (tf32 in fp32 bit patterns, the low 13
            fraction bits zero, as tensor cores read fp32 registers). ``bits`` counts them;
            the sign, exponent and mantissa fields sit above them.
        role: a key of :data:`ROLES`.
        aliases: other accepted names (Quark config names, OCP/ml_dtypes names); looked up
            case-insensitively by :func:`get_format`, like the name itself.

    Storage in memory (what the cycle model counts; the datapath never reads these):

        storage_bits: bits of one element as stored, ``bits`` by default. Differs from
            ``bits`` for MX4/6/9: the datapath widens M to ``m + 1`` magnitude bits (Quark's
            CUDA stochastic rounding can reach ``2^m``; its CPU kernel saturates at
            ``2^m - 1``, docs/bfp.md) while memory holds sign + ``m - 1`` mantissa bits.
        block_size: elements sharing one scale of ``scale_bits`` (None: no block scale).
        subblock_size, microexponent_bits: one ``microexponent_bits`` field per
            ``subblock_size`` elements (MX4/6/9).
    """

    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int
    bias: int
    signed: bool = True
    twos_complement: bool = False
    specials: str = "ieee"
    subnormals: bool = True
    allow_min_twos_complement: bool = True
    # None in the constructor means "derive it"; __post_init__ sets an int, so readers see an int.
    scale_emax: int = field(default=None, compare=False)  # type: ignore[assignment]
    padding_bits: int = 0
    role: str = field(default="custom", compare=False)
    aliases: tuple[str, ...] = field(default=(), compare=False)
    storage_bits: int = field(default=None, compare=False)  # type: ignore[assignment]  # as scale_emax
    block_size: int | None = field(default=None, compare=False)
    scale_bits: int = field(default=0, compare=False)
    subblock_size: int | None = field(default=None, compare=False)
    microexponent_bits: int = field(default=0, compare=False)

    def __post_init__(self):
        if not isinstance(self.specials, str) or self.specials not in SPECIALS:
            raise UnknownNameError("specials encoding", self.specials, SPECIALS)
        width = self.exponent_bits + self.mantissa_bits + self.signed + self.padding_bits
        if width != self.bits or self.bits < 2 or self.bits > 64 or self.padding_bits < 0:
            raise MxsimError(
                f"format {self.name!r}: exponent_bits + mantissa_bits + sign bit + padding_bits must equal bits (2..64)"
            )
        if self.specials == "ieee" and (self.exponent_bits < 2 or self.mantissa_bits < 1):
            raise MxsimError(
                f"format {self.name!r}: ieee specials need >= 2 exponent and >= 1 mantissa bits"
            )
        if self.twos_complement and self.exponent_bits:
            raise MxsimError(
                f"format {self.name!r}: two's complement is only for fixed-point formats"
            )
        if self.role not in ROLES:
            raise UnknownNameError("format role", self.role, ROLES)
        if self.scale_emax is None:
            object.__setattr__(self, "scale_emax", _emax_from_fields(self))
        if self.storage_bits is None:
            object.__setattr__(self, "storage_bits", self.bits)

    # Storage ----------------------------------------------------------------------------
    @property
    def block_storage_bits(self) -> int:
        """Bits of one full block in memory: elements, scale and microexponents."""
        if self.block_size is None:
            return self.storage_bits
        microexponents = self.block_size // self.subblock_size if self.subblock_size else 0
        return (
            self.block_size * self.storage_bits
            + self.scale_bits
            + microexponents * self.microexponent_bits
        )

    @property
    def average_bits_per_element(self) -> Fraction:
        """Storage bits per element including the shared scale and microexponents
        (MX9: 8 + 8/16 + 1/2 = 9; fp4_e2m1: 4 + 8/32 = 4.25)."""
        return Fraction(self.block_storage_bits, self.block_size or 1)

    # Derived properties ---------------------------------------------------------------
    @property
    def field_bits(self) -> int:
        """Width of a code without its padding: sign + exponent + mantissa fields."""
        return self.bits - self.padding_bits

    @property
    def max_index(self) -> int:
        """Magnitude index (field code without sign or padding) of the largest finite value."""
        if self.twos_complement:
            return (1 << (self.field_bits - 1)) - 1
        magnitude_bits = self.field_bits - self.signed
        if self.specials == "ieee":
            return (((1 << self.exponent_bits) - 1) << self.mantissa_bits) - 1
        if self.specials == "nan_at_max":
            return (1 << magnitude_bits) - 2
        return (1 << magnitude_bits) - 1

    @property
    def max_finite(self) -> float:
        """Largest finite value."""
        return _magnitude_from_fields(self, self.max_index)

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value (the quantum of fixed-point formats)."""
        if self.exponent_bits == 0:
            return math.ldexp(1.0, 1 - self.bias - self.mantissa_bits)
        return math.ldexp(1.0, (1 - self.bias) if self.subnormals else -self.bias)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value."""
        if self.exponent_bits and not self.subnormals:
            return self.min_normal
        return math.ldexp(1.0, 1 - self.bias - self.mantissa_bits)

    @property
    def has_inf(self) -> bool:
        return self.specials == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.specials != "none"

    @property
    def has_zero(self) -> bool:
        return self.subnormals or self.exponent_bits == 0

    @property
    def code_dtype(self) -> np.dtype:
        """Smallest unsigned dtype holding a code."""
        return np.dtype(
            np.uint8
            if self.bits <= 8
            else np.uint16
            if self.bits <= 16
            else np.uint32
            if self.bits <= 32
            else np.uint64
        )

    @property
    def emax(self) -> int:
        """Exponent of the leading bit of the largest finite value (from the fields: a float
        log2 of fp64's largest value rounds up to 1024)."""
        return _emax_from_fields(self)

    @functools.cached_property
    def kernel_params(self) -> np.ndarray:
        """The int64 parameter vector the kernels read (see ``_kernels.P_*``), read-only (one
        per format, shared by every caller); the kernels work on field codes (stored codes
        shifted right by ``padding_bits``)."""
        params = np.zeros(K.N_PARAMS, dtype=np.int64)
        params[K.P_BITS] = self.field_bits
        params[K.P_EXPONENT_BITS] = self.exponent_bits
        params[K.P_MANTISSA_BITS] = self.mantissa_bits
        params[K.P_BIAS] = self.bias
        params[K.P_SIGNED] = self.signed
        params[K.P_TWOS_COMPLEMENT] = self.twos_complement
        params[K.P_SPECIALS] = SPECIALS[self.specials]
        params[K.P_SUBNORMALS] = self.subnormals
        params[K.P_MAX_INDEX] = self.max_index
        params[K.P_MAX_INDEX_NEGATIVE] = self.max_index + (
            self.twos_complement and self.allow_min_twos_complement
        )
        params[K.P_EMAX] = _emax_from_fields(self)
        params.setflags(write=False)
        return params

    @property
    def top_fraction_bits(self) -> int:
        """Fraction bits of the binade holding max_finite (its spacing is 2^(emax - this))."""
        below = _magnitude_from_fields(self, self.max_index - 1)
        return self.emax - int(np.log2(self.max_finite - below))

    @functools.cached_property
    def decode_table(self) -> np.ndarray | None:
        """float64 value of every field code (read-only), for fields up to 16 bits; else None."""
        if self.field_bits > 16:
            return None
        out = np.empty(1 << self.field_bits, dtype=np.float64)
        K.decode_array(np.arange(out.size, dtype=np.int64), self.kernel_params, out, 0, out.size)
        out.setflags(write=False)
        return out

    # Operations -----------------------------------------------------------------------
    def decode(self, codes) -> np.ndarray:
        """Exact float64 values of integer codes (any integer array; NaN for NaN codes)."""
        return self.decode_fields(self.field_codes(codes, f"decode({self.name})"))

    def field_codes(self, codes, where: str) -> np.ndarray:
        """Stored codes validated (integers in [0, 2^bits), padding bits zero) and shifted
        right by ``padding_bits``: the field codes that index per-code tables."""
        codes = np.asarray(codes)
        if not np.issubdtype(codes.dtype, np.integer):
            raise MxsimError(f"{where}: codes must be an integer array, got dtype {codes.dtype}")
        if codes.size and (codes.min() < 0 or int(codes.max()) >= (1 << self.bits)):
            raise MxsimError(f"{where}: codes must lie in [0, {1 << self.bits}) for {self.name}")
        if not self.padding_bits:
            return codes
        codes = codes.astype(np.int64)
        if codes.size and (codes & ((1 << self.padding_bits) - 1)).any():
            raise MxsimError(
                f"{where}: {self.name} codes keep their low {self.padding_bits} bits zero "
                f"(round values into the format with encode first)"
            )
        return codes >> self.padding_bits

    def decode_fields(self, codes: np.ndarray) -> np.ndarray:
        """Exact float64 values of field codes (stored codes without their padding)."""
        codes = np.asarray(codes)
        table = self.decode_table
        if table is not None:
            return table[codes]
        out = np.empty(codes.size, dtype=np.float64)
        flat = np.ascontiguousarray(codes, dtype=np.int64).ravel()
        with threads_for(out.size):
            run_in_threads(
                lambda start, stop: K.decode_array(flat, self.kernel_params, out, start, stop),
                out.size,
            )
        return out.reshape(codes.shape)

    def encode(
        self, x, rounding: str = "nearest_even", overflow: str = "saturate", seed: int = 0
    ) -> np.ndarray:
        """Codes of the values ``x``, each rounded once, exactly, from its float16/32/64 value.

        Args:
            x: a numpy float16, float32 or float64 array (or a Python float / list, taken as
                float64). Values are read exactly; there is no intermediate rounding.
            rounding: a mode of :data:`mxsim.formats.rounding.ROUNDING_MODES`.
            overflow: ``"saturate"``: magnitudes above ``max_finite`` (and ±Inf) give
                ±max_finite. ``"inf_nan"``: IEEE 754 overflow — ±Inf where the format has it,
                NaN where it has NaN but no Inf (fp8_e4m3: 465 → NaN), except that
                toward_zero and the directed mode toward the finite side give ±max_finite.
                ``"inf"``: as ``"inf_nan"`` but ±Inf for every rounding mode.
                Not accepted for formats with neither Inf nor NaN.
            seed: stochastic rounding's seed; the draw for element i depends on (seed, i).

        Returns codes of dtype :attr:`code_dtype`. NaN gives the canonical NaN code keeping
        the sign (quiet NaN for IEEE-like formats); a format without NaN rejects NaN inputs.
        Zero keeps its sign in sign-magnitude formats. Values below the smallest value of a
        format without zero (E8M0) give its smallest code; negative values in an unsigned
        format give NaN. Two's-complement formats produce the most negative code only when
        ``allow_min_twos_complement``.

        Rounding to nearest even into a format with a numpy float's layout (fp16, fp32,
        fp64) is numpy's own conversion, which is that rounding (IEEE 754), wherever this
        thread keeps subnormals; of float32 or float16 values into a format that is float32
        with fewer mantissa bits (bf16, tf32), integer arithmetic on float32's bit patterns;
        every other case runs the encode kernel.
        """
        values = as_float_array(x, f"encode({self.name})")
        rounding_mode = rounding_code(rounding)
        overflow_policy = overflow_code(overflow)
        if overflow != "saturate" and not self.has_nan:
            raise MxsimError(
                f"encode({self.name}): overflow={overflow!r} needs a format with Inf or NaN; use 'saturate'"
            )
        if not self.has_nan and np.isnan(values).any():
            raise MxsimError(
                f"encode({self.name}): input has NaN but the format has no NaN encoding"
            )
        native = native_float_dtype(self)
        if native is not None and rounding == "nearest_even" and subnormals_work():
            return self._encode_native(values, native, overflow)
        if rounding == "nearest_even" and values.dtype != np.float64 and _float32_prefix(self):
            return self._encode_float32_prefix(values.astype(np.float32), overflow)
        exponent_bits, mantissa_bits, bit_view = INPUT_FLOATS[values.dtype]
        # One kernel signature for every input and code width: bits and codes travel as uint64.
        flat = np.ascontiguousarray(values).reshape(-1).view(bit_view).astype(np.uint64, copy=False)
        out = np.empty(flat.size, dtype=np.uint64)
        arguments = (
            flat,
            exponent_bits,
            mantissa_bits,
            self.kernel_params,
            rounding_mode,
            overflow_policy,
            seed,
            out,
        )
        with threads_for(out.size):
            run_in_threads(lambda start, stop: K.encode_array(*arguments, start, stop), out.size)
        if self.padding_bits:
            out <<= out.dtype.type(self.padding_bits)
        return out.astype(self.code_dtype).reshape(values.shape)

    def _encode_float32_prefix(self, values: np.ndarray, overflow: str) -> np.ndarray:
        """:meth:`encode` rounding float32 ``values`` to nearest even into a format whose
        layout is float32's with fewer mantissa bits (bf16, tf32: :func:`_float32_prefix`), on
        the bit patterns: adding half an ulp of the kept bits less one, plus the kept LSB,
        carries exactly where nearest-even rounds up (into the exponent, and to the Inf
        pattern past the largest finite value, as IEEE 754 overflows; ``saturate`` clips the
        inputs to ±max_finite first). NaN gives the canonical NaN, keeping the sign."""
        shift = 23 - self.mantissa_bits
        with np.errstate(invalid="ignore"):
            if overflow == "saturate":
                values = np.clip(values, -self.max_finite, self.max_finite)  # (NaN stays NaN)
            bits = np.ascontiguousarray(values).view(np.uint32)
            half = np.uint32((1 << (shift - 1)) - 1)
            codes = (bits + half + ((bits >> np.uint32(shift)) & np.uint32(1))) >> np.uint32(shift)
        nan = np.isnan(values)
        if nan.any():
            codes[nan] = self.canonical_nans[np.signbit(values[nan]).astype(np.intp)]
        return (codes << np.uint32(self.padding_bits)).astype(self.code_dtype)

    @functools.cached_property
    def canonical_nans(self) -> np.ndarray:
        """The field codes (uint32, read-only) of the canonical +NaN and -NaN that
        :meth:`encode` writes (the encode kernel's, for formats with NaN)."""
        codes = self.encode(np.array([np.nan, -np.nan]), "toward_zero") >> self.padding_bits
        kept = codes.astype(np.uint32)
        kept.setflags(write=False)
        return kept

    def _encode_native(self, values: np.ndarray, native: np.dtype, overflow: str) -> np.ndarray:
        """:meth:`encode` rounding to nearest even into a format with a numpy float's layout
        (fp16, fp32, fp64): numpy's conversion (IEEE 754: one rounding, ties to even,
        subnormals, ±Inf beyond the largest finite value; the caller checked that this thread
        keeps subnormals), after ``saturate``'s clipping of the inputs to ±max_finite (a
        value beyond it rounds to it), and the canonical NaN, keeping the sign, that encode
        writes. The checks read the inputs (numpy's float16 arithmetic is slow)."""
        with np.errstate(over="ignore", invalid="ignore"):
            if np.dtype(native).itemsize > values.dtype.itemsize:
                values = values.astype(native)  # exact: then ±max_finite is an input value
            least, most = (float(values.min()), float(values.max())) if values.size else (0, 0)
            if overflow == "saturate" and not (
                -self.max_finite <= least and most <= self.max_finite
            ):
                values = np.clip(values, -self.max_finite, self.max_finite)  # (NaN stays NaN)
            codes = values.astype(native).view(self.code_dtype)  # (a copy: codes change below)
        if np.isnan(least):  # (a minimum propagates NaN)
            nan = np.isnan(values)
            quiet = ((1 << (self.exponent_bits + 1)) - 1) << (self.mantissa_bits - 1)
            sign = np.signbit(values[nan]).astype(self.code_dtype) << (self.bits - 1)
            codes[nan] = sign | self.code_dtype.type(quiet)
        return codes

    def round(
        self, x, rounding: str = "nearest_even", overflow: str = "saturate", seed: int = 0
    ) -> np.ndarray:
        """``decode(encode(x, ...))``: the values ``x`` rounded into this format, as float64."""
        return self.decode(self.encode(x, rounding=rounding, overflow=overflow, seed=seed))

    def value_of(self, code: int) -> Fraction | float:
        """Exact value of one code as a Fraction (float NaN/±Inf for specials)."""
        value = float(self.decode(np.array([code]))[0])
        return value if not math.isfinite(value) else Fraction(value)


def _magnitude_from_fields(fmt: FormatInfo, index: int) -> float:
    """The value of a finite magnitude index from the fields alone, as ``decode`` gives it:
    the table's constants need no kernel (defining a format compiles nothing)."""
    if fmt.exponent_bits == 0 or (fmt.subnormals and index >> fmt.mantissa_bits == 0):
        return math.ldexp(float(index), 1 - fmt.bias - fmt.mantissa_bits)
    significand = (index & ((1 << fmt.mantissa_bits) - 1)) | (1 << fmt.mantissa_bits)
    return math.ldexp(
        float(significand), (index >> fmt.mantissa_bits) - fmt.bias - fmt.mantissa_bits
    )


def _emax_from_fields(fmt: FormatInfo) -> int:
    """floor(log2(max_finite)) from the fields alone (kernel_params cannot call decode)."""
    index = fmt.max_index
    if fmt.exponent_bits == 0:
        return index.bit_length() - 1 + (1 - fmt.bias - fmt.mantissa_bits)
    exponent_field = index >> fmt.mantissa_bits
    if fmt.subnormals and exponent_field == 0:
        return index.bit_length() - 1 + (1 - fmt.bias - fmt.mantissa_bits)
    return exponent_field - fmt.bias


def as_float_array(x, where: str) -> np.ndarray:
    if isinstance(x, (int, float)) or (
        isinstance(x, (list, tuple)) and not isinstance(x, np.ndarray)
    ):
        try:
            x = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            raise MxsimError(
                f"{where}: expected numbers (a float array, or a list of numbers of one shape)"
            ) from None
    if not isinstance(x, np.ndarray):
        raise MxsimError(f"{where}: expected a numpy array of floats, got {type(x).__name__}")
    if x.dtype not in INPUT_FLOATS:
        raise MxsimError(
            f"{where}: expected float16, float32 or float64 values, got dtype {x.dtype}"
        )
    return x


def _table(*formats: FormatInfo) -> dict[str, FormatInfo]:
    return {fmt.name: fmt for fmt in formats}


_OCP: dict[str, Any] = dict(
    block_size=32, scale_bits=8
)  # OCP MX v1.0: one 8-bit E8M0 scale per 32 elements
# MX4/6/9 (Quark BFP "to_bfp_prime"): an 8-bit exponent per 16 elements, a 1-bit microexponent per 2.
_SHARED_MICROEXPONENT: dict[str, Any] = dict(
    role="bfp_element", block_size=16, scale_bits=8, subblock_size=2, microexponent_bits=1
)

FORMATS: dict[str, FormatInfo] = _table(
    # OCP MX v1.0 element formats. Aliases: Quark's MX config names, the OCP short names,
    # ml_dtypes' dtype names.
    FormatInfo(
        "fp8_e4m3",
        8,
        4,
        3,
        7,
        specials="nan_at_max",
        role="element",
        aliases=("MXFP8E4M3", "mxfp8_e4m3", "e4m3", "float8_e4m3fn"),
        **_OCP,
    ),
    FormatInfo(
        "fp8_e5m2",
        8,
        5,
        2,
        15,
        role="element",
        aliases=("MXFP8E5M2", "mxfp8_e5m2", "e5m2", "float8_e5m2"),
        **_OCP,
    ),
    FormatInfo(
        "fp6_e3m2",
        6,
        3,
        2,
        3,
        specials="none",
        role="element",
        aliases=("MXFP6E3M2", "mxfp6_e3m2", "e3m2", "float6_e3m2fn"),
        **_OCP,
    ),
    FormatInfo(
        "fp6_e2m3",
        6,
        2,
        3,
        1,
        specials="none",
        role="element",
        aliases=("MXFP6E2M3", "mxfp6_e2m3", "e2m3", "float6_e2m3fn"),
        **_OCP,
    ),
    FormatInfo(
        "fp4_e2m1",
        4,
        2,
        1,
        1,
        specials="none",
        role="element",
        aliases=("MXFP4E2M1", "mxfp4", "mxfp4_e2m1", "e2m1", "float4_e2m1fn"),
        **_OCP,
    ),
    # MX INT8: two's complement with an implicit 2^-6 (1 - bias - mantissa_bits = -6).
    FormatInfo(
        "int8",
        8,
        0,
        7,
        0,
        twos_complement=True,
        specials="none",
        role="element",
        aliases=("MXINT8", "mxint8"),
        **_OCP,
    ),
    # E8M0 scales: 2^(code - 127), 0xFF = NaN (E8M0_NAN), no sign, no zero.
    FormatInfo(
        "e8m0",
        8,
        8,
        0,
        E8M0_BIAS,
        signed=False,
        specials="nan_at_max",
        subnormals=False,
        role="scale",
        aliases=("float8_e8m0fnu",),
    ),
    # UE4M3 scales (NVFP4, Blackwell kind::mxf4nvf4 block16): E4M3 without its sign bit, so
    # 7 bits (stored in a byte whose top bit the hardware ignores); 0x7F is NaN, 448 the largest.
    FormatInfo(
        "ue4m3",
        7,
        4,
        3,
        7,
        signed=False,
        specials="nan_at_max",
        role="scale",
        aliases=("float8_ue4m3", "e4m3_unsigned"),
    ),
    # Shared-microexponent (MX4/MX6/MX9) elements as the datapath sees them: sign and an
    # integer M <= 2^m (m + 1 magnitude bits: Quark's CUDA stochastic rounding can reach 2^m,
    # its CPU kernel saturates at 2^m - 1), valued M * 2^(1 - m); the sub-block's
    # 2^(E - 127 - d) travels as an E8M0-style scale.
    # In memory: 1 sign + 2/4/7 mantissa bits (storage_bits), averaging 4/6/9 bits per element.
    FormatInfo("mx4", 4, 0, 3, -1, specials="none", storage_bits=3, **_SHARED_MICROEXPONENT),
    FormatInfo("mx6", 6, 0, 5, -1, specials="none", storage_bits=5, **_SHARED_MICROEXPONENT),
    FormatInfo("mx9", 9, 0, 8, -1, specials="none", storage_bits=8, **_SHARED_MICROEXPONENT),
    # Wide formats for accumulators and outputs.
    FormatInfo("fp32", 32, 8, 23, 127, role="wide", aliases=("float32",)),
    FormatInfo("fp16", 16, 5, 10, 15, role="wide", aliases=("float16",)),
    FormatInfo("bf16", 16, 8, 7, 127, role="wide", aliases=("bfloat16",)),
    # IEEE binary64 (FP64 tensor cores and MFMA; a value of every other format is one of its).
    FormatInfo("fp64", 64, 11, 52, 1023, role="wide", aliases=("float64",)),
    # The "fnuz" FP8 formats (AMD MI300 / CDNA3; ml_dtypes float8_e4m3fnuz, float8_e5m2fnuz):
    # every exponent field finite, bias one more than OCP's, the code 0x80 (-0) the only NaN,
    # no Inf, one zero.
    FormatInfo(
        "fp8_e4m3fnuz",
        8,
        4,
        3,
        8,
        specials="nan_at_negative_zero",
        role="tensor_input",
        aliases=("e4m3fnuz", "float8_e4m3fnuz"),
    ),
    FormatInfo(
        "fp8_e5m2fnuz",
        8,
        5,
        2,
        16,
        specials="nan_at_negative_zero",
        role="tensor_input",
        aliases=("e5m2fnuz", "float8_e5m2fnuz"),
    ),
    # NVIDIA TensorFloat-32: fp32's sign and exponent with 10 fraction bits, stored as fp32
    # bit patterns whose low 13 bits are zero (tensor cores read only the top 19 bits).
    FormatInfo(
        "tf32", 32, 8, 10, 127, padding_bits=13, role="tensor_input", aliases=("tensorfloat32",)
    ),
)


def format_names(*roles: str) -> tuple[str, ...]:
    """Table keys of the formats with one of ``roles``, in table order."""
    return tuple(name for name, fmt in FORMATS.items() if fmt.role in roles)


def _lookup_table() -> dict[str, str]:
    lookup: dict[str, str] = {}
    for key, fmt in FORMATS.items():
        for name in (key, *fmt.aliases):
            if lookup.setdefault(name.lower(), key) != key:
                raise MxsimError(
                    f"format name {name!r} is given to both {lookup[name.lower()]!r} and {key!r}"
                )
    return lookup


_LOOKUP = _lookup_table()


def get_format(name: str | FormatInfo) -> FormatInfo:
    """The format called ``name``: a table key or one of its ``aliases`` (``MXFP8E4M3``,
    ``mxfp4``, ``e2m1``, ``float8_e4m3fn``, ...), case-insensitive."""
    if isinstance(name, FormatInfo):
        return name
    if isinstance(name, str) and name.lower() in _LOOKUP:
        return FORMATS[_LOOKUP[name.lower()]]
    raise UnknownNameError(
        "format", name, [n for fmt in FORMATS.values() for n in (fmt.name, *fmt.aliases)]
    )


def custom_format(
    exponent_bits: int,
    mantissa_bits: int,
    bias: int | None = None,
    specials: str = "none",
    subnormals: bool = True,
    name: str | None = None,
) -> FormatInfo:
    """A signed sign-magnitude ExMy format from the same fields as the table's.

    ``bias`` defaults to ``2^(exponent_bits - 1) - 1``. Example: ``custom_format(3, 4)``
    is an E3M4 with no Inf/NaN. Every value must be exact in float64: exponent_bits 1..11,
    mantissa_bits 0..52, and a bias keeping the largest binade at most 2^1023 and the
    smallest subnormal at least 2^-1074.
    """
    exponent_bits = check_int(exponent_bits, "custom_format: exponent_bits", 1, 11)
    mantissa_bits = check_int(mantissa_bits, "custom_format: mantissa_bits", 0, 52)
    lowest, highest = (1 << exponent_bits) - 1 - 1023, 1075 - mantissa_bits
    bias = (
        (1 << (exponent_bits - 1)) - 1
        if bias is None
        else check_int(bias, "custom_format: bias", lowest, highest)
    )
    check_choice(specials, "custom_format: specials", SPECIALS)
    if not isinstance(subnormals, bool):
        raise ArgumentError(
            f"custom_format: subnormals: expected True or False, got {subnormals!r}"
        )
    if name is not None and not isinstance(name, str):
        raise ArgumentError(f"custom_format: name: expected a string or None, got {name!r}")
    return FormatInfo(
        name or f"e{exponent_bits}m{mantissa_bits}",
        1 + exponent_bits + mantissa_bits,
        exponent_bits,
        mantissa_bits,
        bias,
        specials=specials,
        subnormals=subnormals,
    )


def _float32_prefix(fmt: FormatInfo) -> bool:
    """Whether ``fmt``'s codes are float32's bit patterns with their low mantissa bits dropped
    (bf16, tf32): float32's exponent field, bias, IEEE specials and subnormals, fewer
    mantissa bits."""
    return (
        fmt.exponent_bits,
        fmt.bias,
        fmt.signed,
        fmt.twos_complement,
        fmt.specials,
        fmt.subnormals,
        fmt.bits - fmt.padding_bits,
    ) == (8, 127, True, False, "ieee", True, 9 + fmt.mantissa_bits) and fmt.mantissa_bits < 23


@functools.lru_cache(maxsize=None)
def native_float_dtype(fmt: FormatInfo):
    """The numpy float dtype with ``fmt``'s IEEE binary layout (fp16, fp32, fp64), or None:
    its codes are that dtype's bit patterns."""
    for dtype, (exponent_bits, mantissa_bits, _) in INPUT_FLOATS.items():
        if (
            fmt.bits,
            fmt.exponent_bits,
            fmt.mantissa_bits,
            fmt.bias,
            fmt.signed,
            fmt.twos_complement,
            fmt.specials,
            fmt.subnormals,
            fmt.padding_bits,
        ) == (
            1 + exponent_bits + mantissa_bits,
            exponent_bits,
            mantissa_bits,
            (1 << (exponent_bits - 1)) - 1,
            True,
            False,
            "ieee",
            True,
            0,
        ):
            return dtype
    return None
