"""The datapath schema: one table from which config validation, DatapathParams, the kernel
record, the fast routes' eligibility and the docs' key tables all follow."""

from __future__ import annotations

import copy
import dataclasses
import inspect

import numpy as np
import pytest

from conftest import REPO
from mxsim.datapath import _kernels as K
from mxsim.datapath import reference, schema
from mxsim.datapath.api import _kernel_arguments
from mxsim.datapath.blas import blas_applies
from mxsim.datapath.config import check_consistency, load_hwconfig, parse_hwconfig, vary_hwconfig
from mxsim.datapath.window import window_applies
from mxsim.errors import ConfigError

HWCONFIG_DOCS = REPO / "docs" / "hwconfig.md"
MINIMAL = {"name": "unit", "inputs": {"a_formats": ["fp8_e4m3"], "b_formats": ["fp8_e4m3"]}}


def test_docs_show_the_generated_key_tables():
    text = HWCONFIG_DOCS.read_text()
    # On a mismatch: write schema.docs_with_schema(text) back to docs/hwconfig.md.
    assert schema.docs_with_schema(text) == text
    assert schema.schema_markdown() in text


def test_every_key_has_a_field_a_record_rule_and_both_route_declarations():
    fields = [schema.param_field(name, key) for _, name, key in schema.keys()]
    named = [field for field in fields if field is not None]
    assert len(set(named)) == len(named)  # no two keys share a params field
    assert [f.name for f in dataclasses.fields(schema.DatapathParams)] == [
        "a_format",
        "b_format",
        *named,
    ]
    record_names = schema.record_dtype().names
    assert len(set(record_names)) == len(record_names)
    for section, name, key in schema.keys():
        for route in schema.ROUTES:
            assert callable(getattr(key, route)), (
                f"{section}.{name} declares nothing for the {route} route"
            )


def test_the_kernel_reads_every_record_field_and_the_twin_every_param():
    kernel_source = inspect.getsource(K)
    for name in schema.record_dtype().names:
        read = f"cfg.{name}" in kernel_source or f'cfg["{name}"]' in kernel_source
        assert read, f"the kernel never reads record field {name}"
    twin_source = inspect.getsource(reference)
    for field in schema.param_fields()[2:]:
        assert f"params.{field}" in twin_source, f"the reference twin never reads {field}"


def test_kernel_choice_codes_follow_the_schema():
    scales = schema.SCHEMA["inputs"]["scales"].choices
    below = schema.SCHEMA["adder"]["below_window"].choices
    assert [scales.index(c) for c in ("none", "products", "block_sum")] == [
        K.SCALES_NONE,
        K.SCALES_PRODUCTS,
        K.SCALES_BLOCK_SUM,
    ]
    assert [below.index(c) for c in ("truncate", "floor", "nearest_even", "sticky")] == [
        K.BELOW_TRUNCATE,
        K.BELOW_FLOOR,
        K.BELOW_NEAREST_EVEN,
        K.BELOW_STICKY,
    ]


def test_kernel_record_holds_each_key_as_declared():
    params = load_hwconfig(REPO / "hwconfigs" / "h100-fp8.yaml").params(
        "fp8_e4m3", "fp8_e4m3", "fp16"
    )
    record = schema.kernel_record(params)[0]
    assert record["fused_terms"] == params.fused_terms == 16
    assert record["align_fraction_bits"] == params.align_fraction_bits == 25
    assert params.carry_bits is None and record["carry_bits"] == -1  # null is -1
    assert record["scales"] == K.SCALES_NONE and bool(record["c_at_end"]) is True
    assert bool(record["accumulator_exact"]) is False and record["term_order_length"] == len(
        params.term_order or ()
    )
    assert schema.kernel_record(params).dtype == schema.record_dtype()  # one dtype for every unit


# --- a key added through the table reaches every consumer ------------------------------------------


@pytest.fixture
def add_dummy_key(monkeypatch):
    """Install the schema with one more adder key, ``dummy_bits`` (int 0..3, default 0), as a
    new key is added: one table entry, with the given route declarations (none by default)."""

    def install(**declarations):
        key = schema.Key(
            "int", 0, "a dummy key for the tests", minimum=0, maximum=3, **declarations
        )
        table = {**schema.SCHEMA, "adder": {**schema.SCHEMA["adder"], "dummy_bits": key}}
        monkeypatch.setattr(schema, "SCHEMA", table)
        monkeypatch.setattr(schema, "DatapathParams", schema.params_class(table))

    return install


