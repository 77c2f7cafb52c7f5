"""Exported C models equal mxsim.dot bit for bit (compiled with the system C compiler).

The default run covers one unit per family of datapath stages (exact MX blocks with every fp4
code pair, the MXDOTP grid, tensor-core windows with n-bit sums and zero terms, UE4M3 group
sums, pairwise IEEE adds, fp64 FMA chains, parity windows with a second alignment, FP32
promotion, c added at the end with a term order, a Kulisch accumulator, tf32 codes). The long
run, ``MXSIM_CMODEL_LONG=1``, checks every pair of every shipped config on 1000 random vectors,
the corners and the exhaustive cases where they are small (docs/cmodel.md)."""

from __future__ import annotations

import os
import shutil

import pytest

import mxsim
from conftest import REPO
from mxsim.cmodel.check import check_unit

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler"
)

FAMILIES = [
    ("ocp-exact", "fp4_e2m1", "fp4_e2m1", ("random", "corners", "exhaustive")),
    ("mxdotp", "fp8_e4m3", "fp8_e4m3", ("random", "corners")),
    ("h100-fp8", "fp8_e4m3", "fp8_e5m2", ("random", "corners")),
    ("b200-nvfp4", "fp4_e2m1", "fp4_e2m1", ("random", "corners")),
    ("mi250", "fp16", "fp16", ("random",)),
    ("a100-dmma", "fp64", "fp64", ("random",)),
    ("mi300", "fp8_e4m3fnuz", "fp8_e4m3fnuz", ("random",)),
    ("h100-fp8-promoted", "fp8_e4m3", "fp8_e4m3", ("random",)),
    ("b200", "fp16", "fp16", ("random",)),
    ("kulisch", "fp8_e5m2", "fp6_e2m3", ("random",)),
    ("a100", "tf32", "tf32", ("random",)),
]


@pytest.mark.parametrize(
    "config, a_format, b_format, kinds", FAMILIES, ids=[f"{c}-{a}x{b}" for c, a, b, _ in FAMILIES]
)
def test_equal_to_mxsim(tmp_path, config, a_format, b_format, kinds):
    result = check_unit(
        REPO / "hwconfigs" / f"{config}.yaml",
        a_format,
        b_format,
        cases=200,
        kinds=kinds,
        build=tmp_path,
    )
    assert result["vectors"] >= 200 and result["mismatches"] == 0, result


def test_a_longer_k_of_several_blocks(tmp_path):
    result = check_unit(
        REPO / "hwconfigs" / "b200-tcgen05-mxf8f6f4.yaml",
        "fp8_e4m3",
        "fp6_e3m2",
        k=128,
        cases=200,
        kinds=("random",),
        build=tmp_path,
    )
    assert result["mismatches"] == 0, result


def _every_pair():
    for path in sorted((REPO / "hwconfigs").glob("*.yaml")):
        for a_format, b_format in mxsim.load_hwconfig(path).format_pairs:
            yield path.stem, a_format, b_format


@pytest.mark.skipif(
    not os.environ.get("MXSIM_CMODEL_LONG"), reason="long run: set MXSIM_CMODEL_LONG=1"
)
@pytest.mark.parametrize(
    "config, a_format, b_format", list(_every_pair()) if os.environ.get("MXSIM_CMODEL_LONG") else []
)
def test_every_shipped_pair(tmp_path, config, a_format, b_format):
    result = check_unit(
        REPO / "hwconfigs" / f"{config}.yaml", a_format, b_format, cases=1000, build=tmp_path
    )
    assert result["mismatches"] == 0, result
