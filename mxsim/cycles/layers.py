"""Layers as the cycle model sees them: a GEMM, or a convolution lowered to one.

GEMM convention (SCALE-Sim's): output O (M x N) = A (M x K) @ B (K x N). A is the ifmap
operand, B the filter operand, O the ofmap. A convolution maps to M = output pixels,
N = filters, K = filter height x filter width x channels (topology_utils.py and
operand_matrix.py in SCALE-Sim 3.0.0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

from mxsim.errors import MxsimError


def ceil_div(numerator: int, denominator: int | float) -> int:
    """The smallest integer >= numerator / denominator: exact integer arithmetic when the
    denominator is an integer, ``math.ceil`` of the float quotient otherwise."""
    if isinstance(denominator, int):
        return -(-numerator // denominator)
    return math.ceil(numerator / denominator)


def _check_dimensions(layer_name: str, **dimensions: int) -> None:
    for key, value in dimensions.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise MxsimError(f"layer {layer_name!r}: {key} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class OperandLayout:
    """An operand in memory as ``rows`` runs of ``length`` elements along its blocked axis."""

    rows: int
    length: int


@dataclass(frozen=True)
class GemmLayer:
    """O (M x N) = A (M x K) @ B (K x N).

    In memory A is M rows of K, B is N rows of K (both blocked along the reduction K) and O
    is M rows of N (blocked along N, the next layer's reduction axis).
    """

    name: str
    M: int
    N: int
    K: int

    def __post_init__(self) -> None:
        _check_dimensions(self.name, M=self.M, N=self.N, K=self.K)

    def gemm(self) -> GemmLayer:
        return self

    def reduction_steps(self, lanes_per_unit: int) -> int:
        """Cycles a unit needs to consume one output's reduction, ``lanes_per_unit`` at a time."""
        return ceil_div(self.K, lanes_per_unit)

    @property
    def ifmap_layout(self) -> OperandLayout:
        return OperandLayout(self.M, self.K)

    @property
    def filter_layout(self) -> OperandLayout:
        return OperandLayout(self.N, self.K)

    @property
    def ofmap_layout(self) -> OperandLayout:
        return OperandLayout(self.M, self.N)


@dataclass(frozen=True)
class ConvLayer:
    """A convolution without padding, as in a SCALE-Sim conv topology row.

    Output size follows SCALE-Sim: ``ceil((ifmap - filter + stride) / stride)`` per axis.
    In memory the ifmap is height x width rows of ``channels``, the filters are
    ``filters`` x filter height x filter width rows of ``channels`` (MX blocks run along
    channels, so a block never spans two filter taps) and the ofmap is output pixels rows
    of ``filters``.
    """

    name: str
    ifmap_height: int
    ifmap_width: int
    filter_height: int
    filter_width: int
    channels: int
    filters: int
    stride_height: int
    stride_width: int

    def __post_init__(self) -> None:
        _check_dimensions(
            self.name,
            ifmap_height=self.ifmap_height,
            ifmap_width=self.ifmap_width,
            filter_height=self.filter_height,
            filter_width=self.filter_width,
            channels=self.channels,
            filters=self.filters,
            stride_height=self.stride_height,
            stride_width=self.stride_width,
        )
        # SCALE-Sim asserts the same (topology_utils.append_topo_arrays)
        if self.filter_height > self.ifmap_height or self.filter_width > self.ifmap_width:
            raise MxsimError(
                f"layer {self.name!r}: filter {self.filter_height}x{self.filter_width} "
                f"is larger than ifmap {self.ifmap_height}x{self.ifmap_width}"
            )

    @property
    def ofmap_height(self) -> int:
        stride = self.stride_height
        return ceil_div(self.ifmap_height - self.filter_height + stride, stride)

    @property
    def ofmap_width(self) -> int:
        stride = self.stride_width
        return ceil_div(self.ifmap_width - self.filter_width + stride, stride)

    def gemm(self) -> GemmLayer:
        """SCALE-Sim's lowering: M = output pixels, N = filters, K = filter window size."""
        return GemmLayer(
            self.name,
            M=self.ofmap_height * self.ofmap_width,
            N=self.filters,
            K=self.filter_height * self.filter_width * self.channels,
        )

    @property
    def M(self) -> int:
        return self.ofmap_height * self.ofmap_width

    @property
    def N(self) -> int:
        return self.filters

    @property
    def K(self) -> int:
        return self.filter_height * self.filter_width * self.channels

    def reduction_steps(self, lanes_per_unit: int) -> int:
        """Filter taps x ``ceil(channels / lanes)``: lanes never mix taps (K when lanes is 1)."""
        return self.filter_height * self.filter_width * ceil_div(self.channels, lanes_per_unit)

    @property
    def ifmap_layout(self) -> OperandLayout:
        return OperandLayout(self.ifmap_height * self.ifmap_width, self.channels)

    @property
    def filter_layout(self) -> OperandLayout:
        return OperandLayout(self.filters * self.filter_height * self.filter_width, self.channels)

    @property
    def ofmap_layout(self) -> OperandLayout:
        return OperandLayout(self.M, self.filters)


Layer = Union[GemmLayer, ConvLayer]
