"""Tests of mxsim.golden.corners: corner labels mean what they say.

Claims are checked with the independent exact model of test_golden_model (exact_value).
"""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import pytest

from mxsim.golden import GoldenUnit, corner_cases
from test_golden_model import decode_element, decode_fp32, exact_value

FP32_MAX = Fraction((1 << 24) - 1) * Fraction(2) ** 104
FP4 = GoldenUnit("t", "0", "fp4_e2m1", "fp4_e2m1")


@pytest.fixture(scope="module")
def fp4_corners():
    return corner_cases(FP4, None, np.random.default_rng(0))


def exact(vectors, i, unit=FP4):
    return exact_value(
        vectors.a[i],
        vectors.b[i],
        vectors.scale_a[i],
        vectors.scale_b[i],
        vectors.c[i],
        unit.a_format,
        unit.b_format,
    )


def spacing(x: Fraction) -> Fraction:
    """FP32 spacing at |x| (2^-149 in the subnormal range)."""
    m = abs(x)
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if Fraction(2) ** e > m:
        e -= 1
    return Fraction(2) ** (max(e, -126) - 23)


def ulp_fraction(x: Fraction) -> Fraction:
    """Where x lies between its FP32 neighbours, in [0, 1): 1/2 is a tie."""
    q = x / spacing(x)
    return q - (q.numerator // q.denominator)


def labelled(vectors, pattern):
    found = [i for i, label in enumerate(vectors.labels) if re.fullmatch(pattern, label)]
    assert found, f"no corner labelled {pattern}"
    return found


def test_exact_ties_are_midpoints_and_near_ties_are_not(fp4_corners):
    ties = labelled(
        fp4_corners,
        r"tie_(even_down|odd_up)_e-?\d+_j\d+|tie_carry_.*|tie_subnormal_m\d+_(plus|minus)_half_(pos|neg)",
    )
    for i in ties:
        value = exact(fp4_corners, i)
        assert value.kind == "finite" and ulp_fraction(value.value) == Fraction(1, 2), (
            fp4_corners.labels[i]
        )
    near = labelled(fp4_corners, r"tie_.*(tiny|plus_half_plus_2\^-\d+).*")
    for i in near:
        where = ulp_fraction(exact(fp4_corners, i).value)
        # off the midpoint by a quarter ulp or less: only the bits below the round bit decide
        assert where != Fraction(1, 2) and Fraction(1, 4) <= where <= Fraction(3, 4), (
            fp4_corners.labels[i]
        )


def test_ties_cover_every_fp32_binade(fp4_corners):
    exponents = {
        int(m.group(1))
        for label in fp4_corners.labels
        if (m := re.fullmatch(r"tie_odd_up_e(-?\d+)_j\d+", label))
    }
    assert exponents == set(range(-126, 128))


def test_tie_rounding_direction_labels(fp4_corners):
    """'even_down' keeps c, 'odd_up' moves one ulp away from zero: the exact model agrees."""
    from test_golden_model import round_to_fp32

    pattern = r"tie_(even_down|odd_up|even_plus_tiny_up|odd_minus_tiny_down)_e-?\d+_j\d+"
    for i in labelled(fp4_corners, pattern):
        label, c = fp4_corners.labels[i], int(fp4_corners.c[i])
        rounded = round_to_fp32(exact(fp4_corners, i).value)
        moves = re.fullmatch(pattern, label).group(1).endswith("up")
        assert rounded == (c + 1 if moves else c), label  # +1 on the bits: one ulp away from zero


def test_cancellation_corners(fp4_corners):
    for i in labelled(fp4_corners, r"cancel_block_vs_c_exact(_neg)?"):
        value = exact(fp4_corners, i)
        assert value.kind == "finite" and value.value == 0
    for i in labelled(fp4_corners, r"cancel_long_(neg_)?2\^(\d+)\+1_.*_e(-?\d+)"):
        e = int(re.search(r"_e(-?\d+)$", fp4_corners.labels[i]).group(1))
        assert abs(exact(fp4_corners, i).value) == Fraction(2) ** e  # all leading bits cancelled


def test_cancellation_when_max_times_max_blocks_exceed_fp32():
    """bf16 x fp4: 32 lanes of max x max sum past FP32's range, so the exact-cancellation
    corners take the largest product whose block is an FP32 value."""
    unit = GoldenUnit("t", "0", "bf16", "fp4_e2m1")
    vectors = corner_cases(unit, None, np.random.default_rng(0))
    rows = labelled(vectors, r"cancel_block_vs_c_exact(_neg)?")
    assert len(rows) == 2
    for i in rows:
        value = exact(vectors, i, unit)
        assert value.kind == "finite" and value.value == 0
        assert (
            abs(decode_fp32(int(vectors.c[i])).value) > FP32_MAX / 8
        )  # still near the top of the range


def test_overflow_corners(fp4_corners):
    (i,) = labelled(fp4_corners, r"overflow_max_plus_half_ulp_tie_pos")
    assert exact(fp4_corners, i).value == FP32_MAX + Fraction(2) ** 103
    (i,) = labelled(fp4_corners, r"overflow_block_2\^128_vs_c_minus_max_pos")
    assert (
        exact(fp4_corners, i).value == Fraction(2) ** 104
    )  # a block past the range cancelled back in
    for i in labelled(fp4_corners, r"overflow_all_max_block_scale_sum_\d+"):
        assert exact(fp4_corners, i).kind == "finite"
    sums = sorted(
        int(label.rsplit("_", 1)[1])
        for label in fp4_corners.labels
        if label.startswith("overflow_all_max_block_scale_sum_")
    )
    # 1152 * 2^(s - 254) first reaches the round-to-Inf threshold (2 - 2^-24) 2^127 at s = 372
    assert {371, 372} <= set(sums) and max(sums) == 508


def test_alignment_corners_are_what_they_say(fp4_corners):
    for i in labelled(fp4_corners, r"align_c_2\^(-?\d+)_minus_2\^-(\d+)"):
        e0, d = map(
            int, re.fullmatch(r"align_c_2\^(-?\d+)_minus_2\^-(\d+)", fp4_corners.labels[i]).groups()
        )
        assert exact(fp4_corners, i).value == Fraction(2) ** e0 - Fraction(2) ** (e0 - d)
    shifts = {
        int(m.group(1))
        for label in fp4_corners.labels
        if (m := re.fullmatch(r"align_c_2\^0_plus_2\^-(\d+)", label))
    }
    assert {23, 24, 25, 26} <= shifts  # around the 24-bit output significand


def test_special_corners(fp4_corners):
    for i in labelled(fp4_corners, r"nan_scale_.*"):
        assert 0xFF in (int(fp4_corners.scale_a[i, 0]), int(fp4_corners.scale_b[i, 0]))
    for i in labelled(fp4_corners, r"nan_c_.*"):
        assert decode_fp32(int(fp4_corners.c[i])).kind == "nan"
    for i in labelled(fp4_corners, r"inf_c_.*"):
        assert decode_fp32(int(fp4_corners.c[i])).kind == "inf"
    scales = {
        (int(fp4_corners.scale_a[i, 0]), int(fp4_corners.scale_b[i, 0]))
        for i in range(len(fp4_corners))
    }
    assert {(0, 0), (254, 254), (0, 254), (254, 0)} <= scales


def test_zero_sign_corners(fp4_corners):
    for i in labelled(fp4_corners, r"neg_zero_products_neg_zero_c|neg_zero_a_products_neg_zero_c"):
        value = exact(fp4_corners, i)
        assert value.value == 0 and value.negative  # every addend -0
    for i in labelled(
        fp4_corners,
        r"neg_zero_products_but_one_pos_zero_neg_zero_c|neg_zero_times_neg_zero_products_neg_zero_c",
    ):
        value = exact(fp4_corners, i)
        assert value.value == 0 and not value.negative


def test_subnormal_element_corners_use_subnormal_codes(fp4_corners):
    for i in labelled(fp4_corners, r"subnormal_min_sub_x_min_sub_.*"):
        assert decode_element(int(fp4_corners.a[i, 0]), "fp4_e2m1").value in (
            Fraction(1, 2),
            Fraction(-1, 2),
        )


def test_corner_families_present_for_formats_with_specials():
    unit = GoldenUnit("t", "0", "fp8_e5m2", "fp8_e4m3", block_size=32, dot_length=64)
    corners = corner_cases(unit, None, np.random.default_rng(0))
    assert labelled(corners, r"inf_element_a_pos_and_neg")
    assert labelled(corners, r"nan_element_b_.*")
    assert labelled(corners, r"nan_scale_a_last_block")
    i = labelled(corners, r"inf_element_a_pos_and_neg")[0]
    assert exact(corners, i, unit).kind == "nan"
    assert corners.scale_a.shape == (len(corners), 2)


def test_corners_for_unscaled_units_keep_unit_scales():
    unit = GoldenUnit("t", "0", "fp8_e4m3", "fp8_e4m3", scaled=False)
    corners = corner_cases(unit, None, np.random.default_rng(0))
    assert corners.scale_a is None and len(corners) > 100
    assert not any(label.startswith(("nan_scale", "scale_")) for label in corners.labels)


def test_corners_depend_only_on_the_generator_state():
    one = corner_cases(FP4, None, np.random.default_rng(5))
    two = corner_cases(FP4, None, np.random.default_rng(5))
    assert (
        one.labels == two.labels and np.array_equal(one.c, two.c) and np.array_equal(one.a, two.a)
    )
