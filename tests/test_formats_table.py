"""Formats: kernels against the Fraction reference twin, ml_dtypes as an oracle, corners."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import NARROW_FORMATS, SIXTEEN_BIT_OR_LESS, same_float
from mxsim.errors import MxsimError, UnknownNameError
from mxsim.formats import (
    E8M0_BIAS,
    E8M0_NAN,
    FORMATS,
    ROUNDING_MODES,
    custom_format,
    format_names,
    get_format,
)
from mxsim.formats.reference import decode_reference, draw32_reference, encode_reference
from mxsim.formats.table import native_float_dtype

ALL_FORMATS = list(FORMATS)
INT8_NO_MINUS_TWO = dataclasses.replace(FORMATS["int8"], allow_min_twos_complement=False)
E3M4 = custom_format(3, 4)
E5M3_IEEE = custom_format(5, 3, specials="ieee")


def overflow_policies(fmt):
    return ["saturate", "inf_nan"] if fmt.has_nan else ["saturate"]


# --- the table --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, max_finite, scale_emax, min_subnormal",
    [
        ("fp8_e4m3", 448.0, 8, 2.0**-9),
        ("fp8_e5m2", 57344.0, 15, 2.0**-16),
        ("fp6_e3m2", 28.0, 4, 2.0**-4),
        ("fp6_e2m3", 7.5, 2, 2.0**-3),
        ("fp4_e2m1", 6.0, 2, 0.5),
        ("int8", 127 / 64, 0, 2.0**-6),
        ("e8m0", 2.0**127, 127, 2.0**-127),
        ("ue4m3", 448.0, 8, 2.0**-9),
        ("fp16", 65504.0, 15, 2.0**-24),
        ("bf16", (2 - 2.0**-7) * 2.0**127, 127, 2.0**-133),
        ("fp32", float(np.finfo(np.float32).max), 127, 2.0**-149),
        ("fp64", float(np.finfo(np.float64).max), 1023, 2.0**-1074),
        ("fp8_e4m3fnuz", 240.0, 7, 2.0**-10),
        ("fp8_e5m2fnuz", 57344.0, 15, 2.0**-17),
    ],
)
def test_table_matches_the_ocp_and_ieee_figures(name, max_finite, scale_emax, min_subnormal):
    fmt = get_format(name)
    assert fmt.max_finite == max_finite
    assert fmt.scale_emax == scale_emax
    assert fmt.min_subnormal == min_subnormal


def test_quark_names_alias_the_element_formats():
    assert get_format("MXFP8E4M3") is FORMATS["fp8_e4m3"]
    assert get_format("MXINT8") is FORMATS["int8"]


@pytest.mark.parametrize(
    "alias, key",
    [
        ("mxfp4", "fp4_e2m1"),
        ("e2m1", "fp4_e2m1"),
        ("MXFP4E2M1", "fp4_e2m1"),
        ("float4_e2m1fn", "fp4_e2m1"),
        ("E4M3", "fp8_e4m3"),
        ("float8_e4m3fn", "fp8_e4m3"),
        ("MX9", "mx9"),
        ("mxint8", "int8"),
        ("FP8_E5M2", "fp8_e5m2"),
        ("float8_e8m0fnu", "e8m0"),
        ("bfloat16", "bf16"),
    ],
)
def test_aliases_resolve_case_insensitively(alias, key):
    assert get_format(alias) is FORMATS[key]


@pytest.mark.parametrize(
    "name, storage_bits, average_bits",
    [
        # elements + shared metadata per element, by hand: OCP one 8-bit scale per 32;
        # MX4/6/9 one 8-bit exponent per 16 and one 1-bit microexponent per 2
        ("fp8_e4m3", 8, Fraction(33, 4)),  # 8 + 8/32
        ("fp4_e2m1", 4, Fraction(17, 4)),  # 4 + 8/32
        ("fp6_e2m3", 6, Fraction(25, 4)),
        ("mx9", 8, 9),  # 1 sign + 7 mantissa, + 8/16 + 1/2
        ("mx6", 5, 6),
        ("mx4", 3, 4),
        ("bf16", 16, 16),
        ("fp32", 32, 32),
    ],
)
def test_storage_facts(name, storage_bits, average_bits):
    fmt = get_format(name)
    assert fmt.storage_bits == storage_bits
    assert fmt.average_bits_per_element == average_bits


def test_roles_partition_the_table():
    assert format_names("element") == (
        "fp8_e4m3",
        "fp8_e5m2",
        "fp6_e3m2",
        "fp6_e2m3",
        "fp4_e2m1",
        "int8",
    )
    assert format_names("bfp_element") == ("mx4", "mx6", "mx9")
    assert format_names("scale") == ("e8m0", "ue4m3")
    assert set(format_names("wide")) == {"fp32", "fp16", "bf16", "fp64"}
    assert (
        get_format("e8m0").bias == E8M0_BIAS
        and get_format("e8m0").encode(np.array([np.nan]))[0] == E8M0_NAN
    )


def test_unknown_format_lists_the_valid_names():
    with pytest.raises(UnknownNameError, match="fp8_e4m3.*") as info:
        get_format("fp8_e4m4")
    assert "MXFP4E2M1" in str(info.value) and "fp4_e2m1" in str(info.value)


def test_bad_inputs_get_clear_errors():
    fmt = get_format("fp8_e4m3")
    with pytest.raises(MxsimError, match="float16, float32 or float64"):
        fmt.encode(np.arange(3))
    with pytest.raises(MxsimError, match="numpy array"):
        fmt.encode("1.0")
    with pytest.raises(UnknownNameError, match="nearest_even"):
        fmt.encode(np.ones(2), rounding="nearest")
    with pytest.raises(MxsimError, match="integer array"):
        fmt.decode(np.ones(2))
    with pytest.raises(MxsimError, match=r"\[0, 256\)"):
        fmt.decode(np.array([256]))
    with pytest.raises(MxsimError, match="no NaN"):
        get_format("fp4_e2m1").encode(np.array([np.nan]))
    with pytest.raises(MxsimError, match="saturate"):
        get_format("fp4_e2m1").encode(np.ones(1), overflow="inf_nan")


# --- every code, against the reference twin ------------------------------------------------


@pytest.mark.parametrize("name", SIXTEEN_BIT_OR_LESS)
def test_every_code_decodes_as_the_reference(name):
    fmt = FORMATS[name]
    codes = np.arange(1 << fmt.bits)
    decoded = fmt.decode(codes)
    for code in range(1 << fmt.bits):
        assert same_float(decoded[code], float(decode_reference(fmt, code))), (name, code)


@pytest.mark.parametrize("name", NARROW_FORMATS + ["fp16", "bf16"])
@pytest.mark.parametrize("rounding", list(ROUNDING_MODES))
def test_every_finite_code_reencodes_to_itself(name, rounding):
    fmt = FORMATS[name]
    codes = np.arange(1 << fmt.bits)
    values = fmt.decode(codes)
    finite = np.isfinite(values)
    again = fmt.encode(values[finite], rounding=rounding)
    expected = codes[finite]
    if fmt.twos_complement:  # no negative zero: every zero is code 0
        expected = np.where(values[finite] == 0, 0, expected)
    np.testing.assert_array_equal(again, expected)


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "fp16", "bf16", "e8m0", "fp32"])
def test_nan_codes_reencode_to_the_canonical_nan(name):
    fmt = FORMATS[name]
    out = fmt.decode(fmt.encode(np.array([np.nan, -np.nan])))
    assert np.isnan(out).all()


# --- hypothesis: kernel == reference twin ----------------------------------------------------

finite_or_special = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True, width=64)


def _value_near(fmt_name):
    """Values near a format's representable points: exact ties and one-ulp offsets."""
    fmt = FORMATS[fmt_name]
    return st.tuples(
        st.integers(0, (1 << fmt.bits) - 1), st.sampled_from([-1, 0, 1]), st.booleans()
    ).map(lambda t: _near(fmt, *t))


