"""Tests of mxsim.golden.vectors: hex packing, header, parsing back."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mxsim.errors import MxsimError
from mxsim.golden import GoldenUnit, VectorSet, format_lines, layout_for, parse_vector_text
from mxsim.golden.vectors import header_lines, hex_column


def test_hex_column_puts_item_zero_in_the_last_digit():
    assert hex_column(np.array([[1, 2, 3]]), 4, 3).tolist() == ["321"]
    assert hex_column(np.array([[0xAB, 0x01]]), 8, 4).tolist() == ["01ab"]


def test_hex_column_packs_six_bit_items_across_digits():
    # item0 = 0b111111, item1 = 0b000001 -> 0b000001_111111 = 0x07f
    assert hex_column(np.array([[0x3F, 0x01]]), 6, 3).tolist() == ["07f"]
    assert hex_column(np.array([[0x3F]]), 6, 2).tolist() == ["3f"]


def test_hex_column_refuses_values_wider_than_the_field():
    with pytest.raises(MxsimError):
        hex_column(np.array([[16]]), 4, 1)


def random_vectors(unit, n, seed):
    from mxsim import get_format

    rng = np.random.default_rng(seed)
    fa, fb, fd = (get_format(x) for x in (unit.a_format, unit.b_format, unit.out_format))
    nb = unit.dot_length // unit.block_size
    return VectorSet(
        a=rng.integers(0, 1 << fa.bits, (n, unit.dot_length)).astype(np.uint8),
        b=rng.integers(0, 1 << fb.bits, (n, unit.dot_length)).astype(np.uint8),
        scale_a=rng.integers(0, 256, (n, nb)).astype(np.uint8) if unit.scaled else None,
        scale_b=rng.integers(0, 256, (n, nb)).astype(np.uint8) if unit.scaled else None,
        c=rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32),
        d=rng.integers(0, 1 << fd.bits, n, dtype=np.uint64).astype(np.uint32),
    )


UNITS = [
    GoldenUnit("u", "0", "fp4_e2m1", "fp4_e2m1"),
    GoldenUnit("u", "0", "fp6_e3m2", "fp8_e5m2", block_size=16, dot_length=48),
    GoldenUnit("u", "0", "fp6_e2m3", "fp4_e2m1", block_size=1, dot_length=3, out_format="bf16"),
    GoldenUnit("u", "0", "fp8_e4m3", "int8", scaled=False),
]


@given(
    unit_index=st.integers(0, len(UNITS) - 1), n=st.integers(0, 20), seed=st.integers(0, 2**32 - 1)
)
def test_written_text_parses_back_to_the_same_vectors(unit_index, n, seed):
    unit = UNITS[unit_index]
    layout = layout_for(unit)
    vectors = random_vectors(unit, n, seed)
    text = "\n".join(
        header_lines(layout, unit, mxsim_version="x", seed=0, kind="random", count=n)
        + format_lines(layout, vectors)
    )
    parsed_layout, parsed = parse_vector_text(text)
    assert parsed_layout == layout
    for name in layout.names:
        assert np.array_equal(parsed.column(name), vectors.column(name)), name


def test_lines_are_readmemh_numbers_with_underscores():
    unit = UNITS[1]
    layout = layout_for(unit)
    lines = format_lines(layout, random_vectors(unit, 5, 1))
    digits = [f.hex_digits for f in layout.fields]
    for line in lines:
        assert re.fullmatch(r"[0-9a-f_]+", line)
        assert [len(part) for part in line.split("_")] == digits
    for line in header_lines(layout, unit, mxsim_version="x", seed=0, kind="random", count=5):
        assert line.startswith("// ")


def test_the_word_concatenates_fields_most_significant_first():
    unit = UNITS[0]
    layout = layout_for(unit)
    vectors = random_vectors(unit, 1, 3)
    word = int(format_lines(layout, vectors)[0].replace("_", ""), 16)
    assert word & 0xFFFFFFFF == int(vectors.d[0])
    assert word >> 32 & 0xFFFFFFFF == int(vectors.c[0])
    assert word >> 64 & 0xFF == int(vectors.scale_b[0, 0])
    assert word >> 72 & 0xFF == int(vectors.scale_a[0, 0])
    for i in range(32):
        assert word >> (80 + 4 * i) & 0xF == int(vectors.b[0, i])
        assert word >> (208 + 4 * i) & 0xF == int(vectors.a[0, i])


def good_text():
    unit = UNITS[0]
    layout = layout_for(unit)
    lines = header_lines(layout, unit, mxsim_version="x", seed=0, kind="random", count=2)
    return lines, format_lines(layout, random_vectors(unit, 2, 5))


def test_malformed_files_are_refused_with_the_line():
    header, data = good_text()
    with pytest.raises(MxsimError, match=r"<vectors>:\d+: expected fields"):
        parse_vector_text("\n".join(header + [data[0], data[1][:-1]]))
    with pytest.raises(MxsimError, match="not hexadecimal"):
        parse_vector_text("\n".join(header + [data[0], "g" + data[1][1:]]))
    with pytest.raises(MxsimError, match="no '// field' header"):
        parse_vector_text("\n".join(data))


def test_nonzero_padding_bits_are_refused():
    unit = GoldenUnit("u", "0", "fp6_e2m3", "fp6_e2m3", block_size=1, dot_length=1)
    layout = layout_for(unit)
    header = header_lines(layout, unit, mxsim_version="x", seed=0, kind="random", count=1)
    with pytest.raises(MxsimError, match="padding bits of field 'a'"):
        parse_vector_text("\n".join(header + ["ff_00_7f_7f_00000000_00000000"]))


def test_read_vector_file_refuses_non_ascii_and_over_budget_files(tmp_path, monkeypatch):
    from mxsim.errors import BudgetError, InputFileError
    from mxsim.golden import read_vector_file

    latin1 = tmp_path / "latin1.hex"
    latin1.write_bytes("// field caf\u00e9\n".encode("latin-1"))
    with pytest.raises(
        InputFileError, match=r"latin1.hex: not ASCII text \(byte 0xe9 at offset 12\)"
    ):
        read_vector_file(latin1)
    sparse = tmp_path / "sparse.hex"
    with open(sparse, "wb") as handle:  # 5 GiB that take no disk: refused on its size, never read
        handle.truncate(5 << 30)
    monkeypatch.setenv("MXSIM_MAX_BYTES", "4G")
    with pytest.raises(
        InputFileError, match="sparse.hex: reading the vector file .* more than the memory budget"
    ):
        read_vector_file(sparse)
    with pytest.raises(InputFileError, match="no such file"):
        read_vector_file(tmp_path / "absent.hex")
    assert not issubclass(InputFileError, BudgetError)


def test_a_header_without_a_required_field_is_an_mxsim_error():
    # found by the fuzz family "files" (a mutated header dropped a field line: KeyError before)
    unit = GoldenUnit("cfg", "0" * 64, "fp4_e2m1", "fp4_e2m1")
    layout = layout_for(unit)
    vectors = VectorSet(
        a=np.zeros((1, 32), np.uint8),
        b=np.zeros((1, 32), np.uint8),
        scale_a=np.full((1, 1), 127, np.uint8),
        scale_b=np.full((1, 1), 127, np.uint8),
        c=np.zeros(1, np.uint32),
        d=np.zeros(1, np.uint32),
    )
    text = (
        "\n".join(
            header_lines(layout, unit, mxsim_version="x", seed=0, kind="random", count=1)
            + format_lines(layout, vectors)
        )
        + "\n"
    )
    assert parse_vector_text(text)[1].a.shape == (1, 32)
    for name in ("b", "c"):
        lines = [line for line in text.splitlines() if not line.startswith(f"// field {name} ")]
        assert len(lines) == len(text.splitlines()) - 1
        with pytest.raises(
            MxsimError, match="expected a, b, c, d and optionally scale_a, scale_b, each once"
        ):
            parse_vector_text("\n".join(lines))


def test_64_bit_fields_round_trip_and_wider_items_are_refused():
    unit = GoldenUnit(
        "cfg",
        "0" * 64,
        "fp64",
        "fp64",
        block_size=2,
        dot_length=2,
        scaled=False,
        out_format="fp64",
        c_format="fp64",
    )
    layout = layout_for(unit)
    top = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
    vectors = VectorSet(
        a=np.array([[top, 1]], np.uint64),
        b=np.array([[0x8000_0000_0000_0000, 2]], np.uint64),
        scale_a=None,
        scale_b=None,
        c=np.array([top], np.uint64),
        d=np.array([0x7FF8 << 48], np.uint64),
    )
    text = (
        "\n".join(
            header_lines(layout, unit, mxsim_version="x", seed=0, kind="random", count=1)
            + format_lines(layout, vectors)
        )
        + "\n"
    )
    assert text.splitlines()[-1] == (
        "0000000000000001ffffffffffffffff_00000000000000028000000000000000_"
        "ffffffffffffffff_7ff8000000000000"
    )
    _, back = parse_vector_text(text)
    for name in ("a", "b", "c", "d"):
        assert getattr(back, name).dtype == np.uint64 and np.array_equal(
            getattr(back, name), getattr(vectors, name)
        )
    wider = text.replace("(1 x 64): accumulator", "(1 x 65): accumulator")
    with pytest.raises(
        MxsimError, match="field 'c' declares 1 items of 65 bits; expected items of 1..64 bits"
    ):
        parse_vector_text(wider)
