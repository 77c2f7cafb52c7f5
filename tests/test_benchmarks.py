"""The benchmark scripts import: each name they take from mxsim still exists (their timed
work runs from the command line only, see docs/benchmarks.md)."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("bench_*.py")))
def test_benchmark_script_imports(script, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import their _timing helper
    spec = importlib.util.spec_from_file_location(f"benchmark_{script[:-3]}", BENCHMARKS / script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None)), f"{script} has no main()"