def _near(fmt, code, offset, midpoint):
    value = float(fmt.decode(np.array([code]))[0])
    if not math.isfinite(value):
        return value
    if midpoint and code + 1 < (1 << fmt.bits):
        upper = float(fmt.decode(np.array([code + 1]))[0])
        if math.isfinite(upper):
            value = (value + upper) / 2  # exact in float64 for every format here
    return float(np.nextafter(value, math.inf * offset)) if offset else value


@pytest.mark.parametrize(
    "fmt",
    [FORMATS[n] for n in ALL_FORMATS] + [INT8_NO_MINUS_TWO, E3M4, E5M3_IEEE],
    ids=lambda f: f.name,
)
@given(data=st.data())
def test_kernel_equals_reference_twin(fmt, data):
    source = _value_near(fmt.name) if fmt.name in FORMATS and fmt.bits <= 16 else finite_or_special
    x = data.draw(st.one_of(source, finite_or_special, st.floats(-1e6, 1e6)))
    if math.isnan(x) and not fmt.has_nan:
        return
    rounding = data.draw(st.sampled_from(list(ROUNDING_MODES)))
    overflow = data.draw(st.sampled_from(overflow_policies(fmt)))
    seed = data.draw(st.integers(0, 2**32))
    got = int(fmt.encode(np.array([x]), rounding=rounding, overflow=overflow, seed=seed)[0])
    want = encode_reference(fmt, x, rounding, overflow, draw32_reference(seed, 0))
    assert got == want, (fmt.name, x, rounding, overflow, hex(got), hex(want))


