"""Exact building blocks of crafted dot-product inputs, shared by the golden corner vectors
(:mod:`mxsim.golden.corners`) and the probe's input families (:mod:`mxsim.probe.draw`).

- FP32 bit patterns: :func:`fp32_bits_exact` of a value FP32 holds exactly (anything else is
  an error), :func:`fp32_bits_rounded` of float64 values rounded to nearest even.
- Dyadic rationals: :func:`exact_log2` of a power of two, :func:`odd_and_exponent`.
- Codes by value: :class:`CodeBook` (every code of a format up to 16 bits, by exact value),
  :func:`power_codes` (the code of each power of two a format of any width holds).
- Exact product pairs and sums: :class:`ProductTable` (every positive product of two formats,
  the pair of codes making it, and an integer realised as a sum of products), and
  :func:`exact_power_pair` (codes whose product is exactly 2^e).

Everything is built from the format table; nothing here knows a format by name.
"""

from __future__ import annotations

import bisect
import functools
import math
from fractions import Fraction

import numpy as np

from .errors import MxsimError
from .formats import get_format

F32_NAN = 0x7FC00000
F32_INF = 0x7F800000
F32_SIGN = 0x80000000


def fp32_bits_exact(value) -> int:
    """FP32 bits of the finite ``value`` (a Fraction, int or float FP32 holds exactly, -0.0
    included); an ``MxsimError`` for any value FP32 does not hold exactly (too many bits, past
    its range or below its smallest subnormal)."""
    try:
        as_float = float(value)
    except OverflowError:
        raise MxsimError(f"{value} is not exactly an FP32 value") from None
    with np.errstate(over="ignore"):
        single = np.array([as_float], dtype=np.float64).astype(np.float32)
    if not math.isfinite(float(single[0])) or Fraction(float(single[0])) != Fraction(value):
        raise MxsimError(f"{value} is not exactly an FP32 value")
    return int(single.view(np.uint32)[0])


def fp32_bits_rounded(values) -> np.ndarray:
    """float64 ``values`` rounded to FP32 (to nearest even; past its range +-Inf, NaN kept), as
    uint32 bit patterns."""
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=np.float32).view(np.uint32)


def exact_log2(value: Fraction) -> int:
    """log2 of a positive power of two (an ``MxsimError`` for any other value)."""
    value = Fraction(value)
    numerator, denominator = value.numerator, value.denominator
    if numerator <= 0 or numerator & (numerator - 1) or denominator & (denominator - 1):
        raise MxsimError(f"{value} is not a power of two")
    return numerator.bit_length() - denominator.bit_length()


def odd_and_exponent(value: Fraction) -> tuple[int, int]:
    """(m, t) with value = m·2^t and m odd, of a positive dyadic rational (an ``MxsimError`` for
    a denominator that is not a power of two)."""
    value = Fraction(value)
    numerator, denominator = value.numerator, value.denominator
    if denominator & (denominator - 1):
        raise MxsimError(f"{value} is not dyadic")
    t = -(denominator.bit_length() - 1)
    shift = (numerator & -numerator).bit_length() - 1
    return numerator >> shift, t + shift


class CodeBook:
    """The codes of one element format by value: zeros, ±1, max, smallest, subnormals, NaN, Inf
    (every code decoded exactly: for formats up to 16 bits). Shared (:func:`code_book`): its
    values are read-only and its sequences tuples."""

    def __init__(self, name: str):
        self.fmt = fmt = get_format(name)
        codes = np.arange(1 << fmt.bits)
        values = fmt.decode(codes)
        values.setflags(write=False)
        self.values = values
        self.sign_magnitude = fmt.signed and not fmt.twos_complement
        finite = np.isfinite(values)
        self.by_value: dict[Fraction, int] = {}
        for code in codes[finite]:  # first code of each value: +0 before -0 keeps 0 canonical
            self.by_value.setdefault(Fraction(float(values[code])), int(code))
        self.zero = 0
        self.negative_zero = (1 << (fmt.bits - 1)) if self.sign_magnitude else None
        positive = tuple(
            sorted((Fraction(float(values[c])), int(c)) for c in codes[finite & (values > 0)])
        )
        self.positive = positive  # (value, code), ascending
        self.min_positive = positive[0][1]
        self.max = positive[-1][1]
        self.one = self.code(Fraction(1))
        self.subnormals = tuple(
            c for v, c in positive if fmt.exponent_bits and v < Fraction(fmt.min_normal)
        )
        self.nans = tuple(int(c) for c in codes[np.isnan(values)])
        self.infs = tuple(int(c) for c in codes[np.isinf(values)])
        self.positive_inf = next((c for c in self.infs if values[c] > 0), None)
        self.negative_inf = next((c for c in self.infs if values[c] < 0), None)

    def code(self, value: Fraction) -> int:
        """The code of the finite ``value`` (KeyError if the format does not hold it)."""
        return self.by_value[Fraction(value)]

    def value(self, code: int) -> Fraction:
        return Fraction(float(self.values[code]))

    def negate(self, code: int) -> int:
        """The code of minus the value of ``code`` (−0 for +0 in sign-magnitude formats)."""
        if code == self.zero:
            return self.negative_zero if self.negative_zero is not None else self.zero
        if self.sign_magnitude:
            return code ^ (1 << (self.fmt.bits - 1))
        return self.code(-self.value(code))


