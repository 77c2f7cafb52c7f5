"""The ``mxsim`` command line: one subcommand per consumer, thin.

User errors (any :class:`mxsim.errors.MxsimError`, a missing or unreadable file, a bad
option) print exactly one line on stderr and exit with status 2, never a traceback;
``--json`` prints machine-readable results on stdout. Output files are written atomically.
Each subcommand imports what it runs, so ``mxsim --version`` and ``--help`` load no Numba.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from . import __version__
from .errors import ArgumentError, InputFileError, MxsimError
from .fileio import read_npy_file, write_atomic
from .limits import BUDGET_VARIABLE, check_block_size


def _print_table(rows: list[dict], columns: list[str]) -> None:
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in rows:
        print("  ".join(str(row[c]).ljust(w) for c, w in zip(columns, widths)))


def cmd_formats(args) -> int:
    from .formats import FORMATS

    rows = []
    for name, fmt in FORMATS.items():
        rows.append(
            {
                "name": name,
                "bits": fmt.bits,
                "exponent_bits": fmt.exponent_bits,
                "mantissa_bits": fmt.mantissa_bits,
                "bias": fmt.bias,
                "specials": fmt.specials,
                "max_finite": fmt.max_finite,
                "min_subnormal": fmt.min_subnormal,
                "scale_emax": fmt.scale_emax,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _print_table(rows, list(rows[0]))
    return 0


def _sample_tensor(rows: int = 256, columns: int = 1024) -> np.ndarray:
    """A seeded activation-like tensor: Gaussian body, per-channel spread, a few outliers."""
    rng = np.random.default_rng(2026)
    x = rng.standard_normal((rows, columns)) * np.exp(rng.normal(0, 1, columns))
    outliers = rng.random((rows, columns)) < 0.001
    x[outliers] *= 50
    return x.astype(np.float32)


def _load_tensor(path: str) -> np.ndarray:
    def fail(message):
        raise InputFileError(f"--input {path}: {message}")

    array = read_npy_file(Path(path), ("float16", "float32", "float64"), fail)
    if array.size == 0:
        fail(f"the array is empty (shape {array.shape}); give at least one element")
    return array


def cmd_quantize(args) -> int:
    from .formats import format_names, get_format
    from .quantize import fake_quantize, resolve_options

    check_block_size(args.block_size, "--block-size")
    x = _load_tensor(args.input) if args.input else _sample_tensor()
    overrides = {"scale_rule": args.scale_rule} if args.scale_rule else {}
    resolve_options(args.profile, **overrides)
    reference = x.astype(np.float64)
    signal = float(np.sum(reference**2))
    rows = []
    for name in args.format or format_names("element"):
        fmt = get_format(name)
        out = fake_quantize(x, fmt, axis=args.axis, block_size=args.block_size, profile=args.profile, **overrides)
        error = out - reference
        noise = float(np.sum(error**2))
        rows.append(
            {
                "format": fmt.name,
                "sqnr_db": round(10 * np.log10(signal / noise), 2) if noise > 0 else float("inf"),
                "max_abs_error": float(np.max(np.abs(error))),
                "bits_per_element": fmt.bits + 8 / args.block_size,
            }
        )
    result = {
        "input": args.input or "built-in sample (256x1024 float32, seeded)",
        "shape": list(x.shape),
        "profile": args.profile,
        "block_size": args.block_size,
        "axis": args.axis,
        "results": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"MX quantization of {result['input']}, shape {tuple(x.shape)}, profile {args.profile}, block {args.block_size}")
        _print_table(rows, ["format", "sqnr_db", "max_abs_error", "bits_per_element"])
    return 0


def _number_list(text: str, what: str) -> list[float]:
    try:
        return [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise MxsimError(f"{what}: expected comma-separated numbers, got {text!r}") from None


def _code_list(text: str, what: str) -> list[int]:
    try:
        codes = [int(item, 0) for item in text.split(",") if item.strip()]
    except ValueError:
        codes = None
    if codes is None or any(not 0 <= code < 1 << 32 for code in codes):
        raise ArgumentError(f"{what}: expected comma-separated non-negative integer codes (0x.. allowed), got {text!r}")
    return codes


def _operand_codes(values: str | None, codes: str | None, fmt_name: str, operand: str) -> np.ndarray:
    from .formats import get_format

    fmt = get_format(fmt_name)
    if (values is None) == (codes is None):
        raise MxsimError(f"give exactly one of --{operand} (values) or --{operand}-codes")
    if codes is not None:
        return np.array([_code_list(codes, f"--{operand}-codes")], dtype=np.int64)
    numbers = np.array([_number_list(values, f"--{operand}")], dtype=np.float64)
    encoded = fmt.encode(numbers, overflow="inf_nan" if fmt.has_nan else "saturate")
    exact = fmt.decode(encoded)
    inexact = ~((exact == numbers) | (np.isnan(exact) & np.isnan(numbers)))
    if inexact.any():
        first = int(np.flatnonzero(inexact[0])[0])
        raise MxsimError(
            f"--{operand}: {float(numbers[0, first])!r} is not a {fmt.name} value (nearest: {float(exact[0, first])!r}); "
            f"give exact values or --{operand}-codes"
        )
    return encoded.astype(np.int64)


def _describe_stage(stage: dict) -> str:
    kind = stage["stage"]
    rest = ", ".join(f"{key}={value}" for key, value in stage.items() if key != "stage")
    return f"  {kind:18s} {rest}"


def cmd_dot(args) -> int:
    from .datapath import as_float, dot, explain, load_hwconfig
    from .formats import get_format

    hw = load_hwconfig(args.hw)
    a = _operand_codes(args.a, args.a_codes, args.a_format, "a")
    b = _operand_codes(args.b, args.b_codes, args.b_format, "b")
    scale_a = None if args.scale_a is None else np.array([_code_list(args.scale_a, "--scale-a")], dtype=np.int64)
    scale_b = None if args.scale_b is None else np.array([_code_list(args.scale_b, "--scale-b")], dtype=np.int64)
    c = np.array([args.c], dtype=np.float32)
    bits = dot(hw, a, b, a_format=args.a_format, b_format=args.b_format, scale_a=scale_a, scale_b=scale_b,
               c=c, out_format=args.out_format)
    out_format = args.out_format or hw.sections[("output", "format")]
    value = float(as_float(bits, out_format)[0])
    width = get_format(out_format).bits // 4
    result = {"hw": hw.name, "out_format": out_format, "bits": f"0x{int(bits[0]):0{width}x}", "value": value}
    if args.explain:
        report = explain(hw, a[0], b[0], a_format=args.a_format, b_format=args.b_format,
                         scale_a=None if scale_a is None else scale_a[0], scale_b=None if scale_b is None else scale_b[0],
                         c=args.c, out_format=args.out_format)
        result["stages"] = report["stages"]
        result["params"] = report["params"]
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return 0
    if args.explain:
        print(f"{hw.name}: {args.a_format} x {args.b_format} -> {out_format}")
        for stage in result["stages"]:
            print(_describe_stage(stage))
    print(f"{result['bits']} = {value!r}")
    return 0


def _write_json_atomically(path: str, data) -> None:
    write_atomic(Path(path), json.dumps(data, indent=2, default=_json_default))


def _json_default(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def cmd_replay(args) -> int:
    from ._optional import require
    from .datapath import load_hwconfig
    from .parallel import make_runner
    from .replay import format_report, replay, write_plots
    from .replay.run import select_layers
    from .trace import load_trace

    trace = load_trace(args.trace)
    if args.layers is not None:
        if args.end_to_end:
            raise MxsimError("--layers and --end-to-end exclude each other: end to end runs every layer")
        trace = select_layers(trace, args.layers)
    units = [load_hwconfig(path) for path in args.hw]
    if args.plots:
        require("matplotlib")  # a missing extra is refused before any work
    perplexity_fn = None
    if args.end_to_end and trace.network is not None and trace.network.targets is not None:
        require("torch")  # a language model runs in PyTorch
        from .inloop.network import perplexity as perplexity_fn
    try:
        with make_runner(args.workers, args.scheduler) as runner:
            report = replay(trace, units, end_to_end=args.end_to_end,
                            progress=not args.quiet and sys.stderr.isatty(), element_format=args.format,
                            conv_order=args.conv_order, strict=args.strict, runner=runner,
                            perplexity_fn=perplexity_fn)
    except Exception as error:
        partial = getattr(error, "partial", None)
        if partial is not None and partial["layers"]:  # the finished layers are never lost
            partial.pop("_results")
            _print_replay(partial, args, format_report)
        raise
    results = report.pop("_results")
    # The table and the JSON come first: nothing optional (plots) may lose them.
    _print_replay(report, args, format_report)
    if args.plots:
        plots = write_plots({**report, "_results": results}, args.plots)
        print(f"plots: {len(plots)} PNG files in {args.plots}")
    return 0


def _print_replay(report: dict, args, format_report) -> None:
    print(format_report(report))
    if args.json:
        _write_json_atomically(args.json, report)
        print(f"JSON report: {args.json}")


def cmd_sweep(args) -> int:
    from .datapath import load_hwconfig
    from .parallel import make_runner
    from .sweep import format_table, parse_knobs, run_sweep, write_outputs, write_plots
    from .trace import load_trace

    base = load_hwconfig(args.hw)
    knobs = parse_knobs(args.vary, args.hw)
    trace = load_trace(args.trace)
    with make_runner(args.workers, args.scheduler) as runner:
        summary = run_sweep(trace, base, knobs, args.out, runner=runner, element_format=args.format,
                            progress=not args.quiet and sys.stderr.isatty())
    write_outputs(summary, args.out)
    print(format_table(summary))
    try:
        write_plots(summary, args.out)
    except ImportError:
        print("plots skipped: they need matplotlib (pip install 'mxsim[plots]')", file=sys.stderr)
    print(f"results: {Path(args.out) / 'sweep.json'}, {Path(args.out) / 'sweep.csv'}")
    return 1 if summary["failed"] else 0


def _add_run_arguments(parser) -> None:
    """The options replay and sweep share: operand format, progress bar, where to run."""
    parser.add_argument("--format", help="quantize every operand to this element format (default: the trace's specs)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    cluster = parser.add_mutually_exclusive_group()
    cluster.add_argument("--workers", type=int, help="run on a local Dask cluster of N worker processes (mxsim[dask])")
    cluster.add_argument("--scheduler", metavar="ADDRESS", help="run on the Dask cluster at ADDRESS (tcp://host:8786)")


def cmd_cycles(args) -> int:
    from .cycles import estimate_layers, format_table, read_scalesim_topology, storage_for_format
    from .cycles.layers import GemmLayer
    from .datapath import load_hwconfig

    hw = load_hwconfig(args.hw)
    if hw.array is None:
        raise MxsimError(f"{args.hw}: the config has no 'array:' section (see docs/cycles.md)")
    source = Path(args.source)
    a_format = args.a_format or hw.a_formats[0]
    b_format = args.b_format or hw.b_formats[0]
    if source.is_dir():
        from .replay import gemm_shape
        from .trace import load_trace

        trace = load_trace(source)
        layers = []
        for layer in trace.layers:
            shape = gemm_shape(layer)
            layers.append(GemmLayer(layer.name, shape.m, shape.n * shape.groups, shape.k))
    else:
        layers = read_scalesim_topology(source)
    estimate = estimate_layers(hw.array, layers, storage_for_format(a_format), storage_for_format(b_format),
                               storage_for_format(hw.sections[("output", "format")]))
    if args.json:
        print(json.dumps(estimate.to_dict(), indent=2, default=_json_default))
    else:
        print(format_table(estimate))
    return 0


def cmd_capture_onnx(args) -> int:
    from .trace import save_trace
    from .capture.onnx import capture_onnx, load_inputs_npz

    trace = capture_onnx(args.model, load_inputs_npz(args.inputs), name=args.name, bfp_kernel=args.bfp_kernel)
    save_trace(trace, args.out, overwrite=args.force, floats=not args.compact)
    print(f"captured {len(trace.layers)} layers from {args.model} into {args.out}")
    return 0


def cmd_golden(args) -> int:
    from .golden import generate

    pairs = None
    if args.pair:
        pairs = [tuple(item.strip() for item in text.split(",")) for text in args.pair]
        bad = [text for text, pair in zip(args.pair, pairs) if len(pair) != 2 or not all(pair)]
        if bad:
            raise ArgumentError(f"golden --pair: expected A,B (two format names), got {bad[0]!r}")
    manifest = generate(args.hw, args.out, cases=args.cases, seed=args.seed,
                        kinds=args.kind or ["random", "corners"], stage_dumps=args.stages,
                        progress=None if not args.quiet else False, pairs=pairs)
    if args.json:
        print(json.dumps(manifest, indent=2, default=_json_default))
        return 0
    for unit in manifest["units"]:
        for kind, entry in unit["files"].items():
            print(f"{entry['vectors']}: {entry['count']} vectors")
    totals = ", ".join(f"{count} {kind}" for kind, count in manifest["counts"].items())
    print(f"{totals}; manifest: {Path(args.out) / 'manifest.json'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mxsim", description="Bit-accurate MX datapath emulator")
    parser.add_argument("--version", action="version", version=f"mxsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    formats = sub.add_parser("formats", help="list the number formats")
    formats.add_argument("--json", action="store_true", help="print JSON")
    formats.set_defaults(run=cmd_formats)

    quantize = sub.add_parser("quantize", help="MX-quantize a tensor and report the error per format")
    quantize.add_argument("--input", help=".npy float array (default: a built-in sample tensor)")
    quantize.add_argument("--format", action="append", help="element format (repeatable; default: all MX formats)")
    quantize.add_argument("--profile", default="ocp",
                          help="quantization profile (default ocp; docs/profiles.md; an unknown name lists them)")
    quantize.add_argument("--scale-rule", choices=["floor", "ceil", "even", "rceil"], help="override the profile's")
    quantize.add_argument("--axis", type=int, default=-1)
    quantize.add_argument("--block-size", type=int, default=32)
    quantize.add_argument("--json", action="store_true", help="print JSON")
    quantize.set_defaults(run=cmd_quantize)

    dot = sub.add_parser("dot", help="one dot product through a hardware config, optionally stage by stage")
    dot.add_argument("--hw", required=True, help="hardware config YAML")
    dot.add_argument("--a-format", required=True)
    dot.add_argument("--b-format", required=True)
    dot.add_argument("--a", help="A's elements as comma-separated values (must be exact in the format)")
    dot.add_argument("--b", help="B's elements as comma-separated values")
    dot.add_argument("--a-codes", help="A's elements as comma-separated codes (0x.. allowed)")
    dot.add_argument("--b-codes", help="B's elements as codes")
    dot.add_argument("--scale-a", help="scale codes of A's blocks in the unit's inputs.scale_format (E8M0, UE4M3; default: scale 1)")
    dot.add_argument("--scale-b", help="scale codes of B's blocks (as --scale-a)")
    dot.add_argument("--c", type=float, default=0.0, help="fp32 accumulator input (default 0)")
    dot.add_argument("--out-format", choices=["fp32", "fp16", "bf16"], help="default: the config's")
    dot.add_argument("--explain", action="store_true", help="print every stage: products, alignment, sums, roundings")
    dot.add_argument("--json", action="store_true", help="print JSON")
    dot.set_defaults(run=cmd_dot)

    replay = sub.add_parser("replay", help="replay a trace's layers through hardware configs")
    replay.add_argument("trace", help="trace directory (see docs/trace-format.md)")
    replay.add_argument("--hw", action="append", required=True, help="hardware config YAML (repeatable)")
    replay.add_argument("--end-to-end", action="store_true", help="also run the whole model on each unit: accuracy (classifiers) or perplexity (language models)")
    replay.add_argument("--json", metavar="OUT", help="write the JSON report to OUT")
    replay.add_argument("--plots", metavar="DIR",
                        help="write PNG plots: an overview of every layer and unit, and per-layer error histograms "
                             "(needs matplotlib)")
    replay.add_argument("--conv-order", choices=["kh_kw_c", "c_kh_kw"], default="kh_kw_c",
                        help="conv lowering: K ordered (kh, kw, C) with C blocked per tap (default, as NHWC "
                             "accelerators) or (C, kh, kw) (see docs/replay.md)")
    replay.add_argument("--layers", metavar="REGEX",
                        help="replay only the layers whose name matches REGEX (Python re.search)")
    replay.add_argument("--strict", action="store_true",
                        help="fail when a unit cannot take a layer's recorded quantization (default: mark the row)")
    _add_run_arguments(replay)
    replay.set_defaults(run=cmd_replay)

    sweep = sub.add_parser("sweep", help="replay a trace under every point of a grid of hwconfig changes")
    sweep.add_argument("trace", help="trace directory")
    sweep.add_argument("--hw", required=True, help="base hardware config YAML")
    sweep.add_argument("--vary", action="append", required=True, metavar="KEY=VALUES",
                       help="a key path and its values: a:b, a:b:step (integers) or x,y,z (repeatable; docs/sweep.md)")
    sweep.add_argument("--out", required=True, help="output directory (finished points are kept there and reused)")
    _add_run_arguments(sweep)
    sweep.set_defaults(run=cmd_sweep)

    cycles = sub.add_parser("cycles", help="MX-aware cycle estimates of a trace or a SCALE-Sim topology CSV")
    cycles.add_argument("source", help="trace directory or SCALE-Sim topology .csv")
    cycles.add_argument("--hw", required=True, help="hardware config YAML with an 'array:' section")
    cycles.add_argument("--a-format", help="operand A storage format (default: the config's first)")
    cycles.add_argument("--b-format", help="operand B storage format")
    cycles.add_argument("--json", action="store_true", help="print JSON")
    cycles.set_defaults(run=cmd_cycles)

    capture = sub.add_parser("capture", help="capture a trace from a model")
    capture_sub = capture.add_subparsers(dest="source_kind", required=True)
    onnx = capture_sub.add_parser("onnx", help="an ONNX model (float, QDQ, or Quark-quantized); needs mxsim[onnx]")
    onnx.add_argument("model", help="model .onnx file")
    onnx.add_argument("--inputs", required=True, help=".npz of the model's input tensors by name")
    onnx.add_argument("--out", required=True, help="trace directory to write")
    onnx.add_argument("--name", help="trace name (default: the model file's stem)")
    onnx.add_argument("--bfp-kernel", choices=["cpu", "cuda"], default="cpu", help="Quark BFP kernel semantics")
    onnx.add_argument("--force", action="store_true", help="overwrite an existing trace directory")
    onnx.add_argument("--compact", action="store_true",
                      help="store MX-quantized operands as codes and scales only, without their floats "
                           "(docs/trace-format.md: which reports need the floats)")
    onnx.set_defaults(run=cmd_capture_onnx)

    golden = sub.add_parser("golden", help="golden reference vectors for RTL test benches")
    golden.add_argument("--hw", required=True, help="hardware config YAML")
    golden.add_argument("--out", required=True, help="output directory")
    golden.add_argument("--cases", type=int, default=1000, help="random vectors per format pair (default 1000)")
    golden.add_argument("--seed", type=int, default=0)
    golden.add_argument("--kind", action="append", choices=["random", "corners", "exhaustive"],
                        help="case kind (repeatable; default: random and corners)")
    golden.add_argument("--pair", action="append", metavar="A,B",
                        help="an (A format, B format) pair to generate (repeatable; default: every pair of --hw)")
    golden.add_argument("--stages", action="store_true", help="also write per-vector stage dumps")
    golden.add_argument("--quiet", action="store_true", help="no progress bar")
    golden.add_argument("--json", action="store_true", help="print the manifest as JSON")
    golden.set_defaults(run=cmd_golden)
    return parser


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def _one_line(text) -> str:
    return " ".join(str(text).split())


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; bad input of any kind prints one line on stderr and returns 2."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (MxsimError, OSError) as error:
        message = error
    except MemoryError:
        message = f"out of memory; the memory budget ({BUDGET_VARIABLE}, docs/limits.md) is above what this machine has"
    print(f"mxsim {args.command}: error: {_one_line(message)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
