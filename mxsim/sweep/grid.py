"""The sweep grid: ``--vary KEY=VALUES`` knobs over hwconfig key paths, and their points.

``KEY`` is a key path of the hardware-config schema (``adder.align_fraction_bits``; see
``docs/hwconfig.md``). ``VALUES`` is an inclusive integer range ``a:b`` or ``a:b:step`` (for
integer keys), or a comma-separated list of YAML scalars (``8,16,32``, ``fp32,bf16``,
``true,false``, ``null`` for an optional key). The grid is the Cartesian product of the knobs,
in the order given, each knob's values in the order given.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import yaml

from ..datapath import HardwareConfig
from ..datapath.config import key_of_path, vary_hwconfig
from ..errors import ConfigError, MxsimError

INTEGER_KINDS = ("int", "optional_int")
UNVARIABLE_KINDS = ("order",)  # a permutation per value: not expressible as a comma list


@dataclass(frozen=True)
class Knob:
    """One varied key path and its values (YAML-typed: int, bool, str or None)."""

    key_path: str
    values: tuple


def _integer(text: str, option: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise MxsimError(f"--vary {option}: {text!r} is not an integer (ranges are a:b or a:b:step)") from None


def parse_knob(option: str, source: str = "<config>") -> Knob:
    """One ``--vary`` argument; errors name the key path and list what it accepts."""
    key_path, equals, spec = option.partition("=")
    key_path, spec = key_path.strip(), spec.strip()
    if not equals or not key_path or not spec:
        raise MxsimError(f"--vary {option!r}: expected KEY=VALUES, e.g. adder.fused_terms=8,16,32 or "
                         "adder.align_fraction_bits=8:28")
    key = key_of_path(key_path, source)
    if key.kind in UNVARIABLE_KINDS:
        raise ConfigError(source, key_path, "cannot be varied (its values are lists); vary keys of kind "
                                            "int, optional_int, bool, str, format or format_list")
    if ":" in spec:
        if key.kind not in INTEGER_KINDS:
            raise ConfigError(source, key_path, f"a range {spec!r} needs an integer key; give a list "
                                                f"of values from {', '.join(map(str, key.choices)) or 'true, false'}")
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise MxsimError(f"--vary {option}: a range is a:b or a:b:step")
        start, stop = _integer(parts[0], option), _integer(parts[1], option)
        step = _integer(parts[2], option) if len(parts) == 3 else 1
        if step < 1 or stop < start:
            raise MxsimError(f"--vary {option}: a range a:b:step needs a <= b and step >= 1")
        values = tuple(range(start, stop + 1, step))
    else:
        items = [item.strip() for item in spec.split(",")]
        if not all(items):
            raise MxsimError(f"--vary {option}: an empty value in the list")
        try:
            values = tuple(yaml.safe_load(item) for item in items)
        except yaml.YAMLError:
            raise MxsimError(f"--vary {option}: values must be plain YAML scalars") from None
    if len(set(map(repr, values))) != len(values):
        raise MxsimError(f"--vary {option}: a value is repeated")
    return Knob(key_path, values)


def parse_knobs(options: list[str], source: str = "<config>") -> list[Knob]:
    knobs = [parse_knob(option, source) for option in options]
    paths = [knob.key_path for knob in knobs]
    if not knobs:
        raise MxsimError("a sweep needs at least one --vary KEY=VALUES")
    if len(set(paths)) != len(paths):
        raise MxsimError(f"--vary: each key path once, got {', '.join(paths)}")
    return knobs


def point_label(point: dict[str, Any]) -> str:
    """``adder.fused_terms=16,accumulator.format=bf16``: a point's name in tables and errors."""
    return ",".join(f"{path}={'null' if value is None else str(value).lower() if isinstance(value, bool) else value}"
                    for path, value in point.items())


def grid_configs(base: HardwareConfig, knobs: list[Knob]) -> list[tuple[dict[str, Any], HardwareConfig]]:
    """Every point of the grid with its validated config (built before anything runs: a bad
    value or an inconsistent combination is an error naming the point and the key)."""
    points = []
    for values in itertools.product(*(knob.values for knob in knobs)):
        point = {knob.key_path: value for knob, value in zip(knobs, values)}
        try:
            config = vary_hwconfig(base, point, name=f"{base.name}[{point_label(point)}]")
        except ConfigError as error:
            raise ConfigError(error.source, error.key_path,
                              f"{str(error).split(': ', 2)[-1]} (at sweep point {point_label(point)})") from None
        points.append((point, config))
    return points
