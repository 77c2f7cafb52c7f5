"""The generated RTL against mxsim: golden vectors (mxsim.dot's bits) through Icarus Verilog and
Verilator, every output bit compared; and mxsim probe recovering a generated unit.

CI runs a representative subset: an exact tree and a fixed-point grid under Icarus (K = one
block), a windowed tree with c in the window and a normalised sum under Verilator (K = 8, a partial
tree: Verilator's C++ compile grows with the unit), a GPU fp16 unit (fields decode), an NVFP4
group-sum unit, an exact tree across sub-block scales (bfp-exact), an fp32 and an fp64 FMA chain
(ieee_steps zeros) and a promoting unit under Icarus, three variant units of keys no shipped config
uses (``VARIANTS``) under Icarus, and the fields decode of fp16 and bf16 on every code.
``MXSIM_RTL_LONG=1`` runs every format pair of every shipped config the generator covers (one
per distinct parameter set), at K = one and two blocks (or trees, where a tree spans several
blocks), under both simulators, with 1000 random vectors, the corner list, and the
exhaustive list for 4-bit pairs, and the variant units under both simulators;
``MXSIM_RTL_LONG=PATTERN[,PATTERN]`` only the configs (variant ids) whose name matches a pattern.
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
from mxsim.formats import get_format
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
    config: str | dict,
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
    if isinstance(config, dict):  # a config's YAML data
        hw, config = parse_hwconfig(config, f"{config['name']}.yaml"), config["name"]
    else:
        hw = load_hwconfig(REPO / "hwconfigs" / f"{config}.yaml")
    if changes:
        hw = vary_hwconfig(hw, changes, f"{config}-varied")
    unit = generate_unit(hw, *pair, k, pipeline=pipeline)
    out = tmp_path / f"{config}-{pair[0]}x{pair[1]}-{unit.dot_length}"
    if any(get_format(f).padding_bits for f in pair):
        # golden files hold no padded codes (tf32): the vectors come from mxsim.dot directly
        files = padded_vectors(hw, unit, out, cases)
        counts = {f.name: cases for f in files}
    else:
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
            Path(e["vectors"]).name: e["count"]
            for u in manifest["units"]
            for e in u["files"].values()
        }
    results = simulate(unit, files, simulator, work_dir=tmp_path)
    for name, result in results.items():
        assert result.failed == 0, f"{config} {pair} K={unit.dot_length} {name}: {result.failures}"
        assert result.passed == counts[name] > 0 or (
            result.passed == counts[name] == 0 and cases == 0
        )
    return {name: (r.passed, r.failed) for name, r in results.items()}


def padded_vectors(hw, unit, out: Path, cases: int) -> list[Path]:
    """Vectors for a pair with padded codes (tf32), in the golden layout, expected bits from
    mxsim.dot. Element codes (padding 0): 45 % with exponents over a quarter of the range each
    way, 53.5 % near one (exponents within 4 binades: cancellation and carries), 1.5 % edge
    values (zeros, the smallest subnormal and normal); one vector in ten gets the largest finite
    value, an Inf or a NaN; c: 80 % normal-distributed, 20 % zeros, edges and specials."""
    from mxsim.rtl.simulate import vector_fields

    p, k = unit.params, unit.dot_length
    assert p.scales == "none" and p.c_format == "fp32", "padded codes: a scale-free fp32-c unit"
    rng = np.random.default_rng(7)

    def codes(name: str) -> np.ndarray:
        fmt = get_format(name)
        live = fmt.bits - fmt.padding_bits
        m, sign = fmt.mantissa_bits, np.uint64(1 << (live - 1))
        edges = np.array([0, 1, 1 << m], dtype=np.uint64)
        # exponents over a quarter of the range each way: sums of products rarely overflow
        uniform = (
            rng.integers(fmt.bias - fmt.bias // 4, fmt.bias + fmt.bias // 4 + 1, (cases, k)).astype(
                np.uint64
            )
            << np.uint64(m)
        ) | rng.integers(0, 1 << m, (cases, k), dtype=np.uint64)
        uniform |= np.where(rng.random((cases, k)) < 0.5, sign, np.uint64(0))
        near = (
            rng.integers(fmt.bias - 4, fmt.bias + 5, (cases, k)).astype(np.uint64) << np.uint64(m)
        ) | rng.integers(0, 1 << m, (cases, k), dtype=np.uint64)
        near |= np.where(rng.random((cases, k)) < 0.5, sign, np.uint64(0))
        edge = edges[rng.integers(0, len(edges), (cases, k))] | np.where(
            rng.random((cases, k)) < 0.5, sign, np.uint64(0)
        )
        pick = rng.random((cases, k))
        x = np.where(pick < 0.45, uniform, np.where(pick < 0.985, near, edge))
        # the largest finite value, Inf, -Inf, a NaN
        special = np.array(
            [
                (1 << (live - 1)) - (1 << m) - 1,
                (1 << (live - 1)) - (1 << m),
                (1 << live) - (1 << m),
                (1 << (live - 1)) - 1,
            ],
            np.uint64,
        )
        rows = np.flatnonzero(rng.random(cases) < 0.1)
        x[rows, rng.integers(0, k, len(rows))] = special[rng.integers(0, len(special), len(rows))]
        return x << np.uint64(fmt.padding_bits)

    a, b = codes(p.a_format), codes(p.b_format)
    c_edges = np.array(
        [0, 0x80000000, 1, 0x00800000, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000], np.uint32
    )
    c = np.where(
        rng.random(cases) < 0.8,
        rng.standard_normal(cases).astype(np.float32).view(np.uint32),
        c_edges[rng.integers(0, len(c_edges), cases)],
    ).view(np.float32)
    d = dot(hw, a, b, a_format=p.a_format, b_format=p.b_format, c=c)
    out_fmt = get_format(p.output_format)
    special = ((d >> out_fmt.mantissa_bits) & ((1 << out_fmt.exponent_bits) - 1)) == (
        1 << out_fmt.exponent_bits
    ) - 1
    assert special.mean() < 0.35, "the vectors must mostly give finite results"
    values = {"a": a, "b": b, "c": c.view(np.uint32), "d": d}
    out.mkdir(parents=True)
    lines = []
    for row in range(cases):
        word = 0
        for name, lsb, bits in vector_fields(unit):
            if name in ("a", "b"):
                w = bits // k
                field = sum(int(x) << (w * i) for i, x in enumerate(values[name][row]))
            else:
                field = int(values[name][row])
            word |= field << lsb
        lines.append(f"{word:x}")
    path = out / "random-and-edges.hex"
    path.write_text("\n".join(lines) + "\n")
    return [path]


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
    # fp16 elements decoded by their fields; c in a 25-bit window, truncated; K = 16, one tree
    ("h100", ("fp16", "fp16"), 16, "iverilog", {"inputs.block_size": 16}),
    # scales: group_sum with UE4M3 scales: one exact group of 16, scaled, in a 35-bit window
    ("b200-nvfp4", ("fp4_e2m1", "fp4_e2m1"), 16, "iverilog", None),
    # an exact tree across sub-block scales (the grid spans the E8M0 exponents); K = 4, two
    # sub-blocks in a partial tree (the grid's width does not depend on K)
    ("bfp-exact", ("mx6", "mx4"), 4, "iverilog", None),
    # output.zero_sign: ieee_steps, an fp32 FMA chain; K = 8
    ("mi100", ("fp32", "fp32"), 8, "iverilog", {"inputs.block_size": 8}),
    # fp64 elements, c, accumulator and output (64-bit c port), ieee_steps; K = 4
    ("a100-dmma", ("fp64", "fp64"), 4, "iverilog", {"inputs.block_size": 4}),
    # CDNA3's second alignment: each 8-term tree's 24-bit window sum meets the accumulator at
    # max(R, e), both kept toward -inf, cut to 32 bits; K = 16, two trees
    ("mi300", ("fp16", "fp16"), 16, "iverilog", {"inputs.block_size": 16}),
    # CDNA2's pairwise IEEE adds ((p0+p1)+(p2+p3), then acc + s, each rounded into fp32 and
    # flushed) with zeros and tiny c read as +0; K = 8, two trees of 4
    ("mi250", ("fp16", "fp16"), 8, "iverilog", {"inputs.block_size": 8}),
    # multiplier.overflow_exponent: products of 2^4 and more are +-Inf (most random ones here)
    (
        "h100",
        ("fp16", "fp16"),
        8,
        "iverilog",
        {"inputs.block_size": 8, "multiplier.overflow_exponent": 4},
    ),
    # promotion into the outer fp32 accumulator after 16 products and at the end: four trees
    (
        "h100-fp8-promoted",
        ("fp8_e4m3", "fp8_e4m3"),
        32,
        "iverilog",
        {"accumulator.promotion_interval": 16, "adder.fused_terms": 8},
    ),
    # align_reference: leading_bit (each product aligned at floor(log2|p|)); K = 8
    (
        "h100-fp8",
        ("fp8_e4m3", "fp8_e5m2"),
        8,
        "iverilog",
        {"inputs.block_size": 8, "adder.align_reference": "leading_bit"},
    ),
    # scales: block_sum with a window: the tree's sum times the block scale (the products
    # aligned unscaled, against zero_term_exponent -133); K = 32, the accumulator outside
    (
        "b200-tcgen05-mxf8f6f4",
        ("fp8_e4m3", "fp8_e5m2"),
        32,
        "iverilog",
        {"inputs.scales": "block_sum", "adder.accumulator_in_tree": False},
    ),
    # promotion from a bf16 accumulator (trees of 4, every 8 products) into the fp32 one; K = 16
    (
        "h100-fp8-promoted",
        ("fp8_e4m3", "fp8_e4m3"),
        16,
        "iverilog",
        {
            "accumulator.promotion_interval": 8,
            "adder.fused_terms": 4,
            "accumulator.format": "bf16",
            "inputs.block_size": 16,
        },
    ),
]


@pytest.mark.parametrize(
    "config,pair,k,simulator,changes",
    CI_UNITS,
    ids=[u[0] + ("-varied" if u[4] and len(u[4]) > 1 else "") for u in CI_UNITS],
)
def test_generated_unit_equals_mxsim_on_golden_vectors(
    tmp_path, config, pair, k, simulator, changes
):
    prove(tmp_path, config, pair, k, simulator, cases=100, changes=changes)


def _mi300_alone(formats: list, name: str, inputs: dict, adder: dict) -> dict:
    """mi300's path of one format group alone (its override, if any, made the base), with
    ``inputs`` and ``adder`` keys changed."""
    data = yaml.safe_load((REPO / "hwconfigs" / "mi300.yaml").read_text())
    override = next((o for o in data.pop("overrides") if o.get("a_format") == formats), {})
    data["inputs"].update(a_formats=formats, b_formats=formats, format_groups=[formats], **inputs)
    data["adder"].update(override.get("adder", {}), **adder)
    data["name"] = name
    return data


def _fp8_mi300(special_exponent: int) -> dict:
    """mi300's FP8 path alone with special_accumulator_exponent changed: a NaN or Inf
    accumulator is dropped under products of 2^(e + 26) and more, which the shipped -1 never
    meets (FP8 fnuz products stay below 2^24)."""
    return _mi300_alone(
        ["fp8_e4m3fnuz", "fp8_e5m2fnuz"],
        f"mi300-fp8-special{special_exponent}",
        {"block_size": 32},
        {"special_accumulator_exponent": special_exponent},
    )


def test_parity_windows_and_a_dropped_special_accumulator_equal_mxsim(tmp_path):
    """CDNA3's FP8 unit: even and odd products in two windows, the second alignment with a
    far accumulator dropped, and a NaN/Inf c or running sum dropped at exponent -30 (K = 32,
    two trees of 16)."""
    prove(tmp_path, _fp8_mi300(-30), ("fp8_e4m3fnuz", "fp8_e5m2fnuz"), 32, "iverilog", cases=100)


#: units of keys no shipped config uses, each built on a shipped config's path: (id, config
#: or YAML data, pair, K, vector kinds, changes)
VARIANTS = [
    # FP8, parity windows, a dropped special accumulator: each tree's R and window sums times
    # its block's scale (scales: block_sum, 16-element blocks), the products aligned at their
    # leading bits; K = 16, one tree
    (
        "mi300-fp8-block-sum-leading-bit",
        _mi300_alone(
            ["fp8_e4m3fnuz", "fp8_e5m2fnuz"],
            "mi300-fp8-block-sum-leading-bit",
            {"block_size": 16, "scales": "block_sum"},
            {"special_accumulator_exponent": -30, "align_reference": "leading_bit"},
        ),
        ("fp8_e4m3fnuz", "fp8_e5m2fnuz"),
        16,
        ("random", "corners"),
        None,
    ),
    # fp16, one window per tree: R and the sum times the block's scale before the second
    # alignment (scales: block_sum, 8-element blocks); K = 16, two trees
    (
        "mi300-fp16-block-sum",
        _mi300_alone(
            ["fp16"], "mi300-fp16-block-sum", {"block_size": 8, "scales": "block_sum"}, {}
        ),
        ("fp16", "fp16"),
        16,
        ("random", "corners"),
        None,
    ),
    # promotion from an fp64 accumulator with an fp64 c: the outer fp32 accumulator starts as
    # c, so its first add reads 64 bits; K = 8, trees of 2 promoted every 4 products and at
    # the end. Random vectors only (the corner list is built around an fp32 c)
    (
        "h100-fp8-promoted-fp64",
        "h100-fp8-promoted",
        ("fp8_e4m3", "fp8_e4m3"),
        8,
        ("random",),
        {
            "accumulator.format": "fp64",
            "accumulator.promotion_interval": 4,
            "adder.fused_terms": 2,
            "inputs.c_format": "fp64",
            "inputs.block_size": 8,
        },
    ),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_variant_unit_equals_mxsim_on_golden_vectors(tmp_path, variant):
    _, config, pair, k, kinds, changes = variant
    prove(tmp_path, config, pair, k, "iverilog", 100, kinds, changes=changes)


@pytest.mark.skipif(not LONG, reason="the long RTL run: MXSIM_RTL_LONG=1 (docs/rtl.md)")
@pytest.mark.parametrize("simulator", ["iverilog", "verilator"])
@pytest.mark.parametrize("variant", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_long_variant_unit(tmp_path, variant, simulator):
    """The variant units with 1000 random vectors under both simulators (with
    MXSIM_RTL_LONG=PATTERN[,...]: those whose id matches)."""
    name, config, pair, k, kinds, changes = variant
    if LONG != "1" and not any(fnmatch.fnmatch(name, p) for p in LONG.split(",")):
        pytest.skip(f"{name} does not match MXSIM_RTL_LONG={LONG}")
    counts = prove(tmp_path, config, pair, k, simulator, 1000, kinds, changes=changes)
    print(name, simulator, counts)


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


def test_every_shipped_config_is_covered():
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
        "bfp-exact",
        "b200-nvfp4",
        "b200-tcgen05-mxf4",
        "b200-tcgen05-mxf4nvf4",
        "b200-tcgen05-mxf4nvf4-e8m0-block16",
        "rtx50-mma-mxf4",
        "rtx50-mma-mxf4nvf4",
        "h100-dmma",
        "mi100",
    ):
        assert name in names, name
        assert not [r for r in refused if r[0] == name], name
    assert not refused, refused  # every pair of every shipped config generates


def _long_units():
    """The covered shipped units the long run proves: one per distinct resolved parameter set
    (the RTL and the vectors are functions of the parameters: the others generate the same
    unit), the first config in name order representing the rest."""
    if not LONG:
        return []
    covered, _ = shipped_units()
    patterns = None if LONG == "1" else LONG.split(",")
    seen, units = set(), []
    for name, pair in covered:
        if patterns is not None and not any(fnmatch.fnmatch(name, p) for p in patterns):
            continue
        params = load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml").params(*pair)
        if params not in seen:
            seen.add(params)
            units.append((name, pair))
    return units


@pytest.mark.skipif(not LONG, reason="the long RTL run: MXSIM_RTL_LONG=1 (docs/rtl.md)")
@pytest.mark.parametrize(
    "config,pair", _long_units(), ids=[f"{c}-{a}x{b}" for c, (a, b) in _long_units()]
)
@pytest.mark.parametrize("simulator", ["iverilog", "verilator"])
@pytest.mark.parametrize("blocks", [1, 2])
def test_long_every_covered_shipped_unit(tmp_path, config, pair, simulator, blocks):
    params = load_hwconfig(REPO / "hwconfigs" / f"{config}.yaml").params(*pair)
    # a block, or a whole tree where one spans several blocks (bfp-exact, the group-sum units)
    unit = params.block_size
    if params.scales != "none" and params.fused_terms % params.block_size == 0:
        unit = max(unit, params.fused_terms)
    k = blocks * unit
    kinds = ["random", "corners"] + (
        ["exhaustive"] if blocks == 1 and pair == ("fp4_e2m1", "fp4_e2m1") else []
    )
    # the two-block units with a result register stage (the bench clocks it)
    counts = prove(
        tmp_path, config, pair, k, simulator, cases=1000, kinds=kinds, pipeline=blocks - 1
    )
    print(f"proof {config} {pair[0]}x{pair[1]} K={k} {simulator}: {counts}")  # shown with -s


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


def _reference_decode(fmt, code: int, subnormals: bool, zeros_positive: bool) -> tuple:
    """(nan, inf, zero, sign, exp, sig) of one code from the format table's Fraction decode:
    exp = max(floor(log2 |v|), emin), sig = |v| / 2^(exp - mantissa bits)."""
    from fractions import Fraction
    import math

    from mxsim.formats.reference import decode_reference

    value = decode_reference(fmt, code << fmt.padding_bits)
    if isinstance(value, float) and math.isnan(value):
        return (1, 0, 0, 0, 0, 0)
    if isinstance(value, float) and math.isinf(value):
        return (0, 1, 0, int(value < 0), 0, 0)
    negative = int(code >> (fmt.bits - fmt.padding_bits - 1))
    magnitude = abs(Fraction(value))
    min_normal = Fraction(2) ** (1 - fmt.bias)
    if magnitude == 0 or (not subnormals and magnitude < min_normal):
        return (0, 0, 1, 0 if zeros_positive else negative, 0, 0)
    exp = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exp > magnitude:
        exp -= 1
    exp = max(exp, 1 - fmt.bias)
    sig = magnitude / Fraction(2) ** (exp - fmt.mantissa_bits)
    assert sig.denominator == 1
    return (0, 0, 0, negative, exp, int(sig))


DECODES = [("fp16", True, False), ("bf16", False, True)] + (
    [("tf32", True, False), ("fp16", False, False), ("bf16", True, True)] if LONG else []
)


@pytest.mark.parametrize("fmt_name,subnormals,zeros_positive", DECODES)
def test_a_wide_element_decode_equals_the_format_table_on_every_code(
    tmp_path, fmt_name, subnormals, zeros_positive
):
    """The field decode of a wide element (IEEE-shaped, more than 8 bits) under Icarus, every
    code (padding bits 0) against the format table's Fraction decode."""
    import subprocess

    from mxsim.formats import get_format
    from mxsim.rtl.generate import _decode_module, element_decode

    require_simulator("iverilog")
    fmt = get_format(fmt_name)
    table = element_decode(fmt_name, subnormals, zeros_positive)
    (tmp_path / "dec.sv").write_text(_decode_module("dec", table))
    live = fmt.bits - fmt.padding_bits
    lines = []
    for code in range(1 << live):
        nan, inf, zero, sign, exp, sig = _reference_decode(fmt, code, subnormals, zeros_positive)
        word = (
            (((code << 4 | nan << 3 | inf << 2 | zero << 1 | sign) << 16) | (exp & 0xFFFF)) << 32
        ) | sig
        lines.append(f"{word:x}")
    (tmp_path / "codes.hex").write_text("\n".join(lines) + "\n")
    width = live + 4 + 16 + 32
    code = f"mem[i][{width - 1}:52]"
    if fmt.padding_bits:
        code = f"{{{code}, {{{fmt.padding_bits}{{1'b1}}}}}}"
    (tmp_path / "tb.sv").write_text(
        f"""module tb;
  logic [{width - 1}:0] mem [0:{(1 << live) - 1}];
  logic [{fmt.bits - 1}:0] code; logic nan, inf, zero, sign; logic signed [15:0] exp;
  logic [{fmt.mantissa_bits}:0] sig; int failed;
  dec d (.code(code), .nan(nan), .inf(inf), .zero(zero), .sign(sign), .exp(exp), .sig(sig));
  initial begin
    $readmemh("{tmp_path / "codes.hex"}", mem);
    failed = 0;
    for (int i = 0; i < {1 << live}; i++) begin
      // padding bits set to ones: the decode ignores them
      code = {code};
      #1;
      if ({{nan, inf, zero, sign, exp, 32'(sig)}} !== mem[i][51:0]) begin
        failed++;
        if (failed < 4) $display("FAIL %h: %b%b%b%b %h %h", code, nan, inf, zero, sign, exp, sig);
      end
    end
    $display("%0d failed", failed);
    $finish;
  end
endmodule
"""
    )
    subprocess.run(
        [
            "iverilog",
            "-g2012",
            "-o",
            str(tmp_path / "tb.vvp"),
            str(tmp_path / "dec.sv"),
            str(tmp_path / "tb.sv"),
        ],
        check=True,
        capture_output=True,
    )
    out = subprocess.run(
        ["vvp", "-n", str(tmp_path / "tb.vvp")], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip().splitlines()[-1] == "0 failed", out[-2000:]
