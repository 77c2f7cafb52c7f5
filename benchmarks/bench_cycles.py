"""Time the cycle model on a 50-layer trace; the target is well under one second.

Run from the repository root: ``python benchmarks/bench_cycles.py``. The trace is BERT-base
at sequence length 512 (12 encoder blocks x 4 GEMMs) plus two convolutions, estimated on a
128 x 128 array of 32-lane units with MXFP8 operands, once per dataflow.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

# allow running as a plain script from a checkout without installing mxsim
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mxsim.cycles import ArrayConfig, ConvLayer, GemmLayer, estimate_layers, storage_for_format  # noqa: E402


def bert_base_trace() -> list:
    layers = []
    for block in range(12):
        layers += [
            GemmLayer(f"block{block}.qkv", M=512, N=2304, K=768),
            GemmLayer(f"block{block}.attention_out", M=512, N=768, K=768),
            GemmLayer(f"block{block}.ffn_up", M=512, N=3072, K=768),
            GemmLayer(f"block{block}.ffn_down", M=512, N=768, K=3072),
        ]
    layers += [
        ConvLayer("stem", 224, 224, 7, 7, 3, 64, 2, 2),
        ConvLayer("conv3x3", 56, 56, 3, 3, 64, 64, 1, 1),
    ]
    return layers


def main() -> None:
    layers = bert_base_trace()
    fp8, bf16 = storage_for_format("fp8_e4m3"), storage_for_format("bf16")
    repeats = 50
    for dataflow in ("os", "ws", "is"):
        array = ArrayConfig(
            rows=128,
            columns=128,
            lanes_per_unit=32,
            dataflow=dataflow,
            offchip_bytes_per_cycle=256,
            ifmap_buffer_kib=1024,
            filter_buffer_kib=1024,
            ofmap_buffer_kib=1024,
        )
        timings = []
        for _ in range(repeats):
            start = time.perf_counter()
            trace = estimate_layers(array, layers, fp8, fp8, bf16)
            timings.append(time.perf_counter() - start)
        print(
            f"{dataflow}: {len(layers)}-layer trace estimated in "
            f"{statistics.median(timings) * 1e3:.3f} ms (median of {repeats}); "
            f"{trace.total_cycles} cycles, {trace.total_bytes} bytes off chip"
        )


if __name__ == "__main__":
    main()
