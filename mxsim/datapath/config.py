"""Hardware configs: the YAML description of one MX dot-product unit, validated.

This is the only module that reads YAML. It checks every key as its entry in
:data:`mxsim.datapath.schema.SCHEMA` declares it (type, accepted values, default) and resolves
a unit's :class:`~mxsim.datapath.schema.DatapathParams`. Errors name the file and the key path.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from .array import ArrayConfig, parse_array_config
from ..errors import ConfigError
from ..fileio import load_yaml, read_text
from ..limits import check_path, shown
from ..formats import get_format
from . import schema
from .schema import REQUIRED, WIDE_FORMATS, DatapathParams, Key
from .tables import products_fit_float64

SCHEMA_VERSION = 1
_KEY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")  # what a mistyped key looks like
OVERRIDE_SELECTORS = ("a_format", "b_format", "out_format")


def _top_level() -> set[str]:
    return {
        "mxsim_hwconfig",
        "name",
        "description",
        "extends",
        "overrides",
        "array",
        *schema.SCHEMA,
    }


@dataclass(frozen=True)
class HardwareConfig:
    """A validated hardware config: one dot-product unit (and optionally its array).

    ``sections`` holds the base values of every schema key; ``overrides`` are
    ``({selector: formats}, {(section, key): value})`` pairs applied in order where every
    selector (a_format, b_format, out_format) matches one of its formats. :meth:`params`
    resolves them.
    """

    name: str
    description: str
    source: str
    sections: dict
    overrides: tuple
    array: ArrayConfig | None
    digest: str
    _params_memo: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def a_formats(self) -> tuple[str, ...]:
        return self.sections[("inputs", "a_formats")]

    @property
    def b_formats(self) -> tuple[str, ...]:
        return self.sections[("inputs", "b_formats")]

    @property
    def format_pairs(self) -> tuple[tuple[str, str], ...]:
        """Every (A, B) element-format pair the unit accepts (equal pairs only with ``same_format``;
        pairs one of ``format_groups`` holds only, where it is given)."""
        return tuple(
            (a, b) for a in self.a_formats for b in self.b_formats if self._takes_pair(a, b)
        )

    def _takes_pair(self, a_name: str, b_name: str) -> bool:
        groups = self.sections[("inputs", "format_groups")]
        if self.sections[("inputs", "same_format")] and a_name != b_name:
            return False
        return groups is None or any(a_name in group and b_name in group for group in groups)

    def params(
        self,
        a_format: str,
        b_format: str,
        out_format: str | None = None,
        c_format: str | None = None,
    ) -> DatapathParams:
        """The unit's parameters for A/B element formats, an output format and a format of c
        (defaults: the config's ``output.format`` and ``inputs.c_format``); remembered per
        formats (a config does not change)."""
        key = (a_format, b_format, out_format, c_format)
        try:  # (format names alone are kept: the check below passed them)
            kept = self._params_memo.get(key)
        except TypeError:  # unhashable: not a format name
            kept = None
        if kept is not None:
            return kept
        if not all(
            name is None or isinstance(name, str) for name in key
        ):  # not a format name: its error
            return self._resolve_params(*key)
        if key not in self._params_memo:
            self._params_memo[key] = self._resolve_params(*key)
        return self._params_memo[key]

    def _resolve_params(
        self, a_format: str, b_format: str, out_format: str | None, c_format: str | None = None
    ) -> DatapathParams:
        a_name, b_name = get_format(a_format).name, get_format(b_format).name
        out_name = (
            self.sections[("output", "format")]
            if out_format is None
            else get_format(out_format).name
        )
        if out_name not in WIDE_FORMATS:
            raise ConfigError(
                self.source,
                "output.format",
                f"output format {out_name!r} is not one of {', '.join(WIDE_FORMATS)}",
            )
        c_name = (
            self.sections[("inputs", "c_format")] if c_format is None else get_format(c_format).name
        )
        if c_name not in WIDE_FORMATS:
            raise ConfigError(
                self.source,
                "inputs.c_format",
                f"format of c {c_name!r} is not one of {', '.join(WIDE_FORMATS)}",
            )
        for operand, name, accepted in (
            ("A", a_name, self.a_formats),
            ("B", b_name, self.b_formats),
        ):
            if name not in accepted:
                raise ConfigError(
                    self.source,
                    f"inputs.{operand.lower()}_formats",
                    f"operand {operand} format {name!r} is not supported by this unit; accepted: {', '.join(accepted)}",
                )
        if self.sections[("inputs", "same_format")] and a_name != b_name:
            raise ConfigError(
                self.source,
                "inputs.same_format",
                f"this unit takes one element format for A and B; got {a_name!r} and {b_name!r}",
            )
        if not self._takes_pair(a_name, b_name):
            groups = "; ".join(
                ", ".join(group) for group in self.sections[("inputs", "format_groups")]
            )
            raise ConfigError(
                self.source,
                "inputs.format_groups",
                f"this unit takes no {a_name} x {b_name} pair: A and B must lie in one group ({groups})",
            )
        values = dict(self.sections)
        values[("output", "format")] = out_name
        values[("inputs", "c_format")] = c_name
        for selectors, changes in self.overrides:
            chosen = {"a_format": a_name, "b_format": b_name, "out_format": out_name}
            if all(chosen[key] in names for key, names in selectors.items()):
                values.update(changes)
        fields = {
            field: values[(section, name)]
            for section, name, key in schema.keys()
            if (field := schema.param_field(name, key)) is not None
        }
        params = schema.DatapathParams(a_format=a_name, b_format=b_name, **fields)
        check_consistency(params, self.source)
        return params


def adder_width_bits(params: DatapathParams) -> int:
    """Width of the tree adder's signed register when ``carry_bits`` is set (see SCHEMA)."""
    return (
        1 + params.align_fraction_bits + 2 + params.carry_bits + (params.below_window == "sticky")
    )


def check_consistency(params: DatapathParams, source: str) -> None:
    """Raise ConfigError for parameter combinations no unit can have."""
    if params.scales == "block_sum":
        if params.block_size % params.fused_terms:
            raise ConfigError(
                source,
                "adder.fused_terms",
                f"scales: block_sum needs each tree inside one block: fused_terms ({params.fused_terms}) "
                f"must divide block_size ({params.block_size})",
            )
        if params.accumulator_in_tree:
            raise ConfigError(
                source,
                "adder.accumulator_in_tree",
                "scales: block_sum scales a tree's sum, so the accumulator cannot join the tree: set it to false",
            )
        order = params.term_order or ()
        # Period p of the order holds k = p * T + order[j]: which blocks its trees meet repeats
        # after block_size / gcd(T, block_size) periods.
        periods = params.block_size // math.gcd(len(order), params.block_size) if order else 0
        for period in range(periods):
            for start in range(0, len(order), params.fused_terms):
                tree = order[start : start + params.fused_terms]
                if len({(period * len(order) + k) // params.block_size for k in tree}) > 1:
                    raise ConfigError(
                        source,
                        "adder.term_order",
                        "scales: block_sum needs each tree inside one block, but this order mixes blocks in a tree",
                    )
    if params.scale_format != "e8m0" and params.scales != "group_sum":
        raise ConfigError(
            source,
            "inputs.scale_format",
            f"{params.scale_format} scales are not powers of two: they need scales: group_sum",
        )
    if params.scales == "group_sum":
        _check_groups(params, source)
    if params.term_order is not None and len(params.term_order) % params.fused_terms:
        raise ConfigError(
            source,
            "adder.term_order",
            f"its length must be a multiple of fused_terms ({params.fused_terms})",
        )
    if params.accumulator_format == "exact" and (
        params.align_fraction_bits is not None or params.sum_significant_bits is not None
    ):
        raise ConfigError(
            source,
            "accumulator.format",
            "an exact accumulator needs exact trees: align_fraction_bits and sum_significant_bits null",
        )
    if (
        params.align_fraction_bits is not None
        and params.align_fraction_bits + 3 + params.fused_terms.bit_length() > 62
    ):
        raise ConfigError(
            source,
            "adder.align_fraction_bits",
            f"{params.align_fraction_bits} fraction bits with {params.fused_terms} fused terms overflow a 62-bit "
            "adder; use null for an exact tree",
        )
    if params.carry_bits is not None:
        if params.align_fraction_bits is None:
            raise ConfigError(
                source,
                "adder.carry_bits",
                "needs a window (align_fraction_bits): an exact tree never overflows",
            )
        if adder_width_bits(params) > 62:
            raise ConfigError(
                source,
                "adder.carry_bits",
                f"the adder would be {adder_width_bits(params)} bits wide; at most 62",
            )
    if params.trees_in_blocks and (
        params.term_order is not None or params.promotion_interval is not None
    ):
        raise ConfigError(
            source,
            "adder.trees_in_blocks",
            "trees restarting at blocks need k order and no promotion "
            "(term_order and promotion_interval null)",
        )
    if not products_fit_float64(get_format(params.a_format), get_format(params.b_format)):
        check_wide_products(params, source)
    if params.grid_fraction_bits is not None:
        _check_grid(params, source)
    if params.product_overflow_exponent is not None and params.scales == "group_sum":
        raise ConfigError(
            source,
            "multiplier.overflow_exponent",
            "needs null with inputs.scales: group_sum (a group "
            "sums its exact products before any scale; no unit overflows them)",
        )
    if params.structure == "pairwise_rounded":
        _check_needs(
            params,
            source,
            "adder.structure: pairwise_rounded",
            {
                "inputs.scales": (
                    params.scales == "group_sum",
                    "'none', 'products' or 'block_sum'",
                ),
                "accumulator.format": (params.accumulator_format == "exact", "a floating format"),
                "accumulator.c_entry": (
                    params.c_entry != "initial",
                    "'initial': c is the first accumulator",
                ),
                "accumulator.promotion_interval": (params.promotion_interval is not None, "null"),
                "grid.fraction_bits": (params.grid_fraction_bits is not None, "null"),
            },
        )
    for key, value in (
        ("parity_windows", params.parity_windows),
        ("second_alignment_bits", params.second_alignment_bits is not None),
    ):
        if value:
            _check_needs(
                params,
                source,
                f"adder.{key}",
                {
                    "adder.align_fraction_bits": (params.align_fraction_bits is None, "a window"),
                    "adder.below_window": (params.below_window == "sticky", "no sticky bit"),
                    "inputs.scales": (
                        params.scales == "group_sum",
                        "'none', 'products' or 'block_sum'",
                    ),
                    "grid.fraction_bits": (params.grid_fraction_bits is not None, "null"),
                },
            )
    if params.parity_windows and params.accumulator_in_tree:
        raise ConfigError(
            source,
            "adder.accumulator_in_tree",
            "adder.parity_windows needs false: the windows hold products only",
        )
    if params.second_alignment_bits is not None:
        _check_needs(
            params,
            source,
            "adder.second_alignment_bits",
            {
                "adder.accumulator_in_tree": (
                    params.accumulator_in_tree,
                    "false: the accumulator joins the second alignment",
                ),
                "adder.sum_significant_bits": (
                    params.sum_significant_bits is not None,
                    "null: the second alignment cuts the sum",
                ),
                "accumulator.format": (params.accumulator_format == "exact", "a floating format"),
                "accumulator.c_entry": (
                    params.c_entry != "initial",
                    "'initial': c is the first accumulator",
                ),
                "accumulator.promotion_interval": (params.promotion_interval is not None, "null"),
            },
        )
    if params.special_accumulator_exponent is not None:
        _check_needs(
            params,
            source,
            "adder.special_accumulator_exponent",
            {
                "adder.second_alignment_bits": (
                    params.second_alignment_bits is None,
                    "an integer: a NaN/Inf accumulator is dropped at the second alignment",
                ),
                "adder.far_accumulator": (params.far_accumulator != "zero", "'zero'"),
                "adder.align_fraction_bits": (params.align_fraction_bits is None, "a window"),
            },
        )
    if params.promotion_interval is not None:
        if params.promotion_interval % params.fused_terms:
            raise ConfigError(
                source,
                "accumulator.promotion_interval",
                f"must be a multiple of adder.fused_terms ({params.fused_terms}), got {params.promotion_interval}",
            )
        if params.accumulator_format == "exact":
            raise ConfigError(
                source,
                "accumulator.promotion_interval",
                "needs a floating accumulator, not 'exact'",
            )
        if params.c_entry != "initial":
            raise ConfigError(
                source,
                "accumulator.promotion_interval",
                "c starts the outer accumulator: c_entry must be 'initial'",
            )
    if params.output_zero_sign == "ieee_steps":
        _check_ieee_steps(params, source)


def _check_ieee_steps(params: DatapathParams, source: str) -> None:
    """``output.zero_sign: ieee_steps`` signs the exact zeros of the accumulator's own steps: it
    refuses the steps whose zero sign it does not model (a toward_negative exact zero, the outer
    adds of c_entry: end and promotion, the grid's own rule)."""
    exact = params.accumulator_format == "exact"
    _check_needs(
        params,
        source,
        "output.zero_sign: ieee_steps",
        {
            "accumulator.rounding": (
                not exact and params.accumulator_rounding == "toward_negative",
                "a rounding other than toward_negative",
            ),
            "output.rounding": (
                exact and params.output_rounding == "toward_negative",
                "a rounding other than toward_negative with an exact accumulator",
            ),
            "accumulator.c_entry": (params.c_entry != "initial", "'initial'"),
            "accumulator.promotion_interval": (params.promotion_interval is not None, "null"),
            "grid.fraction_bits": (params.grid_fraction_bits is not None, "null"),
        },
    )


def _check_needs(params: DatapathParams, source: str, what: str, needs: dict) -> None:
    """Raise ConfigError for the first key (path: (bad, wanted)) that ``what`` cannot take."""
    for path, (bad, wanted) in needs.items():
        if bad:
            raise ConfigError(source, path, f"{what} needs {wanted}")


def check_wide_products(params: DatapathParams, source: str) -> None:
    """Products wider than a float64 (fp64 operands: 106 bits, down to 2^-2148) are held
    exactly only as they enter an exact sum: the kernel refuses every key that would cut one."""
    _check_needs(
        params,
        source,
        f"{params.a_format} x {params.b_format} (products of up to 106 bits, summed exactly "
        "only in exact trees)",
        {
            "multiplier.product_fraction_bits": (params.product_fraction_bits is not None, "null"),
            "multiplier.overflow_exponent": (params.product_overflow_exponent is not None, "null"),
            "adder.align_fraction_bits": (
                params.align_fraction_bits is not None,
                "null (an exact tree)",
            ),
            "adder.sum_significant_bits": (params.sum_significant_bits is not None, "null"),
            "grid.fraction_bits": (params.grid_fraction_bits is not None, "null"),
            "inputs.scales": (params.scales == "group_sum", "not 'group_sum'"),
            "adder.structure": (
                params.structure == "pairwise_rounded",
                "not 'pairwise_rounded' (it rounds each product)",
            ),
        },
    )


def _check_grid(params: DatapathParams, source: str) -> None:
    """A fixed-point grid (``grid.fraction_bits``) sums exact products with the accumulator
    outside the tree, one scale per tree, and must hold every product of the element formats."""
    needs = {
        "adder.accumulator_in_tree": (
            params.accumulator_in_tree,
            "false: the accumulator is aligned to the grid",
        ),
        "adder.align_fraction_bits": (
            params.align_fraction_bits is not None,
            "null: the grid sums exactly",
        ),
        "adder.sum_significant_bits": (
            params.sum_significant_bits is not None,
            "null: the grid sum is not rounded",
        ),
        "multiplier.product_fraction_bits": (
            params.product_fraction_bits is not None,
            "null: exact products",
        ),
        "accumulator.format": (params.accumulator_format == "exact", "a floating format"),
        "accumulator.c_entry": (
            params.c_entry != "initial",
            "'initial': c is the first accumulator",
        ),
        "accumulator.promotion_interval": (params.promotion_interval is not None, "null"),
        "inputs.scales": (params.scales not in ("none", "products"), "'none' or 'products'"),
        "adder.term_order": (params.term_order is not None, "null"),
    }
    _check_needs(params, source, "a fixed-point grid (grid.fraction_bits)", needs)
    if (
        params.scales != "none"
        and not params.trees_in_blocks
        and params.block_size % params.fused_terms
    ):
        raise ConfigError(
            source,
            "adder.trees_in_blocks",
            "a fixed-point grid takes one scale per tree: "
            f"set it true, or make fused_terms ({params.fused_terms}) divide block_size ({params.block_size})",
        )
    smallest = Fraction(get_format(params.a_format).min_subnormal) * Fraction(
        get_format(params.b_format).min_subnormal
    )
    if smallest * 2**params.grid_fraction_bits != int(smallest * 2**params.grid_fraction_bits):
        raise ConfigError(
            source,
            "grid.fraction_bits",
            f"{params.grid_fraction_bits} fraction bits do not hold the "
            f"smallest {params.a_format} x {params.b_format} product ({float(smallest)!r})",
        )


def _binades(ratio: Fraction) -> int:
    """math.frexp's exponent of a positive ratio, exact (fp64's spans overflow a float)."""
    e = ratio.numerator.bit_length() - ratio.denominator.bit_length()  # 2^(e-1) < ratio < 2^(e+1)
    return e + 1 if ratio >= Fraction(2) ** e else e


def _check_groups(params: DatapathParams, source: str) -> None:
    """``scales: group_sum``: groups inside one block and one tree, in k order, and every group
    sum times its scales exact in float64 and inside the window's 62-bit adder."""
    for key, size in (
        ("inputs.block_size", params.block_size),
        ("adder.fused_terms", params.fused_terms),
    ):
        if size % params.group_terms:
            raise ConfigError(
                source,
                key,
                f"scales: group_sum needs whole groups: {size} is not a multiple of "
                f"adder.group_terms ({params.group_terms})",
            )
    if params.term_order is not None:
        raise ConfigError(
            source, "adder.term_order", "scales: group_sum sums groups in k order: it must be null"
        )
    a, b, scale = (
        get_format(params.a_format),
        get_format(params.b_format),
        get_format(params.scale_format),
    )
    # Products are multiples of the smallest product step and below max_a * max_b: a group sum
    # needs that span plus log2(group_terms) bits, times the two scale significands.
    span = _binades(
        Fraction(a.max_finite)
        * Fraction(b.max_finite)
        / (Fraction(a.min_subnormal) * Fraction(b.min_subnormal))
    )
    bits = span + params.group_terms.bit_length() + 2 * (scale.mantissa_bits + 1)
    if bits > 53:
        raise ConfigError(
            source,
            "inputs.scales",
            f"group sums of {a.name} x {b.name} with {scale.name} scales need "
            f"{bits} bits, more than float64's exact 53",
        )
    # A group term may lie above 2^R by the group sum's magnitude and the scale significands.
    above = math.frexp(a.max_finite * b.max_finite * params.group_terms)[1] + 2
    if (
        params.align_fraction_bits is not None
        and params.align_fraction_bits + above + params.fused_terms.bit_length() > 62
    ):
        raise ConfigError(
            source,
            "adder.align_fraction_bits",
            f"{params.align_fraction_bits} fraction bits with group sums up to 2^{above} overflow a 62-bit adder",
        )


def _check_value(source: str, path: str, key: Key, value: Any) -> Any:
    def fail(expected: str) -> ConfigError:
        return ConfigError(source, path, f"expected {expected}, got {shown(value)}")

    if key.kind == "bool":
        if not isinstance(value, bool):
            raise fail("true or false")
        return value
    if key.kind in ("int", "optional_int"):
        if value is None and key.kind == "optional_int":
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail("an integer" + (" or null" if key.kind == "optional_int" else ""))
        if (
            key.minimum is not None
            and value < key.minimum
            or key.maximum is not None
            and value > key.maximum
        ):
            upper = f"..{key.maximum}" if key.maximum is not None else " or more"
            raise ConfigError(
                source, path, f"expected an integer {key.minimum}{upper}, got {value}"
            )
        return value
    if key.kind in ("str", "format"):
        if not isinstance(value, str) or value not in key.choices:
            raise fail(f"one of {', '.join(key.choices)}")
        return value
    if key.kind == "order":
        if value is None:
            return None
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in value)
            or (key.maximum is not None and len(value) > key.maximum)
            or sorted(value) != list(range(len(value)))
        ):
            raise fail(
                f"null or a permutation of 0..T-1 (a list of at most {key.maximum} distinct integers)"
            )
        return tuple(value)
    if key.kind == "format_list":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items:
            raise fail(f"a list of formats from {', '.join(key.choices)}")
        return _format_names(source, path, key, items)
    if key.kind == "format_groups":
        if value is None:
            return None
        if not isinstance(value, list) or not value:
            raise fail("null or a list of format lists, e.g. [[fp16], [fp8_e4m3, fp8_e5m2]]")
        groups = []
        for index, group in enumerate(value):
            if not isinstance(group, list) or not group:
                raise ConfigError(
                    source,
                    f"{path}[{index}]",
                    f"expected a non-empty list of formats from "
                    f"{', '.join(key.choices)}, got {shown(group)}",
                )
            groups.append(_format_names(source, f"{path}[{index}]", key, group))
        return tuple(groups)
    raise AssertionError(key.kind)


def _format_names(source: str, path: str, key: Key, items: list) -> tuple[str, ...]:
    """The canonical names of a list of formats, each one of the key's choices."""
    resolved = []
    for index, item in enumerate(items):
        name = get_format(item).name if isinstance(item, str) and _is_format(item) else None
        if name is None or name not in key.choices:
            raise ConfigError(
                source,
                f"{path}[{index}]",
                f"expected one of {', '.join(key.choices)}, got {shown(item)}",
            )
        resolved.append(name)
    return tuple(resolved)


def _is_format(name: str) -> bool:
    try:
        get_format(name)
    except KeyError:
        return False
    return True


def _read_section(source: str, prefix: str, section: str, mapping: Any, partial: bool) -> dict:
    keys = schema.SCHEMA[section]
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, dict):
        raise ConfigError(
            source, prefix + section, f"expected a mapping of keys ({', '.join(keys)})"
        )
    values = {}
    for name, value in mapping.items():
        if name not in keys:
            raise ConfigError(
                source, f"{prefix}{section}.{name}", f"unknown key; accepted: {', '.join(keys)}"
            )
        values[(section, name)] = _check_value(
            source, f"{prefix}{section}.{name}", keys[name], value
        )
    if not partial:
        for name, key in keys.items():
            if (section, name) not in values:
                if key.default is REQUIRED:
                    raise ConfigError(source, f"{section}.{name}", "required key is missing")
                values[(section, name)] = key.default
    return values


