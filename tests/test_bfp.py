"""Tests of mxsim.quantize.bfp: Quark's BFP / shared-microexponent (MX4/MX6/MX9) quantizer.

Three kinds of evidence:
* hand-computed corner values (each worked out in a comment) for rules read from Quark's source;
* the numba kernels against the slow Fraction-based reference twin on hypothesis inputs;
* the public API (layout, axis, padding, dequantize) against the twin applied lane by lane.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mxsim.errors import MxsimError, UnknownNameError
from mxsim.quantize import _bfp_kernels, _bfp_reference
from mxsim.quantize.bfp import (
    BFP_KERNELS,
    FLUSHED_ZERO_SIGNS,
    BFP_SPECS,
    BFPAxisError,
    BFPInputError,
    BFPSpec,
    BFPSpecError,
    quantize_bfp,
)

FLT_MAX = np.float32(np.finfo(np.float32).max)


def f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def bits_of(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def block(values, size=16) -> np.ndarray:
    """One block: ``values`` then zeros."""
    out = np.zeros(size, np.float32)
    out[: len(values)] = values
    return out


def deq(x, spec) -> np.ndarray:
    return quantize_bfp(f32(x), spec).dequantize()


# --------------------------------------------------------------------------------------------
# Named specs
# --------------------------------------------------------------------------------------------


def test_named_specs_match_quark_bit_widths_and_storage_cost():
    expected = {  # name: (method, bit_width, block, m, bits per element)
        "MX4": ("to_bfp_prime", 11, 16, 2, 4.0),  # 1 + 2 + 8/16 + 1/2
        "MX6": ("to_bfp_prime", 13, 16, 4, 6.0),  # 1 + 4 + 8/16 + 1/2
        "MX9": ("to_bfp_prime", 16, 16, 7, 9.0),  # 1 + 7 + 8/16 + 1/2
        "BFP16": ("to_bfp", 16, 8, 7, 9.0),  # 1 + 7 + 8/8
    }
    assert set(BFP_SPECS) == set(expected)
    for name, (method, bit_width, block_size, m, bpe) in expected.items():
        spec = BFP_SPECS[name]
        assert (spec.method, spec.bit_width, spec.block_size) == (method, bit_width, block_size)
        assert spec.mantissa_bits == m
        assert spec.bits_per_element == bpe
        assert quantize_bfp(f32([1.0]), name).bits_per_element == bpe
    assert BFP_SPECS["MX6"].sub_block_size == 2 and BFP_SPECS["MX6"].sub_block_shift_bits == 1


# --------------------------------------------------------------------------------------------
# Hand-computed corner values
# --------------------------------------------------------------------------------------------


def test_197_saturates_at_the_largest_mantissa_on_both_kernels():
    # float32(1.97) = 0x3FFC28F6: e = 127, sig = 0xFC28F6 = 16525558.  Block [1.97, 0, ...]:
    # E = 127, its sub-block's max exponent is 127, so d = 0.
    # MX6 (m = 4): LSB = 2**(127-127-0+1-4) = 2**-3, q = 1.97 / 0.125 = 15.76.
    #   CPU: nearest integer 16 = 2**4 would carry out of the sub-block's top; Quark's CPU
    #        runtime keeps the largest mantissa 15                -> 15 * 2**-3 = 1.875
    #   CUDA: keeps floor(2q) = 31 = 2**5 - 1 (all ones), so rounding mode 1 may not add the
    #         half and the result is 31 >> 1 = 15             -> 15 * 2**-3 = 1.875
    # MX4 (m = 2): LSB = 2**(1-2) = 0.5, q = 3.94 -> 4 -> kept at 3 -> 1.5 (CUDA: 7 >> 1 = 3).
    assert bits_of(f32(1.97)) == 0x3FFC28F6
    x = block([1.97, -1.97])
    for name, value, m in [("MX6", 1.875, 15), ("MX4", 1.5, 3)]:
        assert m == 2 ** BFP_SPECS[name].mantissa_bits - 1
        specs = [BFP_SPECS[name].replace(rounding_mode=mode) for mode in (0, 1, 2)]
        # CUDA truncation (mode 0) gives the same 15 / 3.
        specs += [BFP_SPECS[name].replace(kernel="cuda", rounding_mode=mode) for mode in (0, 1)]
        for spec in specs:
            t = quantize_bfp(x, spec)
            assert t.dequantize()[:2].tolist() == [value, -value]
            assert t.element_significands()[:2].tolist() == [m, -m]


# MX9 (m = 7), block [1.0, x, 0, ...]: x shares sub-block 0 with 1.0, so E = 127, d = 0 and
# LSB = 2**(127-127-0+1-7) = 2**-6.  x = 1 + 1/128 gives q = 64.5 and x = 1 + 3/128 gives
# q = 65.5, both exact ties.  BFP16 (to_bfp, m = 7): LSB = 2**(E-126-7) = 2**-6 too.
TIE_INPUTS = [1 + 1 / 128, 1 + 3 / 128, -(1 + 1 / 128), -(1 + 3 / 128)]  # q = +-64.5, +-65.5
NEAREST_TIES = {  # Quark CPU rounding_mode -> M for TIE_INPUTS (also to_bfp on CPU and CUDA)
    0: [65, 66, -65, -66],  # STD_ROUND: half away from zero
    1: [65, 66, -64, -65],  # DPU_ROUND: half toward +inf
    2: [64, 66, -64, -66],  # PY3_ROUND: half to even
}
CUDA_PRIME_TIES = {
    0: [64, 65, -64, -65],  # truncate
    1: [65, 66, -65, -66],  # half away from zero
}


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_exact_ties_cpu_prime_and_plain_bfp(mode):
    for x_value, expected in zip(TIE_INPUTS, NEAREST_TIES[mode]):
        prime = quantize_bfp(block([1.0, x_value]), BFP_SPECS["MX9"].replace(rounding_mode=mode))
        assert prime.element_significands()[1] == expected
        assert prime.dequantize()[1] == expected / 64
        for kernel in BFP_KERNELS:
            spec = BFP_SPECS["BFP16"].replace(rounding_mode=mode, kernel=kernel)
            plain = quantize_bfp(block([1.0, x_value], 8), spec)
            assert plain.element_significands()[1] == expected
            assert plain.element_lsb_exponents()[1] == -6


@pytest.mark.parametrize("mode", [0, 1])
def test_exact_ties_cuda_prime(mode):
    spec = BFP_SPECS["MX9"].replace(kernel="cuda", rounding_mode=mode)
    for x_value, expected in zip(TIE_INPUTS, CUDA_PRIME_TIES[mode]):
        assert quantize_bfp(block([1.0, x_value]), spec).element_significands()[1] == expected


def test_microexponent_lowers_the_lsb_of_a_small_sub_block():
    # MX9 block [8.0, 0, 1.0 + 1/128, 0, 0.5, 0, ...]: E = 130 (8.0).  Sub-block 1 has max
    # exponent 127 -> d = min(3, 1) = 1, LSB = 2**(130-127-1+1-7) = 2**-4, so 1 + 1/128 is
    # q = 16.125 and rounds to 16 (1.0).  Sub-block 2 (0.5) likewise d = 1, q = 8.
    # Sub-block 0: d = 0, LSB 2**(130-127-0+1-7) = 2**-3.
    t = quantize_bfp(block([8.0, 0, 1 + 1 / 128, 0, 0.5]), "MX9")
    assert t.shared_exponents.tolist() == [130]
    assert t.microexponents.tolist() == [[0, 1, 1, 1, 1, 1, 1, 1]]
    assert t.element_lsb_exponents()[:5].tolist() == [-3, -3, -4, -4, -4]
    assert t.dequantize()[:5].tolist() == [8.0, 0.0, 1.0, 0.0, 0.5]


def test_nan_block_prime_and_passthrough_plain():
    # to_bfp_prime: Inf/NaN has exponent field 255 = the block maximum, so the whole block
    # becomes NaN (bits 0x7FFFFFFF); the neighbouring block is untouched.
    x = np.concatenate([block([np.inf, 1.0, -2.0]), block([1.0, 2.0])])
    for kernel in BFP_KERNELS:
        t = quantize_bfp(x, BFP_SPECS["MX6"].replace(kernel=kernel))
        assert t.shared_exponents.tolist() == [255, 128]
        assert t.nan_blocks.tolist() == [True, False]
        assert (bits_of(t.dequantize()[:16]) == 0x7FFFFFFF).all()
        assert t.dequantize()[16:18].tolist() == [1.0, 2.0]
        assert t.element_nonfinite_mask().tolist() == [True] * 16 + [False] * 16
        assert not t.mantissas[0].any() and not t.microexponents[0].any()
    nan_bits = np.array([0x7FC00001], np.uint32).view(np.float32)[0]
    assert (bits_of(deq(block([nan_bits, 1.0]), "MX9")) == 0x7FFFFFFF)[:16].all()
    # to_bfp: Inf/NaN are ignored when choosing E and pass through bit for bit.  Block
    # [-inf, 1.0, NaN(payload), 0.25, ...]: E = 127 (1.0), so 0.25 and 1.0 are exact.
    x = block([-np.inf, 1.0, nan_bits, 0.25], 8)
    t = quantize_bfp(x, "BFP16")
    assert t.shared_exponents.tolist() == [127]
    out = t.dequantize()
    assert bits_of(out)[[0, 2]].tolist() == [0xFF800000, 0x7FC00001]
    assert out[[1, 3]].tolist() == [1.0, 0.25]
    assert t.element_nonfinite_mask()[:4].tolist() == [True, False, True, False]


def test_to_bfp_clamps_to_largest_magnitude():
    # BFP16 (m = 7), block [1.999, -1.999]: E = 127, LSB = 2**(127-126-7) = 2**-6,
    # q = 1.999 * 64 = 127.94 -> 128, clamped to 2**7 - 1 = 127: 127/64 = 1.984375
    # = 2**(E+1-127) - LSB.
    t = quantize_bfp(block([1.999, -1.999], 8), "BFP16")
    assert t.element_significands()[:2].tolist() == [127, -127]
    assert t.dequantize()[:2].tolist() == [1.984375, -1.984375]
    # FLT_MAX: E = 254, q = (2**24 - 1) / 2**17 -> 128 -> clamp 127: 127 * 2**121.
    assert deq(block([FLT_MAX], 8), "BFP16")[0] == 127 * 2.0**121


def test_prime_saturates_at_top_exponent_instead_of_overflowing():
    # MX9, FLT_MAX = (2**24 - 1) * 2**104: E = 254, d = 0, LSB = 2**(254-127+1-7) = 2**121,
    # q = (2**24 - 1) / 2**17 = 127.99999 -> 128 = 2**7 would be 2**128 (not a float32); both
    # kernels keep M = 127: 127 * 2**121.
    for spec in (BFP_SPECS["MX9"], BFP_SPECS["MX9"].replace(kernel="cuda", rounding_mode=1)):
        t = quantize_bfp(block([FLT_MAX, -FLT_MAX]), spec)
        assert t.element_significands()[:2].tolist() == [127, -127]
        assert t.element_lsb_exponents()[0] == 121
        assert t.dequantize()[:2].tolist() == [127 * 2.0**121, -127 * 2.0**121]


def test_subnormals_flush_in_prime_but_not_in_plain_bfp():
    sub = np.array([0x00400000, 0x80600000], np.uint32).view(np.float32)  # 2**-127, -1.5*2**-127
    # to_bfp_prime: exponent field 0 -> significand 0, for every rounding mode and kernel.
    for kernel in BFP_KERNELS:
        for mode in (0, 1):
            t = quantize_bfp(
                block(sub), BFP_SPECS["MX9"].replace(kernel=kernel, rounding_mode=mode)
            )
            assert not t.mantissas.any() and t.shared_exponents.tolist() == [0]
            assert bits_of(t.dequantize()[:2]).tolist() == [0x00000000, 0x80000000]
    # to_bfp: E = 0, LSB = 2**(0-126-7) = 2**-133; 2**-127 = 64 LSBs, 1.5 * 2**-127 = 96 LSBs.
    t = quantize_bfp(block(sub, 8), "BFP16")
    assert t.element_significands()[:2].tolist() == [64, -96]
    assert bits_of(t.dequantize()[:2]).tolist() == bits_of(sub).tolist()


def test_signed_zeros():
    # Prime kernels: value = sign * 2**k * M, so a negative input that rounds to 0 gives -0.0.
    for kernel in BFP_KERNELS:
        out = deq(block([1.0, -1e-10]), BFP_SPECS["MX9"].replace(kernel=kernel))
        assert bits_of(out[1]) == 0x80000000
    # to_bfp, block [1.0, -1e-3]: q = 1e-3 * 64 = 0.064 -> M = 0.  std::round / dpu_round keep
    # -0.0; py3_round returns floor(-0.064) + 1 = +0.0.
    x = block([1.0, -1e-3, -0.0], 8)
    for mode, expected in [(0, 0x80000000), (1, 0x80000000), (2, 0x00000000)]:
        out = deq(x, BFP_SPECS["BFP16"].replace(rounding_mode=mode))
        assert bits_of(out[1]) == expected
        assert bits_of(out[2]) == 0x80000000  # -0.0 itself always stays -0.0
    # ... unless x / scale underflows to -0.0 in float32 first: block [2**127, -2**-149]:
    # LSB 2**121, q = 2**-270 <= 2**-150 -> -0.0, and py3_round(-0.0) = -0.0.
    tiny = np.array([0x80000001], np.uint32).view(np.float32)[0]
    out = deq(block([2.0**127, tiny], 8), BFP_SPECS["BFP16"].replace(rounding_mode=2))
    assert bits_of(out[1]) == 0x80000000


def test_flushed_zero_sign():
    # Prime blocks [1.0, -0.0, -2^-149 (subnormal), -1e-10]: the zero and the subnormal are
    # flushed, the normal -1e-10 rounds to 0.  "input": all three -0.0; "positive": the
    # flushed two +0.0 (quark.torch), the rounded one still -0.0.
    x = block([1.0, -0.0, -(2.0**-149), -1e-10])
    for sign, expected in [
        ("input", [0x80000000] * 3),
        ("positive", [0x00000000, 0x00000000, 0x80000000]),
    ]:
        t = quantize_bfp(x, BFP_SPECS["MX6"].replace(flushed_zero_sign=sign))
        assert bits_of(t.dequantize()[1:4]).tolist() == expected, sign
        assert t.mantissas[0, 1:4].tolist() == [0, 0, 0]
    for changes in (dict(kernel="cuda"), dict()):
        spec = BFP_SPECS["MX6" if changes else "BFP16"].replace(**changes)
        with pytest.raises(BFPSpecError, match="flushed_zero_sign 'positive'"):
            spec.replace(flushed_zero_sign="positive")
    with pytest.raises(UnknownNameError, match="flushed_zero_sign"):
        BFP_SPECS["MX6"].replace(flushed_zero_sign="negative")


# --------------------------------------------------------------------------------------------
# CUDA stochastic rounding
# --------------------------------------------------------------------------------------------

STOCHASTIC_MX6 = BFP_SPECS["MX6"].replace(kernel="cuda", rounding_mode=2, seed=1234)


def test_stochastic_is_reproducible_and_seed_dependent():
    x = np.tile(block([1.0, 1.03125, 0.3, -0.7]), 64)
    a = quantize_bfp(x, STOCHASTIC_MX6).mantissas
    b = quantize_bfp(x, STOCHASTIC_MX6).mantissas
    c = quantize_bfp(x, STOCHASTIC_MX6.replace(seed=99)).mantissas
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_stochastic_mean_is_unbiased_for_a_normal_value():
    # MX6, block [1.0, 1.03125, 0...]: E = 127, d = 0, LSB 2**-3, q = 8.25.  The CUDA kernel
    # keeps floor(2q) = 16 (not all ones) and adds 1 to M with probability
    # (low 20 raw bits = fraction 0x040000) / 2**20 = 0.25.  10,000 samples: sd of the mean
    # is sqrt(0.25 * 0.75 / 1e4) = 0.0043; allow 5 sd.
    x = np.tile(block([1.0, 1.03125]), 10_000)
    samples = quantize_bfp(x, STOCHASTIC_MX6).element_significands()[1::16]
    assert set(np.unique(samples)) == {8, 9}
    assert abs(samples.mean() - 8.25) < 0.022


def test_stochastic_quirks_exponent_bit_and_subnormals():
    # MX6 block [1.0, 0, 0.5, 0.046875, 0...]: E = 127; sub-block 1 has max exponent 126, so
    # d = 1 and LSB = 2**(127-127-1+1-4) = 2**-4; 0.046875 = 1.5 * 2**-5 (e = 122) is q = 0.75.
    # The CUDA shift is E-d-e+23-m = 23, so Quark compares the low 24 bits of the raw encoding,
    # whose bit 23 is the exponent's low bit (0 here), not the implicit 1: the round-up chance
    # is 0x400000 / 2**24 = 0.25, not 0.75.
    x = np.tile(block([1.0, 0.0, 0.5, 0.046875]), 10_000)
    samples = quantize_bfp(x, STOCHASTIC_MX6).element_significands()[3::16]
    assert abs(samples.mean() - 0.25) < 0.022
    # Subnormals are not flushed by stochastic rounding.  MX9, a block of 0x00010000 (2**-133):
    # E = 0, d = 0, CUDA shift 0-0-0+23-7 = 16, chance (0x10000 mod 2**17) / 2**17 = 0.5 of
    # M = 1, i.e. 1 * 2**(0-127+1-7) = 2**-133.
    sub = np.full(16 * 1000, np.array([0x00010000], np.uint32).view(np.float32)[0])
    t = quantize_bfp(sub, BFP_SPECS["MX9"].replace(kernel="cuda", rounding_mode=2, seed=7))
    assert set(np.unique(t.dequantize())) == {0.0, 2.0**-133}
    assert abs(t.element_significands().mean() - 0.5) < 0.02


# --------------------------------------------------------------------------------------------
# Kernels == reference twin (hypothesis)
# --------------------------------------------------------------------------------------------

FINITE_EDGE_BITS = [
    0x00000000,
    0x80000000,  # +-0
    0x00000001,
    0x80000001,
    0x007FFFFF,
    0x00400000,  # subnormals
    0x00800000,
    0x80800000,  # smallest normals
    0x7F7FFFFF,
    0xFF7FFFFF,
    0x7F000000,  # largest
    0x3F800000,
    0xBF800000,
    0x3FFC28F6,
    0x3FFFFFFF,  # 1, -1, 1.97, just below 2
]
NONFINITE_BITS = [0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001]


@st.composite
def near_exponent_bits(draw, base):
    exponent = min(max(base - draw(st.integers(-1, 12)), 0), 254)
    fraction = draw(
        st.one_of(st.integers(0, 2**23 - 1), st.sampled_from([0, 1, 0x7FFFFF, 0x7FFFF0, 0x400000]))
    )
    return (draw(st.integers(0, 1)) << 31) | (exponent << 23) | fraction


@st.composite
def block_rows(draw, block_size, max_blocks=4):
    """(blocks, block_size) uint32 float32 patterns: clustered exponents, edges, raw bits."""
    rows = []
    for _ in range(draw(st.integers(1, max_blocks))):
        base = draw(st.integers(0, 254))
        element = st.one_of(
            near_exponent_bits(base), st.sampled_from(FINITE_EDGE_BITS), st.integers(0, 2**32 - 1)
        )
        if draw(st.integers(0, 3)) == 0:
            element = st.one_of(element, st.sampled_from(NONFINITE_BITS))
        rows.append(draw(st.lists(element, min_size=block_size, max_size=block_size)))
    return np.array(rows, np.uint32)


def place_exact_ties(rows: np.ndarray, spec: BFPSpec, chosen: list[bool]) -> np.ndarray:
    """Rewrite the chosen elements' low bits so their scaled magnitude q is exactly k + 1/2.

    Only fraction bits change, so E and d (which depend on exponent fields) do not move.
    """
    m = spec.mantissa_bits
    out = rows.copy()
    flat_index = 0
    for b, row in enumerate(rows.tolist()):
        exps = [(v >> 23) & 0xFF for v in row]
        if spec.has_microexponents:
            shared = max(exps)
            s = spec.sub_block_size
            micro = [
                min(shared - max(exps[i - i % s : i - i % s + s]), 2**spec.sub_block_shift_bits - 1)
                for i in range(len(row))
            ]
        else:
            shared = max([e for e in exps if e != 255], default=0)
            micro = [0] * len(row)
        for j, v in enumerate(row):
            pick = chosen[flat_index % len(chosen)] if chosen else False
            flat_index += 1
            e = exps[j]
            if not pick or e == 255 or shared == 255 or (spec.has_microexponents and e == 0):
                continue
            shift = shared - micro[j] - max(e, 1) + 24 - m  # q = significand / 2**shift
            if 1 <= shift <= 23:
                out[b, j] = (v & ~((1 << shift) - 1) & 0xFFFFFFFF) | (1 << (shift - 1))
    return out


def run_kernel(spec: BFPSpec, rows: np.ndarray, words: np.ndarray):
    m = spec.mantissa_bits
    if spec.has_microexponents:
        shared, micro, mant, sign = _bfp_kernels.bfp_prime_kernel(
            rows,
            m,
            spec.sub_block_size,
            spec.sub_block_shift_bits,
            spec.rounding_mode,
            spec.kernel == "cuda",
            words,
            spec.flushed_zero_sign == "input",
        )
        return shared, micro, mant, sign, np.zeros(rows.shape, np.uint32)
    return _bfp_kernels.bfp_plain_kernel(rows, m, spec.rounding_mode)


def run_reference(spec: BFPSpec, rows: np.ndarray, words):
    return _bfp_reference.quantize_blocks_reference(
        rows,
        spec.method,
        spec.mantissa_bits,
        spec.sub_block_size,
        spec.sub_block_shift_bits,
        spec.rounding_mode,
        spec.kernel == "cuda",
        words,
        spec.flushed_zero_sign == "input",
    )


@st.composite
def rows_ties_and_words(draw, spec: BFPSpec):
    rows = draw(block_rows(spec.block_size))
    rows = place_exact_ties(rows, spec, draw(st.lists(st.booleans(), max_size=16)))
    # Random words: uniform, or next to the element's own bits to hit the comparison boundary.
    how = draw(st.sampled_from(["uniform", "equal", "one_below", "one_above"]))
    if how == "uniform":
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        words = rng.integers(0, 2**32, size=rows.shape, dtype=np.uint32)
    else:
        delta = {"equal": 0, "one_below": -1, "one_above": 1}[how]
        words = ((rows.astype(np.int64) + delta) % 2**32).astype(np.uint32)
    return rows, words


def assert_kernel_matches_reference(spec: BFPSpec, rows: np.ndarray, words: np.ndarray):
    got = run_kernel(spec, rows, words)
    want = run_reference(spec, rows, words)
    for name, g, w in zip(["shared", "micro", "mant", "sign", "special"], got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w), (name, spec, rows, g, w)


@pytest.mark.parametrize("kernel", BFP_KERNELS)
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(BFP_SPECS))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_kernel_matches_reference_named_specs(name, mode, kernel, data):
    spec = BFP_SPECS[name].replace(rounding_mode=mode, kernel=kernel)
    rows, words = data.draw(rows_ties_and_words(spec))
    assert_kernel_matches_reference(spec, rows, words)
    if spec.has_microexponents and kernel == "cpu":
        flushing = spec.replace(flushed_zero_sign="positive")
        assert_kernel_matches_reference(flushing, rows, words)


@st.composite
def free_specs(draw):
    method = draw(st.sampled_from(["to_bfp", "to_bfp_prime"]))
    if method == "to_bfp":
        block_size = draw(st.integers(1, 24))
        sub_block_size, shift_bits = block_size, 0
    else:
        sub_block_size = draw(st.integers(1, 6))
        block_size = sub_block_size * draw(st.integers(1, 6))
        shift_bits = draw(st.integers(0, 8))
    kernel = draw(st.sampled_from(BFP_KERNELS))
    flushable = method == "to_bfp_prime" and kernel == "cpu"
    return BFPSpec(
        method,
        bit_width=9 + draw(st.integers(1, 23)),
        block_size=block_size,
        sub_block_size=sub_block_size,
        sub_block_shift_bits=shift_bits,
        rounding_mode=draw(st.integers(0, 2)),
        kernel=kernel,
        seed=draw(st.integers(0, 2**32)),
        flushed_zero_sign=draw(
            st.sampled_from(FLUSHED_ZERO_SIGNS if flushable else FLUSHED_ZERO_SIGNS[:1])
        ),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_kernel_matches_reference_free_parameters(data):
    spec = data.draw(free_specs())
    rows, words = data.draw(rows_ties_and_words(spec))
    assert_kernel_matches_reference(spec, rows, words)


# --------------------------------------------------------------------------------------------
# Public API against the twin applied lane by lane (layout, axis, padding, dequantize)
# --------------------------------------------------------------------------------------------


def reference_dequantize_bits(x32: np.ndarray, spec: BFPSpec, axis: int) -> np.ndarray:
    """Quark's float32 output bits, built independently: per lane along ``axis`` (lanes in C
    order of the other axes), zero-pad, cut into blocks, quantize each with the twin."""
    moved = np.moveaxis(x32, axis, -1)
    length = moved.shape[-1]
    lanes = [
        lane.view(np.uint32).tolist() for lane in moved.reshape(math.prod(moved.shape[:-1]), length)
    ]
    bs = spec.block_size
    n_blocks = -(-length // bs)
    rows = []
    for lane in lanes:
        lane = lane + [0] * (n_blocks * bs - length)
        rows += [lane[i * bs : (i + 1) * bs] for i in range(n_blocks)]
    rows = np.array(rows, np.uint32).reshape(len(rows), bs)
    words = None
    if spec.has_microexponents and spec.kernel == "cuda" and spec.rounding_mode == 2:
        # the documented contract: one uint32 per padded element, blocked layout, C order
        words = np.random.default_rng(spec.seed).integers(0, 2**32, rows.shape, np.uint32)
    shared, micro, mant, sign, special = run_reference(spec, rows, words)
    out = np.zeros(rows.shape, np.uint32)
    for b in range(rows.shape[0]):
        for j in range(bs):
            if spec.has_microexponents and shared[b] == 255:
                out[b, j] = 0x7FFFFFFF
            elif special[b, j]:
                out[b, j] = special[b, j]
            else:
                d = int(micro[b, j // spec.sub_block_size]) if spec.has_microexponents else 0
                value = _bfp_reference.exact_element_value(
                    int(shared[b]), d, int(mant[b, j]), spec.mantissa_bits, spec.method
                )
                out[b, j] = _bfp_reference.float32_output_bits(value, bool(sign[b, j]))
    per_lane = out.reshape(len(lanes), n_blocks * bs)[:, :length]
    return np.moveaxis(per_lane.reshape(*moved.shape), -1, axis)


@st.composite
def tensors(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
    axis = draw(st.integers(-ndim, ndim - 1))
    shape = list(shape)
    shape[axis] = draw(st.integers(0, 40))
    size = math.prod(shape)
    element = st.one_of(
        st.integers(0, 2**32 - 1),
        st.sampled_from(FINITE_EDGE_BITS),
        st.builds(
            lambda s, e, f: (s << 31) | (e << 23) | f,
            st.integers(0, 1),
            st.integers(110, 135),
            st.integers(0, 2**23 - 1),
        ),
    )
    bits = np.array(draw(st.lists(element, min_size=size, max_size=size)), np.uint32)
    return bits.view(np.float32).reshape(shape), axis


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_quantize_bfp_matches_reference_lane_by_lane(data):
    x, axis = data.draw(tensors())
    spec = data.draw(
        st.one_of(
            st.builds(
                lambda s, k, r, seed: s.replace(kernel=k, rounding_mode=r, seed=seed),
                st.sampled_from(list(BFP_SPECS.values())),
                st.sampled_from(BFP_KERNELS),
                st.integers(0, 2),
                st.integers(0, 1000),
            ),
            free_specs(),
        )
    )
    t = quantize_bfp(x, spec, axis=axis)
    want = reference_dequantize_bits(x, spec, axis % x.ndim)
    got = t.dequantize()
    assert got.shape == x.shape and got.dtype == np.float32
    assert np.array_equal(bits_of(got), want)
    length = x.shape[axis]
    assert t.padding == -(-length // spec.block_size) * spec.block_size - length
    # The integer view: significand * 2**lsb is the dequantized value wherever it is finite.
    sig = t.element_significands().astype(np.float64)
    exact = np.ldexp(sig, t.element_lsb_exponents())
    finite = ~t.element_nonfinite_mask() & np.isfinite(got)
    assert np.array_equal(exact[finite], got[finite].astype(np.float64))


def test_axis_moves_blocks_and_padding_is_recorded():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((37, 5)).astype(np.float32)
    t0 = quantize_bfp(x, "MX6", axis=0)
    t1 = quantize_bfp(np.ascontiguousarray(x.T), "MX6", axis=-1)
    assert t0.axis == 0 and t0.padding == 11  # 37 -> 3 blocks of 16
    assert t0.shared_exponents.shape == (5, 3)
    assert t0.microexponents.shape == (5, 3, 8)
    assert t0.mantissas.shape == t0.sign_bits.shape == (5, 3, 16)
    assert np.array_equal(t0.mantissas, t1.mantissas)
    assert np.array_equal(bits_of(t0.dequantize()), bits_of(t1.dequantize().T))
    # Padding zeros do not disturb the real elements of the last block.
    lane = x[32:, 0]
    assert np.array_equal(bits_of(t0.dequantize()[32:, 0]), bits_of(deq(block(lane), "MX6")[:5]))


def test_float64_input_is_rounded_to_float32_first():
    x64 = np.array([1 + 2.0**-30, 1e300, -1e-300, 0.1, 3.0], np.float64)
    with np.errstate(over="ignore"):
        x32 = x64.astype(np.float32)  # 1.0, inf, -0.0, 0.1f, 3.0
    assert x32[0] == 1.0 and np.isinf(x32[1])
    for name in ("MX9", "BFP16"):
        a, b = quantize_bfp(x64, name), quantize_bfp(x32, name)
        assert np.array_equal(bits_of(a.dequantize()), bits_of(b.dequantize()))
        assert np.array_equal(a.mantissas, b.mantissas)


def test_empty_tensors():
    t = quantize_bfp(np.zeros((3, 0), np.float32), "MX9")
    assert t.dequantize().shape == (3, 0) and t.shared_exponents.shape == (3, 0)
    t = quantize_bfp(np.zeros((0, 20), np.float32), "BFP16", axis=1)
    assert t.dequantize().shape == (0, 20) and t.padding == 4


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


def test_unknown_name_lists_valid_ones():
    with pytest.raises(UnknownNameError) as info:
        quantize_bfp(f32([1.0]), "MX5")
    assert "BFP16, MX4, MX6, MX9" in str(info.value)
    assert isinstance(info.value, MxsimError)
    with pytest.raises(UnknownNameError, match="cpu, cuda"):
        BFP_SPECS["MX9"].replace(kernel="gpu")
    with pytest.raises(UnknownNameError, match="to_bfp, to_bfp_prime"):
        BFP_SPECS["MX9"].replace(method="to_mx")


def test_bad_axis():
    x = np.zeros((2, 3), np.float32)
    for axis in (2, -3):
        with pytest.raises(BFPAxisError, match="out of range"):
            quantize_bfp(x, "MX9", axis=axis)
    with pytest.raises(BFPAxisError, match="must be an int"):
        quantize_bfp(x, "MX9", axis=1.0)


@pytest.mark.parametrize("dtype", [np.int32, np.float16, np.complex64, np.uint32])
def test_wrong_dtype(dtype):
    with pytest.raises(BFPInputError, match="float32 or float64"):
        quantize_bfp(np.zeros(4, dtype), "MX9")


def test_non_array_and_scalar():
    for not_an_array in ([1.0, 2.0], np.float32(1.0), 1.0):
        with pytest.raises(BFPInputError, match="numpy array"):
            quantize_bfp(not_an_array, "MX9")
    with pytest.raises(BFPInputError, match="0-d"):
        quantize_bfp(np.array(1.0, np.float32), "MX9")


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(bit_width=9), "bit_width must be in \\[10, 32\\]"),
        (dict(bit_width=33), "bit_width must be in \\[10, 32\\]"),
        (dict(block_size=0), r"block_size must be in \[1, 4096\], got 0"),
        (dict(sub_block_size=3), "must divide block_size"),
        (dict(sub_block_shift_bits=9), "sub_block_shift_bits must be in \\[0, 8\\]"),
        (dict(rounding_mode=3), "rounding_mode must be in \\[0, 2\\]"),
        (dict(seed=-1), r"seed must be in \[0, 9223372036854775807\], got -1"),
        (dict(bit_width=True), "bit_width must be an int"),
        (dict(method="to_bfp"), "to_bfp has no microexponents"),
    ],
)
def test_spec_validation(changes, message):
    with pytest.raises(BFPSpecError, match=message):
        BFP_SPECS["MX9"].replace(**changes)


def test_smallest_lsb_is_still_a_float32():
    # dequantize relies on every finite element value being a float32 (except 2**128).  The
    # smallest LSB arises with E - d = 0 and m = 23: a to_bfp block of subnormals (E = 0) has
    # LSB 2**(0-126-23) = 2**-149, the smallest subnormal, and M < 2**23 keeps values subnormal.
    value = _bfp_reference.exact_element_value(0, 0, 3, 23, "to_bfp")
    assert value == Fraction(3, 2**149)
    assert _bfp_reference.float32_output_bits(value, True) == 0x80000003
    t = quantize_bfp(
        np.array([3, 0x00700000], np.uint32).view(np.float32),
        BFP_SPECS["BFP16"].replace(bit_width=32),
    )
    assert t.shared_exponents.tolist() == [0] and t.element_lsb_exponents()[0] == -149
    assert bits_of(t.dequantize()).tolist() == [3, 0x00700000]


@pytest.mark.parametrize("name", ["MX4", "MX6", "MX9", "BFP16"])
def test_as_mx_tensor_keeps_every_value(name):
    x = np.random.default_rng(9).standard_normal((5, 37)).astype(np.float32) * 8
    tensor = quantize_bfp(x, name, axis=1)
    mx = tensor.as_mx_tensor()
    assert mx.block_size == tensor.spec.sub_block_size
    assert mx.element_format.name == {"BFP16": "mx9"}.get(name, name.lower())
    np.testing.assert_array_equal(mx.dequantize(np.float32), tensor.dequantize())


def test_as_mx_tensor_needs_an_element_format():
    with pytest.raises(MxsimError, match="mantissa bits"):
        quantize_bfp(
            np.ones((2, 8), np.float32), BFP_SPECS["BFP16"].replace(bit_width=32), axis=1
        ).as_mx_tensor()
    with pytest.raises(MxsimError, match="Inf/NaN"):
        quantize_bfp(np.array([[1.0, np.inf] * 4], np.float32), "BFP16", axis=1).as_mx_tensor()


@pytest.mark.parametrize("spec", ["MX9", "MX6", "MX4"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_quantize_bfp_leaves_its_input_unchanged(spec, dtype):
    """quantize_bfp leaves every byte of ``x`` as it was: float32 with whole blocks along the
    last axis (the kernel's blocks are then ``x``'s own memory), padded, along the other
    axis, and float64 (a copy); -0, ±Inf, NaN and subnormals among the values."""
    rng = np.random.default_rng(4)
    for length in (64, 70):
        x = (rng.standard_normal((5, length)) * np.exp2(rng.integers(-8, 9, (5, 1)))).astype(dtype)
        x.reshape(-1)[:5] = [-0.0, np.inf, -np.inf, np.nan, 1e-40]
        kept = x.tobytes()
        quantize_bfp(x, spec, axis=-1)
        quantize_bfp(x, spec, axis=0)
        assert x.tobytes() == kept
