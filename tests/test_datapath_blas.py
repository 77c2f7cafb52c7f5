"""The float64-BLAS route equals the datapath kernel bit for bit wherever it is taken."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from conftest import REPO
from mxsim.quantize import MXGroups, quantize, quantize_bfp, quantize_grouped
from mxsim.datapath import load_hwconfig, matmul, matmul_batched
from mxsim.datapath.blas import (
    ROUNDING_CHOICES,
    _exact_chunks,
    _fold_blocks,
    _fold_code_blocks,
    _decoded_folded,
    _folded_powers,
    _folded_trees,
    _fp32_exact_blocks,
    span_bits,
    _unscaled,
    blas_applies,
    blocks_per_tree,
    codes_all_finite,
    decode_fold_limits,
    exact_in_float64,
    grid_floor,
    grid_nearest_even_floor,
    grid_trees,
    tree_sum_bits,
    zero_block_mask,
)
from mxsim.datapath._blas_kernels import (
    accumulate_grid_fp32,
    accumulate_rne_fp32,
    decode_folded,
    values_finite_and_not_negative_zero,
)
from mxsim.datapath.config import vary_hwconfig
from mxsim.datapath.reference import dot_reference
from mxsim.datapath.schema import DIRECTED_AND_NEAREST, route_accepts
from mxsim.formats import get_format
from mxsim.formats.reference import encode_reference
from mxsim.datapath.api import _kernel_arguments, _scales_for_unit
from mxsim.datapath._tree_kernels import (
    COLUMNS,
    PACKED_PAD,
    trees16_fp32,
    grid_trees8,
    grid_trees16,
    rne_trees8,
)
from mxsim.datapath import api as api_module
from mxsim.datapath import batch as batch_module
from mxsim.datapath import blas as blas_module

UNITS = {
    name: load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
    for name in ("ocp-exact", "mxdotp-paper", "h100-fp8")
}
SMALL_SPAN = ["fp8_e4m3", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1"]


def route_taken(unit, qa, qb, c=None) -> bool:
    params = unit.params(qa.element_format.name, qb.element_format.name)
    _, _, args = _kernel_arguments(params)
    c_values = np.zeros((1, 1)) if c is None else c.astype(np.float64)
    return blas_applies(
        params,
        args,
        qa.codes,
        qb.codes,
        _scales_for_unit(qa.scales, params),
        _scales_for_unit(qb.scales, params),
        c_values,
    )


def test_exactness_condition_per_format_pair():
    params = UNITS["ocp-exact"].params
    assert exact_in_float64(params("fp8_e4m3", "fp8_e4m3"))  # 36 + 5 bits
    assert exact_in_float64(params("int8", "int8"))
    assert not exact_in_float64(params("fp8_e5m2", "fp8_e5m2"))  # 64 + 5 bits
    assert not exact_in_float64(params("fp8_e4m3", "fp8_e5m2"))  # 50 + 5 bits
    kulisch = load_hwconfig(REPO / "hwconfigs" / "kulisch.yaml").params("fp8_e4m3", "fp8_e4m3")
    for wide in (
        "fp32",
        "fp64",
    ):  # no table of every code (2^32, 2^64): refused without building one
        assert not exact_in_float64(dataclasses.replace(kulisch, a_format=wide, b_format=wide))


@settings(max_examples=40, deadline=None)
@given(
    unit=st.sampled_from(["ocp-exact", "mxdotp-paper"]),
    a_format=st.sampled_from(SMALL_SPAN),
    b_format=st.sampled_from(SMALL_SPAN),
    shape=st.tuples(st.integers(1, 9), st.integers(1, 80), st.integers(1, 7)),
    spread=st.floats(0, 40),
    with_c=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_blas_route_equals_the_kernel(unit, a_format, b_format, shape, spread, with_c, seed):
    rng = np.random.default_rng(seed)
    rows, length, columns = shape
    # Wide per-row and per-column magnitudes reach fp32 subnormals and overflow.
    A = rng.standard_normal((rows, length)) * np.exp2(rng.uniform(-spread, spread, (rows, 1)) * 3)
    B = rng.standard_normal((length, columns)) * np.exp2(
        rng.uniform(-spread, spread, (1, columns)) * 3
    )
    qa = quantize(A, a_format, axis=1)
    qb = quantize(B, b_format, axis=0)
    c = (
        (rng.standard_normal((rows, columns)) * np.exp2(rng.uniform(-130, 120))).astype(np.float32)
        if with_c
        else None
    )
    if c is not None:
        c[c == 0] = 1.0  # -0 accumulator inputs go to the kernel
    hw = UNITS[unit]
    assert route_taken(hw, qa, qb, c)
    fast = matmul(hw, qa, qb, c=c)
    slow = matmul(hw, qa, qb, c=c, method="kernel")
    np.testing.assert_array_equal(fast.bits, slow.bits)


def test_special_inputs_and_other_units_go_to_the_kernel():
    qa = quantize(np.array([[1.0, np.nan]]), "fp8_e4m3", axis=1)
    qb = quantize(np.ones((2, 1)), "fp8_e4m3", axis=0)
    assert not route_taken(UNITS["ocp-exact"], qa, qb)  # NaN element (a NaN block scale)
    ok_a = quantize(np.ones((1, 2)), "fp8_e4m3", axis=1)
    assert route_taken(UNITS["ocp-exact"], ok_a, qb)
    assert not route_taken(UNITS["ocp-exact"], ok_a, qb, c=np.array([[-0.0]], dtype=np.float32))
    e5m2 = quantize(np.ones((2, 1)), "fp8_e5m2", axis=0)
    assert not route_taken(UNITS["ocp-exact"], ok_a, e5m2)
    assert np.isnan(matmul(UNITS["ocp-exact"], qa, qb).values[0, 0])


def test_tree_sum_bits_choose_float32_for_narrow_formats():
    # fp4_e2m1: products are multiples of 2^-2 below 2^(2 + 2 + 2); 32 of them: 8 + 5 bits,
    # exact in float32's 24. fp6_e3m2: (4 + 4 + 2 + 4 + 4) + 5 = 23. fp8_e4m3: 36 + 5 = 41
    # (float64). MXDOTP's trees of 8: 3 bits for the count.
    params = UNITS["ocp-exact"].params
    assert tree_sum_bits(params("fp4_e2m1", "fp4_e2m1")) == 13
    assert tree_sum_bits(params("fp6_e3m2", "fp6_e3m2")) == 23
    assert tree_sum_bits(params("int8", "int8")) == 21
    assert tree_sum_bits(params("fp8_e4m3", "fp8_e4m3")) == 41
    assert tree_sum_bits(params("fp8_e4m3", "fp4_e2m1")) == 27
    assert tree_sum_bits(UNITS["mxdotp-paper"].params("fp4_e2m1", "fp4_e2m1")) == 11


def test_int8_span_counts_its_minus_two_code():
    # MX INT8 decodes 0x80 as -2.0: the largest magnitude's leading bit is 2^1, not emax = 0.
    assert span_bits(get_format("int8")) == (1, -6)
    assert span_bits(get_format("fp8_e4m3")) == (8, -9)


def test_a_flushing_floating_point_mode_refuses_the_route(monkeypatch):
    import mxsim.datapath.blas as blas

    assert blas.subnormals_work()  # this process keeps subnormals
    qa = quantize(np.ones((1, 32)), "fp8_e4m3", axis=1)
    qb = quantize(np.ones((32, 1)), "fp8_e4m3", axis=0)
    assert route_taken(UNITS["ocp-exact"], qa, qb)
    monkeypatch.setattr(blas, "subnormals_work", lambda: False)
    assert not route_taken(UNITS["ocp-exact"], qa, qb)
    assert matmul(UNITS["ocp-exact"], qa, qb).values[0, 0] == 32.0  # the kernel computes it


def test_unknown_method_is_an_error():
    qa = quantize(np.ones((1, 2)), "fp8_e4m3", axis=1)
    qb = quantize(np.ones((2, 1)), "fp8_e4m3", axis=0)
    with pytest.raises(Exception, match="method"):
        matmul(UNITS["ocp-exact"], qa, qb, method="fast")


@settings(max_examples=30, deadline=None)
@given(
    a_format=st.sampled_from(SMALL_SPAN + ["int8"]),
    spread=st.integers(0, 120),
    seed=st.integers(0, 2**32 - 1),
)
def test_kulisch_blas_route_equals_the_kernel(a_format, spread, seed):
    # Block scales spread over up to 2 x 120 binades: some exact sums need more than two
    # float64s; those outputs go back to the kernel, and every output must still match.
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((6, 96)) * np.exp2(rng.integers(-spread, spread + 1, (6, 96)))
    B = rng.standard_normal((96, 5)) * np.exp2(rng.integers(-spread, spread + 1, (96, 5)))
    qa, qb = quantize(A, a_format, axis=1), quantize(B, a_format, axis=0)
    c = rng.standard_normal((6, 5)).astype(np.float32)
    kulisch = load_hwconfig(REPO / "hwconfigs" / "kulisch.yaml")
    assert route_taken(kulisch, qa, qb, c)
    np.testing.assert_array_equal(
        matmul(kulisch, qa, qb, c=c).bits, matmul(kulisch, qa, qb, c=c, method="kernel").bits
    )


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    groups=st.integers(1, 3),
    rows=st.integers(1, 9),
    length=st.integers(1, 100),
    columns=st.integers(1, 9),
    a_format=st.sampled_from(["fp8_e4m3", "fp4_e2m1", "int8"]),
    spread=st.integers(0, 6),
    seed=st.integers(0, 2**32 - 1),
)
def test_kulisch_sum_of_one_range_rounds_once_as_the_twin(
    monkeypatch, groups, rows, length, columns, a_format, spread, seed
):
    # Scales a few binades apart: all of K is one exactly summed range, added to c and
    # rounded once. Against the generic kernel and a Fraction twin, with accumulator inputs
    # at the corners (+0, subnormals, near fp32's top so that acc + S overflows), zeros and
    # exact cancellations (rows equal to another row negated) in the data, odd shapes.
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((groups, rows, length)) * np.exp2(
        rng.integers(-spread, spread + 1, (groups, rows, length))
    )
    A[rng.random(A.shape) < 0.2] = 0.0
    B = rng.standard_normal((groups, length, columns))
    if columns > 1:
        B[:, :, -1] = -B[:, :, 0]  # the last column's sums: the first's negated
    # (c near an ulp of S: S rounded first, then acc + S, would differ)
    corners = np.array([0.0, 1e-40, -3e-45, 3.4e38, -3.4e38, 1e-6, -7e-7, 1.5], dtype=np.float32)
    c = rng.choice(corners, (groups, rows, columns))
    c[rng.random(c.shape) < 0.5] = rng.standard_normal() * 1e3
    c = c.astype(np.float32)
    qa = quantize_grouped(A, a_format, 32)
    rows_b = quantize_grouped(np.ascontiguousarray(B.transpose(0, 2, 1)), a_format, 32)
    qb = dataclasses.replace(rows_b, shape=(length, columns), axis=0)
    kulisch = load_hwconfig(REPO / "hwconfigs" / "kulisch.yaml")
    # the BLAS route's tiles, not the small-groups route, for these small groups
    monkeypatch.setattr(batch_module, "SMALL_GROUP_OUTPUTS", 0)
    ranges = []
    double_double = blas_module.accumulate_double_double
    monkeypatch.setattr(
        blas_module,
        "accumulate_double_double",
        lambda *args: ranges.append(1) or double_double(*args),
    )
    fast = matmul_batched(kulisch, qa, qb, c=c)
    # whole blocks of nonzero normal samples, spread 0: scales within a few binades, one
    # range (no two float64s); a short or all-zero block (scale 2^-127) may start another
    whole = length % 32 == 0 and (A.reshape(groups, rows, -1, 32) != 0).any(axis=-1).all()
    assert spread > 0 or not whole or not ranges
    np.testing.assert_array_equal(
        fast.bits, matmul_batched(kulisch, qa, qb, c=c, method="kernel").bits
    )
    fp32 = get_format("fp32")
    a_values, b_values = qa.dequantize(), qb.dequantize()
    for g in range(groups):
        for i in range(rows):
            for j in range(columns):
                exact = Fraction(c[g, i, j].item()) + sum(
                    Fraction(x) * Fraction(y)
                    for x, y in zip(a_values[g, i].tolist(), b_values[g, :, j].tolist())
                )
                want = encode_reference(fp32, exact, "nearest_even", "inf_nan")
                assert int(fast.bits[g, i, j]) == want, (g, i, j)


def test_kulisch_sums_wider_than_two_doubles_go_back_to_the_kernel():
    from mxsim.datapath.blas import blas_matmul
    from mxsim.datapath.api import _kernel_arguments

    # Three blocks whose sums sit at 2^200, 2^0 and 2^-200: no two float64s hold their sum.
    A = np.concatenate([np.full(32, 2.0**100), np.full(32, 1.0), np.full(32, 2.0**-100)])[None, :]
    B = np.concatenate([np.full(32, 2.0**100), np.full(32, 1.0), np.full(32, 2.0**-100)])[:, None]
    qa, qb = quantize(A, "fp8_e4m3", axis=1), quantize(B, "fp8_e4m3", axis=0)
    kulisch = load_hwconfig(REPO / "hwconfigs" / "kulisch.yaml")
    params = kulisch.params("fp8_e4m3", "fp8_e4m3")
    _, _, args = _kernel_arguments(params)
    out = np.empty((1, 1, 1), dtype=np.uint32)
    leftovers = blas_matmul(
        params,
        args,
        qa.codes[None],
        qb.codes[None],
        _scales_for_unit(qa.scales, params)[None],
        _scales_for_unit(qb.scales, params)[None],
        np.zeros((1, 1, 1), np.float32),
        out,
    )
    assert leftovers == [(0, 0, 0)]
    np.testing.assert_array_equal(
        matmul(kulisch, qa, qb).bits, matmul(kulisch, qa, qb, method="kernel").bits
    )


@pytest.mark.parametrize("a_format", ["fp8_e4m3", "fp4_e2m1", "int8"])
def test_kulisch_blocks_at_e8m0_extremes_are_scaled_exactly(a_format):
    # Block scales at E8M0's ends (2^-127, 2^127) and beside 2^0, drawn per block of A and
    # of B: the blocks are scaled while decoded, each by its exponent's power of two; the
    # outputs (one range, two float64s, or back to the kernel) are the kernel's.
    rng = np.random.default_rng(11)
    A = rng.standard_normal((2, 5, 96))
    B = rng.standard_normal((2, 96, 4))
    A[0, 1] = 0.0
    qa = quantize_grouped(A, a_format, 32)
    rows_b = quantize_grouped(np.ascontiguousarray(B.transpose(0, 2, 1)), a_format, 32)
    qb = dataclasses.replace(rows_b, shape=(96, 4), axis=0)
    ends = np.array([0, 1, 126, 127, 128, 253, 254], dtype=np.uint8)  # E8M0 codes
    qa = dataclasses.replace(qa, scales=rng.choice(ends, qa.scales.shape).astype(np.uint8))
    qb = dataclasses.replace(qb, scales=rng.choice(ends, qb.scales.shape).astype(np.uint8))
    qb.scales[1] = 127  # (a group of B at 2^0: A's ends alone)
    kulisch = load_hwconfig(REPO / "hwconfigs" / "kulisch.yaml")
    decoded = []
    scaled = blas_module._decoded
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batch_module, "SMALL_GROUP_OUTPUTS", 0)
        patch.setattr(blas_module, "_decoded", lambda *a: decoded.append(1) or scaled(*a))
        fast = matmul_batched(kulisch, qa, qb)
    assert decoded
    np.testing.assert_array_equal(fast.bits, matmul_batched(kulisch, qa, qb, method="kernel").bits)


def test_fp32_elements_are_refused_without_a_table_of_every_code():
    # An fma chain of fp32 elements (mi250-fp32, with the whole-sum zero sign rule) passes every
    # key declaration, but its products span far more than float64's 53 bits; the span comes
    # from the format, not 2^32 decoded codes.
    params = dataclasses.replace(
        load_hwconfig(REPO / "hwconfigs" / "mi250-fp32.yaml").params("fp32", "fp32"),
        output_zero_sign="ieee",
    )
    assert route_accepts("blas", params)
    assert span_bits(get_format("fp32")) == (127, -149)
    assert not exact_in_float64(params)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # same patch each
@given(
    unit=st.sampled_from(["ocp-exact", "mxdotp-paper", "kulisch"]),
    a_format=st.sampled_from(SMALL_SPAN),
    shape=st.tuples(st.integers(1, 3), st.integers(1, 9), st.integers(1, 100), st.integers(1, 9)),
    spread=st.integers(0, 8),
    held=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_small_tiles_panels_and_chunks_equal_the_kernel(
    monkeypatch, unit, a_format, shape, spread, held, seed
):
    # Tiles of 2 rows, B decoded a few columns at a time, GEMMs of a few MACs, several blocks
    # per exact-accumulator range (spread: block scales a few binades apart): the kernel's bits.
    import mxsim.datapath.blas as blas

    for name, value in {
        "TILE_ROWS": 2,
        "SMALL_TILE_ROWS": 3,
        "TILE_COLUMNS": 4,
        "DECODED_VALUES": 96,
        "SINGLE_THREAD_MACS": 200,
        "KULISCH_MACS": 300,
        "KULISCH_COLUMNS": 3,
    }.items():
        monkeypatch.setattr(blas, name, value)
    if not held:  # no controllable BLAS: GEMMs within SINGLE_THREAD_MACS
        monkeypatch.setattr(blas, "_blas_threads", lambda: None)
    groups, rows, length, columns = shape
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((groups, rows, length)) * np.exp2(
        rng.integers(-spread, spread + 1, (groups, rows, length))
    )
    B = rng.standard_normal((groups, length, columns)) * np.exp2(
        rng.integers(-spread, spread + 1, (1, length, 1))
    )
    c = rng.standard_normal((groups, rows, columns)).astype(np.float32)
    hw = UNITS.get(unit) or load_hwconfig(REPO / "hwconfigs" / f"{unit}.yaml")
    reports = []
    fast = matmul_batched(
        hw,
        A,
        B,
        c=c,
        a_format=a_format,
        b_format=a_format,
        progress=lambda done, total: reports.append((done, total)),
    )
    slow = matmul_batched(hw, A, B, c=c, a_format=a_format, b_format=a_format, method="kernel")
    np.testing.assert_array_equal(fast.bits, slow.bits)
    assert reports[-1] == (groups * rows, groups * rows) and reports == sorted(reports)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # same patch each
@given(
    unit=st.sampled_from(
        ["ocp-exact", "mxdotp-paper", "mxdotp", "mxdotp-rtz", "kulisch", "bfp-exact"]
    ),
    shape=st.tuples(st.integers(2, 5), st.integers(1, 7), st.integers(1, 70), st.integers(1, 7)),
    spread=st.integers(0, 12),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**32 - 1),
)
def test_batch_passes_decoding_their_own_groups_of_b_equal_the_kernel(
    monkeypatch, unit, shape, spread, threads, seed
):
    # A batch of whole-group passes decodes each pass's groups of B in the pass. Against
    # the generic kernel, with whole blocks of zeros, exact cancellations and accumulator
    # inputs at the corners (+0, subnormals, near fp32's top), on one and two threads.
    import numba

    import mxsim.datapath.blas as blas

    monkeypatch.setattr(batch_module, "SMALL_GROUP_OUTPUTS", 0)  # not the small-groups route
    for name in ("TILE_ROWS", "SMALL_TILE_ROWS", "TILE_COLUMNS", "KULISCH_COLUMNS"):
        monkeypatch.setattr(blas, name, 4)  # passes of 4 rows: a few groups each
    monkeypatch.setattr(blas, "GROUP_PASS_TILES", 1)  # (passes of whole groups: several)
    monkeypatch.setattr(blas, "SINGLE_THREAD_MACS", 200)
    decoded_groups = []
    seen_passes = []
    passes = blas.batch_passes
    # (a call folded again first after its fold while decoding failed passes again: the
    # decodes counted are those of the last passes)
    monkeypatch.setattr(
        blas,
        "batch_passes",
        lambda *a: (
            decoded_groups.clear() or seen_passes.append(list(passes(*a))) or seen_passes[-1]
        ),
    )
    # (``_decoded`` decodes through ``_unscaled`` only for blocks of no power of two: not these)
    for name in ("_unscaled", "_decoded_folded", "_decoded"):
        decode = getattr(blas, name)
        monkeypatch.setattr(
            blas,
            name,
            lambda *a, decode=decode, **k: decoded_groups.append(a[1].shape[0]) or decode(*a, **k),
        )
    refused = []  # the route refused after its fold while decoding (sums beyond 53 bits)
    refolded = blas._refolded
    monkeypatch.setattr(
        blas, "_refolded", lambda *a: (lambda out: refused.append(out is None) or out)(refolded(*a))
    )
    groups, rows, length, columns = shape
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((groups, rows, length)) * np.exp2(
        rng.integers(-spread, spread + 1, (groups, rows, length))
    )
    A[:, :, : length // 2][rng.random((groups, rows)) < 0.3] = 0.0  # blocks of zeros
    B = rng.standard_normal((groups, length, columns)) * np.exp2(
        rng.integers(-spread, spread + 1, (groups, length, 1))
    )
    if columns > 1:
        B[..., -1] = -B[..., 0]
    corners = np.array([0.0, 1e-40, -3e-45, 3.4e38, -3.4e38, 1e-6, 1.5], dtype=np.float32)
    c = rng.choice(corners, (groups, rows, columns)).astype(np.float32)
    hw = load_hwconfig(REPO / "hwconfigs" / f"{unit}.yaml")
    element = "mx9" if unit == "bfp-exact" else "fp8_e4m3"
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        fast = matmul_batched(hw, A, B, c=c, a_format=element, b_format=element)
    finally:
        numba.set_num_threads(before)
    slow = matmul_batched(hw, A, B, c=c, a_format=element, b_format=element, method="kernel")
    np.testing.assert_array_equal(fast.bits, slow.bits)
    taken = seen_passes[-1] if seen_passes and not any(refused) else []  # (none: refused)
    if len(taken) >= threads and all(r1 - r0 == rows for _, _, r0, r1 in taken):
        # passes of whole groups, one item each: each decodes its own groups of B
        assert len(decoded_groups) == 2 * len(taken)
        assert decoded_groups[::2] == [g1 - g0 for g0, g1, _, _ in taken]


def test_exact_ranges_of_blocks():
    # fp8_e4m3 x fp8_e4m3 blocks of 32 need 41 bits: 2^12 blocks of equal scales fit one GEMM,
    # a block 13 binades above the others' floor does not join them.
    kulisch = load_hwconfig(REPO / "hwconfigs" / "kulisch.yaml").params("fp8_e4m3", "fp8_e4m3")
    zeros = np.zeros((1, 4), np.int32)
    assert _exact_chunks(kulisch, zeros, zeros, 32) == [(0, 4)]
    assert _exact_chunks(kulisch, np.array([[-127]]), np.array([[127]]), 32) == [(0, 1)]
    assert _exact_chunks(kulisch, zeros[:, :0], zeros[:, :0], 32) == []
    assert _exact_chunks(kulisch, np.array([[0, 0, 11, 0]]), zeros, 32) == [
        (0, 4)
    ]  # 1 + 1 + 2^11 + 1 <= 2^12
    assert _exact_chunks(kulisch, np.array([[0, 0, 12, 0]]), zeros, 32) == [
        (0, 2),
        (2, 3),
        (3, 4),
    ]  # 2^12 + 1
    assert _exact_chunks(kulisch, np.array([[12, 0, 0, 0]]), zeros, 32) == [(0, 1), (1, 4)]
    assert _exact_chunks(kulisch, np.array([[0, -13, 0, 0]]), zeros, 32) == [(0, 1), (1, 2), (2, 4)]
    # the floor is the least exponent sum over rows and columns: a row 12 binades below moves it
    assert _exact_chunks(kulisch, np.array([[0, 0, 0, 0], [-12, -12, -12, -12]]), zeros, 32) == [
        (0, 1),
        (1, 2),
        (2, 3),
        (3, 4),
    ]


@settings(max_examples=150, deadline=None)
@given(
    dtype=st.sampled_from([np.float32, np.float64]),
    shape=st.tuples(st.integers(1, 2), st.integers(1, 40), st.integers(1, 300)),
    specials=st.lists(st.sampled_from([np.inf, -np.inf, np.nan, -0.0, 0.0]), max_size=3),
    seed=st.integers(0, 2**32 - 1),
)
def test_accumulator_inputs_check_equals_its_definition(dtype, shape, specials, seed):
    # Accumulator inputs (mostly normal values, a few specials placed anywhere, past the
    # first chunk of 4,096 too): the check is numpy's every value finite and none -0.
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(shape).astype(dtype)
    for special in specials:
        values.reshape(-1)[rng.integers(values.size)] = special
    want = bool(np.isfinite(values).all() and not (np.signbit(values) & (values == 0)).any())
    assert values_finite_and_not_negative_zero(values) == want


@settings(max_examples=150, deadline=None)
@given(
    fmt=st.sampled_from(["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "many", "three"]),
    shape=st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(0, 70)),
    specials=st.sampled_from([0, 1, 3]),
    width=st.sampled_from([np.uint8, np.uint16, np.uint32]),
    layout=st.sampled_from(["contiguous", "strided", "unaligned"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_codes_all_finite_equals_a_lookup_of_every_code(fmt, shape, specials, width, layout, seed):
    # Codes of formats with 0, 2 and 8 non-finite codes (each set every code with some bits
    # fixed: one masked compare), a table with 3 others (a compare each) and one with more
    # (scanned), a few non-finite codes placed or none, bytes or wider, contiguous (words of
    # several codes, and the codes past the last whole word), strided, or contiguous from an
    # address no word starts at: whether every code's value is finite, read code by code in
    # plain Python.
    rng = np.random.default_rng(seed)
    if fmt == "many":  # more non-finite codes than FEW_NON_FINITE
        values = np.where(np.arange(256) % 16 == 3, np.nan, np.arange(256.0))
    elif fmt == "three":  # not all codes with some bits fixed: 0x80 and 0x7F differ in all
        values = np.where(np.isin(np.arange(256), [0x7F, 0x80, 0xFF]), np.inf, np.arange(256.0))
    else:
        values = get_format(fmt).decode_fields(np.arange(1 << get_format(fmt).field_bits))
    finite = np.isfinite(values)
    codes = rng.choice(np.flatnonzero(finite), shape)
    bad = np.flatnonzero(~finite)
    if codes.size and bad.size:
        for _ in range(specials):
            codes.reshape(-1)[rng.integers(codes.size)] = rng.choice(bad)
    codes = codes.astype(width)
    if layout == "strided":
        codes = np.repeat(codes, 2, axis=-1)[..., ::2]
    elif layout == "unaligned":  # (one code more in front of the same codes)
        codes = np.concatenate([codes.reshape(-1)[:1], codes.reshape(-1)])[1:].reshape(shape)
    want = all(bool(finite[c]) for c in codes.reshape(-1).tolist())
    assert codes_all_finite(codes, finite) == want


def exact_ranges_twin(rows_a, rows_b, room: int) -> list[tuple[int, int]]:
    """Plain Python: the greedy ranges of blocks whose sum of 2^(largest scale sum - the
    range's least) stays within ``room`` (lists of per-row block exponents of A and B)."""
    blocks = len(rows_a[0]) if rows_a else 0
    most = [max(r[t] for r in rows_a) + max(r[t] for r in rows_b) for t in range(blocks)]
    least = [min(r[t] for r in rows_a) + min(r[t] for r in rows_b) for t in range(blocks)]
    ranges, first = [], 0
    for t in range(1, blocks + 1):
        floor = min(least[first:t])
        if t - first > 1 and sum(2 ** (most[u] - floor) for u in range(first, t)) > room:
            ranges.append((first, t - 1))
            first = t - 1
    return ranges + ([(first, blocks)] if blocks else [])


@settings(max_examples=40, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(0, 6)),
    spread=st.sampled_from([0, 3, 12, 30]),
    seed=st.integers(0, 2**32 - 1),
)
def test_exact_ranges_of_blocks_equal_their_definition(shape, spread, seed):
    # Rows of A and B whose block exponents differ (the largest and least sums of a block
    # taken over both operands' rows), against the greedy rule in plain Python.
    rows_a, rows_b, blocks = shape
    rng = np.random.default_rng(seed)
    exps_a = rng.integers(-spread, spread + 1, (rows_a, blocks)).astype(np.int32)
    exps_b = rng.integers(-spread, spread + 1, (1, rows_b, blocks)).astype(np.int32)
    kulisch = load_hwconfig(REPO / "hwconfigs" / "kulisch.yaml").params("fp8_e4m3", "fp8_e4m3")
    room = 2 ** (53 - 41)  # fp8_e4m3 x fp8_e4m3 blocks of 32: 41 bits
    want = exact_ranges_twin(exps_a.tolist(), exps_b[0].tolist(), room)
    assert _exact_chunks(kulisch, exps_a, exps_b, 32) == want


