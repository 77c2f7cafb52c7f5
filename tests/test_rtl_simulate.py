"""The generated RTL against mxsim: golden vectors (mxsim.dot's bits) through Icarus Verilog and
Verilator, every output bit compared; and mxsim probe recovering a generated unit.

CI runs a representative subset: an exact tree and a fixed-point grid under Icarus (K = one
block), a windowed tree with c in the window and a normalised sum under Verilator (K = 8, a partial
tree: Verilator's C++ compile grows with the unit). ``MXSIM_RTL_LONG=1`` runs every format
pair of every shipped config the generator covers, at K = one and two blocks, under both
simulators, with 1000 random vectors, the corner list, and the exhaustive list for 4-bit
pairs; ``MXSIM_RTL_LONG=PATTERN[,PATTERN]`` only the configs whose name matches a pattern.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import REPO
from mxsim.datapath import dot, load_hwconfig, parse_hwconfig
from mxsim.datapath.config import vary_hwconfig
from mxsim.errors import ConfigError
from mxsim.golden import generate
from mxsim.rtl import check_covered, generate_unit
from mxsim.rtl.simulate import have, probe_testbench, simulate
from test_golden_rtl import require

LONG = os.environ.get("MXSIM_RTL_LONG", "")


def require_simulator(simulator: str) -> None:
    require(
        have(simulator),
        {"iverilog": "Icarus Verilog (iverilog, vvp)", "verilator": "Verilator"}[simulator],
    )


def prove(
    tmp_path: Path,
    config: str,
    pair: tuple[str, str],
    k: int | None,
    simulator: str,
    cases: int,
    kinds=("random", "corners"),
    pipeline: int = 0,
    changes: dict | None = None,
) -> dict:
    """Vectors from mxsim.dot for (config with ``changes``, pair, K) through the generated unit:
    {file: (passed, failed)}."""
    require_simulator(simulator)
    hw = load_hwconfig(REPO / "hwconfigs" / f"{config}.yaml")
    if changes:
        hw = vary_hwconfig(hw, changes, f"{config}-varied")
    unit = generate_unit(hw, *pair, k, pipeline=pipeline)
    out = tmp_path / f"{config}-{pair[0]}x{pair[1]}-{unit.dot_length}"
    manifest = generate(
        hw,
        out,
        cases=cases,
        seed=7,
        kinds=list(kinds),
        pairs=[pair],
        dot_length=unit.dot_length,
        progress=False,
    )
    files = sorted(out.glob("*.hex"))
    counts = {
        Path(e["vectors"]).name: e["count"] for u in manifest["units"] for e in u["files"].values()
    }
    results = simulate(unit, files, simulator, work_dir=tmp_path)
    for name, result in results.items():
        assert result.failed == 0, f"{config} {pair} K={unit.dot_length} {name}: {result.failures}"
        assert result.passed == counts[name] > 0 or (
            result.passed == counts[name] == 0 and cases == 0
        )
    return {name: (r.passed, r.failed) for name, r in results.items()}


CI_UNITS = [
    (
        "ocp-exact",
        ("fp4_e2m1", "fp4_e2m1"),
        32,
        "iverilog",
        None,
    ),  # exact tree, c and the block sum added once
    ("mxdotp", ("fp4_e2m1", "fp4_e2m1"), 32, "iverilog", None),  # fixed-point grid, two trees of 16
    # 13-bit window with c, 14-bit normalised sum; K = 8 (a partial tree: Verilator's C++ compile
    # grows with the unit; the unit takes no scales, so the block size only sets the vectors' K)
    ("h100-fp8", ("fp8_e4m3", "fp8_e5m2"), 8, "verilator", {"inputs.block_size": 8}),
]


@pytest.mark.parametrize("config,pair,k,simulator,changes", CI_UNITS, ids=[u[0] for u in CI_UNITS])
def test_generated_unit_equals_mxsim_on_golden_vectors(
    tmp_path, config, pair, k, simulator, changes
):
    prove(tmp_path, config, pair, k, simulator, cases=100, changes=changes)


def shipped_units():
    """(config, pair) of every shipped config's pairs the generator covers; refusals as (config, key)."""
    covered, refused = [], []
    for path in sorted((REPO / "hwconfigs").glob("*.yaml")):
        hw = load_hwconfig(path)
        for pair in hw.format_pairs:
            try:
                check_covered(hw.params(*pair), hw.source)
            except ConfigError as error:
                refused.append((hw.name, pair, str(error)))
            else:
                covered.append((hw.name, pair))
    return covered, refused


