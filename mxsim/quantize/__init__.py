"""MX block quantization with every semantic choice named, and its profiles."""

from .bfp import BFP_SPECS, BFPSpec, BFPTensor, get_bfp_spec, quantize_bfp
from .mx import (
    MXGroups,
    MXTensor,
    fake_quantize,
    quantize,
    quantize_at_scales,
    quantize_grouped,
    quantize_groups,
)
from .nvfp4 import (
    NVFP4_PROFILES,
    NVFP4Groups,
    NVFP4Options,
    NVFP4Tensor,
    quantize_nvfp4,
    quantize_nvfp4_at_scales,
    quantize_nvfp4_grouped,
    tensor_scale_from_amax,
)
from .options import PROFILES, QuantOptions, resolve_options

__all__ = [
    "BFP_SPECS",
    "PROFILES",
    "BFPSpec",
    "BFPTensor",
    "MXGroups",
    "MXTensor",
    "NVFP4Groups",
    "NVFP4Options",
    "NVFP4Tensor",
    "NVFP4_PROFILES",
    "QuantOptions",
    "fake_quantize",
    "get_bfp_spec",
    "quantize",
    "quantize_at_scales",
    "quantize_bfp",
    "quantize_grouped",
    "quantize_groups",
    "quantize_nvfp4",
    "quantize_nvfp4_at_scales",
    "quantize_nvfp4_grouped",
    "resolve_options",
    "tensor_scale_from_amax",
]
