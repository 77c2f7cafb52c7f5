"""End-to-end accuracy of the digits CNN with every layer on each shipped datapath, per MX format.

The hardware-datapath version of the seeds' ResNet50 table (one row per MX element format,
one column per unit). Prints a Markdown table; docs/accuracy.md records its output.
Run: ``python examples/accuracy_table.py [TRACE]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mxsim
from mxsim.errors import MxsimError
from mxsim.trace import load_trace
from mxsim.replay import replay

REPO = Path(__file__).resolve().parent.parent
FORMATS = ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8"]
UNITS = ["ocp-exact", "kulisch", "mxdotp", "h100-fp8", "b200-fp8", "ada-fp8", "h100-fp8-promoted"]


def main() -> None:
    trace = load_trace(sys.argv[1] if len(sys.argv) > 1 else REPO / "traces" / "digits-cnn")
    units = [mxsim.load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml") for name in UNITS]
    float_accuracy = None
    rows = []
    for fmt in FORMATS:
        cells = []
        for unit in units:
            try:
                report = replay(trace, [unit], end_to_end=True, element_format=fmt)
            except MxsimError:
                cells.append("—")  # the unit does not take this format
                continue
            float_accuracy = report["end_to_end"]["float_accuracy"]
            cells.append(f"{100 * report['end_to_end']['accuracy'][unit.name]:.2f} %")
        rows.append(f"| {fmt} | " + " | ".join(cells) + " |")
    print(
        f"{trace.name}: float accuracy {100 * float_accuracy:.2f} % on {len(trace.dataset[trace.network.labels])} test images"
    )
    print()
    print("| element format | " + " | ".join(UNITS) + " |")
    print("|---|" + "---|" * len(UNITS))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
