"""Tests of mxsim.exact: the building blocks the golden corners and the probe's families share.

Values are checked with the independent decoders and FP32 rounding of test_golden_model
(fields read from the bits, ``fractions.Fraction`` arithmetic), never with mxsim's formats.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mxsim.errors import MxsimError
from mxsim.exact import (
    code_book,
    CodeBook,
    ProductTable,
    exact_log2,
    exact_power_pair,
    fp32_bits_exact,
    fp32_bits_rounded,
    odd_and_exponent,
    power_codes,
)
from mxsim.formats import get_format
from test_golden_model import decode_element, decode_fp32, round_to_fp32

FP32_FINITE = st.integers(0, 0xFFFFFFFF).filter(lambda bits: bits >> 23 & 0xFF != 0xFF)


@settings(max_examples=300, deadline=None)
@given(FP32_FINITE)
def test_fp32_bits_exact_gives_the_bits_of_every_fp32_value(bits):
    value = decode_fp32(bits)
    want = bits if value.value != 0 else (bits & 0x80000000 if value.negative else 0)
    # Fraction has no -0: only the float -0.0 carries the sign of a zero
    given_value = -0.0 if value.value == 0 and value.negative else value.value
    assert fp32_bits_exact(given_value) == want


@pytest.mark.parametrize(
    "value",
    [
        Fraction(1) + Fraction(1, 1 << 24),  # one bit past FP32's 24
        Fraction(1, 3),  # not dyadic
        Fraction(2) ** 128,  # past the range
        Fraction(2) ** -150,  # half the smallest subnormal
        Fraction(2) ** 2000,  # past float64 too
    ],
)
def test_fp32_bits_exact_refuses_values_fp32_does_not_hold(value):
    with pytest.raises(MxsimError, match="not exactly an FP32 value"):
        fp32_bits_exact(value)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=True))
def test_fp32_bits_rounded_rounds_to_nearest_even(value):
    got = int(fp32_bits_rounded([value])[0])
    if value == 0:
        assert got == (0x80000000 if np.signbit(value) else 0)
    else:
        assert got == round_to_fp32(Fraction(value))


def test_fp32_bits_rounded_keeps_specials():
    got = fp32_bits_rounded([np.inf, -np.inf, np.nan, 1e300])
    assert [int(x) for x in got[[0, 1, 3]]] == [0x7F800000, 0xFF800000, 0x7F800000]
    assert got[2] >> 23 & 0xFF == 0xFF and got[2] & 0x7FFFFF


def test_exact_log2_and_odd_and_exponent():
    assert [exact_log2(Fraction(2) ** e) for e in (-149, -1, 0, 7, 300)] == [-149, -1, 0, 7, 300]
    for value in (Fraction(3), Fraction(3, 4), Fraction(0), Fraction(-2)):
        with pytest.raises(MxsimError, match="not a power of two"):
            exact_log2(value)
    assert odd_and_exponent(Fraction(3, 4)) == (3, -2)
    assert odd_and_exponent(Fraction(40)) == (5, 3)
    assert odd_and_exponent(Fraction(2) ** -149) == (1, -149)
    with pytest.raises(MxsimError, match="not dyadic"):
        odd_and_exponent(Fraction(1, 3))


@pytest.mark.parametrize("name", ["fp4_e2m1", "fp6_e3m2", "fp8_e4m3", "fp8_e5m2"])
def test_power_codes_are_every_power_of_two_the_format_holds(name):
    fmt = get_format(name)
    want = {}
    for code in range(1 << fmt.bits):
        value = decode_element(code, name)
        if value.kind == "finite" and value.value > 0:
            numerator, denominator = value.value.numerator, value.value.denominator
            if numerator & (numerator - 1) == 0 and denominator & (denominator - 1) == 0:
                exponent = numerator.bit_length() - denominator.bit_length()
                if -160 <= exponent < 160:
                    want[exponent] = code
    assert power_codes(fmt) == want


def test_exact_power_pairs_multiply_to_the_power_asked():
    a_name, b_name = "fp8_e4m3", "fp6_e2m3"
    a_powers, b_powers = (power_codes(get_format(name)) for name in (a_name, b_name))
    lowest = min(a_powers) + min(b_powers)
    highest = max(a_powers) + max(b_powers)
    least = (get_format(a_name).min_normal, get_format(b_name).min_normal)
    for exponent in range(lowest - 2, highest + 3):
        pair = exact_power_pair(a_powers, b_powers, exponent)
        assert (pair is None) == (not lowest <= exponent <= highest)
        normal = exact_power_pair(a_powers, b_powers, exponent, *least)
        for found in filter(None, (pair, normal)):
            a, b = decode_element(found[0], a_name), decode_element(found[1], b_name)
            assert a.value * b.value == Fraction(2) ** exponent
        if normal:
            assert decode_element(normal[0], a_name).value >= Fraction(least[0])
            assert decode_element(normal[1], b_name).value >= Fraction(least[1])
    assert exact_power_pair(a_powers, b_powers, lowest, *least) is None  # needs subnormals


def test_product_table_realizes_every_small_sum_exactly():
    A = B = CodeBook("fp4_e2m1")
    table = ProductTable(A, B)
    assert table.quantum_exponent == -2
    for units in range(0, 2001):
        pairs = table.realize(units, 32)
        assert pairs is not None and len(pairs) <= 32
        total = sum(
            decode_element(a, "fp4_e2m1").value * decode_element(b, "fp4_e2m1").value
            for a, b in pairs
        )
        assert total == units * Fraction(1, 4)
    assert table.realize(144 * 32 + 1, 32) is None  # past 32 lanes of 6 x 6


def test_product_table_pairs_make_their_products():
    A, B = CodeBook("fp8_e4m3"), CodeBook("fp6_e3m2")
    table = ProductTable(A, B)
    quantum = Fraction(2) ** table.quantum_exponent
    for units, (a, b) in table.pair.items():
        product = decode_element(a, "fp8_e4m3").value * decode_element(b, "fp6_e3m2").value
        assert product == units * quantum
    assert min(table.pair) == 1  # the smallest product is the quantum


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp4_e2m1", "int8"])
def test_kept_code_books_cannot_be_changed_in_place(name):
    """A code book is built once per process and shared: its values refuse an in-place
    write and its sequences are tuples."""
    book = code_book(name)
    assert not book.values.flags.writeable
    for sequence in (book.positive, book.subnormals, book.nans, book.infs):
        assert isinstance(sequence, tuple)
