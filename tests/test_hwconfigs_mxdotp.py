"""The cvfpu MXDOTP configs against the unit's RTL: vectors run through a simulation of the RTL
as written (tests/data/mxdotp-rtl/README.md), every vector bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import REPO
from mxsim.datapath import dot, load_hwconfig
from mxsim.datapath.api import _gemm_groups, _kernel_arguments, _scales_for_unit
from mxsim.datapath import blas as blas_module
from mxsim.datapath.blas import blas_applies, grid_floor
from mxsim.datapath.reference import dot_reference
from mxsim.formats import get_format

DATA = REPO / "tests" / "data" / "mxdotp-rtl" / "mxdotp_rtl.npz"
FORMATS = ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1"]  # the data's format index
CONFIGS = [
    "mxdotp",
    "mxdotp-rtz",
    "mxdotp-rdn",
    "mxdotp-rup",
    "mxdotp-rmm",
]  # by RISC-V rounding mode 0..4


@pytest.fixture(scope="module")
def vectors():
    with np.load(DATA, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def rows_of(vectors, fmt_index: int, rounding: int, length: int) -> np.ndarray:
    return np.flatnonzero(
        (vectors["format"] == fmt_index)
        & (vectors["rounding"] == rounding)
        & (vectors["length"] == length)
    )


def run(config: str, vectors, rows: np.ndarray, fmt: str) -> np.ndarray:
    length = int(vectors["length"][rows[0]])
    blocks = -(-length // 32)
    return dot(
        load_hwconfig(REPO / "hwconfigs" / f"{config}.yaml"),
        vectors["a"][rows, :length],
        vectors["b"][rows, :length],
        a_format=fmt,
        b_format=fmt,
        scale_a=vectors["scale_a"][rows, :blocks],
        scale_b=vectors["scale_b"][rows, :blocks],
        c=vectors["c"][rows].view(np.float32),
    )


def test_the_data_covers_every_format_rounding_mode_and_kind(vectors):
    lanes = {"fp8_e4m3": 8, "fp8_e5m2": 8, "fp6_e3m2": 11, "fp6_e2m3": 11, "fp4_e2m1": 16}
    for index, fmt in enumerate(FORMATS):
        for rounding in range(5):
            assert rows_of(vectors, index, rounding, lanes[fmt]).size == 240  # one operation
            assert (
                rows_of(vectors, index, rounding, 64).size == 40
            )  # two blocks, operation after operation
    results = vectors["result"].view(np.float32)
    assert np.isnan(results).sum() > 100 and np.isinf(results).sum() > 50
    assert (results == 0).sum() > 100 and np.signbit(
        results[results == 0]
    ).sum() > 30  # zeros of both signs
    assert (
        (results != 0) & (np.abs(results) < np.finfo(np.float32).tiny)
    ).sum() > 20  # subnormal results
    assert (
        vectors["result"] == vectors["c"]
    ).sum() > 1000  # the accumulator passed through unchanged


@pytest.mark.parametrize("rounding", range(5), ids=CONFIGS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_config_equals_the_rtl_bit_for_bit(vectors, fmt, rounding):
    index = FORMATS.index(fmt)
    for length in sorted({int(n) for n in vectors["length"][vectors["format"] == index]}):
        rows = rows_of(vectors, index, rounding, length)
        out = run(CONFIGS[rounding], vectors, rows, fmt)
        mismatches = np.flatnonzero(out != vectors["result"][rows])
        assert mismatches.size == 0, [
            (int(rows[i]), hex(int(out[i])), hex(int(vectors["result"][rows[i]])))
            for i in mismatches[:5]
        ]


@pytest.mark.parametrize("rounding", range(5), ids=CONFIGS)
def test_reference_twin_equals_the_rtl(vectors, rounding):
    # Every 8th vector of each format through the slow Fraction twin.
    for index, fmt in enumerate(FORMATS):
        params = load_hwconfig(REPO / "hwconfigs" / f"{CONFIGS[rounding]}.yaml").params(fmt, fmt)
        rows = np.flatnonzero((vectors["format"] == index) & (vectors["rounding"] == rounding))[::8]
        for row in rows:
            length = int(vectors["length"][row])
            value = dot_reference(
                params,
                vectors["a"][row, :length].tolist(),
                vectors["b"][row, :length].tolist(),
                vectors["scale_a"][row].tolist(),
                vectors["scale_b"][row].tolist(),
                float(vectors["c"][row : row + 1].view(np.float32)[0]),
            )
            bits = (
                int(np.array([value], dtype=np.float32).view(np.uint32)[0])
                if value == value
                else 0x7FC00000
            )
            assert bits == int(vectors["result"][row]), (
                int(row),
                value,
                hex(int(vectors["result"][row])),
            )


def test_the_eight_lane_summary_misses_fp6_and_fp4(vectors):
    # The data tells the RTL from the 8-lanes-for-every-format summary kept as mxdotp-paper.
    for fmt in ("fp6_e3m2", "fp4_e2m1"):
        index = FORMATS.index(fmt)
        rows = rows_of(vectors, index, 0, 64)
        out = run("mxdotp-paper", vectors, rows, fmt)
        assert (out != vectors["result"][rows]).sum() > 0


def rtl_gemm(vectors, params, index: int, rounding: int, length: int, least_exponent=None):
    """(rows, _gemm_groups operands) of one GEMM of the format's vectors of one length that
    hold no value the BLAS route leaves to the kernel (NaN/Inf elements, scale 0xFF, -0 or
    NaN/Inf c), and, with ``least_exponent``, whose scale exponents all lie at or above it:
    row i of A and of B^T are vector i's operands, c's diagonal its accumulator (1 elsewhere)."""
    element = get_format(FORMATS[index])
    finite = np.isfinite(element.decode_fields(np.arange(1 << element.field_bits)))
    rows = rows_of(vectors, index, rounding, length)
    blocks = -(-length // 32)
    a, b = vectors["a"][rows, :length], vectors["b"][rows, :length]
    scale_a, scale_b = vectors["scale_a"][rows, :blocks], vectors["scale_b"][rows, :blocks]
    c = vectors["c"][rows]
    ok = (
        finite[a].all(axis=1)
        & finite[b].all(axis=1)
        & (scale_a != 0xFF).all(axis=1)
        & (scale_b != 0xFF).all(axis=1)
        & np.isfinite(c.view(np.float32))
        & (c != 0x80000000)
    )
    if least_exponent is not None:
        ok &= (np.minimum(scale_a, scale_b).astype(np.int64) - 127 >= least_exponent).all(axis=1)
    rows, a, b, scale_a, scale_b, c = (x[ok] for x in (rows, a, b, scale_a, scale_b, c))
    accumulators = np.ones((rows.size, rows.size))
    np.fill_diagonal(accumulators, c.view(np.float32))
    exponents_a = _scales_for_unit(scale_a, params)[None]
    exponents_b = _scales_for_unit(scale_b, params)[None]
    return rows, (params, a[None], b[None], exponents_a, exponents_b, accumulators[None])


def rtl_checked(vectors, params, rows, operands) -> None:
    """The GEMM takes the BLAS route; its diagonal is the RTL's results and every output
    the generic kernel's."""
    args = _kernel_arguments(params)[2]
    assert blas_applies(params, args, *operands[1:])
    fast = _gemm_groups(*operands, args, "auto", None, 256)[0]
    slow = _gemm_groups(*operands, args, "kernel", None, 256)[0]
    np.testing.assert_array_equal(fast.diagonal(), vectors["result"][rows])
    np.testing.assert_array_equal(fast, slow)


