"""The group-sum route equals the generic kernel and the Fraction twin bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conftest import REPO
from mxsim import get_format
from mxsim.datapath import load_hwconfig, matmul, matmul_batched
from mxsim.datapath.api import _kernel_arguments, matmul_groups
from mxsim.datapath.config import DatapathParams, check_consistency
from mxsim.datapath.groups import _setup, groups_apply, groups_matmul
from mxsim.datapath.reference import dot_reference
from mxsim.errors import ConfigError, MxsimError
from mxsim.quantize import quantize_nvfp4, quantize_nvfp4_grouped

ROUNDINGS = [
    "nearest_even",
    "toward_zero",
    "toward_negative",
    "toward_positive",
    "nearest_away",
    "nearest_toward_positive",
]
ELEMENTS = ["fp4_e2m1", "fp4_e2m1", "fp6_e2m3", "fp6_e3m2", "fp8_e4m3"]
GROUP_UNITS = [
    "b200-nvfp4",
    "b200-tcgen05-mxf4",
    "b200-tcgen05-mxf4nvf4",
    "b200-tcgen05-mxf4nvf4-e8m0-block16",
    "rtx50-mma-mxf4",
    "rtx50-mma-mxf4nvf4",
    "rtx50-mma-mxf4nvf4-e8m0-block16",
]


def unit(name: str):
    return load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")


def nvfp4(**changes) -> DatapathParams:
    return dataclasses.replace(unit("b200-nvfp4").params("fp4_e2m1", "fp4_e2m1"), **changes)


# --- which units take the route --------------------------------------------------------------------


@pytest.mark.parametrize("name", GROUP_UNITS)
def test_the_group_sum_units_take_the_route(name):
    assert groups_apply(unit(name).params("fp4_e2m1", "fp4_e2m1"))


@pytest.mark.parametrize(
    "name", ["ocp-exact", "h100-fp8", "b200-tcgen05-mxf8f6f4", "mxdotp", "kulisch"]
)
def test_units_without_group_sums_do_not(name):
    config = unit(name)
    assert not groups_apply(config.params(config.a_formats[0], config.b_formats[0]))


@pytest.mark.parametrize(
    "changes",
    [
        {"below_window": "floor"},
        {"below_window": "sticky"},
        {"carry_bits": 4},
        {"product_fraction_bits": 1},
        {"align_fraction_bits": None},
        {"c_entry": "end"},
        {"promotion_interval": 128},
        {"accumulator_format": "exact"},
        {"sum_rounding": "stochastic", "sum_significant_bits": 20},
        {"scales": "products", "scale_format": "e8m0"},
        {"group_terms": 32},  # groups would straddle blocks of 16
        # E4M3 group sums below 2^22 in a 35-bit window: a tree's sum could pass 2^53
        {"a_format": "fp8_e4m3", "b_format": "fp8_e4m3"},
        {"zero_term_exponent": -1000},  # 2^(W - R) would leave float64's normal range
    ],
)
def test_what_the_route_does_not_compute_refuses_it(changes):
    assert groups_apply(nvfp4())
    assert not groups_apply(nvfp4(**changes))


def test_an_unknown_parameter_refuses_the_route():
    Extended = dataclasses.make_dataclass(
        "Extended",
        [("new_key", int, dataclasses.field(default=0))],
        bases=(DatapathParams,),
        frozen=True,
    )
    assert not groups_apply(Extended(**nvfp4().__dict__))


# --- random units of the family, mostly realistic inputs -------------------------------------------


@st.composite
def group_params(draw) -> DatapathParams:
    group = draw(st.sampled_from([4, 8, 16, 16, 32]))
    block = group * draw(st.sampled_from([1, 1, 2]))
    return nvfp4(
        a_format=draw(st.sampled_from(ELEMENTS)),
        b_format=draw(st.sampled_from(ELEMENTS)),
        group_terms=group,
        block_size=block,
        fused_terms=block * draw(st.sampled_from([1, 2, 4])),
        scale_format=draw(st.sampled_from(["ue4m3", "e8m0"])),
        input_subnormals=draw(st.booleans()),
        accumulator_in_tree=draw(st.booleans()),
        align_fraction_bits=draw(st.integers(0, 36)),
        sum_significant_bits=draw(st.sampled_from([None, None, 24, 12])),
        sum_rounding=draw(st.sampled_from(ROUNDINGS)),
        accumulator_format=draw(st.sampled_from(["fp32", "fp32", "fp16", "bf16"])),
        accumulator_rounding=draw(st.sampled_from(ROUNDINGS)),
        output_format=draw(st.sampled_from(["fp32", "fp32", "fp16", "bf16"])),
        output_rounding=draw(st.sampled_from(ROUNDINGS)),
        align_reference=draw(st.sampled_from(["exponent_sum", "leading_bit"])),
        accumulator_exponent=draw(st.sampled_from(["leading_bit", "format_emin"])),
        zero_term_exponent=draw(st.sampled_from([None, -139, -139, -133, -21])),
        accumulator_overflow=draw(st.sampled_from(["ieee", "infinity"])),
        output_zero_sign=draw(st.sampled_from(["ieee", "positive"])),
    )


def operands(params, rng, rows, length, columns, corners: bool, spread: int):
    """Element codes of Gaussian data (B as (N, K)) and scale codes within 2^±spread of 1;
    with ``corners`` scattered zeros, an all-zero group, a group whose products cancel, a
    group whose products are all 0 with neither operand's group all zero, zero and NaN scales
    and (E4M3) a NaN element."""
    codes = []
    for fmt_name, shape in (
        (params.a_format, (rows, length)),
        (params.b_format, (columns, length)),
    ):
        fmt = get_format(fmt_name)
        values = (
            rng.standard_normal(shape)
            * fmt.max_finite
            / 4
            * np.exp2(rng.integers(-3, 1, (shape[0], 1)))
        )
        if corners:
            values[rng.random(shape) < 0.3] = 0.0
            values[0, : params.group_terms] = 0.0  # an all-zero group
        codes.append(fmt.encode(np.clip(values, -fmt.max_finite, fmt.max_finite)).astype(np.uint8))
    a, b = codes
    if corners and length >= 2:
        fmt = get_format(params.a_format)
        b[:, :2] = get_format(params.b_format).encode(np.array([1.0]))[0]
        a[-1, : params.group_terms] = 0
        a[-1, :2] = fmt.encode(
            np.array([1.0, -1.0])
        )  # a[-1] . b over this group: 1 - 1 = 0, products nonzero
    group = params.group_terms
    if corners and length >= 2 * group:  # row 0's second group: every product 0, no group all zero
        a[0, group : 2 * group : 2] = 0
        a[0, group + 1 : 2 * group : 2] = get_format(params.a_format).encode(np.array([1.5]))[0]
        b[:, group : 2 * group : 2] = get_format(params.b_format).encode(np.array([-3.0]))[0]
        b[:, group + 1 : 2 * group : 2] = 0
    blocks = -(-length // params.block_size)
    scale = get_format(params.scale_format)
    scales = []
    for count in (rows, columns):
        values = np.exp2(rng.uniform(-spread, spread, (count, blocks))) * rng.uniform(
            1, 2, (count, blocks)
        )
        codes_ = scale.encode(np.clip(values, scale.min_subnormal, scale.max_finite)).astype(
            np.int32
        )
        if corners:
            codes_[rng.random(codes_.shape) < 0.05] = 0  # UE4M3 0; E8M0 2^-127
            codes_[rng.random(codes_.shape) < 0.02] = (
                0xFF if params.scale_format == "e8m0" else 0x7F
            )  # NaN
        scales.append(codes_)
    if corners and length >= 2:  # the cancelling group's scale the tree's largest: it alone sets R
        scales[0][-1, 0] = 0xFE if params.scale_format == "e8m0" else 0x7E
    if corners and params.a_format == "fp8_e4m3" and rng.random() < 0.5:
        a[0, 0] = 0x7F  # NaN
    return a, b, scales[0], scales[1]


def reference_bits(params, a, b, scale_a, scale_b, c, m, n):
    value = dot_reference(
        params,
        a[m].tolist(),
        b[n].tolist(),
        scale_a[m].tolist(),
        scale_b[n].tolist(),
        float(c[m, n]),
    )
    return int(get_format(params.output_format).encode(np.array([value]), overflow="inf_nan")[0])


@settings(max_examples=50, deadline=None)
@given(
    params=group_params(),
    shape=st.tuples(st.integers(1, 5), st.integers(1, 130), st.integers(1, 6)),
    corners=st.integers(0, 3),
    spread=st.sampled_from([0, 3, 20, 60]),
    seed=st.integers(0, 2**32 - 1),
)
def test_group_route_equals_generic_kernel_and_fraction_twin(params, shape, corners, spread, seed):
    try:
        check_consistency(params, "x")
    except ConfigError:
        assume(False)
    assume(groups_apply(params))
    rng = np.random.default_rng(seed)
    rows, length, columns = shape
    a, b, scale_a, scale_b = operands(params, rng, rows, length, columns, corners == 0, spread)
    c = (rng.standard_normal((rows, columns)) * 2.0 ** rng.integers(-20, 20)).astype(np.float32)
    if corners == 0:
        c.flat[rng.integers(0, c.size)] = rng.choice([0.0, -0.0, np.inf, np.nan, 1e-40, 3e38])
    fast = np.empty((rows, columns), dtype=np.uint32)
    left = groups_matmul(
        params, a[None], b[None], scale_a[None], scale_b[None], c[None], fast[None]
    )[1:]
    slow = np.empty((rows, columns), dtype=np.uint32)
    matmul_groups(
        a[None],
        b[None],
        scale_a[None],
        scale_b[None],
        c[None],
        *_kernel_arguments(params)[2],
        slow[None],
    )
    unflagged = np.ones(fast.shape, dtype=bool)
    unflagged[left] = False
    # The route's own outputs (before any generic fallback) against both.
    np.testing.assert_array_equal(fast[unflagged], slow[unflagged])
    for m, n in zip(*np.nonzero(unflagged)):
        assert int(fast[m, n]) == reference_bits(params, a, b, scale_a, scale_b, c, m, n), (
            m,
            n,
            params,
        )
    if corners and spread <= 20 and params.accumulator_format == params.output_format == "fp32":
        assert unflagged.all()  # realistic data stays on the fast path


# --- the shipped NVFP4 unit through the public API ---------------------------------------------------


def test_nvfp4_matmul_takes_the_route_and_recomputes_flagged_outputs():
    rng = np.random.default_rng(7)
    A = rng.standard_normal((40, 320)).astype(np.float32)
    B = rng.standard_normal((30, 320)).astype(np.float32)
    A[2, :64] = 0.0  # a zero tree: R at the zero-term exponent
    qa, qb = quantize_nvfp4(A), quantize_nvfp4(B)
    qa.scales[5, 3] = 0x7F  # a NaN scale: row 5 is flagged
    c = rng.standard_normal((40, 30)).astype(np.float32)
    c[0, :3] = [-0.0, 1e-40, np.inf]
    hw = unit("b200-nvfp4")
    params = hw.params("fp4_e2m1", "fp4_e2m1")
    out = np.empty((40, 30), dtype=np.uint32)
    _, m, _ = groups_matmul(
        params,
        qa.codes[None],
        qb.codes[None],
        qa.scales.astype(np.int32)[None],
        qb.scales.astype(np.int32)[None],
        c[None],
        out[None],
    )
    assert set(m.tolist()) == {0, 5}
    fast = matmul(hw, qa, qb, c=c)
    slow = matmul(hw, qa, qb, c=c, method="kernel")
    np.testing.assert_array_equal(fast.bits, slow.bits)
    assert np.isnan(fast.values[5]).all()


def test_mxfp4_matmul_through_the_route_equals_the_kernel():
    from mxsim import quantize_mx

    rng = np.random.default_rng(8)
    qa = quantize_mx(rng.standard_normal((24, 200)), "fp4_e2m1", axis=1)
    qb = quantize_mx(rng.standard_normal((200, 20)), "fp4_e2m1", axis=0)
    hw = unit("b200-tcgen05-mxf4")
    np.testing.assert_array_equal(matmul(hw, qa, qb).bits, matmul(hw, qa, qb, method="kernel").bits)


@pytest.mark.parametrize("shape", [(3, 0, 4), (1, 40, 5), (5, 33, 1), (40, 96, 3)])
def test_edge_shapes_and_progress(shape):
    # K = 0 (c rounded), partial last groups and trees, single rows and columns; progress per tile.
    from mxsim import quantize_mx

    rows, length, columns = shape
    rng = np.random.default_rng(9)
    qa = quantize_mx(rng.standard_normal((rows, length)), "fp4_e2m1", axis=1)
    qb = quantize_mx(rng.standard_normal((length, columns)), "fp4_e2m1", axis=0)
    c = rng.standard_normal((rows, columns)).astype(np.float32)
    hw = unit("b200-tcgen05-mxf4")
    seen = []
    fast = matmul(hw, qa, qb, c=c, progress=lambda done, total: seen.append((done, total)))
    np.testing.assert_array_equal(fast.bits, matmul(hw, qa, qb, c=c, method="kernel").bits)
    assert seen[-1] == (rows, rows) and [done for done, _ in seen] == sorted(
        done for done, _ in seen
    )


def test_kept_group_tables_are_read_only():
    """The group-sum route's tables, kept per params, refuse an in-place write."""
    setup = _setup(nvfp4())
    arrays = [getattr(setup, f.name) for f in dataclasses.fields(setup)][1:]
    assert len(arrays) == 8 and not [x for x in arrays if x.flags.writeable]


