"""An independent, slow model of the ``ocp-exact`` unit in exact rationals, and its own checks.

The golden tests and the RTL proof use :func:`ocp_exact_expected_fn` as the expected function
(``mxsim.dot`` is checked against it where available). It shares no code with mxsim: element
formats are decoded from their field definitions here, and rounding into FP32 is written out.

ocp-exact, per block of k elements (blocks in order, the result of one block is the next c):

    acc <- RNE_fp32(acc + 2^(Xa-127) * 2^(Xb-127) * sum_i a_i * b_i),   acc = c at first,

with the sum exact and one rounding; subnormal results kept; overflow to ±Inf; a NaN
element, a NaN scale (0xFF) or a NaN c gives the quiet NaN 0x7FC00000; infinities follow
IEEE 754 (Inf − Inf and Inf × 0 are NaN); an exact zero is −0 only when every addend
(products, whose zero sign is sign(a) xor sign(b), and acc) is −0.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

QNAN = 0x7FC00000
INF = 0x7F800000

# name: (exponent bits, mantissa bits, bias, specials) — OCP MX v1.0 element formats.
ELEMENT_FIELDS = {
    "fp4_e2m1": (2, 1, 1, "none"),
    "fp6_e2m3": (2, 3, 1, "none"),
    "fp6_e3m2": (3, 2, 3, "none"),
    "fp8_e4m3": (4, 3, 7, "nan_at_max"),
    "fp8_e5m2": (5, 2, 15, "ieee"),
    "fp16": (5, 10, 15, "ieee"),
    "bf16": (8, 7, 127, "ieee"),
}


class Value:
    """A number of the extended reals with a signed zero: finite (Fraction, sign), ±Inf or NaN."""

    __slots__ = ("kind", "value", "negative")

    def __init__(self, kind: str, value: Fraction = Fraction(0), negative: bool = False):
        self.kind, self.value, self.negative = kind, value, negative

    def __repr__(self):
        return f"Value({self.kind}, {self.value}, {'-' if self.negative else '+'})"


def decode_element(code: int, fmt: str) -> Value:
    """Value of an element code, from the format's fields alone."""
    if fmt == "int8":  # two's complement with an implicit 2^-6
        signed = code - 256 if code & 0x80 else code
        return Value("finite", Fraction(signed, 64), signed < 0)
    ebits, mbits, bias, specials = ELEMENT_FIELDS[fmt]
    negative = bool(code >> (ebits + mbits) & 1)
    exponent = code >> mbits & ((1 << ebits) - 1)
    mantissa = code & ((1 << mbits) - 1)
    if specials == "ieee" and exponent == (1 << ebits) - 1:
        return Value("nan") if mantissa else Value("inf", negative=negative)
    if specials == "nan_at_max" and exponent == (1 << ebits) - 1 and mantissa == (1 << mbits) - 1:
        return Value("nan")
    if exponent == 0:
        magnitude = Fraction(mantissa, 1 << mbits) * Fraction(2) ** (1 - bias)
    else:
        magnitude = (1 + Fraction(mantissa, 1 << mbits)) * Fraction(2) ** (exponent - bias)
    return Value("finite", -magnitude if negative else magnitude, negative)


def decode_fp32(bits: int) -> Value:
    negative = bool(bits >> 31)
    exponent, fraction = bits >> 23 & 0xFF, bits & 0x7FFFFF
    if exponent == 0xFF:
        return Value("nan") if fraction else Value("inf", negative=negative)
    significand = fraction if exponent == 0 else fraction + (1 << 23)
    magnitude = significand * Fraction(2) ** (max(exponent, 1) - 150)
    return Value("finite", -magnitude if negative else magnitude, negative)