def test_the_mx_family_is_covered_and_refusals_name_a_key():
    covered, refused = shipped_units()
    names = {name for name, _ in covered}
    for name in (
        "ocp-exact",
        "kulisch",
        "mxdotp",
        "mxdotp-paper",
        "mxdotp-rtz",
        "mxdotp-rdn",
        "mxdotp-rup",
        "mxdotp-rmm",
        "h100-fp8",
        "b200-fp8",
        "b200-tcgen05-mxf8f6f4",
        "rtx50-mma-mxf8f6f4",
    ):
        assert name in names, name
        assert not [r for r in refused if r[0] == name], name
    for name, pair, message in refused:
        assert "is not covered by the RTL generator" in message and ": " in message, message
        assert message.count("\n") == 0


def _long_units():
    if not LONG:
        return []
    covered, _ = shipped_units()
    patterns = None if LONG == "1" else LONG.split(",")
    return [
        (name, pair)
        for name, pair in covered
        if patterns is None or any(fnmatch.fnmatch(name, p) for p in patterns)
    ]


@pytest.mark.skipif(not LONG, reason="the long RTL run: MXSIM_RTL_LONG=1 (docs/rtl.md)")
@pytest.mark.parametrize(
    "config,pair", _long_units(), ids=[f"{c}-{a}x{b}" for c, (a, b) in _long_units()]
)
@pytest.mark.parametrize("simulator", ["iverilog", "verilator"])
@pytest.mark.parametrize("blocks", [1, 2])
def test_long_every_covered_shipped_unit(tmp_path, config, pair, simulator, blocks):
    params = load_hwconfig(REPO / "hwconfigs" / f"{config}.yaml").params(*pair)
    k = blocks * params.block_size
    if params.accumulator_format == "exact" and blocks > 1:
        pytest.skip("an exact accumulator is generated for one block")
    kinds = ["random", "corners"] + (
        ["exhaustive"] if blocks == 1 and pair == ("fp4_e2m1", "fp4_e2m1") else []
    )
    # the two-block units with a result register stage (the bench clocks it)
    prove(tmp_path, config, pair, k, simulator, cases=1000, kinds=kinds, pipeline=blocks - 1)


@pytest.mark.skipif(
    not LONG, reason="the probe of a generated unit takes minutes: MXSIM_RTL_LONG=1 (docs/rtl.md)"
)
def test_probe_recovers_a_generated_unit(tmp_path):
    """mxsim probe through the subprocess adapter on a generated windowed unit (Icarus) comes out
    with a config that reproduces the unit on vectors of this test's own."""
    import subprocess

    from mxsim.probe import SubprocessUnit, probe

    require_simulator("iverilog")
    pair = ("fp8_e4m3", "fp8_e4m3")
    hw = load_hwconfig(REPO / "hwconfigs" / "b200-tcgen05-mxf8f6f4.yaml")
    unit = generate_unit(hw, *pair)
    sources = []
    for name, text in unit.files.items():
        (tmp_path / name).write_text(text)
        sources.append(str(tmp_path / name))
    (tmp_path / "probe_tb.sv").write_text(probe_testbench(unit))
    subprocess.run(
        [
            "iverilog",
            "-g2012",
            "-o",
            str(tmp_path / "probe.vvp"),
            *sources,
            str(tmp_path / "probe_tb.sv"),
        ],
        check=True,
        capture_output=True,
    )
    command = f"vvp -n {tmp_path / 'probe.vvp'}"
    adapter = SubprocessUnit(command, *pair, timeout=120)
    try:
        result = probe(adapter, *pair, unit.dot_length, validation_vectors=512, corner_vectors=256)
    finally:
        adapter.close()
    assert result.validation.mismatches == 0
    params = parse_hwconfig(yaml.safe_load(result.yaml), "<probed>").params(*pair)
    assert params.align_fraction_bits == hw.params(*pair).align_fraction_bits
    rng = np.random.default_rng(3)
    n = 200
    a = rng.integers(0, 256, (n, 32)).astype(np.uint64)
    b = rng.integers(0, 256, (n, 32)).astype(np.uint64)
    sa = rng.integers(100, 150, (n, 1)).astype(np.uint8)
    sb = rng.integers(100, 150, (n, 1)).astype(np.uint8)
    c = rng.standard_normal(n).astype(np.float32)
    adapter = SubprocessUnit(command, *pair)
    try:
        rtl = adapter(a, b, sa, sb, c.view(np.uint32))
    finally:
        adapter.close()
    emitted = parse_hwconfig(yaml.safe_load(result.yaml), "<probed>")
    mine = dot(emitted, a, b, a_format=pair[0], b_format=pair[1], scale_a=sa, scale_b=sb, c=c)
    assert mine.astype(np.uint64).tolist() == rtl.tolist()