@pytest.mark.parametrize(
    "shape", [(7, 14, 32, 14), (3, 21, 64, 40), (2, 40, 96, 5), (1, 40, 64, 7)]
)
def test_a_batch_of_gemms_in_one_call_equals_the_generic_kernel(shape):
    # Attention heads: every group's own B and c, rows not a multiple of the row tile (c read
    # tile by tile); progress reports the rows of all groups.
    from mxsim import quantize_mx

    groups, rows, length, columns = shape
    rng = np.random.default_rng(sum(shape))
    a = [
        quantize_mx(rng.standard_normal((rows, length)), "fp4_e2m1", axis=1) for _ in range(groups)
    ]
    b = [
        quantize_mx(rng.standard_normal((length, columns)), "fp4_e2m1", axis=0)
        for _ in range(groups)
    ]
    c = rng.standard_normal((groups, rows, columns)).astype(np.float32)
    hw = unit("b200-tcgen05-mxf4")
    want = matmul_batched(hw, a, b, c=c, method="kernel").bits
    np.testing.assert_array_equal(matmul_batched(hw, a, b, c=c).bits, want)
    reports = []
    got = matmul_batched(hw, a, b, c=c, progress=lambda done, total: reports.append((done, total)))
    np.testing.assert_array_equal(got.bits, want)
    assert reports and reports[-1] == (groups * rows, groups * rows)
    assert [done for done, _ in reports] == sorted(done for done, _ in reports)


