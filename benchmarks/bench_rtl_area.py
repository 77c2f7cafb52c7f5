"""Area and logic depth of generated MX dot-product units versus their datapath keys (docs/area.md).

Each row is one variant of a base config (default: B200's kind::mxf8f6f4 unit, K = 32, c in a
window, toward-zero rounding) for one element format, synthesized by Yosys (mxsim.rtl.synth:
NAND/NOR/NOT cells, a transistor estimate, gate levels on the longest path). The yardstick
printed first is the same synthesis of the base unit, so ratios between rows of one run are
what to read. Results are cached per design, so a rerun prints at once.

    python benchmarks/bench_rtl_area.py --format fp8_e4m3 --format fp4_e2m1
"""

from __future__ import annotations

import argparse
import json

from mxsim.datapath import load_hwconfig
from mxsim.datapath.config import vary_hwconfig
from mxsim.rtl import generate_unit
from mxsim.rtl.synth import synthesize

VARIANTS = [
    ("base (window 25 bits, 32-term tree, fp32 accumulator)", {}),
    ("window 9", {"adder.align_fraction_bits": 9}),
    ("window 13", {"adder.align_fraction_bits": 13}),
    ("window 35", {"adder.align_fraction_bits": 35}),
    ("exact tree (no window)", {"adder.align_fraction_bits": None}),
    ("products cut to 4 bits", {"multiplier.product_fraction_bits": 3}),
    ("tree of 16", {"adder.fused_terms": 16}),
    ("tree of 8", {"adder.fused_terms": 8}),
    ("fp16 accumulator", {"accumulator.format": "fp16"}),
    ("bf16 accumulator", {"accumulator.format": "bf16"}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hw", default="hwconfigs/b200-tcgen05-mxf8f6f4.yaml")
    parser.add_argument("--format", action="append", help="element format (repeatable; default fp8_e4m3, fp4_e2m1)")
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--only", action="append", help="run only the variants whose label contains this")
    parser.add_argument("--json", help="also write the rows as JSON")
    args = parser.parse_args()
    base = load_hwconfig(args.hw)
    rows = []
    for fmt in args.format or ["fp8_e4m3", "fp4_e2m1"]:
        for label, changes in VARIANTS:
            if args.only and not any(part in label for part in args.only) and changes:
                continue
            hw = vary_hwconfig(base, changes, f"{base.name}-v") if changes else base
            result = synthesize(generate_unit(hw, fmt, fmt, args.k))
            rows.append({"format": fmt, "variant": label, "cells": result.cells, "transistors": result.transistors,
                         "depth": result.depth, "synthesis_seconds": result.seconds})
            print(f"{fmt:10s} {label:55s} {result.cells:8d} cells {result.transistors:9d} transistors "
                  f"depth {result.depth:4d}  ({result.seconds:.0f} s{', cached' if result.cached else ''})", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=2)


if __name__ == "__main__":
    main()