def test_fp32_exact_blocks_bound_the_scaled_sums_by_float32():
    # fp4 x fp4 trees: multiples of 2^-2 below 2^11. A block is added in float32 when its
    # least step product times 2^-2 reaches 2^-149 and its largest times 2^11 stays <= 2^128.
    def steps(*exponents):
        return np.ldexp(1.0, np.array(exponents)).reshape(len(exponents), 1, 1)

    span = (-2, 11)
    ones = steps(0, 0, 0, 0)
    got = _fp32_exact_blocks(steps(-147, -148, 117, 118), ones, span)
    assert got.tolist() == [True, False, True, False]
    # the steps' product counts, not each step: 2^-100 * 2^-47 = 2^-147
    assert _fp32_exact_blocks(steps(-100, -100), steps(-47, -48), span).tolist() == [True, False]
    # a step product beyond float32 is refused even where the sums' bounds allow it
    assert _fp32_exact_blocks(steps(-150), ones, (2, 3)).tolist() == [False]
    assert _fp32_exact_blocks(steps(128), ones, (-2, -1)).tolist() == [False]


@settings(max_examples=25, deadline=None)
@given(
    unit=st.sampled_from(["ocp-exact", "mxdotp-paper"]),
    a_format=st.sampled_from(["fp4_e2m1", "fp6_e2m3", "fp6_e3m2"]),
    shape=st.tuples(st.integers(1, 6), st.integers(1, 130), st.integers(1, 6)),
    center=st.sampled_from([2, 40, 127, 200, 252]),
    width=st.integers(0, 60),
    seed=st.integers(0, 2**32 - 1),
)
def test_blocks_added_in_float32_or_not_equal_the_kernel(
    unit, a_format, shape, center, width, seed
):
    # Block scales drawn per block across E8M0's range: within one GEMM some blocks' scaled
    # sums are float32s (added in float32) and others reach fp32 subnormals or overflow.
    rng = np.random.default_rng(seed)
    rows, length, columns = shape
    qa = quantize(rng.standard_normal((rows, length)), a_format, axis=1)
    qb = quantize(rng.standard_normal((length, columns)), a_format, axis=0)

    def rescaled(q):
        codes = np.clip(center + rng.integers(-width, width + 1, q.scales.shape), 0, 254)
        return dataclasses.replace(q, scales=codes.astype(np.uint8))

    qa, qb = rescaled(qa), rescaled(qb)
    c = (rng.standard_normal((rows, columns)) * 2.0 ** rng.integers(-140, 120)).astype(np.float32)
    c[c == 0] = 1.0  # -0 accumulator inputs go to the kernel
    hw = UNITS[unit]
    assert route_taken(hw, qa, qb, c)
    fast = matmul(hw, qa, qb, c=c)
    slow = matmul(hw, qa, qb, c=c, method="kernel")
    np.testing.assert_array_equal(fast.bits, slow.bits)


