"""Sweep grid: --vary parsing, validation of key paths and values before anything runs."""

from __future__ import annotations

import pytest

from conftest import REPO
from mxsim.datapath import load_hwconfig
from mxsim.errors import ConfigError, MxsimError
from mxsim.sweep import grid_configs, parse_knob, parse_knobs

BASE = load_hwconfig(REPO / "hwconfigs" / "h100-fp8.yaml")


def test_ranges_lists_and_yaml_scalars():
    assert parse_knob("adder.align_fraction_bits=8:12").values == (8, 9, 10, 11, 12)
    assert parse_knob("adder.align_fraction_bits=8:28:10").values == (8, 18, 28)
    assert parse_knob("adder.fused_terms=8,16,32").values == (8, 16, 32)
    assert parse_knob("accumulator.format=fp32, bf16").values == ("fp32", "bf16")
    assert parse_knob("adder.sum_significant_bits=null,14").values == (None, 14)
    assert parse_knob("accumulator.subnormals=true,false").values == (True, False)


def test_grid_is_the_product_in_the_given_order():
    knobs = parse_knobs(["adder.align_fraction_bits=10,13", "accumulator.format=fp32,bf16"])
    points = grid_configs(BASE, knobs)
    assert [point for point, _ in points] == [
        {"adder.align_fraction_bits": 10, "accumulator.format": "fp32"},
        {"adder.align_fraction_bits": 10, "accumulator.format": "bf16"},
        {"adder.align_fraction_bits": 13, "accumulator.format": "fp32"},
        {"adder.align_fraction_bits": 13, "accumulator.format": "bf16"},
    ]
    config = points[1][1]
    assert config.sections[("adder", "align_fraction_bits")] == 10
    assert config.sections[("accumulator", "format")] == "bf16"
    assert config.name == "h100-fp8[adder.align_fraction_bits=10,accumulator.format=bf16]"
    params = config.params("fp8_e4m3", "fp8_e4m3")
    assert (params.align_fraction_bits, params.accumulator_format) == (10, "bf16")
    assert len({c.digest for _, c in points}) == 4 and BASE.digest not in {c.digest for _, c in points}


@pytest.mark.parametrize("option, message", [
    ("adder.nope=1,2", "adder.nope: unknown key path; accepted: inputs.a_formats"),
    ("fused_terms=8", "unknown key path; accepted:"),
    ("adder.fused_terms", "expected KEY=VALUES"),
    ("adder.fused_terms=", "expected KEY=VALUES"),
    ("adder.fused_terms=8,,16", "empty value"),
    ("adder.fused_terms=8,8", "repeated"),
    ("adder.fused_terms=16:8", "a <= b"),
    ("adder.fused_terms=8:16:0", "step >= 1"),
    ("adder.fused_terms=8:x", "not an integer"),
    ("accumulator.format=fp32:bf16", "accumulator.format: a range 'fp32:bf16' needs an integer key"),
    ("adder.term_order=null", "adder.term_order: cannot be varied"),
])
def test_bad_vary_options(option, message):
    with pytest.raises(MxsimError, match=message.replace("[", r"\[")):
        parse_knobs([option], "base.yaml")


@pytest.mark.parametrize("options, message", [
    (["adder.align_fraction_bits=8,99"], "h100-fp8.yaml: adder.align_fraction_bits: expected an integer 0..50, got 99 "
                                          r"\(at sweep point adder.align_fraction_bits=99\)"),
    (["accumulator.format=fp32,fp64"], "accumulator.format: expected one of fp32, fp16, bf16, exact, got 'fp64'"),
    (["adder.fused_terms=eight"], "adder.fused_terms: expected an integer, got 'eight'"),
    (["adder.align_fraction_bits=null,13", "adder.carry_bits=2"],
     r"adder.carry_bits: needs a window .* \(at sweep point adder.align_fraction_bits=null,adder.carry_bits=2\)"),
])
def test_bad_values_are_found_before_running(options, message):
    knobs = parse_knobs(options, "base.yaml")
    with pytest.raises(ConfigError, match=message):
        grid_configs(BASE, knobs)


def test_each_key_once_and_at_least_one():
    with pytest.raises(MxsimError, match="each key path once"):
        parse_knobs(["adder.fused_terms=8", "adder.fused_terms=16"])
    with pytest.raises(MxsimError, match="at least one"):
        parse_knobs([])