def round_to_fp32(x: Fraction) -> int:
    """FP32 bits of the nonzero rational x rounded to nearest, ties to even; overflow to ±Inf."""
    sign = 0x80000000 if x < 0 else 0
    m = abs(x)
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if Fraction(2) ** e > m:
        e -= 1  # now 2^e <= m < 2^(e+1)
    e = max(e, -126)  # below 2^-126 the spacing stays 2^-149 (subnormals)
    scaled = m / Fraction(2) ** (e - 23)  # significand with 23 fraction bits
    n = scaled.numerator // scaled.denominator
    rest = scaled - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1):
        n += 1
    if n == 1 << 24:
        n, e = 1 << 23, e + 1
    if e > 127:
        return sign | INF
    if n < 1 << 23:  # subnormal (e == -126), including rounding to zero
        return sign | n
    return sign | (e + 127) << 23 | (n - (1 << 23))


def add_exact(addends: list[Value]) -> Value:
    """IEEE 754 sum of exact addends, before rounding: NaN, ±Inf, or finite with zero sign rule."""
    if any(v.kind == "nan" for v in addends):
        return Value("nan")
    infinite = {v.negative for v in addends if v.kind == "inf"}
    if len(infinite) == 2:
        return Value("nan")
    if infinite:
        return Value("inf", negative=infinite.pop())
    total = sum((v.value for v in addends), Fraction(0))
    if total == 0:
        return Value("finite", Fraction(0), all(v.negative for v in addends))
    return Value("finite", total, total < 0)


def multiply(x: Value, y: Value) -> Value:
    if x.kind == "nan" or y.kind == "nan":
        return Value("nan")
    negative = x.negative != y.negative
    if x.kind == "inf" or y.kind == "inf":
        if (x.kind == "finite" and x.value == 0) or (y.kind == "finite" and y.value == 0):
            return Value("nan")
        return Value("inf", negative=negative)
    return Value("finite", x.value * y.value, negative)


def to_bits(v: Value) -> int:
    if v.kind == "nan":
        return QNAN
    if v.kind == "inf":
        return INF | (0x80000000 if v.negative else 0)
    if v.value == 0:
        return 0x80000000 if v.negative else 0
    return round_to_fp32(v.value)