def test_a_batch_without_rows_computes_nothing():
    params = unit("b200-tcgen05-mxf4").params("fp4_e2m1", "fp4_e2m1")
    codes = np.zeros((2, 0, 32), dtype=np.uint8)
    scales = np.full((2, 0, 1), 127, dtype=np.int32)
    b, b_scales = np.zeros((2, 3, 32), dtype=np.uint8), np.full((2, 3, 1), 127, dtype=np.int32)
    out = np.empty((2, 0, 3), dtype=np.uint32)
    c = np.zeros((1, 1, 1), dtype=np.float32)
    assert all(i.size == 0 for i in groups_matmul(params, codes, b, scales, b_scales, c, out))


# --- batches of NVFP4 GEMMs, and B kept across calls ----------------------------------------------


def _nvfp4_batch(seed: int, groups: int = 4, rows: int = 9, length: int = 80, columns: int = 6):
    """A (G, M, K) and B^T (G, N, K) NVFP4 groups with their own magnitudes (tensor scales
    from each group's amax), a NaN scale in one group's row and a zero group of A."""
    rng = np.random.default_rng(seed)
    magnitudes = np.exp2(rng.integers(-12, 12, (groups, 1, 1))).astype(np.float32)
    a = (rng.standard_normal((groups, rows, length)) * magnitudes).astype(np.float32)
    b = rng.standard_normal((groups, columns, length)).astype(np.float32)
    a[1] = 0.0
    qa, qb = quantize_nvfp4_grouped(a, "amax"), quantize_nvfp4_grouped(b, "amax")
    qa.scales[2, 3, 1] = 0x7F  # NaN: the row is recomputed by the generic kernel
    return qa, qb


