"""Perplexity of the char-lm sample with every matmul on each datapath, per element format.

One row per element format (operands quantized on the fly, OCP profile; units without block
scales get one power-of-two scale per operand tensor), one column per unit. Prints a Markdown
table; docs/accuracy.md records its output.
Run: ``python examples/perplexity_table.py [TRACE] [UNIT ...]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mxsim
from mxsim.errors import MxsimError
from mxsim.trace import load_trace
from mxsim.inloop.network import perplexity

REPO = Path(__file__).resolve().parent.parent
FORMATS = ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8"]
UNITS = ["ocp-exact", "mxdotp", "h100-fp8"]


def main() -> None:
    trace = load_trace(sys.argv[1] if len(sys.argv) > 1 else REPO / "traces" / "char-lm")
    names = sys.argv[2:] or UNITS
    units = [mxsim.load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml") for name in names]
    tokens = trace.dataset[trace.network.input]
    print(
        f"{trace.name}: float32 perplexity {perplexity(trace):.4f} on {tokens.size} held-out tokens"
    )
    print()
    print("| element format | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names), flush=True)
    for fmt in FORMATS:
        cells = []
        for unit in units:
            try:
                cells.append(f"{perplexity(trace, unit, a_format=fmt):.4f}")
            except MxsimError:
                cells.append("—")  # the unit does not take this format
        print(f"| {fmt} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
