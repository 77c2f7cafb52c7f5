"""Round trip: every shipped hwconfig, probed as a black box through the callable adapter,
gives a config that reproduces it bit for bit on vectors the probe never saw.

CI probes one characteristic format path per distinct config (the ``CI_PATHS`` table);
``MXSIM_PROBE_LONG=1`` probes every (A, B) pair of every config with fp32, fp16 and bf16
outputs (docs/probe.md). Configs that only extend another without changing a datapath key
(a2, l40s, h200, the *-fp8 views) are checked to resolve to their base's parameters on
every path, so probing the base covers them.
"""

from __future__ import annotations

import os
from dataclasses import fields

import numpy as np
import pytest
import yaml

from mxsim.datapath import dot, load_hwconfig, parse_hwconfig
from mxsim.probe import ProbeError, probe
from mxsim.probe.units import HwconfigUnit

from conftest import REPO

HW = REPO / "hwconfigs"
LONG = bool(os.environ.get("MXSIM_PROBE_LONG"))

#: Distinct configs and, for CI, the path probed: (A, B, output, K).
CI_PATHS = {
    "v100": ("fp16", "fp16", "fp32", 16),
    "a100": ("tf32", "tf32", "fp16", 16),
    "ada": ("fp8_e4m3", "fp8_e4m3", "fp32", 64),
    "h100": ("fp8_e4m3", "fp8_e5m2", "fp16", 32),
    "b200": ("fp8_e5m2", "fp8_e5m2", "fp32", 64),
    "h100-fp8-promoted": ("fp8_e4m3", "fp8_e4m3", "fp32", 160),  # promotion at 128 acts
    "bfp-exact": ("mx6", "mx9", "fp32", 32),
    "kulisch": ("int8", "fp8_e4m3", "fp32", 64),
    "mxdotp": ("fp6_e2m3", "fp6_e2m3", "fp32", 64),  # same_format; trees of 11 restart at each block
    "mxdotp-paper": ("fp6_e2m3", "fp4_e2m1", "fp32", 32),
    "mxdotp-rtz": ("fp8_e4m3", "fp8_e4m3", "fp32", 64),
    "mxdotp-rdn": ("fp4_e2m1", "fp4_e2m1", "fp32", 64),
    "mxdotp-rup": ("fp8_e5m2", "fp8_e5m2", "fp32", 64),
    "mxdotp-rmm": ("fp6_e3m2", "fp6_e3m2", "fp32", 64),
    "ocp-exact": ("fp8_e5m2", "fp6_e3m2", "fp32", 64),
    "h100-wgmma": ("fp8_e4m3", "fp8_e5m2", "fp16", 32),
    "b200-tcgen05": ("fp6_e3m2", "fp4_e2m1", "fp32", 64),
    "b200-tcgen05-mxf8f6f4": ("fp8_e4m3", "fp6_e2m3", "fp32", 64),
    # scales: group_sum: exact group sums times the scale pair, one window anchored at the largest scale
    "b200-tcgen05-mxf4nvf4": ("fp4_e2m1", "fp4_e2m1", "fp32", 64),  # UE4M3 per 16 (NVFP4)
    "b200-tcgen05-mxf4": ("fp4_e2m1", "fp4_e2m1", "fp32", 64),  # E8M0 per 32
    "b200-tcgen05-mxf4nvf4-e8m0-block16": ("fp4_e2m1", "fp4_e2m1", "fp32", 64),  # E8M0 per 16
    # AMD matrix cores (docs/probe.md, "AMD matrix-core probes")
    "mi100": ("fp16", "fp16", "fp32", 16),  # exact 4-term trees, exact zero sums +0
    "mi250": ("bf16", "bf16", "fp32", 16),  # pairwise rounded adds, flush to +0
    "mi250-bf16-legacy": ("bf16", "bf16", "fp32", 16),
    "mi300": ("fp8_e4m3fnuz", "fp8_e5m2fnuz", "fp32", 32),  # parity windows, second alignment, far c dropped
}
#: Configs whose CI path is probed only with MXSIM_PROBE_LONG (CI time: mi300's FP8 path takes
#: about 15 passes, docs/probe.md).
LONG_ONLY = {"mi300"}
#: AMD paths probed only with MXSIM_PROBE_LONG: the other input kinds, at an instruction's K.
LONG_AMD_PATHS = [("mi300", "fp16", "fp16", "fp32", 16), ("mi300", "bf16", "bf16", "fp32", 16),
                  ("mi300", "tf32", "tf32", "fp32", 16), ("mi300", "fp32", "fp32", "fp32", 8),
                  ("mi250", "fp16", "fp16", "fp32", 16), ("mi100", "bf16", "bf16", "fp32", 16),
                  ("mi100", "fp32", "fp32", "fp32", 8)]
