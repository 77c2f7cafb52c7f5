"""The FMA-chain route equals the generic kernel and the Fraction twin bit for bit.

The route's own independent oracle is MMA-Sim: ``mxsim.dot`` takes the route for the fp64
and AMD fp32 units, which tests/test_oracles_mmasim.py compares with MMA-Sim's FMA chains.
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
from mxsim import get_format, quantize_mx as quantize
from mxsim.datapath import dot, fma, load_hwconfig, matmul
from mxsim.datapath.reference import dot_reference

#: Every shipped unit and format pair the route takes (test_the_route_takes_exactly_these).
FMA_UNITS = [
    ("a100-dmma", "fp64"),
    ("ada-dmma", "fp64"),
    ("b200-dmma", "fp64"),
    ("h100-dmma", "fp64"),
    ("rtx50-dmma", "fp64"),
    ("mi250-f64", "fp64"),
    ("mi300-f64", "fp64"),
    ("mi100", "fp32"),
    ("mi250-fp32", "fp32"),
    ("mi300", "fp32"),
]
FLOATS = {"fp64": np.float64, "fp32": np.float32}


def unit(name: str):
    return load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")


def test_the_route_takes_exactly_these():
    assert shipped_pairs_taking(fma.fma_applies) == sorted((name, f, f, f) for name, f in FMA_UNITS)


@pytest.mark.parametrize(
    "changes",
    [
        {"accumulator_rounding": "toward_zero"},
        {"fused_terms": 2},
        {"output_zero_sign": "positive"},
        {"accumulator_subnormals": False},
        {"align_fraction_bits": 60},
        {"c_entry": "end"},
        {"output_format": "fp32"},  # rounds the fp64 chain once more
        {"c_format": "fp32"},
    ],
)
def test_the_route_refuses_what_it_does_not_compute(changes):
    params = unit("a100-dmma").params("fp64", "fp64")
    assert fma.fma_applies(params)
    assert not fma.fma_applies(dataclasses.replace(params, **changes))


def test_the_route_waits_for_a_thread_that_keeps_subnormals(monkeypatch):
    params = unit("h100-dmma").params("fp64", "fp64")
    monkeypatch.setattr(fma, "subnormals_work", lambda: False)
    assert fma.fma_float_type(params) is not None and not fma.fma_applies(params)


# --- operands -------------------------------------------------------------------------------------


def realistic(rng, shape, dtype) -> np.ndarray:
    """Values as a GEMM meets them: normal values over a few binades, some exact zeros."""
    values = rng.standard_normal(shape) * 2.0 ** rng.integers(-6, 7, shape)
    values[rng.random(shape) < 0.05] = 0.0
    return values.astype(dtype)


def with_corners(rng, values: np.ndarray, share: float) -> np.ndarray:
    """``values`` with a ``share`` of them replaced by corners of their float type: ±0,
    subnormals, the largest finite values (products that overflow), ±Inf, the quiet NaN and a
    NaN with every payload bit set."""
    info = np.finfo(values.dtype)
    bits = np.dtype(f"uint{8 * values.dtype.itemsize}")
    payload_nan = np.array([np.iinfo(bits).max >> 1], bits).view(values.dtype)[0]
    corners = np.array(
        [
            0.0,
            -0.0,
            info.smallest_subnormal,
            -info.smallest_subnormal,
            info.tiny / 3,
            info.max,
            -info.max,
            np.inf,
            -np.inf,
            np.nan,
            payload_nan,
        ],
        dtype=values.dtype,
    )
    out = values.copy()
    where = rng.random(values.shape) < share
    out[where] = rng.choice(corners, int(where.sum()))
    return out


def exact_tensor(values: np.ndarray, fmt: str, axis: int):
    """``values`` (2-D) as an MXTensor of ``fmt`` along ``axis`` whose codes are the values'
    bit patterns as they are (quantize would make a NaN canonical and saturate an Inf), K
    padded with +0 codes to whole blocks of 32 as quantize pads it; unscaled."""
    layout = quantize(
        np.zeros_like(values), fmt, axis=axis, per_tensor_scale=True, tensor_scale_exponent=0
    )
    codes = np.zeros_like(layout.codes)
    rows = np.moveaxis(values, axis, -1)
    codes[:, : rows.shape[-1]] = rows.view(codes.dtype)
    return dataclasses.replace(layout, codes=codes)


def twin_bits(params, a_codes, b_codes, c_value, fmt) -> int:
    """The Fraction twin's output code for one row of A's codes and one of B^T's."""
    value = dot_reference(params, a_codes.tolist(), b_codes.tolist(), c=float(c_value))
    return int(get_format(fmt).encode(np.array([value]), overflow="inf_nan")[0])


# --- the route against the generic kernel and the twin -------------------------------------------