def ocp_exact_dot_one(
    a, b, scale_a, scale_b, c_bits: int, a_format: str, b_format: str, block_size: int
) -> int:
    """FP32 bits of one ocp-exact dot product (see the module docstring)."""
    acc = decode_fp32(int(c_bits))
    K = len(a)
    for block in range(K // block_size):
        lanes = range(block * block_size, (block + 1) * block_size)
        products = [
            multiply(decode_element(int(a[i]), a_format), decode_element(int(b[i]), b_format))
            for i in lanes
        ]
        if scale_a is not None:
            xa, xb = int(scale_a[block]), int(scale_b[block])
            if 0xFF in (xa, xb):
                return QNAN
            factor = Fraction(2) ** (xa + xb - 254)
            products = [Value(p.kind, p.value * factor, p.negative) for p in products]
        total = add_exact(products + [acc])
        rounded = total.kind == "finite" and total.value != 0
        acc = decode_fp32(round_to_fp32(total.value)) if rounded else total
    return to_bits(acc)


def ocp_exact_expected_fn(unit):
    """An expected function (a, b, scale_a, scale_b, c) -> uint32 bits for ``unit``, from this model."""
    assert unit.out_format == "fp32"

    def expected(a, b, scale_a, scale_b, c):
        return np.array(
            [
                ocp_exact_dot_one(
                    a[i],
                    b[i],
                    None if scale_a is None else scale_a[i],
                    None if scale_b is None else scale_b[i],
                    c[i],
                    unit.a_format,
                    unit.b_format,
                    unit.block_size,
                )
                for i in range(len(c))
            ],
            dtype=np.uint32,
        )

    expected.__qualname__ = "tests.test_golden_model.ocp_exact"
    return expected


def exact_value(a, b, scale_a, scale_b, c_bits, a_format, b_format) -> Value:
    """The exact (unrounded) single-block sum c + 2^(Xa+Xb-254) Σ a_i b_i, for checking corner labels."""
    products = [
        multiply(decode_element(int(x), a_format), decode_element(int(y), b_format))
        for x, y in zip(a, b)
    ]
    if 0xFF in (int(scale_a[0]), int(scale_b[0])):
        return Value("nan")
    factor = Fraction(2) ** (int(scale_a[0]) + int(scale_b[0]) - 254)
    products = [Value(p.kind, p.value * factor, p.negative) for p in products]
    return add_exact(products + [decode_fp32(int(c_bits))])


# Checks of the model itself, with expected values worked out by hand ---------------------
FP4 = {0.0: 0x0, 0.5: 0x1, 1.0: 0x2, 1.5: 0x3, 2.0: 0x4, 3.0: 0x5, 4.0: 0x6, 6.0: 0x7}
NEG = 0x8


def dot(lanes, sa=127, sb=127, c=0):
    """fp4 × fp4, K = k = 32: lanes is a list of (a code, b code); the rest are +0."""
    a = [x for x, _ in lanes] + [0] * (32 - len(lanes))
    b = [y for _, y in lanes] + [0] * (32 - len(lanes))
    return ocp_exact_dot_one(a, b, [sa], [sb], c, "fp4_e2m1", "fp4_e2m1", 32)


@pytest.mark.parametrize(
    "lanes, sa, sb, c, expected",
    [
        ([(FP4[1.0], FP4[1.0])], 127, 127, 0, 0x3F800000),  # 1 × 1 = 1.0
        ([(FP4[6.0], FP4[6.0])] * 32, 127, 127, 0, 0x44900000),  # 32 × 36 = 1152 = 1.125 × 2^10
        ([(FP4[6.0] | NEG, FP4[6.0])] * 32, 127, 127, 0, 0xC4900000),
        ([(FP4[1.5], FP4[3.0])], 128, 126, 0x3F800000, 0x40B00000),  # 4.5 + 1 = 5.5
        ([(FP4[0.5], FP4[0.5])], 116, 116, 0x3F800000, 0x3F800000),  # 1 + 2^-24: tie, to even 1.0
        ([(FP4[0.5], FP4[0.5])], 116, 116, 0x3F800001, 0x3F800002),  # (1 + 2^-23) + 2^-24: tie, up
        (
            [(FP4[0.5], FP4[0.5]), (FP4[0.5], FP4[0.5])],
            115,
            116,
            0x3F800000,
            0x3F800000,
        ),  # 2^-24 split: tie
        ([(FP4[0.5], FP4[0.5])], 107, 0, 0, 0x00000001),  # 2^-2 × 2^-147 = 2^-149, min subnormal
        ([(FP4[0.5] | NEG, FP4[0.5])], 107, 0, 0, 0x80000001),
        ([(FP4[0.5] | NEG, FP4[0.5])], 105, 0, 0, 0x80000000),  # −2^-151 rounds to −0
        (
            [(FP4[0.5], FP4[1.0])],
            105,
            0,
            0,
            0x00000000,
        ),  # 2^-150: tie between 0 and 2^-149, to even 0
        ([(FP4[0.5], FP4[1.5])], 105, 0, 0, 0x00000001),  # 1.5 × 2^-150 rounds up
        (
            [(FP4[0.5], FP4[0.5])],
            180,
            179,
            0x7F7FFFFF,
            0x7F800000,
        ),  # max + 2^103 (half ulp): tie, to Inf
        ([(FP4[1.0], FP4[1.5])], 178, 178, 0x7F7FFFFF, 0x7F7FFFFF),  # max + 1.5 × 2^102 < half ulp
        ([(FP4[6.0], FP4[6.0])] * 32, 254, 254, 0, 0x7F800000),  # 1152 × 2^254 overflows
        ([(FP4[1.0], FP4[1.0])], 255, 127, 0, QNAN),  # NaN scale
        ([(FP4[1.0], FP4[1.0])], 127, 255, 0, QNAN),
        ([], 255, 255, 0x7F800000, QNAN),
        ([(FP4[1.0], FP4[1.0])], 127, 127, 0x7F800001, QNAN),  # signalling NaN c -> canonical
        ([(FP4[1.0], FP4[1.0])], 127, 127, 0xFF800000, 0xFF800000),  # −Inf + 1
        ([(FP4[6.0], FP4[6.0])] * 32, 254, 254, 0xFF800000, 0xFF800000),  # −Inf + huge finite
        ([], 127, 127, 0x80000000, 0x00000000),  # +0 products + (−0) = +0
        ([(0x0, FP4[1.0] | NEG)] * 32, 127, 127, 0x80000000, 0x80000000),  # all −0 addends
        ([(0x0, FP4[1.0] | NEG)] * 32, 127, 127, 0x00000000, 0x00000000),
        ([(NEG, NEG)] * 32, 127, 127, 0x80000000, 0x00000000),  # (−0)(−0) = +0
        (
            [(FP4[6.0], FP4[6.0]), (FP4[6.0] | NEG, FP4[6.0])],
            127,
            127,
            0x80000000,
            0x00000000,
        ),  # cancel: +0
        ([(FP4[6.0], FP4[6.0])] * 32, 127, 127, 0xC4900000, 0x00000000),  # 1152 − 1152
    ],
)
def test_model_matches_hand_worked_values(lanes, sa, sb, c, expected):
    assert dot(lanes, sa, sb, c) == expected


def test_model_infinities_in_e5m2_elements():
    inf, neg_inf, one = 0x7C, 0xFC, 0x3C  # e5m2: exponent 31 is Inf/NaN; 0x3C = 1.0
    pad = [0] * 30
    run = lambda a, b, c=0: ocp_exact_dot_one(
        a + pad, b + pad, [127], [127], c, "fp8_e5m2", "fp8_e5m2", 32
    )
    assert run([inf, one], [one, one]) == INF
    assert run([inf, neg_inf], [one, one]) == QNAN  # Inf − Inf
    assert run([inf, 0], [0, one]) == QNAN  # Inf × 0
    assert run([inf, 0], [one, 0], c=0xFF800000) == QNAN  # Inf + (−Inf) from c
    assert run([0x7D, one], [one, one]) == QNAN  # NaN element


def test_model_e4m3_nan_and_max():
    pad = [0] * 31
    run = lambda a, b: ocp_exact_dot_one(
        [a] + pad, [b] + pad, [127], [127], 0, "fp8_e4m3", "fp8_e4m3", 32
    )
    assert run(0x7F, 0x38) == QNAN  # S.1111.111 is NaN
    assert run(0x7E, 0x38) == 0x43E00000  # 448 × 1 = 448


def test_decoders_agree_with_mxsim_format_table():
    """The model's own field decoding and mxsim's format table give the same values for every code."""
    from mxsim import get_format

    for name in list(ELEMENT_FIELDS) + ["int8"]:
        fmt = get_format(name)
        table = fmt.decode(np.arange(256 if fmt.bits == 8 else 1 << fmt.bits))
        for code, reference in enumerate(table):
            mine = decode_element(code, name)
            if np.isnan(reference):
                assert mine.kind == "nan", (name, code)
            elif np.isinf(reference):
                assert mine.kind == "inf" and mine.negative == (reference < 0), (name, code)
            else:
                assert mine.kind == "finite" and mine.value == Fraction(float(reference)), (
                    name,
                    code,
                )


def test_rounding_agrees_with_numpy_on_float64_exact_values():
    """For values float64 holds exactly, the model's FP32 rounding equals numpy's float64 → float32 cast."""
    rng = np.random.default_rng(7)
    n = 20000
    # Exponents over FP32's range and a little beyond (subnormals, underflow, overflow),
    # full 52-bit mantissas (so ties and near-ties at 2^-24 relative occur), both signs.
    mantissa = rng.integers(0, 1 << 52, n, dtype=np.int64)
    mantissa[: n // 4] &= ~np.int64((1 << 28) - 1)  # a quarter with short mantissas: exact ties
    mantissa[: n // 8] |= np.int64(1) << 28
    exponent = rng.integers(-155, 130, n)
    values = np.ldexp(1.0 + mantissa / 2.0**52, exponent) * np.where(rng.random(n) < 0.5, -1.0, 1.0)
    with np.errstate(over="ignore"):
        expected = values.astype(np.float32).view(np.uint32)
    for x, bits in zip(values, expected):
        assert round_to_fp32(Fraction(float(x))) == int(bits), x