@given(values=st.lists(st.floats(-500, 500), min_size=2, max_size=40), seed=st.integers(0, 2**40))
def test_stochastic_draws_depend_on_seed_and_index_only(values, seed):
    fmt = FORMATS["fp8_e4m3"]
    got = fmt.encode(np.array(values), rounding="stochastic", seed=seed)
    want = [
        encode_reference(fmt, v, "stochastic", "saturate", draw32_reference(seed, i))
        for i, v in enumerate(values)
    ]
    assert got.tolist() == want


def test_stochastic_rounding_is_unbiased_on_a_constructed_value():
    fmt = FORMATS["fp8_e4m3"]
    x = np.full(20000, 1.0 + 0.125 * 0.3)  # 30% of the way from 1.0 to 1.125
    rounded = fmt.round(x, rounding="stochastic", seed=7)
    assert set(np.unique(rounded)) == {1.0, 1.125}
    assert abs((rounded == 1.125).mean() - 0.3) < 0.015
    np.testing.assert_array_equal(rounded, fmt.round(x, rounding="stochastic", seed=7))


@given(a=st.floats(-1e5, 1e5), b=st.floats(-1e5, 1e5))
def test_monotone_in_every_deterministic_mode(a, b):
    lo, hi = min(a, b), max(a, b)
    for name in ("fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp4_e2m1", "int8", "bf16"):
        fmt = FORMATS[name]
        for rounding in ROUNDING_MODES:
            if rounding == "stochastic":
                continue
            r = fmt.round(np.array([lo, hi]), rounding=rounding)
            assert r[0] <= r[1], (name, rounding, lo, hi)


@given(x=st.floats(-1e4, 1e4))
def test_directed_modes_bracket_the_value(x):
    fmt = FORMATS["fp6_e3m2"]
    down = fmt.round(np.array([x]), "toward_negative")[0]
    up = fmt.round(np.array([x]), "toward_positive")[0]
    if abs(x) <= fmt.max_finite:
        assert down <= x <= up
        assert fmt.round(np.array([x]), "toward_zero")[0] == (down if x >= 0 else up)


