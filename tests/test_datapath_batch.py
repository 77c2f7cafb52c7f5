"""The small-groups routes (``mxsim.datapath.batch``, ``_batch_kernels``): batches of small
GEMMs through exact-tree units and truncating-window units, bit for bit against the generic
kernel and the Fraction twin, corners included."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numba
import numpy as np
import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import mxsim.datapath.api as api
from conftest import REPO, arrays_in, same_float
from mxsim import get_format
from mxsim.datapath import load_hwconfig, matmul_batched, parse_hwconfig
from mxsim.datapath import _batch_kernels as batch_kernels
from mxsim.datapath import batch as batch_module
from mxsim.datapath.batch import (
    GROUPS_DECODED,
    SMALL_GROUP_OUTPUTS,
    WINDOW_GROUP_OUTPUTS,
    WINDOW_GROUP_VALUES,
    WINDOW_WIDE_OUTPUTS,
    WINDOW_WIDE_ROWS,
    exact_trees,
    small_groups_apply,
    window_groups_apply,
)
from mxsim.datapath.blas import grid_floor
from mxsim.datapath.reference import dot_reference
from mxsim.datapath.window import window_applies
from mxsim.quantize import MXGroups, quantize_bfp, quantize_grouped
from mxsim.quantize.mx import scale_exponents_of_codes

# (unit, element format): every accumulation of the route (trees rounded to nearest even,
# an exact accumulator, a fixed-point grid in each rounding mode) and element formats with
# and without NaN/Inf codes, subnormals and trees cut inside blocks (FP6's 11 + 11 + 10).
UNITS = [
    ("ocp-exact", "fp8_e4m3"),
    ("ocp-exact", "fp4_e2m1"),
    ("ocp-exact", "int8"),
    ("mxdotp-paper", "fp8_e4m3"),
    ("mxdotp-paper", "fp6_e2m3"),
    ("kulisch", "fp8_e4m3"),
    ("kulisch", "fp6_e3m2"),
    ("mxdotp", "fp8_e4m3"),
    ("mxdotp", "fp6_e3m2"),
    ("mxdotp-rtz", "fp8_e4m3"),
    ("mxdotp-rup", "fp4_e2m1"),
    ("mxdotp-rdn", "fp6_e2m3"),
    ("mxdotp-rmm", "fp8_e4m3"),
]
# Units whose wider groups (128-token heads) take the exact route too: trees of 32 float64
# sums (wider than 24 bits) or an exact accumulator's blocks of 32.
WIDE_TREE_UNITS = [
    ("ocp-exact", "fp8_e4m3"),
    ("kulisch", "fp8_e4m3"),
    ("kulisch", "fp6_e3m2"),
]
# Truncating-window units (``window_groups``): per-tensor units (H100/B200 FP8, one FP16),
# MX block-scaled ones (kind::mxf8f6f4) with FP8/FP6/FP4 elements.
WINDOW_UNITS = [
    ("h100-fp8", "fp8_e4m3"),
    ("b200-fp8", "fp8_e5m2"),
    ("h100-wgmma-fp8", "fp8_e4m3"),
    ("b200-tcgen05-fp8", "fp6_e3m2"),
    ("b200-tcgen05-mxf8f6f4", "fp8_e4m3"),
    ("b200-tcgen05-mxf8f6f4", "fp6_e2m3"),
    ("rtx50-mma-mxf8f6f4", "fp4_e2m1"),
    ("h100", "fp16"),
    ("mi300", "fp8_e5m2fnuz"),  # parity windows: trees of 16 as two windows of 8
]
SCALE_NAN = 0xFF


def hw(name: str):
    return load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")


def corner_codes(fmt_name: str) -> dict[str, np.ndarray]:
    """The format's codes by kind: zeros (both signs), subnormals, the largest magnitudes,
    NaN/Inf (empty where the format has none)."""
    fmt = get_format(fmt_name)
    codes = np.arange(1 << fmt.field_bits)
    values = fmt.decode_fields(codes)
    finite = np.isfinite(values)
    magnitudes = np.where(finite, np.abs(values), 0.0)
    smallest_normal = 2.0 ** (1 - fmt.bias)
    kinds = {
        "zero": codes[finite & (values == 0)],
        "subnormal": codes[finite & (magnitudes > 0) & (magnitudes < smallest_normal)],
        "largest": codes[finite & (magnitudes == magnitudes.max())],
        "special": codes[~finite],
    }
    return {kind: chosen for kind, chosen in kinds.items() if chosen.size}


def operands(
    rng,
    fmt_name: str,
    block: int,
    shape,
    corners: float,
    scaled: bool = True,
    specials=True,
    shifts=(0, 0),
    magnitudes=8,
    scale_corners=True,
):
    """(A, B) MXGroups of a (G, M, K) x (G, K, N) batch: realistic values (Gaussian and
    heavy-tailed, each row its own magnitude, 2^-``magnitudes`` to 2^``magnitudes``)
    quantized along K, then a fraction ``corners``
    of the codes replaced by corner codes (NaN/Inf among them if ``specials``) and, for a unit
    that takes scales (``scaled``) and ``scale_corners``, of the scales by 0xFF (NaN), 0
    (2^-127) and 254 (2^127);
    without, every scale 1. ``shifts``: added to A's and B's scale exponents (kept within
    E8M0's [-127, 127]; NaN scales kept): extreme scale pairs, with subnormal, underflowing
    and overflowing outputs."""
    groups, m, k, n = shape

    def grouped(rows, shift):
        x = rng.standard_normal((groups, rows, k))
        x *= np.exp2(rng.integers(-magnitudes, magnitudes + 1, (groups, rows, 1)))
        x[:, ::3] = rng.standard_t(3, size=x[:, ::3].shape)
        q = quantize_grouped(x.astype(np.float32), fmt_name, block)
        if corners:
            kinds = corner_codes(fmt_name)
            pool = np.concatenate([v for kind, v in kinds.items() if specials or kind != "special"])
            hit = rng.random(q.codes.shape) < corners
            q.codes[hit] = rng.choice(pool, size=int(hit.sum()))
            hit = rng.random(q.scales.shape) < (corners / 2 if scale_corners else 0.0)
            q.scales[hit] = rng.choice([SCALE_NAN, 0, 254], size=int(hit.sum()))
        if shift:
            moved = np.clip(q.scales.astype(np.int64) + shift, 0, 254).astype(np.uint8)
            q.scales[...] = np.where(q.scales == SCALE_NAN, SCALE_NAN, moved)
        if not scaled:
            q.scales[...] = 127
        return q

    a = grouped(m, shifts[0])
    b = dataclasses.replace(grouped(n, shifts[1]), shape=(k, n), axis=0)
    return a, b


def accumulator_inputs(rng, shape, corners: bool):
    """(G, M, N) float32 c, with -0, ±Inf, NaN, subnormals and zeros among them if ``corners``."""
    c = (rng.standard_normal(shape) * np.exp2(rng.integers(-10, 10, shape))).astype(np.float32)
    if corners:
        hit = rng.random(shape) < 0.1
        pool = np.array([-0.0, 0.0, np.inf, -np.inf, np.nan, 1e-40, -3e38], dtype=np.float32)
        c[hit] = rng.choice(pool, size=int(hit.sum()))
    return c


def special_outputs(a, b, c) -> np.ndarray:
    """(G, M, N) bool: the outputs the route must leave to the generic kernel: a NaN/Inf
    element in the row of A or column of B, a NaN scale in either, or c non-finite or -0."""
    fmt_a, fmt_b = a.element_format, b.element_format
    bad_a = ~np.isfinite(fmt_a.decode_fields(a.codes)).all(axis=-1) | (a.scales == SCALE_NAN).any(
        axis=-1
    )
    bad_b = ~np.isfinite(fmt_b.decode_fields(b.codes)).all(axis=-1) | (b.scales == SCALE_NAN).any(
        axis=-1
    )
    bad = bad_a[:, :, None] | bad_b[:, None, :]
    if c is not None:
        bad |= ~np.isfinite(c) | ((c == 0) & np.signbit(c))
    return bad


def run_route(
    monkeypatch,
    name,
    fmt_name,
    shape,
    seed,
    corners=0.0,
    with_c=True,
    specials=True,
    shifts=(0, 0),
    magnitudes=8,
    scale_corners=True,
):
    """The batch through the small-groups route (checked taken for G > 1), the generic
    kernel's bits and the outputs the route flagged (None where it was not taken); asserts
    the two agree bit for bit."""
    config = hw(name)
    rng = np.random.default_rng(seed)
    block = config.sections[("inputs", "block_size")]
    scaled = config.sections[("inputs", "scales")] != "none"
    a, b = operands(
        rng, fmt_name, block, shape, corners, scaled, specials, shifts, magnitudes, scale_corners
    )
    c = accumulator_inputs(rng, (shape[0], shape[1], shape[3]), corners > 0) if with_c else None
    flagged = []
    taken = []
    recompute = api._recompute
    routes = {name: getattr(api, name) for name in ("small_groups_matmul", "window_groups_matmul")}

    def recording_recompute(g, m, n, *rest):
        flagged.append(np.stack([g, m, n]))
        recompute(g, m, n, *rest)

    def recording(name):
        def route(*arguments):
            taken.append(name)
            return routes[name](*arguments)

        return route

    monkeypatch.setattr(api, "_recompute", recording_recompute)
    for route in routes:
        monkeypatch.setattr(api, route, recording(route))
    got = matmul_batched(config, a, b, c=c)
    params = config.params(fmt_name, fmt_name)
    exact = small_groups_apply(params, 1, 1, 1)
    expected = "small_groups_matmul" if exact else "window_groups_matmul"
    assert set(taken) == ({expected} if shape[0] > 1 else set())  # one GEMM: its own route
    marked = np.zeros(got.bits.shape, dtype=bool) if taken else None
    for triples in flagged if taken else ():  # (the per-GEMM routes' flags are their own)
        marked[tuple(triples)] = True
    monkeypatch.setattr(api, "_recompute", recompute)
    want = matmul_batched(config, a, b, c=c, method="kernel")
    np.testing.assert_array_equal(got.bits, want.bits)
    return config, a, b, c, got, marked


def check_flags(config, a, b, c, marked):
    """Every output with a special input is flagged; and, for the exact-tree units but an exact
    accumulator (whose sums wider than two float64s are flagged too), no other: the route
    computed them (the window units' flag values outside the normal ranges too). Only where
    the route was taken (``marked`` not None)."""
    if marked is None:
        return
    special = special_outputs(a, b, c)
    assert not (special & ~marked).any()
    params = config.params(a.element_format.name, b.element_format.name)
    if small_groups_apply(params, 1, 1, 1) and params.accumulator_format != "exact":
        np.testing.assert_array_equal(marked, special)


def check_twin(config, a, b, c, got, rng, count: int = 4):
    """A few outputs against the Fraction twin (``datapath.reference``)."""
    params = config.params(a.element_format.name, b.element_format.name)
    out_fmt = get_format(params.output_format)
    groups, m, n = got.bits.shape
    for _ in range(count):
        g, i, j = rng.integers(groups), rng.integers(m), rng.integers(n)
        scaled = params.scales != "none"
        padding = (np.uint64(x.element_format.padding_bits) for x in (a, b))
        a_codes, b_codes = (
            x.codes[g, k].astype(np.uint64) << p for x, k, p in zip((a, b), (i, j), padding)
        )
        twin = dot_reference(  # (the twin reads stored codes: tf32's fp32 pattern)
            params,
            a_codes.tolist(),
            b_codes.tolist(),
            a.scales[g, i].tolist() if scaled else None,
            b.scales[g, j].tolist() if scaled else None,
            0.0 if c is None else float(c[g, i, j]),
        )
        value = float(out_fmt.decode(got.bits[g, i : i + 1, j])[0])
        assert same_float(value, twin), (g, i, j, value, twin)


@pytest.mark.parametrize("name, fmt_name", UNITS)
@pytest.mark.parametrize(
    "shape",
    [
        (3, 16, 64, 16),  # decoded A and B filling whole pages of the kernel's scratch
        (2, 32, 64, 32),  # and its tree sums and accumulators too
    ],
)
def test_exact_route_on_groups_filling_whole_pages_of_its_scratch(
    monkeypatch, name, fmt_name, shape
):
    """The scratch arrays of ``_batch_kernels.exact_groups`` are laid out by page: arrays
    ending on a page's last element (where an off-by-one would overlap the next) keep the
    kernel's bits."""
    config, a, b, c, got, marked = run_route(monkeypatch, name, fmt_name, shape, seed=sum(shape))
    check_flags(config, a, b, c, marked)
    check_twin(config, a, b, c, got, np.random.default_rng(2))


@pytest.mark.parametrize("name, fmt_name", UNITS + WINDOW_UNITS)
@pytest.mark.parametrize(
    "shape",
    [
        (192, 14, 32, 14),  # MiniLM's q @ k^T heads
        (12, 14, 14, 32),  # its P @ v heads: K below one block
        (1, 1, 1, 1),  # G = M = N = K = 1 (one GEMM: the BLAS route)
        (2, 1, 1, 1),  # M = N = K = 1
        (3, 1, 70, 5),  # M = 1, K past two blocks
        (2, 7, 33, 1),  # N = 1, K one past a block
    ],
)
def test_route_equals_the_kernel_and_the_twin_on_realistic_data(monkeypatch, name, fmt_name, shape):
    config, a, b, c, got, marked = run_route(monkeypatch, name, fmt_name, shape, seed=sum(shape))
    check_flags(config, a, b, c, marked)
    check_twin(config, a, b, c, got, np.random.default_rng(1))


@pytest.mark.parametrize("specials", [True, False])
@pytest.mark.parametrize("name, fmt_name", UNITS + WINDOW_UNITS)
def test_route_flags_exactly_the_specials_and_computes_the_rest(
    monkeypatch, name, fmt_name, specials
):
    """Corner codes (zeros of both signs, subnormals, the largest, NaN/Inf if ``specials``),
    corner scales (NaN, 2^-127: subnormal and underflowing outputs, 2^127: overflow to Inf)
    and corner c (-0, ±Inf, NaN, subnormal)."""
    # (the window units flag values outside the normal ranges too: fewer corners)
    corners = 0.08 if (name, fmt_name) in UNITS else 0.01
    config, a, b, c, got, marked = run_route(
        monkeypatch, name, fmt_name, (6, 9, 70, 11), seed=5, corners=corners, specials=specials
    )
    check_flags(config, a, b, c, marked)
    assert marked.any() and not marked.all()
    check_twin(config, a, b, c, got, np.random.default_rng(2), count=8)


@pytest.mark.parametrize(
    "name, fmt_name",
    [("ocp-exact", "fp8_e4m3"), ("mxdotp", "fp8_e4m3"), ("b200-tcgen05-mxf8f6f4", "fp8_e4m3")],
)
def test_route_on_zeros_overflow_and_underflow(name, fmt_name):
    """All-zero operands of both signs give +0 outputs (a +0 c; -0 c is the kernel's);
    largest elements at scale 2^127 overflow to Inf; subnormal elements at 2^-127 round to
    fp32 subnormals or zero."""
    config = hw(name)
    rng = np.random.default_rng(3)
    kinds = corner_codes(fmt_name)
    block = config.sections[("inputs", "block_size")]
    a, b = operands(rng, fmt_name, block, (4, 5, 40, 6), 0.0)
    for codes, scale in ((kinds["zero"], 127), (kinds["largest"], 254), (kinds["subnormal"], 0)):
        for x in (a, b):
            x.codes[...] = rng.choice(codes, size=x.codes.shape)
            x.scales[...] = scale
        got = matmul_batched(config, a, b)
        want = matmul_batched(config, a, b, method="kernel")
        np.testing.assert_array_equal(got.bits, want.bits)
    zeros = kinds["zero"]
    for x in (a, b):
        x.codes[...] = rng.choice(zeros, size=x.codes.shape)
        x.scales[...] = 127
    got = matmul_batched(config, a, b)
    np.testing.assert_array_equal(got.bits, 0)  # +0: no output sign from products of zeros
    assert np.isinf(
        matmul_batched(
            config,
            dataclasses.replace(a, codes=np.full_like(a.codes, kinds["largest"][0])),
            dataclasses.replace(
                b,
                codes=np.full_like(b.codes, kinds["largest"][0]),
                scales=np.full_like(b.scales, 254),
            ),
        ).values
    ).all()


@pytest.mark.parametrize("fmt_name", ["fp8_e4m3", "fp6_e3m2", "fp4_e2m1"])
@pytest.mark.parametrize("name", ["ocp-exact", "kulisch"])
def test_exact_route_folds_extreme_scales_exactly(name, fmt_name):
    """The exact-tree route scales each decoded element by its block's 2^X: rows and columns
    mixing the largest and the smallest subnormal elements, at scales 2^-127 and 2^127 on
    either side and at 2^-127 on both (the widest and the smallest products), give the
    generic kernel's bits and the Fraction twin's."""
    config = hw(name)
    assert small_groups_apply(config.params(fmt_name, fmt_name), 5, 7, 40)  # (the route's case)
    rng = np.random.default_rng(11)
    kinds = corner_codes(fmt_name)
    smallest = kinds["subnormal"][
        np.argmin(np.abs(get_format(fmt_name).decode_fields(kinds["subnormal"])))
    ]
    extremes = np.concatenate([kinds["largest"], [smallest, smallest], kinds["subnormal"]])
    block = config.sections[("inputs", "block_size")]
    a, b = operands(rng, fmt_name, block, (3, 5, 40, 7), 0.0)
    for x in (a, b):
        x.codes[...] = rng.choice(extremes, size=x.codes.shape)
    for scale_a, scale_b in ((0, 254), (254, 0), (0, 0), (254, 254)):
        a.scales[...], b.scales[...] = scale_a, scale_b
        a.scales[0, 0, -1] = SCALE_NAN  # (one NaN scale: its row is flagged)
        got = matmul_batched(config, a, b)
        want = matmul_batched(config, a, b, method="kernel")
        np.testing.assert_array_equal(got.bits, want.bits)
        check_twin(config, a, b, None, got, np.random.default_rng(scale_a + scale_b), count=8)


@settings(max_examples=40, deadline=None)
@given(
    unit=st.sampled_from(UNITS + WINDOW_UNITS),
    shape=st.tuples(st.integers(1, 5), st.integers(1, 16), st.integers(1, 80), st.integers(1, 16)),
    corners=st.sampled_from([0.0, 0.0, 0.0, 0.03]),
    with_c=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_route_equals_the_kernel_on_random_batches(unit, shape, corners, with_c, seed):
    with pytest.MonkeyPatch.context() as monkeypatch:
        config, a, b, c, got, marked = run_route(
            monkeypatch, *unit, shape, seed, corners=corners, with_c=with_c
        )
    check_flags(config, a, b, c, marked)
    check_twin(config, a, b, c, got, np.random.default_rng(seed), count=2)


@settings(max_examples=60, deadline=None)
@given(
    unit=st.sampled_from(UNITS),
    shape=st.tuples(st.integers(2, 4), st.integers(1, 20), st.integers(1, 70), st.integers(1, 40)),
    corners=st.sampled_from([0.0, 0.0, 0.0, 0.02, 0.1]),
    shifts=st.sampled_from([(0, 0)] * 4 + [(-120, -120), (120, 100), (-127, 127), (-60, -70)]),
    with_c=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_exact_route_equals_the_kernel_and_the_twin_on_wide_and_extreme_batches(
    unit, shape, corners, shifts, with_c, seed
):
    """Exact-tree units on groups of up to 40 columns (several passes of the kernel's
    columns), corners and extreme scale pairs (subnormal, underflowing and overflowing
    outputs): every bit the generic kernel's, outputs checked against the Fraction twin,
    the flags exactly the special outputs (but an exact accumulator's wide sums)."""
    groups, m, k, n = shape
    assume(m * n <= SMALL_GROUP_OUTPUTS)
    with pytest.MonkeyPatch.context() as monkeypatch:
        config, a, b, c, got, marked = run_route(
            monkeypatch, *unit, shape, seed, corners=corners, with_c=with_c, shifts=shifts
        )
    check_flags(config, a, b, c, marked)
    check_twin(config, a, b, c, got, np.random.default_rng(seed), count=6)


@pytest.mark.parametrize(
    "name, fmt_name",
    [("mxdotp", "fp8_e4m3"), ("mxdotp-rtz", "fp8_e4m3"), ("mxdotp-rup", "fp4_e2m1")],
)
@pytest.mark.parametrize("c_kind", ["none", "tiny", "large"])
def test_grid_units_around_their_floors(name, fmt_name, c_kind):
    """A grid unit's batches whose every scale exponent sum X lies at, above or below the
    floors from which the route rounds each tree plainly or by the keep rule
    (``blas.grid_nearest_even_floor``, ``blas.grid_floor``), down to where a zero
    accumulator is kept (X < n - L - 150: a tiny negative sum would round to -0 otherwise),
    each group its own X; c none, tiny, or large (about 2^(X + L - n + 24): kept by the
    rule, where a directed rounding of acc + S would move it): every bit the generic
    kernel's."""
    config = hw(name)
    params = config.params(fmt_name, fmt_name)
    floor = grid_floor(params)
    fraction, left = params.grid_fraction_bits, params.grid_max_left_shift
    keep_zero = fraction - left - 150
    targets = [floor + 3, floor, floor - 1, floor - 20, keep_zero, keep_zero - 1, keep_zero - 30]
    rng = np.random.default_rng(17)
    shape = (len(targets), 6, 64, 7)
    a, b = operands(rng, fmt_name, 32, shape, 0.0)
    for g, x in enumerate(targets):
        a.scales[g] = 127 + x // 2
        b.scales[g] = 127 + x - x // 2
    c = None
    if c_kind != "none":
        c = accumulator_inputs(rng, (shape[0], shape[1], shape[3]), False)
        powers = (
            [-140] * len(targets)
            if c_kind == "tiny"
            else [x + left - fraction + 24 for x in targets]
        )
        c = (c * np.exp2(np.array(powers))[:, None, None]).astype(np.float32)
    got = matmul_batched(config, a, b, c=c)
    want = matmul_batched(config, a, b, c=c, method="kernel")
    np.testing.assert_array_equal(got.bits, want.bits)
    if c_kind == "none":  # a -0: the floors are where it matters
        assert (got.bits == 0x80000000).any()


@pytest.mark.parametrize("name", ["mxdotp-rtz", "mxdotp-rup", "mxdotp-rdn"])
def test_grid_keeps_large_accumulators_against_exact_sums(name):
    """A directed grid unit above its floor, accumulators just past the keep bound
    2^(X + L - n + 24) and tree sums of one product of the largest FP8 elements (few
    significant bits: acc + S is an exact float64, so the route's one-rounding step takes
    it): the rule keeps acc where rounding acc + S toward a side would move it; every bit
    the generic kernel's, and some outputs are c itself."""
    config = hw(name)
    params = config.params("fp8_e4m3", "fp8_e4m3")
    fraction, left = params.grid_fraction_bits, params.grid_max_left_shift
    rng = np.random.default_rng(23)
    shape = groups, m, k, n = (3, 5, 64, 6)
    a, b = operands(rng, "fp8_e4m3", 32, shape, 0.0)
    largest = corner_codes("fp8_e4m3")["largest"]
    for x in (a, b):
        x.codes[...] = corner_codes("fp8_e4m3")["zero"][0]
        x.codes[..., :: params.fused_terms] = rng.choice(
            largest, size=x.codes[..., :: params.fused_terms].shape
        )
        x.scales[...] = 127 - 5  # X = -10: above the floor
    bound = -10 + left - fraction + 24
    c = rng.choice([-1.0, 1.0], (groups, m, n)) * rng.uniform(1.0, 2.0, (groups, m, n))
    c = (c * 2.0**bound).astype(np.float32)
    got = matmul_batched(config, a, b, c=c)
    want = matmul_batched(config, a, b, c=c, method="kernel")
    np.testing.assert_array_equal(got.bits, want.bits)
    assert (got.values == c).any()


def flagged_outputs(monkeypatch, config, a, b, c=None):
    """``matmul_batched``'s result and the (G, M, N) outputs it left to the generic kernel."""
    groups, rows = a.codes.shape[:2]
    flagged = np.zeros((groups, rows, b.shape[1]), dtype=bool)
    recompute = api._recompute

    def recording_recompute(g, m, n, *rest):
        flagged[g, m, n] = True
        recompute(g, m, n, *rest)

    monkeypatch.setattr(api, "_recompute", recording_recompute)
    got = matmul_batched(config, a, b, c=c)
    monkeypatch.setattr(api, "_recompute", recompute)
    return got, flagged


@pytest.mark.parametrize(
    "name, fmt_name", [("ocp-exact", "fp8_e4m3"), ("mxdotp", "fp8_e4m3"), ("kulisch", "fp6_e3m2")]
)
def test_route_flags_infinite_elements_beside_zeros(monkeypatch, name, fmt_name):
    """NaN/Inf elements beside zeros in the other operand (±Inf times 0 is NaN, so every sum
    of such a row or column is non-finite): exactly their outputs are flagged, the rest
    computed, every bit the generic kernel's."""
    config = hw(name)
    assert small_groups_apply(config.params(fmt_name, fmt_name), 5, 7, 40)  # (the route's case)
    rng = np.random.default_rng(11)
    kinds = corner_codes(fmt_name)
    block = config.sections[("inputs", "block_size")]
    special = kinds.get("special", kinds["largest"])  # (FP6 has no NaN/Inf codes)
    zero = kinds["zero"][0]
    a, b = operands(rng, fmt_name, block, (4, 6, 40, 5), 0.0)

    a.codes[1, 2, 3] = special[0]
    b.codes[1, :, 3] = zero  # every product of that element is Inf (or NaN) times 0
    a.codes[2, 0, 7] = special[-1]
    b.codes[3, 4, :] = zero  # a column of zeros against a row with a special element
    a.codes[3, 1, 20] = special[0]
    got, flagged = flagged_outputs(monkeypatch, config, a, b)
    np.testing.assert_array_equal(flagged, special_outputs(a, b, None))
    want = matmul_batched(config, a, b, method="kernel")
    np.testing.assert_array_equal(got.bits, want.bits)
    if "special" in kinds:
        assert flagged[1, 2].all() and flagged[3, 1].all() and np.isnan(got.values[1, 2]).all()


def zero_tail_operands(rng, config, fmt_name, shape, tail: str, zero_from: int = 16):
    """(A, B) of a realistic batch whose codes from position ``zero_from`` on are set by
    ``tail``: "both" 0 in A and B (so the kernel's last tree of 32 sums its first 16 or 8
    positions), "a" / "b" 0 in that operand alone, "b special" 0 in A and B but a NaN/Inf
    (or largest) code in one column of B, "minus zero" the -0 code (not code 0) in A and
    B, "one group" 0 in every group but group 1, which keeps its codes."""
    block = config.sections[("inputs", "block_size")]
    a, b = operands(rng, fmt_name, block, shape, 0.0)
    kinds = corner_codes(fmt_name)
    operands_set = {"both": (a, b), "a": (a,), "b": (b,), "b special": (a, b)}
    for x in operands_set.get(tail, ()):
        x.codes[:, :, zero_from:] = 0
    if tail == "b special":
        b.codes[2, 3, zero_from + 4] = kinds.get("special", kinds["largest"])[0]
    if tail == "minus zero":
        negative = [code for code in kinds["zero"] if code != 0]
        for x in (a, b):
            x.codes[:, :, zero_from:] = negative[0] if negative else 0
    if tail == "one group":
        kept = a.codes[1].copy(), b.codes[1].copy()
        for x in (a, b):
            x.codes[:, :, zero_from:] = 0
        a.codes[1], b.codes[1] = kept
    return a, b


def check_route_flags_and_twin(monkeypatch, config, a, b, c, twin_seed: int, count: int):
    """The route's bits are the generic kernel's; it flags every special output, and no
    other where the accumulator is not exact; ``count`` outputs against the Fraction twin."""
    got, flagged = flagged_outputs(monkeypatch, config, a, b, c)
    want = matmul_batched(config, a, b, c=c, method="kernel")
    np.testing.assert_array_equal(got.bits, want.bits)
    special = special_outputs(a, b, c)
    assert not (special & ~flagged).any()
    params = config.params(a.element_format.name, b.element_format.name)
    if params.accumulator_format != "exact":
        np.testing.assert_array_equal(flagged, special)
    check_twin(config, a, b, c, got, np.random.default_rng(twin_seed), count=count)


@pytest.mark.parametrize("name, fmt_name", UNITS[:8])
@pytest.mark.parametrize("tail", ["both", "a", "b", "b special", "minus zero", "one group"])
@pytest.mark.parametrize("with_c", [False, True])
@pytest.mark.parametrize("length, zero_from", [(32, 16), (96, 72)])
def test_exact_route_with_zero_codes_past_half_a_tree(
    monkeypatch, name, fmt_name, tail, with_c, length, zero_from
):
    """Operands whose last tree's codes past its first half (16 of 32) or quarter (72 of
    96: the third tree's 8) are 0 in A and B (the kernel then decodes and sums those
    alone: ``_batch_kernels._live_trees``), in one of them only, beside a NaN/Inf
    code in B, or -0 codes: every bit the generic kernel's, the flags exactly the special
    outputs, outputs against the Fraction twin."""
    config = hw(name)
    rng = np.random.default_rng(17)
    a, b = zero_tail_operands(rng, config, fmt_name, (4, 6, length, 9), tail, zero_from)
    c = accumulator_inputs(rng, (4, 6, 9), False) if with_c else None
    check_route_flags_and_twin(monkeypatch, config, a, b, c, twin_seed=3, count=6)


@pytest.mark.parametrize("name, fmt_name", UNITS[:8])
@pytest.mark.parametrize("shape", [(5, 14, 14, 32), (3, 7, 8, 20), (3, 5, 40, 6), (2, 9, 70, 17)])
def test_exact_route_on_k_short_of_its_last_tree(monkeypatch, name, fmt_name, shape):
    """K ending before the last tree's half or quarter (P @ v's 14 in a tree of 32; 8; 40
    and 70, whose last trees of 32 hold 8 and 6 elements): the quantizer's zero padding is
    left out of the sums, every bit the generic kernel's and the twin's, corners among the
    codes and scales."""
    config, a, b, c, got, marked = run_route(
        monkeypatch, name, fmt_name, shape, seed=sum(shape), corners=0.03
    )
    check_flags(config, a, b, c, marked)
    check_twin(config, a, b, c, got, np.random.default_rng(4), count=6)


def live_trees_reference(codes_a, codes_b, g, trees, zero_code_zero):
    """``_batch_kernels._live_trees`` spelled out for group g: z = the first position from
    which every code of its A and B is 0 where code 0 is ±0 (``zero_code_zero``) and its
    codes at K - 1 are 0 in A's first row and B's first column, else K; for trees in
    order, a tree from z on sums nothing, another halves while a multiple of 16 with its
    second half from z on (out of order: every tree sums all). Returns (each tree's
    positions, the positions to decode, the trees to run: to the last that sums a
    position, and one more)."""
    length, count = codes_a.shape[2], len(trees)
    widths = [last - first for first, last, _ in trees.tolist()]
    if any(trees[t, 1] > trees[t + 1, 0] for t in range(count - 1)):
        return widths, length, count
    z = length
    if zero_code_zero and codes_a[g, 0, -1] == 0 and codes_b[g, 0, -1] == 0:
        while z > 0 and not (codes_a[g, :, z - 1].any() or codes_b[g, :, z - 1].any()):
            z -= 1
    terms = []
    for (first, _, _), width in zip(trees.tolist(), widths):
        summed = 0 if first >= z else width
        while summed and summed % 16 == 0 and first + summed // 2 >= z:
            summed //= 2
        terms.append(summed)
    summing = [t for t in range(count) if terms[t]]
    if not summing:
        return terms, 0, min(count, 1)
    t = summing[-1]
    return terms, min(length, int(trees[t, 0]) + terms[t]), min(count, t + 2)


@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(1, 5),
    columns=st.integers(1, 5),
    widths=st.lists(st.sampled_from([8, 11, 16, 32]), min_size=1, max_size=4),
    length_cut=st.integers(0, 40),
    zero_from=st.integers(0, 140),
    nonzero=st.lists(st.tuples(st.booleans(), st.integers(0, 4000)), max_size=3),
    zero_code_zero=st.booleans(),
    swap=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_live_trees_equals_its_reference(
    rows, columns, widths, length_cut, zero_from, nonzero, zero_code_zero, swap, seed
):
    from mxsim.datapath import _batch_kernels as kernels

    rng = np.random.default_rng(seed)
    ends = np.cumsum(widths)
    trees = np.stack([ends - widths, ends, np.zeros_like(ends)], axis=1).astype(np.int64)
    if swap and len(widths) > 1:  # trees out of order
        trees[[0, -1]] = trees[[-1, 0]]
    length = max(1, int(ends.max()) - length_cut)
    groups = 4
    codes = [rng.integers(1, 256, (groups, n, length)).astype(np.uint8) for n in (rows, columns)]
    for x in codes:  # zeros from a position on
        x[:, :, zero_from:] = 0
    for in_b, at in nonzero:  # a few nonzero codes put back anywhere
        x = codes[int(in_b)]
        x.reshape(-1)[at % x.size] = 1 + at % 255
    start, stop = 1, groups
    terms = np.full((stop - start, len(widths)), -1, dtype=np.int64)
    limits = np.full((stop - start, 2), -1, dtype=np.int64)
    kernels._live_trees(*codes, trees, zero_code_zero, start, stop, terms, limits)
    for g in range(start, stop):
        want_terms, decoded, run = live_trees_reference(*codes, g, trees, zero_code_zero)
        assert terms[g - start].tolist() == want_terms
        assert limits[g - start].tolist() == [decoded, run]


def zero_tail_batch(rng, config, fmt_name, shape, zero_from, corner):
    """(A, B, c) of a realistic batch, codes 0 in A and B from ``zero_from`` on, and one
    ``corner``: "none"; "a special" / "b special" a NaN/Inf (or largest) code inside A's /
    B's zero tail; "minus zero" the -0 code (not code 0) at the tail's first position;
    "nan scale" a NaN scale on the tail's last block; "bad c" c with NaN, ±Inf and -0
    among them; "minus zero c" every c -0; "overflow" c at ±3e38, so that accumulators
    overflow to ±Inf before the zero trees; "tiny" scales of 2^-127 and c = None, so that
    trees' sums round to ±0 (a negative one to -0, which a step with S = +0 turns to +0);
    "coarse" scales of 2^40 on the blocks from ``zero_from`` on (a grid's step of their
    zero trees, on a coarser grid, rounds the accumulator)."""
    block = config.sections[("inputs", "block_size")]
    shifts = (-127, -127) if corner == "tiny" else (0, 0)
    a, b = operands(rng, fmt_name, block, shape, 0.0, shifts=shifts)
    kinds = corner_codes(fmt_name)
    groups, m, length, n = shape
    for x in (a, b):
        x.codes[:, :, zero_from:] = 0
    odd = kinds.get("special", kinds["largest"])[0]
    if corner == "a special" and zero_from < length:
        a.codes[1, m - 1, length - 1] = odd
    if corner == "b special" and zero_from < length:
        b.codes[2, n - 1, zero_from] = odd
    if corner == "minus zero" and zero_from < length:
        negative = [code for code in kinds["zero"] if code != 0]
        a.codes[:, 0, zero_from] = negative[0] if negative else 0
    if corner == "nan scale":
        a.scales[0, 1, -1] = SCALE_NAN
        b.scales[3, 0, -1] = SCALE_NAN
    if corner == "coarse":
        for x in (a, b):
            x.scales[:, :, -(-zero_from // block) :] = 127 + 40
    c = None
    if corner in ("none", "a special", "b special", "minus zero", "nan scale", "coarse"):
        c = accumulator_inputs(rng, (groups, m, n), False)
    if corner == "bad c":
        c = accumulator_inputs(rng, (groups, m, n), True)
    if corner == "minus zero c":
        c = np.full((groups, m, n), -0.0, dtype=np.float32)
    if corner == "overflow":
        c = rng.choice(np.float32([-3e38, 3e38]), (groups, m, n)).astype(np.float32)
        for x in (a, b):
            x.scales[...] = np.where(x.scales == SCALE_NAN, SCALE_NAN, 254)
    return a, b, c


ZERO_TAIL_CORNERS = [
    "none",
    "a special",
    "b special",
    "minus zero",
    "nan scale",
    "bad c",
    "minus zero c",
    "overflow",
    "tiny",
    "coarse",
]


@pytest.mark.parametrize("name, fmt_name", UNITS)
@pytest.mark.parametrize("corner", ZERO_TAIL_CORNERS)
@pytest.mark.parametrize(
    "length, zero_from",
    [(32, 0), (32, 5), (32, 8), (32, 14), (32, 24), (32, 31), (64, 32), (64, 40)],
)
def test_exact_route_with_zero_tails(monkeypatch, name, fmt_name, corner, length, zero_from):
    """Codes 0 in A and B from a position on (every code; part of a tree; whole trees
    after it: ``_batch_kernels._live_trees``), beside every corner of the zero-code cut
    (``zero_tail_batch``): every bit the generic kernel's, the flags exactly the special
    outputs (no other where the accumulator is not exact), outputs against the Fraction
    twin."""
    config = hw(name)
    rng = np.random.default_rng(length + zero_from)
    a, b, c = zero_tail_batch(rng, config, fmt_name, (4, 6, length, 9), zero_from, corner)
    check_route_flags_and_twin(monkeypatch, config, a, b, c, twin_seed=5, count=3)


def test_zero_tails_reach_the_corners_they_name():
    """The corners of ``zero_tail_batch`` happen. "tiny" through mxdotp-paper (trees of 8,
    each rounded into the accumulator): the second tree's sums round to ±0, -0 where
    negative, and the zero trees after it turn those to +0, so every output is +0 (a
    kernel that skipped those steps would give -0). "overflow": infinite outputs."""
    config = hw("mxdotp-paper")
    rng = np.random.default_rng(32 + 14)
    a, b, c = zero_tail_batch(rng, config, "fp8_e4m3", (4, 6, 32, 9), 14, "tiny")
    values_a = a.element_format.decode_fields(a.codes).astype(np.float64)
    values_b = b.element_format.decode_fields(b.codes).astype(np.float64)
    second_tree = np.einsum("gik,gjk->gij", values_a[:, :, 8:16], values_b[:, :, 8:16])
    assert (second_tree < 0).any()
    got = matmul_batched(config, a, b, c=c).values
    assert (got == 0).all() and not np.signbit(got).any()
    a, b, c = zero_tail_batch(rng, config, "fp8_e4m3", (4, 6, 32, 9), 14, "overflow")
    assert np.isinf(matmul_batched(config, a, b, c=c).values).any()


@pytest.mark.parametrize("name, fmt_name", [("ocp-exact", "fp8_e4m3"), ("mxdotp-rtz", "fp8_e4m3")])
def test_route_computes_any_split_of_the_groups(monkeypatch, name, fmt_name):
    """The groups split over threads as ``run_in_threads`` cuts them: each group computed
    by a call of its own (in reverse order) gives the bits of one call over the batch."""
    calls = []

    def one_group_a_call(call, items, threads=None):
        for g in reversed(range(items)):
            calls.append(g)
            call(g, g + 1)

    monkeypatch.setattr(batch_module, "run_in_threads", one_group_a_call)
    config, a, b, c, got, marked = run_route(
        monkeypatch, name, fmt_name, (5, 14, 32, 14), seed=7, corners=0.02
    )
    assert calls == [4, 3, 2, 1, 0]
    check_flags(config, a, b, c, marked)


def test_lowered_bounds_hold_after_a_shape_was_checked(monkeypatch):
    # Only the unit checks are remembered: a bound lowered after a shape took the route (as
    # tests lower them, to send small groups to the per-GEMM routes) holds at once.
    for (name, fmt_name), bound, applies in (
        (UNITS[0], "SMALL_GROUP_OUTPUTS", small_groups_apply),
        (WINDOW_UNITS[0], "WINDOW_GROUP_OUTPUTS", window_groups_apply),
    ):
        params = hw(name).params(fmt_name, fmt_name)
        assert applies(params, 14, 14, 32)
        monkeypatch.setattr(batch_module, bound, 0)
        assert not applies(params, 14, 14, 32)


def test_which_units_and_groups_take_the_route():
    for name, fmt_name in UNITS:
        params = hw(name).params(fmt_name, fmt_name)
        assert small_groups_apply(params, 14, 14, 32)
        assert small_groups_apply(params, 1, SMALL_GROUP_OUTPUTS, 32)
        if (name, fmt_name) in WIDE_TREE_UNITS:  # 128-token heads too, up to 128 x 128
            for rows, columns in ((2, SMALL_GROUP_OUTPUTS), (128, 128), (128, 64), (64, 128)):
                assert small_groups_apply(params, rows, columns, 64)
            assert not small_groups_apply(params, 129, 128, 64)
        else:  # wide groups: BLAS tiles
            assert not small_groups_apply(params, 2, SMALL_GROUP_OUTPUTS, 32)
            assert not small_groups_apply(params, 128, 64, 64)
        # one group's decoded operands within the bound, B's columns padded to whole passes
        # of 16 (the kernel's scratch); longer ones keep the BLAS route
        assert small_groups_apply(params, 1, 48, GROUPS_DECODED // 64)
        assert not small_groups_apply(params, 1, 49, GROUPS_DECODED // 64)
        assert small_groups_apply(params, 1, 1, GROUPS_DECODED // 17)
        assert not small_groups_apply(params, 1, 1, GROUPS_DECODED // 17 + 1)
        assert not window_groups_apply(params, 14, 14, 32)
    for name, fmt_name in WINDOW_UNITS:
        params = hw(name).params(fmt_name, fmt_name)
        assert window_groups_apply(params, 14, 14, 32)
        assert not small_groups_apply(params, 14, 14, 32)
        assert window_groups_apply(params, 1, WINDOW_GROUP_OUTPUTS, 32)
        assert not window_groups_apply(params, 2, WINDOW_GROUP_OUTPUTS, 32)
        # lane tiles within the bound; longer groups keep the window route's work items
        length = WINDOW_GROUP_VALUES // WINDOW_GROUP_OUTPUTS
        assert window_groups_apply(params, 1, WINDOW_GROUP_OUTPUTS, length)
        assert not window_groups_apply(params, 1, WINDOW_GROUP_OUTPUTS, length + 1)
        # a narrow group's tile of B is 16 columns wide: its K x 16 within the bound too
        assert window_groups_apply(params, 1, 1, WINDOW_GROUP_VALUES // 16)
        assert not window_groups_apply(params, 1, 1, WINDOW_GROUP_VALUES // 16 + 1)
        # wide groups: 128-token heads either way round (64 x 128 computed as 128 x 64's
        # transpose), from 16 rows (or columns) and within WINDOW_WIDE_OUTPUTS outputs
        for rows, columns in ((128, 128), (128, 64), (64, 128), (16, 64), (64, 16)):
            assert window_groups_apply(params, rows, columns, 64)
        assert WINDOW_WIDE_OUTPUTS == 128 * 128 and WINDOW_WIDE_ROWS == 16
        assert not window_groups_apply(params, 15, 64, 64)
        assert not window_groups_apply(params, 64, 15, 64)
        assert not window_groups_apply(params, 129, 128, 64)
        assert not window_groups_apply(params, 2, 1024, 32)
        assert window_groups_apply(params, 128, 128, WINDOW_GROUP_VALUES // 128)
        assert not window_groups_apply(params, 128, 128, WINDOW_GROUP_VALUES // 128 + 1)
    for fmt_name in ("mx9", "mx6", "mx4", "int8"):  # folded trees of several scale blocks
        assert small_groups_apply(hw("bfp-exact").params(fmt_name, fmt_name), 14, 14, 32)
    refused = [
        ("ocp-exact", "fp8_e5m2"),  # tree sums wider than float64's 53 bits
        ("mi250", "fp16"),  # rounded pairwise adds: neither route's
    ]
    for name, fmt_name in refused:
        params = hw(name).params(fmt_name, fmt_name)
        assert not small_groups_apply(params, 14, 14, 32)
        assert not window_groups_apply(params, 14, 14, 32)


def test_which_units_and_gemms_take_the_tiled_route():
    """``exact_tiles_apply``: units rounding each tree of 32 float64 sums (ocp-exact on FP8
    E4M3), GEMMs of at least 128 rows and columns and a tile's decoded operands within
    ``GROUPS_DECODED``; an exact accumulator (kulisch), a grid (mxdotp), float32 sums
    (FP4) and window units keep their routes."""
    params = hw("ocp-exact").params("fp8_e4m3", "fp8_e4m3")
    assert batch_module.EXACT_TILE == 128
    assert batch_module.exact_tiles_apply(params, 128, 128, 64)
    assert batch_module.exact_tiles_apply(params, 4096, 1024, GROUPS_DECODED // 256)
    assert not batch_module.exact_tiles_apply(params, 4096, 1024, GROUPS_DECODED // 256 + 32)
    assert not batch_module.exact_tiles_apply(params, 127, 1024, 1024)
    assert not batch_module.exact_tiles_apply(params, 1024, 127, 1024)
    for name, fmt_name in [
        ("kulisch", "fp8_e4m3"),
        ("mxdotp", "fp8_e4m3"),
        ("mxdotp-paper", "fp8_e4m3"),
        ("ocp-exact", "fp4_e2m1"),
        ("bfp-exact", "mx9"),
        ("h100-fp8", "fp8_e4m3"),
    ]:
        other = hw(name).params(fmt_name, fmt_name)
        assert not batch_module.exact_tiles_apply(other, 1024, 1024, 1024), name


@pytest.fixture
def tiled(monkeypatch):
    """The tiled route taken wherever it applies, whichever route the processor's race
    picks (``exact_tiles_outrun_blas``)."""
    monkeypatch.setattr(api, "exact_tiles_outrun_blas", lambda *arguments: True)


class RaceClock:
    """A stand-in for ``time`` in ``datapath.batch`` whose ``thread_time`` advances by
    ``tiles`` seconds over a run of the tiled route and ``blas`` over one of the BLAS route
    (whichever ran since the last reading), counting the routes' runs."""

    def __init__(self, monkeypatch, tiles: float, blas: float):
        self.now, self.ran, self.runs = 0.0, None, []
        self.cost = {"tiles": tiles, "blas": blas}
        for name, attribute in (("tiles", "exact_tiles_matmul"), ("blas", "blas_matmul")):
            monkeypatch.setattr(
                batch_module, attribute, self.timed(name, getattr(batch_module, attribute))
            )
        monkeypatch.setattr(batch_module, "time", self)

    def timed(self, name, route):
        def run(*arguments):
            self.ran = name
            self.runs.append((name, numba.get_num_threads()))
            return route(*arguments)

        return run

    def thread_time(self) -> float:
        if self.ran is not None:
            self.now += self.cost[self.ran]
            self.ran = None
        return self.now


@pytest.mark.parametrize("tiles_faster", [True, False])
def test_the_race_between_the_tiles_and_the_blas_route(monkeypatch, tiles_faster):
    """``exact_tiles_outrun_blas`` runs each route once and then RACE_ROUNDS times in turn on
    one thread, compares their best times (a clock that makes one route faster), keeps its
    answer per unit (a second GEMM runs no race) and ``matmul_batched`` takes the winner,
    whose bits are the other's; without threadpoolctl (no BLAS thread control) it runs no
    race and picks the tiles."""
    config = hw("ocp-exact")
    params = config.params("fp8_e4m3", "fp8_e4m3")
    monkeypatch.setattr(batch_module, "_RACED", {})
    clock = RaceClock(monkeypatch, *((1.0, 2.0) if tiles_faster else (2.0, 1.0)))
    taken = []
    for name in ("exact_tiles_matmul", "blas_matmul"):
        route = getattr(api, name)
        monkeypatch.setattr(
            api, name, lambda *a, route=route, name=name: taken.append(name) or route(*a)
        )
    rng = np.random.default_rng(5)
    a, b = operands(rng, "fp8_e4m3", 32, (1, 128, 96, 130), 0.0)
    before = numba.get_num_threads()
    bits = [matmul_batched(config, a, b).bits for _ in range(2)]
    assert numba.get_num_threads() == before
    rounds = batch_module.RACE_ROUNDS
    assert clock.runs == [("tiles", 1), ("blas", 1)] * (rounds + 1)
    assert batch_module._RACED == {params: tiles_faster}
    winner = "exact_tiles_matmul" if tiles_faster else "blas_matmul"
    assert taken == [winner, winner]
    monkeypatch.setattr(api, "exact_tiles_apply", lambda *arguments: False)
    np.testing.assert_array_equal(bits[0], bits[1])
    np.testing.assert_array_equal(bits[0], matmul_batched(config, a, b).bits)
    monkeypatch.setattr(batch_module, "_blas_threads", lambda: None)
    monkeypatch.setattr(batch_module, "_RACED", {})
    assert batch_module.exact_tiles_outrun_blas(params, api._kernel_arguments(params)[2])
    assert batch_module._RACED == {}


@pytest.mark.parametrize("threads", [1, 2])
def test_tiled_route_runs_its_panels_tiles_in_any_split(monkeypatch, tiled, threads):
    """Consecutive batches of the tiled route (a panel's run of columns each), up to
    EXACT_RUN / EXACT_TILE tiles in all, split their tiles over the threads together: each
    tile computed by a call of its own, in reverse order, and the split of two threads both
    give the bits of the BLAS route, and progress after each panel; with EXACT_RUN halved,
    fewer tiles at a time."""
    config = hw("ocp-exact")
    shape = (2, 300, 64, 600)  # per group: 3 panels, each a run of 2 tiles and one of 1
    rng = np.random.default_rng(11)
    a, b = operands(rng, "fp8_e4m3", 32, shape, 0.05)
    c = accumulator_inputs(rng, (shape[0], shape[1], shape[3]), True)
    with monkeypatch.context() as patch:
        patch.setattr(api, "exact_tiles_apply", lambda *arguments: False)
        want = matmul_batched(config, a, b, c=c).bits
    calls = []

    def one_tile_a_call(call, items, threads=None):
        calls.append(items)
        for item in reversed(range(items)):
            call(item, item + 1)

    if threads == 1:
        monkeypatch.setattr(batch_module, "run_in_threads", one_tile_a_call)
    elif numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs Numba's pool to hold two threads")
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        for run in (batch_module.EXACT_RUN, batch_module.EXACT_RUN // 2):
            monkeypatch.setattr(batch_module, "EXACT_RUN", run)
            reports = []
            got = matmul_batched(config, a, b, c=c, progress=lambda *done: reports.append(done))
            np.testing.assert_array_equal(got.bits, want)
            assert [done for done, _ in reports] == [128, 256, 300, 428, 556, 600]
    finally:
        numba.set_num_threads(before)
    if threads == 1:  # per group: 8 tiles (two panels and a run) and 1; or each panel's 3
        assert calls == [8, 1, 8, 1] + [3] * 6


@pytest.mark.parametrize(
    "shape", [(2, 130, 70, 260), (1, 300, 200, 130), (1, 128, 40, 128), (1, 129, 64, 600)]
)
@pytest.mark.parametrize("corners", [0.0, 0.05])
@pytest.mark.parametrize("with_c", [False, True])
@pytest.mark.parametrize("wide", [True, False])
def test_tiled_route_equals_the_blas_route_and_the_kernel(
    monkeypatch, tiled, shape, corners, with_c, wide
):
    """GEMMs of at least 128 rows and columns through ocp-exact take the tiled route (its
    calls recorded): bits of the BLAS route (the tiled route turned off), of the generic
    kernel on the outputs it flags (specials, NaN scales, bad c: checked against
    ``special_outputs``) and of the Fraction twin. Tiles of 256 columns, or of 128 where K
    is too long for them (``GROUPS_DECODED`` lowered to just below a wide tile's need): N =
    130, 260 and 600 leave last tiles of 2, 4 and 88 (or 2, 4, 88) columns, padded to 128
    or 256, and runs of one tile beside them, whose per-output c is a (1, rows, width)
    array; M = 129, 130 and 300 last panels of 1, 2 and 44 rows; progress is reported after
    each panel, up to every row."""
    config = hw("ocp-exact")
    rng = np.random.default_rng(sum(shape))
    a, b = operands(rng, "fp8_e4m3", 32, shape, corners)
    c = accumulator_inputs(rng, (shape[0], shape[1], shape[3]), corners > 0) if with_c else None
    padded = -(-shape[2] // 32) * 32
    if not wide:
        narrow = (batch_module.EXACT_TILE + batch_module.EXACT_WIDE_TILE) * padded - 1
        monkeypatch.setattr(batch_module, "GROUPS_DECODED", narrow)
    widths = []
    exact_arguments = batch_module._exact_arguments

    def recording_widths(params, kernel_args, codes_a, codes_b, *rest):
        widths.append(codes_b.shape[1])
        return exact_arguments(params, kernel_args, codes_a, codes_b, *rest)

    monkeypatch.setattr(batch_module, "_exact_arguments", recording_widths)
    calls, flagged, reports = [], [], []
    tiled, recompute = api.exact_tiles_matmul, api._recompute

    def recording(*arguments):
        calls.append(True)
        return tiled(*arguments)

    def recording_recompute(g, m, n, *rest):
        flagged.append(np.stack([g, m, n]))
        recompute(g, m, n, *rest)

    monkeypatch.setattr(api, "exact_tiles_matmul", recording)
    monkeypatch.setattr(api, "_recompute", recording_recompute)
    bits = matmul_batched(config, a, b, c=c, progress=lambda *done: reports.append(done)).bits
    assert calls == [True]
    marked = np.zeros(bits.shape, dtype=bool)
    for g, m, n in flagged:
        marked[g, m, n] = True
    np.testing.assert_array_equal(marked, special_outputs(a, b, c))
    total = shape[0] * shape[1]
    assert reports[-1] == (total, total) and len(reports) == shape[0] * -(-shape[1] // 128)
    width = 256 if wide else 128
    whole, rest = shape[3] // width, -(-(shape[3] % width) // 128) * 128
    assert set(widths) == ({width} if whole else set()) | ({rest} if rest else set())
    assert all(x[0] < y[0] for x, y in zip(reports, reports[1:]))
    monkeypatch.setattr(api, "exact_tiles_apply", lambda *arguments: False)
    np.testing.assert_array_equal(bits, matmul_batched(config, a, b, c=c).bits)
    check_twin(config, a, b, c, matmul_batched(config, a, b, c=c), np.random.default_rng(7))


@pytest.mark.parametrize("name", ["mi250"])
def test_units_outside_the_routes_keep_their_bits_in_small_batches(name):
    """A unit of neither route (the generic kernel): the batch still equals the generic
    kernel."""
    config = hw(name)
    per_tensor = config.sections[("inputs", "scales")] == "none"
    rng = np.random.default_rng(7)
    a = rng.standard_normal((16, 14, 32)) * np.exp2(rng.integers(-6, 6, (16, 14, 1)))
    b = rng.standard_normal((16, 32, 14))
    c = accumulator_inputs(rng, (16, 14, 14), False)
    np.testing.assert_array_equal(
        matmul_batched(config, a, b, c=c, per_tensor_scale=per_tensor).bits,
        matmul_batched(config, a, b, c=c, per_tensor_scale=per_tensor, method="kernel").bits,
    )


@pytest.mark.parametrize("name, fmt_name", WIDE_TREE_UNITS)
@pytest.mark.parametrize(
    "shape",
    [
        (2, 47, 40, 33),  # odd M, N two passes and one column, K past a block
        (3, 128, 64, 17),  # 128-token rows, N one past a pass
        (2, 33, 64, 64),  # whole passes, an odd last row
    ],
)
@pytest.mark.parametrize("corners", [0.0, 0.05])
def test_wide_tree_units_take_groups_past_small_ones(monkeypatch, name, fmt_name, shape, corners):
    """Groups of more than ``SMALL_GROUP_OUTPUTS`` outputs of the wide-tree units take the
    exact small-groups route (``run_route`` checks it taken): bits of the generic kernel,
    flags, the Fraction twin."""
    assert shape[1] * shape[3] > SMALL_GROUP_OUTPUTS
    config, a, b, c, got, marked = run_route(
        monkeypatch, name, fmt_name, shape, seed=sum(shape), corners=corners
    )
    check_flags(config, a, b, c, marked)
    check_twin(config, a, b, c, got, np.random.default_rng(3))


@pytest.mark.parametrize("name, fmt_name", WIDE_TREE_UNITS[1:])
@pytest.mark.parametrize("shape", [(3, 128, 64, 128), (3, 128, 128, 64), (4, 9, 40, 21)])
@pytest.mark.parametrize("corners", ["none", "codes", "codes and scales"])
def test_exact_accumulator_sums_a_heads_trees_as_one(monkeypatch, name, fmt_name, shape, corners):
    """Attention heads of one magnitude (scales a few binades apart): the exact
    accumulator's groups are summed as one tree over all of K (``one_sum_fits`` holds for
    every group), and the outputs are the generic kernel's bits (flags checked) and the
    Fraction twin's; also with corners among the codes (NaN/Inf, zeros, the largest), and
    among the scales too (NaN, 2^-127, 2^127: groups then are summed tree by tree)."""
    config, a, b, c, got, marked = run_route(
        monkeypatch,
        name,
        fmt_name,
        shape,
        seed=sum(shape),
        corners=0.0 if corners == "none" else 0.05,
        magnitudes=0,
        scale_corners=corners == "codes and scales",
    )
    check_flags(config, a, b, c, marked)
    check_twin(config, a, b, c, got, np.random.default_rng(5))
    params = config.params(fmt_name, fmt_name)
    trees = exact_trees(params, shape[2])
    room = 53 - batch_module.tree_sum_bits(params)
    exponents = [scale_exponents_of_codes(operand.scales) for operand in (a, b)]
    fits = [batch_kernels.one_sum_fits(*exponents, g, trees, room) for g in range(shape[0])]
    assert all(fits) or corners == "codes and scales"


def test_one_sum_fits_at_the_edge_of_float64():
    """kulisch on FP8 E4M3: a tree of 32 unscaled products needs 41 bits (448 < 2^9, the
    least subnormal 2^-9: products from 2^-18 to below 2^18, times 32), so its trees sum
    exactly as one where sum_t 2^(h_t - m) <= 2^12 (h_t a tree's largest Xa + Xb, m the
    group's least). Two trees at 11 above m: 2^11 + 2^11 = 2^12, at the edge; at 12 past
    it; three trees at 11, 10, 10 at the edge again; one more binade on the last past it.
    NaN scales, trees that do not adjoin, no room: False."""
    params = hw("kulisch").params("fp8_e4m3", "fp8_e4m3")
    assert batch_module.tree_sum_bits(params) == 41

    def fits(rises, trees=None, room=12, nan=False):
        blocks = len(rises)
        trees = exact_trees(params, 32 * blocks) if trees is None else trees
        scales_a = np.zeros((2, 2, blocks), dtype=np.int32)  # row 0 at m = 0 in every block
        scales_a[1, 1] = rises  # (group 1; group 0 all at m)
        scales_b = np.full((2, 3, blocks), -5, dtype=np.int32)  # (m = -5 then)
        if nan:  # (every scale: one NaN among others lies above any room by itself)
            scales_a[1] = scales_b[1] = batch_module.SCALE_NAN
        both = [batch_kernels.one_sum_fits(scales_a, scales_b, g, trees, room) for g in (0, 1)]
        assert both[0] == (room >= 0 and np.array_equal(trees[1:, 0], trees[:-1, 1]))
        return both[1]

    assert fits([11, 11])
    assert not fits([11, 12])
    assert fits([11, 10, 10])
    assert not fits([11, 10, 11])
    assert fits([0, 0, 0, 0])
    assert not fits([0, 0], nan=True)
    assert not fits([0, 0], room=-1)
    assert not fits([0, 0], np.array([[0, 32, 0], [40, 72, 1]], dtype=np.int64))


@pytest.mark.parametrize("terms", [0, 1, 3, 7, 8, 9, 10, 11, 15, 16, 17, 24, 31, 32, 33, 40])
def test_tree_sums_of_two_rows_are_their_exact_sums(terms):
    """``_batch_kernels._tree_sums`` (two rows of A against a pass of B, flat arrays at
    offsets) against sums of Fractions, bit for bit: FP8 values, zeros of both signs among
    them; lane 0's products all zeros, lane 1's cancelling in the second row, and lanes 2
    and 3 all -0 in the first and the second row (exact zero sums: +0); other entries of
    the sums left as they were."""
    lanes = batch_kernels.LANES
    fmt = get_format("fp8_e4m3")
    values = fmt.decode_fields(np.arange(256))
    values = values[np.isfinite(values)]
    rng = np.random.default_rng(terms)
    at_a, at_a2, at_b = 5, 5 + terms + 3, 2
    a = rng.choice(values, size=at_a2 + terms + 4)
    b = rng.choice(values, size=at_b + max(terms, 1) * lanes + 7)
    a[rng.random(a.size) < 0.1] *= 0.0  # (±0 elements)
    b_rows = b[at_b : at_b + terms * lanes].reshape(terms, lanes)
    b_rows[:, 0] = rng.choice([0.0, -0.0], size=terms)
    half = terms // 2  # the second row's positions half + m cancel positions m in lane 1
    a[at_a2 + half : at_a2 + 2 * half] = -a[at_a2 : at_a2 + half]
    b_rows[half : 2 * half, 1] = b_rows[:half, 1]
    if terms % 2:
        b_rows[-1, 1] = 0.0
    for lane, row in ((2, at_a), (3, at_a2)):  # zeros of the other sign than the row's elements
        b_rows[:, lane] = np.copysign(0.0, -np.copysign(1.0, a[row : row + terms]))
    sums = np.full(4 * lanes, 7.0)
    at_sums, at_sums2 = lanes, 3 * lanes
    batch_kernels._tree_sums(
        a,
        np.uint64(at_a),
        np.uint64(at_a2),
        b,
        np.uint64(at_b),
        terms,
        sums,
        np.uint64(at_sums),
        np.uint64(at_sums2),
    )
    for row, at_out in ((at_a, at_sums), (at_a2, at_sums2)):
        for jj in range(lanes):
            exact = sum(
                (Fraction(a[row + m]) * Fraction(b_rows[m, jj]) for m in range(terms)),
                Fraction(0),
            )
            want = float(exact)  # (Fraction 0 is +0.0)
            got = sums[at_out + jj]
            assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want), (
                row,
                jj,
            )
    assert (sums[:lanes] == 7.0).all() and (sums[2 * lanes : 3 * lanes] == 7.0).all()


def test_exact_trees_are_the_blas_routes_trees():
    # fused_terms 32 in blocks of 32: one tree per block, the padding's included
    ocp = hw("ocp-exact").params("fp8_e4m3", "fp8_e4m3")
    assert exact_trees(ocp, 14).tolist() == [[0, 32, 0]]
    assert exact_trees(ocp, 70).tolist() == [[0, 32, 0], [32, 64, 1], [64, 96, 2]]
    # a grid's trees of 8 stop at K; FP6's 11 + 11 + 10 restart at each block
    grid8 = hw("mxdotp").params("fp8_e4m3", "fp8_e4m3")
    assert exact_trees(grid8, 40).tolist() == [
        [0, 8, 0],
        [8, 16, 0],
        [16, 24, 0],
        [24, 32, 0],
        [32, 40, 1],
    ]
    grid6 = hw("mxdotp").params("fp6_e3m2", "fp6_e3m2")
    assert grid6.fused_terms == 11
    assert exact_trees(grid6, 40).tolist() == [[0, 11, 0], [11, 22, 0], [22, 32, 0], [32, 43, 1]]
    # an exact accumulator: one sum per scale block
    kulisch = hw("kulisch").params("fp8_e4m3", "fp8_e4m3")
    assert exact_trees(kulisch, 33).tolist() == [[0, 32, 0], [32, 64, 1]]
    # folded trees of 8 sub-blocks of 2: one (folded) scale per tree of 16
    bfp = hw("bfp-exact").params("mx9", "mx9")
    assert exact_trees(bfp, 14).tolist() == [[0, 16, 0]]
    assert exact_trees(bfp, 33).tolist() == [[0, 16, 0], [16, 32, 1], [32, 48, 2]]


@pytest.mark.parametrize("name", ["ocp-exact", "mxdotp-paper", "mxdotp"])
def test_route_rounds_c_plus_a_tree_sum_once(name):
    """c = 1 plus a tree sum S = (2^16 + 2^-18) * 2^-40 = 2^-24 + 2^-58: the exact sum lies
    just above the midpoint of 1 and 1 + 2^-23, so one rounding gives 1 + 2^-23, while
    rounding it to float64 first (2^-58 is below its last place at 1) leaves the midpoint,
    which rounds to even: 1."""
    config = hw(name)
    groups, m, k, n = 3, 2, 32, 2
    x = np.zeros((groups, m, k), dtype=np.float32)
    x[..., 0], x[..., 1] = 256.0, 2.0**-9  # fp8_e4m3: 2^8 and its least subnormal
    a = quantize_grouped(x, "fp8_e4m3", 32)
    b = dataclasses.replace(quantize_grouped(x[:, :n], "fp8_e4m3", 32), shape=(k, n), axis=0)
    a.scales[...] = 127 - 20  # 2^-20 each: Xa + Xb = -40
    b.scales[...] = 127 - 20
    c = np.ones((groups, m, n), dtype=np.float32)
    got = matmul_batched(config, a, b, c=c)
    np.testing.assert_array_equal(got.values, np.float32(1.0 + 2.0**-23))
    np.testing.assert_array_equal(got.bits, matmul_batched(config, a, b, c=c, method="kernel").bits)


@pytest.mark.parametrize("name", ["ocp-exact", "mxdotp-paper", "mxdotp"])
def test_route_rounds_a_tree_sum_plus_a_tiny_c_once(name):
    """c = 2^-58 plus a tree sum S = (2^16 + 2^-8) * 2^-16 = 1 + 2^-24, the midpoint of 1 and
    1 + 2^-23: the exact sum lies just above it, so one rounding gives 1 + 2^-23, while t =
    RN64(c + S) is the midpoint itself (t - c == S, only t - S != c shows it inexact), which
    rounds to even: 1."""
    config = hw(name)
    groups, m, k, n = 3, 2, 32, 2
    x = np.zeros((groups, m, k), dtype=np.float32)
    x[..., 0], x[..., 1] = 256.0, 2.0**-4
    a = quantize_grouped(x, "fp8_e4m3", 32)
    b = dataclasses.replace(quantize_grouped(x[:, :n], "fp8_e4m3", 32), shape=(k, n), axis=0)
    a.scales[...] = 127 - 8  # 2^-8 each: Xa + Xb = -16
    b.scales[...] = 127 - 8
    c = np.full((groups, m, n), 2.0**-58, dtype=np.float32)
    got = matmul_batched(config, a, b, c=c)
    np.testing.assert_array_equal(got.values, np.float32(1.0 + 2.0**-23))
    np.testing.assert_array_equal(got.bits, matmul_batched(config, a, b, c=c, method="kernel").bits)


@pytest.mark.parametrize("name, later", [("ocp-exact", 32), ("mxdotp-paper", 8), ("mxdotp", 8)])
def test_route_rounds_a_first_tree_from_zero_to_fp32(name, later):
    """c = None and a first tree sum S0 = (2^16 + 2^-18) * 2^-16 = 1 + 2^-34, which is not
    a float32 value, then the next tree's sum (its first position ``later``) S1 = 2^-24: a
    unit rounding each tree into fp32 holds RNE_fp32(S0) = 1, so 1 + S1 is the midpoint of 1
    and 1 + 2^-23, which rounds to even: 1; had the first sum stayed unrounded, 1 + 2^-34 +
    2^-24 lies above it (1 + 2^-23)."""
    config = hw(name)
    groups, m, k, n = 3, 2, 64, 2
    x = np.zeros((groups, m, k), dtype=np.float32)
    x[..., 0], x[..., 1] = 256.0, 2.0**-9  # fp8_e4m3: 2^8 and its least subnormal
    x[..., later] = 2.0**-4
    a = quantize_grouped(x, "fp8_e4m3", 32)
    b = dataclasses.replace(quantize_grouped(x[:, :n], "fp8_e4m3", 32), shape=(k, n), axis=0)
    # scales 2^-8 each in block 0 (Xa + Xb = -16: the codes at 8 are 2^-4) and 2^-20 in
    # block 1 (-40: the quantizer's codes there are 2^8)
    for operand in (a, b):
        operand.scales[..., 0], operand.scales[..., 1] = 127 - 8, 127 - 20
    got = matmul_batched(config, a, b)
    np.testing.assert_array_equal(got.values, np.float32(1.0))
    np.testing.assert_array_equal(got.bits, matmul_batched(config, a, b, method="kernel").bits)


@pytest.mark.parametrize("name, want", [("kulisch", 1.0 + 2.0**-23), ("ocp-exact", 1.0)])
def test_route_keeps_a_later_trees_bits_below_float64(name, want):
    """c = None, a first tree sum S0 = (2^16 + 2^-8) * 2^-16 = 1 + 2^-24, the midpoint of 1
    and 1 + 2^-23, then the next tree's (block 1) S1 = 2^-60, below float64's last place
    at 1: an exact accumulator holds it apart (high 1 + 2^-24, low 2^-60), so its one
    rounding lies above the midpoint: 1 + 2^-23; a unit rounding each tree rounds S0 to
    even, 1, and 1 + S1 to 1."""
    config = hw(name)
    groups, m, k, n = 3, 2, 64, 2
    x = np.zeros((groups, m, k), dtype=np.float32)
    x[..., 0], x[..., 1], x[..., 32] = 256.0, 2.0**-4, 1.0
    a = quantize_grouped(x, "fp8_e4m3", 32)
    b = dataclasses.replace(quantize_grouped(x[:, :n], "fp8_e4m3", 32), shape=(k, n), axis=0)
    # scales 2^-8 each in block 0 (Xa + Xb = -16) and 2^-38 in block 1 (-76: the
    # quantizer's codes there are 2^8)
    for operand in (a, b):
        operand.scales[..., 0], operand.scales[..., 1] = 127 - 8, 127 - 38
    got = matmul_batched(config, a, b)
    np.testing.assert_array_equal(got.values, np.float32(want))
    np.testing.assert_array_equal(got.bits, matmul_batched(config, a, b, method="kernel").bits)


@pytest.mark.parametrize("name", ["ocp-exact", "kulisch"])
@pytest.mark.parametrize("tree", [0, 1])
def test_wide_groups_round_c_plus_a_tree_sum_once(name, tree):
    """The case above on 128-row groups of the wide-tree units (two trees of one scale block
    each, N = 17: a pass and one column), the sum in the first tree or the second (the other
    +0): c = 1 plus S = 2^-24 + 2^-58 gives 1 + 2^-23, one rounding. An exact accumulator
    keeps TwoSum's error 2^-58 of 1 + S beside 1 + 2^-24; dropped, the midpoint would round
    to 1. With c = None, S rounds to 2^-24 (an exact accumulator then forms the first tree's
    sums in its high part, the second tree's step from there). A NaN scale of a row of the
    second group and of a column of the third flags that row's and column's outputs (their
    bits the generic kernel's NaN), in groups whose others are computed."""
    config = hw(name)
    groups, m, k, n = 3, 128, 64, 17
    x = np.zeros((groups, m, k), dtype=np.float32)
    at = 32 * tree
    x[..., at], x[..., at + 1] = 256.0, 2.0**-9  # fp8_e4m3: 2^8 and its least subnormal
    a = quantize_grouped(x, "fp8_e4m3", 32)
    b = dataclasses.replace(quantize_grouped(x[:, :n], "fp8_e4m3", 32), shape=(k, n), axis=0)
    a.scales[...] = 127 - 20  # 2^-20 each: Xa + Xb = -40
    b.scales[...] = 127 - 20
    a.scales[1, 5, tree] = SCALE_NAN
    b.scales[2, 16, tree] = SCALE_NAN
    nan = np.zeros((groups, m, n), dtype=bool)
    nan[1, 5, :], nan[2, :, 16] = True, True
    # c per output, and c = None (+0 for every output: the kernel's one-c set-up)
    for c, want in ((np.ones((groups, m, n), dtype=np.float32), 1.0 + 2.0**-23), (None, 2.0**-24)):
        with pytest.MonkeyPatch.context() as monkeypatch:
            taken = []
            route = api.small_groups_matmul
            monkeypatch.setattr(
                api, "small_groups_matmul", lambda *args: taken.append(True) or route(*args)
            )
            got = matmul_batched(config, a, b, c=c)
        assert taken == [True]
        kernel = matmul_batched(config, a, b, c=c, method="kernel")
        np.testing.assert_array_equal(got.bits, kernel.bits)
        assert np.isnan(got.values[nan]).all()
        np.testing.assert_array_equal(got.values[~nan], np.float32(want))


def shipped_window_units() -> list[tuple[str, str, str, str | None]]:
    """(config, A format, B format, output format or None for the config's) of every shipped
    config and format pair (fp32 and fp16 outputs) that takes the window small-groups route."""
    chosen = []
    for path in sorted((REPO / "hwconfigs").glob("*.yaml")):
        config = load_hwconfig(path)
        for a_name in config.a_formats:
            for b_name in config.b_formats:
                for out_name in (None, "fp16"):
                    try:
                        params = config.params(a_name, b_name, out_name)
                    except Exception:  # a pair or output the config does not take
                        continue
                    if window_groups_apply(params, 5, 19, 37):
                        chosen.append((path.stem, a_name, b_name, out_name))
    return chosen


SHIPPED_WINDOW_UNITS = shipped_window_units()


def mixed_operands(rng, config, a_name, b_name, shape, corners):
    """``operands`` with A of one element format and B of another (each its own batch)."""
    block = config.sections[("inputs", "block_size")]
    scaled = config.sections[("inputs", "scales")] != "none"
    a, _ = operands(rng, a_name, block, shape, corners, scaled)
    _, b = operands(rng, b_name, block, shape, corners, scaled)
    return a, b


def run_window_groups(monkeypatch, config, a, b, c, out_name=None):
    """The batch through ``matmul_batched``, checked to take the window small-groups route,
    and the generic kernel's bits; asserts they agree bit for bit and that every output with
    a special input was left to the generic kernel. Returns the route's result."""
    taken = []
    route = api.window_groups_matmul

    def recording(*arguments):
        taken.append(True)
        return route(*arguments)

    monkeypatch.setattr(api, "window_groups_matmul", recording)
    flagged = []
    recompute = api._recompute

    def recording_recompute(g, m, n, *rest):
        flagged.append((g, m, n))
        recompute(g, m, n, *rest)

    monkeypatch.setattr(api, "_recompute", recording_recompute)
    got = matmul_batched(config, a, b, c=c, out_format=out_name)
    monkeypatch.setattr(api, "_recompute", recompute)
    monkeypatch.setattr(api, "window_groups_matmul", route)
    assert taken == [True]
    want = matmul_batched(config, a, b, c=c, out_format=out_name, method="kernel")
    np.testing.assert_array_equal(got.bits, want.bits)
    marked = np.zeros(got.bits.shape, dtype=bool)
    for g, m, n in flagged:
        marked[g, m, n] = True
    assert not (special_outputs(a, b, c) & ~marked).any()
    return got


@pytest.mark.parametrize("name, a_name, b_name, out_name", SHIPPED_WINDOW_UNITS)
def test_window_groups_equal_the_kernel_for_every_shipped_window_config(
    monkeypatch, name, a_name, b_name, out_name
):
    """Every shipped config and format pair the window small-groups route takes, on groups
    of an odd row count (a zero row pads the row pairs), two lane blocks of columns (19:
    three padding lanes) and K = 37 (past a tree of 32, not a multiple of the kernels' eight
    terms a pass), realistic data with a few corners, c included."""
    config = hw(name)
    rng = np.random.default_rng(len(SHIPPED_WINDOW_UNITS))
    shape = (3, 5, 37, 19)
    a, b = mixed_operands(rng, config, a_name, b_name, shape, corners=0.01)
    c = accumulator_inputs(rng, (3, 5, 19), corners=True)
    got = run_window_groups(monkeypatch, config, a, b, c, out_name)
    if out_name is None:
        check_twin(config, a, b, c, got, rng, count=2)


@pytest.mark.parametrize("name", ["h200-cublaslt-fp8", "h100-fp8-promoted"])
def test_window_groups_promote_every_interval(monkeypatch, name):
    """K = 300: promotions after 128 and 256 products and a last add of the partial interval."""
    config = hw(name)
    rng = np.random.default_rng(300)
    a, b = mixed_operands(rng, config, "fp8_e4m3", "fp8_e5m2", (3, 5, 300, 19), corners=0.01)
    c = accumulator_inputs(rng, (3, 5, 19), corners=True)
    got = run_window_groups(monkeypatch, config, a, b, c)
    check_twin(config, a, b, c, got, rng, count=4)


@settings(max_examples=60, deadline=None)
@given(
    unit=st.sampled_from(WINDOW_UNITS),
    shape=st.tuples(st.integers(2, 4), st.integers(1, 13), st.integers(1, 100), st.integers(1, 40)),
    corners=st.sampled_from([0.0, 0.0, 0.0, 0.02]),
    with_c=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_window_groups_equal_the_kernel_on_random_wide_batches(unit, shape, corners, with_c, seed):
    """Groups up to 13 rows (odd ones padded with a zero row) and 40 columns (up to three
    lane blocks), K from 1 (a tree shorter than the kernels' eight-term passes) to 100
    (four trees of some units), mostly realistic data; against the generic kernel and,
    for a few outputs, the Fraction twin."""
    assume(shape[1] * shape[3] <= WINDOW_GROUP_OUTPUTS)
    check_random_batch(unit, shape, corners, with_c, seed)


def check_random_batch(unit, shape, corners, with_c, seed):
    """A random batch (mostly realistic, ``corners`` of them corner codes, c or none)
    through the window small-groups route: the generic kernel's bits and, for a few
    outputs, the Fraction twin's."""
    name, fmt_name = unit
    groups, m, _, n = shape
    config = hw(name)
    rng = np.random.default_rng(seed)
    a, b = mixed_operands(rng, config, fmt_name, fmt_name, shape, corners)
    c = accumulator_inputs(rng, (groups, m, n), corners > 0) if with_c else None
    with pytest.MonkeyPatch.context() as monkeypatch:
        got = run_window_groups(monkeypatch, config, a, b, c)
    check_twin(config, a, b, c, got, rng, count=2)


@pytest.mark.parametrize("name, fmt_name", WINDOW_UNITS)
def test_window_groups_on_zeros_overflow_underflow_and_scale_gaps(monkeypatch, name, fmt_name):
    """Corner batches of each window unit: every element 0 of either sign (+0 outputs), the
    largest elements (at scale 2^127 where the unit takes scales: overflow), subnormal
    elements (at 2^-127: underflow), each row and column at its own scale far from the
    others' (gaps up to 2^254), M and N of 1, -0 and subnormal c."""
    config = hw(name)
    scaled = config.sections[("inputs", "scales")] != "none"
    block = config.sections[("inputs", "block_size")]
    rng = np.random.default_rng(9)
    kinds = corner_codes(fmt_name)
    shapes = ((4, 6, 45, 17), (3, 1, 33, 20), (3, 9, 20, 1), (2, 16, 45, 66), (2, 66, 45, 17))
    for shape in (*shapes, (2, 16, 45, 32)):
        groups, m, k, n = shape
        a, b = operands(rng, fmt_name, block, shape, 0.0, scaled)
        cases = [(kinds["zero"], 127), (kinds["largest"], 254), (kinds["subnormal"], 0)]
        for codes, scale in cases:
            for x in (a, b):
                x.codes[...] = rng.choice(codes, size=x.codes.shape)
                x.scales[...] = scale if scaled else 127
            run_window_groups(monkeypatch, config, a, b, None)
        a, b = operands(rng, fmt_name, block, shape, 0.0, scaled)
        if scaled:
            a.scales[...] = rng.choice([0, 1, 127, 253, 254], size=a.scales.shape)
            b.scales[...] = rng.choice([0, 1, 127, 253, 254], size=b.scales.shape)
        c = accumulator_inputs(rng, (groups, m, n), False)
        c[0] = -0.0
        c[-1, 0] = 1e-41
        run_window_groups(monkeypatch, config, a, b, c)
        zeros = a.codes.copy()
        zeros[...] = kinds["zero"][-1]  # the negative zero where the format has one
        got = run_window_groups(monkeypatch, config, dataclasses.replace(a, codes=zeros), b, None)
        np.testing.assert_array_equal(got.bits, 0)


@pytest.mark.parametrize("name, fmt_name", WINDOW_UNITS)
@pytest.mark.parametrize(
    "shape",
    [
        (3, 13, 40, 32),  # two lane blocks, an odd row count
        (2, 14, 14, 32),  # MiniLM's P @ v: K = 14 of a block of 32
        (2, 7, 37, 25),  # 25 columns padded to two lane blocks (7 padding lanes)
        (2, 14, 32, 14),  # MiniLM's q @ k^T: one lane block (2 padding lanes)
        (2, 5, 70, 48),  # three lane blocks, trees past the first
    ],
)
def test_window_groups_on_narrow_groups_of_each_width(monkeypatch, name, fmt_name, shape):
    """Narrow groups (the kernel's lane-block stages) of one to three lane blocks, MiniLM's
    heads among them: against the generic kernel (every output) and the Fraction twin (a
    few), on realistic data with corner codes (zeros of both signs, subnormals, the
    largest, NaN/Inf) and NaN or extreme scales, c with -0, NaN/Inf and subnormals; then
    the same shapes with the corners alone, half the codes."""
    config = hw(name)
    scaled = config.sections[("inputs", "scales")] != "none"
    block = config.sections[("inputs", "block_size")]
    groups, m, k, n = shape
    rng = np.random.default_rng(sum(shape))
    a, b = operands(rng, fmt_name, block, shape, 0.03, scaled)
    c = accumulator_inputs(rng, (groups, m, n), corners=True)
    got = run_window_groups(monkeypatch, config, a, b, c)
    check_twin(config, a, b, c, got, rng, count=3)
    a, b = operands(rng, fmt_name, block, shape, 0.5, scaled, specials=False)
    got = run_window_groups(monkeypatch, config, a, b, None)
    check_twin(config, a, b, None, got, rng, count=3)


def kernel_lengths(monkeypatch) -> list[int]:
    """The K of the codes each ``_batch_kernels.window_groups`` call gets (a list filled as
    the batch runs)."""
    lengths: list[int] = []
    kernel = batch_kernels.window_groups

    def recording(codes_a, *rest):
        lengths.append(codes_a.shape[2])
        return kernel(codes_a, *rest)

    monkeypatch.setattr(batch_kernels, "window_groups", recording)
    return lengths


@pytest.mark.parametrize("name, fmt_name", [*WINDOW_UNITS, ("ada-fp8", "fp8_e4m3")])
@pytest.mark.parametrize("k", [5, 14, 40])
def test_window_groups_skip_the_zero_padding_of_k(monkeypatch, name, fmt_name, k):
    """K padded to whole scale blocks of 32 by the quantizer (MiniLM's P @ v: 14 of 32):
    the kernel gets the codes cut to K rounded up to a pass of 8 where the cut keeps every
    tree (trees of 32: 5 -> 8, 14 -> 16, 40 -> 40 of 64; trees of 16, ADA's and H100 FP16's,
    whose accumulator joins each tree: only 40 -> 40 of 64, as 8 and 16 of 32 would drop a
    tree of padding that still truncates the accumulator), and the generic kernel's bits
    and the Fraction twin's either way, c included."""
    config = hw(name)
    params = config.params(fmt_name, fmt_name)
    scaled = config.sections[("inputs", "scales")] != "none"
    rng = np.random.default_rng(k)
    a, b = operands(rng, fmt_name, 32, (3, 5, k, 19), 0.0, scaled)
    c = accumulator_inputs(rng, (3, 5, 19), corners=False)
    lengths = kernel_lengths(monkeypatch)
    got = run_window_groups(monkeypatch, config, a, b, c)
    cut = {5: 8, 14: 16, 40: 40}[k]
    keeps_trees = -(-cut // params.fused_terms) == -(-a.codes.shape[-1] // params.fused_terms)
    assert lengths == [cut if keeps_trees else a.codes.shape[-1]]
    assert params.fused_terms == 32 or (params.fused_terms == 16 and lengths[0] != cut) or k == 40
    check_twin(config, a, b, c, got, rng, count=4)


def test_window_groups_keep_trees_of_padding_alone(monkeypatch):
    """A unit whose accumulator joins each tree holding more bits than the window keeps
    (Ada's FP16 path, trees of 8, with a 13-bit window): a tree of padding alone still
    truncates the accumulator, so K = 5 of 32 keeps the codes' four trees (the twin's
    result differs with one), and the bits agree with the generic kernel and the twin."""
    raw = yaml.safe_load((REPO / "hwconfigs" / "ada.yaml").read_text())
    raw["name"], raw["adder"]["align_fraction_bits"] = "ada-window-13", 13
    config = parse_hwconfig(raw)
    params = config.params("fp16", "fp16")
    rng = np.random.default_rng(5)
    a, b = operands(rng, "fp16", 32, (3, 5, 5, 19), 0.0, scaled=False)
    c = accumulator_inputs(rng, (3, 5, 19), corners=False)
    lengths = kernel_lengths(monkeypatch)
    got = run_window_groups(monkeypatch, config, a, b, c)
    assert lengths == [32]
    check_twin(config, a, b, c, got, rng, count=4)
    whole = dot_reference(
        params, a.codes[0, 0].tolist(), b.codes[0, 0].tolist(), None, None, float(c[0, 0, 0])
    )
    cut = dot_reference(
        params,
        a.codes[0, 0, :8].tolist(),
        b.codes[0, 0, :8].tolist(),
        None,
        None,
        float(c[0, 0, 0]),
    )
    assert whole != cut


@pytest.mark.parametrize("operand", ["A", "B"])
@pytest.mark.parametrize("kind", ["number", "special", "negative zero"])
def test_window_groups_keep_padding_that_is_not_the_zero_code(monkeypatch, operand, kind):
    """Batches whose padding past K holds, in one row of A or column of B, a code other
    than the zero code (a number, a NaN code, -0): the generic kernel counts every code of
    the padded K, so the window kernel gets them all too, and the bits agree (the NaN's
    outputs left to the generic kernel)."""
    config = hw("h100-fp8")
    rng = np.random.default_rng(3)
    a, b = operands(rng, "fp8_e4m3", 32, (3, 5, 14, 19), 0.0, scaled=False)
    c = accumulator_inputs(rng, (3, 5, 19), corners=False)
    values = get_format("fp8_e4m3").decode_fields(np.arange(256))
    code = {
        "number": int(np.flatnonzero(values == 1.5)[0]),
        "special": int(corner_codes("fp8_e4m3")["special"][0]),
        "negative zero": int(np.flatnonzero((values == 0) & np.signbit(values))[0]),
    }[kind]
    # a number in A's padding meets B's zero padding: the output is unchanged, the codes
    # are not cut all the same (the cut only looks at codes)
    (a if operand == "A" else b).codes[1, 2, 20] = code
    lengths = kernel_lengths(monkeypatch)
    run_window_groups(monkeypatch, config, a, b, c)
    assert lengths == [32]


def test_window_units_with_trees_of_four_keep_the_per_gemm_route(monkeypatch):
    """V100's FP16 trees of four terms are not whole passes of the small-groups kernel: the
    batch takes the per-GEMM window route, its bits the generic kernel's."""
    config = hw("v100")
    params = config.params("fp16", "fp16")
    assert params.fused_terms == 4 and window_applies(params)
    assert not window_groups_apply(params, 14, 14, 32)
    rng = np.random.default_rng(12)
    a, b = operands(rng, "fp16", 32, (3, 6, 21, 5), 0.0, scaled=False)
    c = accumulator_inputs(rng, (3, 6, 5), False)
    taken = []
    route = api.window_groups_matmul
    monkeypatch.setattr(api, "window_groups_matmul", lambda *x: taken.append(1) or route(*x))
    got = matmul_batched(config, a, b, c=c)
    assert not taken
    want = matmul_batched(config, a, b, c=c, method="kernel")
    np.testing.assert_array_equal(got.bits, want.bits)


@pytest.mark.parametrize(
    "name, fmt_name", [("h100-fp8", "fp8_e5m2"), ("b200-tcgen05-mxf8f6f4", "fp6_e3m2")]
)
@pytest.mark.parametrize("shape", [(2, 1, 100, 300), (2, 3, 70, 170)])
def test_window_groups_of_wide_columns(monkeypatch, name, fmt_name, shape):
    """Groups of 170 to 300 columns (tiles of B of 11 to 19 lane blocks a row, K of 100 and
    70), with corners and c: the generic kernel's bits."""
    config = hw(name)
    rng = np.random.default_rng(shape[3])
    a, b = mixed_operands(rng, config, fmt_name, fmt_name, shape, corners=0.01)
    c = accumulator_inputs(rng, (shape[0], shape[1], shape[3]), corners=True)
    run_window_groups(monkeypatch, config, a, b, c)


@pytest.mark.parametrize("name, fmt_name", WINDOW_UNITS)
@pytest.mark.parametrize(
    "shape",
    # MiniLM's heads; an odd row count and padding lanes; wide groups (in place, with a padding
    # row, transposed)
    [
        (6, 14, 32, 14),
        (6, 14, 14, 32),
        (6, 5, 37, 19),
        (6, 18, 21, 64),
        (6, 17, 37, 64),
        (6, 64, 21, 17),
    ],
)
@pytest.mark.parametrize("with_c", [False, True])
def test_window_groups_flag_unusable_inputs_group_by_group(
    monkeypatch, name, fmt_name, shape, with_c
):
    """Groups with no unusable input (their lane flags a plain fill, their codes copied
    without flags) beside groups with one: a NaN/Inf element in one column of B, in the last
    column of B, in one row of A (where the format has such codes), a NaN scale of a column
    of B and of a row of A (where the unit takes scales), a NaN and a -0 c (with c): every
    bit the generic kernel's, every output of those rows and columns flagged, and none of
    the groups without one (realistic values: no output out of range)."""
    config = hw(name)
    groups, m, k, n = shape
    rng = np.random.default_rng(m * n + k)
    block = config.sections[("inputs", "block_size")]
    scaled = config.sections[("inputs", "scales")] != "none"
    a, b = operands(rng, fmt_name, block, shape, 0.0, scaled)
    special = corner_codes(fmt_name).get("special")
    if special is not None:
        b.codes[1, 3, k // 2] = special[0]
        b.codes[2, n - 1, k - 1] = special[-1]
        a.codes[3, m - 1, 0] = special[0]
    if scaled:
        b.scales[2, 0, 0] = SCALE_NAN
        a.scales[4, m // 2, -1] = SCALE_NAN
    c = None
    if with_c:
        c = accumulator_inputs(rng, (groups, m, n), corners=False)
        c[4, 0, n - 1] = np.nan
        c[3, m - 1, 0] = -0.0
    unusable = special_outputs(a, b, c)
    assert not unusable[0].any() and not unusable[5].any()
    assert unusable[1:5].any() == (special is not None or scaled or with_c)
    routed = []
    route = api.window_groups_matmul

    def recording(*arguments):
        g, i, j = route(*arguments)
        routed.append((g, i, j))
        return g, i, j

    monkeypatch.setattr(api, "window_groups_matmul", recording)
    run_window_groups(monkeypatch, config, a, b, c)
    flagged = np.zeros(unusable.shape, dtype=bool)
    flagged[routed[0]] = True
    assert not (unusable & ~flagged).any()
    assert not flagged[0].any() and not flagged[5].any()


@pytest.mark.parametrize("name, a_name, b_name, out_name", SHIPPED_WINDOW_UNITS)
@pytest.mark.parametrize(
    "shape", [(2, 17, 37, 49), (2, 49, 37, 17), (2, 70, 21, 5), (2, 18, 37, 64)]
)
def test_wide_window_groups_equal_the_kernel_for_every_shipped_window_config(
    monkeypatch, name, a_name, b_name, out_name, shape
):
    """Every shipped config and format pair of the route on wide groups (a row's lanes loop
    at once: 49 columns padded to 64), an odd row count and K = 37, and their transposes
    (49 rows, computed as C^T = B A^T: A's and B's formats swap tables), as a small group
    of 70 rows and 5 columns is (K = 21: not whole passes), and groups whose lanes are
    their outputs (18 x 64: stages run in the output arrays), corners and c: the generic
    kernel's bits and, for a few outputs, the Fraction twin's."""
    config = hw(name)
    rng = np.random.default_rng(shape[1])
    a, b = mixed_operands(rng, config, a_name, b_name, shape, corners=0.01)
    c = accumulator_inputs(rng, (shape[0], shape[1], shape[3]), corners=True)
    got = run_window_groups(monkeypatch, config, a, b, c, out_name)
    if out_name is None:
        check_twin(config, a, b, c, got, rng, count=2)


@settings(max_examples=40, deadline=None)
@given(
    unit=st.sampled_from(WINDOW_UNITS),
    shape=st.tuples(
        st.integers(2, 3), st.integers(16, 70), st.integers(1, 72), st.integers(16, 70)
    ),
    corners=st.sampled_from([0.0, 0.0, 0.0, 0.02]),
    with_c=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_wide_window_groups_equal_the_kernel_on_random_batches(unit, shape, corners, with_c, seed):
    """Wide groups (16 to 70 rows and columns: one side padded to 64 or 80 lanes, either way
    round), K from 1 to 72 (trees of every unit, int32 groups shorter than a tree for some),
    mostly realistic data; against the generic kernel and, for a few outputs, the Fraction
    twin."""
    name, fmt_name = unit
    _, m, k, n = shape
    params = hw(name).params(fmt_name, fmt_name)
    assume(window_groups_apply(params, m, n, k) and max(m, n) > 48)
    check_random_batch(unit, shape, corners, with_c, seed)


@pytest.mark.parametrize("name, fmt_name", WINDOW_UNITS)
@pytest.mark.parametrize("shape", [(3, 128, 64, 128), (3, 128, 128, 64)])
def test_window_groups_on_the_128_token_heads(monkeypatch, name, fmt_name, shape):
    """The 128-token heads' shapes (q @ k^T, and P @ v computed as its transpose), whose
    groups are the kernel's longest row loops and, for P @ v, its transposed copy-out: a
    group of realistic data (its outputs copied without flags), one with corner codes
    (zeros of both signs, subnormals, the largest, NaN/Inf), NaN or extreme scales and c
    with -0, NaN/Inf and subnormals, and one of the largest elements at the largest scale
    (overflow): every bit the generic kernel's, a few outputs the Fraction twin's."""
    config = hw(name)
    scaled = config.sections[("inputs", "scales")] != "none"
    block = config.sections[("inputs", "block_size")]
    groups, m, k, n = shape
    rng = np.random.default_rng(k)
    a, b = operands(rng, fmt_name, block, shape, 0.0, scaled)
    corner_a, corner_b = operands(rng, fmt_name, block, shape, 0.03, scaled)
    a.codes[1], b.codes[1] = corner_a.codes[1], corner_b.codes[1]
    a.scales[1], b.scales[1] = corner_a.scales[1], corner_b.scales[1]
    largest = corner_codes(fmt_name)["largest"]
    a.codes[2] = rng.choice(largest, size=a.codes[2].shape)
    b.codes[2] = rng.choice(largest, size=b.codes[2].shape)
    if scaled:
        a.scales[2], b.scales[2] = 254, 254
    c = accumulator_inputs(rng, (groups, m, n), corners=False)
    c[1] = accumulator_inputs(rng, (1, m, n), corners=True)[0]
    got = run_window_groups(monkeypatch, config, a, b, c)
    check_twin(config, a, b, c, got, rng, count=3)


@pytest.mark.parametrize("name, a_name, b_name, out_name", SHIPPED_WINDOW_UNITS)
def test_narrow_and_wide_groups_meet_at_row_lanes_from(monkeypatch, name, a_name, b_name, out_name):
    """Groups either side of the kernel's split (``_batch_kernels.ROW_LANES_FROM``: 64
    padded columns): 48 columns (three lane blocks) run its narrow compilation
    (``transposed`` None), 49 (64 padded) and their transposes (49 rows) its wide one, each
    run checked by what it passed; corners and c, every shipped config and format pair: the
    generic kernel's bits."""
    from mxsim.datapath import _batch_kernels

    assert _batch_kernels.ROW_LANES_FROM == 64  # the shapes below straddle it
    kernel, passed = _batch_kernels.window_groups, []

    def recording(*arguments):
        passed.append(arguments[10])  # transposed: None for narrow groups
        return kernel(*arguments)

    monkeypatch.setattr(_batch_kernels, "window_groups", recording)
    config = hw(name)
    rng = np.random.default_rng(48)
    cases = [((2, 9, 37, 48), {None}), ((2, 16, 37, 49), {False}), ((2, 49, 37, 16), {True})]
    for shape, want in cases:
        passed.clear()
        a, b = mixed_operands(rng, config, a_name, b_name, shape, corners=0.01)
        c = accumulator_inputs(rng, (shape[0], shape[1], shape[3]), corners=True)
        run_window_groups(monkeypatch, config, a, b, c, out_name)
        assert passed and set(passed) == want, (shape, passed)


def small_element_operands(rng, shape, scaled):
    """(A, B) of FP8 E4M3 elements below 1/4 in the first K of each row (every product's
    exponent sum negative) and the quantizer's zero padding after them, scales 1."""
    fmt = get_format("fp8_e4m3")
    codes = np.arange(256)
    values = fmt.decode_fields(codes)
    small = codes[np.isfinite(values) & (np.abs(values) >= 2.0**-6) & (np.abs(values) < 0.25)]
    a, b = operands(rng, "fp8_e4m3", 32, shape, 0.0, scaled)
    for x in (a, b):
        x.codes[...] = 0
        x.codes[..., : shape[2]] = rng.choice(small, size=x.codes[..., : shape[2]].shape)
        x.scales[...] = 127
    return a, b


@pytest.mark.parametrize("name", ["h100-fp8", "b200-fp8", "b200-tcgen05-mxf8f6f4"])
def test_window_groups_of_small_elements_beside_zero_padding(monkeypatch, name):
    """Every element below 1/4 (all exponent sums negative) and the rest of the 32-element
    block zeros: the zeros' exponents must not raise any tree's reference, or the truncation
    to the window differs from the generic kernel's."""
    config = hw(name)
    scaled = config.sections[("inputs", "scales")] != "none"
    rng = np.random.default_rng(13)
    for shape in ((3, 6, 13, 9), (2, 4, 21, 20)):
        a, b = small_element_operands(rng, shape, scaled)
        got = run_window_groups(monkeypatch, config, a, b, None)
        assert np.isfinite(got.values).all() and (got.values != 0).any()


@pytest.mark.parametrize("name", ["h100-fp8", "b200-fp8", "b200-tcgen05-mxf8f6f4"])
def test_window_groups_pad_k_to_whole_passes(name):
    """Codes of K = 13 and 21 (not whole passes of eight terms: the kernel pads them with zero
    elements) straight into ``window_groups_matmul``: the generic kernel's bits of the same
    products with the quantizer's block of 32 (zeros after K)."""
    config = hw(name)
    scaled = config.sections[("inputs", "scales")] != "none"
    rng = np.random.default_rng(14)
    for shape in ((3, 6, 13, 9), (2, 5, 21, 20)):
        groups, m, k, n = shape
        a, b = small_element_operands(rng, shape, scaled)
        params = config.params("fp8_e4m3", "fp8_e4m3")
        want = matmul_batched(config, a, b, method="kernel").bits
        got = np.empty((groups, m, n), dtype=np.uint32)
        flagged = batch_module.window_groups_matmul(
            params,
            np.ascontiguousarray(a.codes[..., :k]),
            np.ascontiguousarray(b.codes[..., :k]),
            api._scales_for_unit(a.scales, params),
            api._scales_for_unit(b.scales, params),
            np.zeros((1, 1, 1), dtype=np.float32),
            got,
        )
        assert not flagged[0].size
        np.testing.assert_array_equal(got, want)


# bfp-exact's element formats: MX9/MX6/MX4 (the BFP quantizer's shared microexponents) and
# MX INT8 in sub-blocks of 2.
BFP_FORMATS = ["mx9", "mx6", "mx4", "int8"]


def bfp_operands(rng, fmt_name: str, shape, corners: float = 0.0, gaps: float = 0.0):
    """(A, B) MXGroups of a (G, M, K) x (G, K, N) batch for bfp-exact: realistic values
    (Gaussian and heavy-tailed, each row its own magnitude) through the BFP quantizer (MX
    INT8 through ``quantize_grouped`` in sub-blocks of 2), then a fraction ``corners`` of
    the codes replaced by corner codes (±0, subnormal, largest), of the sub-blocks by zeros
    and of the scales by NaN, 2^-127 or 2^127, and a fraction ``gaps`` of the sub-blocks'
    scales moved by up to 60 binades (folds wider than float64's 53 bits)."""
    groups, m, k, n = shape

    def grouped(rows):
        x = rng.standard_normal((groups, rows, k)) * np.exp2(rng.integers(-8, 9, (groups, rows, 1)))
        x[:, ::3] = rng.standard_t(3, size=x[:, ::3].shape)
        x = x.astype(np.float32)
        if fmt_name == "int8":
            q = quantize_grouped(x, "int8", 2)
        else:
            q = MXGroups.of(
                [quantize_bfp(part, fmt_name.upper(), axis=1).as_mx_tensor() for part in x]
            )
        codes, scales = q.codes, q.scales
        if corners:
            pool = np.concatenate(
                [v for kind, v in corner_codes(fmt_name).items() if kind != "special"]
            )
            hit = rng.random(codes.shape) < corners
            codes[hit] = rng.choice(pool, size=int(hit.sum()))
            blocks = codes.reshape(codes.shape[:-1] + (-1, 2))
            blocks[rng.random(blocks.shape[:-1]) < corners] = corner_codes(fmt_name)["zero"][-1]
            hit = rng.random(scales.shape) < corners / 4
            scales[hit] = rng.choice([SCALE_NAN, 0, 254], size=int(hit.sum()))
        if gaps:
            hit = (rng.random(scales.shape) < gaps) & (scales != SCALE_NAN)
            moved = scales.astype(np.int64) + rng.integers(-60, 61, scales.shape)
            scales[hit] = np.clip(moved, 0, 254)[hit]
        return q

    a = grouped(m)
    b = dataclasses.replace(grouped(n), shape=(k, n), axis=0)
    return a, b


def run_bfp(monkeypatch, fmt_name, shape, seed, corners=0.0, gaps=0.0, with_c=True):
    """A bfp-exact batch through ``matmul_batched`` (the small-groups route checked taken
    for G > 1) against the generic kernel, bit for bit, and a few outputs against the
    Fraction twin; returns (a, b, c, the outputs the route flagged)."""
    config = hw("bfp-exact")
    rng = np.random.default_rng(seed)
    a, b = bfp_operands(rng, fmt_name, shape, corners, gaps)
    c = accumulator_inputs(rng, (shape[0], shape[1], shape[3]), corners > 0) if with_c else None
    taken, route = [], api.small_groups_matmul

    def recording(*arguments):
        taken.append(True)
        return route(*arguments)

    monkeypatch.setattr(api, "small_groups_matmul", recording)
    got, flagged = flagged_outputs(monkeypatch, config, a, b, c)
    assert taken == ([True] if shape[0] > 1 else [])
    want = matmul_batched(config, a, b, c=c, method="kernel")
    np.testing.assert_array_equal(got.bits, want.bits)
    assert not (special_outputs(a, b, c) & ~flagged).any()
    check_twin(config, a, b, c, got, rng, count=4)
    return a, b, c, flagged


@pytest.mark.parametrize("fmt_name", BFP_FORMATS)
@pytest.mark.parametrize(
    "shape",
    [
        (192, 14, 32, 14),  # MiniLM's q @ k^T heads: two trees of 16
        (12, 14, 14, 32),  # its P @ v heads: K below one tree
        (3, 1, 70, 5),  # K past four trees, not a multiple of 16
        (2, 7, 33, 1),  # N = 1, K one past two trees (an odd K: half a sub-block)
        (4, 20, 48, 40),  # several passes of the kernel's columns
    ],
)
def test_folded_trees_equal_the_kernel_and_the_twin(monkeypatch, fmt_name, shape):
    """bfp-exact's folded trees on the exact small-groups route: the BFP quantizer's
    operands (sub-blocks at most a binade apart) flag nothing but are computed bit for bit
    as the generic kernel computes them."""
    a, b, c, flagged = run_bfp(monkeypatch, fmt_name, shape, seed=sum(shape))
    assert not flagged.any()


@pytest.mark.parametrize("fmt_name", BFP_FORMATS)
@pytest.mark.parametrize("length", [70, 48])  # (48: whole trees, MX9's folded in block pairs)
def test_folded_trees_on_corners_and_scale_gaps(monkeypatch, fmt_name, length):
    """Corner codes (±0, subnormals, the largest), sub-blocks of zeros, NaN and extreme
    scales, corner c, and sub-block scales up to 60 binades apart (folds wider than 53
    bits: those rows' outputs flagged and left to the generic kernel): every bit the
    generic kernel's, some outputs flagged and some computed."""
    shape = (6, 9, length, 11)
    a, b, c, flagged = run_bfp(monkeypatch, fmt_name, shape, 5, corners=0.05, gaps=0.02)
    assert flagged.any() and not flagged.all()


def test_folded_trees_flag_only_the_rows_rising_past_53_bits(monkeypatch):
    """mx9's tree sums need 20 bits (|M| <= 127 at 2^-6 each, 16 products: 7 + 7 + 2 + 4),
    a fold rising R binades 20 + R: with B's sub-blocks at one scale, a row of A whose
    sub-block lies R = 33 binades above its tree's least is folded exactly (53 bits) and
    R = 34 is flagged, its outputs left to the generic kernel, the other rows computed; a
    sub-block of zeros at scale 2^-127 (as MX INT8 quantizes one) is left out of its
    tree's fold: computed. Every bit the generic kernel's."""
    config = hw("bfp-exact")
    for rise, wide in ((33, False), (34, True)):
        rng = np.random.default_rng(rise)
        a, b = bfp_operands(rng, "mx9", (3, 4, 32, 5))
        b.scales[...] = 120
        a.scales[1, 2, 8:16] = 100  # the second tree of row 2 of group 1
        a.scales[1, 2, 9] = 100 + rise
        a.codes[1, 2, 18:20] = 1  # (its sub-block holds numbers)
        a.codes[0, 1, 10:12] = corner_codes("mx9")["zero"][-1]  # -0, -0
        a.scales[0, 1, 5] = 0
        got, flagged = flagged_outputs(monkeypatch, config, a, b)
        expected = np.zeros_like(flagged)
        expected[1, 2] = wide
        np.testing.assert_array_equal(flagged, expected)
        want = matmul_batched(config, a, b, method="kernel")
        np.testing.assert_array_equal(got.bits, want.bits)


@settings(max_examples=40, deadline=None)
@given(
    fmt_name=st.sampled_from(BFP_FORMATS),
    shape=st.tuples(st.integers(2, 5), st.integers(1, 16), st.integers(1, 80), st.integers(1, 24)),
    corners=st.sampled_from([0.0, 0.0, 0.0, 0.03, 0.1]),
    gaps=st.sampled_from([0.0, 0.0, 0.0, 0.02, 0.2]),
    with_c=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_folded_trees_equal_the_kernel_on_random_batches(
    fmt_name, shape, corners, gaps, with_c, seed
):
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_bfp(monkeypatch, fmt_name, shape, seed, corners=corners, gaps=gaps, with_c=with_c)


@pytest.mark.parametrize("trees", [1, 2, 3])
def test_block_pair_fold_equals_a_loop_over_blocks_and_the_general_fold(trees):
    """``_batch_kernels.fold_block_pairs`` (uint16 codes of blocks of 2 read as uint32 pairs)
    against a Python loop over each row's trees and blocks, and against
    ``fold_group_codes``: least per tree, raised codes, rows' largest rises; exponents mostly
    a few binades apart (the BFP quantizer's sub-blocks), with -127, 127, the NaN exponent,
    whole NaN trees and gaps past the rise cap."""
    from mxsim.datapath import _batch_kernels as kernels

    rng = np.random.default_rng(41 + trees)
    units, size, cap = 400, 512, 33
    blocks, length = 8 * trees, 16 * trees
    codes = rng.integers(0, size, (units, length)).astype(np.uint16)
    codes[:, :2] = [0, size - 1]  # (the least and largest codes beside each other)
    exps = (rng.integers(-20, 20, (units, 1)) + rng.integers(0, 3, (units, blocks))).astype(
        np.int32
    )
    corner = rng.random(exps.shape) < 0.1
    exps[corner] = rng.choice([-127, 127, int(batch_module.SCALE_NAN)], size=int(corner.sum()))
    exps[5, :8] = batch_module.SCALE_NAN  # a tree of NaN scales only
    exps[6, :] = [127 if m % 8 == 0 else -127 for m in range(blocks)]  # rises past the cap
    want_least = np.empty((units, trees), dtype=np.int64)
    want_raised = np.empty((units, length), dtype=np.int64)
    want_tops = np.zeros(units, dtype=np.int64)
    for u in range(units):
        for t in range(trees):
            tree = [int(x) for x in exps[u, 8 * t : 8 * t + 8]]
            want_least[u, t] = min(tree)
            want_tops[u] = max(want_tops[u], max(tree) - min(tree))
            for k in range(16 * t, 16 * t + 16):
                rise = int(exps[u, k // 2]) - min(tree)
                want_raised[u, k] = int(codes[u, k]) + size * min(rise, cap)
    least = np.empty((units, trees), dtype=np.int32)
    raised = np.empty((units, length), dtype=np.uint16)
    tops = np.empty(units, dtype=np.int64)
    kernels.fold_block_pairs(
        codes.view(np.uint32), exps, size, cap, least, raised.view(np.uint32), tops
    )
    np.testing.assert_array_equal(least, want_least)
    np.testing.assert_array_equal(raised, want_raised)
    np.testing.assert_array_equal(tops, want_tops)
    general = (np.empty_like(least), np.empty_like(raised), np.empty_like(tops))
    kernels.fold_group_codes(codes, exps, 8, 2, size, cap, *general)
    for got, other in zip((least, raised, tops), general):
        np.testing.assert_array_equal(got, other)


def test_raised_tables_are_the_element_values_times_powers_of_two_kept_per_read_only_table():
    """``batch._raised_table``: copy r of the table is each element value times 2^r (Fraction
    arithmetic, NaN and ±Inf kept); a read-only table's result is kept and served again,
    a writable table's is made afresh (its values may change between calls)."""
    from fractions import Fraction

    values = get_format("mx9").decode_fields(np.arange(512)).astype(np.float64)
    values[[3, 300]] = [np.nan, -np.inf]  # (MX9 has no specials: two put in by hand)
    frozen = values.copy()
    frozen.setflags(write=False)
    raised = batch_module._raised_table(frozen, 4)
    assert raised.shape == (4 * 512,) and not raised.flags.writeable
    for r in range(4):
        for code, value in enumerate(values):
            got = raised[r * 512 + code]
            if not np.isfinite(value):
                assert same_float(got, value), (r, code)
            else:
                assert Fraction(float(got)) == Fraction(float(value)) * 2**r, (r, code)
    assert batch_module._raised_table(frozen, 4) is raised
    assert batch_module._raised_table(frozen, 3) is not raised  # another count, its own
    writable = values.copy()
    first = batch_module._raised_table(writable, 2)
    writable[0] = 1.0
    again = batch_module._raised_table(writable, 2)
    assert first[0] == values[0] and again[0] == 1.0 and again[512] == 2.0
    # tables freed and made anew (an id may be reused once its object is gone): each its own
    for n in range(70):  # (past the cache's 64 entries, which it then clears)
        table = np.full(8, float(n))
        table.setflags(write=False)
        got = batch_module._raised_table(table, 2)
        assert got[0] == n and got[8] == 2 * n, n
        del table, got
    # a read-only view of writable memory changes with it: not kept either
    memory = values.copy()
    view = memory[:]
    view.setflags(write=False)
    first = batch_module._raised_table(view, 2)
    memory[0] = 1.0
    again = batch_module._raised_table(view, 2)
    assert first[0] == values[0] and again[0] == 1.0 and again[512] == 2.0


def test_folded_codes_decode_to_the_elements_times_their_rises():
    """``batch._folded_groups``: each raised code's table value times 2^(its tree's folded
    scale) is the element times 2^(its sub-block's scale), exactly, wherever the row is not
    flagged (NaN scales, rises past the budget); a Python loop over the blocks as the
    reference."""
    config = hw("bfp-exact")
    params = config.params("mx9", "mx9")
    rng = np.random.default_rng(29)
    a, b = bfp_operands(rng, "mx9", (3, 5, 40, 6), corners=0.05, gaps=0.05)
    table = get_format("mx9").decode_fields(np.arange(512)).astype(np.float64)
    exps_a = a.scales.astype(np.int64) - 127
    exps_b = b.scales.astype(np.int64) - 127
    exps_a[a.scales == SCALE_NAN] = batch_module.SCALE_NAN
    exps_b[b.scales == SCALE_NAN] = batch_module.SCALE_NAN
    codes_b = np.ascontiguousarray(b.codes)
    trees = exact_trees(params, 40).shape[0]
    raised_a, raised_b, least_a, least_b, (table_a, _) = batch_module._folded_groups(
        params, (table, table), a.codes, codes_b, exps_a, exps_b, trees
    )
    checked = 0
    for g in range(3):
        for i in range(5):
            if (least_a[g, i] == batch_module.SCALE_NAN).any():
                continue
            for k in range(40):
                tree, block = k // 16, k // 2
                want = table[a.codes[g, i, k]] * 2.0 ** exps_a[g, i, block]
                got = table_a[raised_a[g, i, k]] * 2.0 ** least_a[g, i, tree]
                assert same_float(got, want), (g, i, k)
                checked += 1
    assert checked > 100


def float32_groups_recorded(monkeypatch) -> list:
    """Record, per call of ``_float32_kernels.scaled_float32_groups``, which of its groups it
    left to the folded route (its ``deferred`` flags)."""
    kernels = batch_module.F
    kernel, calls = kernels.scaled_float32_groups, []

    def recording(*arguments):
        result = kernel(*arguments)
        start, stop = arguments[-2], arguments[-1]
        calls.append(np.array(arguments[-3][start:stop], dtype=bool))
        return result

    monkeypatch.setattr(kernels, "scaled_float32_groups", recording)
    return calls


@pytest.mark.parametrize("fmt_name", BFP_FORMATS)
@pytest.mark.parametrize("shape", [(192, 14, 32, 14), (24, 14, 14, 32), (3, 5, 70, 17)])
def test_float32_groups_take_the_bfp_quantizers_batches(monkeypatch, fmt_name, shape):
    """bfp-exact's batches of the BFP quantizer (sub-blocks at most a binade apart) are
    computed by the float32 kernel, no group left to the folded route, every bit the
    generic kernel's and the twin's (``run_bfp``); MX INT8 in sub-blocks of 2 (each its own
    E8M0 scale) is computed bit for bit whichever kernel takes its groups."""
    calls = float32_groups_recorded(monkeypatch)
    run_bfp(monkeypatch, fmt_name, shape, seed=7 + sum(shape))
    if fmt_name != "int8":
        assert calls and not np.concatenate(calls).any()


def _lowest_bit(value: float) -> int:
    """The exponent of the lowest set bit of a nonzero dyadic ``value``."""
    f = Fraction(value)
    numerator = abs(f.numerator)
    return ((numerator & -numerator).bit_length() - 1) - (f.denominator.bit_length() - 1)


def outside_float32(fmt_name: str, exps_a, exps_b, per: int = 8, terms: int = 16) -> bool:
    """Whether a group of bfp-exact (``fmt_name`` both sides) whose rows of A and columns of
    B have the block exponents ``exps_a`` and ``exps_b`` (lists of lists of ints, None for
    NaN) lies outside the float32 kernel's reach, by its rule (``_float32_kernels``' module
    docstring) worked out here in Python ints from the format's values: a NaN; a tree's
    span of exponents in A plus one in B past 24 - the tree sums' bits; an element v 2^x
    that is no float32 (x + lsb < -149 or 2^(e + 1 + x) > 2^128); or, for the least and
    the largest exponent sums X, a tree sum's step 2^(2 lsb + X) below 2^-149 or its bound
    2^(2 lsb + 24 + X) above 2^128."""
    fmt = get_format(fmt_name)
    values = [float(v) for v in fmt.decode_fields(np.arange(1 << fmt.field_bits))]
    nonzero = [abs(v) for v in values if v != 0]
    lsb = min(_lowest_bit(v) for v in nonzero)
    high = math.frexp(max(nonzero))[1] - 1  # the leading bit of the largest magnitude
    bits = 2 * (high + 1 - lsb) + math.ceil(math.log2(terms))
    every = [x for row in exps_a + exps_b for x in row]
    if None in every:
        return True

    def span(exps):
        return max(
            max(r[t : t + per]) - min(r[t : t + per]) for r in exps for t in range(0, len(r), per)
        )

    if span(exps_a) + span(exps_b) > 24 - bits:
        return True
    if any(x + lsb < -149 or x + high + 1 > 128 for x in every):
        return True
    least = min(map(min, exps_a)) + min(map(min, exps_b))
    most = max(map(max, exps_a)) + max(map(max, exps_b))
    return least + 2 * lsb < -149 or most + 2 * lsb + 24 > 128


def run_exponents(monkeypatch, fmt_name, exps_a, exps_b, seed, with_c=True, twins=4, c=None):
    """A bfp-exact batch of (G, 3, 32) x (G, 32, 5) ``fmt_name`` operands (the BFP
    quantizer's codes) whose scales are set to the (G, rows, 16) exponents ``exps_a`` and
    ``exps_b``: against the generic kernel bit for bit, ``twins`` outputs against the
    Fraction twin, and each group taken by the float32 kernel exactly where
    :func:`outside_float32` says it may be (none where it says the first group is outside:
    the batch then skips the kernel). ``c``: that c (G, 3, 5) instead of random ones.
    Returns the groups it says are outside and the result."""
    config = hw("bfp-exact")
    rng = np.random.default_rng(seed)
    groups = exps_a.shape[0]
    a, b = bfp_operands(rng, fmt_name, (groups, 3, 32, 5))
    a.scales[...] = exps_a + 127
    b.scales[...] = exps_b + 127
    if c is None and with_c:
        c = accumulator_inputs(rng, (groups, 3, 5), False)
    calls = float32_groups_recorded(monkeypatch)
    got, flagged = flagged_outputs(monkeypatch, config, a, b, c)
    want = matmul_batched(config, a, b, c=c, method="kernel")
    np.testing.assert_array_equal(got.bits, want.bits)
    assert not flagged.any()
    check_twin(config, a, b, c, got, rng, count=twins)
    expected = [
        outside_float32(fmt_name, exps_a[g].tolist(), exps_b[g].tolist()) for g in range(groups)
    ]
    if expected[0]:  # a first group outside: the whole batch on the folded route
        assert not calls
    else:
        assert np.concatenate(calls).tolist() == expected
    return expected, got


def test_float32_groups_at_their_bounds():
    """MX9 (elements multiples of 2^-6 below 2^2; tree sums of 20 bits, room 4): groups with
    exponent sums at the least X = -137 (steps 2^-149: computed, subnormal sums) and one
    below (deferred), at the largest X = 116 with A at 2^126 (computed, sums up to 2^128:
    overflow to ±Inf) and A at 2^127 (an element past float32: deferred), and trees'
    spans of 2 + 2 (computed) and 3 + 2 (deferred): every bit the generic kernel's."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        rng = np.random.default_rng(3)
        cases = [(-127, -10, 0, 0), (-127, -11, 0, 0), (126, -10, 0, 0), (127, -11, 0, 0)]
        cases += [(0, 0, 2, 2), (0, 0, 3, 2), (-5, 3, 1, 1)]
        exps_a = np.empty((len(cases), 3, 16), dtype=np.int64)
        exps_b = np.empty((len(cases), 5, 16), dtype=np.int64)
        for g, (x, y, spread_a, spread_b) in enumerate(cases):
            exps_a[g] = x - rng.integers(0, spread_a + 1, (3, 16))
            exps_a[g, :, 0] = x - spread_a  # (every tree of row 0 spans the spread)
            exps_a[g, 0, ::8] = x
            exps_b[g] = y + rng.integers(0, spread_b + 1, (5, 16))
            exps_b[g, 0, ::8] = y + spread_b
            exps_b[g, 0, 1::8] = y
        expected, _ = run_exponents(monkeypatch, "mx9", exps_a, exps_b, 3, with_c=False, twins=30)
        assert expected == [False, True, False, True, False, True, False]
        # the same groups after one outside: the batch skips the float32 kernel, same bits
        order = [1, 0, 2, 3, 4, 5, 6]
        run_exponents(monkeypatch, "mx9", exps_a[order], exps_b[order], 3, with_c=False)


def test_float32_groups_overflow_to_infinity():
    """Trees at the largest exponent sum (A at 2^126, B at 2^-10) added to c = ±(fp32's
    largest): sums of the same sign overflow to ±Inf (IEEE float32 addition, RNE), the
    others stay finite, and an infinite accumulator stays so through the next tree; every
    bit the generic kernel's."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        exps_a = np.full((2, 3, 16), 126, dtype=np.int64)
        exps_b = np.full((2, 5, 16), -10, dtype=np.int64)
        largest = float(np.finfo(np.float32).max)
        c = np.where(np.arange(2 * 3 * 5).reshape(2, 3, 5) % 2, largest, -largest)
        _, got = run_exponents(monkeypatch, "mx9", exps_a, exps_b, 5, c=c.astype(np.float32))
        values = got.bits.view(np.float32)
        assert np.isinf(values).any() and np.isfinite(values).any()


EDGES = [-127, -126, -125, -20, -12, -11, -10, -9, -2, 0, 1, 100, 114, 115, 116, 117, 125, 126, 127]


@settings(max_examples=40, deadline=None)
@given(
    fmt_name=st.sampled_from(["mx9", "mx6", "mx4"]),
    bases=st.lists(
        st.tuples(
            st.one_of(st.sampled_from(EDGES), st.integers(-127, 127)),
            st.one_of(st.sampled_from(EDGES), st.integers(-127, 127)),
            st.integers(0, 3),
            st.integers(0, 3),
        ),
        min_size=2,
        max_size=5,
    ),
    with_c=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_float32_groups_equal_the_kernel_near_the_edges_of_float32(fmt_name, bases, with_c, seed):
    """Random groups whose exponents lie near float32's edges and whose trees span 0 to 3
    binades on each side: each group taken by the float32 kernel exactly where the rule
    allows, every bit the generic kernel's either way."""
    rng = np.random.default_rng(seed)
    exps_a = np.empty((len(bases), 3, 16), dtype=np.int64)
    exps_b = np.empty((len(bases), 5, 16), dtype=np.int64)
    for g, (x, y, spread_a, spread_b) in enumerate(bases):
        exps_a[g] = np.clip(x - rng.integers(0, spread_a + 1, (3, 16)), -127, 127)
        exps_b[g] = np.clip(y - rng.integers(0, spread_b + 1, (5, 16)), -127, 127)
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_exponents(monkeypatch, fmt_name, exps_a, exps_b, seed, with_c, twins=2)


def test_float32_tables_only_of_finite_float32_values():
    """``batch._float32_table``: the element values as float32 where every one is a finite
    float32 (kept per read-only table), None otherwise (a NaN, or a value float32 rounds)."""
    values = get_format("mx9").decode_fields(np.arange(512)).astype(np.float64)
    frozen = values.copy()
    frozen.setflags(write=False)
    narrow = batch_module._float32_table(frozen)
    assert narrow.dtype == np.float32 and not narrow.flags.writeable
    assert [Fraction(float(v)) for v in narrow] == [Fraction(float(v)) for v in values]
    assert batch_module._float32_table(frozen) is narrow
    for bad in (np.nan, np.inf, 1.0 + 2.0**-30):
        changed = values.copy()
        changed[7] = bad
        assert batch_module._float32_table(changed) is None, bad


def test_float32_units_take_groups_up_to_their_own_bound():
    """bfp-exact (every element format: the float32 kernel's unit checks) takes the route for
    groups up to ``FLOAT32_GROUP_FACTOR`` times ``SMALL_GROUP_OUTPUTS`` outputs (128-token
    heads either way round), the
    other exact units up to ``SMALL_GROUP_OUTPUTS`` (but the wide-tree units,
    ``WIDE_TREE_UNITS``); the decoded operands' bound holds for both."""
    assert batch_module.FLOAT32_GROUP_FACTOR * SMALL_GROUP_OUTPUTS == 128 * 128
    for fmt_name in BFP_FORMATS:
        params = hw("bfp-exact").params(fmt_name, fmt_name)
        for rows, columns in ((128, 128), (128, 64), (64, 128), (1, 128 * 128)):
            assert small_groups_apply(params, rows, columns, 64)
        assert not small_groups_apply(params, 129, 128, 64)
        assert not small_groups_apply(params, 128, 128, GROUPS_DECODED // 256 + 1)
    for name, fmt_name in UNITS:
        params = hw(name).params(fmt_name, fmt_name)
        assert not batch_module._float32_unit(params)
        wide = (name, fmt_name) in WIDE_TREE_UNITS
        assert small_groups_apply(params, 128, 128, 64) == wide


@pytest.mark.parametrize("fmt_name", BFP_FORMATS)
@pytest.mark.parametrize("shape", [(3, 128, 64, 128), (2, 128, 128, 64), (2, 40, 48, 200)])
def test_float32_groups_of_128_token_heads(monkeypatch, fmt_name, shape):
    """128-token heads (and wider groups of several passes) through the float32 kernel: every
    bit the generic kernel's and the twin's; the BFP quantizer's groups none deferred."""
    calls = float32_groups_recorded(monkeypatch)
    run_bfp(monkeypatch, fmt_name, shape, seed=sum(shape))
    if fmt_name != "int8":
        assert calls and not np.concatenate(calls).any()


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32])
def test_zero_word_repeats_the_zero_code_over_a_word(dtype):
    from mxsim.datapath.batch import _zero_word

    size = np.dtype(dtype).itemsize
    for zero in (0, 0x7F, 0xFF):
        word = int.from_bytes(zero.to_bytes(size, "little") * (8 // size), "little")
        assert _zero_word(zero, np.dtype(dtype)) == np.uint64(word)
        assert _zero_word(zero, np.dtype(dtype)).dtype == np.uint64


@pytest.mark.parametrize("name", ["ocp-exact", "bfp-exact", "h100-fp8"])
def test_batches_read_each_calls_operands_afresh(name):
    """The kept per-unit work (params, plans, tables, budget) serves a later call with
    changed codes, scales and tensor scales its own results: as the generic kernel's."""
    unit = hw(name)
    rng = np.random.default_rng(3)
    if name == "bfp-exact":
        groups = [
            MXGroups.of([quantize_bfp(part, "MX9", axis=axis).as_mx_tensor() for part in values])
            for values, axis in (
                (rng.standard_normal((12, 14, 32)), 1),
                (rng.standard_normal((12, 32, 14)), 0),
            )
        ]
        qa, qb = groups
    else:
        per_tensor = unit.sections[("inputs", "scales")] == "none"
        qa = quantize_grouped(
            rng.standard_normal((12, 14, 14)), "fp8_e4m3", 32, per_tensor_scale=per_tensor
        )
        rows = quantize_grouped(
            rng.standard_normal((12, 32, 14)), "fp8_e4m3", 32, per_tensor_scale=per_tensor
        )
        qb = dataclasses.replace(rows, shape=(14, 32), axis=0)
    first = matmul_batched(unit, qa, qb)
    assert np.array_equal(first.bits, matmul_batched(unit, qa, qb, method="kernel").bits)
    # the same objects with new contents: codes swapped between groups, scales and tensor
    # scales raised by one
    qa.codes[:] = qa.codes[::-1].copy()
    qb.codes[:6] = qb.codes[6:].copy()
    if unit.sections[("inputs", "scales")] != "none":
        qa.scales[qa.scales < 200] += 1
    qb.tensor_scale_exponents[:] += 1
    again = matmul_batched(unit, qa, qb)
    want = matmul_batched(unit, qa, qb, method="kernel")
    assert np.array_equal(again.bits, want.bits)
    assert np.array_equal(again.scale_exponents, want.scale_exponents)
    assert not np.array_equal(again.bits, first.bits)


@pytest.mark.parametrize("c_kind", ["none", "zeros"])
@pytest.mark.parametrize("shape", [(5, 6, 96, 7), (5, 14, 70, 32)])
def test_grid_zero_trees_each_take_their_own_step(monkeypatch, c_kind, shape):
    """mxdotp's grid (n = 34, L = 70, R = 24) over K = 96, or K = 70 padded to 96
    (MiniLM-like): a masked-attention P @ v whose codes past the first block are 0 in A and
    B (the kernel sums none of them: ``_batch_kernels._live_trees``), the first block's
    last tree one product that rounds to -0 (X = -150: S = -2^-168). A step with S = +0
    keeps a zero accumulator where X < n - L - 150 = -186 or X > n + R - 150 = -92, else
    makes it +0: the blocks' X differ, so each zero tree's step counts, not only the
    first's (a run of them taking the first one's step alone keeps a -0 that a later block
    clears; zero padding within one block cannot show it, as its trees share one X). Each
    group its own order of a keeping and a clearing X; every bit the Fraction twin's (signs
    of zero included) and the generic kernel's, through the exact small-groups route."""
    config = hw("mxdotp")
    params = config.params("fp8_e4m3", "fp8_e4m3")
    fraction, left, right = (
        params.grid_fraction_bits,
        params.grid_max_left_shift,
        params.grid_max_right_shift,
    )
    assert (fraction, left, right) == (34, 70, 24)  # the X bounds below are worked out for these
    rng = np.random.default_rng(29)
    groups, m, k, n = shape
    a, b = operands(rng, "fp8_e4m3", 32, shape, 0.0)
    kinds = corner_codes("fp8_e4m3")
    smallest = int(kinds["subnormal"][0])  # 2^-9, and its negative (the sign bit set)
    for x in (a, b):
        x.codes[...] = 0
    a.codes[:, :, 24] = smallest
    b.codes[:, :, 24] = smallest | 0x80
    # per group the X of blocks 1 and 2 (block 0's: -150): kept right (0), kept left (-200),
    # cleared (-120)
    orders = [(0, -120), (-200, -120), (-120, 0), (-120, -200), (0, -200)]
    for g, later in enumerate(orders):
        for block, x in enumerate((-150, *later)):
            a.scales[g, :, block] = 127 + x // 2
            b.scales[g, :, block] = 127 + x - x // 2
    c = None if c_kind == "none" else np.zeros((groups, m, n), dtype=np.float32)
    taken = []
    route = api.small_groups_matmul
    monkeypatch.setattr(api, "small_groups_matmul", lambda *x: taken.append(1) or route(*x))
    got, flagged = flagged_outputs(monkeypatch, config, a, b, c)
    assert taken and not flagged.any()  # the route computed every output itself
    want = matmul_batched(config, a, b, c=c, method="kernel")
    np.testing.assert_array_equal(got.bits, want.bits)
    for g, later in enumerate(orders):
        twin = dot_reference(
            params,
            a.codes[g, 0].tolist(),
            b.codes[g, 0].tolist(),
            a.scales[g, 0].tolist(),
            b.scales[g, 0].tolist(),
            0.0,
        )
        assert (got.bits[g] == np.float32(twin).view(np.uint32)).all(), (g, later, twin)
    # the case the steps tell apart is there: a -0 kept by block 1, cleared by block 2
    assert (got.bits[0] == 0).all() and (got.bits[4] == 0x80000000).all()


@pytest.mark.parametrize(
    "name, fmt_name",
    [
        ("ocp-exact", "fp8_e4m3"),
        ("kulisch", "fp6_e3m2"),
        ("mxdotp", "fp8_e4m3"),
        ("bfp-exact", "MX9"),
    ],
)
def test_kept_plans_and_tables_are_read_only(name, fmt_name):
    """The small-groups routes' work kept per unit (the exact kernel's trees, floors and
    grid rule; the float32 kernel's bounds and tables; the window kernel's config and packed
    tables; raised tables) refuses an in-place write."""
    params = hw(name).params(fmt_name, fmt_name)
    kept = [batch_module._exact_plan(params, 70)]
    tables = (api._kernel_arguments(params)[2][0],) * 2
    if name == "bfp-exact":
        kept += [batch_module._float32_bounds(params), batch_module._float32_table(tables[0])]
    kept += [batch_module._raised_table(tables[0], 3)]
    window = hw("h100-fp8").params("fp8_e4m3", "fp8_e4m3")
    kept += [batch_module._window_plan(window)]
    arrays = arrays_in(kept)
    assert len(arrays) >= 8 and not [a for a in arrays if a.flags.writeable]
