"""Exact bit helpers on Python ints and Fractions, for the slow twins and the code that sets
up the fast routes (never called by a Numba kernel: each kernel has its own in its module).
"""

from __future__ import annotations

from fractions import Fraction


def floor_log2(value: Fraction | int) -> int:
    """The e with 2^e <= value < 2^(e+1) of a positive rational, by exact comparison."""
    value = Fraction(value)
    exponent = value.numerator.bit_length() - value.denominator.bit_length()
    return exponent if Fraction(2) ** exponent <= value else exponent - 1


def odd_part_bits(value: int) -> int:
    """The bit length of ``value``'s odd part (``value`` with its trailing zero bits dropped):
    the significand bits it needs; 0 for 0."""
    value = abs(value)
    if value == 0:
        return 0
    return (value >> ((value & -value).bit_length() - 1)).bit_length()