# --- ml_dtypes as an independent oracle (round to nearest even) -----------------------------

ML_DTYPES = {
    "fp8_e4m3": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
    "fp6_e3m2": ml_dtypes.float6_e3m2fn,
    "fp6_e2m3": ml_dtypes.float6_e2m3fn,
    "fp4_e2m1": ml_dtypes.float4_e2m1fn,
    "e8m0": ml_dtypes.float8_e8m0fnu,
    "bf16": ml_dtypes.bfloat16,
    "fp16": np.float16,
    "fp8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "fp8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
}


def _oracle_inputs(fmt) -> np.ndarray:
    """float32 inputs: every representable value, every midpoint, and their float32 neighbours."""
    values = fmt.decode(np.arange(1 << fmt.bits))
    values = np.unique(values[np.isfinite(values)])
    mids = (values[:-1] + values[1:]) / 2
    base = np.concatenate([values, mids]).astype(np.float32)
    spread = [base, np.nextafter(base, np.float32(np.inf)), np.nextafter(base, np.float32(-np.inf))]
    rng = np.random.default_rng(1)
    spread.append((rng.standard_normal(20000) * min(fmt.max_finite, 1e30) / 3).astype(np.float32))
    return np.concatenate(spread)


@pytest.mark.parametrize("name", list(ML_DTYPES))
def test_round_to_nearest_even_agrees_with_ml_dtypes(name):
    fmt = FORMATS[name]
    x = _oracle_inputs(fmt)
    if name == "e8m0":
        x = x[x > 0]  # ml_dtypes maps non-positive values to NaN; mxsim documents its own choice
        # ml_dtypes rounds float32-subnormal inputs to E8M0 oddly (1.4 * 2^-127 -> 2^-126,
        # the farther neighbour); the reference-twin test covers that range.
        x = x[x >= np.finfo(np.float32).tiny]
        ours = fmt.encode(x, rounding="nearest_away")  # ml_dtypes rounds E8M0 ties up (3.0 -> 4.0)
    else:
        x = np.clip(
            x, -fmt.max_finite, fmt.max_finite
        )  # ml_dtypes' overflow differs: saturate first
        ours = fmt.encode(x)
    theirs = x.astype(ML_DTYPES[name]).view(np.uint8 if fmt.bits <= 8 else np.uint16)
    if fmt.bits < 8:  # ml_dtypes stores sub-byte formats in the low bits of a byte
        theirs = theirs & ((1 << fmt.bits) - 1)
    np.testing.assert_array_equal(ours, theirs)


def test_ue4m3_is_e4m3_without_its_sign_bit_per_ml_dtypes():
    # ml_dtypes has no UE4M3; NVIDIA's UE4M3 is float8_e4m3fn with the sign bit clear.
    x = _oracle_inputs(FORMATS["fp8_e4m3"])
    x = np.clip(np.abs(x), 0.0, 448.0)  # abs: -0.0 would carry the sign bit
    theirs = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(FORMATS["ue4m3"].encode(x), theirs)
    codes = np.arange(128)
    np.testing.assert_array_equal(
        FORMATS["ue4m3"].decode(codes),
        codes.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64),
    )


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz", "fp8_e5m2fnuz"])
def test_overflow_to_nan_or_inf_agrees_with_ml_dtypes(name):
    fmt = FORMATS[name]
    x = np.array(
        [fmt.max_finite * k for k in (1.01, 1.05, 1.1, 2, 10)] + [np.inf], dtype=np.float32
    )
    x = np.concatenate([x, -x])
    ours = fmt.decode(fmt.encode(x, overflow="inf_nan"))
    theirs = x.astype(ML_DTYPES[name]).astype(np.float64)
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("name", ["fp8_e4m3fnuz", "fp8_e5m2fnuz"])
def test_fnuz_codes_agree_with_ml_dtypes(name):
    # Every code decodes as ml_dtypes reads it (0x80 the one NaN, no -0, no Inf); zeros of
    # either sign and values that round to zero encode to the one zero, NaN to 0x80.
    fmt = FORMATS[name]
    codes = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(fmt.decode(codes), codes.view(ML_DTYPES[name]).astype(np.float64))
    x = np.array([0.0, -0.0, -fmt.min_subnormal / 4, np.nan, -np.nan])
    np.testing.assert_array_equal(fmt.encode(x), x.astype(ML_DTYPES[name]).view(np.uint8))
    assert list(fmt.encode(x)) == [0, 0, 0, 0x80, 0x80]


