"""The ``array:`` section of a hardware config: the dot-product array and its memories.

Every key, its type, default and unit is listed once in :data:`ARRAY_KEYS`; the parser, the
dataclass defaults and docs/cycles.md all follow that table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from mxsim.errors import ConfigError
from mxsim.limits import shown

DATAFLOWS = ("os", "ws", "is")
"""Output-, weight- and input-stationary, named as in SCALE-Sim's ``Dataflow`` setting."""


@dataclass(frozen=True)
class _KeySpec:
    kind: str  # "int", "number" or "dataflow"
    default: Any  # None: the key is required
    minimum: float | None  # smallest accepted value (inclusive), for int and number keys
    unit: str
    meaning: str


# Defaults other than rows/columns mirror SCALE-Sim's sample configs/scale.cfg (64 kB buffers,
# 10 words per cycle, output-stationary), so a SCALE-Sim user gets comparable numbers.
ARRAY_KEYS: dict[str, _KeySpec] = {
    "rows": _KeySpec(
        "int", None, 1, "units", "dot-product units per column (SCALE-Sim ArrayHeight)"
    ),
    "columns": _KeySpec(
        "int", None, 1, "units", "dot-product units per row (SCALE-Sim ArrayWidth)"
    ),
    "lanes_per_unit": _KeySpec(
        "int",
        1,
        1,
        "multipliers",
        "products each unit sums per cycle along K; 1 is a plain systolic PE; for MX "
        "operands it must divide the block size",
    ),
    "pipeline_latency": _KeySpec(
        "int",
        1,
        1,
        "cycles",
        "cycles from a unit's operands to its result; 1 is SCALE-Sim's single-cycle MAC",
    ),
    "clock_mhz": _KeySpec("number", 1000.0, 0, "MHz", "clock frequency, only for seconds"),
    "dataflow": _KeySpec("dataflow", "os", None, "", "os, ws or is"),
    "ifmap_buffer_kib": _KeySpec("number", 64, 0, "KiB", "on-chip buffer for operand A (ifmap)"),
    "filter_buffer_kib": _KeySpec("number", 64, 0, "KiB", "on-chip buffer for operand B (filter)"),
    "ofmap_buffer_kib": _KeySpec(
        "number", 64, 0, "KiB", "on-chip buffer for outputs and partial sums"
    ),
    "offchip_bytes_per_cycle": _KeySpec("number", 10, 0, "bytes/cycle", "off-chip bandwidth"),
    "accumulator_bits": _KeySpec(
        "int", 32, 1, "bits", "width of a partial sum spilled off chip (ws and is only)"
    ),
}


@dataclass(frozen=True)
class ArrayConfig:
    """A rows x columns array of dot-product units with three on-chip buffers.

    Field meanings, units and defaults are those of :data:`ARRAY_KEYS`. Constructing one
    directly validates it the same way :func:`parse_array_config` does.
    """

    rows: int
    columns: int
    lanes_per_unit: int = 1
    pipeline_latency: int = 1
    clock_mhz: float = 1000.0
    dataflow: str = "os"
    ifmap_buffer_kib: float = 64
    filter_buffer_kib: float = 64
    ofmap_buffer_kib: float = 64
    offchip_bytes_per_cycle: float = 10
    accumulator_bits: int = 32

    def __post_init__(self) -> None:
        for field in fields(self):
            _check_value("ArrayConfig", field.name, getattr(self, field.name))

    @property
    def units(self) -> int:
        """Number of dot-product units, rows x columns."""
        return self.rows * self.columns

    def buffer_bytes(self, which: str) -> float:
        """Capacity in bytes of the ``ifmap``, ``filter`` or ``ofmap`` buffer (KiB x 1024)."""
        return getattr(self, f"{which}_buffer_kib") * 1024


def _accepted(spec: _KeySpec) -> str:
    if spec.kind == "dataflow":
        return "one of " + ", ".join(DATAFLOWS)
    noun = "an integer" if spec.kind == "int" else "a number"
    if spec.minimum == 0 and spec.kind == "number":
        return f"{noun} > 0"
    return f"{noun} >= {spec.minimum:g}"


def _check_value(source: str, key: str, value: Any) -> None:
    spec = ARRAY_KEYS[key]
    key_path = f"array.{key}"
    if spec.kind == "dataflow":
        if value not in DATAFLOWS:
            raise ConfigError(source, key_path, f"got {shown(value)}; accepted: {_accepted(spec)}")
        return
    # bool is an int subclass, but `rows: true` is a mistake, never a count
    is_int = isinstance(value, int) and not isinstance(value, bool)
    is_number = is_int or (isinstance(value, float) and math.isfinite(value))
    if (spec.kind == "int" and not is_int) or (spec.kind == "number" and not is_number):
        raise ConfigError(source, key_path, f"got {shown(value)}; accepted: {_accepted(spec)}")
    too_small = (
        value <= 0 if (spec.kind == "number" and spec.minimum == 0) else value < spec.minimum
    )
    if too_small:
        raise ConfigError(source, key_path, f"got {shown(value)}; accepted: {_accepted(spec)}")


def parse_array_config(mapping: Any, source: str) -> ArrayConfig:
    """Validate the ``array:`` mapping of a hardware config and build an :class:`ArrayConfig`.

    ``source`` names the YAML file in error messages. Raises :class:`ConfigError` naming the
    key path (``array.rows``) for a missing required key, an unknown key (listing the valid
    ones), or a value of the wrong type or range (saying what is accepted).
    """
    if not isinstance(mapping, dict):
        raise ConfigError(
            source, "array", f"must be a mapping of keys to values, got {type(mapping).__name__}"
        )
    unknown = sorted(str(key) for key in mapping if key not in ARRAY_KEYS)
    if unknown:
        raise ConfigError(
            source, f"array.{unknown[0]}", f"unknown key; valid keys: {', '.join(ARRAY_KEYS)}"
        )
    values = {}
    for key, spec in ARRAY_KEYS.items():
        if key not in mapping:
            if spec.default is None:
                raise ConfigError(
                    source, f"array.{key}", f"required; {_accepted(spec)} ({spec.meaning})"
                )
            continue
        _check_value(source, key, mapping[key])
        values[key] = mapping[key]
    return ArrayConfig(**values)
