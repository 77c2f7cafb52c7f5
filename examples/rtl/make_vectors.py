#!/usr/bin/env python3
"""Write golden vectors for mxdot_fp4 (fp4_e2m1 x fp4_e2m1, K = k = 32, FP32 out).

    python examples/rtl/make_vectors.py [--hw hwconfigs/ocp-exact.yaml] [--out DIR]
        [--cases N] [--seed S] [--kind random --kind corners --kind exhaustive]
        [--expected module:factory [--python-path DIR]]

Expected outputs come from mxsim.dot on the config, or from factory(unit) when --expected
is given (the tests use tests/test_golden_model.py:ocp_exact_expected_fn). The RTL takes
fp4 codes only: a config without the fp4_e2m1 x fp4_e2m1 pair (an fp64 unit, whose 64-bit
vectors mxsim golden writes for other benches) is refused, naming the pairs it accepts.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PAIR = ("fp4_e2m1", "fp4_e2m1")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hw", default=str(REPO / "hwconfigs" / "ocp-exact.yaml"))
    parser.add_argument("--out", default=str(HERE / "vectors"))
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kind", action="append", choices=["random", "corners", "exhaustive"])
    parser.add_argument(
        "--expected", help="module:factory; factory(unit) returns the expected function"
    )
    parser.add_argument("--python-path", action="append", default=[])
    args = parser.parse_args(argv)
    sys.path[:0] = [str(Path(p).resolve()) for p in args.python_path]

    from mxsim.datapath import load_hwconfig
    from mxsim.golden import generate

    factory = None
    if args.expected:
        module, _, name = args.expected.partition(":")
        factory = getattr(importlib.import_module(module), name)
    manifest = generate(
        load_hwconfig(args.hw),
        args.out,
        cases=args.cases,
        seed=args.seed,
        kinds=args.kind or ["random", "corners", "exhaustive"],
        pairs=[PAIR],
        expected_factory=factory,
        progress=True,
    )
    for kind, entry in manifest["units"][0]["files"].items():
        print(f"{kind}: {entry['count']} vectors in {Path(args.out) / entry['vectors']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
