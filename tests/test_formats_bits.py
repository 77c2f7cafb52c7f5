"""mxsim.formats.bits: floor_log2 and odd_part_bits against their definitions, by brute force."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mxsim.formats.bits import floor_log2, odd_part_bits


@given(
    st.fractions(min_value=Fraction(1, 2**200), max_value=Fraction(2**200)).filter(lambda v: v > 0)
)
def test_floor_log2_brackets_the_value_between_powers_of_two(value):
    e = floor_log2(value)
    assert Fraction(2) ** e <= value < Fraction(2) ** (e + 1)


@pytest.mark.parametrize(
    "value, expected",
    [
        (1, 0),
        (2, 1),
        (3, 1),
        (Fraction(1, 2), -1),
        (Fraction(3, 4), -1),
        (Fraction(1, 3), -2),
        (2**100 - 1, 99),
        (Fraction(1, 2**60), -60),
    ],
)
def test_floor_log2_known_values(value, expected):
    assert floor_log2(value) == expected


def test_odd_part_bits_counts_the_bits_between_the_lowest_and_highest_one():
    for value in range(-300, 301):
        digits = bin(abs(value))[2:].rstrip("0")  # the odd part, written out
        assert odd_part_bits(value) == len(digits)
