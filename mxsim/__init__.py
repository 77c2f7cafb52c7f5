"""mxsim: a bit-accurate emulator of MX (OCP Microscaling) accelerator datapaths."""

__version__ = "0.1.0"

from .datapath import HardwareConfig, as_float, dot, explain, load_hwconfig, matmul
from .formats import FORMATS, FormatInfo, custom_format, get_format
from .quantize import BFP_SPECS, PROFILES, BFPSpec, BFPTensor, MXTensor, QuantOptions, fake_quantize, quantize, quantize_bfp

__all__ = [
    "HardwareConfig",
    "as_float",
    "dot",
    "explain",
    "load_hwconfig",
    "matmul",
    "BFP_SPECS",
    "BFPSpec",
    "BFPTensor",
    "quantize_bfp",
    "FORMATS",
    "PROFILES",
    "FormatInfo",
    "MXTensor",
    "QuantOptions",
    "custom_format",
    "fake_quantize",
    "get_format",
    "quantize",
]
