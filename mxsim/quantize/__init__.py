"""MX block quantization with every semantic choice named, and its profiles."""

from .bfp import BFP_SPECS, BFPSpec, BFPTensor, get_bfp_spec, quantize_bfp
from .mx import MXTensor, fake_quantize, quantize, quantize_groups
from .options import PROFILES, QuantOptions, resolve_options

__all__ = [
    "BFP_SPECS",
    "PROFILES",
    "BFPSpec",
    "BFPTensor",
    "MXTensor",
    "QuantOptions",
    "fake_quantize",
    "get_bfp_spec",
    "quantize",
    "quantize_bfp",
    "quantize_groups",
    "resolve_options",
]