def with_adder(**values) -> dict:
    data = copy.deepcopy(MINIMAL)
    data["adder"] = values
    return data


def test_a_new_key_is_validated_and_reaches_the_params(add_dummy_key):
    add_dummy_key()
    assert parse_hwconfig(MINIMAL).params("fp8_e4m3", "fp8_e4m3").dummy_bits == 0  # the default
    assert parse_hwconfig(with_adder(dummy_bits=2)).params("fp8_e4m3", "fp8_e4m3").dummy_bits == 2
    for value, message in (
        (7, "expected an integer 0..3, got 7"),
        ("2", "expected an integer, got '2'"),
    ):
        with pytest.raises(ConfigError) as caught:
            parse_hwconfig(with_adder(dummy_bits=value), "cfg.yaml")
        assert str(caught.value) == f"cfg.yaml: adder.dummy_bits: {message}"
    with pytest.raises(ConfigError, match="adder.dummy_bit: unknown key; accepted: .*dummy_bits"):
        parse_hwconfig(with_adder(dummy_bit=1), "cfg.yaml")
    data = {**MINIMAL, "overrides": [{"out_format": "fp16", "adder": {"dummy_bits": 3}}]}
    config = parse_hwconfig(data)
    assert [config.params("fp8_e4m3", "fp8_e4m3", out).dummy_bits for out in ("fp32", "fp16")] == [
        0,
        3,
    ]
    assert (
        vary_hwconfig(config, {"adder.dummy_bits": 1}, "x")
        .params("fp8_e4m3", "fp8_e4m3", "fp16")
        .dummy_bits
        == 1
    )


def test_a_new_key_reaches_the_docs_tables(add_dummy_key):
    add_dummy_key()
    assert (
        "| `dummy_bits` | int | `0` | 0..3 | a dummy key for the tests |"
        in schema.schema_markdown()
    )
    text = HWCONFIG_DOCS.read_text()
    assert (
        schema.docs_with_schema(text) != text
    )  # the docs test would ask for the regenerated tables


def test_a_new_key_reaches_the_kernel_record(add_dummy_key):
    before = schema.record_dtype()
    add_dummy_key()
    params = parse_hwconfig(with_adder(dummy_bits=2)).params("fp8_e4m3", "fp8_e4m3")
    record = _kernel_arguments(params)[2][4]  # the record among the kernel arguments
    assert "dummy_bits" in record.dtype.names and "dummy_bits" not in before.names
    assert record[0]["dummy_bits"] == 2


def blas_route(params) -> bool:
    args = _kernel_arguments(params)[2]
    codes = np.zeros((2, 64), dtype=np.uint8)
    scales = np.zeros((2, 2), dtype=np.int32)
    return blas_applies(params, args, codes, codes, scales, scales, np.zeros((1, 1), np.float32))


def unit_params(name: str, out_format: str | None = None):
    config = load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
    return config.params(config.a_formats[0], config.b_formats[0], out_format)


