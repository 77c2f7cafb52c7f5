"""Input families the probes draw from: batches of dot products designed to expose one
datapath choice (cancellation, ties, tree positions, c placement, specials), plus random
realistic vectors. Everything is built from the format table (no per-format code).
:class:`Context` holds every family (:mod:`mxsim.probe.families`, by kind) on the building
blocks of :class:`~mxsim.probe.draw.Drawing`."""

from __future__ import annotations

from .draw import FP32, FP64, SHARED_SCALE_CODES, Batch, Drawing, random_fields, stream
from .families.realistic import RealisticFamilies
from .families.ties import TiesFamilies
from .families.sums import SumsFamilies
from .families.zeros import ZerosFamilies
from .families.ranges import RangesFamilies
from .families.scales import ScalesFamilies

__all__ = [
    "FP32",
    "FP64",
    "SHARED_SCALE_CODES",
    "Batch",
    "Context",
    "random_fields",
    "stream",
]


class Context(
    RealisticFamilies,
    TiesFamilies,
    SumsFamilies,
    ZerosFamilies,
    RangesFamilies,
    ScalesFamilies,
    Drawing,
):
    """What the probes know of the unit's interface: formats, K, block size, output format,
    the scale format held so far (scale codes are written in it); a seeded generator; a pool
    of element pairs indexed by their product's exponent."""
