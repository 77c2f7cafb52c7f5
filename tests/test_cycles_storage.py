"""Operand storage: element packing and scale/microexponent bytes, derived by hand."""

import pytest

from mxsim.cycles.storage import FORMAT_STORAGE, OperandStorage, StorageBytes, storage_for_format
from mxsim.errors import UnknownNameError


def test_plain_words_have_no_scales():
    # 1-byte words, as SCALE-Sim: a 7 x 5 operand is 35 bytes
    assert OperandStorage.plain(1).operand_bytes(7, 5) == StorageBytes(35, 0)
    # 2-byte words: 7 x 5 x 2
    assert OperandStorage.plain(2).operand_bytes(7, 5) == StorageBytes(70, 0)


@pytest.mark.parametrize(
    "name, element_bytes, scale_bytes",
    [
        # one row of 64 elements
        ("fp8_e4m3", 64, 2),  # 64 x 8 bits; 2 blocks of 32 -> two 8-bit scales
        ("fp6_e3m2", 48, 2),  # 64 x 6 = 384 bits = 48 bytes
        ("fp4_e2m1", 32, 2),  # 64 x 4 = 256 bits = 32 bytes
        ("int8", 64, 2),
        # MX9/6/4: 4 blocks of 16 -> 4 x 8 = 32 bits; 32 subblocks of 2 -> 32 x 1 bit; 64 bits = 8 B
        ("mx9", 64, 8),  # 1 sign + 7 mantissa = 8 bits each
        ("mx6", 40, 8),  # 1 + 4 = 5 bits: 320 bits = 40 bytes
        ("mx4", 24, 8),  # 1 + 2 = 3 bits: 192 bits = 24 bytes
        ("bf16", 128, 0),
        ("fp32", 256, 0),
    ],
)
def test_one_row_of_64_elements(name, element_bytes, scale_bytes):
    assert storage_for_format(name).row_bytes(64) == StorageBytes(element_bytes, scale_bytes)


def test_mx_formats_average_their_nominal_bits_per_element():
    # MX9 is 9 bits per element, MX6 6, MX4 4 (elements + shared metadata), over a long row
    for name, bits in [("mx9", 9), ("mx6", 6), ("mx4", 4)]:
        row = storage_for_format(name).row_bytes(1024)
        assert row.total_bytes * 8 == bits * 1024


def test_partial_block_still_carries_a_scale_and_rows_pad_to_bytes():
    fp4 = storage_for_format("fp4_e2m1")
    # 33 elements: 132 bits -> 17 bytes (padded); 2 blocks (32 + 1) -> 2 scale bytes
    assert fp4.row_bytes(33) == StorageBytes(17, 2)
    # 3 elements (an RGB pixel): 12 bits -> 2 bytes; one scale byte; 5 rows -> times 5
    assert fp4.operand_bytes(5, 3) == StorageBytes(10, 5)


def test_microexponent_bits_round_with_scales_not_elements():
    mx4 = storage_for_format("mx4")
    # 3 elements: 9 bits -> 2 bytes; 1 block scale (8 bits) + 2 subblocks (2 bits) = 10 bits -> 2
    assert mx4.row_bytes(3) == StorageBytes(2, 2)


def test_lookup_takes_the_format_table_names_and_rejects_unknown_ones():
    assert storage_for_format("MX9") is FORMAT_STORAGE["mx9"]
    with pytest.raises(UnknownNameError) as caught:
        storage_for_format("fp5_e2m2")
    assert "fp4_e2m1" in str(caught.value)


@pytest.mark.parametrize(
    "arguments",
    [
        dict(element_bits=0, block_size=32),
        dict(element_bits=8, block_size=0),
        dict(element_bits=8, block_size=16, subblock_size=3, microexponent_bits=1),
        dict(element_bits=8, block_size=16, microexponent_bits=1),
        dict(element_bits=8, block_size=None, subblock_size=2),
        dict(element_bits=8, block_size=32, scale_bits=-1),
    ],
)
def test_inconsistent_storage_is_refused(arguments):
    with pytest.raises(ValueError):
        OperandStorage(**arguments)
