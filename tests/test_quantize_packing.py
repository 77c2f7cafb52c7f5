"""Packing: the documented bit order, round trips, and errors."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mxsim.errors import MxsimError
from mxsim.quantize.packing import pack_codes, unpack_codes


def test_fp4_two_per_byte_low_nibble_first():
    assert pack_codes(np.array([0x1, 0xA, 0xF]), 4).tolist() == [0xA1, 0x0F]


def test_fp6_four_codes_in_three_bytes():
    # stream (LSB first): c0=0b000001, c1=0b000010, c2=0b000011, c3=0b111111
    # byte0 = c0 | (c1 & 0b11) << 6 = 0b10000001; byte1 = c1 >> 2 | c2 << 4 = 0b00110000;
    # byte2 = c2 >> 4 | c3 << 2 = 0b11111100
    assert pack_codes(np.array([1, 2, 3, 63]), 6).tolist() == [0b10000001, 0b00110000, 0b11111100]


@given(bits=st.integers(1, 8), data=st.data())
def test_round_trip(bits, data):
    codes = np.array(
        data.draw(st.lists(st.integers(0, (1 << bits) - 1), max_size=50)), dtype=np.uint8
    )
    packed = pack_codes(codes, bits)
    assert packed.size == (codes.size * bits + 7) // 8
    np.testing.assert_array_equal(unpack_codes(packed, bits, codes.size), codes)


def test_errors():
    with pytest.raises(MxsimError, match="lie in"):
        pack_codes(np.array([16]), 4)
    with pytest.raises(MxsimError, match="fewer than"):
        unpack_codes(np.array([0], dtype=np.uint8), 4, 3)
