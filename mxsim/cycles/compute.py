"""Closed-form compute cycles of a layer on the array, SCALE-Sim's fold model generalised.

SCALE-Sim 3.0.0 (scalesim/compute/systolic_compute_{os,ws,is}.py) maps a GEMM onto the
array as spatial extents Sr (along rows) and Sc (along columns) and a temporal extent T,
cuts Sr and Sc into folds of at most rows x columns, and runs folds one after another,
each draining before the next starts. Its demand matrices have, per fold,

* os: T + rows + columns - 2 lines,
* ws and is: 2 rows + columns + T - 2 lines,

and its memory loop (memory/double_buffered_scratchpad_mem.py) reports as "Total Cycles"
the index of the last line, counted from 0: lines - 1 when nothing stalls.

mxsim generalises this in two ways that both vanish for a plain array:

* a unit with L lanes consumes L reduction elements per cycle, so the reduction extent is
  ``layer.reduction_steps(L)`` (ceil(K / L) for a GEMM) instead of K;
* a unit with pipeline latency p finishes its last dot product p - 1 cycles after a
  single-cycle PE would, once per fold (operands can be skewed ahead of the result, so only
  the fold's final result waits).
"""

from __future__ import annotations

from dataclasses import dataclass

from mxsim.datapath.array import ArrayConfig
from mxsim.cycles.layers import ceil_div


@dataclass(frozen=True)
class FoldSchedule:
    """How a layer folds onto the array, and the compute cycles that follow.

    ``spatial_rows``/``spatial_columns``/``temporal`` are SCALE-Sim's Sr, Sc and T with the
    reduction counted in steps of ``lanes_per_unit``. ``compute_cycles`` is
    ``folds * cycles_per_fold - 1``, SCALE-Sim's "Total Cycles" without stalls.
    ``mapping_efficiency`` is SCALE-Sim's: the mean over folds of (units holding mapped
    work) / (rows x columns).
    """

    dataflow: str
    spatial_rows: int
    spatial_columns: int
    temporal: int
    row_folds: int
    column_folds: int
    cycles_per_fold: int
    compute_cycles: int
    mapping_efficiency: float

    @property
    def folds(self) -> int:
        return self.row_folds * self.column_folds


def spatiotemporal_extents(
    dataflow: str, M: int, N: int, reduction_steps: int
) -> tuple[int, int, int]:
    """(Sr, Sc, T) as in SCALE-Sim's ``calc_spatio_temporal_params``, K replaced by steps."""
    if dataflow == "os":
        return M, N, reduction_steps
    if dataflow == "ws":
        return reduction_steps, N, M
    if dataflow == "is":
        return reduction_steps, M, N
    raise ValueError(f"unknown dataflow {dataflow!r}")


def fold_schedule(array: ArrayConfig, M: int, N: int, reduction_steps: int) -> FoldSchedule:
    """Folds and compute cycles of an (M, N, reduction_steps) GEMM on ``array``."""
    rows, columns = array.rows, array.columns
    spatial_rows, spatial_columns, temporal = spatiotemporal_extents(
        array.dataflow, M, N, reduction_steps
    )
    row_folds = ceil_div(spatial_rows, rows)
    column_folds = ceil_div(spatial_columns, columns)
    if array.dataflow == "os":
        # operands skew in over rows - 1 and columns - 1 cycles while T products accumulate
        fold_lines = temporal + rows + columns - 2
    else:
        # rows cycles to load the stationary operand, then the stream skews through
        # rows - 1 and columns - 1 cycles (SCALE-Sim's prefix/suffix/skew per fold)
        fold_lines = 2 * rows + columns + temporal - 2
    cycles_per_fold = fold_lines + array.pipeline_latency - 1
    folds = row_folds * column_folds
    # Summed over folds, the units used along rows total Sr and along columns Sc, so the
    # mean of rows_used * columns_used / (rows * columns) over all folds factorises.
    mapping_efficiency = (spatial_rows * spatial_columns) / (rows * columns * folds)
    return FoldSchedule(
        dataflow=array.dataflow,
        spatial_rows=spatial_rows,
        spatial_columns=spatial_columns,
        temporal=temporal,
        row_folds=row_folds,
        column_folds=column_folds,
        cycles_per_fold=cycles_per_fold,
        compute_cycles=folds * cycles_per_fold - 1,
        mapping_efficiency=mapping_efficiency,
    )
