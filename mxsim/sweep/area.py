"""Synthesized area and depth of each sweep point's unit (``mxsim sweep --area``).

Each point's config is turned into RTL (:func:`mxsim.rtl.generate_unit`) for one element-format
pair and one dot length K, and synthesized with Yosys (:func:`mxsim.rtl.synth.synthesize`:
NAND/NOR/NOT cells, a transistor estimate, gate levels on the longest path), cached per
generated design in the per-user cache, so a rerun synthesizes nothing again. The pair is
(F, F) with ``--format F``, else the config's first accepted pair (the one the cost proxy
counts); K is ``--area-k`` for every point (units doing the same work), else each point's
block size. Every point's RTL is generated before any replay runs: a point the generator
does not cover is refused with its key and point named.
"""

from __future__ import annotations

import time
from typing import Callable

from ..datapath import HardwareConfig
from ..errors import ArgumentError, ConfigError, MxsimError
from ..rtl import RtlUnit, generate_unit
from ..rtl.synth import have_yosys, synthesize
from .grid import point_label


def area_pair(config: HardwareConfig, element_format: str | None) -> tuple[str, str]:
    return (element_format, element_format) if element_format else config.format_pairs[0]


def plan_units(
    points: list[tuple[dict, HardwareConfig]], element_format: str | None, k: int | None
) -> list[RtlUnit]:
    """Every point's unit, generated now (ConfigError naming the point when one is not covered;
    ArgumentError for a K the unit does not take); needs Yosys on the PATH."""
    if not have_yosys():
        raise MxsimError(
            "sweep --area: yosys is not installed (apt-get install yosys; docs/area.md)"
        )
    units = []
    for point, config in points:
        try:  # the top module is named by the config's digest: a point's label can be long
            units.append(
                generate_unit(
                    config,
                    *area_pair(config, element_format),
                    k,
                    name=f"mxdot_{config.digest[:16]}",
                )
            )
        except ConfigError as error:
            raise ConfigError(
                error.source,
                error.key_path,
                f"{str(error).split(': ', 2)[-1]} (sweep --area, at point {point_label(point)})",
            ) from None
        except ArgumentError as error:
            raise ArgumentError(f"sweep --area at point {point_label(point)}: {error}") from None
    return units


def add_area(
    records: list[dict], units: list[RtlUnit], report: Callable[[str], None] | None = None
) -> None:
    """Synthesize each record's unit (cached) and store ``record["area"]``: cells, transistors,
    depth, the pair and K. ``report`` gets one progress line per point."""
    for index, (record, unit) in enumerate(zip(records, units, strict=True), 1):
        if report:
            report(
                f"area {index}/{len(units)}: {point_label(record['point'])}: synthesizing {unit.name} ..."
            )
        start = time.perf_counter()
        result = synthesize(unit)
        record["area"] = {
            "cells": result.cells,
            "transistors": result.transistors,
            "depth": result.depth,
            "a_format": unit.params.a_format,
            "b_format": unit.params.b_format,
            "k": unit.dot_length,
        }
        if report:
            report(
                f"area {index}/{len(units)}: {result.cells} cells, {result.transistors} transistors, "
                f"depth {result.depth} ({'cached' if result.cached else f'{time.perf_counter() - start:.0f} s'})"
            )
