"""The sweep grid: ``--vary KEY=VALUES`` knobs over hwconfig key paths, and their points.

``KEY`` is a key path of the hardware-config schema (``adder.align_fraction_bits``; see
``docs/hwconfig.md``). ``VALUES`` is an inclusive integer range ``a:b`` or ``a:b:step`` (for
integer keys), or a comma-separated list of YAML scalars (``8,16,32``, ``fp32,bf16``,
``true,false``, ``null`` for an optional key). The grid is the Cartesian product of the knobs,
in the order given, each knob's values in the order given.

Bounds, checked on the text before any value or config is built (docs/limits.md): at most
MAX_GRID_POINTS values in one knob and points in the whole grid (a grid's size is the
product of its knobs' sizes, computed, never enumerated); a range's ends lie within the
key's schema bounds; a list holds plain scalars only (null, true/false, integers, names:
YAML tags, anchors, aliases and collections are refused).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import yaml

from ..datapath import HardwareConfig
from ..datapath.config import key_of_path, vary_hwconfig
from ..errors import ArgumentError, BudgetError, ConfigError, MxsimError
from ..limits import shown

#: Most values one knob may have and most points a grid may have (each point is a whole replay).
MAX_GRID_POINTS = 10_000
#: Longest integer text accepted in a range (a 2^63 range end has 19 digits).
MAX_INTEGER_DIGITS = 40
INTEGER_KINDS = ("int", "optional_int")
UNVARIABLE_KINDS = (
    "order",
    "format_groups",
)  # a list (of lists) per value: not expressible as a comma list


@dataclass(frozen=True)
class Knob:
    """One varied key path and its values (YAML-typed: int, bool, str or None)."""

    key_path: str
    values: tuple


def _integer(text: str, option: str) -> int:
    text = text.strip()
    if len(text) > MAX_INTEGER_DIGITS or not text.lstrip("+-").isdigit() or not text.isascii():
        raise ArgumentError(
            f"--vary {shown(option)}: {shown(text)} is not an integer of at most "
            f"{MAX_INTEGER_DIGITS} digits (ranges are a:b or a:b:step)"
        )
    return int(text)


def _list_value(item: str, option: str):
    """One list item as a plain YAML scalar: None, a bool, an int, a float or a str."""
    if item[0] in "!&*[]{}|>'\"%@`#" or len(item) > 200:
        raise ArgumentError(
            f"--vary {shown(option)}: {shown(item)} is not a plain value; give null, "
            "true/false, integers or names"
        )
    try:
        value = yaml.safe_load(item)
    except (yaml.YAMLError, ValueError, KeyError, TypeError, OverflowError, RecursionError):
        # PyYAML's constructors raise ValueError (a date such as 2001-13-45) and others
        raise ArgumentError(
            f"--vary {shown(option)}: {shown(item)} is not a plain value; give null, "
            "true/false, integers or names"
        ) from None
    if value is not None and not isinstance(value, (bool, int, float, str)):
        raise ArgumentError(
            f"--vary {shown(option)}: {shown(item)} reads as a {type(value).__name__}; give "
            "null, true/false, integers or names"
        )
    return value


def _range_values(option: str, spec: str, key, key_path: str, source: str) -> range:
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise ArgumentError(f"--vary {shown(option)}: a range is a:b or a:b:step")
    start, stop = _integer(parts[0], option), _integer(parts[1], option)
    step = _integer(parts[2], option) if len(parts) == 3 else 1
    if step < 1 or stop < start:
        raise ArgumentError(f"--vary {shown(option)}: a range a:b:step needs a <= b and step >= 1")
    low = key.minimum
    high = key.maximum
    if (low is not None and start < low) or (high is not None and stop > high):
        bounds = f"{low}..{high}" if high is not None else f">= {low}"
        raise ConfigError(
            source, key_path, f"the range {shown(spec)} leaves the key's values {bounds}"
        )
    count = (stop - start) // step + 1
    if count > MAX_GRID_POINTS:
        raise BudgetError(
            f"--vary {shown(option)}: {count} values; a knob and a grid hold at most "
            f"{MAX_GRID_POINTS} points (docs/limits.md)"
        )
    return range(start, stop + 1, step)


def parse_knob(option: str, source: str = "<config>") -> Knob:
    """One ``--vary`` argument; errors name the key path and list what it accepts."""
    if not isinstance(option, str):
        raise ArgumentError(f"--vary: expected a KEY=VALUES string, got {type(option).__name__}")
    key_path, equals, spec = option.partition("=")
    key_path, spec = key_path.strip(), spec.strip()
    if not equals or not key_path or not spec:
        raise ArgumentError(
            f"--vary {shown(option)}: expected KEY=VALUES, e.g. adder.fused_terms=8,16,32 or "
            "adder.align_fraction_bits=8:28"
        )
    key = key_of_path(key_path, source)
    if key.kind in UNVARIABLE_KINDS:
        raise ConfigError(
            source,
            key_path,
            "cannot be varied (its values are lists); vary keys of kind "
            "int, optional_int, bool, str, format or format_list",
        )
    if ":" in spec:
        if key.kind not in INTEGER_KINDS:
            raise ConfigError(
                source,
                key_path,
                f"a range {shown(spec)} needs an integer key; give a list "
                f"of values from {', '.join(map(str, key.choices)) or 'true, false'}",
            )
        values = tuple(_range_values(option, spec, key, key_path, source))
    else:
        items = [item.strip() for item in spec.split(",")]
        if not all(items):
            raise ArgumentError(f"--vary {shown(option)}: an empty value in the list")
        if len(items) > MAX_GRID_POINTS:
            raise BudgetError(
                f"--vary {shown(option)}: {len(items)} values; a knob and a grid hold at most "
                f"{MAX_GRID_POINTS} points (docs/limits.md)"
            )
        values = tuple(_list_value(item, option) for item in items)
    if len(set(map(repr, values))) != len(values):
        raise ArgumentError(f"--vary {shown(option)}: a value is repeated")
    return Knob(key_path, values)


def parse_knobs(options: list[str], source: str = "<config>") -> list[Knob]:
    knobs = [parse_knob(option, source) for option in options]
    paths = [knob.key_path for knob in knobs]
    if not knobs:
        raise MxsimError("a sweep needs at least one --vary KEY=VALUES")
    if len(set(paths)) != len(paths):
        raise MxsimError(f"--vary: each key path once, got {', '.join(paths)}")
    check_grid_size(knobs)
    return knobs


def check_grid_size(knobs: list[Knob]) -> int:
    """The grid's point count (the product of the knobs' sizes); BudgetError above MAX_GRID_POINTS."""
    points = math.prod(len(knob.values) for knob in knobs)
    if points > MAX_GRID_POINTS:
        sizes = " x ".join(str(len(knob.values)) for knob in knobs)
        raise BudgetError(
            f"--vary: the grid has {sizes} = {points} points; at most {MAX_GRID_POINTS} "
            "(docs/limits.md)"
        )
    return points


def point_label(point: dict[str, Any]) -> str:
    """``adder.fused_terms=16,accumulator.format=bf16``: a point's name in tables and errors."""
    return ",".join(
        f"{path}={'null' if value is None else str(value).lower() if isinstance(value, bool) else value}"
        for path, value in point.items()
    )


def grid_configs(
    base: HardwareConfig, knobs: list[Knob]
) -> list[tuple[dict[str, Any], HardwareConfig]]:
    """Every point of the grid with its validated config (built before anything runs: a bad
    value or an inconsistent combination is an error naming the point and the key); the
    grid's size is checked first (see :func:`check_grid_size`)."""
    check_grid_size(knobs)
    points = []
    for values in itertools.product(*(knob.values for knob in knobs)):
        point = {knob.key_path: value for knob, value in zip(knobs, values)}
        try:
            config = vary_hwconfig(base, point, name=f"{base.name}[{point_label(point)}]")
        except ConfigError as error:
            raise ConfigError(
                error.source,
                error.key_path,
                f"{str(error).split(': ', 2)[-1]} (at sweep point {point_label(point)})",
            ) from None
        points.append((point, config))
    return points
