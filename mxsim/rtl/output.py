"""Writing a generated unit: its SystemVerilog files, its test bench and a manifest, all at once.

The output directory is replaced as a whole (``fileio.staged_directory``): it must be new,
empty, or an earlier ``mxsim rtl`` output (recognised by its ``rtl.json``), so a kill at any
moment leaves the old complete output or the new one.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..fileio import check_output_directory, json_text, staged_directory
from .generate import RtlUnit
from .simulate import probe_testbench, testbench, vector_fields

MANIFEST = "rtl.json"


def is_rtl_output(directory: Path) -> bool:
    """Whether ``directory`` holds an earlier ``mxsim rtl`` output (its manifest)."""
    manifest = directory / MANIFEST
    try:
        return (
            manifest.is_file()
            and json.loads(manifest.read_text(encoding="utf-8")).get("tool") == "mxsim rtl"
        )
    except (OSError, ValueError, AttributeError):
        return False


def manifest(unit: RtlUnit, area: dict | None = None) -> dict:
    p = unit.params
    return {
        "tool": "mxsim rtl",
        "top": unit.name,
        "a_format": p.a_format,
        "b_format": p.b_format,
        "k": unit.dot_length,
        "pipeline": unit.pipeline,
        "files": sorted(unit.files) + ["tb.sv"] + ([] if unit.pipeline else ["probe_tb.sv"]),
        "ports": [
            {"name": n, "direction": d, "bits": w, "meaning": m} for n, d, w, m in unit.ports
        ],
        "vector_fields": [
            {"name": n, "lsb": lsb, "bits": bits} for n, lsb, bits in vector_fields(unit)
        ],
        **({"area": area} if area else {}),
    }


def write_unit(unit: RtlUnit, out_dir, area: dict | None = None) -> Path:
    """Write ``unit``'s files, ``tb.sv`` and ``rtl.json`` into ``out_dir`` atomically; return it."""
    target = check_output_directory(out_dir, is_rtl_output, "--out")
    with staged_directory(target) as staging:
        for name, text in unit.files.items():
            (staging / name).write_text(text, encoding="utf-8")
        (staging / "tb.sv").write_text(testbench(unit), encoding="utf-8")
        if not unit.pipeline:
            (staging / "probe_tb.sv").write_text(probe_testbench(unit), encoding="utf-8")
        (staging / MANIFEST).write_text(
            json_text(manifest(unit, area), indent=2) + "\n", encoding="utf-8"
        )
    return target
