"""Replay timing: the shipped sample and the real model, per layer and where the time goes.

For each layer and unit: MACs, seconds in the datapath (mxsim.matmul_batched), seconds quantizing
and lowering (everything else in the layer), and emulated MAC/s.
Run: ``python benchmarks/bench_replay.py [--hw NAME ...]``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

import mxsim
from mxsim.trace import load_trace
from mxsim.replay.layer import replay_layer

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hw", action="append", default=None)
    parser.add_argument("--traces", default="digits-cnn,ppocr-cls")
    args = parser.parse_args()
    units = [
        mxsim.load_hwconfig(REPO / "hwconfigs" / f"{n}.yaml")
        for n in (args.hw or ["ocp-exact", "h100-fp8"])
    ]
    print(f"mxsim {mxsim.__version__}, numpy {np.__version__}, {os.cpu_count()} cores")
    import mxsim.replay.layer as layer_module

    spent = {"matmul": 0.0}
    original = layer_module.matmul_batched  # what run_layer calls for every layer's groups

    def timed_matmul(*a, **k):
        start = time.perf_counter()
        result = original(*a, **k)
        spent["matmul"] += time.perf_counter() - start
        return result

    layer_module.matmul_batched = timed_matmul
    for name in args.traces.split(","):
        trace = load_trace(REPO / "traces" / name)
        for unit in units:  # warm the kernels for this unit outside the timing
            replay_layer(trace.layers[0], unit)
        print(f"\n{name}: {len(trace.layers)} layers")
        print(
            f"  {'layer':14s} {'unit':10s} {'MACs':>10s} {'total s':>8s} {'matmul s':>8s} {'other s':>8s} {'M MAC/s':>8s}"
        )
        for unit in units:
            total_time = total_matmul = total_macs = 0
            for layer in trace.layers:
                spent["matmul"] = 0.0
                start = time.perf_counter()
                result = replay_layer(layer, unit)
                seconds = time.perf_counter() - start
                total_time += seconds
                total_matmul += spent["matmul"]
                total_macs += result.macs
                print(
                    f"  {layer.name[:14]:14s} {unit.name[:10]:10s} {result.macs:10d} {seconds:8.3f} {spent['matmul']:8.3f} "
                    f"{seconds - spent['matmul']:8.3f} {result.macs / seconds / 1e6:8.1f}"
                )
            print(
                f"  {'total':14s} {unit.name[:10]:10s} {total_macs:10d} {total_time:8.3f} {total_matmul:8.3f} "
                f"{total_time - total_matmul:8.3f} {total_macs / total_time / 1e6:8.1f}"
            )


if __name__ == "__main__":
    main()