def test_a_batch_of_nvfp4_gemms_equals_one_matmul_per_group():
    qa, qb = _nvfp4_batch(31)
    hw = unit("b200-nvfp4")
    batch = matmul_batched(hw, qa, qb)
    assert (
        batch.tensor_scales.tolist()
        == [(1.0 if s is None else s) * t for s, t in zip(qa.tensor_scales, qb.tensor_scales)]
        and qa.tensor_scales[1] is None
    )
    for g, (ta, tb) in enumerate(zip(qa.tensors(), qb.tensors())):
        alone = matmul(hw, ta, tb)
        np.testing.assert_array_equal(batch.bits[g], alone.bits)
        np.testing.assert_array_equal(batch.bits[g], matmul(hw, ta, tb, method="kernel").bits)
        np.testing.assert_array_equal(batch.values[g], alone.values)
    assert np.isnan(batch.values[2, 3]).all() and not np.isnan(batch.values[2, :3]).any()


def test_a_batch_of_nvfp4_gemms_with_c_and_single_level_scales():
    rng = np.random.default_rng(32)
    a = rng.standard_normal((3, 5, 48)).astype(np.float32)
    b = rng.standard_normal((3, 4, 48)).astype(np.float32)
    qa, qb = quantize_nvfp4_grouped(a), quantize_nvfp4_grouped(b)
    c = rng.standard_normal((3, 5, 4)).astype(np.float32)
    hw = unit("b200-nvfp4")
    batch = matmul_batched(hw, qa, qb, c=c)
    for g, (ta, tb) in enumerate(zip(qa.tensors(), qb.tensors())):
        np.testing.assert_array_equal(batch.bits[g], matmul(hw, ta, tb, c=c[g]).bits)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda a, b, hw: (a, b, "b200-nvfp4", {"c": np.zeros((2, 3, 2), np.float32)}),
            "c with NVFP4 tensor scales",
        ),
        (
            lambda a, b, hw: (a, b, "b200-nvfp4", {"per_tensor_scale": True}),
            "take no per_tensor_scale",
        ),
        (lambda a, b, hw: (a, a, "b200-nvfp4", {}), None),  # (2, 3, 32) x (2, 3, 32): fine
        (lambda a, b, hw: (a, b.group(0), "b200-nvfp4", {}), "must be NVFP4 groups"),
        (lambda a, b, hw: (a, np.zeros((2, 32, 2)), "b200-nvfp4", {}), "must be NVFP4 groups"),
        (
            lambda a, b, hw: (
                a,
                quantize_nvfp4_grouped(np.ones((3, 2, 32), np.float32)),
                "b200-nvfp4",
                {},
            ),
            "A has 2 groups, B has 3",
        ),
        (
            lambda a, b, hw: (
                a,
                quantize_nvfp4_grouped(np.ones((2, 2, 48), np.float32)),
                "b200-nvfp4",
                {},
            ),
            "inner dimensions differ",
        ),
        (
            lambda a, b, hw: (a, b, "b200-tcgen05-mxf4", {}),
            "ue4m3 scales per 16 differ from the unit's e8m0 per 32",
        ),
    ],
)
def test_nvfp4_batches_refuse_bad_arguments(change, message):
    a = quantize_nvfp4_grouped(np.ones((2, 3, 32), np.float32), "amax")
    b = quantize_nvfp4_grouped(np.ones((2, 2, 32), np.float32), "amax")
    first, second, name, options = change(a, b, None)
    if message is None:
        assert matmul_batched(unit(name), first, second, **options).bits.shape == (2, 3, 3)
        return
    with pytest.raises(MxsimError) as error:
        matmul_batched(unit(name), first, second, **options)
    assert message in str(error.value) and "matmul_batched" in str(error.value)


