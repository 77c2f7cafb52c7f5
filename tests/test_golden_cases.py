"""Tests of mxsim.golden.cases: random and exhaustive cases cover what they claim.

Claims are checked with the independent exact model of test_golden_model (exact_value).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from mxsim.errors import MxsimError
from mxsim.golden import GoldenUnit, exhaustive_cases, random_cases
from test_golden_model import decode_fp32, exact_value

FP4 = GoldenUnit("t", "0", "fp4_e2m1", "fp4_e2m1")


def test_random_cases_shapes_mix_and_determinism():
    unit = GoldenUnit("t", "0", "fp4_e2m1", "fp6_e3m2", block_size=32, dot_length=64)
    vectors = random_cases(unit, 400, np.random.default_rng(1))
    assert (
        vectors.a.shape == (400, 64)
        and vectors.scale_b.shape == (400, 2)
        and vectors.c.dtype == np.uint32
    )
    assert int(vectors.a.max()) < 16 and int(vectors.b.max()) < 64
    names = {label.split("_c_")[0] for label in vectors.labels}
    assert names == {
        "random_uniform_codes",
        "random_mx_gaussian",
        "random_mx_sparse",
        "random_mx_outliers",
    }
    assert {label.split("_c_")[1] for label in vectors.labels} == {
        "zero",
        "near_block",
        "any_finite",
        "cancel",
    }
    again = random_cases(unit, 400, np.random.default_rng(1))
    other = random_cases(unit, 400, np.random.default_rng(2))
    assert np.array_equal(vectors.a, again.a) and np.array_equal(vectors.c, again.c)
    assert not np.array_equal(vectors.a, other.a)


def test_random_cancel_mode_really_cancels():
    vectors = random_cases(FP4, 600, np.random.default_rng(3))
    for i, label in enumerate(vectors.labels):
        if label.endswith("_c_cancel"):
            value = exact_value(
                vectors.a[i],
                vectors.b[i],
                vectors.scale_a[i],
                vectors.scale_b[i],
                vectors.c[i],
                FP4.a_format,
                FP4.b_format,
            )
            block = value.value - decode_fp32(int(vectors.c[i])).value
            assert abs(value.value) <= abs(block) * Fraction(
                1, 2**20
            )  # c is the FP32 nearest to -block


def test_exhaustive_fp4_puts_every_pair_in_every_lane():
    vectors = exhaustive_cases(FP4, None, None)
    assert len(vectors) == 256 * 32 + 256
    isolated = vectors.a[: 256 * 32], vectors.b[: 256 * 32]
    seen = set()
    for a_row, b_row in zip(*isolated):
        lanes = np.flatnonzero((a_row != 0) | (b_row != 0))
        assert len(lanes) <= 1
        lane = int(lanes[0]) if len(lanes) else None
        seen.add(
            (
                lane,
                int(a_row[lane]) if lane is not None else 0,
                int(b_row[lane]) if lane is not None else 0,
            )
        )
    for lane in range(32):
        assert {(a, b) for seen_lane, a, b in seen if seen_lane == lane} | {(0, 0)} == {
            (a, b) for a in range(16) for b in range(16)
        }
    rotation_a, rotation_b = vectors.a[256 * 32 :], vectors.b[256 * 32 :]
    for lane in range(32):
        assert len(set(zip(rotation_a[:, lane].tolist(), rotation_b[:, lane].tolist()))) == 256
    assert (vectors.c == 0).all() and (vectors.scale_a == 127).all()


def test_exhaustive_large_spaces():
    fp6 = exhaustive_cases(GoldenUnit("t", "0", "fp6_e2m3", "fp6_e2m3"), None, None)
    assert len(fp6) == 64 * 64  # rotation only: 4096 x 32 isolated vectors would exceed the limit
    with pytest.raises(MxsimError, match="exhaustive"):
        exhaustive_cases(GoldenUnit("t", "0", "fp16", "fp16"), None, None)
