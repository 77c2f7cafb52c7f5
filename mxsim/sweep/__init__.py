"""Design-space sweeps: a trace replayed under every point of a grid of hwconfig changes.

* :mod:`.grid` — ``--vary KEY=VALUES`` knobs and the validated grid of configs.
* :mod:`.cost` — the hardware-cost proxy (bits of adder and accumulator state).
* :mod:`.area` — synthesized area and depth of each point's unit (``--area``, Yosys via :mod:`mxsim.rtl`).
* :mod:`.run` — running the points (in-process or on Dask), resumable per-point storage.
* :mod:`.report` — table, JSON, CSV and plots.
"""

from .cost import hardware_cost
from .grid import Knob, grid_configs, parse_knob, parse_knobs, point_label
from .report import csv_text, format_table, write_outputs, write_plots
from .run import pareto_front, replay_point, run_sweep, trace_digest

__all__ = [
    "Knob",
    "csv_text",
    "format_table",
    "grid_configs",
    "hardware_cost",
    "pareto_front",
    "parse_knob",
    "parse_knobs",
    "point_label",
    "replay_point",
    "run_sweep",
    "trace_digest",
    "write_outputs",
    "write_plots",
]