@pytest.mark.parametrize("rounding", range(5), ids=CONFIGS)
def test_config_as_gemms_on_the_blas_route_equals_the_rtl(vectors, rounding):
    # The vectors of each format whose sums fit float64 (not fp8_e5m2) and that the route
    # takes (``rtl_gemm``) as one GEMM per format and length: the RTL's results, the generic
    # kernel's bits.
    config = load_hwconfig(REPO / "hwconfigs" / f"{CONFIGS[rounding]}.yaml")
    checked = 0
    for index, fmt in enumerate(FORMATS):
        if fmt == "fp8_e5m2":
            continue
        params = config.params(fmt, fmt)
        for length in sorted({int(n) for n in vectors["length"][vectors["format"] == index]}):
            rows, operands = rtl_gemm(vectors, params, index, rounding, length)
            rtl_checked(vectors, params, rows, operands)
            checked += rows.size
    assert checked > 900


@pytest.mark.parametrize("rounding", range(5), ids=CONFIGS)
def test_vectors_above_the_floor_on_the_fused_trees_equal_the_rtl(vectors, rounding, monkeypatch):
    # The vectors whose scale exponents all lie at or above half the grid's floor, so that a
    # GEMM of them lies above it and its trees run fused (``grid_trees8``, ``grid_trees16``: 8 or 16
    # products in the directed and away-from-even modes; ``rne_trees8``: fp8_e4m3 rounding
    # to nearest even): the RTL's results, the generic kernel's bits, and the fused kernel
    # did run.
    config = load_hwconfig(REPO / "hwconfigs" / f"{CONFIGS[rounding]}.yaml")
    tiles = []
    name = "_tree8_tile" if rounding == 0 else "_grid_trees_tile"
    original = getattr(blas_module, name)
    monkeypatch.setattr(blas_module, name, lambda *args: tiles.append(1) or original(*args))
    checked = 0
    for fmt in ("fp8_e4m3", "fp4_e2m1"):
        index = FORMATS.index(fmt)
        params = config.params(fmt, fmt)
        least = -(-grid_floor(params) // 2)
        for length in sorted({int(n) for n in vectors["length"][vectors["format"] == index]}):
            rows, operands = rtl_gemm(vectors, params, index, rounding, length, least)
            if rows.size:
                rtl_checked(vectors, params, rows, operands)
                checked += rows.size
    assert checked > 300
    assert len(tiles) >= (1 if rounding == 0 else 2)
