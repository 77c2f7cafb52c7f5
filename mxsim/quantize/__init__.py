"""MX block quantization with every semantic choice named, and its profiles."""

from .mx import MXTensor, fake_quantize, quantize
from .options import PROFILES, QuantOptions, resolve_options

__all__ = ["PROFILES", "MXTensor", "QuantOptions", "fake_quantize", "quantize", "resolve_options"]
