"""Off-chip bytes a layer moves, from operand storage, buffer sizes and the fold order.

Model (mxsim's own; SCALE-Sim simulates its buffers request by request instead):

* Folds run in SCALE-Sim's order: column folds outer, row folds inner.
* Each buffer keeps reusable data in half its capacity; the other half prefetches (SCALE-Sim's
  ``active_buf_frac = 0.5``). Data whose reuse set fits in that half is fetched once;
  otherwise it is fetched again on every pass of the loop that reuses it.
* Per dataflow, the operand that must be re-read, and what must fit to avoid that:

  ====  ==========================================  ==========================================
  flow  operand A (ifmap)                           operand B (filter)
  ====  ==========================================  ==========================================
  os    all of A fits, else column_folds passes     B for one column fold fits, else row_folds
  ws    all of A fits, else column_folds passes     read once (each weight is stationary once)
  is    read once (each input is stationary once)   all of B fits, else column_folds passes
  ====  ==========================================  ==========================================

* Outputs are written once. In ws and is the reduction is split over row folds; the partial
  sums of one column fold (M x columns in ws, columns x N in is, ``accumulator_bits`` each)
  stay on chip if they fit in half the ofmap buffer, otherwise they are written out and read
  back once per extra row fold: 2 x (row_folds - 1) x M x N partial sums in all.
* Bytes of each operand come from its :class:`~mxsim.cycles.storage.OperandStorage`.
"""

from __future__ import annotations

from dataclasses import dataclass

from mxsim.datapath.array import ArrayConfig
from mxsim.cycles.compute import FoldSchedule
from mxsim.cycles.layers import Layer
from mxsim.cycles.storage import OperandStorage, StorageBytes


@dataclass(frozen=True)
class Traffic:
    """Off-chip bytes of one layer: each operand's bytes over all its passes."""

    ifmap: StorageBytes
    filter: StorageBytes
    ofmap: StorageBytes
    partial_sum_bytes: int
    ifmap_passes: int
    filter_passes: int
    partial_sum_spills: int

    @property
    def element_bytes(self) -> int:
        """Element bytes of A, B and outputs; partial sums are counted apart."""
        return self.ifmap.element_bytes + self.filter.element_bytes + self.ofmap.element_bytes

    @property
    def scale_bytes(self) -> int:
        """Scale and microexponent bytes of A, B and outputs."""
        return self.ifmap.scale_bytes + self.filter.scale_bytes + self.ofmap.scale_bytes

    @property
    def total_bytes(self) -> int:
        return self.element_bytes + self.scale_bytes + self.partial_sum_bytes


def offchip_traffic(
    array: ArrayConfig,
    layer: Layer,
    schedule: FoldSchedule,
    a_storage: OperandStorage,
    b_storage: OperandStorage,
    out_storage: OperandStorage,
) -> Traffic:
    """Off-chip bytes of ``layer`` under ``schedule`` (see the module doc for the model)."""
    a_layout, b_layout, out_layout = layer.ifmap_layout, layer.filter_layout, layer.ofmap_layout
    a_bytes = a_storage.operand_bytes(a_layout.rows, a_layout.length)
    b_bytes = b_storage.operand_bytes(b_layout.rows, b_layout.length)
    out_bytes = out_storage.operand_bytes(out_layout.rows, out_layout.length)
    a_room = array.buffer_bytes("ifmap") / 2
    b_room = array.buffer_bytes("filter") / 2
    psum_room = array.buffer_bytes("ofmap") / 2
    M, N = layer.M, layer.N
    dataflow = schedule.dataflow

    ifmap_passes = filter_passes = 1
    if dataflow in ("os", "ws") and a_bytes.total_bytes > a_room:
        ifmap_passes = schedule.column_folds
    if dataflow == "os":
        filters_per_fold = min(array.columns, N)
        rows_per_filter = b_layout.rows // N  # filter taps (1 for a GEMM)
        b_fold_bytes = b_storage.operand_bytes(filters_per_fold * rows_per_filter, b_layout.length)
        if b_fold_bytes.total_bytes > b_room:
            filter_passes = schedule.row_folds
    if dataflow == "is" and b_bytes.total_bytes > b_room:
        filter_passes = schedule.column_folds

    partial_sum_spills = 0
    if dataflow in ("ws", "is") and schedule.row_folds > 1:
        psums_per_fold = (
            M * min(array.columns, N) if dataflow == "ws" else min(array.columns, M) * N
        )
        if psums_per_fold * array.accumulator_bits > 8 * psum_room:
            partial_sum_spills = schedule.row_folds - 1
    partial_sum_bytes = -(-2 * partial_sum_spills * M * N * array.accumulator_bits // 8)

    return Traffic(
        ifmap=a_bytes.times(ifmap_passes),
        filter=b_bytes.times(filter_passes),
        ofmap=out_bytes,
        partial_sum_bytes=partial_sum_bytes,
        ifmap_passes=ifmap_passes,
        filter_passes=filter_passes,
        partial_sum_spills=partial_sum_spills,
    )
