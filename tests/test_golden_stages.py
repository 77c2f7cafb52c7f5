"""Tests of mxsim.golden.stages: exact-arithmetic stage records and the explain adapter."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np

from conftest import REPO
from mxsim.datapath import load_hwconfig
from mxsim.golden import GoldenUnit, VectorSet, exact_stages
from mxsim.golden.stages import datapath_stage_fn, json_safe

FP4 = GoldenUnit("t", "0", "fp4_e2m1", "fp4_e2m1")


def one_vector(unit, lanes, scale_a=127, scale_b=127, c_bits=0):
    a = np.zeros((1, unit.dot_length), dtype=np.uint8)
    b = np.zeros((1, unit.dot_length), dtype=np.uint8)
    for lane, (x, y) in enumerate(lanes):
        a[0, lane], b[0, lane] = x, y
    nb = unit.dot_length // unit.block_size
    return VectorSet(
        a,
        b,
        np.full((1, nb), scale_a, np.uint8),
        np.full((1, nb), scale_b, np.uint8),
        np.array([c_bits], dtype=np.uint32),
        labels=["hand"],
    )


def on_grid(value: Fraction, lsb: int) -> str:
    units = value / Fraction(2) ** lsb
    assert units.denominator == 1
    return f"-0x{-units.numerator:x}" if units < 0 else f"0x{units.numerator:x}"


def test_exact_stages_of_a_hand_worked_vector():
    # lanes: 1.0 x 1.0 = 1 and 6 x -6 = -36; scales 2^0; c = 0.5. Sum -34.5.
    record = exact_stages(FP4, one_vector(FP4, [(0x2, 0x2), (0x7, 0xF)], c_bits=0x3F000000))[0]
    assert record["product_lsb_exponent"] == -2  # fp4 values are multiples of 1/2
    assert record["lsb_exponent"] == -149  # FP32 c's grid is finer than the products'
    assert record["scale_exponents"] == [0]
    assert record["products"][0][:3] == [4, -144, 0]  # in quarters
    assert record["aligned"][0][:2] == [on_grid(Fraction(1), -149), on_grid(Fraction(-36), -149)]
    assert record["accumulator"][0] == on_grid(Fraction(1), -149)
    assert record["accumulator"][-1] == on_grid(Fraction(-35), -149)
    assert record["c"] == on_grid(Fraction(1, 2), -149)
    assert record["exact_sum"] == on_grid(Fraction(-69, 2), -149)


def test_exact_stages_grid_follows_tiny_scales():
    # 0.5 x 0.5 at scales 0 + 0: 2^-2 x 2^-254 = 2^-256, below FP32's grid.
    record = exact_stages(FP4, one_vector(FP4, [(0x1, 0x1)], 0, 0))[0]
    assert record["lsb_exponent"] == -2 - 254
    assert record["exact_sum"] == "0x1"


def test_exact_stages_specials_and_signed_zero():
    record = exact_stages(FP4, one_vector(FP4, [(0x2, 0x2)], scale_a=0xFF))[0]
    assert record["scale_exponents"] == [None] and record["exact_sum"] == "nan"
    assert set(record["aligned"][0]) == {"nan"}
    record = exact_stages(FP4, one_vector(FP4, [(0x0, 0xA)], c_bits=0x80000000))[0]  # +0 x -1
    assert record["products"][0][0] == "-0" and record["c"] == "0x0"
    e5m2 = GoldenUnit("t", "0", "fp8_e5m2", "fp8_e5m2")
    inf, neg_inf, one = 0x7C, 0xFC, 0x3C
    record = exact_stages(e5m2, one_vector(e5m2, [(inf, one), (neg_inf, one)]))[0]
    assert record["accumulator"][:2] == ["inf", "nan"] and record["exact_sum"] == "nan"
    record = exact_stages(e5m2, one_vector(e5m2, [(inf, one)], c_bits=0xFF800000))[0]
    assert (
        record["accumulator"][0] == "inf" and record["c"] == "-inf" and record["exact_sum"] == "nan"
    )
    record = exact_stages(e5m2, one_vector(e5m2, [(inf, 0x00)]))[0]  # Inf x 0
    assert record["products"][0][0] == "nan"


def test_exact_stages_two_blocks():
    unit = GoldenUnit("t", "0", "fp4_e2m1", "fp4_e2m1", block_size=2, dot_length=4)
    vectors = one_vector(
        unit, [(0x2, 0x2), (0, 0), (0x2, 0x2)], scale_a=128
    )  # block scales 2^1 each
    record = exact_stages(unit, vectors)[0]
    assert record["scale_exponents"] == [1, 1]
    assert record["accumulator"][-1] == on_grid(Fraction(4), -149)


def test_json_safe_replaces_non_finite_floats():
    value = {"a": [math.nan, math.inf, -math.inf, 1.5, np.int64(3)], "b": (np.float32("nan"),)}
    assert json_safe(value) == {"a": ["nan", "inf", "-inf", 1.5, 3], "b": ["nan"]}
    json.dumps(json_safe(value), allow_nan=False)


def test_datapath_stage_fn_records_agree_with_dot():
    from mxsim.golden import dot_expected_fn, fill_expected, make_cases, units_from_hwconfig

    hw = load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml")
    (unit,) = units_from_hwconfig(hw, pairs=[("fp4_e2m1", "fp4_e2m1")])
    vectors = fill_expected(make_cases(unit, "random", 40, 3), dot_expected_fn(hw, unit))
    records = datapath_stage_fn(hw, unit)(vectors)
    assert len(records) == 40
    for record, bits in zip(records, vectors.d):
        assert record["source"] == "mxsim.explain" and record["stages"]
        assert record["bits"] == int(bits)
        json.dumps(record, allow_nan=False)
