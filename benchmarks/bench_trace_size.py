"""Trace sizes on disk for a real model, and what the residual reference does to SQNR vs float.

all-MiniLM-L6-v2 (``mxsim[minilm]``) captured with ``mxsim.capture.torch.capture_torch`` on
the first 16 sentences of examples/minilm/sentences.txt, padded to 20 tokens, with an MX
fp8_e4m3 spec (block 32, OCP) on every input and weight (49 layers), saved as:

* ``v1``: format version 1 (one NPZ per layer);
* ``v2``: version 2 (content-addressed blobs, floats kept);
* ``compact float32``: ``floats=False, reference="float32"`` (MX operands as codes and
  scales, float reference outputs whole);
* ``compact residual8``: ``floats=False`` (the compact default: reference outputs as int16
  residuals from the exact MX product).

Sizes are the bytes of every file of the trace directory (MB = 10^6 bytes), with the bytes
of each kind of array in the compact residual8 trace. ``--sqnr HW ...`` also replays the two
compact traces (the same operands; float32 or residual8 reference outputs) through each unit,
checks that the unit's outputs are bit-identical, and prints, per unit, the worst and median
|SQNR vs float (residual8) - SQNR vs float (float32)| over the layers and the difference of
the totals (worst, median and mean layer SQNR vs float). On rows where the unit takes the
model's operands the float32 compact trace's unit outputs are the version-2 trace's too;
where replay re-quantizes (a unit without block scales) a compact trace starts from the
model's quantized values instead of the floats (docs/trace-format.md).

Run: ``python benchmarks/bench_trace_size.py [--out DIR] [--sqnr kulisch h100-fp8] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
SENTENCES, TOKENS = 16, 20


def capture_minilm():
    from mxsim.capture.torch import capture_torch
    from mxsim.evaluate import load_hf, minilm_model_dir, read_inputs
    from mxsim.trace import MXQuant

    texts = read_inputs(REPO / "examples/minilm/sentences.txt", "embedding").texts[:SENTENCES]
    model, tokenizer = load_hf(minilm_model_dir(), "embedding")
    sample = dict(
        tokenizer(
            texts, padding="max_length", truncation=True, max_length=TOKENS, return_tensors="pt"
        )
    )
    spec = MXQuant("fp8_e4m3")
    return capture_torch(
        model, sample, name="all-MiniLM-L6-v2", quant={"input": spec, "weight": spec}
    )


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def bytes_by_kind(path: Path) -> dict[str, int]:
    """Bytes of each kind of blob of a version-2 trace (each blob counted once)."""
    manifest = yaml.safe_load((path / "manifest.yaml").read_text())
    seen, kinds = set(), {}
    for layer in manifest["layers"]:
        for key, entry in layer["tensors"].items():
            for part in ("blob", "codes", "scales", "residual"):
                if part in entry and entry[part] not in seen:
                    seen.add(entry[part])
                    kind = f"{key} {part}"
                    kinds[kind] = (
                        kinds.get(kind, 0)
                        + (path / "tensors" / f"{entry[part]}.npz").stat().st_size
                    )
    kinds["manifest"] = (path / "manifest.yaml").stat().st_size
    return kinds


def sqnr_differences(full, compact, units) -> dict:
    from mxsim.datapath import load_hwconfig
    from mxsim.replay import replay

    out = {}
    for name in units:
        unit = load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
        reports = [replay(trace, [unit], progress=False) for trace in (full, compact)]
        pairs = [
            (a["results"][0], b["results"][0])
            for a, b in zip(reports[0]["layers"], reports[1]["layers"])
        ]
        assert all(
            np.array_equal(a.bits, b.bits)
            for a, b in zip(*(r["_results"][unit.name] for r in reports))
        ), "unit outputs differ"
        layer_diffs = [abs(b["sqnr_vs_float_db"] - a["sqnr_vs_float_db"]) for a, b in pairs]
        totals = [r["totals"][unit.name] for r in reports]
        out[name] = {
            "layers": len(pairs),
            "rows": totals[0]["rows"],
            "unit_outputs_bit_identical": True,
            "worst_layer_abs_diff_db": max(layer_diffs),
            "median_layer_abs_diff_db": float(np.median(layer_diffs)),
            "totals": {
                key: {
                    "float32": totals[0][key],
                    "residual8": totals[1][key],
                    "abs_diff_db": abs(totals[1][key] - totals[0][key]),
                }
                for key in (
                    "worst_layer_sqnr_vs_float_db",
                    "median_layer_sqnr_vs_float_db",
                    "mean_layer_sqnr_vs_float_db",
                )
            },
            "layer_sqnr_vs_float_db_range": [
                min(a["sqnr_vs_float_db"] for a, _ in pairs),
                max(a["sqnr_vs_float_db"] for a, _ in pairs),
            ],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for the four traces (default: a temporary one)")
    parser.add_argument(
        "--sqnr",
        nargs="*",
        default=[],
        metavar="HW",
        help="hwconfigs/NAME.yaml units to replay the v2 and compact traces through",
    )
    parser.add_argument("--json", help="write the figures as JSON here")
    args = parser.parse_args()
    from mxsim.trace import load_trace, save_trace

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.out or scratch)
        start = time.perf_counter()
        trace = capture_minilm()
        print(
            f"captured {len(trace.layers)} layers in {time.perf_counter() - start:.1f} s "
            f"({SENTENCES} sentences x {TOKENS} tokens)"
        )
        variants = {
            "v1": dict(version=1),
            "v2": {},
            "compact float32": dict(floats=False, reference="float32"),
            "compact residual8": dict(floats=False),
        }
        figures = {"sizes_mb": {}, "save_seconds": {}, "load_seconds": {}}
        for name, options in variants.items():
            path = root / name.replace(" ", "-")
            start = time.perf_counter()
            save_trace(trace, path, overwrite=True, **options)
            figures["save_seconds"][name] = time.perf_counter() - start
            start = time.perf_counter()
            load_trace(path)
            figures["load_seconds"][name] = time.perf_counter() - start
            figures["sizes_mb"][name] = directory_bytes(path) / 1e6
        v1 = figures["sizes_mb"]["v1"]
        print(f"{'trace':18s} {'MB':>8s} {'of v1':>7s} {'save s':>7s} {'load s':>7s}")
        for name, size in figures["sizes_mb"].items():
            print(
                f"{name:18s} {size:8.2f} {size / v1:7.3f} {figures['save_seconds'][name]:7.1f} "
                f"{figures['load_seconds'][name]:7.1f}"
            )
        kinds = bytes_by_kind(root / "compact-residual8")
        figures["compact_residual8_mb_by_kind"] = {k: v / 1e6 for k, v in kinds.items()}
        print(
            "compact residual8 by kind: "
            + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in kinds.items())
        )
        if args.sqnr:  # the same operands (codes) in both: only the reference outputs differ
            full, compact = (
                load_trace(root / "compact-float32"),
                load_trace(root / "compact-residual8"),
            )
            figures["sqnr"] = sqnr_differences(full, compact, args.sqnr)
            for name, found in figures["sqnr"].items():
                totals = ", ".join(
                    f"{k.split('_')[0]} {v['abs_diff_db']:.2e}" for k, v in found["totals"].items()
                )
                low, high = found["layer_sqnr_vs_float_db_range"]
                print(
                    f"{name}: |SQNR vs float (residual8) - (float32)| over {found['layers']} layers: worst "
                    f"{found['worst_layer_abs_diff_db']:.2e} dB, median {found['median_layer_abs_diff_db']:.2e} dB; "
                    f"totals (worst/median/mean layer): {totals} dB; layer SQNR vs float {low:.2f}..{high:.2f} dB; "
                    "unit outputs bit-identical"
                )
    if args.json:
        from mxsim.fileio import json_text

        Path(args.json).write_text(json_text(figures, indent=2))


if __name__ == "__main__":
    main()
