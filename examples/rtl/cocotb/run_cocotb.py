#!/usr/bin/env python3
"""Build mxdot_fp4 with Icarus Verilog and run the cocotb tests of mxdot_cocotb.py.

    python examples/rtl/cocotb/run_cocotb.py [--bug N] [--cases N] [--seed S]
        [--expected module:factory] [--hwconfig PATH] [--build-dir DIR]

Exit status 0 when every cocotb test passed, 1 otherwise; prints "N passed, M failed"
(cocotb tests). --bug selects a broken variant of the RTL (see mxdot_fp4.sv).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bug", type=int, default=0, help="broken RTL variant (0: correct)")
    parser.add_argument("--cases", type=int, default=500, help="random vectors")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--expected", help="module:factory giving the expected function (default: mxsim.dot)"
    )
    parser.add_argument("--hwconfig", help="hardware config YAML for mxsim.dot")
    parser.add_argument("--build-dir", default=str(HERE / "sim_build"))
    parser.add_argument(
        "--python-path", action="append", default=[], help="extra import path for --expected"
    )
    args = parser.parse_args(argv)

    os.environ.pop("PYTEST_CURRENT_TEST", None)  # the runner exits the process under pytest
    from cocotb_tools.check_results import get_results
    from cocotb_tools.runner import get_runner

    build_dir = Path(args.build_dir).resolve() / f"bug{args.bug}"
    runner = get_runner("icarus")
    runner.build(
        sources=[HERE.parent / "mxdot_fp4.sv"],
        hdl_toplevel="mxdot_fp4",
        parameters={"BUG": args.bug},
        build_dir=build_dir,
        build_args=["-g2012"],
        timescale=("1ns", "1ps"),
        always=True,
    )
    sys.path[:0] = [
        str(Path(p).resolve()) for p in args.python_path
    ]  # the runner passes sys.path on
    env = {"MXSIM_GOLDEN_CASES": str(args.cases), "MXSIM_GOLDEN_SEED": str(args.seed)}
    if args.expected:
        env["MXSIM_GOLDEN_EXPECTED"] = args.expected
    if args.hwconfig:
        env["MXSIM_HWCONFIG"] = str(Path(args.hwconfig).resolve())
    results = build_dir / "results.xml"
    try:
        runner.test(
            hdl_toplevel="mxdot_fp4",
            test_module="mxdot_cocotb",
            test_dir=HERE,
            build_dir=build_dir,
            extra_env=env,
            results_xml=str(results),
            timescale=("1ns", "1ps"),
        )
    except SystemExit as stop:  # the simulator itself failed
        print(f"cocotb: simulator exited with {stop.code}", file=sys.stderr)
        return 1
    tests, failed = get_results(results)
    print(f"cocotb: {tests - failed} passed, {failed} failed")
    return 0 if failed == 0 and tests > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