def test_float32_round_trips_like_numpy():
    x = np.random.default_rng(2).standard_normal(50000) * np.logspace(-45, 38, 50000)
    fmt = FORMATS["fp32"]
    np.testing.assert_array_equal(fmt.encode(x), x.astype(np.float32).view(np.uint32))


def test_fp64_properties_are_numpy_float64s():
    fmt, info = FORMATS["fp64"], np.finfo(np.float64)
    assert (fmt.max_finite, fmt.min_normal, fmt.min_subnormal) == (
        info.max,
        info.tiny,
        info.smallest_subnormal,
    )
    assert (fmt.emax, fmt.top_fraction_bits, fmt.code_dtype) == (
        info.maxexp - 1,
        info.nmant,
        np.uint64,
    )
    assert (fmt.has_inf, fmt.has_nan, fmt.has_zero) == (True, True, True)
    assert get_format("float64") is fmt and fmt.decode_table is None


def test_fp64_codes_are_numpy_float64_bit_patterns():
    # Every exponent field, subnormals, zeros and specials: decode is the bit view, and
    # encode of float64 (and of float16/float32, widened exactly) gives the bits back, under
    # every rounding mode (nothing rounds) and with quiet NaN as the only NaN code.
    rng = np.random.default_rng(64)
    codes = rng.integers(0, 1 << 64, 40000, dtype=np.uint64)
    codes[:8] = [
        0,
        1 << 63,
        1,
        0x000FFFFFFFFFFFFF,
        0x7FEFFFFFFFFFFFFF,
        0x7FF0000000000000,
        0xFFF0000000000000,
        0x7FF8000000000000,
    ]
    codes[8:1000] &= np.uint64(0x800FFFFFFFFFFFFF)  # subnormals
    values = codes.view(np.float64)
    decoded = FORMATS["fp64"].decode(codes)
    np.testing.assert_array_equal(decoded, values)
    finite = ~np.isnan(values)  # NaN codes decode to NaN (its sign is not kept)
    assert np.signbit(decoded[finite]).tolist() == np.signbit(values[finite]).tolist()
    for rounding in ("nearest_even", "toward_zero", "toward_negative", "nearest_away"):
        encoded = FORMATS["fp64"].encode(values, rounding=rounding, overflow="inf_nan")
        np.testing.assert_array_equal(encoded[finite], codes[finite])
        quiet = np.where(
            np.signbit(values[~finite]), 0xFFF8000000000000, 0x7FF8000000000000
        ).astype(np.uint64)
        np.testing.assert_array_equal(encoded[~finite], quiet)
    narrow = rng.standard_normal(5000).astype(np.float32) * np.logspace(-45, 38, 5000).astype(
        np.float32
    )
    for x in (narrow, narrow.astype(np.float16)):
        np.testing.assert_array_equal(
            FORMATS["fp64"].encode(x, overflow="inf"), x.astype(np.float64).view(np.uint64)
        )


def test_float64_inputs_are_not_double_rounded():
    # 690.0000188... lies just above the bf16 midpoint 690 between 688 and 692. Rounding
    # through float32 first lands exactly on the midpoint and then goes to even (688);
    # ml_dtypes does that. The exact answer is 692.
    x = 690.0000188284085
    assert Fraction(x) > 690
    assert get_format("bf16").round(np.array([x]))[0] == 692.0
    assert float(np.array([x]).astype(ml_dtypes.bfloat16)[0]) == 688.0


