"""Tests of mxsim.golden.layout: units and the bit layout of a vector word."""

from __future__ import annotations

import pytest

from conftest import REPO
from mxsim.datapath import load_hwconfig
from mxsim.errors import ConfigError, MxsimError
from mxsim.golden import GoldenUnit, layout_for, units_from_hwconfig


def unit(a="fp4_e2m1", b="fp4_e2m1", k=32, K=32, **kw):
    return GoldenUnit("test-unit", "ab" * 32, a, b, block_size=k, dot_length=K, **kw)


def slices(layout):
    return [(f.name, f.msb, f.lsb, f.bits, f.items, f.item_bits) for f in layout.fields]


def test_fp4_layout_is_the_one_the_test_bench_slices():
    # 32 x 4-bit codes per operand, one scale each, c and d: 128+128+8+8+32+32 = 336 bits.
    layout = layout_for(unit())
    assert layout.word_bits == 336 and layout.hex_digits == 84
    assert slices(layout) == [
        ("a", 335, 208, 128, 32, 4),
        ("b", 207, 80, 128, 32, 4),
        ("scale_a", 79, 72, 8, 1, 8),
        ("scale_b", 71, 64, 8, 1, 8),
        ("c", 63, 32, 32, 1, 32),
        ("d", 31, 0, 32, 1, 32),
    ]


def test_six_bit_elements_pack_without_padding_per_element():
    layout = layout_for(unit("fp6_e3m2", "fp8_e4m3"))
    a, b = layout.field("a"), layout.field("b")
    assert (a.bits, a.hex_digits, a.item_bits) == (192, 48, 6)  # 32 x 6 bits = 48 hex digits
    assert (b.bits, b.hex_digits) == (256, 64)


def test_field_padding_to_whole_hex_digits():
    layout = layout_for(unit("fp6_e2m3", "fp6_e2m3", k=1, K=1))
    a = layout.field("a")
    assert a.bits == 6 and a.width == 8 and a.hex_digits == 2
    assert layout.word_bits == 8 + 8 + 8 + 8 + 32 + 32


def test_several_blocks_give_packed_scale_fields():
    layout = layout_for(unit(k=32, K=96))
    assert layout.field("scale_a").items == 3 and layout.field("scale_a").bits == 24
    assert layout.field("a").bits == 96 * 4


def test_unscaled_unit_has_no_scale_fields():
    layout = layout_for(unit("fp8_e4m3", "fp8_e5m2", scaled=False))
    assert layout.names == ("a", "b", "c", "d")
    assert layout.word_bits == 256 + 256 + 32 + 32
    assert unit(scaled=False).n_blocks == 0


def test_fp16_output_is_sixteen_bits():
    assert layout_for(unit(out_format="bf16")).field("d").bits == 16


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(k=32, K=48),
        dict(k=0, K=32),
        dict(out_format="fp8_e4m3"),
        dict(c_format="fp16"),
        dict(c_format="bf16"),
    ],
)
def test_invalid_units_are_refused(kwargs):
    with pytest.raises(MxsimError):
        unit(**kwargs)


def test_fp64_unit_has_64_bit_codes_c_and_d():
    layout = layout_for(
        unit("fp64", "fp32", k=4, K=4, scaled=False, out_format="fp64", c_format="fp64")
    )
    assert slices(layout) == [
        ("a", 511, 256, 256, 4, 64),
        ("b", 255, 128, 128, 4, 32),
        ("c", 127, 64, 64, 1, 64),
        ("d", 63, 0, 64, 1, 64),
    ]
    assert layout.field("c").meaning == "accumulator input, FP64 bits"


def test_units_from_hwconfig_take_fp64_c_from_the_config():
    (dmma,) = units_from_hwconfig(load_hwconfig(REPO / "hwconfigs" / "a100-dmma.yaml"))
    assert (dmma.a_format, dmma.c_format, dmma.out_format) == ("fp64", "fp64", "fp64")
    assert all(
        u.c_format == "fp32"
        for u in units_from_hwconfig(load_hwconfig(REPO / "hwconfigs" / "h100-fp8.yaml"))
    )


def test_quark_names_are_normalised():
    assert unit("MXFP4E2M1", "MXFP8E4M3").pair_name == "fp4_e2m1xfp8_e4m3"
    assert unit().file_stem("corners") == "test-unit.fp4_e2m1xfp4_e2m1.corners"


OCP_EXACT = REPO / "hwconfigs" / "ocp-exact.yaml"


@pytest.fixture(scope="module")
def ocp_exact():
    return load_hwconfig(OCP_EXACT)


def test_units_from_hwconfig_cover_every_accepted_pair(ocp_exact):
    units = units_from_hwconfig(ocp_exact)
    assert len(units) == len(ocp_exact.a_formats) * len(ocp_exact.b_formats)
    first = units[0]
    assert first.config_name == ocp_exact.name and first.config_hash == ocp_exact.digest
    assert all(
        u.block_size == 32 and u.dot_length == 32 and u.scaled and u.out_format == "fp32"
        for u in units
    )


def test_units_from_hwconfig_pairs_and_dot_length(ocp_exact):
    (only,) = units_from_hwconfig(ocp_exact, pairs=[("MXFP4E2M1", "fp4_e2m1")], dot_length=64)
    assert only.pair_name == "fp4_e2m1xfp4_e2m1" and only.n_blocks == 2
    with pytest.raises(ConfigError):
        units_from_hwconfig(ocp_exact, pairs=[("fp4_e2m1", "fp16")])