@functools.lru_cache(maxsize=8)
def code_book(name: str) -> CodeBook:
    """The :class:`CodeBook` of a format, built once per process (fp16's takes seconds: every
    code's exact value), shared by the format pairs and runs that use it; read only."""
    return CodeBook(name)


class ProductTable:
    """Positive element products a·b as integers in units of the smallest product 2^quantum_exponent.

    ``pair[units]`` is the smallest (A code, B code) pair whose product is exactly ``units``
    quanta; :meth:`realize` writes an integer as a sum of such products (greedy, largest
    first), which lets corner cases ask for an exact block sum.
    """

    def __init__(self, a: CodeBook, b: CodeBook):
        qa, qb = a.value(a.min_positive), b.value(b.min_positive)
        self.quantum_exponent = exact_log2(qa) + exact_log2(qb)
        a_items = [(int(v / qa), c) for v, c in a.positive]
        b_items = [(int(v / qb), c) for v, c in b.positive]
        # wide formats: all of one side times powers of two
        wide = len(a_items) * len(b_items) > (1 << 16)
        b_powers = [(u, c) for u, c in b_items if u & (u - 1) == 0] if wide else b_items
        # For each product, the smallest (A code, B code) pair giving it: codes go from the
        # largest down and a smaller one overwrites (fp16 x bf16 has millions of candidates,
        # too many to list and sort).
        descending = sorted(b_items, key=lambda item: item[1], reverse=True)
        descending_powers = sorted(b_powers, key=lambda item: item[1], reverse=True)
        best: dict[int, tuple[int, int]] = {}
        for ua, ca in sorted(a_items, key=lambda item: item[1], reverse=True):
            right = descending if not wide or ua & (ua - 1) == 0 else descending_powers
            best.update({ua * ub: (ca, cb) for ub, cb in right})
        self.units = sorted(best)
        self.pair = best

    def realize(self, units: int, lanes: int) -> list[tuple[int, int]] | None:
        """(A code, B code) pairs, at most ``lanes`` of them, whose products sum to ``units``; None if not found."""
        pairs: list[tuple[int, int]] = []
        remaining = units
        while remaining > 0:
            if len(pairs) == lanes:
                return None
            index = bisect.bisect_right(self.units, remaining) - 1
            take = self.units[index]
            pairs.append(self.pair[take])
            remaining -= take
        return pairs


#: The powers of two :func:`power_codes` looks for: 2^-160 to 2^159 (past every element
#: format's products that a dot of the probe's reaches).
POWER_EXPONENTS = np.arange(-160, 160)
POWER_EXPONENTS.setflags(write=False)


def power_codes(fmt) -> dict[int, int]:
    """exponent y -> the code of 2^y, for every power of two from 2^-160 to 2^159 the format
    (a ``FormatInfo`` of any width) holds exactly, ascending."""
    powers = np.exp2(POWER_EXPONENTS.astype(float))
    exact = fmt.decode(fmt.encode(powers)) == powers
    return dict(
        zip(POWER_EXPONENTS[exact].tolist(), fmt.encode(powers[exact]).astype(np.uint64).tolist())
    )


def exact_power_pair(
    a_powers: dict[int, int],
    b_powers: dict[int, int],
    exponent: int,
    a_least: float = 0.0,
    b_least: float = 0.0,
) -> tuple[int, int] | None:
    """Codes (a, b) whose product is exactly 2^exponent, from two formats' :func:`power_codes`,
    the a element the smallest power that has a partner; each element at least ``a_least`` /
    ``b_least`` (the formats' smallest normals: both elements normal). None where no two such
    powers make it."""
    for y, code in a_powers.items():
        if exponent - y in b_powers and 2.0**y >= a_least and 2.0 ** (exponent - y) >= b_least:
            return int(code), int(b_powers[exponent - y])
    return None