def parse_hwconfig(data: Any, source: str = "<config>") -> HardwareConfig:
    """Validate a parsed YAML mapping (``source`` names it in errors) into a HardwareConfig."""
    if not isinstance(data, dict):
        raise ConfigError(source, "", "expected a YAML mapping at the top level")
    top_level = _top_level()
    for name in data:
        if name not in top_level:
            accepted = f"accepted: {', '.join(sorted(top_level))}"
            if "mxsim_hwconfig" not in data and not _KEY_NAME.fullmatch(str(name)):
                # not a config at all (a file given by mistake, e.g. /etc/shadow): never echo its text
                raise ConfigError(
                    source,
                    "",
                    f"not an mxsim hardware config: a top-level key that is not a name "
                    f"and no mxsim_hwconfig key; {accepted}",
                )
            raise ConfigError(source, str(name), f"unknown key; {accepted}")
    if "extends" in data:
        raise ConfigError(
            source, "extends", "only a config read from a file can extend another (load_hwconfig)"
        )
    version = data.get("mxsim_hwconfig", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise ConfigError(
            source,
            "mxsim_hwconfig",
            f"unsupported schema version {shown(version)}; accepted: {SCHEMA_VERSION}",
        )
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(source, "name", "expected a non-empty string")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(source, "description", "expected a string")
    sections = {}
    for section in schema.SCHEMA:
        sections.update(_read_section(source, "", section, data.get(section), partial=False))
    overrides = []
    raw_overrides = data.get("overrides", []) or []
    if not isinstance(raw_overrides, list):
        raise ConfigError(
            source,
            "overrides",
            "expected a list of {a_format?, b_format?, out_format?, <section>: {...}} entries",
        )
    for index, entry in enumerate(raw_overrides):
        prefix = f"overrides[{index}]."
        if not isinstance(entry, dict):
            raise ConfigError(source, f"overrides[{index}]", "expected a mapping")
        selectors = {}
        changes = {}
        for key, value in entry.items():
            if key in OVERRIDE_SELECTORS:
                names = [value] if isinstance(value, str) else value
                if not (
                    isinstance(names, list)
                    and names
                    and all(isinstance(n, str) and _is_format(n) for n in names)
                ):
                    raise ConfigError(
                        source,
                        prefix + key,
                        f"expected a format name or a list of them, got {shown(value)}",
                    )
                selectors[key] = tuple(get_format(n).name for n in names)
            elif key in schema.SCHEMA and key != "inputs":
                changes.update(_read_section(source, prefix, key, value, partial=True))
            else:
                accepted = ", ".join(
                    OVERRIDE_SELECTORS + tuple(s for s in schema.SCHEMA if s != "inputs")
                )
                raise ConfigError(source, prefix + str(key), f"unknown key; accepted: {accepted}")
        overrides.append((selectors, changes))
    array = parse_array_config(data["array"], source) if data.get("array") is not None else None
    digest = hashlib.sha256(yaml.safe_dump(data, sort_keys=True).encode()).hexdigest()
    config = HardwareConfig(name, description, source, sections, tuple(overrides), array, digest)
    _check_combinations(config)
    return config


def _check_combinations(config: HardwareConfig) -> None:
    """Every format the unit takes lies in one of its format groups, and every supported (A, B,
    output) format combination resolves consistently."""
    groups = config.sections[("inputs", "format_groups")] or ()
    grouped = {name for group in groups for name in group}
    for operand, accepted in (("a", config.a_formats), ("b", config.b_formats)):
        for name in accepted if groups else ():
            if name not in grouped:
                raise ConfigError(
                    config.source,
                    "inputs.format_groups",
                    f"inputs.{operand}_formats takes {name} but no group holds it: "
                    f"list it with the formats it pairs with",
                )
    for a_format, b_format in config.format_pairs:
        for out_format in WIDE_FORMATS:
            config.params(a_format, b_format, out_format)


def key_of_path(key_path: str, source: str = "<config>") -> Key:
    """The schema entry of a key path ``section.key``; a ConfigError lists the accepted ones."""
    section, _, name = key_path.partition(".")
    if section not in schema.SCHEMA or name not in schema.SCHEMA[section]:
        accepted = ", ".join(f"{s}.{k}" for s, k, _ in schema.keys())
        raise ConfigError(source, key_path, f"unknown key path; accepted: {accepted}")
    return schema.SCHEMA[section][name]


def vary_hwconfig(config: HardwareConfig, changes: dict[str, Any], name: str) -> HardwareConfig:
    """``config`` with a key changed for the whole unit: ``changes`` maps key paths
    (``adder.fused_terms``) to YAML-typed values, each checked as the loader checks the file;
    the value replaces the base value and the value of every override that sets the key (so
    every format path of the unit gets it), then every format combination is re-checked for
    consistency. Overrides keep their other keys. The result is called ``name``; its digest
    covers the base config and the changes."""
    sections = dict(config.sections)
    overrides = [(selectors, dict(override)) for selectors, override in config.overrides]
    for key_path, value in changes.items():
        key = key_of_path(key_path, config.source)
        section, _, key_name = key_path.partition(".")
        checked = _check_value(config.source, key_path, key, value)
        sections[(section, key_name)] = checked
        for _, override in overrides:
            if (section, key_name) in override:
                override[(section, key_name)] = checked
    canonical = yaml.safe_dump({"base": config.digest, "changes": dict(changes)}, sort_keys=True)
    varied = HardwareConfig(
        name,
        config.description,
        config.source,
        sections,
        tuple(overrides),
        config.array,
        hashlib.sha256(canonical.encode()).hexdigest(),
    )
    _check_combinations(varied)
    return varied


def load_hwconfig(path: str | Path) -> HardwareConfig:
    """Read and validate a hardware-config YAML file; errors name the file and key path.

    ``extends: <file>`` (resolved relative to the extending file) starts from that config:
    the extending file's sections are merged key by key over the base's, its overrides
    follow the base's (so they win), and every other top-level key replaces the base's.
    A base must be an mxsim hardware config (a top-level ``mxsim_hwconfig`` key; anything
    else is refused without showing its content); a symlink on the way to a base must not
    lead out of the extending file's directory; a chain holds at most MAX_EXTENDS_DEPTH
    files; a cycle is an error naming the files in it.

    The file must be UTF-8 YAML nested at most 64 levels deep, without repeated keys (see
    docs/limits.md); any problem raises :class:`~mxsim.errors.ConfigError`.
    """
    path = check_path(path, "load_hwconfig: path")
    return parse_hwconfig(_resolved_data(Path(path), ()), str(path))


#: Most files in one ``extends`` chain (the loaded file and its bases).
MAX_EXTENDS_DEPTH = 32


def _read_yaml(path: Path) -> Any:
    def fail(message: str):
        raise ConfigError(str(path), "", message)

    return load_yaml(read_text(path, fail), fail)


def _base_path(path: Path, base_name: str) -> Path:
    """The resolved file ``extends: base_name`` of ``path`` names; a symlink on the way must
    not lead out of ``path``'s directory (a plain path may: the base is then checked as any
    file is)."""
    try:  # a NUL byte, an over-long name, a symlink loop or an unreadable directory is the file's error
        directory = path.parent.resolve()
        lexical = Path(os.path.normpath(directory / base_name))
        resolved = lexical.resolve()
        found = resolved.is_file()
    except (OSError, ValueError, RuntimeError) as error:
        reason = "a symlink loop" if isinstance(error, RuntimeError) else str(error)[:120]
        raise ConfigError(
            str(path), "extends", f"not a usable file name ({reason}): {shown(base_name)}"
        ) from None
    if resolved != lexical and not resolved.is_relative_to(directory):
        raise ConfigError(
            str(path),
            "extends",
            f"{shown(base_name)} is a symlink (or lies behind one) leading out "
            f"of the config's directory {directory}; refused",
        )
    if not found:
        raise ConfigError(str(path), "extends", f"no such file: {shown(str(lexical), 200)}")
    return resolved


def _resolved_data(path: Path, chain: tuple[Path, ...]) -> Any:
    """The YAML mapping of ``path`` with its ``extends`` chain merged in (see load_hwconfig);
    ``chain`` holds the resolved files that extend it, outermost first."""
    data = _read_yaml(path)
    if chain and not (isinstance(data, dict) and "mxsim_hwconfig" in data):
        raise ConfigError(
            str(chain[-1]),
            "extends",
            f"{shown(str(path), 200)} is not an mxsim hardware config "
            "(it has no top-level mxsim_hwconfig key)",
        )
    if not isinstance(data, dict) or "extends" not in data:
        return data
    base_name = data["extends"]
    if not isinstance(base_name, str) or not base_name:
        raise ConfigError(
            str(path),
            "extends",
            f"expected the file name of the config this one extends, got {shown(base_name)}",
        )
    base_path = _base_path(path, base_name)
    chain = chain + (path.resolve(),)
    if base_path in chain:
        cycle = " -> ".join(str(p) for p in chain[chain.index(base_path) :] + (base_path,))
        raise ConfigError(str(path), "extends", f"configs extend each other in a cycle: {cycle}")
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise ConfigError(
            str(chain[0]),
            "extends",
            f"the chain of extended configs is longer than "
            f"{MAX_EXTENDS_DEPTH} files (docs/limits.md)",
        )
    base = _resolved_data(base_path, chain)
    parse_hwconfig(base, str(base_path))  # a base is a complete config: its errors name its file
    merged = {key: value for key, value in base.items()}
    for key, value in data.items():
        if key == "extends":
            continue
        if key == "overrides":
            merged[key] = (
                list(base.get(key) or []) + list(value or []) if isinstance(value, list) else value
            )
        elif key in schema.SCHEMA or key == "array":
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                merged[key] = {**base[key], **value}
            else:
                merged[key] = value
        else:
            merged[key] = value
    return merged


@functools.lru_cache(maxsize=None)
def exact_unit(a_format: str, b_format: str, block_size: int) -> HardwareConfig:
    """The exact (Kulisch) accumulator unit for these operand formats and block size: every
    product and c summed exactly, one round-to-nearest-even into fp32 (hwconfigs/kulisch.yaml).
    Replay's ideal and a compact trace's reference prediction are its results."""
    return parse_hwconfig(
        {
            "mxsim_hwconfig": 1,
            "name": "ideal",
            "description": "exact accumulation, one final rounding",
            "inputs": {
                "a_formats": [a_format],
                "b_formats": [b_format],
                "block_size": block_size,
                "scales": "products",
            },
            "adder": {"fused_terms": block_size, "align_fraction_bits": None},
            "accumulator": {"format": "exact"},
            "output": {"format": "fp32", "rounding": "nearest_even"},
        },
        "the ideal (exact accumulator) unit",
    )