BFP = load_hwconfig(REPO / "hwconfigs" / "bfp-exact.yaml")


@settings(max_examples=30, deadline=None)
@given(
    spec=st.sampled_from(["MX9", "MX6", "MX4"]),
    shape=st.tuples(st.integers(1, 6), st.integers(1, 70), st.integers(1, 6)),
    spread=st.floats(0, 40),
    jitter=st.sampled_from([0, 1, 3, 30]),
    holes=st.sampled_from([0.0, 0.3]),
    hole_drop=st.sampled_from([None, 8]),
    seed=st.integers(0, 2**32 - 1),
)
def test_trees_of_several_scale_blocks_equal_the_kernel(
    spec, shape, spread, jitter, holes, hole_drop, seed
):
    # bfp-exact: trees of 16 over sub-blocks of 2, each with its own scale (microexponents);
    # the route folds each tree's blocks onto its least scale where the sums stay within 53
    # bits. jitter moves single sub-block scales further apart (30: beyond float64 for MX9).
    # holes: sub-blocks of A made zeros with scale code 0 (2^-127), as quantizers leave
    # them (hole_drop: 8 binades below the sub-block's scale instead): left out of the fold.
    rng = np.random.default_rng(seed)
    rows, length, columns = shape
    A = rng.standard_normal((rows, length)) * np.exp2(rng.uniform(-spread, spread, (rows, 1)) * 3)
    B = rng.standard_normal((length, columns)) * np.exp2(
        rng.uniform(-spread, spread, (1, columns)) * 3
    )
    qa = quantize_bfp(A, spec, axis=1).as_mx_tensor()
    qb = quantize_bfp(B, spec, axis=0).as_mx_tensor()
    if jitter:
        moved = qa.scales.astype(np.int64) + rng.integers(-jitter, jitter + 1, qa.scales.shape)
        qa = dataclasses.replace(qa, scales=np.clip(moved, 1, 254).astype(np.uint8))
    if holes:
        empty = rng.random(qa.scales.shape) < holes
        codes = qa.codes.copy()
        codes[np.repeat(empty, 2, axis=1)[:, : codes.shape[1]]] = 0
        low = 0 if hole_drop is None else np.clip(qa.scales.astype(np.int64) - hole_drop, 0, 254)
        qa = dataclasses.replace(qa, codes=codes, scales=np.where(empty, low, qa.scales))
    c = (rng.standard_normal((rows, columns)) * np.exp2(rng.uniform(-130, 120))).astype(np.float32)
    c[c == 0] = 1.0  # -0 accumulator inputs go to the kernel
    params = BFP.params(qa.element_format.name, qb.element_format.name)
    scales_a, scales_b = (_scales_for_unit(q.scales, params) for q in (qa, qb))
    args = _kernel_arguments(params)[2]
    # the tree sums' bits once each tree's blocks are folded onto its least scale (blocks
    # of zeros left out): the trees' bits plus the largest rise in A and in B
    per = blocks_per_tree(params)
    bits = tree_sum_bits(params)
    for q, scales, table in ((qa, scales_a, args[0]), (qb, scales_b, args[2])):
        marks = zero_block_marks(q.codes, table, 2, scales.shape[-1])
        rises = folded_twin(scales.tolist(), marks.tolist(), per)[1]
        bits += max(max(row) for row in rises)
    assert route_taken(BFP, qa, qb, c) == (bits <= 53)
    # The route's fold (every block counted where that keeps float32) decides as this one:
    # float32 sums, float64 sums or the kernel.
    folded = _folded_trees(params, args, qa.codes, qb.codes, scales_a, scales_b)
    chosen = tree_sum_bits(params) + folded[0][2] + folded[1][2]
    assert (chosen <= 24, chosen <= 53) == (bits <= 24, bits <= 53)
    fast = matmul(BFP, qa, qb, c=c)
    slow = matmul(BFP, qa, qb, c=c, method="kernel")
    np.testing.assert_array_equal(fast.bits, slow.bits)