@pytest.mark.parametrize("name, fmt", FMA_UNITS)
@settings(max_examples=12, deadline=None)
@given(
    shape=st.tuples(
        st.integers(1, 9), st.integers(0, 70), st.integers(1, 11)
    ),  # M (odd: a pair's copy), K (0: c alone), N
    corner_share=st.sampled_from([0.0, 0.0, 0.02, 0.3]),
    with_c=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_route_equals_generic_kernel_and_twin(name, fmt, shape, corner_share, with_c, seed):
    rng = np.random.default_rng(seed)
    rows, length, columns = shape
    dtype = FLOATS[fmt]
    a = with_corners(rng, realistic(rng, (rows, length), dtype), corner_share)
    b = with_corners(rng, realistic(rng, (length, columns), dtype), corner_share)
    c = with_corners(rng, realistic(rng, (rows, columns), dtype), corner_share) if with_c else None
    hw = unit(name)
    operands = (exact_tensor(a, fmt, 1), exact_tensor(b, fmt, 0))
    kw = dict(c=c, c_format=fmt)
    got = matmul(hw, *operands, **kw).bits
    want = matmul(hw, *operands, method="kernel", **kw).bits
    assert np.array_equal(got, want)
    params = hw.params(fmt, fmt)
    # The twin reads the codes the kernels read: K padded with +0 codes to whole blocks of 32
    # (which an FMA chain's -0 does not survive: -0 + 0 * 0 is +0).
    codes_a, codes_b = (tensor.codes for tensor in operands)
    for i, j in [(0, 0), (rows - 1, columns - 1), (rows // 2, columns // 2)]:
        c_value = 0.0 if c is None else c[i, j]
        assert int(got[i, j]) == twin_bits(params, codes_a[i], codes_b[j], c_value, fmt), (i, j)


@pytest.mark.parametrize("name, fmt", [("h100-dmma", "fp64"), ("mi300", "fp32")])
def test_route_over_tiles_groups_and_kept_b(name, fmt):
    # N beyond one tile of lanes, an odd M, groups, and B's transposed floats kept between calls.
    rng = np.random.default_rng(5)
    dtype = FLOATS[fmt]
    groups, rows, length, columns = 3, 7, 40, fma.F.LANES + 37
    a = [exact_tensor(realistic(rng, (rows, length), dtype), fmt, 1) for _ in range(groups)]
    b = [exact_tensor(realistic(rng, (length, columns), dtype), fmt, 0) for _ in range(groups)]
    c = realistic(rng, (groups, rows, columns), dtype)
    hw = unit(name)
    kw = dict(c=c, c_format=fmt)
    assert_kept_b_gives_the_generic_bits(hw, a, b, kw, "fma")


@pytest.mark.parametrize("name, fmt", [("a100-dmma", "fp64"), ("mi250-fp32", "fp32")])
def test_route_writes_the_units_nan_and_ieee_zero_signs(name, fmt):
    # NaN results are the generic kernel's NaN code (the machine's FMA propagates the
    # payload); a -0 c stays -0 through -0 products (IEEE's sign of an exact zero sum).
    dtype = FLOATS[fmt]
    bits = np.dtype(f"uint{8 * np.dtype(dtype).itemsize}")
    payload = np.iinfo(bits).max >> 1  # a positive quiet NaN, every payload bit set
    a = np.zeros((3, 32), dtype=dtype)  # a whole block: no padding
    a[0, 0], a[1], a[2, 0] = np.array([payload], bits).view(dtype)[0], -0.0, np.inf
    b = np.ones((32, 1), dtype=dtype)
    c = np.array([[1.0], [-0.0], [-np.inf]], dtype=dtype)
    hw = unit(name)
    operands = (exact_tensor(a, fmt, 1), exact_tensor(b, fmt, 0))
    got = matmul(hw, *operands, c=c, c_format=fmt).bits[:, 0]
    want = matmul(hw, *operands, c=c, c_format=fmt, method="kernel").bits[:, 0]
    assert np.array_equal(got, want)
    fmt_info = get_format(fmt)
    assert np.isnan(fmt_info.decode(got[[0, 2]])).all() and int(got[0]) != payload
    assert int(got[1]) == int(fmt_info.encode(np.array([-0.0]))[0])


@pytest.mark.parametrize("name, fmt", [("rtx50-dmma", "fp64"), ("mi100", "fp32")])
def test_dot_route_equals_generic_kernel(name, fmt):
    rng = np.random.default_rng(9)
    dtype = FLOATS[fmt]
    rows, length = 5000, 13  # more rows than one work item
    a = with_corners(rng, realistic(rng, (rows, length), dtype), 0.02)
    b = with_corners(rng, realistic(rng, (rows, length), dtype), 0.02)
    c = with_corners(rng, realistic(rng, rows, dtype), 0.02)
    bits = np.dtype(f"uint{8 * np.dtype(dtype).itemsize}")
    codes = [x.view(bits) for x in (a, b)]  # the corners' bit patterns as they are
    hw = unit(name)
    kw = dict(a_format=fmt, b_format=fmt, c=c, c_format=fmt)
    assert np.array_equal(dot(hw, *codes, **kw), dot(hw, *codes, method="kernel", **kw))


@pytest.mark.parametrize("name, fmt", [("a100-dmma", "fp64"), ("mi300", "fp32")])
def test_route_on_minilms_operands(minilm_operands, name, fmt):
    # A real transformer's activations and weight, and its attention heads.
    assert_route_equals_generic_on_minilm(unit(name), minilm_operands, fmt)
