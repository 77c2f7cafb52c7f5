"""Hardware-config loading: every shipped file, every kind of bad key, overrides, extends."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from conftest import REPO
from mxsim.datapath.config import load_hwconfig, parse_hwconfig
from mxsim.errors import ConfigError, MxsimError, UnknownNameError

MINIMAL = {"name": "unit", "inputs": {"a_formats": ["fp8_e4m3"], "b_formats": ["fp8_e4m3"]}}
MARKED = {"mxsim_hwconfig": 1, **MINIMAL}  # a config another may extend


def with_changes(**sections) -> dict:
    data = copy.deepcopy(MINIMAL)
    for section, values in sections.items():
        if isinstance(values, dict):
            data.setdefault(section, {}).update(values)
        else:
            data[section] = values
    return data


@pytest.mark.parametrize("path", sorted((REPO / "hwconfigs").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_config_loads_and_names_its_sources(path):
    config = load_hwconfig(path)
    assert config.name == path.stem
    assert path.read_text().lstrip().startswith("#")  # each file says where its numbers come from


def test_defaults_fill_every_key():
    params = parse_hwconfig(MINIMAL).params("fp8_e4m3", "fp8_e4m3")
    assert (
        params.fused_terms == 32
        and params.align_fraction_bits is None
        and params.accumulator_format == "fp32"
    )


@pytest.mark.parametrize(
    "data, key_path, message",
    [
        (
            with_changes(adder={"align_fraction_bit": 3}),
            "adder.align_fraction_bit",
            "unknown key; accepted: fused_terms",
        ),
        (with_changes(adder={"fused_terms": "32"}), "adder.fused_terms", "expected an integer"),
        (
            with_changes(adder={"fused_terms": 0}),
            "adder.fused_terms",
            "expected an integer 1..4096",
        ),
        (with_changes(adder={"align_fraction_bits": 99}), "adder.align_fraction_bits", "0..50"),
        (
            with_changes(adder={"below_window": "round"}),
            "adder.below_window",
            "truncate, floor, nearest_even, sticky",
        ),
        (with_changes(adder={"term_order": [0, 0]}), "adder.term_order", "permutation"),
        (
            with_changes(inputs={"a_formats": ["fp8_e4m3", "fp9"]}),
            "inputs.a_formats[1]",
            "fp8_e4m3",
        ),
        (with_changes(inputs={"subnormals": "yes"}), "inputs.subnormals", "true or false"),
        (
            with_changes(accumulator={"format": "tf32"}),
            "accumulator.format",
            "fp32, fp16, bf16, fp64, exact",
        ),
        (with_changes(output={"rounding": "stochastic"}), "output.rounding", "nearest_even"),
        (with_changes(widget=1), "widget", "unknown key"),
        (with_changes(mxsim_hwconfig=2), "mxsim_hwconfig", "unsupported schema version"),
        (with_changes(name=""), "name", "non-empty"),
        (
            with_changes(overrides=[{"a_format": "fp8_e5m2", "inputs": {"block_size": 16}}]),
            "overrides[0].inputs",
            "unknown key",
        ),
        (
            with_changes(overrides=[{"out_format": "fp99", "adder": {}}]),
            "overrides[0].out_format",
            "format name",
        ),
        (
            with_changes(
                inputs={"scales": "block_sum", "block_size": 32},
                adder={"fused_terms": 24, "accumulator_in_tree": False},
            ),
            "adder.fused_terms",
            "must divide block_size",
        ),
        (
            with_changes(inputs={"scales": "block_sum"}),
            "adder.accumulator_in_tree",
            "cannot join the tree",
        ),
        (
            with_changes(accumulator={"format": "exact"}, adder={"align_fraction_bits": 13}),
            "accumulator.format",
            "exact trees",
        ),
        (
            with_changes(accumulator={"promotion_interval": 48}),
            "accumulator.promotion_interval",
            "multiple of adder.fused_terms",
        ),
        (
            with_changes(adder={"align_fraction_bits": 50, "fused_terms": 4096}),
            "adder.align_fraction_bits",
            "overflow",
        ),
        (with_changes(inputs={"same_format": 1}), "inputs.same_format", "true or false"),
        (
            with_changes(adder={"trees_in_blocks": True, "term_order": [1, 0], "fused_terms": 2}),
            "adder.trees_in_blocks",
            "k order and no promotion",
        ),
        (with_changes(grid={"fraction_bits": -34}), "grid.fraction_bits", "0..200"),
        (
            with_changes(grid={"accumulator_max_left_shift": None}),
            "grid.accumulator_max_left_shift",
            "expected an integer",
        ),
        (
            with_changes(grid={"fraction_bits": 34}),
            "adder.accumulator_in_tree",
            "a fixed-point grid (grid.fraction_bits) needs false",
        ),
        (
            with_changes(
                grid={"fraction_bits": 34},
                adder={"accumulator_in_tree": False, "align_fraction_bits": 13},
            ),
            "adder.align_fraction_bits",
            "the grid sums exactly",
        ),
        (
            with_changes(
                grid={"fraction_bits": 34},
                adder={"accumulator_in_tree": False},
                accumulator={"format": "exact"},
            ),
            "accumulator.format",
            "a floating format",
        ),
        (
            with_changes(
                grid={"fraction_bits": 34}, adder={"accumulator_in_tree": False, "fused_terms": 11}
            ),
            "adder.trees_in_blocks",
            "one scale per tree",
        ),
        (
            with_changes(grid={"fraction_bits": 8}, adder={"accumulator_in_tree": False}),
            "grid.fraction_bits",
            "do not hold the smallest fp8_e4m3 x fp8_e4m3 product",
        ),
        (
            with_changes(
                grid={"fraction_bits": 34},
                inputs={"scales": "group_sum"},
                adder={"accumulator_in_tree": False, "group_terms": 16},
            ),
            "inputs.scales",
            "a fixed-point grid (grid.fraction_bits) needs 'none' or 'products'",
        ),
        # matrix-core adders (AMD CDNA)
        (with_changes(adder={"structure": "tree"}), "adder.structure", "fused, pairwise_rounded"),
        (
            with_changes(adder={"structure": "pairwise_rounded"}, accumulator={"format": "exact"}),
            "accumulator.format",
            "adder.structure: pairwise_rounded needs a floating format",
        ),
        (
            with_changes(adder={"structure": "pairwise_rounded"}, accumulator={"c_entry": "end"}),
            "accumulator.c_entry",
            "pairwise_rounded needs 'initial'",
        ),
        (
            with_changes(
                adder={"structure": "pairwise_rounded", "group_terms": 16},
                inputs={"scales": "group_sum"},
            ),
            "inputs.scales",
            "pairwise_rounded needs 'none', 'products' or 'block_sum'",
        ),
        (
            with_changes(adder={"parity_windows": True, "accumulator_in_tree": False}),
            "adder.align_fraction_bits",
            "adder.parity_windows needs a window",
        ),
        (
            with_changes(
                adder={
                    "parity_windows": True,
                    "accumulator_in_tree": False,
                    "align_fraction_bits": 24,
                    "below_window": "sticky",
                }
            ),
            "adder.below_window",
            "needs no sticky bit",
        ),
        (
            with_changes(adder={"parity_windows": True, "align_fraction_bits": 24}),
            "adder.accumulator_in_tree",
            "the windows hold products only",
        ),
        (
            with_changes(adder={"second_alignment_bits": 31, "align_fraction_bits": 24}),
            "adder.accumulator_in_tree",
            "adder.second_alignment_bits needs false",
        ),
        (
            with_changes(
                adder={
                    "second_alignment_bits": 31,
                    "align_fraction_bits": 24,
                    "accumulator_in_tree": False,
                    "sum_significant_bits": 14,
                }
            ),
            "adder.sum_significant_bits",
            "the second alignment cuts",
        ),
        (
            with_changes(
                adder={
                    "second_alignment_bits": 31,
                    "align_fraction_bits": 24,
                    "accumulator_in_tree": False,
                },
                accumulator={"promotion_interval": 32},
            ),
            "accumulator.promotion_interval",
            "needs null",
        ),
        (with_changes(adder={"second_alignment_bits": 41}), "adder.second_alignment_bits", "0..40"),
        (with_changes(adder={"far_accumulator": "drop"}), "adder.far_accumulator", "floor, zero"),
        (
            with_changes(adder={"special_accumulator_exponent": -1}),
            "adder.second_alignment_bits",
            "adder.special_accumulator_exponent needs an integer",
        ),
        (
            with_changes(
                adder={
                    "special_accumulator_exponent": -1,
                    "second_alignment_bits": 31,
                    "align_fraction_bits": 24,
                    "accumulator_in_tree": False,
                }
            ),
            "adder.far_accumulator",
            "adder.special_accumulator_exponent needs 'zero'",
        ),
        (
            with_changes(adder={"special_accumulator_exponent": "nan"}),
            "adder.special_accumulator_exponent",
            "expected an integer",
        ),
        (
            with_changes(adder={"special_accumulator_exponent": 5000}),
            "adder.special_accumulator_exponent",
            "-1100..1100",
        ),
        (
            with_changes(multiplier={"overflow_exponent": 2000}),
            "multiplier.overflow_exponent",
            "-1022..1023",
        ),
        (
            with_changes(
                multiplier={"overflow_exponent": 128},
                adder={"group_terms": 16},
                inputs={"scales": "group_sum"},
            ),
            "multiplier.overflow_exponent",
            "needs null with inputs.scales: group_sum",
        ),
        (with_changes(inputs={"zero_sign": "negative"}), "inputs.zero_sign", "keep, positive"),
        (
            with_changes(output={"zero_sign": "negative"}),
            "output.zero_sign",
            "ieee, positive, exact_positive",
        ),
    ],
)
def test_bad_configs_name_the_file_and_key(data, key_path, message):
    with pytest.raises(ConfigError) as info:
        parse_hwconfig(data, "cfg.yaml")
    text = str(info.value)
    assert text.startswith(f"cfg.yaml: {key_path}: "), text
    assert message in text, text


def test_missing_required_key_and_files(tmp_path):
    with pytest.raises(ConfigError, match="inputs.b_formats: required key is missing"):
        parse_hwconfig({"name": "x", "inputs": {"a_formats": ["fp4_e2m1"]}}, "cfg.yaml")
    with pytest.raises(ConfigError, match="no such file"):
        load_hwconfig(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_hwconfig(broken)


def test_overrides_apply_by_selector():
    config = load_hwconfig(REPO / "hwconfigs" / "h100-fp8.yaml")
    assert config.params("fp8_e4m3", "fp8_e5m2").fused_terms == 32
    fp16 = config.params("fp8_e4m3", "fp8_e5m2", "fp16")
    assert (fp16.fused_terms, fp16.accumulator_format, fp16.c_entry) == (16, "fp16", "end")
    with pytest.raises(ConfigError, match="not supported by this unit"):
        config.params("int8", "fp8_e4m3")
    with pytest.raises(UnknownNameError):
        config.params("fp8_e4m3", "fp8_e4m3", "fp99")


def test_digest_tracks_content():
    first = parse_hwconfig(MINIMAL)
    changed = parse_hwconfig(with_changes(adder={"fused_terms": 16}))
    assert first.digest == parse_hwconfig(yaml.safe_load(yaml.safe_dump(MINIMAL))).digest
    assert first.digest != changed.digest


def test_vary_hwconfig_changes_base_values_and_keeps_overrides():
    from mxsim.datapath.config import vary_hwconfig

    base = load_hwconfig(REPO / "hwconfigs" / "h100-fp8.yaml")
    varied = vary_hwconfig(
        base, {"adder.align_fraction_bits": 9, "accumulator.format": "bf16"}, name="narrow"
    )
    params = varied.params("fp8_e4m3", "fp8_e4m3")
    assert (varied.name, params.align_fraction_bits, params.accumulator_format) == (
        "narrow",
        9,
        "bf16",
    )
    assert params.sum_significant_bits == 14 and varied.digest != base.digest
    # Every format path gets the varied keys (h100-fp8's FP8 paths are overrides of h100.yaml);
    # the fp16-output override keeps the keys it sets that were not varied (16-term trees).
    fp16 = varied.params("fp8_e4m3", "fp8_e4m3", "fp16")
    assert (fp16.align_fraction_bits, fp16.accumulator_format, fp16.fused_terms) == (9, "bf16", 16)
    assert base.params("fp8_e4m3", "fp8_e4m3", "fp16").fused_terms == 16
    assert base.params("fp8_e4m3", "fp8_e4m3").align_fraction_bits == 13
    with pytest.raises(
        ConfigError,
        match="h100-fp8.yaml: adder.fused: unknown key path; accepted: inputs.a_formats",
    ):
        vary_hwconfig(base, {"adder.fused": 8}, name="x")
    with pytest.raises(
        ConfigError, match="accumulator.promotion_interval: must be a multiple of adder.fused_terms"
    ):
        vary_hwconfig(base, {"accumulator.promotion_interval": 48}, name="x")


def write_yaml(path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))


def test_extends_merges_sections_and_appends_overrides(tmp_path):
    base = with_changes(
        inputs={"a_formats": ["fp8_e4m3", "fp8_e5m2"], "b_formats": ["fp8_e4m3", "fp8_e5m2"]},
        adder={"fused_terms": 16, "align_fraction_bits": 13},
        overrides=[{"out_format": "fp16", "adder": {"fused_terms": 8}}],
    )
    write_yaml(tmp_path / "base.yaml", {"mxsim_hwconfig": 1, **base})  # a base carries the marker
    child = {
        "extends": "../base.yaml",
        "name": "child",
        "adder": {"align_fraction_bits": 20},
        "overrides": [
            {"a_format": ["fp8_e5m2"], "out_format": "fp16", "adder": {"fused_terms": 4}}
        ],
    }
    write_yaml(tmp_path / "sub" / "child.yaml", child)  # resolved relative to the extending file
    config = load_hwconfig(tmp_path / "sub" / "child.yaml")
    assert config.name == "child"
    e4m3 = config.params("fp8_e4m3", "fp8_e4m3")
    assert (e4m3.fused_terms, e4m3.align_fraction_bits) == (16, 20)  # merged key by key
    assert config.params("fp8_e4m3", "fp8_e4m3", "fp16").fused_terms == 8  # the base's override
    assert config.params("fp8_e5m2", "fp8_e4m3", "fp16").fused_terms == 4  # the child's wins
    assert config.params("fp8_e5m2", "fp8_e4m3", "fp32").fused_terms == 16


def test_extends_cycles_and_bad_bases_name_the_files(tmp_path):
    write_yaml(tmp_path / "a.yaml", {**MARKED, "extends": "b.yaml"})
    write_yaml(tmp_path / "b.yaml", {**MARKED, "extends": "a.yaml"})
    with pytest.raises(ConfigError, match="extends: configs extend each other in a cycle") as info:
        load_hwconfig(tmp_path / "a.yaml")
    assert str(tmp_path / "a.yaml") in str(info.value) and str(tmp_path / "b.yaml") in str(
        info.value
    )
    write_yaml(tmp_path / "self.yaml", {**MARKED, "extends": "self.yaml"})
    with pytest.raises(ConfigError, match="cycle"):
        load_hwconfig(tmp_path / "self.yaml")
    write_yaml(tmp_path / "orphan.yaml", {**MINIMAL, "extends": "absent.yaml"})
    with pytest.raises(ConfigError, match="orphan.yaml: extends: no such file: .*absent.yaml"):
        load_hwconfig(tmp_path / "orphan.yaml")
    write_yaml(
        tmp_path / "bad.yaml", {"mxsim_hwconfig": 1, **with_changes(adder={"fused_terms": 0})}
    )
    write_yaml(tmp_path / "uses-bad.yaml", {"extends": "bad.yaml", "name": "x"})
    with pytest.raises(
        ConfigError, match="bad.yaml: adder.fused_terms"
    ):  # the base's own file and key
        load_hwconfig(tmp_path / "uses-bad.yaml")
    with pytest.raises(ConfigError, match="cfg.yaml: extends: only a config read from a file"):
        parse_hwconfig({**MINIMAL, "extends": "a.yaml"}, "cfg.yaml")
    write_yaml(tmp_path / "number.yaml", {**MINIMAL, "extends": 3})
    with pytest.raises(ConfigError, match="number.yaml: extends: expected the file name"):
        load_hwconfig(tmp_path / "number.yaml")


def test_override_selectors_take_one_format_or_a_list():
    data = with_changes(
        inputs={"a_formats": ["fp8_e4m3", "fp8_e5m2", "fp4_e2m1"], "b_formats": ["fp8_e4m3"]},
        overrides=[{"a_format": ["fp8_e4m3", "fp8_e5m2"], "adder": {"fused_terms": 16}}],
    )
    config = parse_hwconfig(data)
    assert [
        config.params(f, "fp8_e4m3").fused_terms for f in ("fp8_e4m3", "fp8_e5m2", "fp4_e2m1")
    ] == [16, 16, 32]
    with pytest.raises(
        ConfigError, match=r"overrides\[0\].a_format: expected a format name or a list"
    ):
        parse_hwconfig(with_changes(overrides=[{"a_format": [], "adder": {}}]), "cfg.yaml")


def _write(tmp_path, data: bytes):
    path = tmp_path / "hw.yaml"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "data, message",
    [
        ("name: caf\u00e9\n".encode("latin-1"), "not UTF-8 text (byte 0xe9 at offset 9)"),
        (bytes(range(256)), "not UTF-8 text"),
        (b"name: " + b"[" * 3000 + b"]" * 3000, "YAML nested deeper than 64 levels"),
        (
            b"a:\n" + b"".join(b" " * i + b"b:\n" for i in range(1, 200)),
            "YAML nested deeper than 64 levels",
        ),
        (b"", "expected a YAML mapping at the top level"),
    ],
)
def test_unreadable_files_are_config_errors(tmp_path, data, message):
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as caught:
        load_hwconfig(path)
    assert str(caught.value).startswith(str(path)) and message in str(caught.value)


@pytest.mark.parametrize(
    "section, key, value, message",
    [
        ("accumulator", "promotion_interval", 2**70, "expected an integer 1..1073741824"),
        ("adder", "term_order", list(range(5000)), "a list of at most 4096 distinct integers"),
        ("adder", "fused_terms", 10**9, "expected an integer 1..4096"),
        ("inputs", "block_size", 0, "expected an integer 1..4096"),
    ],
)
def test_absurd_sizes_are_refused(section, key, value, message):
    with pytest.raises(ConfigError) as caught:
        parse_hwconfig(with_changes(**{section: {key: value}}), "<test>")
    assert str(caught.value).startswith(f"<test>: {section}.{key}: expected") and message in str(
        caught.value
    )


@pytest.mark.parametrize("base_name", ["a\x00b.yaml", "a" * 5000 + ".yaml"])
def test_extends_with_an_unusable_file_name_is_a_config_error(tmp_path, base_name):
    write_yaml(tmp_path / "child.yaml", {**MINIMAL, "extends": base_name})
    with pytest.raises(ConfigError, match="child.yaml: extends: not a usable file name"):
        load_hwconfig(tmp_path / "child.yaml")


def test_one_format_units_refuse_mixed_pairs():
    data = with_changes(
        inputs={
            "a_formats": ["fp8_e4m3", "fp4_e2m1"],
            "b_formats": ["fp8_e4m3", "fp4_e2m1"],
            "same_format": True,
        }
    )
    unit = parse_hwconfig(data, "cfg.yaml")
    assert unit.format_pairs == (("fp8_e4m3", "fp8_e4m3"), ("fp4_e2m1", "fp4_e2m1"))
    assert unit.params("fp4_e2m1", "fp4_e2m1").same_format is True
    with pytest.raises(
        ConfigError, match=r"cfg.yaml: inputs.same_format: .*'fp8_e4m3' and 'fp4_e2m1'"
    ):
        unit.params("fp8_e4m3", "fp4_e2m1")
    mixed = parse_hwconfig(with_changes(inputs={"a_formats": ["fp8_e4m3", "fp4_e2m1"]}), "cfg.yaml")
    assert mixed.format_pairs == (("fp8_e4m3", "fp8_e4m3"), ("fp4_e2m1", "fp8_e4m3"))


def test_format_groups_take_the_pairs_one_group_holds():
    data = with_changes(
        inputs={
            "a_formats": ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"],
            "b_formats": ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"],
            "format_groups": [["fp16"], ["bf16"], ["e4m3", "fp8_e5m2"]],
        }
    )
    unit = parse_hwconfig(data, "cfg.yaml")
    assert unit.format_pairs == (
        ("fp16", "fp16"),
        ("bf16", "bf16"),
        ("fp8_e4m3", "fp8_e4m3"),
        ("fp8_e4m3", "fp8_e5m2"),
        ("fp8_e5m2", "fp8_e4m3"),
        ("fp8_e5m2", "fp8_e5m2"),
    )
    assert unit.params("fp8_e5m2", "fp8_e4m3").b_format == "fp8_e4m3"
    with pytest.raises(
        ConfigError,
        match=r"^cfg.yaml: inputs.format_groups: this unit takes no fp16 x bf16 pair: "
        r"A and B must lie in one group \(fp16; bf16; fp8_e4m3, fp8_e5m2\)$",
    ):
        unit.params("fp16", "bf16")
    # A group may list a format the unit does not take: a narrower view keeps its base's groups.
    narrow = parse_hwconfig(
        with_changes(
            inputs={
                "a_formats": ["fp8_e4m3"],
                "b_formats": ["fp8_e4m3", "fp8_e5m2"],
                "format_groups": [["fp16"], ["fp8_e4m3", "fp8_e5m2"]],
            }
        ),
        "cfg.yaml",
    )
    assert narrow.format_pairs == (("fp8_e4m3", "fp8_e4m3"), ("fp8_e4m3", "fp8_e5m2"))


@pytest.mark.parametrize(
    "groups, path, message",
    [
        ("fp16", "inputs.format_groups", "expected null or a list of format lists"),
        ([], "inputs.format_groups", "expected null or a list of format lists"),
        (["fp16"], "inputs.format_groups[0]", "expected a non-empty list of formats"),
        ([[]], "inputs.format_groups[0]", "expected a non-empty list of formats"),
        ([["fp16"], {"a": 1}], "inputs.format_groups[1]", "expected a non-empty list of formats"),
        ([["fp16", "fp17"]], "inputs.format_groups[0][1]", "expected one of"),
        ([["fp16", 3]], "inputs.format_groups[0][1]", "expected one of"),
        ([["fp16"]], "inputs.format_groups", "inputs.a_formats takes bf16 but no group holds it"),
    ],
)
def test_bad_format_groups_name_the_key(groups, path, message):
    data = with_changes(
        inputs={"a_formats": ["fp16", "bf16"], "b_formats": ["fp16"], "format_groups": groups}
    )
    with pytest.raises(ConfigError) as caught:
        parse_hwconfig(data, "cfg.yaml")
    assert str(caught.value).startswith(f"cfg.yaml: {path}: ") and message in str(caught.value)


def test_shipped_units_take_only_the_pairs_an_instruction_has():
    """The GPU configs' mixed pairs are the ones a real instruction takes: FP8 (and on
    tcgen05 FP6/FP4) formats mix among themselves; fp16, bf16, tf32 and fp32 pair only with
    themselves."""
    fp8 = {"fp8_e4m3", "fp8_e5m2"}
    mixing = {
        "a100": set(),
        "mi100": set(),
        "mi250": set(),
        "ada": fp8,
        "h100": fp8,
        "h100-wgmma": fp8,
        "b200": fp8,
        "b200-tcgen05": fp8 | {"fp6_e3m2", "fp6_e2m3", "fp4_e2m1"},
        "mi300": {"fp8_e4m3fnuz", "fp8_e5m2fnuz"},
    }
    for name, formats in mixing.items():
        unit = load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
        mixed = {(a, b) for a, b in unit.format_pairs if a != b}
        assert mixed == {(a, b) for a in formats for b in formats if a != b}, name
        assert all((fmt, fmt) in unit.format_pairs for fmt in unit.a_formats), name


def test_mxdotp_elements_per_operation_follow_the_element_width():
    unit = load_hwconfig(REPO / "hwconfigs" / "mxdotp.yaml")
    lanes = {fmt: unit.params(fmt, fmt).fused_terms for fmt, _ in unit.format_pairs}
    assert lanes == {"fp8_e4m3": 8, "fp8_e5m2": 8, "fp6_e3m2": 11, "fp6_e2m3": 11, "fp4_e2m1": 16}
    roundings = {
        name: load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
        .params("fp8_e4m3", "fp8_e4m3")
        .accumulator_rounding
        for name in ("mxdotp", "mxdotp-rtz", "mxdotp-rdn", "mxdotp-rup", "mxdotp-rmm")
    }
    assert roundings == {
        "mxdotp": "nearest_even",
        "mxdotp-rtz": "toward_zero",
        "mxdotp-rdn": "toward_negative",
        "mxdotp-rup": "toward_positive",
        "mxdotp-rmm": "nearest_away",
    }


# ----------------------------------------------------------------------------- hostile extends


def test_extends_a_symlink_loop_is_a_config_error(tmp_path):
    (tmp_path / "loop1.yaml").symlink_to("loop2.yaml")
    (tmp_path / "loop2.yaml").symlink_to("loop1.yaml")
    write_yaml(tmp_path / "child.yaml", {**MINIMAL, "extends": "loop1.yaml"})
    with pytest.raises(
        ConfigError, match=r"child.yaml: extends: not a usable file name \(a symlink loop\)"
    ):
        load_hwconfig(tmp_path / "child.yaml")


def test_extends_chain_depth_is_bounded_and_names_the_loaded_file(tmp_path):
    from mxsim.datapath.config import MAX_EXTENDS_DEPTH

    for index in range(1000):  # RecursionError naming an innocent file in the middle, before
        data = {**MARKED, **({"extends": f"c{index + 1}.yaml"} if index < 999 else {})}
        write_yaml(tmp_path / f"c{index}.yaml", data)
    with pytest.raises(
        ConfigError, match=rf"c0.yaml: extends: the chain .* longer than {MAX_EXTENDS_DEPTH} files"
    ):
        load_hwconfig(tmp_path / "c0.yaml")
    assert (
        load_hwconfig(tmp_path / f"c{1000 - MAX_EXTENDS_DEPTH}.yaml").name == "unit"
    )  # exactly the bound loads


def test_extends_a_file_that_is_no_hwconfig_never_shows_its_content(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text(
        "topsecret-first-line:\n  password: hunter2\n"
    )  # parses as a mapping with a key
    write_yaml(tmp_path / "child.yaml", {**MINIMAL, "extends": str(secret)})
    with pytest.raises(ConfigError) as info:
        load_hwconfig(tmp_path / "child.yaml")
    message = str(info.value)
    assert (
        "secret.txt' is not an mxsim hardware config (it has no top-level mxsim_hwconfig key)"
        in message
    )
    assert "topsecret" not in message and "hunter2" not in message
    secret.write_text(
        "mxsim_hwconfig: 1\nname: [unclosed topsecret\n"
    )  # a YAML error quotes no text either
    with pytest.raises(ConfigError, match=r"not valid YAML: .*\(line \d+, column \d+\)") as info:
        load_hwconfig(tmp_path / "child.yaml")
    assert "topsecret" not in str(info.value)


def test_extends_a_symlink_out_of_the_config_directory_is_refused(tmp_path):
    outside = tmp_path / "outside"
    write_yaml(outside / "base.yaml", MARKED)
    inside = tmp_path / "configs"
    inside.mkdir()
    (inside / "base.yaml").symlink_to(outside / "base.yaml")
    (inside / "up").symlink_to(outside)
    for name in ("base.yaml", "up/base.yaml"):
        write_yaml(inside / "child.yaml", {**MINIMAL, "extends": name})
        with pytest.raises(
            ConfigError, match="is a symlink .* leading out of the config's directory"
        ):
            load_hwconfig(inside / "child.yaml")
    write_yaml(
        inside / "child.yaml", {**MINIMAL, "extends": "../outside/base.yaml"}
    )  # a plain path may leave
    assert load_hwconfig(inside / "child.yaml").name == "unit"
    (inside / "local.yaml").symlink_to("child.yaml")  # a symlink staying inside is followed
    write_yaml(inside / "grandchild.yaml", {**MINIMAL, "extends": "local.yaml"})
    with pytest.raises(ConfigError, match="child.yaml' is not an mxsim hardware config"):
        load_hwconfig(inside / "grandchild.yaml")


def test_repeated_yaml_keys_are_refused(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(
        "name: unit\ninputs: {a_formats: [fp8_e4m3], b_formats: [fp8_e4m3]}\nname: other\n"
    )
    with pytest.raises(
        ConfigError,
        match=r"dup.yaml: a key repeats an earlier key of its mapping \(line 3, column 1\)",
    ):
        load_hwconfig(path)
    path.write_text(
        "name: unit\ninputs: {a_formats: [fp8_e4m3], b_formats: [fp8_e4m3], a_formats: [fp4_e2m1]}\n"
    )
    with pytest.raises(ConfigError, match="line 2"):
        load_hwconfig(path)


def test_an_alias_bomb_under_the_node_limit_gives_a_short_error(tmp_path):
    # Anchors first in the file, in a section checked after adder (sections go in schema order).
    lines = [
        "name: unit",
        "inputs: {a_formats: [fp8_e4m3], b_formats: [fp8_e4m3]}",
        "accumulator:",
        "  x0: &a0 [x, x, x, x, x, x, x, x, x]",
    ]
    for level in range(1, 5):
        lines.append(f"  x{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    # 9**6 = 531,441 nodes here, about 600,000 in all: under the 1,000,000 limit
    lines += ["adder:", "  align_fraction_bits: [" + ", ".join(["*a4"] * 9) + "]"]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as info:
        load_hwconfig(path)
    assert "adder.align_fraction_bits: expected an integer or null, got [[[" in str(info.value)
    assert len(str(info.value)) < 300


def test_a_file_that_is_no_config_is_refused_without_echoing_its_lines(tmp_path):
    path = tmp_path / "shadow"
    path.write_text(
        "root:$6$SECRETHASH:19000:0:99999:7:::\nbin:*:19000::\n"
    )  # lines ending in ':' are keys
    with pytest.raises(
        ConfigError, match="not an mxsim hardware config: a top-level key that is not a name"
    ) as info:
        load_hwconfig(path)
    assert "SECRETHASH" not in str(info.value)


@pytest.mark.parametrize("bad", [["fp8_e4m3"], {"fp8_e4m3": 1}, 3.5])
def test_params_of_a_name_that_is_no_string_is_an_mxsim_error(bad):
    # params are remembered per format names: an unhashable argument raised TypeError here before
    hw = load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml")
    for args in ((bad, "fp8_e4m3"), ("fp8_e4m3", bad), ("fp8_e4m3", "fp8_e4m3", bad)):
        with pytest.raises(MxsimError):
            hw.params(*args)


def test_params_are_kept_per_format_names_and_odd_names_still_refused():
    config = parse_hwconfig(MINIMAL)
    first = config.params("fp8_e4m3", "fp8_e4m3")
    assert config.params("fp8_e4m3", "fp8_e4m3") is first
    for odd in (["fp8_e4m3"], 3):  # unhashable, and not a name: the format lookup's error
        with pytest.raises(UnknownNameError, match=re.escape(f"unknown format {odd};")):
            config.params(odd, "fp8_e4m3")