#: Configs that extend one above without changing the datapath.
SAME_AS = {"a2": "a100", "l40s": "ada", "h200": "h100", "h100-fp8": "h100", "h200-fp8": "h100",
           "ada-fp8": "ada", "b200-fp8": "b200", "t4": "a100", "h200-wgmma": "h100-wgmma",
           "h100-wgmma-fp8": "h100-wgmma", "b200-tcgen05-fp8": "b200-tcgen05", "rtx50": "b200-tcgen05",
           "rtx50-mma-mxf8f6f4": "b200-tcgen05-mxf8f6f4", "b200-nvfp4": "b200-tcgen05-mxf4nvf4",
           "rtx50-mma-mxf4nvf4": "b200-tcgen05-mxf4nvf4", "rtx50-mma-mxf4": "b200-tcgen05-mxf4",
           "rtx50-mma-mxf4nvf4-e8m0-block16": "b200-tcgen05-mxf4nvf4-e8m0-block16",
           "ada-dmma": "a100-dmma", "h100-dmma": "a100-dmma", "b200-dmma": "a100-dmma", "rtx50-dmma": "a100-dmma",
           "mi300-f64": "mi250-f64", "mi250-fp32": "mi100"}
#: Keys the probe must find as a group-sum config has them (no other value gives its outputs on
#: every input: the round trip's vectors alone seldom show a wrong group size).
GROUP_KEYS = ("scales", "scale_format", "group_terms")
#: AMD keys the probe must find as the config has them on its CI path (other values of these give
#: other bits on the probes' designed inputs, which random vectors seldom show).
AMD_KEYS = {"mi250": ("structure", "fused_terms"),
            "mi300": ("parity_windows", "second_alignment_bits", "far_accumulator", "align_fraction_bits")}


#: fp64 units: the probe's inputs and outputs stop at 32-bit formats (docs/probe.md).
FP64_NOT_PROBED = {"a100-dmma", "mi250-f64"}


def test_every_shipped_config_is_probed():
    assert {p.stem for p in HW.glob("*.yaml")} == set(CI_PATHS) | set(SAME_AS) | FP64_NOT_PROBED


@pytest.mark.parametrize("name", sorted(FP64_NOT_PROBED))
def test_configs_not_probed_are_the_fp64_units(name):
    assert load_hwconfig(HW / f"{name}.yaml").a_formats == ("fp64",)


@pytest.mark.parametrize("name, base", sorted(SAME_AS.items()))
def test_extending_configs_resolve_to_their_base(name, base):
    config, base_config = load_hwconfig(HW / f"{name}.yaml"), load_hwconfig(HW / f"{base}.yaml")
    for a in config.a_formats:
        for b in config.b_formats:
            for out in ("fp32", "fp16", "bf16"):
                assert config.params(a, b, out) == base_config.params(a, b, out)


def _paths():
    if not LONG:
        return [(name, *path) for name, path in CI_PATHS.items() if name not in LONG_ONLY]
    paths = [(name, *CI_PATHS[name]) for name in sorted(LONG_ONLY)] + LONG_AMD_PATHS
    for name in CI_PATHS:
        config = load_hwconfig(HW / f"{name}.yaml")
        k = 64 if config.params(config.a_formats[0], config.b_formats[0]).block_size >= 32 else 32
        paths += [(name, a, b, out, k) for a in config.a_formats for b in config.b_formats for out in ("fp32", "fp16", "bf16")]
    return paths


