"""The configurable MX dot-product datapath: hwconfig schema, kernels, reference twin, API."""

from .config import HardwareConfig, load_hwconfig, parse_hwconfig
from .schema import DatapathParams
from .api import MatmulResult, as_float, dot, explain, matmul

__all__ = [
    "DatapathParams",
    "HardwareConfig",
    "MatmulResult",
    "as_float",
    "dot",
    "explain",
    "load_hwconfig",
    "matmul",
    "parse_hwconfig",
]
