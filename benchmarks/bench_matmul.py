"""Emulated MAC/s of MXFP8 and NVFP4 GEMMs through hardware configs, beside numpy float64 matmul.

Prints, for an N x N x N GEMM (default 1024) of fp8_e4m3 operands (the unit's first element
format where it takes no fp8_e4m3, e.g. fp4_e2m1 for kind::mxf4; NVFP4 operands with their
tensor scales for units with UE4M3 scales), the route ``mxsim.matmul`` takes, the emulated MACs per
second through each config (best of ``--repeats`` runs) and the same run's numpy float64
matmul of the same shape as a yardstick; ``--generic`` also times the generic datapath
kernel (``method="kernel"``) for the configs that take a faster route. ``--memory 8192`` measures the peak resident memory of 8192^3 GEMMs (operands
included) and compares it with the packed operands plus the output; ``--memory-tiles T``
stops each after T row tiles (the working set is allocated before the first tile and does
not grow), 0 runs the whole GEMM.
``--record`` writes the figures with the date, commit and load average to
``benchmarks/results/matmul.json`` (docs/benchmarks.md shows them: ``benchmarks/docs_tables.py``).
``--batched`` times attention-shaped batches instead (``q @ k^T``: heads x seq x seq x 64, and
``P @ v``: heads x seq x 64 x seq, and MiniLM's 14-token heads; MXFP8 operands through
``mxsim.matmul_batched``, one call per batch) and prints each one's MACs per second as a
ratio to one size^3 GEMM of the same unit timed beside it (1.0: a batch is no slower per MAC
than one large GEMM) and to numpy's float64 batched matmul of the same shape (on one
thread: the ``blas`` extra's threadpoolctl); with
``--record``, to ``benchmarks/results/matmul-batched.json``.
Run: ``python benchmarks/bench_matmul.py [--size N] [--configs a,b] [--generic] [--cpu-time] [--batched] [--memory M] [--record]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import time
from pathlib import Path

import numpy as np

import mxsim
from _timing import best_seconds, cpu_model
from bench_guard import batch_operands, conditions, one_thread
from mxsim.fileio import json_text, write_atomic
from mxsim.quantize import BFP_SPECS
from mxsim.datapath.batch import exact_tiles_apply, exact_tiles_outrun_blas
from mxsim.datapath.blas import blas_applies
from mxsim.datapath.api import _kernel_arguments, _scales_for_unit
from mxsim.datapath.fma import fma_applies
from mxsim.datapath.groups import groups_apply
from mxsim.datapath.window import window_applies

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "matmul.json"


def operands(size: int, rng, unit_scales: bool, hw=None, element: str = "fp8_e4m3"):
    """Quantized operands (A along K, B along K): MXFP8 (or the unit's first element format;
    MX4/MX6/MX9 through the BFP quantizer), scales set to 1 for scale-less units; NVFP4Tensors (B as B^T) for UE4M3-scaled units."""
    x = rng.standard_normal((size, size)).astype(np.float32)
    y = rng.standard_normal((size, size)).astype(np.float32)
    if hw is not None and mxsim.get_format(hw.sections[("inputs", "scale_format")]).mantissa_bits:
        scale = mxsim.quantize.tensor_scale_from_amax
        return (
            mxsim.quantize_nvfp4(x, scale(np.abs(x).max())),
            mxsim.quantize_nvfp4(np.ascontiguousarray(y.T), scale(np.abs(y).max())),
        )
    element = element if hw is None or element in hw.a_formats else hw.a_formats[0]
    if element.upper() in BFP_SPECS:  # shared-microexponent elements: Quark's BFP quantizer
        a = mxsim.quantize.quantize_bfp(x, element.upper(), axis=1).as_mx_tensor()
        b = mxsim.quantize.quantize_bfp(y, element.upper(), axis=0).as_mx_tensor()
        return a, b
    a = mxsim.quantize_mx(x, element, axis=1)
    b = mxsim.quantize_mx(y, element, axis=0)
    if unit_scales:
        a = dataclasses.replace(a, scales=np.full_like(a.scales, 127))
        b = dataclasses.replace(b, scales=np.full_like(b.scales, 127))
    return a, b


def route(hw, a, b) -> str:
    """Which route mxsim.matmul takes for these operands (the dispatch order of mxsim.datapath.api)."""
    if isinstance(a, mxsim.NVFP4Tensor):
        params = hw.params(a.options.element_format, b.options.element_format)
        return "group-sum route" if groups_apply(params) else "generic kernel"
    params = hw.params(a.element_format.name, b.element_format.name)
    _, _, kernel_args = _kernel_arguments(params)
    scales_a, scales_b = _scales_for_unit(a.scales, params), _scales_for_unit(b.scales, params)
    codes_a, codes_b = a.codes.reshape(a.shape[0], -1), b.codes.reshape(b.shape[1], -1)
    if blas_applies(
        params, kernel_args, codes_a, codes_b, scales_a, scales_b, np.zeros((1, 1), np.float32)
    ):
        rows, columns, length = codes_a.shape[0], codes_b.shape[0], codes_a.shape[1]
        tiled = exact_tiles_apply(params, rows, columns, length) and exact_tiles_outrun_blas(
            params, kernel_args
        )
        return "exact tiles" if tiled else "exact BLAS"
    if groups_apply(params):
        return "group-sum route"
    if fma_applies(params):
        return "FMA chain"
    return "window kernel" if window_applies(params) else "generic kernel"


def throughput(
    names: list[str],
    size: int,
    repeats: int,
    generic: bool,
    clock=time.perf_counter,
    element: str = "fp8_e4m3",
) -> list[dict]:
    """Print and return each config's figures ({config, element, route, gmacs, seconds, ratio}:
    ratio = its speed / that of float64 matmuls timed right after it)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((size, size))
    y = rng.standard_normal((size, size))
    x @ y
    baseline = size**3 / best_seconds(lambda: x @ y, repeats, clock)
    print(f"  numpy float64 matmul {size}^3: {baseline / 1e9:8.3f} G MAC/s")
    figures = [
        {
            "config": "numpy float64 matmul",
            "element": "float64",
            "route": "BLAS",
            "gmacs": baseline / 1e9,
            "seconds": size**3 / baseline,
            "ratio": 1.0,
        }
    ]
    for name in names:
        hw = mxsim.load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
        a, b = operands(
            size,
            rng,
            unit_scales=hw.sections[("inputs", "scales")] == "none",
            hw=hw,
            element=element,
        )
        methods = ["auto"]
        way = route(hw, a, b)
        if generic and way != "generic kernel":
            methods.append("kernel")
        for method in methods:
            small = dataclasses.replace(a, codes=a.codes[:8], scales=a.scales[:8])
            if not isinstance(a, mxsim.NVFP4Tensor):
                small = dataclasses.replace(small, shape=(8, size))
            mxsim.matmul(hw, small, b, method=method)  # compile outside the timing
            best = best_seconds(lambda: mxsim.matmul(hw, a, b, method=method), repeats, clock)
            baseline = size**3 / best_seconds(
                lambda: x @ y, repeats, clock
            )  # beside each unit: the load drifts
            rate = size**3 / best
            label = f"{name} ({way if method == 'auto' else 'generic kernel'})"
            print(
                f"  {label:45s} {size}^3: {rate / 1e9:8.3f} G MAC/s  ({best:.2f} s; "
                f"{baseline / rate:.1f}x slower than float64 = {rate / baseline:.3f}x its speed)"
            )
            taken = (
                a.options.element_format
                if isinstance(a, mxsim.NVFP4Tensor)
                else a.element_format.name
            )
            figures.append(
                {
                    "config": name,
                    "element": f"nvfp4 ({taken})" if isinstance(a, mxsim.NVFP4Tensor) else taken,
                    "route": way if method == "auto" else "generic kernel",
                    "gmacs": rate / 1e9,
                    "seconds": best,
                    "ratio": rate / baseline,
                }
            )
    return figures


