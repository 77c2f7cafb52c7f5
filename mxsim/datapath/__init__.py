"""The configurable MX dot-product datapath: hwconfig schema, kernels, reference twin, API."""

from .config import HardwareConfig, load_hwconfig, parse_hwconfig
from .schema import DatapathParams
from .api import BatchedMatmulResult, MatmulResult, as_float, dot, explain, matmul, matmul_batched

__all__ = [
    "BatchedMatmulResult",
    "DatapathParams",
    "HardwareConfig",
    "MatmulResult",
    "as_float",
    "dot",
    "explain",
    "load_hwconfig",
    "matmul",
    "matmul_batched",
    "parse_hwconfig",
]
