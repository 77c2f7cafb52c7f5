"""Kernel-side setup shared by the datapath routes: per-code element tables and the n-bit
sum format. (The reference twin derives the same facts on its own.)"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..formats import FormatInfo, custom_format

ZERO_EXPONENT = -(1 << 40)


def alignment_emin(fmt: FormatInfo) -> int:
    """Smallest alignment exponent: 1 - bias, or for fixed point (MX INT8) emax."""
    return 1 - fmt.bias if fmt.exponent_bits else fmt.emax


@functools.lru_cache(maxsize=None)
def sum_format(bits: int) -> FormatInfo:
    """``adder.sum_significant_bits``: n significant bits with an exponent range no sum reaches
    (one object per width: its kernel parameters are worked out once)."""
    return custom_format(10, bits - 1, name=f"sum{bits}")


#: Formats up to this many field bits get a table of every code (tf32: 2^19 entries); wider
#: ones (fp32, fp64) none: the kernel decodes their codes' bit fields (:func:`element_operand`).
FULL_TABLE_BITS = 20
NO_TABLE = np.zeros(0, dtype=np.float64), np.zeros(0, dtype=np.int64)
for _empty in NO_TABLE:
    _empty.setflags(write=False)  # read-only as the tables are: one kernel signature for both


def products_fit_float64(a_fmt: FormatInfo, b_fmt: FormatInfo) -> bool:
    """Whether every product of an A and a B value times 2^s (|s| <= 254: two E8M0 scale
    exponents) is a float64: at most 53 significant bits, its lowest bit at or above 2^-1074,
    its magnitude below 2^1024. True for every pair of formats up to fp32; false with fp64."""
    bits = (a_fmt.mantissa_bits + 1) + (b_fmt.mantissa_bits + 1)
    lowest = math.log2(a_fmt.min_subnormal) + math.log2(b_fmt.min_subnormal)
    return bits <= 53 and lowest - 254 >= -1074 and a_fmt.emax + b_fmt.emax + 1 + 254 < 1024


@functools.lru_cache(maxsize=None)
def element_tables(fmt: FormatInfo, subnormals: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per field code: the exact value, and the alignment exponent max(floor(log2|v|), emin)."""
    return _tables_of(fmt, np.arange(1 << fmt.field_bits), subnormals)


def element_operand(fmt: FormatInfo, subnormals: bool) -> tuple[np.ndarray, np.ndarray]:
    """(values, exponents) the kernels take for an operand: the tables of every code, or, for
    a format wider than FULL_TABLE_BITS, empty tables: the kernel decodes each code from its
    bit fields (``_kernels.element``)."""
    if fmt.field_bits <= FULL_TABLE_BITS:
        return element_tables(fmt, subnormals)
    return NO_TABLE


def _tables_of(
    fmt: FormatInfo, fields: np.ndarray, subnormals: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(values, alignment exponents) of the given field codes."""
    values = fmt.decode_fields(fields).astype(np.float64)
    if not subnormals:
        tiny = (values != 0) & (np.abs(values) < fmt.min_normal)
        values = np.where(tiny, np.copysign(0.0, values), values)
    magnitude = np.abs(values)
    usable = np.isfinite(magnitude) & (magnitude > 0)
    # Zeros get a very negative exponent: they must never set a tree's alignment reference.
    exponents = np.full(values.shape, ZERO_EXPONENT, dtype=np.int64)
    exponents[usable] = np.maximum(np.frexp(magnitude[usable])[1] - 1, alignment_emin(fmt))
    values.setflags(write=False)
    exponents.setflags(write=False)
    return values, exponents


@functools.lru_cache(maxsize=None)
def scale_tables(fmt: FormatInfo) -> tuple[np.ndarray, np.ndarray]:
    """Per block-scale code (``inputs.scale_format``, read by ``scales: group_sum``): the exact
    value (NaN for the NaN code), and the alignment exponent floor(log2 s), at least emin when
    the format has subnormals (UE4M3: -6; E8M0 has none, its code 0 is 2^-127)."""
    values = fmt.decode_fields(np.arange(1 << fmt.field_bits)).astype(np.float64)
    usable = np.isfinite(values) & (values > 0)
    exponents = np.full(values.shape, ZERO_EXPONENT, dtype=np.int64)
    exponents[usable] = np.frexp(values[usable])[1] - 1
    if fmt.subnormals:
        exponents[usable] = np.maximum(exponents[usable], alignment_emin(fmt))
    values.setflags(write=False)
    exponents.setflags(write=False)
    return values, exponents
