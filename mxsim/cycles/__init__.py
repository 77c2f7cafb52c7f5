"""MX-aware cycle model of a systolic array of dot-product units.

For a plain array (one lane per unit, 1-byte words, no scales) the compute cycles equal
SCALE-Sim 3.0.0's; see docs/cycles.md for the formulas and the model of memory traffic.
"""

from mxsim.datapath.array import ARRAY_KEYS, DATAFLOWS, ArrayConfig, parse_array_config
from mxsim.cycles.compute import FoldSchedule, fold_schedule
from mxsim.cycles.estimate import LayerEstimate, TraceEstimate, estimate_layer, estimate_layers
from mxsim.cycles.layers import ConvLayer, GemmLayer, Layer, OperandLayout
from mxsim.cycles.report import format_table
from mxsim.cycles.storage import FORMAT_STORAGE, OperandStorage, StorageBytes, storage_for_format
from mxsim.cycles.topology import read_scalesim_topology
from mxsim.cycles.traffic import Traffic, offchip_traffic

__all__ = [
    "ARRAY_KEYS",
    "DATAFLOWS",
    "FORMAT_STORAGE",
    "ArrayConfig",
    "ConvLayer",
    "FoldSchedule",
    "GemmLayer",
    "Layer",
    "LayerEstimate",
    "OperandLayout",
    "OperandStorage",
    "StorageBytes",
    "TraceEstimate",
    "Traffic",
    "estimate_layer",
    "estimate_layers",
    "fold_schedule",
    "format_table",
    "offchip_traffic",
    "parse_array_config",
    "read_scalesim_topology",
    "storage_for_format",
]