#: (label, groups, M, K, N) of the attention-shaped batches ``--batched`` times.
BATCHES = (
    ("q @ k^T, 12 heads x 8, seq 128", 96, 128, 64, 128),
    ("P @ v, 12 heads x 8, seq 128", 96, 128, 128, 64),
    ("q @ k^T, 12 heads x 16, seq 14 (MiniLM)", 192, 14, 32, 14),
    ("P @ v, 12 heads x 16, seq 14 (MiniLM)", 192, 14, 14, 32),
)


def batched(names: list[str], size: int, repeats: int, clock=time.perf_counter) -> list[dict]:
    """Print and return each config's per-MAC rate of the attention-shaped ``BATCHES`` (one
    ``matmul_batched`` call each) as a ratio to one size^3 GEMM of the same unit, interleaved
    (``{config, batch, route, gmacs, ratio}``)."""
    rng = np.random.default_rng(0)
    # What BLAS itself gives each shape (small heads are slower per MAC in float64 too), timed
    # before any unit and on one thread: OpenBLAS's threads spin while they wait, for one
    # another on a busy machine (on the CPU clock, up to 100 times the work itself) and for a
    # while after its multi-threaded calls (counted as the next unit's time).
    float_seconds = {}
    with one_thread():
        for label, groups, m, k, n in BATCHES:
            x64 = rng.standard_normal((groups, m, k))
            y64 = rng.standard_normal((groups, k, n))
            float_seconds[label] = best_seconds(lambda: np.matmul(x64, y64), repeats, clock)
    figures = []
    for name in names:
        hw = mxsim.load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
        if hw.sections.get(("inputs", "scale_format"), "e8m0") != "e8m0":
            # batches are MX tensors (E8M0 scales); NVFP4 operands have no grouped form
            print(f"  {name:12s} not timed: its operands are NVFP4 tensors, not MX groups")
            continue
        element = "fp8_e4m3" if "fp8_e4m3" in hw.a_formats else hw.a_formats[0]
        per_tensor = hw.sections[("inputs", "scales")] == "none"
        a, b = operands(size, rng, unit_scales=per_tensor, hw=hw, element=element)
        mxsim.matmul(hw, a, b)  # compile outside the timing
        for label, groups, m, k, n in BATCHES:
            qa, qb = batch_operands(hw, element, groups, m, k, n, rng)
            mxsim.matmul_batched(hw, qa, qb)
            seconds = best_seconds(lambda: mxsim.matmul_batched(hw, qa, qb), repeats, clock)
            large = best_seconds(lambda: mxsim.matmul(hw, a, b), repeats, clock)
            floats = float_seconds[label]
            rate, yardstick = groups * m * k * n / seconds, size**3 / large
            print(
                f"  {name:12s} {label:42s}: {rate / 1e9:7.3f} G MAC/s = {rate / yardstick:.2f}x "
                f"the rate of one {size}^3 GEMM ({yardstick / 1e9:.3f} G MAC/s, same run); "
                f"{floats / seconds:.2f}x that of numpy's float64 batched matmul of the shape"
            )
            figures.append(
                {
                    "config": name,
                    "batch": label,
                    "shape": [groups, m, k, n],
                    "gmacs": rate / 1e9,
                    "yardstick_gmacs": yardstick / 1e9,
                    "ratio": rate / yardstick,
                    "float64_batched_ratio": floats / seconds,
                }
            )
    return figures


