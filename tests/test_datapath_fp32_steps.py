"""The fp32-steps route (pairwise and exact steps) equals the generic kernel and the Fraction
twin bit for bit.

The route's independent oracle is MMA-Sim: ``mxsim.dot`` takes the route for the CDNA1 and
CDNA2 fp16 and bf16 units, which tests/test_oracles_mmasim.py compares with MMA-Sim's MFMA
instructions.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import (
    REPO,
    assert_kept_b_gives_the_generic_bits,
    assert_route_equals_generic_on_minilm,
    shipped_pairs_taking,
)
from mxsim import get_format
from mxsim.datapath import dot, fp32_steps, load_hwconfig
from mxsim.datapath.api import _kernel_arguments, dot_with_params, matmul_groups
from mxsim.datapath.reference import dot_reference

#: Every shipped unit and format pair the route takes (test_the_route_takes_exactly_these).
STEPS_UNITS = [
    ("mi100", "fp16"),
    ("mi100", "bf16"),
    ("mi250", "fp16"),
    ("mi250", "bf16"),
    ("mi250-bf16-legacy", "fp16"),
    ("mi250-bf16-legacy", "bf16"),
]


def unit(name: str):
    return load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")


def test_the_route_takes_exactly_these():
    assert shipped_pairs_taking(fp32_steps.fp32_steps_apply) == sorted(
        (name, f, f, "fp32") for name, f in STEPS_UNITS
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"accumulator_rounding": "toward_zero"},
        {"accumulator_format": "fp16"},
        {"output_format": "fp16"},
        {"output_zero_sign": "exact_positive"},
        {"c_entry": "end"},
        {"c_format": "fp64"},
        {"scales": "products"},
        {"product_fraction_bits": 10},
        {"product_overflow_exponent": 30},
        {"promotion_interval": 2},
        {"term_order": (1, 0, 3, 2)},
        {"a_format": "fp32", "b_format": "fp32"},  # products of 48 bits
        {"a_format": "fp32", "b_format": "fp8_e4m3"},  # 24 + 4 bits
    ],
)
def test_the_route_refuses_what_it_does_not_compute_pairwise(changes):
    params = unit("mi250").params("fp16", "fp16")
    assert fp32_steps.fp32_steps_apply(params)
    assert not fp32_steps.fp32_steps_apply(dataclasses.replace(params, **changes))


@pytest.mark.parametrize(
    "changes",
    [
        {"align_fraction_bits": 24},  # a window
        {"sum_significant_bits": 24},
        {"carry_bits": 30},
        {"second_alignment_bits": 31},
        {"accumulator_subnormals": False},
        {"output_zero_sign": "ieee"},
        {"accumulator_rounding": "toward_zero"},
        {"a_format": "fp64", "b_format": "fp64"},  # not binary32 values
    ],
)
def test_the_route_refuses_what_it_does_not_compute_exact(changes):
    params = unit("mi100").params("fp16", "fp16")
    assert fp32_steps.fp32_steps_apply(params)
    assert not fp32_steps.fp32_steps_apply(dataclasses.replace(params, **changes))


def test_the_route_takes_any_pair_of_formats_whose_products_it_holds_exactly():
    pairwise = unit("mi250").params("fp16", "fp16")
    pairs = [("tf32", "tf32"), ("tf32", "bf16"), ("fp8_e4m3", "fp16"), ("bf16", "fp8_e5m2")]
    for a_name, b_name in pairs:  # 11 + 11 bits at most: exact binary32 products
        changed = dataclasses.replace(pairwise, a_format=a_name, b_format=b_name)
        assert fp32_steps.fp32_steps_apply(changed)
    exact = unit("mi100").params("fp16", "fp16")
    for a_name, b_name in [("tf32", "fp16"), ("bf16", "tf32"), ("fp8_e5m2", "bf16")]:
        assert fp32_steps.fp32_steps_apply(
            dataclasses.replace(exact, a_format=a_name, b_format=b_name)
        )
    # fp32: no table of every code
    assert not fp32_steps.fp32_steps_apply(dataclasses.replace(exact, a_format="fp32"))


def test_the_route_waits_for_a_thread_that_keeps_subnormals(monkeypatch):
    params = unit("mi250").params("bf16", "bf16")
    monkeypatch.setattr(fp32_steps, "subnormals_work", lambda: False)
    assert not fp32_steps.fp32_steps_apply(params)


# --- the route's own outputs against the generic kernel and the twin ------------------------------


def codes_of(fmt_name: str, values: np.ndarray) -> np.ndarray:
    """The values' field codes (what the routes and kernels read; tf32's 19 bits)."""
    fmt = get_format(fmt_name)
    stored = fmt.encode(values, overflow="inf_nan" if fmt.has_nan else "saturate")
    return fmt.field_codes(stored, fmt_name).astype(np.uint32)


def stored(fmt_name: str, fields: np.ndarray) -> np.ndarray:
    """Field codes as stored codes (what ``dot`` takes)."""
    return fields.astype(np.uint64) << np.uint64(get_format(fmt_name).padding_bits)


def operand_codes(rng, fmt_name, shape, spread, corners):
    """Codes of (rows, K) Gaussian values with per-row magnitudes 2^±spread (clipped to the
    format's range; B is given as B^T: per column of B); with ``corners``, a few are ±0, the
    format's least subnormal and normal, its largest value, ±Inf, NaN."""
    fmt = get_format(fmt_name)
    magnitudes = np.exp2(rng.uniform(-spread, spread, (shape[0], 1)))
    values = np.clip(rng.standard_normal(shape) * magnitudes, -fmt.max_finite, fmt.max_finite)
    if corners:
        corner_values = [0.0, -0.0, fmt.min_subnormal, -fmt.min_normal, -fmt.max_finite]
        corner_values += [np.inf, -np.inf, np.nan] if fmt.has_nan else []
        where = rng.random(shape) < 0.03
        values[where] = rng.choice(corner_values, int(where.sum()))
    return codes_of(fmt_name, values)


def route_and_kernel(params, codes_a, codes_b, c):
    """(the route's own output codes, the outputs it leaves, the generic kernel's codes, the
    padded operands) of
    one GEMM of A's codes (M, K) and B^T's (N, K), K padded with +0 codes to whole blocks
    (as the API pads it)."""
    padding = -codes_a.shape[1] % params.block_size
    codes_a, codes_b = (np.pad(codes, ((0, 0), (0, padding))) for codes in (codes_a, codes_b))
    tile = (codes_a[None], codes_b[None], None, None, c[None])
    fast = np.empty((1, *c.shape), dtype=np.uint32)
    _, *left = fp32_steps.fp32_steps_matmul(params, *tile[:2], None, None, tile[4], fast)
    slow = np.empty_like(fast)
    blocks = max(1, -(-codes_a.shape[1] // params.block_size))
    no_scales = (np.zeros((1, len(codes), blocks), np.int32) for codes in (codes_a, codes_b))
    matmul_groups(tile[0], tile[1], *no_scales, tile[4], *_kernel_arguments(params)[2], slow)
    return fast[0], tuple(left), slow[0], (codes_a, codes_b)


def twin_code(params, codes_a, codes_b, c_value) -> int:
    """The Fraction twin's output code for one row of A's stored codes and one of B^T's."""
    value = dot_reference(params, codes_a.tolist(), codes_b.tolist(), c=float(c_value))
    return int(get_format(params.output_format).encode(np.array([value]), overflow="inf_nan")[0])


@st.composite
def steps_params(draw):
    """mi250's pairwise fp16 unit or mi100's exact one with what the route takes varied: the
    formats (for pairwise trees, pairs whose products fit 24 bits), trees of 1 to 9
    products, inputs and results flushed or kept, zero signs."""
    exact = draw(st.booleans())
    pairs = [("fp16", "fp16"), ("bf16", "bf16"), ("fp8_e4m3", "fp16"), ("bf16", "fp8_e5m2")]
    pairs += [("tf32", "bf16"), ("tf32", "tf32")]
    a_name, b_name = draw(st.sampled_from(pairs))
    return dataclasses.replace(
        unit("mi100" if exact else "mi250").params("fp16", "fp16"),
        a_format=a_name,
        b_format=b_name,
        fused_terms=draw(st.integers(1, 9)),
        input_subnormals=draw(st.booleans()),
        input_zero_sign=draw(st.sampled_from(["keep", "positive"])),
        accumulator_subnormals=exact or draw(st.booleans()),
        output_subnormals=draw(st.booleans()),
        output_zero_sign=draw(
            st.sampled_from(["positive", "exact_positive"] if exact else ["ieee", "positive"])
        ),
    )


@settings(max_examples=60, deadline=None)
@given(
    params=steps_params(),
    shape=st.tuples(st.integers(1, 5), st.integers(0, 70), st.integers(1, 6)),
    spread=st.sampled_from([0, 4, 20, 40, 70]),
    corners=st.sampled_from([False, False, True]),
    cancel=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_route_equals_generic_kernel_and_twin(params, shape, spread, corners, cancel, seed):
    rng = np.random.default_rng(seed)
    rows, length, columns = shape
    codes_a = operand_codes(rng, params.a_format, (rows, length), spread, corners)
    codes_b = operand_codes(rng, params.b_format, (columns, length), spread, corners)
    if cancel and length >= 2 and params.a_format == params.b_format:
        # B's first column A's first row with every other sign flipped: products that
        # cancel pair by pair (exact zero sums, and subnormal ones where they nearly do)
        flipped = codes_a[0].copy()
        fmt = get_format(params.a_format)
        flipped[1::2] ^= np.uint32(1 << (fmt.bits - fmt.padding_bits - 1))  # the sign bit
        codes_b[0] = flipped
    c = (rng.standard_normal((rows, columns)) * 2.0 ** rng.integers(-40, 40)).astype(np.float32)
    if corners:
        c.flat[rng.integers(0, c.size)] = rng.choice([0.0, -0.0, 1e-40, -1e-45, np.inf, np.nan])
    fast, left, slow, (padded_a, padded_b) = route_and_kernel(params, codes_a, codes_b, c)
    own = np.ones(fast.shape, dtype=bool)
    own[left] = False
    np.testing.assert_array_equal(fast[own], slow[own])
    for m, n in list(zip(*np.nonzero(own)))[:6]:
        twin = twin_code(
            params,
            stored(params.a_format, padded_a[m]),
            stored(params.b_format, padded_b[n]),
            c[m, n],
        )
        assert int(fast[m, n]) == twin, (m, n)
    small = params.a_format in ("fp16", "fp8_e4m3") or spread <= 20
    pairwise = params.structure == "pairwise_rounded"
    if pairwise and not corners and not cancel and small:
        assert own.all()  # realistic data stays on the route
    # The public API (route plus fallback) equals the generic kernel everywhere.
    m, n = (index.ravel() for index in np.indices(c.shape))
    rows_a, rows_b = stored(params.a_format, codes_a[m]), stored(params.b_format, codes_b[n])
    public = dot_with_params(params, rows_a, rows_b, c=c[m, n])
    generic = dot_with_params(params, rows_a, rows_b, c=c[m, n], method="kernel")
    np.testing.assert_array_equal(public, generic)


def test_a_flushing_unit_leaves_subnormal_sums_and_products_to_the_generic_kernel():
    # bf16: (1 + 2^-7) 2^-126 - 2^-126 = 2^-133 is an exact sum the machine keeps and the
    # unit flushes to +0; 2^-70 * 2^-60 and 2^-70 * 2^-63 are products below 2^-126.
    params = unit("mi250").params("bf16", "bf16")
    a = np.array([[(1 + 2.0**-7) * 2.0**-63, -(2.0**-63), 0.0, 0.0], [2.0**-70, 1.0, 0.0, 0.0]])
    b = np.array([[2.0**-63, 2.0**-63, 0.0, 0.0], [2.0**-60, 0.0, 0.0, 0.0]])
    codes_a, codes_b = codes_of("bf16", a), codes_of("bf16", b)
    c = np.zeros((2, 2), dtype=np.float32)
    fast, left, slow, _ = route_and_kernel(params, codes_a, codes_b, c)
    assert sorted(zip(*left)) == [(0, 0), (1, 0), (1, 1)]
    assert get_format("fp32").decode(slow[[0, 1], [0, 1]]).tolist() == [0.0, 0.0]
    assert get_format("fp32").decode(fast[0, 0]) == 2.0**-133  # the machine's (IEEE) sum
    kept = dataclasses.replace(params, accumulator_subnormals=True, output_subnormals=True)
    fast, left, slow, _ = route_and_kernel(kept, codes_a, codes_b, c)
    assert not left[0].size and np.array_equal(fast, slow)


def test_exact_steps_round_each_step_once():
    # mi100's bf16 steps (two products and c, summed exactly, rounded once): 1 + 2^-24 +
    # 2^-70 lies above the tie between 1 and 1 + 2^-23, so it rounds up; its float64 sum,
    # 1 + 2^-24, would round to even (down) once more. 2^-24 + 2^-80 is no float64 sum:
    # that step is left to the generic kernel, whose 1 + 2^-23 the float64 sum would miss.
    params = unit("mi100").params("bf16", "bf16")
    assert params.fused_terms == 2
    a = np.zeros((2, 32))  # a whole block: no padding
    a[0, :2], a[1, :2] = [2.0**-12, 2.0**-35], [2.0**-12, 2.0**-40]
    b = a[:, :].copy()
    c = np.ones((2, 2), dtype=np.float32)
    fast, left, slow, _ = route_and_kernel(params, codes_of("bf16", a), codes_of("bf16", b), c)
    above_the_tie = 0x3F800001  # 1 + 2^-23
    assert int(fast[0, 0]) == int(slow[0, 0]) == above_the_tie
    assert (1, 1) in set(zip(*left)) and int(slow[1, 1]) == above_the_tie


def test_zero_signs_follow_the_unit():
    # -0 * 1 is -0 and -0 * -1 is +0; -0 + -0 is -0, and c = -0 keeps it so, where the unit
    # keeps the inputs' zero signs and its outputs' (IEEE); -0 elements and c read as +0
    # (inputs.zero_sign: positive), or every zero output +0 (output.zero_sign: positive),
    # make both +0.
    params = unit("mi250").params("fp16", "fp16")
    a = np.full((1, 32), -0.0)  # a whole block: no +0 padding
    b = np.stack([np.ones(32), -np.ones(32)])
    c = np.array([[-0.0, -0.0]], dtype=np.float32)
    negative_zero = 0x80000000
    for zeros in ("keep", "positive"):
        for output_zero_sign in ("ieee", "positive"):
            changed = dataclasses.replace(
                params, input_zero_sign=zeros, output_zero_sign=output_zero_sign
            )
            fast, left, slow, _ = route_and_kernel(
                changed, codes_of("fp16", a), codes_of("fp16", b), c
            )
            assert not left[0].size and np.array_equal(fast, slow), (zeros, output_zero_sign)
            ieee = zeros == "keep" and output_zero_sign == "ieee"
            assert fast.tolist() == [[negative_zero if ieee else 0, 0]], (zeros, output_zero_sign)


# --- shipped units through the public API -------------------------------------------------------


@pytest.mark.parametrize(
    "name, fmt", [("mi250", "fp16"), ("mi250-bf16-legacy", "bf16"), ("mi100", "fp16")]
)
def test_route_over_tiles_groups_and_kept_b(name, fmt):
    # N beyond one tile of lanes, an odd M, groups, K not a whole number of trees, and B's
    # transposed values kept between calls.
    rng = np.random.default_rng(5)
    groups, rows, length, columns = 3, 7, 41, fp32_steps.P.LANES + 37
    a = rng.standard_normal((groups, rows, length)).astype(np.float32)
    b = rng.standard_normal((groups, length, columns)).astype(np.float32)
    c = rng.standard_normal((groups, rows, columns)).astype(np.float32)
    hw = unit(name)
    kw = dict(a_format=fmt, b_format=fmt, c=c, per_tensor_scale=True)
    assert_kept_b_gives_the_generic_bits(hw, a, b, kw, "fp32 steps")


@pytest.mark.parametrize("name, fmt", STEPS_UNITS)
def test_dot_route_equals_generic_kernel(name, fmt):
    rng = np.random.default_rng(9)
    rows, length = 3000, 13
    codes = [operand_codes(rng, fmt, (rows, length), 30, True) for _ in range(2)]
    c = rng.standard_normal(rows).astype(np.float32)
    hw = unit(name)
    kw = dict(a_format=fmt, b_format=fmt, c=c)
    assert np.array_equal(dot(hw, *codes, **kw), dot(hw, *codes, method="kernel", **kw))


@pytest.mark.parametrize("name, fmt", [("mi250", "fp16"), ("mi250", "bf16"), ("mi100", "bf16")])
def test_route_on_minilms_operands(minilm_operands, name, fmt):
    # A real transformer's activations and weight, and its attention heads.
    assert_route_equals_generic_on_minilm(unit(name), minilm_operands, fmt)