@pytest.mark.parametrize("name", ["b200-nvfp4", "b200-tcgen05-mxf4"])
def test_kept_b_gives_the_bits_of_forming_b_per_call(name):
    """A B kept in b_memo (its group values, scales and masks formed once): later calls with
    other A give the bits of calls without the memo, and the kept arrays are not written."""
    from mxsim import quantize_mx

    hw = unit(name)
    rng = np.random.default_rng(33)
    if name == "b200-nvfp4":
        qb = _nvfp4_batch(34)[1]
        a_of = [
            quantize_nvfp4_grouped(
                rng.standard_normal((4, 9, 80)).astype(np.float32) * np.float32(scale), "amax"
            )
            for scale in (1.0, 2.0**-20)
        ]
    else:
        qb = [quantize_mx(rng.standard_normal((80, 6)), "fp4_e2m1", axis=0) for _ in range(4)]
        a_of = [
            [quantize_mx(rng.standard_normal((9, 80)), "fp4_e2m1", axis=1) for _ in range(4)]
            for _ in range(2)
        ]
    memo = {}
    for qa in a_of:
        kept = matmul_batched(hw, qa, qb, b_memo=memo)
        np.testing.assert_array_equal(kept.bits, matmul_batched(hw, qa, qb).bits)
        (entry,) = memo.values()
        groups = entry["route"]["groups"]
        before = [x.copy() for x in groups]
    assert all(np.array_equal(x, y) for x, y in zip(groups, before))


@pytest.mark.parametrize(
    "a_shape, b_shape", [((0, 3, 32), (0, 2, 32)), ((2, 0, 32), (2, 3, 32)), ((2, 3, 0), (2, 4, 0))]
)
def test_empty_nvfp4_batches_give_empty_or_zero_results(a_shape, b_shape):
    """No groups, no rows, or K = 0 (every output the empty sum, +0): the batch and matmul
    of one group agree."""
    hw = unit("b200-nvfp4")
    a = quantize_nvfp4_grouped(np.ones(a_shape, np.float32))
    b = quantize_nvfp4_grouped(np.ones(b_shape, np.float32))
    batch = matmul_batched(hw, a, b)
    assert batch.bits.shape == (a_shape[0], a_shape[1], b_shape[1])
    assert not batch.values.any()
    for g in range(a_shape[0]):
        np.testing.assert_array_equal(matmul(hw, a.group(g), b.group(g)).bits, batch.bits[g])
