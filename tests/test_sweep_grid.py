"""Sweep grid: --vary parsing, validation of key paths and values before anything runs."""

from __future__ import annotations

import pytest

from conftest import REPO
from mxsim.datapath import load_hwconfig
from mxsim.errors import ArgumentError, BudgetError, ConfigError, MxsimError
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
    assert len({c.digest for _, c in points}) == 4 and BASE.digest not in {
        c.digest for _, c in points
    }


@pytest.mark.parametrize(
    "option, message",
    [
        ("adder.nope=1,2", "adder.nope: unknown key path; accepted: inputs.a_formats"),
        ("fused_terms=8", "unknown key path; accepted:"),
        ("adder.fused_terms", "expected KEY=VALUES"),
        ("adder.fused_terms=", "expected KEY=VALUES"),
        ("adder.fused_terms=8,,16", "empty value"),
        ("adder.fused_terms=8,8", "repeated"),
        ("adder.fused_terms=16:8", "a <= b"),
        ("adder.fused_terms=8:16:0", "step >= 1"),
        ("adder.fused_terms=8:x", "not an integer"),
        (
            "accumulator.format=fp32:bf16",
            "accumulator.format: a range 'fp32:bf16' needs an integer key",
        ),
        ("adder.term_order=null", "adder.term_order: cannot be varied"),
        ("inputs.format_groups=null", "inputs.format_groups: cannot be varied"),
    ],
)
def test_bad_vary_options(option, message):
    with pytest.raises(MxsimError, match=message.replace("[", r"\[")):
        parse_knobs([option], "base.yaml")


@pytest.mark.parametrize(
    "options, message",
    [
        (
            ["adder.align_fraction_bits=8,99"],
            "h100-fp8.yaml: adder.align_fraction_bits: expected an integer 0..50, got 99 "
            r"\(at sweep point adder.align_fraction_bits=99\)",
        ),
        (
            ["accumulator.format=fp32,tf32"],
            "accumulator.format: expected one of fp32, fp16, bf16, fp64, exact, got 'tf32'",
        ),
        (["adder.fused_terms=eight"], "adder.fused_terms: expected an integer, got 'eight'"),
        (
            ["adder.align_fraction_bits=null,13", "adder.carry_bits=2"],
            r"adder.carry_bits: needs a window .* \(at sweep point adder.align_fraction_bits=null,adder.carry_bits=2\)",
        ),
    ],
)
def test_bad_values_are_found_before_running(options, message):
    knobs = parse_knobs(options, "base.yaml")
    with pytest.raises(ConfigError, match=message):
        grid_configs(BASE, knobs)


def test_each_key_once_and_at_least_one():
    with pytest.raises(MxsimError, match="each key path once"):
        parse_knobs(["adder.fused_terms=8", "adder.fused_terms=16"])
    with pytest.raises(MxsimError, match="at least one"):
        parse_knobs([])


@pytest.mark.parametrize(
    "option, error, message",
    [
        # Range ends beyond the key's bounds, refused on the text (no range is built).
        (
            "accumulator.promotion_interval=1:99999999999999999999",
            ConfigError,
            "accumulator.promotion_interval: the range '1:99999999999999999999' leaves the key's values 1..1073741824",
        ),
        (
            "adder.fused_terms=1:" + "9" * 5000,
            ArgumentError,
            "is not an integer of at most 40 digits",
        ),
        ("adder.fused_terms=0x10:0x20", ArgumentError, "'0x10' is not an integer"),
        # A range within the key's bounds but too long for a grid.
        (
            "accumulator.promotion_interval=1:1073741824",
            BudgetError,
            "1073741824 values; a knob and a grid hold at most 10000",
        ),
        # YAML values that are not plain scalars (PyYAML raises ValueError, KeyError on these).
        ("adder.fused_terms=2001-13-45", ArgumentError, "'2001-13-45' is not a plain value"),
        ("adder.fused_terms=!!bool x", ArgumentError, "'!!bool x' is not a plain value"),
        ("adder.fused_terms=!!float x", ArgumentError, "'!!float x' is not a plain value"),
        ("adder.fused_terms=&a 8", ArgumentError, "is not a plain value"),
        ("adder.fused_terms=[8]", ArgumentError, "is not a plain value"),
        ("adder.fused_terms=2001-12-01", ArgumentError, "reads as a date"),
        ("adder.fused_terms=" + ",".join(map(str, range(10_001))), BudgetError, "10001 values"),
    ],
)
def test_hostile_vary_text_is_refused_before_any_value_is_built(option, error, message):
    with pytest.raises(error, match=message.replace("[", r"\[").replace("(", r"\(")) as caught:
        parse_knobs([option], "base.yaml")
    assert len(str(caught.value)) < 400  # the option is cut short in the message


def test_grid_size_is_computed_and_refused_before_any_point_is_built(monkeypatch):
    import mxsim.sweep.grid as grid

    monkeypatch.setattr(
        grid, "vary_hwconfig", lambda *args, **kwargs: pytest.fail("a point was built")
    )
    options = ["multiplier.product_fraction_bits=0:52", "inputs.block_size=1:4096"]
    with pytest.raises(BudgetError, match=r"the grid has 53 x 4096 = 217088 points; at most 10000"):
        parse_knobs(options)
    knobs = [parse_knob(option) for option in options]  # each knob alone is within bounds
    with pytest.raises(BudgetError, match="217088 points"):
        grid_configs(BASE, knobs)