# --- corner vectors (docs/profiles.md §3) ----------------------------------------------------


def test_e4m3_corner_vector_ties_away_and_nearest_even():
    x = np.array([485, 475, 400, -485, -475, -450, 2.0**-6, -(2.0**-6)])
    fmt = get_format("fp8_e4m3")
    np.testing.assert_array_equal(
        fmt.round(x, "nearest_away"), [448, 448, 416, -448, -448, -448, 2.0**-6, -(2.0**-6)]
    )
    assert fmt.round(np.array([400.0]))[0] == 384


def test_e4m3_overflow_saturates_or_gives_nan():
    fmt = get_format("fp8_e4m3")
    np.testing.assert_array_equal(fmt.round(np.array([464.0, 465.0, np.inf])), [448, 448, 448])
    out = fmt.round(np.array([464.0, 465.0, -np.inf]), overflow="inf_nan")
    assert out[0] == 448 and np.isnan(out[1:]).all()


def test_mxint8_corners():
    fmt = get_format("int8")
    np.testing.assert_array_equal(
        fmt.round(np.array([0.0078125, 1.99609375]), "nearest_away"), [0.015625, 1.984375]
    )
    assert fmt.round(np.array([-2.0]))[0] == -2.0
    assert INT8_NO_MINUS_TWO.round(np.array([-2.0]))[0] == -127 / 64
    assert fmt.encode(np.array([-0.0]))[0] == 0  # two's complement has one zero


def test_e8m0_ties_and_limits():
    fmt = get_format("e8m0")
    assert fmt.round(np.array([3.0]), "nearest_even")[0] == 2.0  # gfloat
    assert fmt.round(np.array([3.0]), "nearest_away")[0] == 4.0  # ml_dtypes, ONNX, torch
    assert fmt.encode(np.array([0.0, 2.0**-140]))[0] == 0  # no zero: the smallest scale
    assert fmt.encode(np.array([-1.0]))[0] == 0xFF
    assert np.isnan(fmt.decode(np.array([0xFF]))[0])


def test_directed_overflow_follows_ieee():
    fmt = get_format("fp16")
    big = np.array([1e6, -1e6])
    np.testing.assert_array_equal(fmt.round(big, "toward_zero", "inf_nan"), [65504, -65504])
    np.testing.assert_array_equal(fmt.round(big, "toward_positive", "inf_nan"), [np.inf, -65504])
    np.testing.assert_array_equal(fmt.round(big, "toward_negative", "inf_nan"), [65504, -np.inf])
    np.testing.assert_array_equal(fmt.round(big, "nearest_even", "inf_nan"), [np.inf, -np.inf])
    for rounding in (
        "toward_zero",
        "toward_positive",
        "toward_negative",
        "nearest_even",
    ):  # "inf": always Inf
        np.testing.assert_array_equal(fmt.round(big, rounding, "inf"), [np.inf, -np.inf])
    np.testing.assert_array_equal(
        fmt.round(np.array([65504.0, 65519.0]), "toward_zero", "inf"), [65504, 65504]
    )


def test_float16_and_float32_inputs_are_read_exactly():
    fmt = get_format("fp4_e2m1")
    for dtype in (np.float16, np.float32, np.float64):
        np.testing.assert_array_equal(
            fmt.round(np.array([2.5, 2.75, -5.0], dtype=dtype)), [2, 3, -4]
        )


def test_custom_format_from_fields():
    e3m4 = custom_format(3, 4)
    assert (e3m4.bits, e3m4.bias, e3m4.max_finite) == (8, 3, 31.0)
    assert e3m4.round(np.array([1.03125]))[0] == 1.0  # tie to even (1.0 has mantissa 0000)
    with pytest.raises(MxsimError):
        custom_format(0, 3)


