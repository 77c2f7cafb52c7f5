"""Synthesizable SystemVerilog of a configured dot-product unit (docs/rtl.md).

:func:`generate_unit` builds the RTL from a hardware config's resolved parameters;
:func:`write_unit` writes it atomically; :mod:`mxsim.rtl.simulate` runs it under Icarus or
Verilator on golden-vector files; :mod:`mxsim.rtl.synth` measures it with Yosys.
"""

from .generate import COVERED, RtlUnit, check_covered, generate_unit, tree_positions

__all__ = ["COVERED", "RtlUnit", "check_covered", "generate_unit", "tree_positions"]