def folded_twin(exponents: list, empty: list, per: int) -> tuple[list, list]:
    """Plain Python: per row of block exponents and zero-block marks, each tree's least
    exponent over its blocks that hold a nonzero (over all of them when none does) and each
    block's rise above it (0 for blocks of zeros and padding blocks)."""
    want_least, want_rises = [], []
    for row, marks in zip(exponents, empty):
        blocks, lows, ups = len(row), [], []
        for t in range(-(-blocks // per)):
            span = range(t * per, min((t + 1) * per, blocks))
            counted = [row[b] for b in span if not marks[b]]
            lows.append(min(counted) if counted else min(row[b] for b in span))
            ups += [
                0 if b >= blocks or marks[b] else row[b] - lows[-1]
                for b in range(t * per, (t + 1) * per)
            ]
        want_least.append(lows)
        want_rises.append(ups)
    return want_least, want_rises


@pytest.mark.parametrize("reach", [1, 127, 400])
@pytest.mark.parametrize("trees", [1, 3])
def test_trees_of_eight_blocks_folded_from_the_scales_equal_their_definition(reach, trees):
    # bfp-exact's trees of 8 sub-blocks (``fold_blocks``' unrolled path, every tree whole):
    # against plain Python, int32 and int64 exponents, rises in bytes and in int64 (reach
    # 400: rises past a byte's 255, which the caller then folds again in int64).
    rng = np.random.default_rng(reach + trees)
    for dtype in (np.int32, np.int64):
        exponents = rng.integers(-reach, reach + 1, (2, 5, 8 * trees)).astype(dtype)
        least, rises, top = _fold_blocks(exponents, 8, trees)
        want = folded_twin(exponents.reshape(-1, 8 * trees).tolist(), np.zeros((10, 8 * trees)), 8)
        assert least.reshape(-1, trees).tolist() == want[0]
        assert rises.reshape(-1, 8 * trees).tolist() == want[1]
        assert top == max(max(row) for row in want[1])


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 4),
    blocks=st.integers(1, 20),
    per=st.integers(1, 8),
    block=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_trees_decoded_equal_their_definition(rows, blocks, per, block, seed):
    # Elements decoded times 2^rise (each block's rise above its tree's least exponent, the
    # fold's plain-Python definition), against plain Python.
    rng = np.random.default_rng(seed)
    exponents = rng.integers(-127, 128, (rows, blocks)).astype(np.int32)
    zeros = rng.random((rows, blocks)) < 0.3
    trees = -(-blocks // per)
    rises = np.array(folded_twin(exponents.tolist(), zeros.tolist(), per)[1])
    table = np.array([0.0, 0.5, -1.5, 3.0])
    length = blocks * block - rng.integers(0, block)
    codes = rng.integers(0, 4, (rows, length)).astype(np.uint8)
    small = np.minimum(rises, 20)  # within float64's exact powers for the check
    for dtype in (np.float64, np.float32):
        got = _unscaled(table, codes[None], trees * per * block, dtype, small[None], block)[0]
        want = [
            [
                table[row[k]] * 2.0 ** steps[k // block] if k < length else 0.0
                for k in range(trees * per * block)
            ]
            for row, steps in zip(codes.tolist(), small.tolist())
        ]
        assert got.dtype == dtype and got.tolist() == want


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32])
@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("block", [32, 24])
def test_codes_of_every_width_and_layout_decode_alike(dtype, strided, block):
    # Codes of one or two bytes decoded as they are, others (and strided ones) widened
    # first: plain and scaled values (E8M0's ends included; blocks of a power of two
    # scaled while decoded, others after), as plain Python reads them.
    rng = np.random.default_rng(5)
    table = rng.standard_normal(256 if dtype == np.uint8 else 300)
    stored = rng.integers(0, table.size, (3, 4, 2 * 70)).astype(dtype)
    codes = stored[..., ::2] if strided else stored[..., :70]
    blocks = 96 // block
    exponents = rng.choice([-127, -126, -1, 0, 1, 126, 127], (3, 4, blocks)).astype(np.int32)
    plain = blas_module._unscaled(table, codes, 96, np.float64)
    scaled = blas_module._decoded(table, codes, exponents, block, 96)
    for g, i, k in np.ndindex(3, 4, 96):
        value = table[codes[g, i, k]] if k < 70 else 0.0
        assert plain[g, i, k] == value
        assert scaled[g, i, k] == math.ldexp(value, int(exponents[g, i, k // block]))


@settings(max_examples=60, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 3), st.integers(1, 5)),
    trees=st.integers(1, 4),
    per=st.sampled_from([1, 3, 8, 8]),
    block=st.sampled_from([1, 2, 2, 3]),
    short=st.integers(0, 5),
    reach=st.sampled_from([0, 1, 2, 3, 127]),
    limit=st.integers(0, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_trees_folded_while_decoded_equal_their_definition(
    shape, trees, per, block, short, reach, limit, seed
):
    # ``decode_folded`` (fold and decode in one pass; trees of 8 blocks of 2 covering the
    # rows by ``_decode_folded_eights``) against plain Python: each tree's least over all its
    # blocks (``folded_twin``, no block left out), 2^least as float64s, each value times
    # 2^(its block's rise), zeros past the codes; the largest rise returned. Codes short of
    # whole trees (``short``) leave a last tree of fewer blocks, or a short last block; reach
    # 127: rises past the limit, where only the largest rise is defined.
    rng = np.random.default_rng(seed)
    groups, rows = shape
    padded = trees * per * block
    length = padded - min(short, per * block - 1)  # (the route's trees hold codes each)
    blocks = -(-length // block)
    exponents = rng.integers(-127, 128 - reach, (groups, rows, 1)) + rng.integers(
        0, reach + 1, (groups, rows, blocks)
    )
    exponents = exponents.astype(np.int32)
    table = np.array([0.0, 0.5, -1.5, 3.0, -0.0, 2.0**-9, 127.0], dtype=np.float32)
    codes = rng.integers(0, table.size, (groups, rows, length)).astype(np.uint32)
    powers_of_least = np.empty((trees, groups, rows))
    rises = np.empty(exponents.shape, dtype=np.uint8)
    out = np.full((groups, rows, padded), np.nan, dtype=np.float32)
    top = decode_folded(
        table, codes, exponents, per, block, _folded_powers(limit), powers_of_least, rises, out
    )
    flat = exponents.reshape(groups * rows, blocks).tolist()
    least, want_rises = folded_twin(flat, [[False] * blocks] * len(flat), per)
    assert top == max(max(row) for row in want_rises)
    steps = powers_of_least.transpose(1, 2, 0).reshape(groups * rows, -1)
    assert steps.tolist() == [[2.0**x for x in row] for row in least]
    if top > limit:
        return
    want = [
        [float(table[row[k]]) * 2.0 ** up[k // block] if k < length else 0.0 for k in range(padded)]
        for row, up in zip(codes.reshape(groups * rows, length).tolist(), want_rises)
    ]
    got = out.reshape(groups * rows, padded)
    assert got.tolist() == want
    assert not np.signbit(got[:, length:]).any()


def test_decode_fold_limits_halve_float32s_room():
    # bfp-exact's MX9 sums need 20 bits (two 7-bit-plus-sign magnitudes, 16 products):
    # rises up to 2 in A and in B keep them within float32's 24; MX6 14, MX4 10 bits. Trees
    # inside one block (ocp-exact) and exact accumulators (kulisch) fold nothing.
    for fmt, want in (("mx9", (2, 2)), ("mx6", (5, 5)), ("mx4", (7, 7))):
        params = BFP.params(fmt, fmt)
        assert decode_fold_limits(params) == want
        assert tree_sum_bits(params) + sum(want) <= 24
    assert decode_fold_limits(UNITS["ocp-exact"].params("fp8_e4m3", "fp8_e4m3")) is None
    kulisch = load_hwconfig(REPO / "hwconfigs" / "kulisch.yaml")
    assert decode_fold_limits(kulisch.params("fp8_e4m3", "fp8_e4m3")) is None


def bfp_groups(rng, spec: str, shape: tuple, jitter: int, holes: float):
    """(A, B) MXGroups of the BFP quantizer (``spec``) on random heads (groups, M, K, N),
    each head's rows scaled apart; ``jitter`` moves single sub-block scales of A and B up to
    that many binades; ``holes``: that share of A's sub-blocks made zeros with scale code 0."""
    groups, m, k, n = shape
    x = rng.standard_normal((groups, m, k)) * np.exp2(rng.uniform(-20, 20, (groups, m, 1)))
    y = rng.standard_normal((groups, k, n)) * np.exp2(rng.uniform(-20, 20, (groups, 1, n)))

    def jittered(q):
        moved = q.scales.astype(np.int64) + rng.integers(-jitter, jitter + 1, q.scales.shape)
        return dataclasses.replace(q, scales=np.clip(moved, 1, 254).astype(np.uint8))

    parts_a = []
    for part in x:
        qa = quantize_bfp(part, spec, axis=1).as_mx_tensor()
        if jitter:
            qa = jittered(qa)
        if holes:
            empty = rng.random(qa.scales.shape) < holes
            codes = qa.codes.copy()
            codes[np.repeat(empty, 2, axis=1)[:, : codes.shape[1]]] = 0
            qa = dataclasses.replace(qa, codes=codes, scales=np.where(empty, 0, qa.scales))
        parts_a.append(qa)
    parts_b = [quantize_bfp(part, spec, axis=0).as_mx_tensor() for part in y]
    if jitter:
        parts_b = [jittered(qb) for qb in parts_b]
    return MXGroups.of(parts_a), MXGroups.of(parts_b)


@pytest.mark.parametrize("spec", ["MX9", "MX6", "MX4"])
@pytest.mark.parametrize(
    "shape",
    [(3, 128, 64, 128), (2, 128, 128, 64), (3, 37, 45, 29), (1, 130, 33, 17)],
)
@pytest.mark.parametrize("jitter, holes", [(0, 0.0), (0, 0.3), (1, 0.0), (6, 0.0), (40, 0.0)])
def test_bfp_batches_folded_while_decoded_equal_the_kernel(monkeypatch, spec, shape, jitter, holes):
    # bfp-exact on attention-shaped heads (128 tokens), odd batches (K not a multiple of 16,
    # outputs past the small-groups route's limit) and a single GEMM: folded while decoding
    # where the rises keep float32 (BFP's sub-blocks: a binade at most), folded again first
    # where they do not (jitter 6: float32 or float64 sums; 40: beyond float64 for MX9, the
    # kernel), bit for bit the generic kernel; and with B kept (``b_memo``: folded first).
    # (128-token heads would take the small-groups route's float32 kernel: kept off it.)
    monkeypatch.setattr(batch_module, "FLOAT32_GROUP_FACTOR", 1)
    rng = np.random.default_rng(abs(hash((spec, shape, jitter, holes))) % 2**32)
    qa, qb = bfp_groups(rng, spec, shape, jitter, holes)
    calls = {"fused": 0, "refolded": 0}
    for name, key in (("_decoded_folded", "fused"), ("_refolded", "refolded")):
        original = getattr(blas_module, name)

        def counted(*args, original=original, key=key):
            calls[key] += 1
            return original(*args)

        monkeypatch.setattr(blas_module, name, counted)
    c = (rng.standard_normal(shape[:2] + shape[3:]) * 2.0**-40).astype(np.float32)
    c[c == 0] = 1.0
    fast = matmul_batched(BFP, qa, qb, c=c).bits
    slow = matmul_batched(BFP, qa, qb, c=c, method="kernel").bits
    np.testing.assert_array_equal(fast, slow)
    assert calls["fused"] > 0  # the fold while decoding was tried
    limit_a = decode_fold_limits(BFP.params(qa.element_format.name, qb.element_format.name))[0]
    if not (jitter or holes):
        assert calls["refolded"] == 0  # BFP's own sub-blocks stay within the limits
    if jitter > 2 * limit_a + 1 or holes:  # (holes: scale 2^-127, every block counted)
        assert calls["refolded"] == 1
    kept = matmul_batched(BFP, qa, qb, c=c, b_memo={}).bits
    np.testing.assert_array_equal(kept, slow)


def test_bfp_single_gemm_folded_while_decoded_equals_the_twin():
    # One small GEMM (the BLAS route: one group), K = 37 (a last tree of 3 sub-blocks, the
    # last of one element), scales far apart between rows and columns (subnormal and huge
    # scaled sums) and a zero sub-block of A at the MX scale 2^-127 among sub-blocks near
    # it: the Fraction twin.
    rng = np.random.default_rng(7)
    A = rng.standard_normal((3, 37)) * np.exp2(np.array([[-126.0], [0.0], [100.0]]))
    B = rng.standard_normal((37, 4)) * np.exp2(np.array([[-5.0, 0.0, 20.0, -30.0]]))
    qa = quantize_bfp(A, "MX9", axis=1).as_mx_tensor()
    qb = quantize_bfp(B, "MX9", axis=0).as_mx_tensor()
    codes, scales = qa.codes.copy(), qa.scales.copy()
    codes[0, 4:6], scales[0, 2] = 0, 0  # (row 0's own scales lie near 2^-127)
    qa = dataclasses.replace(qa, codes=codes, scales=scales)
    c = (rng.standard_normal((3, 4)) * 2.0**-130).astype(np.float32)
    c[c == 0] = 1.0
    params = BFP.params("mx9", "mx9")
    exps = _scales_for_unit(qa.scales, params)[None]
    top = _decoded_folded(_kernel_arguments(params)[2][0], qa.codes[None], exps, 8, 2, 48, 2)[2]
    assert top <= 2  # the fold while decoding holds for these operands
    fast = matmul(BFP, qa, qb, c=c).bits
    np.testing.assert_array_equal(fast, twin_bits(BFP, qa, qb, c))
    np.testing.assert_array_equal(fast, matmul(BFP, qa, qb, c=c, method="kernel").bits)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    groups=st.integers(1, 3),
    rows=st.integers(1, 5),
    blocks=st.integers(1, 20),
    per=st.integers(1, 8),
    block=st.integers(1, 3),
    short=st.integers(0, 4),
    zero_share=st.sampled_from([0.0, 0.3, 0.9, 1.0]),
    chunk=st.sampled_from([1, 7, 1 << 18]),
    reach=st.sampled_from([127, 400]),
    seed=st.integers(0, 2**32 - 1),
)
def test_trees_folded_from_codes_equal_their_definition(
    monkeypatch, groups, rows, blocks, per, block, short, zero_share, chunk, reach, seed
):
    # The one-pass fold from the codes against plain Python reading the codes (a block is
    # of zeros when every code of it before the codes' end decodes to 0 or -0; blocks past
    # it are); a few codes at a time too.
    monkeypatch.setattr(blas_module, "CODES_AT_ONCE", chunk)
    rng = np.random.default_rng(seed)
    table = np.array([0.0, -0.0, 0.5, -1.5, 3.0])
    length = max(0, blocks * block - short)
    codes = rng.integers(2, 5, (groups, rows, length))
    codes[rng.random(codes.shape) < zero_share] = rng.integers(0, 2)
    codes = codes.astype(np.uint16)
    # (reach 400: rises beyond a byte's 255)
    exponents = rng.integers(-reach, reach + 1, (groups, rows, blocks)).astype(np.int32)
    trees = -(-blocks // per)
    least, rises, top = _fold_code_blocks(codes, table, exponents, block, per, trees)
    empty = [
        [all(table[c] == 0 for c in row[b * block : (b + 1) * block]) for b in range(blocks)]
        for row in codes.reshape(groups * rows, length).tolist()
    ]
    want_least, want_rises = folded_twin(exponents.reshape(-1, blocks).tolist(), empty, per)
    assert least.reshape(-1, trees).tolist() == want_least
    assert rises.reshape(-1, trees * per).tolist() == want_rises
    assert top == max(max(row) for row in want_rises)
    # every block counted: the fold of the scales alone
    plain = _fold_blocks(exponents, per, trees)
    every = folded_twin(
        exponents.reshape(-1, blocks).tolist(), np.zeros((groups * rows, blocks)), per
    )
    assert plain[0].reshape(-1, trees).tolist() == every[0]
    assert plain[1].reshape(-1, trees * per).tolist() == every[1]
    assert plain[2] == max(max(row) for row in every[1])
    # 2-D codes (one GEMM's operand) fold as one group
    flat = _fold_code_blocks(codes[0], table, exponents[0], block, per, trees)
    np.testing.assert_array_equal(flat[1], rises[0])


def zero_block_marks(codes, values, block: int, blocks: int) -> np.ndarray:
    """Plain Python: whether each of ``blocks`` blocks of ``block`` codes of each row (...,
    length) holds only codes that decode to 0 or -0 (``values``; a block past the codes
    holds none: marked)."""
    return np.array(
        [
            [all(values[c] == 0 for c in row[b * block : (b + 1) * block]) for b in range(blocks)]
            for row in codes.reshape(-1, codes.shape[-1]).tolist()
        ],
        dtype=bool,
    ).reshape(codes.shape[:-1] + (blocks,))


@settings(max_examples=30, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 6), st.integers(1, 8)),
    zero_share=st.sampled_from([0.0, 0.5, 0.95, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_zero_block_mask_marks_the_blocks_of_zeros(shape, zero_share, seed):
    # Decoded tiles with +0, -0 and tiny or large nonzero elements: a block is marked when
    # each of its elements is 0 or -0 (plain Python over the same values as codes).
    groups, rows, blocks, block = shape
    rng = np.random.default_rng(seed)
    values = rng.choice([1.0, -3.5, 2.0**-140, 2.0**100], (groups, rows, blocks * block))
    values[rng.random(values.shape) < zero_share] = 0.0
    values[rng.random(values.shape) < 0.3 * zero_share] = -0.0
    got = zero_block_mask(values, blocks)
    table = values.reshape(-1)
    codes = np.arange(table.size).reshape(values.shape)
    want = zero_block_marks(codes, table, block, blocks).transpose(2, 0, 1)
    np.testing.assert_array_equal(got, want)


def rne_fp32_twin(running, tree_sums, row_steps, column_steps) -> np.ndarray:
    """The fp32 bits of acc = RNE_fp32(acc + S_t * row step * column step) for each tree t
    in turn, in Fractions (IEEE overflow to Inf)."""
    fp32 = get_format("fp32")
    trees, groups, rows, columns = tree_sums.shape
    out = np.empty(running.shape, dtype=np.uint32)
    for g in range(groups):
        for i in range(rows):
            for j in range(columns):
                acc = running[g, i, j].item()
                for t in range(trees):
                    if np.isinf(acc):
                        break
                    step = Fraction(row_steps[g, i].item()) * Fraction(column_steps[g, j].item())
                    exact = Fraction(acc) + Fraction(tree_sums[t, g, i, j].item()) * step
                    code = encode_reference(fp32, exact, "nearest_even", "inf_nan")
                    acc = np.uint32(code).view(np.float32).item()
                out[g, i, j] = np.float32(acc).view(np.uint32)
    return out


def near_fp32_midpoints(rng, count: int):
    """(accumulators, sums) whose float64 sum rounds onto an fp32 midpoint (or lands on one
    exactly): x = acc + S with S = an odd number of half fp32 steps of acc plus -1, 0 or +1
    steps of S's own last bit, across the normal range, at the overflow threshold and in the
    subnormal range; the sum's exact value lies just off the midpoint."""
    exponents = rng.integers(-125, 127, count)
    acc = np.ldexp(1.0 + rng.integers(0, 1 << 23, count) / 2.0**23, exponents)
    acc[: count // 8] = np.float32(3.4028234663852886e38)  # fp32's largest: ties to Inf
    acc[count // 8 : count // 4] = np.ldexp(rng.integers(1, 1 << 23, count // 8), -149)
    acc = acc.astype(np.float32) * np.where(rng.random(count) < 0.5, -1, 1).astype(np.float32)
    with np.errstate(over="ignore"):
        step = np.spacing(np.abs(acc)).astype(np.float64)  # fp32's step at acc (above)
    step[: count // 8] = 2.0**104  # at fp32's largest: the step it would take
    step[count // 8 : count // 4] = 2.0**-149
    half = step / 2 * (2 * rng.integers(0, 3, count) + 1) * np.sign(acc)
    sums = half + rng.integers(-1, 2, count) * np.spacing(np.abs(half))
    return acc, sums


def test_rne_accumulation_equals_fractions_at_fp32_midpoints():
    # Float64 sums that round onto an fp32 midpoint: only their round-to-odd error keeps the
    # fp32 rounding right.
    rng = np.random.default_rng(5)
    acc, sums = near_fp32_midpoints(rng, 4096)
    running = acc.reshape(1, 64, 64)
    tree_sums = np.stack([sums, -sums * rng.integers(0, 2, sums.size)]).reshape(2, 1, 64, 64)
    ones_r, ones_c = np.ones((1, 64)), np.ones((1, 64))
    expected = rne_fp32_twin(running, tree_sums, ones_r, ones_c)
    got = running.copy()
    for tree in tree_sums:
        accumulate_rne_fp32(got, tree, ones_r, ones_c)
    np.testing.assert_array_equal(got.view(np.uint32), expected)
    # the constructed sums do reach the midpoint case, inexact, in the first tree
    total = acc.astype(np.float64) + sums
    assert ((total.view(np.int64) & ((1 << 29) - 1)) == 1 << 28).sum() > 1000


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    bits=st.integers(1, 41),
    scale=st.integers(-160, 120),
    spread=st.integers(0, 40),
)
@example(seed=106499, bits=1, scale=0, spread=0)  # a -0 accumulator and a zero sum of sign -
def test_rne_accumulation_equals_fractions(seed, bits, scale, spread):
    # Tree sums of up to 41 bits (fp8_e4m3 x fp8_e4m3 blocks), all the same sign or not,
    # scaled by steps across fp32's range: subnormal results, overflow, exact cancellation,
    # zero sums of either sign bit.
    rng = np.random.default_rng(seed)
    trees, rows, columns = 3, 4, 37
    running = (rng.standard_normal((1, rows, columns)) * 2.0 ** rng.integers(-150, 127)).astype(
        np.float32
    )
    sign = 1 if seed % 3 == 0 else rng.choice([-1, 1], (trees, 1, rows, columns))
    tree_sums = sign * rng.integers(0, 1 << bits, (trees, 1, rows, columns)).astype(np.float64)
    tree_sums[0, 0, 0] = (1 << bits) - 1  # the largest sum
    row_steps = np.ldexp(1.0, scale + rng.integers(-spread, spread + 1, (1, rows)))
    column_steps = np.ldexp(1.0, rng.integers(-spread, spread + 1, (1, columns)) - bits // 2)
    expected = rne_fp32_twin(running, tree_sums, row_steps, column_steps)
    got = running.copy()
    for tree in tree_sums:
        accumulate_rne_fp32(got, tree, row_steps, column_steps)
    np.testing.assert_array_equal(got.view(np.uint32), expected)


# --- fixed-point-grid units (cvfpu MXDOTP): the grid's rules after each tree's exact sum ---

GRID_UNITS = ["mxdotp", "mxdotp-rtz", "mxdotp-rdn", "mxdotp-rup", "mxdotp-rmm"]
GRID_FORMATS = ["fp8_e4m3", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1"]  # fp8_e5m2: sums over 53 bits
ROUNDINGS = [
    "nearest_even",
    "nearest_away",
    "toward_zero",
    "toward_positive",
    "toward_negative",
    "nearest_toward_positive",
]
FP32_MAX = float(np.finfo(np.float32).max)
OFF_EVEN_ROUNDINGS = [r for r in ROUNDINGS if r != "nearest_even"]


def grid_step_twin(acc: float, exact_sum: Fraction, exponent: int, rounding: str) -> float:
    """One tree of an MXDOTP-like grid (34 fraction bits, shift limits 70/24) into an fp32
    accumulator, in Fractions: the accumulator's LSB lies offset places above the grid's LSB
    2^(exponent - 34); kept beyond 70, or beyond 24 below with a zero sum; else acc + sum
    rounded once (IEEE overflow), an exact zero +0. An infinite accumulator stays."""
    if math.isinf(acc):
        return acc
    lead = -127 if acc == 0 else max(math.frexp(acc)[1] - 1, -126)
    offset = (lead - 23) - (exponent - 34)
    if offset > 70 or (offset < -24 and exact_sum == 0):
        return acc
    total = Fraction(acc) + exact_sum
    if total == 0:
        return 0.0
    code = encode_reference(get_format("fp32"), total, rounding, "inf_nan")
    return float(np.uint32(code).view(np.float32))


def grid_cases():
    """(accumulator, unscaled sum, scale exponent X): every accumulator class (zeros of both
    signs, subnormals, the least normal, ordinary values, the largest finite, infinities)
    at the pass-through offsets 69/70/71 and -23/-24/-25 and some between, with sums of
    +0 and -0, small and 41-bit integers, sums that land on, or just off, half an fp32 step
    of the accumulator (ties for the nearest modes) and the accumulator's negation (an exact
    zero)."""
    tiny = 2.0**-149
    accumulators = [0.0, -0.0, tiny, -3 * tiny, 2.0**-126, -(2.0**-126) * 1.5, 1.0, -1.25]
    accumulators += [3.0e7, -7.0e-20, FP32_MAX, -FP32_MAX, math.inf, -math.inf]
    for acc in accumulators:
        lead = -127 if acc == 0 else max(math.frexp(acc)[1] - 1, -126) if math.isfinite(acc) else 0
        for offset in (72, 71, 70, 69, 40, 0, -10, -23, -24, -25, -26):
            exponent = lead - 23 + 34 - offset
            if not -254 <= exponent <= 254:
                continue
            half = 2.0 ** (offset - 35)  # half the accumulator's fp32 step, in units of 2^X
            sums = [0.0, -0.0, 1.0, -1.0, 2.0**41 - 1, -(2.0**40) + 3, half, -half, 3 * half]
            sums += [half * (1 + 2.0**-30), -half * (1 - 2.0**-30), -2 * half]
            sums += [-acc * 2.0**-exponent] if math.isfinite(acc) else []  # exact zero
            for value in sums:
                yield acc, value, exponent


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_grid_accumulation_equals_fractions_at_every_boundary(rounding):
    cases = list(grid_cases())
    acc = np.array([case[0] for case in cases], dtype=np.float32)
    sums = np.array([case[1] for case in cases])
    exponents = np.array([case[2] for case in cases])
    # X split into the row's and the column's scale exponents, each within E8M0's range
    row_exponents = exponents // 2
    row_steps = np.ldexp(1.0, row_exponents).reshape(1, -1)
    column_steps = np.ldexp(1.0, exponents - row_exponents).reshape(-1)
    got = acc.reshape(1, -1, 1).copy()
    # one output per case: rows carry the case, a single column each (steps per row/column)
    for case in range(acc.size):
        one = got[:, case : case + 1]
        accumulate_grid_fp32(
            one,
            sums[case : case + 1].reshape(1, 1, 1),
            row_steps[:, case : case + 1],
            column_steps[case : case + 1].reshape(1, 1),
            np.array([34, 70, 24]),
            np.array(ROUNDING_CHOICES[rounding]),
        )
    expected = [
        grid_step_twin(float(a), Fraction(s) * Fraction(2) ** x, int(x), rounding)
        for a, s, x in zip(acc.tolist(), sums.tolist(), exponents.tolist())
    ]
    want = np.array(expected, dtype=np.float32).view(np.uint32)
    mismatches = np.flatnonzero(got.reshape(-1).view(np.uint32) != want)
    assert mismatches.size == 0, [cases[i] for i in mismatches[:5]]
    assert acc.size > 1000


GRID_HW = {name: load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml") for name in GRID_UNITS}
GRID_HW["mxdotp-rntp"] = vary_hwconfig(  # the one mode no shipped variant takes
    GRID_HW["mxdotp"],
    {"accumulator.rounding": "nearest_toward_positive", "output.rounding": "toward_zero"},
    "mxdotp-rntp",
)


def twin_bits(hw, qa, qb, c) -> np.ndarray:
    """Every output's fp32 bits from the Fraction twin (``dot_reference``) of the unit, over
    the operands' whole codes (matmul's K: padded to whole blocks)."""
    fmt = qa.element_format.name
    params = hw.params(fmt, qb.element_format.name)
    rows, columns = qa.codes.shape[0], qb.codes.shape[0]
    out = np.empty((rows, columns), dtype=np.uint32)
    for i in range(rows):
        for j in range(columns):
            value = dot_reference(
                params,
                qa.codes[i].tolist(),
                qb.codes[j].tolist(),
                qa.scales[i].tolist(),
                qb.scales[j].tolist(),
                0.0 if c is None else float(c[i, j]),
            )
            out[i, j] = np.float32(value).view(np.uint32) if value == value else 0x7FC00000
    return out


def grid_route_checked(hw, qa, qb, c=None, twin: bool = True) -> None:
    """The unit takes the BLAS route and its outputs equal the generic kernel's and (where
    ``twin``) the Fraction twin's, bit for bit."""
    assert route_taken(hw, qa, qb, c)
    fast = matmul(hw, qa, qb, c=c).bits
    slow = matmul(hw, qa, qb, c=c, method="kernel").bits
    mismatches = np.argwhere(fast != slow)
    assert mismatches.size == 0, [
        (tuple(ij), hex(fast[tuple(ij)]), hex(slow[tuple(ij)])) for ij in mismatches[:5]
    ]
    if twin:
        np.testing.assert_array_equal(fast, twin_bits(hw, qa, qb, c))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    unit=st.sampled_from(list(GRID_HW)),
    fmt=st.sampled_from(GRID_FORMATS),
    shape=st.tuples(st.integers(1, 4), st.integers(1, 100), st.integers(1, 4)),
    c_shift=st.one_of(st.none(), st.integers(-25, 25), st.integers(-70, 80)),
    spread=st.sampled_from([0, 0, 0, 2, 30]),
    zero_row=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_grid_route_equals_the_kernel_and_the_twin(
    unit, fmt, shape, c_shift, spread, zero_row, seed
):
    # Realistic operands (normal data, OCP scales) with a minority of corners: blocks of
    # different sizes (spread), an all-zero row, c far above or below the products (the
    # pass-through rules), or none (+0).
    rng = np.random.default_rng(seed)
    rows, length, columns = shape
    A = rng.standard_normal((rows, length)) * np.exp2(rng.integers(-spread, spread + 1, length))
    B = rng.standard_normal((length, columns))
    if zero_row:
        A[0] = 0.0
    qa = quantize(A, fmt, axis=1)
    qb = quantize(B, fmt, axis=0)
    c = None
    if c_shift is not None:
        c = (rng.standard_normal((rows, columns)) * 2.0**c_shift).astype(np.float32)
        c[c == 0] = 1.0  # -0 accumulator inputs go to the kernel
    grid_route_checked(GRID_HW[unit], qa, qb, c)


@pytest.mark.parametrize("fmt", GRID_FORMATS)
def test_grid_route_at_the_pass_through_limits(fmt):
    # c placed so that the first tree's accumulator LSB lies 69/70/71 places above the grid's
    # LSB or 23/24/25 below it (and 0), of both signs, against rows whose first block sums to
    # zero (all-zero, or x and -x) and rows that do not; every rounding mode.
    rng = np.random.default_rng(7)
    A = rng.standard_normal((4, 64))
    A[1, :32] = 0.0  # first block all zero
    A[2, :16], A[2, 16:32] = A[2, :16], -A[2, :16]  # first block sums to exactly zero
    A[3] = 0.0
    B = rng.standard_normal((64, 14))
    qa = quantize(A, fmt, axis=1)
    qb = quantize(B, fmt, axis=0)
    scales = qa.scales.copy()  # zero blocks: any scale; an ordinary one keeps c normal
    scales[1:, 0] = scales[3, :] = scales[0, 0]
    qa = dataclasses.replace(qa, scales=scales)
    exponents = qa.scale_exponents[:, :1].astype(np.int64) + qb.scale_exponents[:, 0]
    offsets = np.tile([69, 70, 71, 0, -23, -24, -25], 2)
    signs = np.repeat([1.0, -1.0], 7)
    # LSB offset = (e - 23) - (X - 34): e = offset + X - 11, as 1.25 * 2^e (normal when it can)
    lead = np.clip(offsets + exponents - 11, -126, 127)
    c = (signs * np.ldexp(1.25, lead)).astype(np.float32)
    assert (lead == offsets + exponents - 11).all()
    for hw in GRID_HW.values():
        grid_route_checked(hw, qa, qb, c)


def test_grid_units_take_the_route_with_every_format_whose_sums_fit_float64():
    qa = quantize(np.ones((2, 40)), "fp8_e4m3", axis=1)
    qb = quantize(np.ones((40, 3)), "fp8_e4m3", axis=0)
    for name in GRID_UNITS:
        hw = GRID_HW[name]
        for fmt in GRID_FORMATS:
            a, b = quantize(np.ones((2, 40)), fmt, axis=1), quantize(np.ones((40, 3)), fmt, axis=0)
            assert route_taken(hw, a, b), (name, fmt)
        e5m2 = quantize(np.ones((2, 40)), "fp8_e5m2", axis=1)
        assert not route_taken(hw, e5m2, quantize(np.ones((40, 3)), "fp8_e5m2", axis=0))
        assert not route_taken(hw, qa, qb, c=np.full((2, 3), -0.0, dtype=np.float32))
    # the schema lets grid units of every mode but stochastic on: the route has each one's rule
    assert set(ROUNDING_CHOICES) == set(DIRECTED_AND_NEAREST) == set(ROUNDINGS)
    params = GRID_HW["mxdotp"].params("fp6_e3m2", "fp6_e3m2")
    assert grid_trees(params, 75, 32) == [
        (0, 11),
        (11, 22),
        (22, 32),
        (32, 43),
        (43, 54),
        (54, 64),
        (64, 75),
    ]


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp4_e2m1"])
def test_grid_route_signs_zeros_by_the_pass_through_rules(fmt):
    # Block 0's last tree (scale exponent X = -180) adds -a*b 2^-180 to +0: below half fp32's least
    # subnormal, so it rounds to -0 (to -2^-149 rounding down). Block 1 sums to zero at X
    # placing the -0 accumulator's LSB (2^-150) 74/71/70/69/-23/-24/-25/-26 places above the
    # grid's LSB 2^(X - 34): kept (-0) beyond 70 and below -24, else acc + 0 = exact zero = +0.
    A = np.zeros((1, 64))
    A[0, 31] = -1.0  # in block 0's last tree (earlier zero trees would turn -0 into +0)
    B = np.zeros((64, 8))
    B[31] = 1.0
    B[32:] = -1.0  # block 1's products: -0 (zeros of A times -1)
    qa, qb = quantize(A, fmt, axis=1), quantize(B, fmt, axis=0)
    offsets = np.array([74, 71, 70, 69, -23, -24, -25, -26])
    qa = dataclasses.replace(qa, scales=np.array([[127 - 100, 127 - 95]], dtype=np.uint8))
    scales_b = np.stack([np.full(8, 127 - 80), 127 + (-150 - offsets + 34) + 95], axis=1)
    qb = dataclasses.replace(qb, scales=scales_b.astype(np.uint8))
    assert (qa.scale_exponents[0, 1] + qb.scale_exponents[:, 1] == -150 - offsets + 34).all()
    kept = (offsets > 70) | (offsets < -24)
    for name, hw in GRID_HW.items():
        grid_route_checked(hw, qa, qb)
        got = matmul(hw, qa, qb).bits[0]
        if name != "mxdotp-rdn":  # (rounding down, block 0 gives -2^-149: no zero)
            want = np.where(kept, np.float32(-0.0).view(np.uint32), 0)
            np.testing.assert_array_equal(got, want)


def test_grid_nearest_even_floor_per_format():
    # max(n - L - 150, -149 - (lsb_a + lsb_b)) with n = 34, L = 70 and each format's least
    # step 2^(1 - bias - mantissa bits): e4m3 -9, e3m2 -4, e2m3 -3, e2m1 -1; no floor for
    # the directed and away-from-even modes, whose rounding of acc + tiny S is not acc.
    floors = {"fp8_e4m3": -131, "fp6_e3m2": -141, "fp6_e2m3": -143, "fp4_e2m1": -147}
    for fmt, floor in floors.items():
        assert grid_nearest_even_floor(GRID_HW["mxdotp"].params(fmt, fmt)) == floor
        for name in ("mxdotp-rtz", "mxdotp-rup", "mxdotp-rdn", "mxdotp-rmm", "mxdotp-rntp"):
            assert grid_nearest_even_floor(GRID_HW[name].params(fmt, fmt)) is None


@settings(max_examples=12, deadline=None)
@given(fmt=st.sampled_from(GRID_FORMATS), seed=st.integers(0, 2**32 - 1))
def test_plain_rne_step_equals_the_grid_twin_above_the_floor(fmt, seed):
    # Every accumulator class but -0 (which the route never holds above the floor), tree sums
    # the format can make (multiples of its least product step, below its bound: zero, the
    # least, the largest, random, half fp32 steps of the accumulator and its negation where
    # on that grid) at X from the floor up, the left pass-through offsets 69-72 among them:
    # RNE_fp32(acc + S) equals the grid's rules in Fractions.
    params = GRID_HW["mxdotp"].params(fmt, fmt)
    floor = grid_nearest_even_floor(params)
    high_a, low_a = span_bits(get_format(fmt))
    low, high = 2 * low_a, 2 * high_a + 2 + math.ceil(math.log2(params.fused_terms))
    rng = np.random.default_rng(seed)
    tiny = 2.0**-149
    accumulators = [0.0, tiny, -3 * tiny, 2.0**-126, -1.5 * 2.0**-126, 1.0, -1.25, 3.0e7]
    accumulators += [FP32_MAX, -FP32_MAX, math.inf, -math.inf]
    accumulators += (rng.standard_normal(8) * 2.0 ** rng.integers(-140, 120, 8)).tolist()
    cases = []
    for acc in accumulators:
        acc = float(np.float32(acc))
        lead = -127 if acc == 0 else max(math.frexp(acc)[1] - 1, -126) if math.isfinite(acc) else 0
        exponents = [floor, floor + 1, floor + 20] + rng.integers(floor, 255, 6).tolist()
        exponents += [lead - 23 + 34 - offset for offset in (72, 71, 70, 69)]
        for x in [x for x in exponents if floor <= x <= 254]:
            sums = [0, 1, -1, (1 << (high - low)) - 1, -(1 << (high - low)) + 1]
            sums += rng.integers(-(1 << (high - low)) + 1, 1 << (high - low), 4).tolist()
            if math.isfinite(acc) and acc != 0:
                step = Fraction(2) ** (lead - 23 - 1)  # half the accumulator's fp32 step
                for target in (step, -step, 3 * step, -Fraction(acc)):
                    units = target / Fraction(2) ** (x + low)  # in the sums' least steps
                    if units.denominator == 1 and abs(units) < 1 << (high - low):
                        sums.append(int(units))
            cases += [(acc, Fraction(s) * Fraction(2) ** low, x) for s in sums]
    running = np.array([c[0] for c in cases], dtype=np.float32).reshape(1, -1, 1)
    tree_sums = np.array([float(c[1]) for c in cases]).reshape(1, -1, 1)
    row_steps = np.ldexp(1.0, np.array([c[2] for c in cases])).reshape(1, -1)
    got = running.copy()
    accumulate_rne_fp32(got, tree_sums, row_steps, np.ones((1, 1)))
    want = np.array(
        [grid_step_twin(a, s * Fraction(2) ** x, x, "nearest_even") for a, s, x in cases],
        dtype=np.float32,
    )
    mismatches = np.flatnonzero(got.reshape(-1).view(np.uint32) != want.view(np.uint32))
    assert mismatches.size == 0, [cases[i] for i in mismatches[:5]]


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp4_e2m1"])
def test_grid_route_keeps_a_negative_zero_from_below_the_floor(fmt):
    # Block 0 (X = -180, below the floor) leaves -0; block 1 sums to zero at X = -91 or -90,
    # above the floor, its accumulator LSB 25 or 26 places below the grid's: the grid keeps
    # -0 there, where RNE(-0 + 0) would be +0. One column per GEMM, so that a tile holds
    # only scales above the floor in block 1.
    A = np.zeros((1, 64))
    A[0, 31] = -1.0
    B = np.zeros((64, 1))
    B[31] = 1.0
    B[32:] = -1.0
    qa, qb = quantize(A, fmt, axis=1), quantize(B, fmt, axis=0)
    qa = dataclasses.replace(qa, scales=np.array([[127 - 100, 127 - 95]], dtype=np.uint8))
    for x in (-91, -90):
        scales_b = np.array([[127 - 80, 127 + x + 95]], dtype=np.uint8)
        b = dataclasses.replace(qb, scales=scales_b)
        assert x >= grid_nearest_even_floor(GRID_HW["mxdotp"].params(fmt, fmt))
        grid_route_checked(GRID_HW["mxdotp"], qa, b)
        assert matmul(GRID_HW["mxdotp"], qa, b).bits[0, 0] == np.float32(-0.0).view(np.uint32)


def tree8_twin(acc, a, b, trees, row_steps, column_steps) -> np.ndarray:
    """``rne_trees8``'s outputs as fp32 bits, in integers and Fractions: each tree's sum of 8
    products of fp8_e4m3 values (integers times 2^-9 each) exactly, then ``rne_fp32_twin``."""
    units = np.rint(a * 2.0**9).astype(np.int64), np.rint(b * 2.0**9).astype(np.int64)
    sums = np.stack(
        [
            np.einsum("grk,gnk->grn", units[0][..., f : f + 8], units[1][..., f : f + 8])
            for f, _ in trees
        ]
    )
    assert np.abs(sums).max(initial=0) < 2**53
    blocks = [block for _, block in trees]
    out = acc.copy()
    for t, block in enumerate(blocks):  # one tree at a time: its own steps
        bits = rne_fp32_twin(out, sums[t : t + 1] * 2.0**-18, row_steps[block], column_steps[block])
        out = bits.view(np.float32)
    return out.view(np.uint32)


def run_rne_trees8(a, b, trees, row_steps, column_steps, acc, width=COLUMNS):
    """``rne_trees8`` on a copy of ``acc`` with passes of ``width`` columns: the result."""
    got = acc.copy()
    spare, packed = np.empty_like(got), np.empty((8, width + PACKED_PAD))
    rne_trees8(a, b, np.array(trees), row_steps, column_steps, got, spare, packed)
    return got


def eight_term_case(shape, spread: int, c_shift: int, seed: int, shifts: tuple[int, int]):
    """(a, b, row_steps, column_steps, acc, trees) of ``rne_trees8``: realistic fp8_e4m3
    elements (the format's finite table values) of ``shape`` (groups, rows, columns, trees
    of 8), steps 2^(shift +- spread) per block and row (column), accumulators normal numbers
    times 2^c_shift with an infinite one, fp32's largest and a zero among them."""
    groups, rows, columns, trees_count = shape
    rng = np.random.default_rng(seed)
    values = get_format("fp8_e4m3").decode_fields(np.arange(256))
    finite = values[np.isfinite(values)]
    k = 8 * trees_count
    a = finite[rng.integers(0, finite.size, (groups, rows, k))]
    b = finite[rng.integers(0, finite.size, (groups, columns, k))]
    blocks = -(-k // 32)
    row_shift, column_shift = shifts
    row_exponents = rng.integers(-spread, spread + 1, (blocks, groups, rows)) + row_shift
    column_exponents = rng.integers(-spread, spread + 1, (blocks, groups, columns)) + column_shift
    acc = (rng.standard_normal((groups, rows, columns)) * 2.0**c_shift).astype(np.float32)
    flat = acc.reshape(-1)
    flat[::5][:3] = [np.inf, -FP32_MAX, 0.0][: flat[::5].size]
    trees = [(8 * t, 8 * t // 32) for t in range(trees_count)]
    steps = np.ldexp(1.0, row_exponents), np.ldexp(1.0, column_exponents)
    return a, b, *steps, acc, trees


@settings(max_examples=40, deadline=None)
@given(
    shape=st.tuples(
        st.integers(1, 2),
        st.integers(1, 5),
        st.sampled_from([1, 7, 40, 64, 131]),
        st.integers(1, 4),
    ),
    width=st.sampled_from([8, 64, COLUMNS]),
    spread=st.sampled_from([0, 3, 60]),
    c_shift=st.sampled_from([-140, 0, 30, 60, 100]),
    seed=st.integers(0, 2**32 - 1),
)
def test_fused_eight_term_trees_equal_fractions(shape, width, spread, c_shift, seed):
    # Realistic fp8_e4m3 elements (normal data through the format's table), trees of 8
    # products inside blocks of 32, passes narrower or wider than N, an odd last row, block
    # steps a few or many binades apart, accumulators at or far above the products (sums
    # float64 cannot hold: the exact-pass check and the round-to-odd redo) or subnormal
    # (2^-140: subnormal sums), some infinite or at fp32's largest.
    case = eight_term_case(shape, spread, c_shift, seed, (-10, -10))
    a, b, row_steps, column_steps, acc, trees = case
    got = run_rne_trees8(a, b, trees, row_steps, column_steps, acc, width)
    want = tree8_twin(acc, a, b, trees, row_steps, column_steps)
    np.testing.assert_array_equal(got.view(np.uint32), want)


def test_fused_eight_term_trees_redo_sums_float64_rounds_onto_a_midpoint():
    # acc = 1 (or its neighbours) plus S = 2^-40 (256 * 256 + 2^-9 * 2^-9) = 2^-24 + 2^-58: the
    # float64 sum rounds onto the fp32 midpoint 1 + 2^-24, the exact sum lies above it. Only
    # the exactness check sends it to the round-to-odd pass; nearest-even from the midpoint
    # would give 1.
    a = np.zeros((1, 4, 8))
    a[0, :, :2] = [256.0, 2.0**-9]
    b = np.zeros((1, 3, 8))
    b[0, :, :2] = [256.0, 2.0**-9]
    b[0, 1, 1] = -(2.0**-9)  # just below the midpoint instead
    acc = np.array([1.0, -1.0, np.float32(1 + 2.0**-23), 3.0], dtype=np.float32)
    acc = np.repeat(acc[None, :, None], 3, axis=2)
    row_steps, column_steps = np.full((1, 1, 4), 2.0**-20), np.full((1, 1, 3), 2.0**-20)
    got = run_rne_trees8(a, b, [(0, 0)], row_steps, column_steps, acc)
    want = tree8_twin(acc, a, b, [(0, 0)], row_steps, column_steps)
    np.testing.assert_array_equal(got.view(np.uint32), want)
    assert got[0, 0, 0] == np.float32(1 + 2.0**-23)  # above the midpoint: up


def test_fused_eight_term_trees_redo_a_tiny_accumulator_under_a_midpoint():
    # S = 1 + 2^-24 (2^16 + 2^-8 = 256 * 256 + 2^-4 * 2^-4, times 2^-16), the midpoint of 1
    # and its upper neighbour, and acc = +-2^-100: the exact sum lies just off the midpoint,
    # the float64 sum drops acc and lands on it, and t - acc == S; only t - S != acc sends
    # the row to the round-to-odd redo (for acc > 0 the sum rounds up to 1 + 2^-23, not to
    # the even 1). Both rows of a pair, and an odd last row.
    a = np.zeros((1, 3, 8))
    a[0, :, :2] = [256.0, 2.0**-4]
    b = np.zeros((1, 2, 8))
    b[0, :, :2] = [256.0, 2.0**-4]
    acc = np.array([2.0**-100, 2.0**-100, -(2.0**-100)], dtype=np.float32)
    acc = np.repeat(acc[None, :, None], 2, axis=2)
    row_steps, column_steps = np.full((1, 1, 3), 2.0**-16), np.ones((1, 1, 2))
    got = run_rne_trees8(a, b, [(0, 0)], row_steps, column_steps, acc)
    want = tree8_twin(acc, a, b, [(0, 0)], row_steps, column_steps)
    np.testing.assert_array_equal(got.view(np.uint32), want)
    assert (got[0, :2] == np.float32(1 + 2.0**-23)).all() and (got[0, 2] == 1.0).all()


def test_fused_eight_term_trees_add_a_zero_sum_as_plus_zero():
    # A -0 accumulator and a tree whose products are all -0 (negative zeros times 1) or
    # mixed: the exact sum is 0, so RNE(-0 + 0) is +0 in both passes (the infinite row takes
    # the round-to-odd redo); then through matmul, where an accumulator underflows to -0
    # (-2^-149 + 2^-150 ties to -0) before trees of -0 products: the generic kernel's bits.
    a = np.full((1, 2, 8), -0.0)
    b = np.ones((1, 3, 8))
    b[0, 1, ::2] = -1.0
    acc = np.array([[[-0.0, -0.0, 1.0], [-0.0, np.inf, -0.0]]], dtype=np.float32)
    steps_r, steps_c = np.ones((1, 1, 2)), np.ones((1, 1, 3))
    got = run_rne_trees8(a, b, [(0, 0)], steps_r, steps_c, acc)
    want = tree8_twin(acc, a, b, [(0, 0)], steps_r, steps_c)
    np.testing.assert_array_equal(got.view(np.uint32), want)
    assert got[0, 0, 0] == 0.0 and not np.signbit(got[0, 0, 0])
    fmt = "fp8_e4m3"
    qa = quantize(np.ones((1, 32)), fmt, axis=1)
    qb = quantize(np.ones((32, 1)), fmt, axis=0)
    codes_a = np.full(qa.codes.shape, 0x80, dtype=qa.codes.dtype)  # -0
    codes_a.reshape(-1)[0] = 0x01  # 2^-9
    codes_b = np.full(qb.codes.shape, 0x38, dtype=qb.codes.dtype)  # 1
    codes_b.reshape(-1)[0] = 0x01
    scale = 127 - 66  # 2^-9 * 2^-9 * 2^-132 = 2^-150
    qa = dataclasses.replace(qa, codes=codes_a, scales=np.full_like(qa.scales, scale))
    qb = dataclasses.replace(qb, codes=codes_b, scales=np.full_like(qb.scales, scale))
    c = np.array([[-(2.0**-149)]], dtype=np.float32)
    for name in ("mxdotp-paper", "mxdotp", "ocp-exact"):
        config = load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
        fast = matmul(config, qa, qb, c=c)
        np.testing.assert_array_equal(fast.bits, matmul(config, qa, qb, c=c, method="kernel").bits)


def test_blocks_of_zeros_do_not_hold_a_tile_below_the_floor(monkeypatch):
    # ReLU-like rows: A's first block all zeros with E8M0 scale 0 (X far below the floor) and
    # a second block of zeros in some rows. They add S = 0 at any X, so the tile stays on the
    # fused eight-term kernel (the grid's kernel is not called), every output still the
    # generic kernel's and the Fraction twin's.
    rng = np.random.default_rng(3)
    A = np.maximum(rng.standard_normal((5, 96)), 0.0)
    A[:, :32] = 0.0
    A[1:3, 32:64] = 0.0
    B = rng.standard_normal((96, 6))
    qa, qb = quantize(A, "fp8_e4m3", axis=1), quantize(B, "fp8_e4m3", axis=0)
    scales = qa.scales.copy()
    scales[:, 0] = 0
    scales[1:3, 1] = 0
    qa = dataclasses.replace(qa, scales=scales)
    hw = GRID_HW["mxdotp"]
    low = qa.scale_exponents[:, :1].min() + qb.scale_exponents[:, 0].min()
    assert low < grid_nearest_even_floor(hw.params("fp8_e4m3", "fp8_e4m3"))

    def refuse(*args, **kwargs):
        raise AssertionError("the grid's accumulation ran")

    monkeypatch.setattr(blas_module, "accumulate_grid_fp32", refuse)
    fast = matmul(hw, qa, qb).bits
    monkeypatch.undo()
    np.testing.assert_array_equal(fast, matmul(hw, qa, qb, method="kernel").bits)
    np.testing.assert_array_equal(fast, twin_bits(hw, qa, qb, None))


@pytest.mark.parametrize("codes_at_once", [200, 2_000, 1 << 18])
@pytest.mark.parametrize("name", ["ocp-exact", "bfp-exact"])
def test_codes_widened_in_chunks_give_the_kernels_bits(monkeypatch, name, codes_at_once):
    # Chunks of the stored codes: rows of one group a few at a time (200 codes: 2 rows of K =
    # 96), a few whole groups together (2,000), every group at once: the same bits as the
    # generic kernel, with bfp-exact's folded rises decoded per chunk too.
    monkeypatch.setattr(blas_module, "CODES_AT_ONCE", codes_at_once)
    monkeypatch.setattr(batch_module, "SMALL_GROUP_OUTPUTS", 0)  # the BLAS route, not the batch's
    chunks = []
    row_chunks = blas_module._row_chunks

    def recording_chunks(codes):
        parts = list(row_chunks(codes))
        chunks.extend(parts)
        return parts

    monkeypatch.setattr(blas_module, "_row_chunks", recording_chunks)
    config = load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
    rng = np.random.default_rng(codes_at_once)
    A = rng.standard_normal((5, 7, 96)) * np.exp2(rng.integers(-4, 4, (5, 7, 1)))
    B = rng.standard_normal((5, 96, 6))
    fast = matmul_batched(config, A, B)
    assert chunks  # (the BLAS route read the codes in chunks)
    if codes_at_once == 200:  # two rows of one group at a time
        assert all(g.stop - g.start == 1 and r.stop - r.start <= 2 for g, r in chunks)
    np.testing.assert_array_equal(fast.bits, matmul_batched(config, A, B, method="kernel").bits)


# --- fused grid trees (any rounding mode, 8 or 16 products per tree, above the grid's floor) ---


def grid_trees_twin(acc, a, b, trees, terms, row_steps, column_steps, rounding) -> np.ndarray:
    """``grid_trees8``' and ``grid_trees16``' outputs as fp32 bits in Fractions: each tree's exact sum of products
    of a (1, r, K) and b (1, n, K), tree after tree through ``grid_step_twin``."""
    out = acc.astype(np.float64).copy()
    for first, block in trees:
        for i in range(a.shape[1]):
            for j in range(b.shape[1]):
                s = sum(
                    (Fraction(float(a[0, i, k])) * Fraction(float(b[0, j, k])))
                    for k in range(first, first + terms)
                )
                exponent = int(math.log2(row_steps[block, 0, i] * column_steps[block, 0, j]))
                scaled = s * Fraction(2) ** exponent
                out[0, i, j] = grid_step_twin(float(out[0, i, j]), scaled, exponent, rounding)
    return out.astype(np.float32).view(np.uint32)


def run_grid_trees(acc, a, b, trees, terms, row_steps, column_steps, rounding) -> np.ndarray | None:
    """The fused kernel's outputs as fp32 bits (``grid_trees8`` or ``grid_trees16``); None
    for trees of 8 to nearest even, which ``grid_trees8`` refuses (checked here)."""
    got = acc.copy()
    work = np.empty((18, COLUMNS))
    keep_factor = 2.0 ** (70 - 34 + 24)
    choices = np.array(ROUNDING_CHOICES[rounding])
    trees = np.array(trees)
    if terms == 8:  # fp8_e4m3: the least product step 2^-18; accumulators held in float64
        limits, wide = (keep_factor, 2.0 ** (-18 + 53)), got.astype(np.float64)
        spare = np.empty_like(wide)
        arguments = a, b, trees, row_steps, column_steps, limits, choices, wide, spare, work
        if rounding == "nearest_even":  # rne_trees8's mode
            with pytest.raises(ValueError, match="nearest even"):
                grid_trees8(*arguments)
            return None
        grid_trees8(*arguments)
        got[...] = wide
    else:
        grid_trees16(a, b, trees, row_steps, column_steps, keep_factor, choices, got, work)
    return got.view(np.uint32)


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("terms", [8, 16])
def test_grid_tree_kernels_equal_the_grid_twin_at_every_boundary(rounding, terms):
    # The grid's boundary cases (``grid_cases``: pass-through offsets, half fp32 steps and
    # just off them, exact cancellation, fp32's largest, infinities, subnormals) at X from
    # the floor up, with the sums the kernel takes (multiples of fp8_e4m3's least product
    # 2^-18, below a quarter of the left pass-through limit, 2^58), each as one output over
    # 16 products: two trees of 8 of one block (``grid_trees8``, rows in pairs) or one of 16
    # (``grid_trees16``, the first 8 summed ahead), the case's sum a single product in the
    # first 8 or the last, or in both (two steps of it; one sum of two).
    floor = grid_floor(GRID_HW["mxdotp"].params("fp8_e4m3", "fp8_e4m3"))
    cases = [
        (acc, value, x)
        for acc, value, x in grid_cases()
        if x >= floor
        and abs(value) < 2.0**57
        and (value * 2.0**18).is_integer()
        and not (acc == 0 and math.copysign(1, acc) < 0)
    ]
    count = len(cases)
    a = np.zeros((1, count, 16))
    for i, (_, value, _) in enumerate(cases):
        a[0, i, [3, 14] if i % 3 == 0 else 3 if i % 3 == 1 else 14] = value
    b = np.zeros((1, 1, 16))
    b[0, 0, [3, 14]] = 1.0
    trees = [(0, 0), (8, 0)] if terms == 8 else [(0, 0)]
    acc = np.array([c[0] for c in cases], dtype=np.float32).reshape(1, count, 1)
    row_steps = np.ldexp(1.0, np.array([c[2] for c in cases])).reshape(1, 1, count)
    column_steps = np.ones((1, 1, 1))
    got = run_grid_trees(acc, a, b, trees, terms, row_steps, column_steps, rounding)
    if got is None:
        return
    want = grid_trees_twin(acc, a, b, trees, terms, row_steps, column_steps, rounding)
    mismatches = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    assert mismatches.size == 0, [cases[i] for i in mismatches[:5]]
    assert count > 800


@pytest.mark.parametrize("rounding", OFF_EVEN_ROUNDINGS)
def test_eight_term_grid_trees_redo_sums_only_their_magnitude_shows_inexact(rounding):
    # acc far above S (2^40 and 2^37 at X = 0, 2^90 at X = 50) and S of one product 2^-18
    # (two fp8_e4m3 subnormals) or a few: the exact sum needs more than 53 bits, its float64
    # t rounds back onto acc and t - S == acc, so only the magnitude bound |t| >=
    # 2^(X - 18 + 53) sends the row to the round-to-odd redo (toward zero, 2^40 - 2^-18 is
    # 2^40's lower fp32 neighbour, not 2^40). Rows in pairs: the inexact row beside an exact one,
    # and the other way round, and an odd last row; each tree the grid twin's step.
    tiny = 2.0**-9
    a = np.zeros((1, 5, 16))
    a[0, :, 0] = [tiny, -tiny, 1.0, -tiny, tiny]
    a[0, :, 9] = [0.0, tiny, 0.0, 3 * tiny, -tiny]
    b = np.zeros((1, 2, 16))
    b[0, :, 0] = [tiny, -tiny]
    b[0, :, 9] = [tiny, 2 * tiny]
    acc = np.array([2.0**40, -(2.0**40), 1.0, 2.0**37 * 3, 2.0**90], dtype=np.float32)
    acc = np.repeat(acc[None, :, None], 2, axis=2)
    row_steps = np.ones((1, 1, 5))
    row_steps[0, 0, 4] = 2.0**50
    column_steps = np.ones((1, 1, 2))
    trees = [(0, 0), (8, 0)]
    got = run_grid_trees(acc, a, b, trees, 8, row_steps, column_steps, rounding)
    want = grid_trees_twin(acc, a, b, trees, 8, row_steps, column_steps, rounding)
    np.testing.assert_array_equal(got, want)
    if rounding == "toward_zero":  # 2^40 - 2^-18 (column 1), 2^40 + 2^-18 (column 0)
        assert got[0, 0, 1] == np.float32(2.0**40 - 2.0**16).view(np.uint32)
        assert got[0, 0, 0] == np.float32(2.0**40).view(np.uint32)


@pytest.mark.parametrize("rounding", OFF_EVEN_ROUNDINGS)
def test_eight_term_grid_trees_keep_an_overflow_from_a_rounding_up(rounding):
    # acc = +-fp32's largest plus S = +-2^103 (X = 103): rounding away from zero overflows to
    # Inf (in float64 that would be 2^128); the next tree's S = -+2^110 must leave the Inf
    # (an earlier overflow stays the result), not round 2^128 - 2^110 to a finite value.
    a = np.zeros((1, 2, 16))
    a[0, :, 0] = [1.0, -1.0]
    a[0, :, 8] = [-8.0, 8.0]
    b = np.zeros((1, 1, 16))
    b[0, 0, [0, 8]] = [1.0, 16.0]
    acc = np.array([[[FP32_MAX], [-FP32_MAX]]], dtype=np.float32)
    row_steps, column_steps = np.full((1, 1, 2), 2.0**100), np.full((1, 1, 1), 2.0**3)
    trees = [(0, 0), (8, 0)]
    got = run_grid_trees(acc, a, b, trees, 8, row_steps, column_steps, rounding)
    want = grid_trees_twin(acc, a, b, trees, 8, row_steps, column_steps, rounding)
    np.testing.assert_array_equal(got, want)
    if rounding == "toward_positive":
        assert got.view(np.float32)[0, 0, 0] == np.inf


@settings(max_examples=25, deadline=None)
@given(
    fmt=st.sampled_from(["fp8_e4m3", "fp4_e2m1"]),
    rounding=st.sampled_from(ROUNDINGS),
    shape=st.tuples(st.integers(1, 3), st.sampled_from([1, 7, 40, COLUMNS + 3]), st.integers(1, 3)),
    spread=st.sampled_from([0, 3, 60]),
    c_shift=st.sampled_from([0, 0, 30, 59, 61, 100]),
    seed=st.integers(0, 2**32 - 1),
)
def test_grid_tree_kernels_equal_fractions(fmt, rounding, shape, spread, c_shift, seed):
    # Realistic elements (random codes of the format's table: fp8_e4m3 in float64, fp4_e2m1
    # in float32 as the route decodes them, 8 or 16 per tree), block steps a few or many
    # binades apart at or above the floor, accumulators at the products or far above them
    # (sums float64 cannot hold: the round-to-odd redo; the left pass-through near 2^60),
    # some infinite, at fp32's largest or zero.
    rows, columns, trees_count = shape
    terms = 8 if fmt == "fp8_e4m3" else 16
    rng = np.random.default_rng(seed)
    values = get_format(fmt).decode_fields(np.arange(1 << get_format(fmt).field_bits))
    finite = values[np.isfinite(values)]
    dtype = np.float64 if terms == 8 else np.float32
    k = terms * trees_count
    a = finite[rng.integers(0, finite.size, (1, rows, k))].astype(dtype)
    b = finite[rng.integers(0, finite.size, (1, columns, k))].astype(dtype)
    blocks = -(-k // 32)
    floor = grid_floor(GRID_HW["mxdotp"].params(fmt, fmt))
    base = int(rng.integers(-(-floor // 2) + spread, 80))  # 2 (base - spread) >= floor
    row_steps = np.ldexp(1.0, rng.integers(-spread, spread + 1, (blocks, 1, rows)) + base)
    column_steps = np.ldexp(1.0, rng.integers(-spread, spread + 1, (blocks, 1, columns)) + base)
    assert (np.log2(row_steps.min()) + np.log2(column_steps.min())) >= floor
    magnitude = 2.0 ** (c_shift + 2 * base + rng.integers(-2, 3, (1, rows, columns)))
    with np.errstate(over="ignore"):
        acc = (rng.standard_normal((1, rows, columns)) * magnitude).astype(np.float32)
    flat = acc.reshape(-1)
    flat[::5][:3] = [np.inf, -FP32_MAX, 0.0][: flat[::5].size]
    trees = [(terms * t, terms * t // 32) for t in range(trees_count)]
    got = run_grid_trees(acc, a, b, trees, terms, row_steps, column_steps, rounding)
    if got is not None:
        want = grid_trees_twin(acc, a, b, trees, terms, row_steps, column_steps, rounding)
        np.testing.assert_array_equal(got, want)


def test_grid_floor_per_format():
    # max(n - L - 149, -149 - (lsb_a + lsb_b)), n = 34, L = 70, in every mode but stochastic;
    # no grid, no floor.
    floors = {"fp8_e4m3": -131, "fp6_e3m2": -141, "fp6_e2m3": -143, "fp4_e2m1": -147}
    for fmt, floor in floors.items():
        for hw in GRID_HW.values():
            assert grid_floor(hw.params(fmt, fmt)) == floor
    assert grid_floor(UNITS["mxdotp-paper"].params("fp8_e4m3", "fp8_e4m3")) is None


@pytest.mark.parametrize(
    "name", ["mxdotp-rtz", "mxdotp-rdn", "mxdotp-rup", "mxdotp-rmm", "mxdotp-rntp"]
)
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp4_e2m1"])
def test_grid_units_take_the_fused_trees_above_the_floor(monkeypatch, name, fmt):
    # Realistic MX operands through every mode but RNE: the tile runs on the fused grid trees
    # (the grid's per-tree kernel is not called), every output the generic kernel's and the
    # Fraction twin's, with c of both signs near the products and far above them.
    rng = np.random.default_rng(11)
    A = rng.standard_normal((6, 96))
    A[2, 32:64] = 0.0
    B = rng.standard_normal((96, 9))
    qa, qb = quantize(A, fmt, axis=1), quantize(B, fmt, axis=0)
    c = (rng.standard_normal((6, 9)) * 2.0 ** rng.integers(-20, 90, (6, 9))).astype(np.float32)
    c[c == 0] = 1.0
    hw = GRID_HW[name]

    def refuse(*args, **kwargs):
        raise AssertionError("the grid's accumulation ran")

    monkeypatch.setattr(blas_module, "accumulate_grid_fp32", refuse)
    fast = matmul(hw, qa, qb, c=c).bits
    monkeypatch.undo()
    np.testing.assert_array_equal(fast, matmul(hw, qa, qb, c=c, method="kernel").bits)
    np.testing.assert_array_equal(fast, twin_bits(hw, qa, qb, c))


OFF_EVEN = [
    "toward_zero",
    "toward_positive",
    "toward_negative",
    "nearest_away",
    "nearest_toward_positive",
]


def run_directed_fp32(acc, a, b, trees, row_steps, column_steps, rounding) -> np.ndarray:
    got = acc.copy()
    choices = np.array(ROUNDING_CHOICES[rounding])
    rows32, columns32 = row_steps.astype(np.float32), column_steps.astype(np.float32)
    work = np.empty((18, COLUMNS))
    trees16_fp32(a, b, np.array(trees), rows32, columns32, 2.0**60, choices, got, work)
    return got.view(np.uint32)


@pytest.mark.parametrize("rounding", OFF_EVEN)
def test_float32_trees_equal_the_grid_twin_at_every_boundary(rounding):
    # ``grid_cases`` whose sums the float32 kernel takes (fp4_e2m1's: multiples of 2^-2
    # below 2^12, times 2^X a float32 from 2^-149 up; X from the floor to 126), each as one
    # output of a tree of 16: the case's sum a single product or two (the first 8, the last
    # 8, both).
    floor = grid_floor(GRID_HW["mxdotp"].params("fp4_e2m1", "fp4_e2m1"))
    cases = [
        (acc, value, x)
        for acc, value, x in grid_cases()
        if floor <= x <= 126
        and abs(value) < 2.0**11
        and (value * 4).is_integer()
        and (value == 0 or abs(value) * 2.0**x >= 2.0**-147)
        and not (acc == 0 and math.copysign(1, acc) < 0)
    ]
    count = len(cases)
    a = np.zeros((1, count, 16), dtype=np.float32)
    for i, (_, value, _) in enumerate(cases):
        a[0, i, [3, 14] if i % 3 == 0 else 3 if i % 3 == 1 else 14] = value
    b = np.zeros((1, 1, 16), dtype=np.float32)
    b[0, 0, [3, 14]] = 1.0
    acc = np.array([c[0] for c in cases], dtype=np.float32).reshape(1, count, 1)
    row_steps = np.ldexp(1.0, np.array([c[2] for c in cases])).reshape(1, 1, count)
    column_steps = np.ones((1, 1, 1))
    got = run_directed_fp32(acc, a, b, [(0, 0)], row_steps, column_steps, rounding)
    want = grid_trees_twin(acc, a, b, [(0, 0)], 16, row_steps, column_steps, rounding)
    mismatches = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    assert mismatches.size == 0, [cases[i] for i in mismatches[:5]]
    assert count > 200


@settings(max_examples=25, deadline=None)
@given(
    rounding=st.sampled_from(OFF_EVEN),
    shape=st.tuples(st.integers(1, 3), st.sampled_from([1, 7, 40, COLUMNS + 3]), st.integers(1, 3)),
    base=st.one_of(st.integers(-8, 0), st.integers(-73, 50)),
    spread=st.sampled_from([0, 3, 12]),
    c_shift=st.sampled_from([0, 0, 12, 59, 61, 90]),
    seed=st.integers(0, 2**32 - 1),
)
def test_float32_trees_equal_fractions(rounding, shape, base, spread, c_shift, seed):
    # Realistic fp4_e2m1 elements (float32, random codes of the table), steps around 2^base
    # each (X from near the floor, subnormal sums, to near float32's top), a few or many
    # binades apart, accumulators at the products or far above them (the left pass-through
    # near 2^60: the redo), some infinite, at fp32's largest or zero.
    rows, columns, trees_count = shape
    rng = np.random.default_rng(seed)
    values = get_format("fp4_e2m1").decode_fields(np.arange(16)).astype(np.float32)
    k = 16 * trees_count
    a = values[rng.integers(0, 16, (1, rows, k))]
    b = values[rng.integers(0, 16, (1, columns, k))]
    blocks = -(-k // 32)
    row_steps = np.ldexp(1.0, rng.integers(-spread, spread + 1, (blocks, 1, rows)) + base)
    column_steps = np.ldexp(1.0, rng.integers(-spread, spread + 1, (blocks, 1, columns)) + base)
    span = (-2, 10)  # fp4_e2m1 tree sums: multiples of 2^-2 below 2^10
    assume(  # the kernel's conditions (the route checks them)
        blas_module._fp32_exact_blocks(row_steps, column_steps, span).all()
        and blas_module._times_steps_fit_fp32(a, row_steps)
        and blas_module._times_steps_fit_fp32(b, column_steps)
    )
    magnitude = 2.0 ** (c_shift + 2 * base + rng.integers(-2, 3, (1, rows, columns)))
    with np.errstate(over="ignore"):
        acc = (rng.standard_normal((1, rows, columns)) * magnitude).astype(np.float32)
    flat = acc.reshape(-1)
    flat[::5][:3] = [np.inf, -FP32_MAX, 0.0][: flat[::5].size]
    trees = [(16 * t, 16 * t // 32) for t in range(trees_count)]
    got = run_directed_fp32(acc, a, b, trees, row_steps, column_steps, rounding)
    want = grid_trees_twin(acc, a, b, trees, 16, row_steps, column_steps, rounding)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "name", ["mxdotp-rtz", "mxdotp-rdn", "mxdotp-rup", "mxdotp-rmm", "mxdotp-rntp"]
)
def test_fp4_units_off_nearest_even_take_the_float32_trees(monkeypatch, name):
    # MXFP4 operands in every mode but nearest even: the float32 kernel runs (and only it),
    # every output the generic kernel's.
    from mxsim.datapath import _tree_kernels

    rng = np.random.default_rng(12)
    qa = quantize(rng.standard_normal((5, 96)), "fp4_e2m1", axis=1)
    qb = quantize(rng.standard_normal((96, 7)), "fp4_e2m1", axis=0)
    calls = []
    original = _tree_kernels.trees16_fp32
    monkeypatch.setattr(
        _tree_kernels, "trees16_fp32", lambda *args: calls.append(1) or original(*args)
    )
    monkeypatch.setattr(_tree_kernels, "grid_trees16", None)  # not called
    fast = matmul(GRID_HW[name], qa, qb).bits
    monkeypatch.undo()
    assert calls
    np.testing.assert_array_equal(fast, matmul(GRID_HW[name], qa, qb, method="kernel").bits)


@pytest.mark.parametrize("unit", ["mxdotp", "mxdotp-rtz"])
def test_a_batch_above_the_grid_floor_skips_the_tiles_floor_checks(monkeypatch, unit):
    # Attention-shaped batches (several groups of 8 rows and columns, K = 64): with every
    # scale near 1 the batch's least scale exponent sum lies above the grid's floors, so no
    # tile reads its blocks of zeros; with one group's A scaled far down (and blocks of
    # zeros) the tiles check their floors themselves. Both equal the generic kernel.
    import mxsim.datapath.blas as blas

    monkeypatch.setattr(batch_module, "SMALL_GROUP_OUTPUTS", 0)  # not the small-groups route
    for name in ("TILE_ROWS", "SMALL_TILE_ROWS"):
        monkeypatch.setattr(blas, name, 8)  # two groups a pass
    marked = []
    mask = blas.zero_block_mask
    monkeypatch.setattr(blas, "zero_block_mask", lambda *a: marked.append(1) or mask(*a))
    routed = []
    passes = blas.batch_passes
    monkeypatch.setattr(blas, "batch_passes", lambda *a: routed.append(1) or passes(*a))
    hw = load_hwconfig(REPO / "hwconfigs" / f"{unit}.yaml")
    params = hw.params("fp8_e4m3", "fp8_e4m3")
    floors = [f for f in (grid_nearest_even_floor(params), grid_floor(params)) if f is not None]
    rng = np.random.default_rng(11)
    A = rng.standard_normal((3, 8, 64))
    B = rng.standard_normal((3, 64, 8))
    c = rng.choice(np.array([0.0, 1e-40, 1.5, -3.0e38], dtype=np.float32), (3, 8, 8))
    for low in (False, True):
        marked.clear()
        routed.clear()
        if low:  # one group far below the floor: X about 2 (-100)
            A[1] *= 2.0**-100
            B[1] *= 2.0**-100
            A[1, :4, :32] = 0.0
            assert 2 * -100 < min(floors)
        fast = matmul_batched(hw, A, B, c=c, a_format="fp8_e4m3", b_format="fp8_e4m3")
        slow = matmul_batched(
            hw, A, B, c=c, a_format="fp8_e4m3", b_format="fp8_e4m3", method="kernel"
        )
        np.testing.assert_array_equal(fast.bits, slow.bits)
        assert routed and bool(marked) == low


@settings(max_examples=40, deadline=None)
@given(
    shape=st.tuples(
        st.integers(1, 2),
        st.sampled_from([1, 2, 3, 7, 9, 260]),
        st.integers(1, 5),
        st.integers(1, 4),
    ),
    spread=st.sampled_from([0, 3, 60]),
    c_shift=st.sampled_from([-140, 0, 30, 60]),
    seed=st.integers(0, 2**32 - 1),
)
def test_eight_term_tiles_of_narrow_outputs_equal_fractions(shape, spread, c_shift, seed):
    # A tile of fewer columns than rows (P @ v's N = 64 beside M = 128) runs the fused
    # kernel transposed, rows as its columns (260: more than a pass of COLUMNS); the rest
    # as they are. Realistic fp8_e4m3 elements, row and column steps apart (a swap of them
    # shows), accumulators far above the sums (the redo), subnormal, infinite or at fp32's
    # largest: each equals the Fraction twin.
    case = eight_term_case(shape, spread, c_shift, seed, (-14, -6))
    a, b, row_steps, column_steps, acc, trees = case
    got = acc.copy()
    blas_module._tree8_tile(a, b, row_steps, column_steps, np.array(trees), got)
    want = tree8_twin(acc, a, b, trees, row_steps, column_steps)
    np.testing.assert_array_equal(got.view(np.uint32), want)


def test_eight_term_tiles_of_fewer_columns_than_rows_run_transposed(monkeypatch):
    # The kernel gets the transposed tile (9 rows by 3 columns: 3 by 9) and the tile's
    # outputs stay the Fraction twin's.
    import mxsim.datapath._tree_kernels as tree_kernels

    shapes = []
    kernel = tree_kernels.rne_trees8
    monkeypatch.setattr(
        tree_kernels, "rne_trees8", lambda *a: shapes.append(a[5].shape) or kernel(*a)
    )
    for rows, columns in ((9, 3), (3, 9)):
        case = eight_term_case((2, rows, columns, 3), 3, 0, 5, (-14, -6))
        a, b, row_steps, column_steps, acc, trees = case
        got = acc.copy()
        blas_module._tree8_tile(a, b, row_steps, column_steps, np.array(trees), got)
        want = tree8_twin(acc, a, b, trees, row_steps, column_steps)
        np.testing.assert_array_equal(got.view(np.uint32), want)
    assert shapes == [(2, 3, 9), (2, 3, 9)]


def test_steps_leave_one_blocks_int64_exponents_unchanged():
    # One block's int64 exponents (a folded tree's least), transposed, are contiguous
    # already: the steps are built on a copy, and the exponents read again stay as given.
    exponents = np.array([[[-127], [0]], [[5], [127]]], dtype=np.int64)
    kept = exponents.copy()
    steps = blas_module._steps(exponents, (2, 2), 1)
    np.testing.assert_array_equal(exponents, kept)
    assert steps.tolist() == [[[2.0**-127, 1.0], [32.0, 2.0**127]]]


def test_one_tree_of_folded_blocks_over_several_panels_equals_the_kernel(monkeypatch):
    # bfp-exact with K of one tree (8 sub-blocks), folded first (a progress callback), B in
    # panels of 8 columns: A's steps are built from the same folded exponents for each
    # panel, which the first panel's steps must not have changed.
    monkeypatch.setattr(batch_module, "SMALL_GROUP_OUTPUTS", 0)
    monkeypatch.setattr(blas_module, "DECODED_VALUES", 16 * 2 * 8)
    rng = np.random.default_rng(1)
    A = rng.standard_normal((2, 6, 16)) * np.exp2(rng.integers(-3, 4, (2, 6, 16)))
    B = rng.standard_normal((2, 16, 40)) * np.exp2(rng.integers(-3, 4, (2, 16, 40)))
    hw = load_hwconfig(REPO / "hwconfigs" / "bfp-exact.yaml")
    reports = []
    fast = matmul_batched(
        hw, A, B, a_format="mx9", b_format="mx9", progress=lambda *done: reports.append(done)
    )
    slow = matmul_batched(hw, A, B, a_format="mx9", b_format="mx9", method="kernel")
    assert len(reports) > 1  # (several panels' tiles)
    np.testing.assert_array_equal(fast.bits, slow.bits)


@pytest.mark.parametrize("start", [0.0, -1.5, 3e-41])
def test_eight_term_tiles_from_one_start_neither_need_nor_read_the_accumulators(start):
    # A tile told that every output starts from ``start`` (c given once for all) writes it
    # itself: its accumulators hold NaNs here, and its outputs, transposed or not, are the
    # Fraction twin's from ``start``.
    for rows, columns in ((9, 3), (3, 9)):
        a, b, row_steps, column_steps, acc, trees = eight_term_case(
            (2, rows, columns, 3), 3, 0, 5, (-14, -6)
        )
        got = np.full_like(acc, np.nan)
        blas_module._tree8_tile(a, b, row_steps, column_steps, np.array(trees), got, start)
        want = tree8_twin(np.full_like(acc, start), a, b, trees, row_steps, column_steps)
        np.testing.assert_array_equal(got.view(np.uint32), want)


@pytest.mark.parametrize(
    "unit",
    ["ocp-exact", "kulisch", "bfp-exact", "mxdotp-paper", "mxdotp", "mxdotp-rtz", "mxdotp-rup"],
)
@pytest.mark.parametrize("shape", [(3, 128, 64, 128), (3, 128, 72, 64)])
def test_attention_head_batches_equal_the_kernel(monkeypatch, unit, shape):
    # 128-token heads (q @ k^T; P @ v with K not a whole number of blocks, N below M) on
    # the BLAS route: rows and columns binades apart, a group far down (below the grid
    # floors; fp32 subnormal sums), blocks of zeros, exact cancellations, accumulator inputs
    # at the corners; each output the generic kernel's.
    import mxsim.datapath.blas as blas

    monkeypatch.setattr(batch_module, "SMALL_GROUP_OUTPUTS", 0)
    monkeypatch.setattr(api_module, "exact_tiles_apply", lambda *arguments: False)
    routed = []
    passes = blas.batch_passes
    monkeypatch.setattr(blas, "batch_passes", lambda *a: routed.append(1) or passes(*a))
    groups, rows, length, columns = shape
    rng = np.random.default_rng(7)
    A = rng.standard_normal(shape[:3]) * np.exp2(rng.integers(-20, 21, (groups, rows, 1)))
    B = rng.standard_normal((groups, length, columns)) * np.exp2(
        rng.integers(-20, 21, (groups, 1, columns))
    )
    A[1] *= 2.0**-110
    A[:, ::7, :32] = 0.0
    B[..., -1] = -B[..., 0]
    corners = np.array([0.0, 1e-40, -3e-45, 3.4e38, -3.4e38, 1e-6, 1.5], dtype=np.float32)
    c = rng.choice(corners, (groups, rows, columns)).astype(np.float32)
    hw = load_hwconfig(REPO / "hwconfigs" / f"{unit}.yaml")
    element = "mx9" if unit == "bfp-exact" else "fp8_e4m3"
    fast = matmul_batched(hw, A, B, c=c, a_format=element, b_format=element)
    slow = matmul_batched(hw, A, B, c=c, a_format=element, b_format=element, method="kernel")
    np.testing.assert_array_equal(fast.bits, slow.bits)
    assert routed


def test_a_progress_callback_that_raises_leaves_no_tile_running(monkeypatch):
    # Tiles on two threads; the first report raises: the exception reaches the caller once
    # the tiles in flight have ended (the rest cancelled), and the kept threads then serve
    # the next call, whose outputs are the kernel's.
    import threading
    import time

    import numba

    import mxsim.datapath.blas as blas

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs two Numba threads")
    import mxsim.datapath.api as api

    monkeypatch.setattr(batch_module, "SMALL_GROUP_OUTPUTS", 0)
    monkeypatch.setattr(api, "SERIAL_GEMM_BELOW", 0)  # two threads for a small batch
    tiles = {"TILE_ROWS": 4, "SMALL_TILE_ROWS": 4, "TILE_COLUMNS": 1, "SINGLE_THREAD_MACS": 200}
    for name, value in tiles.items():
        monkeypatch.setattr(blas, name, value)  # 4 passes of 2 groups, a column a tile
    running, started, lock = [0], [0], threading.Lock()
    tile = blas._rounding_tile

    def slow_tile(*args):
        with lock:
            running[0] += 1
            started[0] += 1
        time.sleep(0.02)
        tile(*args)
        with lock:
            running[0] -= 1

    monkeypatch.setattr(blas, "_rounding_tile", slow_tile)
    rng = np.random.default_rng(2)
    A, B = rng.standard_normal((8, 4, 64)), rng.standard_normal((8, 64, 4))
    hw = UNITS["ocp-exact"]

    def stop(done, total):
        raise KeyboardInterrupt("stopped")

    before = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        with pytest.raises(KeyboardInterrupt):
            matmul_batched(hw, A, B, a_format="fp8_e4m3", b_format="fp8_e4m3", progress=stop)
        assert running[0] == 0 and started[0] > 4  # (the first pass's 4 tiles and more)
        fast = matmul_batched(hw, A, B, a_format="fp8_e4m3", b_format="fp8_e4m3")
    finally:
        numba.set_num_threads(before)
    slow = matmul_batched(hw, A, B, a_format="fp8_e4m3", b_format="fp8_e4m3", method="kernel")
    np.testing.assert_array_equal(fast.bits, slow.bits)


def test_a_batch_of_sums_below_fp32s_least_step_is_not_added_in_float32(monkeypatch):
    # fp4_e2m1 (float32 tree sums), every block's scale 2^-74 (elements 2^-72 and 2^-75):
    # the scaled sums 2^-144 + 2^-150 are no float32s (steps below 2^-149), so the
    # batch-wide float32 check must fail: added to 2^-120 in float32 arithmetic the sum
    # would first round to 2^-144 (a tie, to even), then sit at 2^-120's half ulp and round
    # to even (down), where the exact sum rounds up.
    monkeypatch.setattr(batch_module, "SMALL_GROUP_OUTPUTS", 0)  # the BLAS route
    A = np.zeros((2, 8, 32))
    A[..., 0], A[..., 1] = 2.0**-72, 2.0**-75
    B = A.transpose(0, 2, 1).copy()
    c = np.full((2, 8, 8), 2.0**-120, dtype=np.float32)
    hw, formats = UNITS["ocp-exact"], {"a_format": "fp4_e2m1", "b_format": "fp4_e2m1"}
    got = matmul_batched(hw, A, B, c=c, **formats).bits
    want = np.float32(2.0**-120 + 2.0**-143).view(np.uint32)  # RNE of the exact sum: up
    assert (got == want).all()
    np.testing.assert_array_equal(
        got, matmul_batched(hw, A, B, c=c, method="kernel", **formats).bits
    )


def test_kept_powers_are_read_only():
    """The powers of two the decoding passes share between calls refuse an in-place write."""
    for powers in (
        blas_module._folded_powers(5),
        blas_module._rise_powers(7, np.dtype(np.float32)),
        blas_module._rise_powers(7, np.dtype(np.float64)),
    ):
        assert not powers.flags.writeable
        with pytest.raises(ValueError):
            powers[0] = 2.0
