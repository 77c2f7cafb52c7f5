"""Round trip: every shipped hwconfig, probed as a black box through the callable adapter,
gives a config that reproduces it bit for bit on vectors the probe never saw.

CI probes one characteristic format path per distinct config (the ``CI_PATHS`` table), one
fp64 unit (``FP64_PATHS``) and a few paths of the long list whose probe once ended wrong
(``ONCE_FAILING_PATHS``); ``MXSIM_PROBE_LONG=1`` probes every (A, B) pair a config takes (``format_pairs``) of every
config with fp32, fp16 and bf16 outputs, and every fp64 path (docs/probe.md). Configs that only extend another without changing a datapath key
(a2, l40s, the *-fp8 views) are checked to resolve to their base's parameters on
every path, so probing the base covers them.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import fields
from fractions import Fraction

import numpy as np
import pytest
import yaml

from mxsim.datapath import dot, load_hwconfig, parse_hwconfig
from mxsim.probe import ProbeError, probe
from mxsim.probe.probes import GRID_NEEDS
from mxsim.probe.units import HwconfigUnit

from conftest import REPO, any_pair

HW = REPO / "hwconfigs"
LONG = bool(os.environ.get("MXSIM_PROBE_LONG"))

#: Distinct configs and, for CI, the path probed: (A, B, output, K).
CI_PATHS = {
    "v100": ("fp16", "fp16", "fp32", 16),
    "a100": ("tf32", "tf32", "fp16", 16),
    "ada": ("fp8_e4m3", "fp8_e4m3", "fp32", 64),
    "h100": ("fp8_e4m3", "fp8_e5m2", "fp16", 32),
    "h200": ("fp8_e5m2", "fp8_e4m3", "fp32", 64),  # fp16 HMMA trees, promotion at 32 acts
    "h200-cublas": ("bf16", "bf16", "fp16", 32),  # fp32 accumulation, rounded once to fp16
    "b200": ("fp8_e5m2", "fp8_e5m2", "fp32", 64),
    "h100-fp8-promoted": ("fp8_e4m3", "fp8_e4m3", "fp32", 160),  # promotion at 128 acts
    "h200-cublaslt-fp8": ("fp8_e4m3", "fp8_e4m3", "fp32", 160),
    "h200-cublaslt-fp8-fast": ("fp8_e4m3", "fp8_e5m2", "bf16", 64),
    "bfp-exact": ("mx6", "mx9", "fp32", 32),
    "kulisch": ("int8", "fp8_e4m3", "fp32", 64),
    "mxdotp": (
        "fp6_e2m3",
        "fp6_e2m3",
        "fp32",
        64,
    ),  # same_format; trees of 11 restart at each block
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
    "mi300": (
        "fp8_e4m3fnuz",
        "fp8_e5m2fnuz",
        "fp32",
        32,
    ),  # parity windows, second alignment, far c dropped
}
#: Configs whose CI path is probed only with MXSIM_PROBE_LONG, for CI's time: mi300's FP8 path
#: takes about 15 passes (docs/probe.md); the others share their datapath with a config CI
#: probes and differ in a rounding mode (mxdotp: tests/test_probe_modes.py probes it under round
#: toward zero in CI), the formats they take (b200-tcgen05) or the zero-term sign (mi250);
#: h200-cublaslt-fp8 and -fast are h100-wgmma's FP8 path (probed in CI) with h100-fp8-promoted's
#: promotion and h200-cublas's rounding of narrow outputs.
LONG_ONLY = {
    "h200-cublaslt-fp8",
    "h200-cublaslt-fp8-fast",
    "mi300",
    "mxdotp-rtz",
    "mxdotp-rup",
    "mxdotp-rmm",
    "b200-tcgen05-mxf8f6f4",
    "b200-tcgen05-mxf4",
    "mi250-bf16-legacy",
}
#: AMD paths probed only with MXSIM_PROBE_LONG: the other input kinds, at an instruction's K.
LONG_AMD_PATHS = [
    ("mi300", "fp16", "fp16", "fp32", 16),
    ("mi300", "bf16", "bf16", "fp32", 16),
    ("mi300", "tf32", "tf32", "fp32", 16),
    ("mi300", "fp32", "fp32", "fp32", 8),
    ("mi250", "fp16", "fp16", "fp32", 16),
    ("mi100", "bf16", "bf16", "fp32", 16),
    ("mi100", "fp32", "fp32", "fp32", 8),
]
#: Configs that extend one above without changing the datapath.
SAME_AS = {
    "a2": "a100",
    "l40s": "ada",
    "h100-fp8": "h100",
    "h200-fp8": "h200",
    "ada-fp8": "ada",
    "b200-fp8": "b200",
    "t4": "a100",
    "h200-wgmma": "h100-wgmma",
    "h100-wgmma-fp8": "h100-wgmma",
    "b200-tcgen05-fp8": "b200-tcgen05",
    "rtx50": "b200-tcgen05",
    "rtx50-mma-mxf8f6f4": "b200-tcgen05-mxf8f6f4",
    "b200-nvfp4": "b200-tcgen05-mxf4nvf4",
    "rtx50-mma-mxf4nvf4": "b200-tcgen05-mxf4nvf4",
    "rtx50-mma-mxf4": "b200-tcgen05-mxf4",
    "rtx50-mma-mxf4nvf4-e8m0-block16": "b200-tcgen05-mxf4nvf4-e8m0-block16",
    "ada-dmma": "a100-dmma",
    "h100-dmma": "a100-dmma",
    "b200-dmma": "a100-dmma",
    "rtx50-dmma": "a100-dmma",
    "mi300-f64": "mi250-f64",
    "mi250-fp32": "mi100",
}
#: Keys the probe must find as a group-sum config has them (no other value gives its outputs on
#: every input: the round trip's vectors alone seldom show a wrong group size).
GROUP_KEYS = ("scales", "scale_format", "group_terms")
#: AMD keys the probe must find as the config has them on its CI path (other values of these give
#: other bits on the probes' designed inputs, which random vectors seldom show).
AMD_KEYS = {
    "mi250": ("structure", "fused_terms"),
    "mi300": ("parity_windows", "second_alignment_bits", "far_accumulator", "align_fraction_bits"),
}


#: fp64 units (64-bit codes, c and outputs; c_format fp64): CI probes a100-dmma's; the long
#: mode also mi250-f64's (the same FMA chain from another vendor's file) and a longer K.
FP64_PATHS = {"a100-dmma": ("fp64", "fp64", "fp64", 4)}
FP64_LONG_PATHS = [
    ("mi250-f64", "fp64", "fp64", "fp64", 4),
    ("a100-dmma", "fp64", "fp64", "fp64", 16),
]


def test_every_shipped_config_is_probed():
    probed_fp64 = set(FP64_PATHS) | {path[0] for path in FP64_LONG_PATHS}
    assert {p.stem for p in HW.glob("*.yaml")} == set(CI_PATHS) | set(SAME_AS) | probed_fp64


@pytest.mark.parametrize("name, base", sorted(SAME_AS.items()))
def test_extending_configs_resolve_to_their_base(name, base):
    config, base_config = load_hwconfig(HW / f"{name}.yaml"), load_hwconfig(HW / f"{base}.yaml")
    assert config.format_pairs and set(config.format_pairs) <= set(base_config.format_pairs)
    for a, b in config.format_pairs:
        own = config.params(a, b).output_format  # fp64 for the fp64 units
        for out in dict.fromkeys(("fp32", "fp16", "bf16", own)):
            assert config.params(a, b, out) == base_config.params(a, b, out)


def _paths():
    fp64 = [(name, *path) for name, path in FP64_PATHS.items()] + (FP64_LONG_PATHS if LONG else [])
    if not LONG:
        return [(name, *path) for name, path in CI_PATHS.items() if name not in LONG_ONLY] + fp64
    paths = fp64 + [(name, *CI_PATHS[name]) for name in sorted(LONG_ONLY)] + LONG_AMD_PATHS
    for name in CI_PATHS:
        config = load_hwconfig(HW / f"{name}.yaml")
        k = 64 if config.params(config.a_formats[0], config.b_formats[0]).block_size >= 32 else 32
        paths += [
            (name, a, b, out, k) for a, b in config.format_pairs for out in ("fp32", "fp16", "bf16")
        ]
    return paths


def _test_vectors(config, a_format, b_format, k, rng, n=1500):
    """Independent of the probe's own families: uniformly random codes (any code, specials
    included), random scales near 1 and a few extreme, random c from fp32 bits (fp64 bits
    for an fp64 unit's c)."""
    from mxsim.formats import get_format

    params = config.params(a_format, b_format)
    a_fmt, b_fmt = get_format(a_format), get_format(b_format)
    if params.c_format == "fp64":
        return _fp64_test_vectors(rng, n, k)
    a = (
        rng.integers(0, 1 << (a_fmt.bits - a_fmt.padding_bits), (n, k)) << a_fmt.padding_bits
    ).astype(np.uint64)
    b = (
        rng.integers(0, 1 << (b_fmt.bits - b_fmt.padding_bits), (n, k)) << b_fmt.padding_bits
    ).astype(np.uint64)
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
    _signed_zero_rows(a, b, c, a_fmt, b_fmt, np.random.default_rng(17))
    return a, b, scales, c.view(np.float32)


def _signed_zero_rows(a, b, c, a_fmt, b_fmt, rng, rows=48):
    """The last ``rows`` rows: elements +-0 only and c = +-0, the products all -0, half -0 or
    all +0 by turns (a -0 product takes its -0 from either format that has one: none for
    integers and fnuz formats, whose sign bit on zero is NaN; a +0 product is +0 * +0 or, where
    both have one, -0 * -0): the sign of an exact zero result, which uniformly random codes over
    K elements almost never make."""
    negative_codes = []
    for fmt in (a_fmt, b_fmt):
        sign = 1 << (fmt.bits - 1)
        value = fmt.decode(np.array([sign], dtype=np.uint64))[0]
        negative_codes.append(sign if value == 0 and np.signbit(value) else None)
    a_negative, b_negative = negative_codes
    shape = a[-rows:].shape
    negative_product = rng.random(shape) < np.array([1.0, 0.5, 0.0])[np.arange(rows) % 3, None]
    from_a = rng.random(shape) < (
        0.5 if a_negative is not None and b_negative is not None else float(a_negative is not None)
    )
    both = (
        ~negative_product
        & (rng.random(shape) < 0.3)
        & (a_negative is not None)
        & (b_negative is not None)
    )
    a[-rows:], b[-rows:] = 0, 0
    if a_negative is not None:
        a[-rows:][(negative_product & from_a) | both] = a_negative
    if b_negative is not None:
        b[-rows:][(negative_product & ~from_a) | both] = b_negative
    c[-rows:] = np.where(rng.random(rows) < 0.5, np.uint32(0x80000000), np.uint32(0))


def _fp64_test_vectors(rng, n, k):
    """fp64 units: a third uniformly random codes, the rest data of one size (normal values
    times 2^-20..2^20, so sums cancel and round), c from random fp64 bits or of the data's size."""
    a, b = (rng.integers(0, 1 << 64, (n, k), dtype=np.uint64) for _ in range(2))
    data = rng.random(n) < 2 / 3
    for codes in (a, b):
        values = rng.standard_normal((int(data.sum()), k)) * np.exp2(
            rng.integers(-20, 21, (int(data.sum()), 1))
        )
        codes[data] = values.view(np.uint64)
    c = rng.integers(0, 1 << 64, n, dtype=np.uint64).view(np.float64)
    sized = rng.random(n) < 0.5
    c[sized] = rng.standard_normal(int(sized.sum())) * np.exp2(
        rng.integers(-40, 41, int(sized.sum()))
    )
    no_scales = np.full((n, 1), 127, np.uint8)
    return a, b, (no_scales, no_scales), c


@pytest.mark.parametrize("name, a_format, b_format, out_format, k", _paths())
def test_round_trip(name, a_format, b_format, out_format, k):
    _round_trip(load_hwconfig(HW / f"{name}.yaml"), name, a_format, b_format, out_format, k)


#: The MXDOTP unit's own width per element format: 8 FP8, 11 FP6 or 16 FP4 elements per operation.
MXDOTP_OWN_K = {"fp8_e4m3": 8, "fp8_e5m2": 8, "fp6_e3m2": 11, "fp6_e2m3": 11, "fp4_e2m1": 16}
#: The MXDOTP configs, one per rounding mode.
MXDOTP_CONFIGS = ("mxdotp", "mxdotp-rtz", "mxdotp-rdn", "mxdotp-rup", "mxdotp-rmm")


@pytest.mark.skipif(
    not LONG, reason="long mode (MXSIM_PROBE_LONG=1): every mxdotp config at its own width"
)
@pytest.mark.parametrize("name", MXDOTP_CONFIGS)
@pytest.mark.parametrize("element", MXDOTP_OWN_K)
def test_round_trip_at_the_unit_s_own_width(name, element):
    """Each mxdotp config on each element format at the unit's own K (one operation: 8, 11 or
    16 elements, fewer than a block): exact, as at K = 64."""
    _round_trip(
        load_hwconfig(HW / f"{name}.yaml"), name, element, element, "fp32", MXDOTP_OWN_K[element]
    )


@pytest.mark.skipif(
    not LONG, reason="long mode (MXSIM_PROBE_LONG=1): an MI300 datapath, about a minute of probing"
)
def test_round_trip_of_products_far_wider_than_parity_windows():
    """mi300's FP8 datapath (even and odd positions in 24-bit windows of their own) taking fp32
    B elements, a pair no MI300 instruction takes (mi300.yaml refuses it): products spanning
    some 280 binades show the parity windows on nearly every row, and no key decided one at a
    time fits until they are held; the coarse start offers them (402 / 1,280 mismatches
    without)."""
    _round_trip(any_pair("mi300"), "mi300-any-pair", "fp8_e5m2fnuz", "fp32", "fp32", 64)


#: Long-list paths whose probe once ended wrong, each with what fixed it (benchmarks/results/probe-runs.md).
ONCE_FAILING_PATHS = [
    # promotion every 128 products at K = 64: c and the accumulator meet only at the end, rounded
    # to nearest even (319 / 1,280 mismatches while no promotion interval reached K)
    ("h100-fp8-promoted", "fp8_e4m3", "fp8_e4m3", "fp32", 64),
    # the hypothesis held at the end missed an answer of the probes' rows that no validation
    # vector showed (0 / 1,290 in validation, 1 / 1,500 in the round trip)
    ("b200-tcgen05-mxf8f6f4", "fp6_e2m3", "fp4_e2m1", "bf16", 64),
    # a grid of 34 fraction bits emitted as 18: only zero products under extreme scales show
    # it, as the sign of the zero (1 / 1,280)
    ("mxdotp-rmm", "fp6_e2m3", "fp6_e2m3", "bf16", 64),
    # every search ended 1 / 1,287 (a targeted row); polishing the searches' hypotheses against
    # all the run's answers finds the unit
    ("b200-tcgen05", "fp6_e2m3", "fp8_e4m3", "bf16", 64),
    # products exact in any window, c cut by one: a grid held kept c outside the trees, where no
    # window reached it (0 / 1,288 in validation, 2 / 1,500 in the round trip)
    ("b200-tcgen05", "fp6_e3m2", "fp4_e2m1", "fp16", 64),
    # the same unit under bf16: only c showed the trees, and the trees probe took 15 for 32
    # (2 / 1,500 in the round trip)
    ("b200-tcgen05", "fp6_e3m2", "fp4_e2m1", "bf16", 64),
]


#: Once-failing paths whose probe takes more than about half a minute: MXSIM_PROBE_LONG only.
ONCE_FAILING_LONG = [
    ("b200-tcgen05-mxf8f6f4", "fp6_e2m3", "fp4_e2m1", "bf16", 64),
    ("mxdotp-rmm", "fp6_e2m3", "fp6_e2m3", "bf16", 64),
    ("b200-tcgen05", "fp6_e2m3", "fp8_e4m3", "bf16", 64),
    ("b200-tcgen05", "fp6_e3m2", "fp4_e2m1", "bf16", 64),
]


@pytest.mark.parametrize(
    "name, a_format, b_format, out_format, k",
    [path for path in ONCE_FAILING_PATHS if LONG or path not in ONCE_FAILING_LONG],
)
def test_round_trip_of_paths_once_failing(name, a_format, b_format, out_format, k):
    _round_trip(load_hwconfig(HW / f"{name}.yaml"), name, a_format, b_format, out_format, k)


def _round_trip(config, name, a_format, b_format, out_format, k):
    unit = HwconfigUnit(config, a_format, b_format, out_format)
    result = probe(
        unit,
        a_format,
        b_format,
        k,
        block_size=unit.block_size,
        out_format=out_format,
        c_format=unit.c_format,
        validation_vectors=1024,
        corner_vectors=256,
    )
    print(
        f"{name} {a_format} x {b_format} -> {out_format}, K = {k}: {result.queries} queries, {result.seconds:.1f} s, "
        f"{result.passes} passes, {result.validation.mismatches} / {result.validation.vectors} mismatches"
    )
    assert result.validation.mismatches == 0, result.validation.examples
    assert result.queries <= 100_000
    emitted = parse_hwconfig(yaml.safe_load(result.yaml), "<emitted>")
    rng = np.random.default_rng(7)
    a, b, (sa, sb), c = _test_vectors(config, a_format, b_format, k, rng)
    scaled = unit.params.scales != "none"
    kwargs = dict(a_format=a_format, b_format=b_format, c=c, out_format=out_format)
    want = dot(
        config, a, b, scale_a=sa if scaled else None, scale_b=sb if scaled else None, **kwargs
    )
    probed_scaled = emitted.params(a_format, b_format, out_format).scales != "none"
    got = dot(
        emitted,
        a,
        b,
        scale_a=sa if probed_scaled else None,
        scale_b=sb if probed_scaled else None,
        **kwargs,
    )
    nan = np.isnan(as_values(want, out_format)) & np.isnan(as_values(got, out_format))
    assert int(np.count_nonzero((want != got) & ~nan)) == 0
    shipped, probed = unit.params, emitted.params(a_format, b_format, out_format)
    assert probed.c_format == shipped.c_format  # inputs.c_format: fp64 for the fp64 units
    if "ieee_steps" in (
        shipped.output_zero_sign,
        probed.output_zero_sign,
    ):  # the zero chains tell it apart
        assert probed.output_zero_sign == shipped.output_zero_sign
    if shipped.scales == "group_sum":
        assert {key: getattr(probed, key) for key in GROUP_KEYS} == {
            key: getattr(shipped, key) for key in GROUP_KEYS
        }
    if shipped.scales == "group_sum" and shipped.scale_format == "e8m0" and out_format == "fp32":
        # Seen only where every nonzero group's scales lie below it beside a zero term (the
        # probe's zero-anchor rows; the random vectors above never meet one). An fp16 output
        # rounds such results away; a bf16 one (steps of 2^-133) shows them only for group
        # sums of 2^6 or more over such scales, which no probe family builds.
        assert probed.zero_term_exponent == shipped.zero_term_exponent
    if (a_format, b_format, out_format, k) == CI_PATHS.get(name):
        decided = AMD_KEYS.get(name, ())
        assert {key: getattr(probed, key) for key in decided} == {
            key: getattr(shipped, key) for key in decided
        }


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
    answer = unit(
        np.array([row["a"]], np.uint64),
        np.array([row["b"]], np.uint64),
        np.array([row["scale_a"]], np.uint8),
        np.array([row["scale_b"]], np.uint8),
        np.array([int(row["c"], 16)], np.uint32),
    )
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

    result = probe(
        saturating, "fp8_e4m3", "fp8_e4m3", 32, validation_vectors=256, corner_vectors=256
    )
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
            assert np.array_equal(
                values.astype(np.float16).astype(np.float32), values, equal_nan=True
            )
        asked.append(len(c))
        return unit(a, b, sa, sb, c)

    result = probe(
        fp16_c_only, "fp16", "fp16", 16, c_format="fp16", validation_vectors=256, corner_vectors=64
    )
    assert sum(asked) == result.queries and result.validation.mismatches == 0


def test_deterministic_for_a_seed():
    unit = HwconfigUnit(HW / "ocp-exact.yaml", "fp4_e2m1", "fp4_e2m1")
    first = probe(unit, "fp4_e2m1", "fp4_e2m1", 32, validation_vectors=256, corner_vectors=64)
    second = probe(unit, "fp4_e2m1", "fp4_e2m1", 32, validation_vectors=256, corner_vectors=64)
    assert first.yaml == second.yaml and first.queries == second.queries
    assert [f.name for f in fields(first.decisions[0])][:3] == ["probe", "keys", "value"]


# ----------------------------------------------------------------------------- fp64 units not from a config


def correctly_rounded_fp64_dot(a, b, scale_a, scale_b, c):
    """An fp64 unit written with Python's own arithmetic: c + sum a_k b_k summed exactly
    (fractions.Fraction) and rounded once to nearest even (float(Fraction)); past fp64's range
    +-Inf; IEEE specials; an exact zero is -0 only when every addend is -0."""
    out = []
    for row_a, row_b, c_value in zip(
        a.view(np.float64).tolist(), b.view(np.float64).tolist(), c.view(np.float64).tolist()
    ):
        pairs = list(zip(row_a, row_b))
        special = [x * y for x, y in pairs if not (math.isfinite(x) and math.isfinite(y))]
        special += [] if math.isfinite(c_value) else [c_value]
        if special:
            out.append(
                math.nan
                if any(math.isnan(v) for v in special) or {math.inf, -math.inf} <= set(special)
                else special[0]
            )
            continue
        total = Fraction(c_value) + sum(Fraction(x) * Fraction(y) for x, y in pairs)
        if total == 0:
            negative = [math.copysign(1, c_value) < 0] + [
                (math.copysign(1, x) < 0) != (math.copysign(1, y) < 0) for x, y in pairs
            ]
            out.append(-0.0 if all(negative) else 0.0)
            continue
        try:
            out.append(float(total))
        except OverflowError:
            out.append(math.inf if total > 0 else -math.inf)
    return np.array(out, dtype=np.float64).view(np.uint64)


def test_fp64_correctly_rounded_dot_is_told_from_the_fma_chain():
    """An independent fp64 unit (one rounding of the exact sum): the probe describes it with
    0 mismatches and an exact accumulator, and the shipped FMA chain (a100-dmma) is another
    unit on the round trip's vectors."""
    result = probe(
        correctly_rounded_fp64_dot,
        "fp64",
        "fp64",
        4,
        out_format="fp64",
        c_format="fp64",
        validation_vectors=1024,
        corner_vectors=256,
    )
    print(
        f"correctly rounded fp64 dot, K = 4: {result.queries} queries, {result.seconds:.1f} s, "
        f"{result.validation.mismatches} / {result.validation.vectors} mismatches"
    )
    assert result.validation.mismatches == 0, result.validation.examples
    assert result.config["accumulator"]["format"] == "exact"
    a, b, (sa, sb), c = _fp64_test_vectors(np.random.default_rng(5), 1500, 4)
    want = correctly_rounded_fp64_dot(a, b, sa, sb, c.view(np.uint64))
    got = dot(
        parse_hwconfig(yaml.safe_load(result.yaml), "<emitted>"),
        a,
        b,
        a_format="fp64",
        b_format="fp64",
        c=c,
    )
    nan = np.isnan(want.view(np.float64)) & np.isnan(got.view(np.float64))
    assert np.count_nonzero((want != got) & ~nan) == 0
    chain = dot(load_hwconfig(HW / "a100-dmma.yaml"), a, b, a_format="fp64", b_format="fp64", c=c)
    assert np.count_nonzero((want != chain) & ~nan) > 50


@pytest.mark.skipif(
    not LONG,
    reason="long mode (MXSIM_PROBE_LONG=1): the searches a unit no key describes runs cost ~8 s",
)
def test_an_fp64_unit_no_key_describes_is_reported():
    """Products rounded to fp64 before each add (no FMA; no key describes a rounded fp64
    product): the validation must count mismatches."""

    def unfused(a, b, scale_a, scale_b, c):
        d = c.view(np.float64).copy()
        with np.errstate(all="ignore"):
            for k in range(a.shape[1]):
                d = a[:, k].view(np.float64) * b[:, k].view(np.float64) + d
        return d.view(np.uint64)

    result = probe(
        unfused,
        "fp64",
        "fp64",
        4,
        out_format="fp64",
        c_format="fp64",
        validation_vectors=512,
        corner_vectors=128,
    )
    assert result.validation.mismatches > 0


# ----------------------------------------------------------------------------- inputs.c_format


def _small_fp16_rows(rng, n, k):
    """Independent vectors where c's format shows: fp16 elements below 2^-8 (exponent field
    up to 6), c an fp16 subnormal or in the lowest normal binades (exponent field up to 2),
    random signs; c as float32 values."""
    sign = lambda shape: rng.integers(0, 2, shape).astype(np.uint64) << np.uint64(15)  # noqa: E731
    a = rng.integers(0, 0x1C00, (n, k)).astype(np.uint64) | sign((n, k))
    b = rng.integers(0, 0x1C00, (n, k)).astype(np.uint64) | sign((n, k))
    c = (
        (rng.integers(0, 0x0C00, n).astype(np.uint64) | sign(n))
        .astype(np.uint16)
        .view(np.float16)
        .astype(np.float32)
    )
    return a, b, c


def test_c_format_is_decided_and_emitted():
    """v100 taking fp16 c (MMA-Sim's Volta m8n8k4 with f16 c: a subnormal fp16 c aligns at
    fp16's emin, 2^-14): the emitted config says inputs.c_format fp16 and reproduces the unit on
    vectors where v100's own fp32 c_format does not."""
    config = load_hwconfig(HW / "v100.yaml")
    unit = HwconfigUnit(config, "fp16", "fp16", "fp32", c_format="fp16")
    result = probe(
        unit, "fp16", "fp16", 4, c_format="fp16", validation_vectors=512, corner_vectors=128
    )
    print(
        f"v100 with fp16 c, K = 4: {result.queries} queries, {result.seconds:.1f} s, "
        f"{result.validation.mismatches} / {result.validation.vectors} mismatches"
    )
    assert result.validation.mismatches == 0, result.validation.examples
    assert result.config["inputs"]["c_format"] == "fp16"
    emitted = parse_hwconfig(yaml.safe_load(result.yaml), "<emitted>")
    a, b, c = _small_fp16_rows(np.random.default_rng(11), 2000, 4)
    kwargs = dict(a_format="fp16", b_format="fp16", c=c, out_format="fp32")
    want = dot(config, a, b, c_format="fp16", **kwargs)
    assert np.array_equal(dot(emitted, a, b, **kwargs), want)
    assert (
        np.count_nonzero(dot(config, a, b, **kwargs) != want) > 20
    )  # fp32 c_format: another unit here


def test_the_validation_corners_catch_a_zero_sign_rule_blind_to_the_steps(monkeypatch):
    """With the zero sign probe given its rows without the zero chains, a100-dmma's rule comes
    out as the whole sum's (ieee); the validation's corners, which hold zero chains, count it
    (no refinement, no polishing). With the polishing rounds, which weigh those corners' answers
    with every other, the rule of the steps is found."""
    import mxsim.probe.core as core
    from mxsim.probe.probes import _families

    blind = tuple(
        dataclasses.replace(p, inputs=_families(zero_results=96, corners=32))
        if p.name == "zero sign"
        else p
        for p in core.PROBES
    )
    monkeypatch.setattr(core, "PROBES", blind)
    unit = HwconfigUnit(HW / "a100-dmma.yaml", "fp64", "fp64", "fp64")
    run = dict(
        out_format="fp64",
        c_format="fp64",
        validation_vectors=256,
        corner_vectors=256,
        refinements=0,
    )
    polished = probe(unit, "fp64", "fp64", 4, **run)
    monkeypatch.setattr(core, "POLISH_ROUNDS", 0)
    result = probe(unit, "fp64", "fp64", 4, **run)
    assert result.config["output"]["zero_sign"] == "ieee"
    assert result.validation.mismatches > 0
    assert all(example["kind"] == "corner" for example in result.validation.examples)
    assert (
        polished.config["output"]["zero_sign"] == "ieee_steps"
        and polished.validation.mismatches == 0
    )


def test_scale_codes_the_unit_refuses_are_evidence_against_the_format_reading_them():
    """A unit reading UE4M3 scales refuses E8M0 codes past 127 (mxsim raises on them): asked a
    batch written in E8M0 over its whole range, the probe records the rows it refuses as
    answers no output has (no ProbeError), asks the others as usual, and from then on keeps
    E8M0 out of every candidate list, so the scale format probe takes UE4M3 back."""
    from mxsim.datapath.schema import SCHEMA, param_field
    from mxsim.probe.core import _Engine
    from mxsim.probe.inputs import Batch, Context
    from mxsim.probe.probes import PROBES
    from mxsim.probe.units import CountingUnit

    unit = HwconfigUnit(HW / "b200-tcgen05-mxf4nvf4.yaml", "fp4_e2m1", "fp4_e2m1", "fp32")
    ctx = Context("fp4_e2m1", "fp4_e2m1", 32, 16, "fp32")  # codes written in E8M0
    engine = _Engine(CountingUnit(unit, "fp32", 10_000), ctx, "probed")
    for path in engine.hyp:  # every key as shipped but the scales, which are E8M0 on products
        section, key = path.split(".")
        engine.hyp[path] = getattr(unit.params, param_field(key, SCHEMA[section][key]))
    engine.hyp.update({"inputs.scales": "products", "inputs.scale_format": "e8m0"})
    batch = Batch.join(
        [ctx.scales(32), ctx.scale_formats(32)]
    )  # the latter's codes: both formats read them
    wide = np.maximum(batch.scale_a.max(axis=1), batch.scale_b.max(axis=1)) > 127
    assert 0 < wide.sum() < len(batch)
    with pytest.raises(ProbeError, match="UE4M3 codes"):
        CountingUnit(unit, "fp32", 10_000)(batch.a, batch.b, batch.scale_a, batch.scale_b, batch.c)
    answers = engine.ask(batch)
    assert np.all(answers[wide] == 1 << 32)  # past fp32's width: no output has it
    narrow = batch.take(np.flatnonzero(~wide))
    assert np.array_equal(
        answers[~wide], unit(narrow.a, narrow.b, narrow.scale_a, narrow.scale_b, narrow.c)
    )
    assert engine.refused == {"e8m0"} and engine.unit.queries == len(narrow)
    scale_format = next(p for p in PROBES if p.name == "scale format")
    decision = engine.decide(
        scale_format, Batch.join([batch, ctx.fit_c(scale_format.inputs(ctx))]), 0
    )
    assert (
        decision.value["inputs.scale_format"] == "ue4m3"
        and decision.value["inputs.scales"] == "group_sum"
    )
    assert decision.mismatches == 0


def test_a_rounding_toward_zero_whose_overflow_is_inf_is_decided_with_it():
    """a100's bf16 path (MMA-Sim's Ampere bf16 -> fp32 model): the accumulator rounded toward
    zero, Inf past its range. bf16 products reach 2^256, so the accumulator probe's rows
    overflow fp32; from the overflow's default (the largest value under a rounding toward
    zero) no rounding alone fits them, and nearest-even was kept (Ampere and Ada bf16 ended
    with 139 mismatches in 2,560). The probe decides the rounding and the overflow together."""
    from mxsim.datapath.schema import SCHEMA, param_field
    from mxsim.probe.core import _Engine
    from mxsim.probe.inputs import Context
    from mxsim.probe.probes import PROBES
    from mxsim.probe.units import CountingUnit

    unit = HwconfigUnit(HW / "a100.yaml", "bf16", "bf16", "fp32")
    ctx = Context("bf16", "bf16", 16, 32, "fp32")
    engine = _Engine(CountingUnit(unit, "fp32", 10_000), ctx, "probed")
    for path in engine.hyp:  # every other key as shipped
        section, key = path.split(".")
        engine.hyp[path] = getattr(unit.params, param_field(key, SCHEMA[section][key]))
    engine.hyp.update({"accumulator.rounding": "nearest_even", "accumulator.overflow": "ieee"})
    accumulator = next(p for p in PROBES if p.name == "accumulator")
    decision = engine.decide(accumulator, ctx.fit_c(accumulator.inputs(ctx)), 0)
    assert decision.mismatches == 0
    assert decision.value == {
        "accumulator.format": "fp32",
        "accumulator.rounding": "toward_zero",
        "accumulator.overflow": "infinity",
    }


def _engine_holding(unit, ctx, changed: dict):
    """A probe engine holding every key as ``unit``'s config has it but ``changed``."""
    from mxsim.datapath.schema import SCHEMA, param_field
    from mxsim.probe.core import _Engine
    from mxsim.probe.units import CountingUnit

    engine = _Engine(CountingUnit(unit, ctx.out_format, 10_000), ctx, "probed")
    for path in engine.hyp:
        section, key = path.split(".")
        engine.hyp[path] = getattr(unit.params, param_field(key, SCHEMA[section][key]))
    engine.hyp.update(changed)
    return engine


def test_the_validation_counts_answers_the_held_hypothesis_misses():
    """Inputs the unit answered earlier in the run (here the grid probe's scaled zeros) on which
    the hypothesis held at the end misses are counted as mismatches and returned; a hypothesis
    that is the unit's misses none."""
    from mxsim.probe.core import Validation, _answered
    from mxsim.probe.inputs import Batch, Context

    unit = HwconfigUnit(HW / "mxdotp-rmm.yaml", "fp6_e3m2", "fp6_e3m2", "fp32")
    ctx = Context("fp6_e3m2", "fp6_e3m2", 64, 32, "fp32", seed=4)
    batch = ctx.fit_c(Batch.join([ctx.realistic(64), ctx.scaled_zeros(64)]))
    clean = Validation(1280, 1024, 256, 0, 0, [])
    engine = _engine_holding(unit, ctx, {})
    answers = engine.ask(batch)
    assert _answered(engine, clean)[0] == clean
    engine = _engine_holding(unit, ctx, {"grid.fraction_bits": 18})
    engine.ask(batch)
    held = dot(
        parse_hwconfig(engine.data(engine.hyp), "<held>"),
        batch.a,
        batch.b,
        scale_a=batch.scale_a,
        scale_b=batch.scale_b,
        a_format="fp6_e3m2",
        b_format="fp6_e3m2",
        c=batch.c.view(np.float32),
    )
    wrong = np.flatnonzero(held != answers)
    assert wrong.size
    validation, missed = _answered(engine, clean)
    assert validation.answered == validation.mismatches == len(missed) == wrong.size
    assert validation.vectors == clean.vectors and engine.unit.queries == len(
        batch
    )  # nothing more asked
    assert np.array_equal(missed.c, batch.c[wrong]) and all(
        e["kind"] == "answered" for e in validation.examples
    )


def test_polishing_takes_the_value_fewest_answers_rule_out():
    """An engine holding mxdotp-rmm's E3M2 path with a grid of 18 fraction bits for 34, its
    answers those of the grid probe's rows: each key again against all answers takes a grid
    missing none of them and records why; a hypothesis missing nothing is left as it is."""
    from mxsim.probe.inputs import Batch, Context
    from mxsim.probe.probes import PROBES

    unit = HwconfigUnit(HW / "mxdotp-rmm.yaml", "fp6_e3m2", "fp6_e3m2", "fp32")
    ctx = Context("fp6_e3m2", "fp6_e3m2", 64, 32, "fp32", seed=4)
    grid = next(p for p in PROBES if p.name == "grid")
    engine = _engine_holding(unit, ctx, {"grid.fraction_bits": 18})
    engine.ask(ctx.fit_c(Batch.join([grid.inputs(ctx), ctx.scaled_zeros(64)])))
    decisions = {}
    batch, answers = engine.answered()
    engine.polish(PROBES, decisions)
    assert engine.hyp["grid.fraction_bits"] != 18 and list(decisions) == ["grid"]
    assert (
        decisions["grid"].mismatches == 0
        and "the value before" in decisions["grid"].evidence["note"]
    )
    held = dot(
        parse_hwconfig(engine.data(engine.hyp), "<held>"),
        batch.a,
        batch.b,
        scale_a=batch.scale_a,
        scale_b=batch.scale_b,
        a_format="fp6_e3m2",
        b_format="fp6_e3m2",
        c=batch.c.view(np.float32),
    )
    assert np.array_equal(held, answers)
    held = dict(engine.hyp)
    engine.polish(PROBES, decisions)
    assert engine.hyp == held and engine.unit.queries == len(batch)  # no query asked


def test_a_grid_width_moves_with_its_left_shift_to_the_unit_s_grid():
    """mxdotp-rdn's E2M3 path at K = 11 (a grid of 34 fraction bits, left shift 70, right 24)
    held with a grid of 9 and a left shift of 45: the left shift less the width right (36),
    the right shift plus the width not (33 for 58). Each width carries the left shift with it,
    so the grid probe's rows (the scaled zeros sweeping every scale exponent) find the unit's
    grid exactly; with the shift held, no width fitted both and the search swung between
    widths. The c entry probe then keeps the grid (its rows read it as c in an exact tree)."""
    from mxsim.probe.inputs import Context
    from mxsim.probe.probes import PROBES

    unit = HwconfigUnit(HW / "mxdotp-rdn.yaml", "fp6_e2m3", "fp6_e2m3", "fp32")
    ctx = Context("fp6_e2m3", "fp6_e2m3", 11, 32, "fp32")
    engine = _engine_holding(
        unit,
        ctx,
        {"grid.fraction_bits": 9, "grid.accumulator_max_left_shift": 45},
    )
    grid, c_entry = (next(p for p in PROBES if p.name == name) for name in ("grid", "c entry"))
    decision = engine.decide(grid, ctx.fit_c(grid.inputs(ctx)), 0)
    assert decision.mismatches == 0
    assert (
        decision.value["grid.fraction_bits"],
        engine.hyp["grid.accumulator_max_left_shift"],
    ) == (
        34,
        70,
    )
    decision = engine.decide(c_entry, ctx.fit_c(c_entry.inputs(ctx)), 0)
    assert decision.value["adder.accumulator_in_tree"] is False
    assert engine.hyp["grid.fraction_bits"] == 34


def test_a_grid_is_decided_while_the_trees_held_do_not_divide_the_block():
    """mxdotp-rup's E3M2 path with fp16 output: a grid of 34 fraction bits over trees of 11
    restarting at each block of 32. The trees probe, whose rows an fp16 output rounds alike,
    may hold trees of 11 cut from the whole of K; a grid takes one scale per tree, so the grid
    probe offers each grid with the trees restarting at each block (else every grid candidate
    is refused by the loader's checks and the probe keeps no grid)."""
    from mxsim.probe.inputs import Context
    from mxsim.probe.probes import PROBES

    unit = HwconfigUnit(HW / "mxdotp-rup.yaml", "fp6_e3m2", "fp6_e3m2", "fp16")
    ctx = Context("fp6_e3m2", "fp6_e3m2", 64, 32, "fp16")
    engine = _engine_holding(
        unit, ctx, {"grid.fraction_bits": None, "adder.trees_in_blocks": False}
    )
    grid = next(p for p in PROBES if p.name == "grid")
    decision = engine.decide(grid, ctx.fit_c(grid.inputs(ctx)), 0)
    assert decision.mismatches == 0  # 30..34 fraction bits alike on these rows under an fp16 output
    assert (
        decision.value["grid.fraction_bits"] is not None
        and decision.value["adder.trees_in_blocks"] is True
    )


@pytest.mark.parametrize(
    "outside",
    [
        {**GRID_NEEDS, "grid.fraction_bits": 5},  # a grid: exact trees, c outside them
        {
            "accumulator.c_entry": "end",
            "accumulator.c_add_rounding": "toward_zero",
            "adder.align_fraction_bits": None,
        },
    ],
    ids=["grid", "c at the end"],
)
def test_a_window_cutting_c_alone_is_found_while_c_is_held_outside_the_trees(outside):
    """b200-tcgen05 E3M2 x E2M1 -> fp16: products exact in any window, c in the first tree,
    where the 25-bit truncating window cuts a tiny c. A hypothesis holding c outside the
    trees (a grid; or c added at the end, whose rounding toward zero imitates the cut) fits
    nearly every row; the window probe offers each window with c in the first tree as well,
    since a window with c still outside reaches no c (before, the probe kept the grid and its
    config missed 2 / 1,500 round-trip vectors, and MMA-Sim's RTX Blackwell f8f6f4
    E2M1 x E4M3 -> f16 ended with c at the end, 29 / 2,562)."""
    from mxsim.probe.inputs import Context
    from mxsim.probe.probes import PROBES

    unit = HwconfigUnit(HW / "b200-tcgen05.yaml", "fp6_e3m2", "fp4_e2m1", "fp16")
    ctx = Context("fp6_e3m2", "fp4_e2m1", 64, 32, "fp16")
    engine = _engine_holding(unit, ctx, outside)
    window = next(p for p in PROBES if p.name == "window")
    decision = engine.decide(window, window.inputs(ctx), 0)
    assert decision.mismatches == 0
    assert (
        decision.value["adder.align_fraction_bits"] == 25
        and decision.value["adder.below_window"] == "truncate"
    )
    assert (
        decision.value["adder.accumulator_in_tree"] is True
        and decision.value["accumulator.c_entry"] == "initial"
    )
    assert decision.value["grid.fraction_bits"] is None


def test_the_targeted_validation_finds_rows_a_bf16_output_hides():
    """b200-tcgen05's tf32 x E3M2 -> bf16 path held as 4-term interleaved trees with a 27-bit
    window (what the probe once emitted for its 8-term trees with a 25-bit truncating one): the
    validation's fresh random vectors count nothing, the targeted rows (where the equivalent
    8-term trees disagree with the held ones, c cancelling the sum's top) show the unit apart."""
    from mxsim.datapath.schema import SCHEMA, param_field
    from mxsim.probe.core import Decision, _Engine, _targeted, _validate
    from mxsim.probe.inputs import Context
    from mxsim.probe.units import CountingUnit

    unit = HwconfigUnit(
        any_pair("b200-tcgen05"), "tf32", "fp6_e3m2", "bf16"
    )  # a pair no instruction takes
    engine = _Engine(
        CountingUnit(unit, "bf16", 10_000), Context("tf32", "fp6_e3m2", 64, 32, "bf16"), "probed"
    )
    for path in engine.hyp:
        section, key = path.split(".")
        engine.hyp[path] = getattr(unit.params, param_field(key, SCHEMA[section][key]))
    engine.hyp.update(
        {
            "adder.fused_terms": 4,
            "adder.term_order": (0, 2, 4, 6, 1, 3, 5, 7),
            "adder.align_fraction_bits": 27,
            "adder.below_window": "nearest_even",
            "adder.sum_significant_bits": 25,
            "adder.accumulator_exponent": "leading_bit",
            "adder.zero_term_exponent": None,
            "accumulator.rounding": "nearest_even",
            "accumulator.overflow": "ieee",
        }
    )
    validation, _ = _validate(engine, 1, 1024, 256)
    assert validation.mismatches == 0
    trees = Decision(
        "trees",
        ("adder.fused_terms", "adder.term_order"),
        {},
        2,
        0,
        equivalent=[{"adder.fused_terms": 8, "adder.term_order": None}],
    )
    targeted, missed = _targeted(engine, [trees], 7, validation, overflow_rows=0)
    assert 0 < targeted.targeted <= 4 and targeted.mismatches == len(missed) > 0
    assert targeted.vectors == validation.vectors + targeted.targeted
    assert all(example["kind"] == "targeted" for example in targeted.examples)
    # with the partial overflows beside them: up to 4 rows more, and they too show the unit apart
    # (the interleaved 4-term trees round a partial sum that overflows with the other sign)
    with_overflows, missed = _targeted(engine, [trees], 7, validation)
    assert targeted.targeted < with_overflows.targeted <= targeted.targeted + 4
    assert with_overflows.mismatches == len(missed) > targeted.mismatches


def test_an_accumulator_rounding_a_bf16_output_hides_is_kept():
    """v100's fp16 -> bf16 path (an fp32 accumulator rounded toward zero each step, the output
    rounded toward zero into bf16): on the accumulator probe's rows the 8-bit output hides the
    accumulator's last bit, so nearest-even fits them as well. Listed first, it replaced the
    rounding toward zero the coarse start had found on realistic rows, and the later probes bent
    to it (14 mismatches in 1,280). Where the output is narrower than the accumulator held, the
    value held is listed first and stays."""
    from mxsim.datapath.schema import SCHEMA, param_field
    from mxsim.probe.core import _Engine
    from mxsim.probe.inputs import Batch, Context
    from mxsim.probe.probes import PROBES
    from mxsim.probe.units import CountingUnit

    unit = HwconfigUnit(HW / "v100.yaml", "fp16", "fp16", "bf16")
    ctx = Context("fp16", "fp16", 64, 32, "bf16")
    engine = _Engine(CountingUnit(unit, "bf16", 10_000), ctx, "probed")
    for path in engine.hyp:  # every key as shipped
        section, key = path.split(".")
        engine.hyp[path] = getattr(unit.params, param_field(key, SCHEMA[section][key]))
    accumulator = next(p for p in PROBES if p.name == "accumulator")
    # its mixed rows alone: its last rows (output and cancelled ties) tell nearest-even apart
    rows = ctx.fit_c(Batch.join([ctx.ties(256), ctx.realistic(64), ctx.uniform(64)]))
    decision = engine.decide(accumulator, rows, 0)
    assert {
        "accumulator.format": "fp32",
        "accumulator.rounding": "nearest_even",
    } in decision.equivalent
    assert decision.mismatches == 0
    assert decision.value == {"accumulator.format": "fp32", "accumulator.rounding": "toward_zero"}


def test_polishing_a_hypothesis_missing_every_answer():
    """A constant fp64 box (every answer 1.0): the held hypothesis misses every answer, so no
    row is left to weigh a candidate on beyond those it misses; polishing still runs and
    leaves a hypothesis missing no more answers than before."""
    from mxsim.probe.inputs import Context
    from mxsim.probe.probes import PROBES
    from mxsim.probe.units import CountingUnit

    unit = HwconfigUnit(HW / "mi250-f64.yaml", "fp64", "fp64", "fp64", "fp64")
    ctx = Context("fp64", "fp64", 4, 32, "fp64", seed=3, c_format="fp64")
    engine = _engine_holding(unit, ctx, {})
    engine.unit = CountingUnit(
        lambda a, b, sa, sb, c: np.full(len(a), 0x3FF0000000000000, np.uint64), "fp64", 10_000
    )
    engine.ask(ctx.fit_c(ctx.realistic(64)))
    batch, answers = engine.answered()
    before = int(np.count_nonzero(engine.misses(engine.hyp, batch, answers)))
    assert before == len(batch)  # the case: every answer missed
    engine.polish(PROBES, {})
    assert int(np.count_nonzero(engine.misses(engine.hyp, batch, answers))) <= before


# ----------------------------------------------------------------------------- never lose a result


def test_trees_at_k_11_hold_group_sums_of_a_size_they_take():
    """K = 11 (an FP6 unit's width) with group sums of the default 16 held: every tree size up
    to 11 forms a valid config with a group size that divides it and the block, and is offered
    so; none is left out for the group size held (the probe used to end there)."""
    from mxsim.probe.inputs import Context
    from mxsim.probe.probes import PROBES

    unit = HwconfigUnit(HW / "mxdotp.yaml", "fp6_e3m2", "fp6_e3m2", "fp32")
    ctx = Context("fp6_e3m2", "fp6_e3m2", 11, 32, "fp32", seed=0)
    engine = _engine_holding(
        unit,
        ctx,
        {
            "inputs.scales": "group_sum",
            "adder.group_terms": 16,
            "grid.fraction_bits": None,
            "adder.fused_terms": 32,
            "adder.trees_in_blocks": False,
        },
    )
    trees = next(p for p in PROBES if p.name == "trees")
    offered = [
        c for c in engine.candidates(trees) if engine.params({**engine.hyp, **c}) is not None
    ]
    assert {c["adder.fused_terms"] for c in offered} >= {2, 4, 8}
    decision = engine.decide(trees, ctx.fit_c(trees.inputs(ctx)), 0)
    assert engine.params(engine.hyp) is not None and decision.probe == "trees"


def test_trees_of_a_k_the_block_does_not_divide_are_offered_with_a_grid():
    """K = 11 under a grid (one scale per tree): trees of 11 are offered restarting at each
    block (alike within one block, and what a grid admits), before the sizes dividing the block."""
    from mxsim.probe.inputs import Context
    from mxsim.probe.probes import PROBES

    unit = HwconfigUnit(HW / "mxdotp.yaml", "fp6_e3m2", "fp6_e3m2", "fp32")
    engine = _engine_holding(unit, Context("fp6_e3m2", "fp6_e3m2", 11, 32, "fp32", seed=0), {})
    trees = next(p for p in PROBES if p.name == "trees")
    valid = [
        c["adder.fused_terms"]
        for c in engine.candidates(trees)
        if engine.params({**engine.hyp, **c}) is not None
    ]
    assert 11 in valid and valid.index(11) < valid.index(8)


def test_yaml_comments_are_the_config_s_values():
    """The header is written from the config: a decision whose value a later probe changed
    (promotion 20, then null) and which missed answers mid-search is shown with the config's
    value and no claim of misses when the validation counts none."""
    from mxsim.probe.core import Decision, Validation, emit_yaml

    config = {
        "mxsim_hwconfig": 1,
        "name": "x",
        "inputs": {"a_formats": ["fp8_e4m3"], "b_formats": ["fp8_e4m3"]},
        "accumulator": {"promotion_interval": None},
        "adder": {"fused_terms": 8},
        "output": {"format": "fp32"},
    }
    decision = Decision(
        "trees",
        ("adder.fused_terms", "accumulator.promotion_interval"),
        {"adder.fused_terms": 8, "accumulator.promotion_interval": 20},
        10,
        100,
        mismatches=149,
    )
    text = emit_yaml(config, [decision], Validation(100, 80, 20, 0, 0, []), 1000)
    assert_comments_agree(text)
    assert "149" not in text and "20" not in text.split("trees:")[1].split("\n")[0]


def assert_comments_agree(text: str) -> None:
    """Every ``key=value`` a header line names is the value the YAML body holds (its default if unset)."""
    import json
    import re

    from mxsim.datapath.schema import SCHEMA

    body = yaml.safe_load(text)
    named = 0
    for line in text.splitlines():
        if not line.startswith("#   "):
            continue
        for path, value in re.findall(r"(\w+\.\w+)=((?:\[[^\]]*\])|(?:\"[^\"]*\")|[^,\s)]+)", line):
            section, key = path.split(".")
            assert json.loads(value) == body.get(section, {}).get(
                key, SCHEMA[section][key].default
            ), line
            named += 1
    assert named


# ----------------------------------------------------------------------------- rounding modes


def test_a_key_alike_under_the_rounding_probed_only_is_named():
    """mxdotp's E4M3 path at K = 8 holding a grid of 33 fraction bits, with 34 left equivalent:
    alike under nearest-even, not toward zero (its RTZ view, mxdotp-rtz, holds 34), so the
    grid is named with the modes it differs under; a value differing under none is not."""
    from mxsim.probe.core import Decision, _rounding_only
    from mxsim.probe.inputs import Context

    unit = HwconfigUnit(HW / "mxdotp.yaml", "fp8_e4m3", "fp8_e4m3", "fp32")
    engine = _engine_holding(
        unit, Context("fp8_e4m3", "fp8_e4m3", 8, 32, "fp32", seed=0), {"grid.fraction_bits": 33}
    )
    grid = Decision(
        "grid",
        ("grid.fraction_bits",),
        {"grid.fraction_bits": 33},
        80,
        10,
        equivalent=[{"grid.fraction_bits": 34}],
    )
    shift = Decision(
        "grid reach",
        ("grid.accumulator_max_left_shift",),
        {"grid.accumulator_max_left_shift": 70},
        160,
        10,
        equivalent=[{"grid.accumulator_max_left_shift": 70}],
    )
    found = _rounding_only(engine, [grid, shift], seed=5)
    assert [(e["key"], e["held"], e["others"]) for e in found] == [("grid.fraction_bits", 33, [34])]
    assert (
        "toward_zero" in found[0]["differs_under"]
        and "nearest_even" not in found[0]["differs_under"]
    )
    # and the RTZ unit itself: 34 is right, 33 is not
    rtz = HwconfigUnit(HW / "mxdotp-rtz.yaml", "fp8_e4m3", "fp8_e4m3", "fp32")
    assert rtz.params.grid_fraction_bits == 34


@pytest.mark.parametrize("out_format", ["fp16", "bf16", "fp32", "fp64"])
def test_scalar_comparison_agrees_with_the_array_comparison(out_format):
    from mxsim.formats import get_format
    from mxsim.probe.core import _differs, _same

    fmt = get_format(out_format)
    rng = np.random.default_rng(5)
    nan = ((1 << fmt.exponent_bits) - 1) << fmt.mantissa_bits
    specials = [
        0,
        1,
        nan,
        nan | 1,
        nan | (1 << (fmt.mantissa_bits - 1)),
        1 << (fmt.bits - 1) | nan | 3,
        (1 << fmt.bits) - 1,
        1 << fmt.bits if fmt.bits < 64 else 0x0123456789ABCDEF,
    ]
    rows = [
        int(x) for x in rng.integers(0, 1 << min(fmt.bits, 63), 300, dtype=np.uint64)
    ] + specials
    pairs = [(p, a) for p in rows[-40:] + specials for a in rows[-60:] + specials] + list(
        zip(rows, rows[1:])
    )
    predicted = np.array([p for p, _ in pairs], np.uint64)
    answers = np.array([a for _, a in pairs], np.uint64)
    expected = ~_differs(predicted, answers, out_format)
    assert [_same(p, a, out_format) for p, a in pairs] == expected.tolist()
    assert expected.sum() > len(specials)  # NaN pairs with different payloads count as the same


def test_each_probe_draws_its_rows_from_its_own_stream():
    """A probe's rows (its last rows and, once the late probes run, its settled rows included)
    are the same whichever probes drew before it, or none: adding, removing or reordering probes
    moves no other probe's rows. Another seed draws other rows."""
    from mxsim.probe.core import _Engine, _Search
    from mxsim.probe.inputs import Context
    from mxsim.probe.probes import PROBES
    from mxsim.probe.units import CountingUnit

    def rows(order, seed=0):
        ctx = Context("fp8_e4m3", "fp8_e4m3", 11, 32, "fp16", seed=seed)
        search = _Search(
            _Engine(CountingUnit(lambda *_: None, "fp16", 1), ctx, "probed"),
            ctx,
            seed,
            64,
            16,
            2,
            4,
        )
        search.late = True
        return {p.name: search.inputs(p) for p in order}

    watched = [p for p in PROBES if p.name in ("trees", "window")]  # settled rows, last rows
    every = rows([PROBES[0], *watched])
    alone = rows(watched[::-1])
    for name in ("trees", "window"):
        assert all(
            np.array_equal(getattr(every[name], f), getattr(alone[name], f))
            for f in ("a", "b", "scale_a", "scale_b", "c")
        )
    assert not np.array_equal(rows([PROBES[0]], seed=1)[PROBES[0].name].a, every[PROBES[0].name].a)
