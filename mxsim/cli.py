"""The ``mxsim`` command line: one subcommand per consumer, thin.

User errors (any :class:`mxsim.errors.MxsimError`, a missing or unreadable file, a bad
option) print exactly one line on stderr and exit with status 2, never a traceback;
``--json`` prints machine-readable results on stdout. Output files are written atomically.
Each subcommand imports what it runs, so ``mxsim --version`` and ``--help`` load no Numba.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from pathlib import Path

import numpy as np

from . import __version__
from .errors import ArgumentError, InputFileError, MxsimError
from .fileio import check_output_directory, json_text, read_npy_file, write_atomic
from .limits import BUDGET_VARIABLE, check_block_size, check_int, shown

OUTPUT_FORMATS = (
    "fp32",
    "fp16",
    "bf16",
    "fp64",
)  # the table's wide formats (no import at start-up; tests/test_cli.py checks)


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
        print(json_text(rows, indent=2))
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
        out = fake_quantize(
            x, fmt, axis=args.axis, block_size=args.block_size, profile=args.profile, **overrides
        )
        error = out - reference
        noise = float(np.sum(error**2))
        rows.append(
            {
                "format": fmt.name,
                # exact: inf; a NaN anywhere (input or output) makes the error, so the SQNR, NaN
                "sqnr_db": round(10 * np.log10(signal / noise), 2)
                if noise > 0
                else float("inf" if noise == 0 else "nan"),
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
        print(json_text(result, indent=2))
    else:
        print(
            f"MX quantization of {result['input']}, shape {tuple(x.shape)}, profile {args.profile}, block {args.block_size}"
        )
        _print_table(rows, ["format", "sqnr_db", "max_abs_error", "bits_per_element"])
    return 0


def _number_list(text: str, what: str) -> list[float]:
    try:
        return [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise MxsimError(f"{what}: expected comma-separated numbers, got {text!r}") from None


def _code_list(text: str, what: str, bits: int = 32) -> list[int]:
    try:
        codes = [int(item, 0) for item in text.split(",") if item.strip()]
    except ValueError:
        codes = None
    if codes is None or any(not 0 <= code < 1 << bits for code in codes):
        raise ArgumentError(
            f"{what}: expected comma-separated non-negative integer codes (0x.. allowed), got {text!r}"
        )
    return codes


def _operand_codes(
    values: str | None, codes: str | None, fmt_name: str, operand: str
) -> np.ndarray:
    from .formats import get_format

    fmt = get_format(fmt_name)
    if (values is None) == (codes is None):
        raise MxsimError(f"give exactly one of --{operand} (values) or --{operand}-codes")
    if codes is not None:  # fp64 codes reach 2^64: uint64 (the format then checks its own range)
        return np.array([_code_list(codes, f"--{operand}-codes", 64)], dtype=np.uint64)
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
    return encoded


def _describe_stage(stage: dict) -> str:
    kind = stage["stage"]
    rest = ", ".join(f"{key}={value}" for key, value in stage.items() if key != "stage")
    return f"  {kind:18s} {rest}"


def cmd_dot(args) -> int:
    from .datapath import as_float, dot, explain, load_hwconfig
    from .datapath.api import kernel_c_dtype
    from .formats import get_format

    hw = load_hwconfig(args.hw)
    a = _operand_codes(args.a, args.a_codes, args.a_format, "a")
    b = _operand_codes(args.b, args.b_codes, args.b_format, "b")
    scale_a = (
        None
        if args.scale_a is None
        else np.array([_code_list(args.scale_a, "--scale-a")], dtype=np.int64)
    )
    scale_b = (
        None
        if args.scale_b is None
        else np.array([_code_list(args.scale_b, "--scale-b")], dtype=np.int64)
    )
    c_format = args.c_format or hw.sections[("inputs", "c_format")]
    nearest = float(get_format(c_format).round(np.array([args.c]), overflow="inf")[0])
    if not (
        nearest == args.c or np.isnan(nearest) and np.isnan(args.c)
    ):  # as --a and --b: exact values only
        article = "an" if c_format.startswith("f") else "a"
        raise ArgumentError(
            f"--c: {args.c!r} is not {article} {c_format} value (nearest: {nearest!r}); "
            f"give an exact {c_format} value"
        )
    c = np.array([args.c], dtype=kernel_c_dtype(c_format))
    bits = dot(
        hw,
        a,
        b,
        a_format=args.a_format,
        b_format=args.b_format,
        scale_a=scale_a,
        scale_b=scale_b,
        c=c,
        out_format=args.out_format,
        c_format=c_format,
    )
    out_format = args.out_format or hw.sections[("output", "format")]
    value = float(as_float(bits, out_format)[0])
    width = get_format(out_format).bits // 4
    result = {
        "hw": hw.name,
        "out_format": out_format,
        "bits": f"0x{int(bits[0]):0{width}x}",
        "value": value,
    }
    if args.explain:
        report = explain(
            hw,
            a[0],
            b[0],
            a_format=args.a_format,
            b_format=args.b_format,
            scale_a=None if scale_a is None else scale_a[0],
            scale_b=None if scale_b is None else scale_b[0],
            c=args.c,
            out_format=args.out_format,
            c_format=c_format,
        )
        result["stages"] = report["stages"]
        result["params"] = report["params"]
    if args.json:
        print(json_text(result, indent=2))
        return 0
    if args.explain:
        print(f"{hw.name}: {args.a_format} x {args.b_format} -> {out_format}")
        for stage in result["stages"]:
            print(_describe_stage(stage))
    print(f"{result['bits']} = {value!r}")
    return 0


def _write_json_atomically(path: str, data) -> None:
    write_atomic(Path(path), json_text(data, indent=2))


def cmd_replay(args) -> int:
    from ._optional import require
    from .datapath import load_hwconfig
    from .parallel import make_runner
    from .replay import format_report, replay, write_plots
    from .replay.run import select_layers
    from .trace import load_trace

    _check_cluster_options(args)
    trace = load_trace(args.trace)
    if args.layers is not None:
        if args.end_to_end:
            raise MxsimError(
                "--layers and --end-to-end exclude each other: end to end runs every layer"
            )
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
            report = replay(
                trace,
                units,
                end_to_end=args.end_to_end,
                progress=not args.quiet and sys.stderr.isatty(),
                element_format=args.format,
                conv_order=args.conv_order,
                strict=args.strict,
                runner=runner,
                perplexity_fn=perplexity_fn,
            )
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
    from .sweep import format_table, parse_knobs, run_sweep, write_outputs
    from .sweep.run import is_sweep_output
    from .trace import load_trace

    _check_cluster_options(args)
    if args.area_k is not None:
        if not args.area:
            raise ArgumentError("--area-k needs --area")
        check_int(args.area_k, "--area-k", 1, 4096)
    check_output_directory(args.out, is_sweep_output, "--out")
    base = load_hwconfig(args.hw)
    knobs = parse_knobs(args.vary, args.hw)
    trace = load_trace(args.trace)
    with make_runner(args.workers, args.scheduler) as runner:
        summary = run_sweep(
            trace,
            base,
            knobs,
            args.out,
            runner=runner,
            element_format=args.format,
            progress=not args.quiet and sys.stderr.isatty(),
            area=args.area,
            area_k=args.area_k,
            report=None if args.quiet else lambda line: print(line, file=sys.stderr, flush=True),
        )
    try:
        write_outputs(summary, args.out, plots=True)
    except ImportError:
        print("plots skipped: they need matplotlib (pip install 'mxsim[plots]')", file=sys.stderr)
        write_outputs(summary, args.out)
    print(format_table(summary))
    print(f"results: {Path(args.out) / 'sweep.json'}, {Path(args.out) / 'sweep.csv'}")
    return 1 if summary["failed"] else 0


def _check_cluster_options(args) -> None:
    """--scheduler and --workers checked before any file is read (make_runner checks them again)."""
    from .parallel import parse_scheduler_address

    if args.scheduler is not None:
        parse_scheduler_address(args.scheduler)
    if args.workers is not None:
        check_int(args.workers, "--workers", 1, 4096)


def _add_run_arguments(parser) -> None:
    """The options replay and sweep share: operand format, progress bar, where to run."""
    parser.add_argument(
        "--format",
        help="quantize every operand to this element format (default: the trace's specs)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    cluster = parser.add_mutually_exclusive_group()
    cluster.add_argument(
        "--workers",
        type=int,
        help="run on a local Dask cluster of N worker processes (mxsim[dask])",
    )
    cluster.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run on the Dask cluster at ADDRESS (tcp://host:8786)",
    )


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
    estimate = estimate_layers(
        hw.array,
        layers,
        storage_for_format(a_format),
        storage_for_format(b_format),
        storage_for_format(hw.sections[("output", "format")]),
    )
    if args.json:
        print(json_text(estimate.to_dict(), indent=2))
    else:
        print(format_table(estimate))
    return 0


def cmd_capture_onnx(args) -> int:
    from .trace import save_trace
    from .capture.onnx import capture_onnx, load_inputs_npz
    from .trace.io import reference_mode

    reference_mode(
        args.reference, not args.compact, 2
    )  # a bad --reference is refused before the capture runs
    trace = capture_onnx(
        args.model, load_inputs_npz(args.inputs), name=args.name, bfp_kernel=args.bfp_kernel
    )
    save_trace(
        trace, args.out, overwrite=args.force, floats=not args.compact, reference=args.reference
    )
    print(f"captured {len(trace.layers)} layers from {args.model} into {args.out}")
    return 0


def cmd_capture_torch(args) -> int:
    from ._optional import require
    from .capture.torch import capture_torch
    from .evaluate.models import library_error, load_factory, load_hf, read_inputs, tokenize
    from .limits import check_int, check_path
    from .trace import save_trace

    source = check_path(args.model, "model")
    out = check_path(args.out, "--out")
    if out.exists() and not args.force:  # before the model runs
        raise ArgumentError(
            f"--out {out}: already exists (pass --force to replace a trace directory)"
        )
    if out.exists() and not (out / "manifest.yaml").is_file():
        raise ArgumentError(
            f"--out {out}: exists and is not a trace directory; refusing to replace it"
        )
    max_length = check_int(args.max_length, "--max-length", 2, 1 << 16)
    if source.is_dir():
        task = args.task or "embedding"
        if args.inputs is None:
            raise ArgumentError(
                "capture torch: a model directory needs --inputs (a text file, one input a line)"
            )
        texts = read_inputs(args.inputs, task).texts
        model, tokenizer = load_hf(source, task)
        sample = tokenize(tokenizer, texts, max_length, model)
        name = args.name or source.resolve().name
    else:
        if args.task is not None:
            raise ArgumentError(
                "capture torch: --task is for a model directory; a factory's model runs as it is"
            )
        from .capture.onnx import load_inputs_npz

        arrays = None if args.inputs is None else load_inputs_npz(args.inputs)
        model, example = load_factory(args.model)
        inputs = (
            None
            if arrays is None
            else {key: require("torch").from_numpy(value) for key, value in arrays.items()}
        )
        sample = inputs if inputs is not None else example
        if sample is None:
            raise ArgumentError(
                f"capture torch: {args.model} returned no example inputs; pass --inputs FILE.npz"
            )
        name = args.name or args.model.replace(":", ".")
    try:
        trace = capture_torch(model, sample, name=name, source={"model": str(args.model)})
    except MxsimError:
        raise
    except BaseException as error:  # the model's own code failed on its inputs (sys.exit too)
        raise MxsimError(
            f"capture torch: {shown(args.model)} failed on its inputs: {library_error(error)}"
        ) from None
    save_trace(trace, out, overwrite=args.force)
    print(f"captured {len(trace.layers)} layers from {args.model} into {out}")
    return 0


def cmd_evaluate_hf(args) -> int:
    from .evaluate import evaluate_hf, format_report

    if args.json:
        _check_output_file(args.json)
    report = evaluate_hf(
        args.model_dir,
        args.hw,
        args.format,
        args.task,
        args.inputs,
        max_length=args.max_length,
        batch_size=args.batch_size,
        scaling=args.scaling,
        progress=not args.quiet,
        quantizer=args.quantizer,
    )
    print(format_report(report))
    if args.json:
        _write_json_atomically(args.json, report)
        print(f"JSON report: {args.json}")
    return 1 if any("error" in run for run in report["runs"]) else 0


def cmd_evaluate_onnx(args) -> int:
    from .evaluate.onnx import evaluate_onnx, format_onnx_report

    if args.json:
        _check_output_file(args.json)
    report = evaluate_onnx(
        args.model,
        args.data,
        args.hw,
        args.format,
        float_model=args.float_model,
        batch_size=args.batch_size,
        resize=args.resize,
        crop=args.crop,
        scaling=args.scaling,
        progress=not args.quiet,
    )
    print(format_onnx_report(report))
    if args.json:
        _write_json_atomically(args.json, report)
        print(f"JSON report: {args.json}")
    return 1 if any("error" in row for row in report["rows"]) else 0


def _check_output_file(value) -> None:
    """An output file path whose directory exists (checked before the work that fills it)."""
    from .limits import check_path

    path = check_path(value, "--json")
    if path.is_dir() or not path.parent.is_dir():
        raise ArgumentError(f"--json {value}: expected a file in an existing directory")


def cmd_golden(args) -> int:
    from .golden import generate

    pairs = None
    if args.pair:
        pairs = [tuple(item.strip() for item in text.split(",")) for text in args.pair]
        bad = [text for text, pair in zip(args.pair, pairs) if len(pair) != 2 or not all(pair)]
        if bad:
            raise ArgumentError(f"golden --pair: expected A,B (two format names), got {bad[0]!r}")
    manifest = generate(
        args.hw,
        args.out,
        cases=args.cases,
        seed=args.seed,
        kinds=args.kind or ["random", "corners"],
        stage_dumps=args.stages,
        progress=None if not args.quiet else False,
        pairs=pairs,
    )
    if args.json:
        print(json_text(manifest, indent=2))
        return 0
    for unit in manifest["units"]:
        for kind, entry in unit["files"].items():
            print(f"{entry['vectors']}: {entry['count']} vectors")
    totals = ", ".join(f"{count} {kind}" for kind, count in manifest["counts"].items())
    print(f"{totals}; manifest: {Path(args.out) / 'manifest.json'}")
    return 0


def cmd_export_c(args) -> int:
    from .cmodel import export_c

    manifest = export_c(args.hw, args.out, args.a_format, args.b_format, args.k)
    for name in manifest["files"]:
        print(Path(args.out) / name)
    print(
        f"{manifest['c_function']}: {manifest['config']} {manifest['a_format']} x {manifest['b_format']}, K = {manifest['k']}"
    )
    return 0


def cmd_rtl(args) -> int:
    from .rtl import generate_unit
    from .rtl.output import is_rtl_output, write_unit

    check_output_directory(args.out, is_rtl_output, "--out")  # before any work
    if args.k is not None:
        check_int(args.k, "--k", 1, 4096)
    check_int(args.pipeline, "--pipeline", 0, 8)
    unit = generate_unit(
        args.hw, args.a_format, args.b_format, args.k, name=args.name, pipeline=args.pipeline
    )
    area = None
    if args.area:
        from .rtl.synth import synthesize

        result = synthesize(unit)
        area = {
            "cells": result.cells,
            "transistors": result.transistors,
            "depth": result.depth,
            "synthesis_seconds": result.seconds,
        }
    out = write_unit(unit, args.out, area)
    print(f"{unit.name}: {', '.join(sorted(unit.files))}, tb.sv in {out}")
    if area:
        print(
            f"area: {area['cells']} cells (NAND/NOR/NOT), {area['transistors']} transistors, "
            f"depth {area['depth']} gate levels (yosys {area['synthesis_seconds']:.1f} s"
            f"{', cached' if result.cached else ''})"
        )
    return 0


def _check_probe_widths(unit, hw: str, out_format: str | None, c_format: str | None) -> None:
    """--hw: --out-format and --c-format must be of the width the config's unit works in. A unit
    whose accumulator (on the pair's own path) is fp64 takes c and writes results in fp64
    only; any other accumulates in fp32 or narrower and takes c and writes results in fp32,
    fp16 or bf16. Across the two (an fp32 accumulator written out as fp64, an fp64 one rounded
    to fp32, fp64 c into an fp32 accumulator or fp32 c into an fp64 one) the path is no
    instruction's: the shipped configs' hardware reads and writes one width, and a probe of
    such a path would characterise a unit that does not exist."""
    from .datapath.schema import WIDE_FORMATS
    from .formats import get_format

    own = unit.config.params(unit.a_format, unit.b_format)
    wide = own.accumulator_format != "exact" and get_format(own.accumulator_format).bits > 32
    accepted = [name for name in WIDE_FORMATS if (get_format(name).bits > 32) == wide]
    for flag, value in (("--out-format", out_format), ("--c-format", c_format)):
        if value is not None and get_format(value).name not in accepted:
            raise ArgumentError(
                f"probe: {flag} {value} does not fit --hw {hw}: its accumulator is "
                f"{own.accumulator_format}, so it takes {', '.join(accepted)}"
            )


def _check_probe_outputs(args) -> None:
    """--seed, --out and --report checked before the probe asks anything: a seed in range, and
    each output a file in an existing directory (two different files), so that a run is not
    lost to a path that cannot be written."""
    from .limits import check_path
    from .probe.core import MAX_SEED

    check_int(args.seed, "--seed", 0, MAX_SEED)
    paths = {}
    for flag, value in (("--out", args.out), ("--report", args.report)):
        if value is None:
            continue
        path = check_path(value, flag)
        if path.is_dir() or not path.parent.is_dir():
            raise ArgumentError(f"{flag} {shown(value)}: expected a file in an existing directory")
        real = os.path.realpath(path)  # never raises, unlike Path.resolve on a symlink loop
        if real in paths.values():
            raise ArgumentError(f"{flag} {shown(value)}: the same file as --out")
        paths[flag] = real


#: A --mode name: it names the view's file, so letters, digits, '_' and '-' only.
MODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")


def _probe_modes(args) -> int:
    """--mode NAME=CMD (repeated): one box per rounding mode, each a --command; the base config
    is written to --out and each mode's view beside it as STEM-NAME.yaml, extending the base
    (mxsim.probe.modes). Exit 0 when every mode's probe is exact, else 1 (all files written)."""
    from .probe import SubprocessUnit
    from .probe.modes import probe_modes

    modes: dict = {}
    for item in args.mode:
        name, sep, command = item.partition("=")
        if not sep or not MODE_NAME.fullmatch(name) or not command.strip():
            raise ArgumentError(
                f"--mode {shown(item)}: expected NAME=COMMAND, NAME of letters, digits, '_' and '-' "
                "(at most 32, first a letter or digit) and a command"
            )
        if name in modes:
            raise ArgumentError(f"--mode {shown(name)}: given twice")
        modes[name] = command
    if len(modes) < 2:
        raise ArgumentError(
            "--mode: give at least two modes (one box per rounding mode); for one box use --command"
        )
    out = Path(args.out)
    views = {name: out.with_name(f"{out.stem}-{name}{out.suffix or '.yaml'}") for name in modes}
    taken = {os.path.realpath(path) for path in (args.out, args.report) if path is not None}
    for name, path in views.items():
        if os.path.realpath(path) in taken or path.is_dir():
            raise ArgumentError(
                f"--mode {name}: its view {shown(str(path))} would overwrite --out, --report or a directory"
            )
    units = {}
    try:
        for name, command in modes.items():
            try:
                units[name] = SubprocessUnit(
                    command,
                    args.a_format,
                    args.b_format,
                    args.out_format or "fp32",
                    timeout=args.timeout,
                    c_format=args.c_format or "fp32",
                )
            except ArgumentError as error:
                raise ArgumentError(
                    f"--mode {name}: {str(error).removeprefix('--command: ')}"
                ) from None
        result = probe_modes(
            units,
            args.a_format,
            args.b_format,
            args.k,
            block_size=32 if args.block_size is None else args.block_size,
            out_format=args.out_format or "fp32",
            c_format=args.c_format or "fp32",
            seed=args.seed,
            validation_vectors=args.validation,
            corner_vectors=args.corners,
            budget=args.budget,
            name=args.name,
            seconds=args.seconds,
            progress=None if args.quiet else lambda line: print(line, file=sys.stderr, flush=True),
        )
    finally:
        for unit in units.values():
            unit.close()
    write_atomic(out, result.results[result.base].yaml)
    for name, path in views.items():
        write_atomic(path, result.view_yaml(name, out.name, f"{args.name}-{name}"))
    if args.report:
        _write_json_atomically(args.report, result.report())
    if args.json:
        print(json_text(result.report(), indent=2))
    else:
        print(f"base: mode {result.base}; config: {args.out}")
        for name, path in views.items():
            check = result.results[name].validation
            held = (
                ", ".join(f"{key}={value}" for key, value in result.views[name].items())
                or "the base as it is"
            )
            print(
                f"mode {name}: {held}; its probe {check.mismatches} mismatches in {check.vectors} vectors, "
                f"{result.results[name].queries} dot products; view: {path}"
            )
    return 0 if result.exact else 1


def cmd_probe(args) -> int:
    from .probe import HwconfigUnit, SubprocessUnit, load_callable, probe
    from .probe.units import python_path_hint

    sources = [
        name
        for name, value in (
            ("--unit", args.unit),
            ("--hw", args.hw),
            ("--command", args.command_line),
            ("--mode", args.mode),
        )
        if value is not None
    ]
    if len(sources) != 1:
        raise ArgumentError(
            f"probe: give exactly one of --unit, --hw, --command, --mode (got {', '.join(sources) or 'none'})"
        )
    if not 0 < args.timeout <= 3600:
        raise ArgumentError(f"probe: --timeout must be in (0, 3600] seconds, got {args.timeout}")
    _check_probe_outputs(args)
    if args.mode is not None:
        return _probe_modes(args)
    block_size = args.block_size
    closing = None
    out_format, c_format = args.out_format, args.c_format
    if args.hw is not None:
        unit = HwconfigUnit(args.hw, args.a_format, args.b_format, out_format, c_format)
        _check_probe_widths(unit, args.hw, out_format, c_format)
        block_size = unit.block_size if block_size is None else block_size
        out_format, c_format = unit.out_format, unit.c_format  # unset: the config's own
    elif args.unit is not None:
        python_path_hint()
        unit = load_callable(args.unit)
    else:
        unit = closing = SubprocessUnit(
            args.command_line,
            args.a_format,
            args.b_format,
            out_format or "fp32",
            timeout=args.timeout,
            c_format=c_format or "fp32",
        )
    try:
        result = probe(
            unit,
            args.a_format,
            args.b_format,
            args.k,
            block_size=32 if block_size is None else block_size,
            out_format=out_format or "fp32",
            c_format=c_format or "fp32",
            seed=args.seed,
            validation_vectors=args.validation,
            corner_vectors=args.corners,
            budget=args.budget,
            name=args.name,
            seconds=args.seconds,
            progress=None if args.quiet else lambda line: print(line, file=sys.stderr, flush=True),
        )
    finally:
        if closing is not None:
            closing.close()
    write_atomic(Path(args.out), result.yaml)
    if args.report:
        _write_json_atomically(args.report, result.report())
    status = 0 if result.exact else 1  # a config that is not exact is written, and the run fails
    if args.json:
        print(json_text(result.report(), indent=2))
        return status
    for decision in result.decisions:
        values = ", ".join(f"{key}={value}" for key, value in decision.value.items())
        note = (
            f" (no candidate fits: {decision.mismatches} answers missed)"
            if decision.mismatches
            else ""
        )
        print(f"{decision.probe}: {values}; {decision.asked} inputs asked{note}")
    check = result.validation
    print(
        f"validation: {check.mismatches} mismatches in {check.vectors} vectors "
        f"({check.random} random, {check.corners} corners, {check.targeted} targeted)"
        + (f", {check.answered} of the run's earlier answers missed" if check.answered else "")
        + (
            f", {check.nan_payload_differences} NaN outputs with another payload"
            if check.nan_payload_differences
            else ""
        )
    )
    print(
        f"{result.queries} dot products asked in {result.seconds:.1f} s ({result.unit_seconds:.1f} s in the unit); "
        f"config: {args.out}"
    )
    for entry in result.rounding_only:
        print(
            f"decided under {entry['rounding']} only: {entry['key']}={entry['held']} "
            f"({', '.join(map(str, entry['others']))} alike under it, not under {', '.join(entry['differs_under'])})"
        )
    if result.stopped:
        print(f"stopped early: {result.stopped}")
    if not result.exact:
        print(f"NOT EXACT: {check.mismatches} mismatches; the config written is the best found")
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mxsim", description="Bit-accurate MX datapath emulator")
    parser.add_argument("--version", action="version", version=f"mxsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    formats = sub.add_parser("formats", help="list the number formats")
    formats.add_argument("--json", action="store_true", help="print JSON")
    formats.set_defaults(run=cmd_formats)

    quantize = sub.add_parser(
        "quantize", help="MX-quantize a tensor and report the error per format"
    )
    quantize.add_argument("--input", help=".npy float array (default: a built-in sample tensor)")
    quantize.add_argument(
        "--format", action="append", help="element format (repeatable; default: all MX formats)"
    )
    quantize.add_argument(
        "--profile",
        default="ocp",
        help="quantization profile (default ocp; docs/profiles.md; an unknown name lists them)",
    )
    quantize.add_argument(
        "--scale-rule", choices=["floor", "ceil", "even", "rceil"], help="override the profile's"
    )
    quantize.add_argument("--axis", type=int, default=-1)
    quantize.add_argument("--block-size", type=int, default=32)
    quantize.add_argument("--json", action="store_true", help="print JSON")
    quantize.set_defaults(run=cmd_quantize)

    dot = sub.add_parser(
        "dot", help="one dot product through a hardware config, optionally stage by stage"
    )
    dot.add_argument("--hw", required=True, help="hardware config YAML")
    dot.add_argument("--a-format", required=True)
    dot.add_argument("--b-format", required=True)
    dot.add_argument(
        "--a", help="A's elements as comma-separated values (must be exact in the format)"
    )
    dot.add_argument("--b", help="B's elements as comma-separated values")
    dot.add_argument("--a-codes", help="A's elements as comma-separated codes (0x.. allowed)")
    dot.add_argument("--b-codes", help="B's elements as codes")
    dot.add_argument(
        "--scale-a",
        help="scale codes of A's blocks in the unit's inputs.scale_format (E8M0, UE4M3; default: scale 1)",
    )
    dot.add_argument("--scale-b", help="scale codes of B's blocks (as --scale-a)")
    dot.add_argument(
        "--c", type=float, default=0.0, help="accumulator input, a value of --c-format (default 0)"
    )
    dot.add_argument(
        "--c-format",
        choices=OUTPUT_FORMATS,
        help="the format of c (default: the config's inputs.c_format)",
    )
    dot.add_argument("--out-format", choices=OUTPUT_FORMATS, help="default: the config's")
    dot.add_argument(
        "--explain",
        action="store_true",
        help="print every stage: products, alignment, sums, roundings",
    )
    dot.add_argument("--json", action="store_true", help="print JSON")
    dot.set_defaults(run=cmd_dot)

    replay = sub.add_parser("replay", help="replay a trace's layers through hardware configs")
    replay.add_argument("trace", help="trace directory (see docs/trace-format.md)")
    replay.add_argument(
        "--hw", action="append", required=True, help="hardware config YAML (repeatable)"
    )
    replay.add_argument(
        "--end-to-end",
        action="store_true",
        help="also run the whole model on each unit: accuracy (classifiers) or perplexity (language models)",
    )
    replay.add_argument("--json", metavar="OUT", help="write the JSON report to OUT")
    replay.add_argument(
        "--plots",
        metavar="DIR",
        help="write PNG plots: an overview of every layer and unit, and per-layer error histograms "
        "(needs matplotlib)",
    )
    replay.add_argument(
        "--conv-order",
        choices=["kh_kw_c", "c_kh_kw"],
        default="kh_kw_c",
        help="conv lowering: K ordered (kh, kw, C) with C blocked per tap (default, as NHWC "
        "accelerators) or (C, kh, kw) (see docs/replay.md)",
    )
    replay.add_argument(
        "--layers",
        metavar="REGEX",
        help="replay only the layers whose name matches REGEX (Python re.search)",
    )
    replay.add_argument(
        "--strict",
        action="store_true",
        help="fail when a unit cannot take a layer's recorded quantization (default: mark the row)",
    )
    _add_run_arguments(replay)
    replay.set_defaults(run=cmd_replay)

    sweep = sub.add_parser(
        "sweep", help="replay a trace under every point of a grid of hwconfig changes"
    )
    sweep.add_argument("trace", help="trace directory")
    sweep.add_argument("--hw", required=True, help="base hardware config YAML")
    sweep.add_argument(
        "--vary",
        action="append",
        required=True,
        metavar="KEY=VALUES",
        help="a key path and its values: a:b, a:b:step (integers) or x,y,z (repeatable; docs/sweep.md)",
    )
    sweep.add_argument(
        "--out", required=True, help="output directory (finished points are kept there and reused)"
    )
    sweep.add_argument(
        "--area",
        action="store_true",
        help="also synthesize each point's unit with yosys: area and depth columns (slow; docs/area.md)",
    )
    sweep.add_argument(
        "--area-k",
        type=int,
        metavar="K",
        help="elements per dot product of the synthesized units (default: the block size)",
    )
    _add_run_arguments(sweep)
    sweep.set_defaults(run=cmd_sweep)

    cycles = sub.add_parser(
        "cycles", help="MX-aware cycle estimates of a trace or a SCALE-Sim topology CSV"
    )
    cycles.add_argument("source", help="trace directory or SCALE-Sim topology .csv")
    cycles.add_argument("--hw", required=True, help="hardware config YAML with an 'array:' section")
    cycles.add_argument("--a-format", help="operand A storage format (default: the config's first)")
    cycles.add_argument("--b-format", help="operand B storage format")
    cycles.add_argument("--json", action="store_true", help="print JSON")
    cycles.set_defaults(run=cmd_cycles)

    capture = sub.add_parser("capture", help="capture a trace from a model")
    capture_sub = capture.add_subparsers(dest="source_kind", required=True)
    onnx = capture_sub.add_parser(
        "onnx", help="an ONNX model (float, QDQ, or Quark-quantized); needs mxsim[onnx]"
    )
    onnx.add_argument("model", help="model .onnx file")
    onnx.add_argument("--inputs", required=True, help=".npz of the model's input tensors by name")
    onnx.add_argument("--out", required=True, help="trace directory to write")
    onnx.add_argument("--name", help="trace name (default: the model file's stem)")
    onnx.add_argument(
        "--bfp-kernel", choices=["cpu", "cuda"], default="cpu", help="Quark BFP kernel semantics"
    )
    onnx.add_argument("--force", action="store_true", help="overwrite an existing trace directory")
    onnx.add_argument(
        "--compact",
        action="store_true",
        help="store MX-quantized operands as codes and scales only, without their floats "
        "(docs/trace-format.md: which reports need the floats)",
    )
    onnx.add_argument(
        "--reference",
        metavar="MODE",
        help="how the float reference outputs are stored: float32 (exact; the default without "
        "--compact) or residual8 (the residual from the exact MX product, within 2^-8 of the "
        "quantization error's RMS; the default with --compact, which it needs; "
        "docs/trace-format.md)",
    )
    onnx.set_defaults(run=cmd_capture_onnx)

    torch_capture = capture_sub.add_parser(
        "torch",
        help="a PyTorch model: a Hugging Face model directory or module:factory; needs mxsim[torch]",
        description="MODEL is a Hugging Face model directory (loaded offline with the --task auto class, "
        "--inputs a text file, one input a line, tokenized by the directory's tokenizer) or "
        "module:factory (factory() returns an nn.Module or (nn.Module, example inputs); --inputs "
        "an .npz whose arrays are passed as keyword arguments by name). See docs/evaluate.md.",
    )
    torch_capture.add_argument("model", help="model directory or module:factory")
    torch_capture.add_argument(
        "--inputs", help="text file (model directory) or .npz of keyword arguments (factory)"
    )
    torch_capture.add_argument("--out", required=True, help="trace directory to write")
    torch_capture.add_argument(
        "--task",
        choices=["embedding", "causal-lm", "classification"],
        help="which auto class loads a model directory (default embedding: AutoModel)",
    )
    torch_capture.add_argument(
        "--max-length", type=int, default=128, help="tokens per input (default 128)"
    )
    torch_capture.add_argument(
        "--name", help="trace name (default: the directory's or factory's name)"
    )
    torch_capture.add_argument(
        "--force", action="store_true", help="overwrite an existing trace directory"
    )
    torch_capture.set_defaults(run=cmd_capture_torch)

    evaluate = sub.add_parser(
        "evaluate", help="a model in float and with each unit x format in the loop: a verdict"
    )
    evaluate_sub = evaluate.add_subparsers(dest="source_kind", required=True)
    hf = evaluate_sub.add_parser(
        "hf",
        help="a Hugging Face model directory (offline); needs mxsim[torch,models]",
        description="Runs the model in float32 and with every matmul on each --hw unit in each --format, and "
        "reports per unit x format: embedding: cosine vs float (min, mean) and similarity-ranking "
        "agreement; causal-lm: perplexity and top-1 agreement; classification: accuracy (with "
        "labels) and top-1 agreement. See docs/evaluate.md.",
    )
    hf.add_argument("model_dir", help="model directory (config.json, weights, tokenizer)")
    hf.add_argument(
        "--hw", action="append", required=True, help="hardware config YAML (repeatable)"
    )
    hf.add_argument(
        "--format",
        action="append",
        help="element format of both operands (repeatable); or --quantizer",
    )
    hf.add_argument(
        "--quantizer",
        metavar="LIBRARY:SPEC",
        help="quantize the model with the library itself (quark:mxfp8_e4m3, quark:mxfp4, "
        "torchao:mxfp8_e4m3, ...) and report float, the library's model and each unit "
        "computing with its quantized operands; instead of --format",
    )
    hf.add_argument("--task", required=True, choices=["embedding", "causal-lm", "classification"])
    hf.add_argument(
        "--inputs",
        required=True,
        help="UTF-8 text file, one input a line (classification: optionally LABEL<TAB>text)",
    )
    hf.add_argument("--max-length", type=int, default=128, help="tokens per input (default 128)")
    hf.add_argument(
        "--batch-size", type=int, default=32, help="inputs per forward pass (default 32)"
    )
    hf.add_argument(
        "--scaling",
        choices=["auto", "block", "tensor"],
        default="auto",
        help="operand scaling on the unit (default auto: block scales where the unit has them)",
    )
    hf.add_argument("--json", metavar="OUT", help="write the JSON report to OUT")
    hf.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    hf.set_defaults(run=cmd_evaluate_hf)
    onnx_eval = evaluate_sub.add_parser(
        "onnx",
        help="an ONNX image classifier: top-1/top-5 in float, in its runtime and on each unit; needs mxsim[onnx]",
        description="Runs the classifier MODEL.onnx on the images of --data: in onnxruntime (with AMD Quark's "
        "custom-op library for a Quark-quantized model), and with every MatMul/Gemm/Conv on each --hw "
        "unit in each --format; and --float-model in onnxruntime. Prints top-1 and top-5 accuracy and "
        "model size per row. See docs/evaluate.md.",
    )
    onnx_eval.add_argument(
        "model", help="the (quantized) classifier .onnx: one float32 input, (batch, classes) logits"
    )
    onnx_eval.add_argument(
        "--data",
        required=True,
        help="image folder (one sub-folder per class; needs Pillow) or .npz with 'inputs' and "
        "'labels'",
    )
    onnx_eval.add_argument(
        "--hw", action="append", required=True, help="hardware config YAML (repeatable)"
    )
    onnx_eval.add_argument(
        "--format",
        action="append",
        help="element format of both operands (repeatable; default: each unit's first format)",
    )
    onnx_eval.add_argument(
        "--float-model", metavar="FLOAT.onnx", help="the float classifier, for the float row"
    )
    onnx_eval.add_argument("--batch-size", type=int, default=32, help="images per run (default 32)")
    onnx_eval.add_argument(
        "--resize",
        type=int,
        default=256,
        help="an image's shorter side after resizing (default 256)",
    )
    onnx_eval.add_argument(
        "--crop", type=int, default=224, help="the centre crop's side (default 224)"
    )
    onnx_eval.add_argument(
        "--scaling",
        choices=["auto", "block", "tensor"],
        default="auto",
        help="operand scaling on the unit (default auto: block scales where the unit has them)",
    )
    onnx_eval.add_argument("--json", metavar="OUT", help="write the JSON report to OUT")
    onnx_eval.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    onnx_eval.set_defaults(run=cmd_evaluate_onnx)

    golden = sub.add_parser("golden", help="golden reference vectors for RTL test benches")
    golden.add_argument("--hw", required=True, help="hardware config YAML")
    golden.add_argument("--out", required=True, help="output directory")
    golden.add_argument(
        "--cases", type=int, default=1000, help="random vectors per format pair (default 1000)"
    )
    golden.add_argument("--seed", type=int, default=0)
    golden.add_argument(
        "--kind",
        action="append",
        choices=["random", "corners", "exhaustive"],
        help="case kind (repeatable; default: random and corners)",
    )
    golden.add_argument(
        "--pair",
        action="append",
        metavar="A,B",
        help="an (A format, B format) pair to generate (repeatable; default: every pair of --hw)",
    )
    golden.add_argument("--stages", action="store_true", help="also write per-vector stage dumps")
    golden.add_argument("--quiet", action="store_true", help="no progress bar")
    golden.add_argument("--json", action="store_true", help="print the manifest as JSON")
    golden.set_defaults(run=cmd_golden)

    export = sub.add_parser("export", help="export a unit as a model for other tools")
    export_sub = export.add_subparsers(dest="export_kind", required=True)
    export_c = export_sub.add_parser(
        "c",
        help="a dependency-free C99 model of one unit, with DPI-C entry points (docs/cmodel.md)",
    )
    export_c.add_argument("--hw", required=True, help="hardware config YAML")
    export_c.add_argument(
        "--a-format", help="element format of A (needed when the unit takes several pairs)"
    )
    export_c.add_argument("--b-format", help="element format of B")
    export_c.add_argument(
        "--k", type=int, help="elements per dot product (default: the unit's block size)"
    )
    export_c.add_argument("--out", required=True, help="output directory (replaced as a whole)")
    export_c.set_defaults(run=cmd_export_c)

    rtl = sub.add_parser(
        "rtl", help="synthesizable SystemVerilog of a hwconfig's unit (docs/rtl.md)"
    )
    rtl.add_argument("--hw", required=True, help="hardware config YAML")
    rtl.add_argument("--a-format", required=True)
    rtl.add_argument("--b-format", required=True)
    rtl.add_argument("--k", type=int, help="elements per dot product (default: the block size)")
    rtl.add_argument(
        "--pipeline",
        type=int,
        default=0,
        help="register stages on the result (default 0: combinational)",
    )
    rtl.add_argument("--name", help="the top module's name")
    rtl.add_argument(
        "--out", required=True, help="output directory (new, empty, or an earlier mxsim rtl output)"
    )
    rtl.add_argument(
        "--area", action="store_true", help="synthesize with yosys: cells, transistors, logic depth"
    )
    rtl.set_defaults(run=cmd_rtl)

    probe = sub.add_parser(
        "probe", help="characterise a black-box dot-product unit and write its hwconfig"
    )
    probe.add_argument(
        "--unit",
        metavar="MODULE:FUNCTION",
        help="a Python function unit(a, b, scale_a, scale_b, c) -> bits",
    )
    probe.add_argument("--hw", help="an mxsim hardware config, probed as a black box")
    probe.add_argument(
        "--command",
        dest="command_line",
        metavar="CMD",
        help="a command speaking the line protocol of docs/probe.md on stdin/stdout",
    )
    probe.add_argument("--a-format", required=True)
    probe.add_argument("--b-format", required=True)
    probe.add_argument("--k", type=int, required=True, help="the dot length the unit takes")
    probe.add_argument(
        "--block-size", type=int, help="elements per block scale (default: --hw's, else 32)"
    )
    probe.add_argument(
        "--out-format",
        choices=["fp32", "fp16", "bf16", "fp64"],
        help="the unit's output format (default: --hw's output.format, else fp32)",
    )
    probe.add_argument(
        "--c-format",
        choices=["fp32", "fp16", "bf16", "fp64"],
        help="the values of c the unit takes (sent as fp32 bits, fp64 as fp64 bits; "
        "default: --hw's inputs.c_format, else fp32)",
    )
    probe.add_argument(
        "--mode",
        action="append",
        metavar="NAME=CMD",
        help="one box per rounding mode, as --command (repeat, at least two): the base config is "
        "written to --out, each mode's view beside it as STEM-NAME.yaml",
    )
    probe.add_argument("--out", required=True, help="the hwconfig YAML to write")
    probe.add_argument("--report", metavar="JSON", help="also write the evidence report as JSON")
    probe.add_argument("--seed", type=int, default=0)
    probe.add_argument(
        "--validation",
        type=int,
        default=2048,
        help="random validation vectors, half realistic data, half uniform codes (default 2048)",
    )
    probe.add_argument(
        "--corners", type=int, default=512, help="corner validation vectors (default 512)"
    )
    probe.add_argument(
        "--budget", type=int, default=100_000, help="most dot products to ask (default 100000)"
    )
    probe.add_argument(
        "--seconds",
        type=float,
        help="ask nothing more after this many seconds; keep the best found",
    )
    probe.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    probe.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds --command may take per answer (default 30)",
    )
    probe.add_argument("--name", default="probed", help="the emitted config's name")
    probe.add_argument("--json", action="store_true", help="print the evidence report as JSON")
    probe.set_defaults(run=cmd_probe)
    return parser


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr and exit status 2."""

    def error(self, message: str):
        # argparse quotes the offending value whole: each quoted value cut to the echo bound
        message = re.sub(r"'([^']{77})[^']+'", r"'\1...'", _one_line(message))
        message = (
            message if len(message) <= 400 else message[:397] + "..."
        )  # a value quoted otherwise
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _one_line(text) -> str:
    return " ".join(str(text).split())


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; bad input of any kind prints one line on stderr and returns 2."""
    args = build_parser().parse_args(argv)
    # Warnings (numpy's RuntimeWarning, torch's UserWarning, ...) are held while the command
    # runs: shown after it when it ends, dropped when it fails, whose output is the one line.
    with warnings.catch_warnings(record=True) as held:
        try:
            status = args.run(args)
        except (MxsimError, OSError) as error:
            message = error
        except MemoryError:
            message = f"out of memory; the memory budget ({BUDGET_VARIABLE}, docs/limits.md) is above what this machine has"
        else:
            message = None
    if message is None:
        for warning in held:
            warnings.warn_explicit(
                warning.message,
                warning.category,
                warning.filename,
                warning.lineno,
                source=warning.source,
            )
        return status
    print(f"mxsim {args.command}: error: {_one_line(message)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