def test_routes_refuse_a_new_key_until_it_declares_what_they_compute(add_dummy_key):
    assert blas_route(unit_params("ocp-exact")) and window_applies(unit_params("h100-fp8"))
    add_dummy_key()  # declares nothing: both routes must refuse every unit
    assert not blas_route(unit_params("ocp-exact"))
    assert not window_applies(unit_params("h100-fp8"))
    add_dummy_key(blas=schema.only(0), window=schema.only(0))
    assert blas_route(unit_params("ocp-exact")) and window_applies(unit_params("h100-fp8"))
    varied = {"adder.dummy_bits": 1}
    ocp = vary_hwconfig(load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml"), varied, "x")
    h100 = vary_hwconfig(load_hwconfig(REPO / "hwconfigs" / "h100-fp8.yaml"), varied, "y")
    assert not blas_route(ocp.params("fp8_e4m3", "fp8_e4m3"))
    assert not window_applies(h100.params("fp8_e4m3", "fp8_e4m3"))


@pytest.mark.parametrize(
    "route, unit, changes",
    [
        ("blas", "ocp-exact", {"adder.align_fraction_bits": 20}),
        ("blas", "ocp-exact", {"accumulator.rounding": "toward_zero"}),
        ("blas", "ocp-exact", {"output.format": "bf16"}),
        ("blas", "ocp-exact", {"inputs.subnormals": False}),
        ("blas", "kulisch", {"output.rounding": "toward_zero"}),
        ("blas", "mxdotp", {"accumulator.overflow": "infinity"}),  # a grid: ieee overflow only
        ("window", "h100-fp8", {"adder.below_window": "sticky"}),
        ("window", "h100-fp8", {"adder.carry_bits": 4}),
        ("blas", "ocp-exact", {"output.zero_sign": "positive"}),
        ("blas", "ocp-exact", {"output.zero_sign": "exact_positive"}),
        ("blas", "ocp-exact", {"adder.structure": "pairwise_rounded"}),
        ("window", "h100-wgmma", {"adder.structure": "pairwise_rounded"}),
        ("blas", "ocp-exact", {"inputs.zero_sign": "positive"}),
        ("window", "h100-fp8", {"inputs.zero_sign": "positive"}),
        ("blas", "ocp-exact", {"multiplier.overflow_exponent": 128}),
        ("window", "b200-tcgen05-mxf8f6f4", {"multiplier.overflow_exponent": 128}),  # scaled
        # parity windows in a term order, or in trees of an odd count: the route reorders
        # each tree's positions even ones first, in k order
        ("window", "h200-fp8", {"adder.parity_windows": True, "adder.accumulator_in_tree": False}),
        (
            "window",
            "h100-wgmma",
            {
                "adder.parity_windows": True,
                "adder.accumulator_in_tree": False,
                "adder.fused_terms": 5,
            },
        ),
    ],
)
def test_route_declarations_refuse_what_the_route_does_not_compute(route, unit, changes):
    config = load_hwconfig(REPO / "hwconfigs" / f"{unit}.yaml")
    params = config.params(config.a_formats[0], config.b_formats[0])
    varied = vary_hwconfig(config, changes, "x").params(config.a_formats[0], config.b_formats[0])
    assert schema.route_accepts(route, params) and not schema.route_accepts(route, varied)


@pytest.mark.parametrize("route, unit", [("blas", "ocp-exact"), ("window", "h100-fp8")])
@pytest.mark.parametrize("scale_format", ["e8m0", "ue4m3"])
def test_no_route_takes_group_sums(route, unit, scale_format):
    # Not yet shown exact on either route. (The whole config, with its fp8_e5m2 pairs, would
    # be refused: their group sums need more than float64's 53 bits.)
    params = load_hwconfig(REPO / "hwconfigs" / f"{unit}.yaml").params("fp8_e4m3", "fp8_e4m3")
    varied = dataclasses.replace(
        params, scales="group_sum", group_terms=16, scale_format=scale_format
    )
    check_consistency(varied, "x")
    assert schema.route_accepts(route, params) and not schema.route_accepts(route, varied)


def test_params_keep_their_hash_but_not_in_their_fields_or_pickles():
    import pickle

    params = load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml").params("fp8_e4m3", "fp8_e4m3")
    fields = tuple(getattr(params, f.name) for f in dataclasses.fields(params))
    assert hash(params) == hash(fields) == hash(params)  # the dataclass's hash of its fields
    assert params._kept_hash == hash(fields)
    assert set(vars(params)) == {f.name for f in dataclasses.fields(params)}
    state = params.__reduce_ex__(pickle.HIGHEST_PROTOCOL)[2]
    assert "_kept_hash" not in repr(state)  # (a string's hash differs between processes)
    again = pickle.loads(pickle.dumps(params))
    assert again == params and hash(again) == hash(params)
    other = dataclasses.replace(params, fused_terms=params.fused_terms * 2)
    assert other != params and hash(other) == hash(
        tuple(getattr(other, f.name) for f in dataclasses.fields(other))
    )
    assert copy.deepcopy(params) == params