def test_one_encode_kernel_signature_for_every_input_and_code_width():
    from mxsim.formats import _kernels

    x = np.linspace(-3.0, 3.0, 101)
    for name in ("fp8_e4m3", "fp16", "fp32"):
        for dtype in (np.float16, np.float32, np.float64):
            codes = get_format(name).encode(x.astype(dtype))
            assert codes.dtype == get_format(name).code_dtype
    assert len(_kernels.encode_array.signatures) == 1


# --- tf32: fp32 bit patterns with 10 fraction bits ---------------------------------------------


def test_tf32_rounds_like_the_fp32_bit_trick():
    # Round-to-nearest-even of the low 13 bits of an fp32 pattern (the conversion CUDA's
    # __float_to_tf32 documents): carries run into the exponent and up to Inf, and subnormals
    # keep their 10 fraction bits at the same positions.
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(40000) * np.logspace(-44, 38, 40000)).astype(np.float32)
    x = np.concatenate([x, np.float32([3.4028235e38, -3.4028235e38, 1e-45, 0.0, -0.0])])
    bits = x.view(np.uint32).astype(np.uint64)
    expected = ((bits + 0xFFF + ((bits >> 13) & 1)) & ~np.uint64(0x1FFF)).astype(np.uint32)
    expected = np.where(
        np.abs(x) >= np.float32(3.4028235e38), (bits & 0x80000000) | 0x7F800000, expected
    )
    fmt = FORMATS["tf32"]
    np.testing.assert_array_equal(fmt.encode(x, overflow="inf_nan"), expected)
    assert fmt.encode(np.float32([1.0]))[0] == 0x3F800000  # stored as the fp32 bit pattern
    assert (fmt.max_finite, fmt.min_subnormal, fmt.code_dtype) == (
        (2 - 2**-10) * 2.0**127,
        2.0**-136,
        np.uint32,
    )


def test_tf32_codes_decode_as_fp32_and_as_the_reference():
    fmt = FORMATS["tf32"]
    codes = np.arange(0, 1 << 19, 37, dtype=np.uint32) << np.uint32(13)
    decoded = fmt.decode(codes)
    with np.errstate(invalid="ignore"):  # NaN codes widen to NaN
        np.testing.assert_array_equal(decoded, codes.view(np.float32).astype(np.float64))
    for index in range(0, codes.size, 50):
        assert same_float(float(decode_reference(fmt, int(codes[index]))), decoded[index])
    with pytest.raises(MxsimError, match="low 13 bits zero"):
        fmt.decode(np.array([0x3F800001]))
    with pytest.raises(ValueError, match="padding"):
        decode_reference(fmt, 0x3F800001)


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_kept_kernel_params_and_decode_table_are_read_only(name):
    """A format's kernel parameters and code table are made once and shared by every
    caller: an in-place write fails loudly rather than changing every later result."""
    fmt = get_format(name)
    for array in (fmt.kernel_params, fmt.decode_table):
        if array is None:  # (no table past 16 bits)
            continue
        assert not array.flags.writeable
        with pytest.raises(ValueError):
            array[0] = array[0]


