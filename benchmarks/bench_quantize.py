"""Throughput of MX quantize + dequantize beside numpy's float32 -> float16 cast.

Prints elements/s for MXFP8 (E4M3) and MXFP4 (E2M1) on 16M float32 elements (block 32,
OCP profile), and the same-run yardstick of ``x.astype(np.float16)``.
Run: ``python benchmarks/bench_quantize.py [--elements N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import mxsim
from _timing import best_seconds, cpu_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=16 * 2**20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    x = np.random.default_rng(0).standard_normal(args.elements).astype(np.float32)
    print(
        f"mxsim {mxsim.__version__}, numpy {np.__version__}, {os.cpu_count()} cores, {cpu_model()}"
    )
    print(f"{args.elements} float32 elements, best of {args.repeats}")
    baseline = best_seconds(lambda: x.astype(np.float16), args.repeats)
    print(f"  numpy float32->float16 cast : {args.elements / baseline / 1e6:8.1f} M elements/s")
    for name in ("fp8_e4m3", "fp4_e2m1"):
        mxsim.quantize_mx(x[:4096], name).dequantize()  # compile outside the timing
        quantize = best_seconds(lambda: mxsim.quantize_mx(x, name), args.repeats)
        tensor = mxsim.quantize_mx(x, name)
        both = best_seconds(lambda: mxsim.quantize_mx(x, name).dequantize(np.float32), args.repeats)
        dequantize = best_seconds(lambda: tensor.dequantize(np.float32), args.repeats)
        rate = args.elements / both / 1e6
        print(
            f"  MX {name:9s} quantize+dequantize: {rate:8.1f} M elements/s "
            f"(quantize {args.elements / quantize / 1e6:.1f}, dequantize {args.elements / dequantize / 1e6:.1f}; "
            f"{both / baseline:.2f}x the cast's time)"
        )


if __name__ == "__main__":
    main()
