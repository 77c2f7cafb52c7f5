"""The probe on real RTL: examples/rtl/mxdot_fp4.sv under Icarus Verilog, through the line
protocol (examples/rtl/mxdot_probe_tb.sv) and the subprocess adapter.

The correct unit must come out as ocp-exact's fp4 path and reproduce the RTL on vectors of
this test's own; each broken variant (parameter BUG) must come out either with a config that
differs from the correct one in the key its fault touches, or with a validation that counts
mismatches -- never as the correct unit with a clean validation.
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
import yaml

from conftest import REPO
from mxsim.datapath import dot, load_hwconfig, parse_hwconfig
from mxsim.probe import SubprocessUnit, probe
from test_golden_rtl import BUGS, compile_bench, require_icarus

PAIR = ("fp4_e2m1", "fp4_e2m1")
#: The faults a key describes: the keys (any of them) whose value must differ from the correct unit's.
KEYED = {
    1: {"accumulator_rounding", "output_rounding"},  # truncates: toward zero
    4: {"output_subnormals", "accumulator_subnormals"},  # flushes subnormal results
    5: {"output_zero_sign"},  # exact zeros always +0 (exact_positive)
    7: {"input_subnormals"},  # subnormal elements read as zero
}
LONG = bool(os.environ.get("MXSIM_PROBE_LONG"))
#: The variant CI probes: one whose fault a key describes (about a quarter of a minute).
#: MXSIM_PROBE_LONG=1 probes every variant; those no key describes run every step of the search
#: and take 1-2 minutes each (the corner vectors of tests/test_golden_rtl.py catch each of
#: them in CI, and test_probe_core's unit with a fault no key describes is reported there).
CI_BUGS = (7,)


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """Probe a BUG variant (cached): returns (ProbeResult, the emitted config's params, vvp path)."""
    require_icarus()
    out = tmp_path_factory.mktemp("probe_rtl")
    results = {}

    def run(bug: int):
        if bug not in results:
            target = compile_bench("mxdot_probe_tb", bug, out)
            unit = SubprocessUnit(f"vvp -n {target}", *PAIR, timeout=60)
            try:
                result = probe(unit, *PAIR, 32, validation_vectors=768, corner_vectors=512)
            finally:
                unit.close()
            params = parse_hwconfig(yaml.safe_load(result.yaml), "<probed>").params(*PAIR)
            print(
                f"BUG={bug}: {result.queries} queries, {result.seconds:.1f} s ({result.unit_seconds:.1f} s in vvp), "
                f"{result.validation.mismatches} / {result.validation.vectors} mismatches"
            )
            results[bug] = (result, params, target)
        return results[bug]

    return run


def test_correct_unit_is_ocp_exact_and_reproduces_the_rtl(probed):
    result, params, target = probed(0)
    assert result.validation.mismatches == 0
    assert result.queries <= 100_000
    reference = load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml").params(*PAIR)
    assert (
        params.scales == "products"
        and params.fused_terms == 32
        and params.align_fraction_bits is None
    )
    assert (params.accumulator_rounding, params.output_rounding) == (
        reference.accumulator_rounding,
        "nearest_even",
    )
    # Vectors of this test's own: uniformly random codes, scales over a wide range, random c bits.
    rng = np.random.default_rng(11)
    n = 300
    a = rng.integers(0, 16, (n, 32)).astype(np.uint64)
    b = rng.integers(0, 16, (n, 32)).astype(np.uint64)
    sa = rng.integers(60, 200, (n, 1)).astype(np.uint8)
    sb = rng.integers(60, 200, (n, 1)).astype(np.uint8)
    c = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    unit = SubprocessUnit(f"vvp -n {target}", *PAIR)
    try:
        rtl = unit(a, b, sa, sb, c)
    finally:
        unit.close()
    emitted = parse_hwconfig(yaml.safe_load(result.yaml), "<probed>")
    mine = dot(
        emitted,
        a,
        b,
        a_format=PAIR[0],
        b_format=PAIR[1],
        scale_a=sa,
        scale_b=sb,
        c=c.view(np.float32),
    )
    assert mine.astype(np.uint64).tolist() == rtl.tolist()


@pytest.mark.parametrize("bug", sorted(BUGS) if LONG else CI_BUGS)
def test_broken_variant_is_told_apart(probed, bug):
    good = probed(0)[1]
    result, params, _ = probed(bug)
    changed = {
        field
        for field in good.__dataclass_fields__
        if getattr(params, field) != getattr(good, field)
    }
    if bug in KEYED and changed & KEYED[bug]:
        return  # the key its fault touches differs from the correct unit's
    assert result.validation.mismatches > 0, (
        f"BUG={bug} ({BUGS[bug]}): keys changed {sorted(changed)} and a clean validation"
    )


# ----------------------------------------------------------------------------- an odd width: 11 FP6 elements

FP6 = ("fp6_e3m2", "fp6_e3m2")


def _probe_fp6_rtl(bug: int, out):
    """examples/rtl/mxdot_fp6.sv (11 E3M2 elements per operation) with parameter BUG, probed at
    K = 11 through the line protocol; (result, emitted params, vvp path)."""
    require_icarus()
    rtl = REPO / "examples" / "rtl"
    target = out / f"mxdot_fp6_probe_tb_bug{bug}.vvp"
    subprocess.run(
        [
            "iverilog",
            "-g2012",
            f"-Pmxdot_fp6_probe_tb.BUG={bug}",
            "-o",
            str(target),
            str(rtl / "mxdot_fp6.sv"),
            str(rtl / "mxdot_fp6_probe_tb.sv"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    unit = SubprocessUnit(f"vvp -n {target}", *FP6, timeout=60)
    try:
        result = probe(unit, *FP6, 11, validation_vectors=512, corner_vectors=256)
    finally:
        unit.close()
    return result, parse_hwconfig(yaml.safe_load(result.yaml), "<probed>").params(*FP6), target


@pytest.mark.skipif(
    not LONG, reason="long mode (MXSIM_PROBE_LONG=1): a probe through vvp takes a minute or more"
)
def test_an_fp6_unit_of_11_elements_is_probed_exact(tmp_path):
    result, params, target = _probe_fp6_rtl(0, tmp_path)
    assert result.exact and params.fused_terms == 11 and params.scales == "products"
    rng = np.random.default_rng(12)
    n = 300
    a, b = (rng.integers(0, 64, (n, 11)).astype(np.uint64) for _ in range(2))
    sa, sb = (rng.integers(90, 170, (n, 1)).astype(np.uint8) for _ in range(2))
    c = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    unit = SubprocessUnit(f"vvp -n {target}", *FP6)
    try:
        rtl = unit(a, b, sa, sb, c)
    finally:
        unit.close()
    emitted = parse_hwconfig(yaml.safe_load(result.yaml), "<probed>")
    mine = dot(
        emitted,
        a,
        b,
        a_format=FP6[0],
        b_format=FP6[1],
        scale_a=sa,
        scale_b=sb,
        c=c.view(np.float32),
    )
    assert mine.astype(np.uint64).tolist() == rtl.tolist()


@pytest.mark.skipif(
    not LONG, reason="long mode (MXSIM_PROBE_LONG=1): a probe through vvp takes a minute or more"
)
def test_an_fp6_unit_ignoring_its_eleventh_element_is_caught(tmp_path):
    """BUG=2: the eleventh product dropped, which no key describes: the config written is marked
    not exact, with its mismatches."""
    result, _, _ = _probe_fp6_rtl(2, tmp_path)
    assert not result.exact and result.validation.mismatches > 0 and "NOT EXACT" in result.yaml