def rounding_boundaries(fmt, dtype, rng, count: int | None = None) -> np.ndarray:
    """Inputs of ``dtype`` at every place rounding into ``fmt`` (an IEEE format with a numpy
    float's layout) decides something: its finite values, each pair of adjacent ones'
    midpoint (a tie) and the inputs beside each, the overflow threshold, ±Inf, the quiet NaN
    and NaNs with every payload bit set, all with both signs; ``count`` codes drawn at
    random instead of every one (fp32's four billion, fp64's)."""
    native = native_float_dtype(fmt)
    bits = np.dtype(f"uint{fmt.bits}")
    info = np.finfo(native)
    top = int(np.array(info.max, native).view(bits))  # the largest finite code
    if count is None:
        codes = np.arange(top, dtype=bits)
    else:
        codes = np.unique(rng.integers(0, top, count, dtype=bits, endpoint=False))
    low = codes.view(native).astype(np.float64)
    high = (codes + bits.type(1)).view(native).astype(np.float64)
    ulp = 2.0 ** (info.maxexp - 1 - info.nmant)
    input_bits = np.dtype(f"uint{8 * np.dtype(dtype).itemsize}")
    ones, mantissa_bits = int(np.iinfo(input_bits).max), np.finfo(dtype).nmant
    signalling = (ones >> 1) >> mantissa_bits << mantissa_bits | 1
    nans = np.array([ones, ones >> 1, signalling], input_bits).view(dtype)
    with np.errstate(all="ignore"):  # (past the largest values: Inf; the NaNs' casts)
        wide = np.concatenate([low, (low + high) / 2, [float(info.max) + ulp / 2, np.inf]])
        values = np.concatenate([wide, -wide]).astype(dtype)
        values = np.concatenate([values, *(np.nextafter(values, v) for v in (-np.inf, np.inf))])
    return np.concatenate([values, nans, np.array([np.nan], dtype)])


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("fp16", np.float32),
        ("fp16", np.float64),
        ("fp32", np.float64),
        ("fp64", np.float64),
        ("fp64", np.float32),
        ("fp32", np.float16),
    ],
)
@pytest.mark.parametrize("overflow", ["saturate", "inf_nan", "inf"])
def test_numpys_conversion_is_the_kernels_rounding_to_nearest_even(
    monkeypatch, name, dtype, overflow
):
    # encode rounds to nearest even into fp16/fp32/fp64 by numpy's own conversion: the
    # kernel's codes at every tie, beside it, at overflow, for NaN payloads and signed zeros.
    import mxsim.formats.table as table

    fmt = get_format(name)
    rng = np.random.default_rng(3)
    values = rounding_boundaries(fmt, dtype, rng, None if fmt.bits == 16 else 200_000)
    fast = fmt.encode(values, overflow=overflow)
    monkeypatch.setattr(table, "native_float_dtype", lambda fmt: None)
    assert np.array_equal(fast, fmt.encode(values, overflow=overflow))


@pytest.mark.parametrize(
    "name, dtype", [("bf16", np.float32), ("tf32", np.float32), ("bf16", np.float16)]
)
@pytest.mark.parametrize("overflow", ["saturate", "inf_nan", "inf"])
def test_float32_prefix_rounding_is_the_kernels(monkeypatch, name, dtype, overflow):
    """bf16 and tf32 from float32 (or float16) round on float32's bit patterns: the kernel's
    codes for every float32 pattern at, beside and half an ulp of the format from each of its
    codes (every bf16 code; a sample of tf32's), NaN payloads, signed zeros and overflow
    included."""
    import mxsim.formats.table as table

    fmt = get_format(name)
    assert table._float32_prefix(fmt)
    shift = 23 - fmt.mantissa_bits
    half = 1 << (shift - 1)
    if dtype == np.float16:
        values = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    else:
        codes = np.arange(1 << (32 - shift), dtype=np.uint64)
        if fmt.bits > 16:
            codes = np.random.default_rng(4).choice(codes, 200_000, replace=False)
        offsets = np.array([0, 1, half - 1, half, half + 1, 2 * half - 1], dtype=np.uint64)
        bits = ((codes << np.uint64(shift))[:, None] + offsets).ravel().astype(np.uint32)
        values = bits.view(np.float32)
    fast = fmt.encode(values, overflow=overflow)
    monkeypatch.setattr(table, "_float32_prefix", lambda fmt: False)
    assert np.array_equal(fast, fmt.encode(values, overflow=overflow))
    assert not table._float32_prefix(get_format("fp16")) and not table._float32_prefix(
        get_format("fp8_e4m3")
    )
