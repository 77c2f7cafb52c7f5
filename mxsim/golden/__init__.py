"""Golden reference vectors for RTL verification of MX dot-product units.

:func:`generate` writes, for each (A, B) format pair of a hardware config and each case kind
(``random``, ``corners``, ``exhaustive``), a ``$readmemh``-readable hex file of input codes and
expected output bits, a label per vector, optional stage dumps, and a JSON manifest. The
expected outputs come from an injectable expected function, ``mxsim.dot`` by default.
See docs/golden.md.
"""

from .cases import KINDS, exhaustive_cases, random_cases
from .corners import corner_cases
from .writer import MANIFEST_NAME, dot_expected_fn, fill_expected, generate, make_cases, output_bits
from .layout import Field, GoldenUnit, VectorLayout, layout_for, units_from_hwconfig
from .stages import exact_stages
from .vectors import VectorSet, format_lines, parse_vector_text, read_vector_file

__all__ = [
    "KINDS",
    "MANIFEST_NAME",
    "Field",
    "GoldenUnit",
    "VectorLayout",
    "VectorSet",
    "corner_cases",
    "dot_expected_fn",
    "exact_stages",
    "exhaustive_cases",
    "fill_expected",
    "format_lines",
    "generate",
    "layout_for",
    "make_cases",
    "output_bits",
    "parse_vector_text",
    "random_cases",
    "read_vector_file",
    "units_from_hwconfig",
]
