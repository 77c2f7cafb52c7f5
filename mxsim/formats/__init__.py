"""Number formats: one table of descriptions, exact encode/decode."""

from .rounding import OVERFLOW_POLICIES, ROUNDING_MODES
from .table import FORMATS, QUARK_ALIASES, FormatInfo, custom_format, get_format

__all__ = [
    "FORMATS",
    "OVERFLOW_POLICIES",
    "QUARK_ALIASES",
    "ROUNDING_MODES",
    "FormatInfo",
    "custom_format",
    "get_format",
]