class _Stop(Exception):
    pass


def _status_kib(field: str) -> int:
    """A VmRSS/VmHWM figure of this process from /proc (Linux), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so setup temporaries do not count."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_memory(size: int, configs: list[str], tiles: int) -> None:
    """Peak RSS of a size^3 MXFP8 GEMM above the process's RSS before its operands existed."""
    fmt = mxsim.get_format("fp8_e4m3")
    finite = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    for name in configs:
        hw = mxsim.load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
        mxsim.matmul(hw, *operands(64, np.random.default_rng(1), unit_scales=True))  # compile first
        baseline = _status_kib("VmRSS")
        rng = np.random.default_rng(2)
        codes_a = finite[
            rng.integers(0, finite.size, size=(size, size), dtype=np.uint8) % finite.size
        ]
        codes_b = finite[
            rng.integers(0, finite.size, size=(size, size), dtype=np.uint8) % finite.size
        ]
        scales = np.full((size, size // 32), 127, dtype=np.uint8)
        a = mxsim.MXTensor(fmt, codes_a, scales, (size, size), 1, 32, 0, mxsim.QuantOptions())
        b = mxsim.MXTensor(
            fmt, codes_b, scales.copy(), (size, size), 0, 32, 0, mxsim.QuantOptions()
        )
        _reset_peak()
        done = []

        def stop_after(rows_done, rows_total):
            done.append(rows_done)
            if tiles and len(done) >= tiles:
                raise _Stop

        start = time.perf_counter()
        try:
            result = mxsim.matmul(hw, a, b, progress=stop_after)
        except _Stop:
            result = None
        seconds = time.perf_counter() - start
        peak = (_status_kib("VmHWM") - baseline) * 1024
        packed = codes_a.nbytes + codes_b.nbytes + 2 * scales.nbytes
        output = size * size * 4
        covered = "all" if result is not None else f"first {done[-1]} of {size}"
        print(
            f"  {name:10s} {size}^3 GEMM, {covered} rows in {seconds:.1f} s: peak memory {peak / 2**20:.0f} MiB = "
            f"{peak / (packed + output):.2f} x (packed operands {packed / 2**20:.0f} MiB + output {output / 2**20:.0f} MiB); "
            f"limit 1.5 x packed + output = {(1.5 * packed + output) / 2**20:.0f} MiB"
        )
        del a, b, codes_a, codes_b, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--generic",
        action="store_true",
        help="also time the generic kernel where a faster route applies",
    )
    parser.add_argument(
        "--configs",
        default="h100-fp8,ocp-exact,mxdotp-paper,mxdotp,kulisch,b200-fp8,h100-wgmma-fp8,"
        "h200-cublaslt-fp8,h200-fp8,b200-tcgen05-mxf8f6f4,b200-nvfp4,h200-cublas,a100-dmma",
    )
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time by the process's CPU time, not wall time: on a loaded machine, with every library "
        "on one thread (NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1), what an idle core gives",
    )
    parser.add_argument(
        "--memory", type=int, default=0, metavar="SIZE", help="also measure an SIZE^3 GEMM's memory"
    )
    parser.add_argument("--memory-configs", default="ocp-exact,h100-fp8")
    parser.add_argument(
        "--memory-tiles", type=int, default=2, help="stop after this many row tiles (0: whole GEMM)"
    )
    parser.add_argument(
        "--element",
        default="fp8_e4m3",
        help="element format where the unit takes it (fp4_e2m1: MXFP4)",
    )
    parser.add_argument(
        "--batched",
        action="store_true",
        help="time attention-shaped batches (matmul_batched) against one size^3 GEMM per unit",
    )
    parser.add_argument(
        "--record", action="store_true", help=f"write the figures to {RESULTS.relative_to(REPO)}"
    )
    args = parser.parse_args()
    print(
        f"mxsim {mxsim.__version__}, numpy {np.__version__}, {os.cpu_count()} cores, {platform.machine()} ({cpu_model()})"
    )
    where = conditions()
    clock = time.process_time if args.cpu_time else time.perf_counter
    if args.batched:
        figures = batched(args.configs.split(","), args.size, args.repeats, clock)
        if args.record:  # docs_tables.py's plain table form
            rows = [
                [
                    f"`{f['config']}`",
                    f"{f['batch']} ({' × '.join(map(str, f['shape']))})",
                    f"{f['gmacs']:.2f}",
                    f"{f['yardstick_gmacs']:.2f}",
                    f"**{f['ratio']:.2f}x**",
                    f"{f['float64_batched_ratio']:.2f}x",
                ]
                for f in figures
            ]
            command = "python benchmarks/bench_matmul.py --batched" + (
                " --cpu-time" if args.cpu_time else ""
            )
            write_atomic(
                RESULTS.with_name("matmul-batched.json"),
                json_text(
                    {
                        "command": f"{command} --configs {args.configs} --repeats {args.repeats}",
                        "conditions": where,
                        "note": (
                            "Attention-shaped batches of MXFP8 GEMMs (mx9 on bfp-exact; "
                            "groups × M × K × N), one matmul_batched call each, beside one "
                            f"{args.size}³ GEMM of the same unit timed right after it; "
                            f"best of {args.repeats} by {'CPU' if args.cpu_time else 'wall'} "
                            "clock, every output bit exact."
                        ),
                        "columns": [
                            "config",
                            "batch (groups × M × K × N)",
                            "G MAC/s",
                            f"one {args.size}³ GEMM, G MAC/s",
                            "per-MAC rate / the large GEMM's",
                            "rate / numpy float64 batched matmul's (one thread)",
                        ],
                        "rows": rows,
                        "figures": figures,
                    },
                    indent=1,
                )
                + "\n",
            )
        return
    figures = throughput(
        args.configs.split(","),
        args.size,
        args.repeats,
        args.generic,
        time.process_time if args.cpu_time else time.perf_counter,
        args.element,
    )
    if args.record:
        results = (
            RESULTS
            if args.element == "fp8_e4m3"
            else RESULTS.with_name(f"matmul-{args.element}.json")
        )
        write_atomic(
            results,
            json_text(
                {
                    "conditions": where,
                    "size": args.size,
                    "clock": "cpu" if args.cpu_time else "wall",
                    "figures": figures,
                },
                indent=1,
            )
            + "\n",
        )
    if args.memory:
        peak_memory(args.memory, args.memory_configs.split(","), args.memory_tiles)


if __name__ == "__main__":
    main()
