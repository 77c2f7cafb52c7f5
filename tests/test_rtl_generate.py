"""The generator's refusals and arguments: an uncovered key is one ConfigError naming it; bad K,
pipeline and names are ArgumentErrors; the port list is the golden vectors' packing."""

from __future__ import annotations

import pytest
import yaml

from conftest import REPO
from mxsim.datapath import load_hwconfig
from mxsim.errors import ArgumentError, ConfigError
from mxsim.golden import layout_for, units_from_hwconfig
from mxsim.rtl import generate_unit
from mxsim.rtl.generate import element_decode
from mxsim.rtl.simulate import vector_fields
from mxsim.formats import get_format
from mxsim.formats.reference import decode_reference

OCP = REPO / "hwconfigs" / "ocp-exact.yaml"


def variant(tmp_path, base: str, changes: dict) -> str:
    """A copy of hwconfigs/<base>.yaml with section keys changed."""
    data = yaml.safe_load((REPO / "hwconfigs" / f"{base}.yaml").read_text())
    data.pop("extends", None)
    for section, values in changes.items():
        data.setdefault(section, {}).update(values)
    path = tmp_path / f"{base}-variant.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize(
    "base,pair,changes,key",
    [
        (
            "b200-tcgen05-mxf4nvf4",
            ("fp4_e2m1", "fp4_e2m1"),
            {"adder": {"align_reference": "leading_bit"}},
            "adder.align_reference",
        ),  # leading-bit alignment is built for product terms, not for group sums
    ],
)
def test_an_uncovered_key_is_refused_by_name(tmp_path, base, pair, changes, key):
    path = variant(tmp_path, base, changes)
    with pytest.raises(
        ConfigError, match=key.replace(".", r"\.") + r": .* not covered by the RTL generator"
    ):
        generate_unit(path, *pair)


def test_leading_bit_references_of_group_sums_are_refused_by_name():
    """align_reference: leading_bit is built for product terms, not for group-sum terms."""
    import dataclasses

    from mxsim.rtl import check_covered

    params = load_hwconfig(REPO / "hwconfigs" / "b200-nvfp4.yaml").params("fp4_e2m1", "fp4_e2m1")
    with pytest.raises(ConfigError, match=r"adder\.align_reference: leading_bit is not covered"):
        check_covered(dataclasses.replace(params, align_reference="leading_bit"), "x.yaml")


def test_block_sums_on_a_fixed_point_grid_are_refused_by_name():
    """scales: block_sum is built for exact and windowed trees, not with the grid keys."""
    import dataclasses

    from mxsim.rtl import check_covered

    params = load_hwconfig(REPO / "hwconfigs" / "mxdotp.yaml").params("fp8_e4m3", "fp8_e4m3")
    with pytest.raises(ConfigError, match=r"inputs\.scales: block_sum is not covered"):
        check_covered(dataclasses.replace(params, scales="block_sum"), "x.yaml")


def test_group_sums_in_an_exact_tree_are_refused_by_name():
    """Group sums are built as a windowed tree's terms."""
    import dataclasses

    from mxsim.rtl import check_covered

    params = load_hwconfig(REPO / "hwconfigs" / "b200-nvfp4.yaml").params("fp4_e2m1", "fp4_e2m1")
    check_covered(params, "x.yaml")
    with pytest.raises(ConfigError, match=r"inputs\.scales: group_sum is not covered"):
        check_covered(dataclasses.replace(params, align_fraction_bits=None), "x.yaml")


def test_wide_elements_not_ieee_shaped_are_refused_by_name(monkeypatch):
    """Elements of at most TABLE_BITS bits decode by a table (MX9 included), wider ones by
    IEEE fields; a wider format that is not IEEE-shaped is refused."""
    import dataclasses

    from mxsim.rtl import check_covered, generate

    params = load_hwconfig(OCP).params("fp8_e4m3", "fp8_e4m3")
    check_covered(dataclasses.replace(params, a_format="mx9"), "x.yaml")
    check_covered(dataclasses.replace(params, a_format="fp16", b_format="bf16"), "x.yaml")
    monkeypatch.setattr(generate, "TABLE_BITS", 8)
    with pytest.raises(ConfigError, match="a_formats: element format mx9 .9 bits. is not covered"):
        check_covered(dataclasses.replace(params, a_format="mx9"), "x.yaml")


@pytest.mark.parametrize("k", [0, -32, 31, 4097, 1 << 40, True, 32.0, "32"])
def test_bad_k(k):
    with pytest.raises(ArgumentError, match="k"):
        generate_unit(OCP, "fp4_e2m1", "fp4_e2m1", k)


@pytest.mark.parametrize("pipeline", [-1, 9, True, 1.0])
def test_bad_pipeline(pipeline):
    with pytest.raises(ArgumentError, match="pipeline"):
        generate_unit(OCP, "fp4_e2m1", "fp4_e2m1", pipeline=pipeline)


@pytest.mark.parametrize("name", ["9lives", "", "x" * 121])
def test_bad_module_name(name):
    with pytest.raises(ArgumentError, match="module name"):
        generate_unit(OCP, "fp4_e2m1", "fp4_e2m1", name=name)


def test_format_the_config_does_not_take():
    with pytest.raises(ConfigError, match="a_formats"):
        generate_unit(OCP, "fp16", "fp4_e2m1")


def test_ports_pack_as_the_golden_vectors():
    hw = load_hwconfig(REPO / "hwconfigs" / "h100-fp8.yaml")
    for pair, k in ((("fp8_e4m3", "fp8_e5m2"), 64),):
        unit = generate_unit(hw, *pair, k)
        golden = layout_for(units_from_hwconfig(hw, [pair], dot_length=k)[0])
        assert [(f.name, f.lsb, f.bits) for f in golden.fields] == vector_fields(unit)
    hw = load_hwconfig(OCP)
    unit = generate_unit(hw, "fp6_e3m2", "int8", 96)
    golden = layout_for(units_from_hwconfig(hw, [("fp6_e3m2", "int8")], dot_length=96)[0])
    assert [(f.name, f.lsb, f.bits) for f in golden.fields] == vector_fields(unit)


@pytest.mark.parametrize(
    "fmt", ["fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp4_e2m1", "int8", "mx9", "fp8_e4m3fnuz"]
)
def test_decode_table_rows_are_the_format_values(fmt):
    """Every row's sig * 2^(exp - frac) is the code's value (from the format table's decode)."""
    table = element_decode(fmt, True, False)
    info = get_format(fmt)
    for code, (nan, inf, zero, sign, exponent, sig) in enumerate(table.rows):
        value = decode_reference(info, code)
        if nan:
            assert value != value
        elif inf:
            assert value == (float("-inf") if sign else float("inf"))
        elif zero:
            assert value == 0
        else:
            from fractions import Fraction

            assert (-1) ** sign * sig * Fraction(2) ** (exponent - table.frac) == value
            assert exponent >= table.emin and sig < 2 ** (table.frac + 1)
