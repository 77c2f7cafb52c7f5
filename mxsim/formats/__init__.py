"""Number formats: one table of descriptions, exact encode/decode."""

from .rounding import OVERFLOW_POLICIES, ROUNDING_MODES
from .table import (
    E8M0_BIAS,
    E8M0_NAN,
    E8M0_ONE,
    FORMATS,
    ROLES,
    FormatInfo,
    custom_format,
    format_names,
    get_format,
)

__all__ = [
    "E8M0_BIAS",
    "E8M0_NAN",
    "E8M0_ONE",
    "FORMATS",
    "OVERFLOW_POLICIES",
    "ROLES",
    "ROUNDING_MODES",
    "FormatInfo",
    "custom_format",
    "format_names",
    "get_format",
]
