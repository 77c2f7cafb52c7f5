"""Yosys flows compared on one generated unit: the flow mxsim.rtl.synth uses against the
earlier one (``synth -flatten -noshare`` with its generic-gate ABC run, then ``abc -g cmos2``
with Yosys's default ABC script), in the same run: wall time of each and what it measures
(cells, transistor estimate, gate levels on the longest path). Nothing is cached.

    python benchmarks/bench_synth_flow.py [--hw CFG --format F --k K --block B]

The default unit is small (B200 kind::mxf8f6f4, MXFP4 with 8-element blocks, K = 8) so the
comparison takes minutes. Processor time (Yosys and ABC, user + system) is printed beside wall
time: on a shared machine the wall time mostly measures the other jobs.
"""

from __future__ import annotations

import argparse
import platform
import time

from mxsim.datapath import load_hwconfig
from mxsim.datapath.config import vary_hwconfig
from mxsim.rtl import generate_unit
from mxsim.rtl.synth import run_yosys, script


def earlier_script(unit) -> str:
    """The flow before: synth's own ABC run to generic gates, then ABC's default script."""
    return (
        f"read_verilog -sv {' '.join(unit.files)}\n"
        f"synth -top {unit.name} -flatten -noshare\n"
        "abc -g cmos2\n"
        "opt_clean\n"
        "stat -tech cmos\n"
        "ltp -noff\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hw", default="hwconfigs/b200-tcgen05-mxf8f6f4.yaml")
    parser.add_argument("--format", default="fp4_e2m1")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument(
        "--block", type=int, default=8, help="inputs.block_size of the unit (default 8)"
    )
    args = parser.parse_args()
    base = load_hwconfig(args.hw)
    hw = vary_hwconfig(base, {"inputs.block_size": args.block}, f"{base.name}-b{args.block}")
    unit = generate_unit(hw, args.format, args.format, args.k)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
        f"load {' '.join(f'{x:.1f}' for x in __import__('os').getloadavg())}"
    )
    print(
        f"unit {unit.name}: {args.hw} with inputs.block_size={args.block}, {args.format} x {args.format}, K = {args.k}"
    )
    rows = []
    for label, text in (
        ("earlier flow", earlier_script(unit)),
        ("mxsim.rtl.synth flow", script(unit)),
    ):
        result = run_yosys(unit, text)
        rows.append(result)
        print(
            f"{label:22s} {result.cpu_seconds:7.1f} s processor {result.seconds:7.1f} s wall  {result.cells:7d} cells  "
            f"{result.transistors:8d} transistors  depth {result.depth:4d}",
            flush=True,
        )
    old, new = rows
    print(
        f"ratios new/earlier: processor time {new.cpu_seconds / old.cpu_seconds:.2f}, wall {new.seconds / old.seconds:.2f}, "
        f"cells {new.cells / old.cells:.3f}, transistors {new.transistors / old.transistors:.3f}, "
        f"depth {new.depth / old.depth:.3f}"
    )


if __name__ == "__main__":
    main()
