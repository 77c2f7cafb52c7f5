"""Per-layer and per-trace cycle estimates: compute, off-chip memory, and their overlap."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from operator import attrgetter

from mxsim.datapath.array import ArrayConfig
from mxsim.cycles.compute import FoldSchedule, fold_schedule
from mxsim.cycles.layers import Layer, ceil_div
from mxsim.cycles.storage import OperandStorage
from mxsim.cycles.traffic import Traffic, offchip_traffic
from mxsim.errors import MxsimError


def _bytes_dict(traffic: Traffic) -> dict:
    def operand(storage_bytes, passes):
        return {
            "elements": storage_bytes.element_bytes,
            "scales": storage_bytes.scale_bytes,
            "passes": passes,
        }

    return {
        "ifmap": operand(traffic.ifmap, traffic.ifmap_passes),
        "filter": operand(traffic.filter, traffic.filter_passes),
        "ofmap": operand(traffic.ofmap, 1),
        "partial_sums": traffic.partial_sum_bytes,
        "partial_sum_spills": traffic.partial_sum_spills,
        "elements": traffic.element_bytes,
        "scales": traffic.scale_bytes,
        "total": traffic.total_bytes,
    }


@dataclass(frozen=True)
class LayerEstimate:
    """Cycle estimate of one layer.

    * ``compute_cycles``: the array alone, never waiting for memory (see :mod:`compute`);
    * ``memory_cycles``: ``ceil(traffic.total_bytes / offchip_bytes_per_cycle)``;
    * ``total_cycles``: ``max(compute_cycles, memory_cycles)`` -- double buffering overlaps
      transfers with compute entirely, so the slower of the two sets the pace;
    * ``utilisation``: ``macs / (total_cycles x units x lanes_per_unit)``, SCALE-Sim's
      "Overall Util" with lanes counted (its numerator is M x N x K as well);
    * ``compute_utilisation``: the same with ``compute_cycles``.

    Cycle denominators are taken as at least 1 (a 1x1 layer on a 1x1 array takes "0"
    cycles in SCALE-Sim's count).
    """

    name: str
    M: int
    N: int
    K: int
    macs: int
    reduction_steps: int
    schedule: FoldSchedule
    traffic: Traffic
    memory_cycles: int
    total_cycles: int
    utilisation: float
    compute_utilisation: float
    seconds: float

    @property
    def compute_cycles(self) -> int:
        return self.schedule.compute_cycles

    @property
    def bound(self) -> str:
        """``"memory"`` when off-chip transfers take longer than compute, else ``"compute"``."""
        return "memory" if self.memory_cycles > self.compute_cycles else "compute"

    def to_dict(self) -> dict:
        """A JSON-ready dict of every figure."""
        schedule = self.schedule
        return {
            "name": self.name,
            "M": self.M,
            "N": self.N,
            "K": self.K,
            "macs": self.macs,
            "dataflow": schedule.dataflow,
            "reduction_steps": self.reduction_steps,
            "folds": {
                "row": schedule.row_folds,
                "column": schedule.column_folds,
                "total": schedule.folds,
                "cycles_each": schedule.cycles_per_fold,
            },
            "cycles": {
                "compute": self.compute_cycles,
                "memory": self.memory_cycles,
                "total": self.total_cycles,
                "bound": self.bound,
            },
            "seconds": self.seconds,
            "mapping_efficiency": schedule.mapping_efficiency,
            "compute_utilisation": self.compute_utilisation,
            "utilisation": self.utilisation,
            "bytes": _bytes_dict(self.traffic),
        }


def _layer_sum(figure: str) -> property:
    """A :class:`TraceEstimate` total: the layers' ``figure`` (a dotted attribute path) summed."""
    read = attrgetter(figure)
    return property(
        lambda self: sum(read(layer) for layer in self.layers), doc=f"Sum of the layers' {figure}."
    )


@dataclass(frozen=True)
class TraceEstimate:
    """Estimates of a sequence of layers run one after another, with totals (layers do not
    overlap each other: ``total_cycles`` is the sum of per-layer totals)."""

    array: ArrayConfig
    layers: tuple[LayerEstimate, ...]

    macs = _layer_sum("macs")
    compute_cycles = _layer_sum("compute_cycles")
    memory_cycles = _layer_sum("memory_cycles")
    total_cycles = _layer_sum("total_cycles")
    element_bytes = _layer_sum("traffic.element_bytes")
    scale_bytes = _layer_sum("traffic.scale_bytes")
    partial_sum_bytes = _layer_sum("traffic.partial_sum_bytes")
    total_bytes = _layer_sum("traffic.total_bytes")

    @property
    def seconds(self) -> float:
        return self.total_cycles / (self.array.clock_mhz * 1e6)

    @property
    def utilisation(self) -> float:
        """All MACs over all cycles times the array's lane count."""
        lanes = self.array.units * self.array.lanes_per_unit
        return self.macs / (max(self.total_cycles, 1) * lanes)

    def to_dict(self) -> dict:
        """A JSON-ready dict: the array config, every layer, and the totals."""
        return {
            "array": asdict(self.array),
            "layers": [layer.to_dict() for layer in self.layers],
            "totals": {
                "layers": len(self.layers),
                "macs": self.macs,
                "cycles": {
                    "compute": self.compute_cycles,
                    "memory": self.memory_cycles,
                    "total": self.total_cycles,
                },
                "seconds": self.seconds,
                "utilisation": self.utilisation,
                "bytes": {
                    "elements": self.element_bytes,
                    "scales": self.scale_bytes,
                    "partial_sums": self.partial_sum_bytes,
                    "total": self.total_bytes,
                },
            },
        }


def _check_lanes(array: ArrayConfig, storage: OperandStorage, operand: str) -> None:
    block = storage.block_size
    if block is not None and block % array.lanes_per_unit:
        raise MxsimError(
            f"array.lanes_per_unit {array.lanes_per_unit} does not divide the block size {block} "
            f"of operand {operand}; a unit would mix two scale blocks (use a divisor of {block})"
        )


def estimate_layer(
    array: ArrayConfig,
    layer: Layer,
    a_storage: OperandStorage,
    b_storage: OperandStorage,
    out_storage: OperandStorage,
) -> LayerEstimate:
    """Estimate one layer (a :class:`GemmLayer` or :class:`ConvLayer`) on ``array``.

    ``a_storage``, ``b_storage`` and ``out_storage`` describe operand A (ifmap), operand B
    (filter) and the output in memory. Raises :class:`MxsimError` when the array's lanes do
    not divide the block size of A or B.
    """
    _check_lanes(array, a_storage, "A (ifmap)")
    _check_lanes(array, b_storage, "B (filter)")
    steps = layer.reduction_steps(array.lanes_per_unit)
    schedule = fold_schedule(array, layer.M, layer.N, steps)
    traffic = offchip_traffic(array, layer, schedule, a_storage, b_storage, out_storage)
    memory_cycles = ceil_div(traffic.total_bytes, array.offchip_bytes_per_cycle)
    total_cycles = max(schedule.compute_cycles, memory_cycles)
    macs = layer.M * layer.N * layer.K
    lanes = array.units * array.lanes_per_unit
    return LayerEstimate(
        name=layer.name,
        M=layer.M,
        N=layer.N,
        K=layer.K,
        macs=macs,
        reduction_steps=steps,
        schedule=schedule,
        traffic=traffic,
        memory_cycles=memory_cycles,
        total_cycles=total_cycles,
        utilisation=macs / (max(total_cycles, 1) * lanes),
        compute_utilisation=macs / (max(schedule.compute_cycles, 1) * lanes),
        seconds=total_cycles / (array.clock_mhz * 1e6),
    )


def estimate_layers(
    array: ArrayConfig,
    layers: Iterable[Layer],
    a_storage: OperandStorage,
    b_storage: OperandStorage,
    out_storage: OperandStorage,
) -> TraceEstimate:
    """Estimate every layer with the same operand storages; see :func:`estimate_layer`."""
    return TraceEstimate(
        array,
        tuple(estimate_layer(array, layer, a_storage, b_storage, out_storage) for layer in layers),
    )
