"""The ``mxsim`` command line: one subcommand per consumer, thin.

User errors (any :class:`mxsim.errors.MxsimError`, a missing file) print one line on
stderr and exit with status 2; ``--json`` prints machine-readable results on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from . import __version__
from .errors import MxsimError
from .formats import FORMATS, get_format
from .quantize import PROFILES, fake_quantize
from .quantize.options import resolve_options

DEMO_FORMATS = ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8"]


def _print_table(rows: list[dict], columns: list[str]) -> None:
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in rows:
        print("  ".join(str(row[c]).ljust(w) for c, w in zip(columns, widths)))


def cmd_formats(args) -> int:
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
    file = Path(path)
    if not file.is_file():
        raise MxsimError(f"{path}: no such file")
    try:
        array = np.load(file, allow_pickle=False)
    except ValueError as error:
        raise MxsimError(f"{path}: not a plain .npy array ({error})") from None
    if not isinstance(array, np.ndarray) or array.dtype not in (np.float16, np.float32, np.float64):
        raise MxsimError(f"{path}: expected a float16/32/64 .npy array")
    return array


def cmd_quantize(args) -> int:
    x = _load_tensor(args.input) if args.input else _sample_tensor()
    overrides = {"scale_rule": args.scale_rule} if args.scale_rule else {}
    resolve_options(args.profile, **overrides)
    reference = x.astype(np.float64)
    signal = float(np.sum(reference**2))
    rows = []
    for name in args.format or DEMO_FORMATS:
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mxsim", description="Bit-accurate MX datapath emulator")
    parser.add_argument("--version", action="version", version=f"mxsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    formats = sub.add_parser("formats", help="list the number formats")
    formats.add_argument("--json", action="store_true", help="print JSON")
    formats.set_defaults(run=cmd_formats)

    quantize = sub.add_parser("quantize", help="MX-quantize a tensor and report the error per format")
    quantize.add_argument("--input", help=".npy float array (default: a built-in sample tensor)")
    quantize.add_argument("--format", action="append", help="element format (repeatable; default: all MX formats)")
    quantize.add_argument("--profile", default="ocp", help=f"one of {', '.join(PROFILES)}")
    quantize.add_argument("--scale-rule", choices=["floor", "ceil", "even", "rceil"], help="override the profile's")
    quantize.add_argument("--axis", type=int, default=-1)
    quantize.add_argument("--block-size", type=int, default=32)
    quantize.add_argument("--json", action="store_true", help="print JSON")
    quantize.set_defaults(run=cmd_quantize)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except MxsimError as error:
        print(f"mxsim {args.command}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"mxsim {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