def _test_vectors(config, a_format, b_format, k, rng, n=1500):
    """Independent of the probe's own families: uniformly random codes (any code, specials
    included), random scales near 1 and a few extreme, random c from fp32 bits."""
    from mxsim.formats import get_format

    params = config.params(a_format, b_format)
    a_fmt, b_fmt = get_format(a_format), get_format(b_format)
    a = (rng.integers(0, 1 << (a_fmt.bits - a_fmt.padding_bits), (n, k)) << a_fmt.padding_bits).astype(np.uint64)
    b = (rng.integers(0, 1 << (b_fmt.bits - b_fmt.padding_bits), (n, k)) << b_fmt.padding_bits).astype(np.uint64)
    if a_fmt.twos_complement:
        a[a == 0x80] = 0
    if b_fmt.twos_complement:
        b[b == 0x80] = 0
    blocks = -(-k // params.block_size)
    scale_fmt = get_format(params.scale_format)
    codes = np.arange(1 << scale_fmt.bits, dtype=np.uint64)
    with np.errstate(divide="ignore"):
        near_one = codes[np.abs(np.log2(scale_fmt.decode(codes))) <= 9]  # 2^-9 .. 2^9 (NaN out)
    scales = [rng.choice(near_one, (n, blocks)).astype(np.uint8) for _ in range(2)]
    for s in scales:  # a few of any code: NaN, zero, extremes
        s[rng.random(s.shape) < 0.02] = rng.integers(0, len(codes))
    c = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    c[rng.random(n) < 0.5] = np.float32(rng.standard_normal()).view(np.uint32)
    return a, b, scales, c


@pytest.mark.parametrize("name, a_format, b_format, out_format, k", _paths())
def test_round_trip(name, a_format, b_format, out_format, k):
    config = load_hwconfig(HW / f"{name}.yaml")
    unit = HwconfigUnit(config, a_format, b_format, out_format)
    result = probe(unit, a_format, b_format, k, block_size=unit.block_size, out_format=out_format,
                   validation_vectors=1024, corner_vectors=256)
    print(f"{name} {a_format} x {b_format} -> {out_format}, K = {k}: {result.queries} queries, {result.seconds:.1f} s, "
          f"{result.passes} passes, {result.validation.mismatches} / {result.validation.vectors} mismatches")
    assert result.validation.mismatches == 0, result.validation.examples
    assert result.queries <= 100_000
    emitted = parse_hwconfig(yaml.safe_load(result.yaml), "<emitted>")
    rng = np.random.default_rng(7)
    a, b, (sa, sb), c = _test_vectors(config, a_format, b_format, k, rng)
    scaled = unit.params.scales != "none"
    kwargs = dict(a_format=a_format, b_format=b_format, c=c.view(np.float32), out_format=out_format)
    want = dot(config, a, b, scale_a=sa if scaled else None, scale_b=sb if scaled else None, **kwargs)
    probed_scaled = emitted.params(a_format, b_format, out_format).scales != "none"
    got = dot(emitted, a, b, scale_a=sa if probed_scaled else None, scale_b=sb if probed_scaled else None, **kwargs)
    nan = np.isnan(as_values(want, out_format)) & np.isnan(as_values(got, out_format))
    assert int(np.count_nonzero((want != got) & ~nan)) == 0
    shipped, probed = unit.params, emitted.params(a_format, b_format, out_format)
    if shipped.scales == "group_sum":
        assert {key: getattr(probed, key) for key in GROUP_KEYS} == {key: getattr(shipped, key) for key in GROUP_KEYS}
    if (name, a_format, b_format, out_format, k) == (name, *CI_PATHS[name]):
        decided = AMD_KEYS.get(name, ())
        assert {key: getattr(probed, key) for key in decided} == {key: getattr(shipped, key) for key in decided}


def as_values(bits, out_format):
    from mxsim.datapath import as_float

    return as_float(bits, out_format)


def test_probed_keys_that_differ_are_listed_as_equivalent():
    """b200's FP8 fp32 path: c added by an fp32 RNE add after a tree whose sum is rounded
    toward zero to 24 bits; the probe may describe the same unit with other keys, and every
    key it changes must leave the outputs bit-identical (the round trip) -- here we check
    the evidence names the values it ruled out."""
    unit = HwconfigUnit(HW / "b200.yaml", "fp8_e4m3", "fp8_e4m3", "fp32")
    result = probe(unit, "fp8_e4m3", "fp8_e4m3", 32, validation_vectors=512, corner_vectors=128)
    window = next(d for d in result.decisions if d.probe == "window")
    assert window.value["adder.align_fraction_bits"] is not None
    evidence = window.evidence
    assert evidence["other_values"] and evidence["ruled_out_here"] > 0
    row = evidence["input"]
    answer = unit(np.array([row["a"]], np.uint64), np.array([row["b"]], np.uint64), np.array([row["scale_a"]], np.uint8),
                  np.array([row["scale_b"]], np.uint8), np.array([int(row["c"], 16)], np.uint32))
    assert f"0x{int(answer[0]):x}" == evidence["unit_output"]
    assert all(other["output"] != evidence["unit_output"] for other in evidence["other_values"])


def test_a_fault_no_key_describes_is_reported_not_matched():
    """A unit that saturates overflow to the largest finite value under round-to-nearest (no
    key describes it): the validation must count mismatches."""
    unit = HwconfigUnit(HW / "ocp-exact.yaml", "fp8_e4m3", "fp8_e4m3", "fp32")

    def saturating(a, b, sa, sb, c):
        bits = unit(a, b, sa, sb, c).astype(np.uint64)
        infinite = (bits & 0x7FFFFFFF) == 0x7F800000
        overflow = infinite & (c.astype(np.uint64) & 0x7FFFFFFF != 0x7F800000)
        bits[overflow] = (bits[overflow] & 0x80000000) | 0x7F7FFFFF
        return bits

    result = probe(saturating, "fp8_e4m3", "fp8_e4m3", 32, validation_vectors=256, corner_vectors=256)
    assert result.validation.mismatches > 0
    assert f"{result.validation.mismatches} mismatches" in result.yaml


def test_budget_and_arguments():
    unit = HwconfigUnit(HW / "ocp-exact.yaml", "fp4_e2m1", "fp4_e2m1")
    with pytest.raises(ProbeError, match="budget of 50"):
        probe(unit, "fp4_e2m1", "fp4_e2m1", 32, budget=50)
    with pytest.raises(Exception, match="out_format"):
        probe(unit, "fp4_e2m1", "fp4_e2m1", 32, out_format="fp8_e4m3")
    with pytest.raises(Exception, match="e8m0"):
        probe(unit, "e8m0", "fp4_e2m1", 32)
    with pytest.raises(Exception, match="c_format"):
        probe(unit, "fp4_e2m1", "fp4_e2m1", 32, c_format="fp8_e4m3")


def test_a_unit_taking_fp16_c_is_asked_fp16_values_only():
    """c_format: every c asked is a value fp16 holds; a unit refusing others answers throughout."""
    unit = HwconfigUnit(HW / "v100.yaml", "fp16", "fp16", "fp32")
    asked = []

    def fp16_c_only(a, b, sa, sb, c):
        values = c.view(np.float32)
        with np.errstate(over="ignore"):
            assert np.array_equal(values.astype(np.float16).astype(np.float32), values, equal_nan=True)
        asked.append(len(c))
        return unit(a, b, sa, sb, c)

    result = probe(fp16_c_only, "fp16", "fp16", 16, c_format="fp16", validation_vectors=256, corner_vectors=64)
    assert sum(asked) == result.queries and result.validation.mismatches == 0


def test_deterministic_for_a_seed():
    unit = HwconfigUnit(HW / "ocp-exact.yaml", "fp4_e2m1", "fp4_e2m1")
    first = probe(unit, "fp4_e2m1", "fp4_e2m1", 32, validation_vectors=256, corner_vectors=64)
    second = probe(unit, "fp4_e2m1", "fp4_e2m1", 32, validation_vectors=256, corner_vectors=64)
    assert first.yaml == second.yaml and first.queries == second.queries
    assert [f.name for f in fields(first.decisions[0])][:3] == ["probe", "keys", "value"]
