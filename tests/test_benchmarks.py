"""The benchmark scripts import: each name they take from mxsim still exists (their timed
work runs from the command line only, see docs/benchmarks.md). bench_probe.py's tables of
paths are the probe tests' own, and one cheap run of it goes end to end."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from mxsim.probe.core import OVERFLOW_ASKED, TARGETED_ROWS

from conftest import import_or_skip

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(script, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import their _timing helper
    spec = importlib.util.spec_from_file_location(f"benchmark_{script[:-3]}", BENCHMARKS / script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("bench_*.py")))
def test_benchmark_script_imports(script, monkeypatch):
    module = _load(script, monkeypatch)
    assert callable(getattr(module, "main", None)), f"{script} has no main()"


def assert_refused_in_one_line(main, argv, message, capsys) -> None:
    """A script's ``main(argv)`` exits 2 with one line on stderr holding ``message``."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and err.count("\n") == 1, err


UPDATE = "update benchmarks/bench_probe.py's table to the tests'"


def test_bench_probe_paths_are_the_tests(monkeypatch):
    import test_golden_rtl
    import test_probe_core

    bench = _load("bench_probe.py", monkeypatch)
    assert bench.MXSIM_PATHS == {**test_probe_core.CI_PATHS, **test_probe_core.FP64_PATHS}, UPDATE
    assert bench.RTL_VARIANTS == {0: "correct", **test_golden_rtl.BUGS}, UPDATE


def test_bench_probe_own_widths_are_the_tests(monkeypatch):
    import test_probe_core

    bench = _load("bench_probe.py", monkeypatch)
    assert bench.MXDOTP_OWN_K == test_probe_core.MXDOTP_OWN_K, UPDATE
    assert bench.MXDOTP_CONFIGS == test_probe_core.MXDOTP_CONFIGS, UPDATE
    ids = {run.id for run in bench.mxsim_runs()}
    assert {
        f"mxsim/{name}@{element}" for name in bench.MXDOTP_CONFIGS for element in bench.MXDOTP_OWN_K
    } <= ids


def _row(run_id: str, queries: int, measured: dict | None = None) -> dict:
    row = {
        "id": run_id,
        "path": "fp8_e4m3 x fp8_e4m3 -> fp32, K = 8",
        "queries": queries,
        "seconds": 2.0,
        "cpu_seconds": 1.5,
        "compile_seconds": 0.0,
        "unit_seconds": 0.01,
        "passes": 3,
        "mismatches": 0,
        "vectors": 1280,
        "unit_rate": 1000.0,
        "overhead": 2.0,
    }
    return row if measured is None else {**row, "measured": measured}


def test_bench_probe_update_replaces_its_rows_and_keeps_the_others(monkeypatch):
    """--update's merge: a row of the same id replaced in place, a new id added at the end,
    the other rows kept; the rendered table's head then gives the rows' commits and loads (an older row without
    a stamp: the file's load), and no date."""
    bench = _load("bench_probe.py", monkeypatch)
    when = {"date": "2026-01-01 00:00 UTC", "mxsim": "0.1.0", "cores": 2, "load_average": 1.0}
    results = {
        "before": when,
        "after": {**when, "load_average": 2.0},
        "skipped": [],
        "runs": [_row("mxsim/a", 100), _row("mxsim/b", 200)],
    }
    stamp = {"date": "2026-02-02 10:00 UTC", "commit": "abc1234", "load_average": 3.5}
    new = bench.merged(
        results, [_row("mxsim/c", 300, stamp), _row("mxsim/a", 111, stamp)], [], when
    )
    assert [(r["id"], r["queries"]) for r in new["runs"]] == [
        ("mxsim/a", 111),
        ("mxsim/b", 200),
        ("mxsim/c", 300),
    ]
    assert results["runs"][0]["queries"] == 100  # the input is left as it was
    table = bench.render(new)
    assert "| mxsim/a |" in table and "| 111 |" in table
    head = table.splitlines()[0]  # mxsim/b, from before the stamps: the file's load
    assert "abc1234, commit unknown" in head and "load average 1.0 to 3.5" in head
    assert "UTC" not in table  # dates stay in the results file
    assert "total mxsim: 3 runs" in table
    assert "each row's date" not in bench.render(results)  # one run's file: one date above it


def test_bench_probe_update_refuses_what_is_not_a_results_file(monkeypatch, tmp_path, capsys):
    bench = _load("bench_probe.py", monkeypatch)
    (tmp_path / "other.json").write_text('{"runs": [{"queries": 1}]}')
    (tmp_path / "text.json").write_text("not json")
    for argv, message in [
        (["--update", str(tmp_path / "missing.json")], "is not a results file of --json"),
        (["--update", str(tmp_path / "other.json")], "is not a results file of --json"),
        (["--update", str(tmp_path / "text.json")], "is not a results file of --json"),
        (
            ["--update", str(tmp_path / "other.json"), "--json", str(tmp_path / "o.json")],
            "give one",
        ),
    ]:
        assert_refused_in_one_line(bench.main, argv, message, capsys)


def test_the_probe_docs_table_is_the_results_file(monkeypatch):
    """docs/probe.md's table of queries and time is bench_probe's rendering of its results file."""
    bench = _load("bench_probe.py", monkeypatch)
    results = json.loads((BENCHMARKS / "results" / "probe.json").read_text())
    doc = (BENCHMARKS.parent / "docs" / "probe.md").read_text()
    start, end = (
        "<!-- table: python benchmarks/bench_probe.py --render benchmarks/results/probe.json -->\n",
        "\n<!-- end of table -->",
    )
    assert start in doc and end in doc, "docs/probe.md lost its generated table's markers"
    assert doc.split(start)[1].split(end)[0] == bench.render(results), (
        "regenerate docs/probe.md's table: python benchmarks/bench_probe.py --render benchmarks/results/probe.json"
    )


def test_bench_probe_mmasim_families_are_the_tests(monkeypatch):
    import_or_skip("mmasim.nv_ptx", "oracles")
    import test_probe_mmasim as t

    bench = _load("bench_probe.py", monkeypatch)
    known = {
        (f.module, f.op, f.arch, f.ptx): (f.a, f.b, f.c, f.out, f.k, f.block, f.scale)
        for f in t.FAMILIES
    }
    known.update(
        {
            (f.module, f.op, f.arch, f.instruction): (
                "fp64",
                "fp64",
                "fp64",
                "fp64",
                f.k,
                None,
                None,
            )
            for f in t.FP64_FAMILIES
        }
    )
    known.update(
        {
            ("mmasim.amd", "MFMA", f.arch, f.suffix): (f.a, f.b, "fp32", "fp32", f.k, None, None)
            for f in t.AMD_FAMILIES
        }
    )
    rows = {tuple(row[:4]): tuple(row[4:]) for row in bench.MMASIM_FAMILIES}
    assert {key: known.get(key) for key in rows} == rows, UPDATE
    ci = {(f.module, f.op, f.arch, f.ptx) for f in t._ci_families()}
    ci |= {("mmasim.amd", "MFMA", arch, suffix) for arch, suffix in t.AMD_CI}
    assert ci <= rows.keys(), UPDATE


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--set", "mxsim,gpu"], "unknown set 'gpu'"),
        (["--only", "mxsim/no-such-config"], "matches no run"),
        (["--set", "rtl", "--only", "mxsim/*"], "matches no run of the sets rtl"),
        (["--json", "no-such-directory/out.json"], "not a file in an existing directory"),
        (["--markdown=yes"], "ignored explicit argument"),
    ],
)
def test_bench_probe_refuses_bad_flags_in_one_line(argv, message, monkeypatch, capsys):
    bench = _load("bench_probe.py", monkeypatch)
    assert_refused_in_one_line(bench.main, argv, message, capsys)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--hw", "no-such-unit"], "no shipped config 'no-such-unit'"),
        (["--hw", "../hwconfigs/a100"], "no shipped config '../hwconfigs/a100'"),
        (["--hw", "a100:fp8_e4m3"], "a100 takes A and B of one format of bf16, fp16, tf32"),
        (["--repeats", "three"], "invalid int value: 'three'"),
    ],
)
def test_bench_inloop_refuses_bad_flags_in_one_line(argv, message, monkeypatch, capsys):
    bench = _load("bench_inloop.py", monkeypatch)
    assert_refused_in_one_line(bench.main, argv, message, capsys)


def test_bench_inloop_takes_a_units_format(monkeypatch):
    bench = _load("bench_inloop.py", monkeypatch)
    label, unit, formats = bench.shipped_unit("mi300:fp8_e4m3fnuz", None)
    assert (label, unit.name) == ("mi300:fp8_e4m3fnuz", "mi300")
    assert formats == {"a_format": "fp8_e4m3fnuz", "b_format": "fp8_e4m3fnuz"}
    assert bench.shipped_unit("a100", None)[2] == bench.shipped_unit("a100:", None)[2] == {}


@pytest.mark.slow  # a probe run: compiles the probe's kernels
def test_bench_probe_runs_one_path(monkeypatch, tmp_path, capsys):
    bench = _load("bench_probe.py", monkeypatch)
    bench.main(
        ["--set", "mxsim", "--only", "mxsim/ocp-exact", "--json", str(tmp_path / "probe.json")]
    )
    (run,) = json.loads((tmp_path / "probe.json").read_text())["runs"]
    assert run["id"] == "mxsim/ocp-exact" and "error" not in run, run
    # 1,024 random and 256 corner vectors (an fp32 output: no narrow-output rows), and the targeted
    # rows asked after a validation counting none, partial overflows included
    assert run["mismatches"] == 0 and run["vectors"] == 1280 + run["targeted"]
    assert 0 <= run["targeted"] <= TARGETED_ROWS + OVERFLOW_ASKED
    assert 0 < run["queries"] <= 100_000
    assert run["unit_rate"] > 0 and run["seconds"] >= run["unit_seconds"] > 0
    assert "mxsim/ocp-exact" in capsys.readouterr().out


def test_guard_flags_only_large_regressions_of_a_recorded_ratio(monkeypatch):
    guard = _load("bench_guard.py", monkeypatch)
    recorded = {"fast": 0.5, "slow": 0.3}
    assert (
        guard.regressions(recorded, {"fast": 0.2, "slow": 0.11}) == []
    )  # within 3x: a loaded machine
    problems = guard.regressions(recorded, {"fast": 0.1, "other": 1.0})
    assert len(problems) == 2 and problems[0].startswith(
        "fast: 0.100x numpy, recorded 0.500x (5.0x slower"
    )
    assert problems[1] == "slow: not measured"


def test_guard_times_a_batch_beside_numpys_batched_matmul(monkeypatch):
    """A batch case end to end on a small batch: its ratio under its name, and its operands
    (G, M, K) and (G, K, N) groups quantized along K, B as its rows of B^T."""
    guard = _load("bench_guard.py", monkeypatch)
    monkeypatch.setattr(guard, "BATCH_TIMING", 0.0)
    case = guard.BatchCase("ocp-exact", "fp8_e4m3", 3, 4, 40, 5)
    assert case.name == "ocp-exact fp8_e4m3, 3x4x40x5 batch"
    ((name, ratio),) = guard.measure_batches([case], repeats=1).items()
    assert name == case.name and ratio > 0
    hw = guard.mxsim.load_hwconfig(guard.REPO / "hwconfigs" / "ocp-exact.yaml")
    a, b = guard.batch_operands(hw, "fp8_e4m3", 3, 4, 40, 5, np.random.default_rng(0))
    assert (a.shape, a.axis, b.shape, b.axis) == ((4, 40), 1, (40, 5), 0)
    assert a.codes.shape == (3, 4, 64) and b.codes.shape == (3, 5, 64)


def test_guard_results_record_every_case_and_the_conditions(monkeypatch):
    guard = _load("bench_guard.py", monkeypatch)
    results = json.loads(guard.RESULTS.read_text())
    assert set(results["ratios"]) == {case.name for case in guard.CASES + guard.BATCH_CASES}
    assert all(ratio > 0 for ratio in results["ratios"].values())
    assert {"date", "commit", "load_average", "cores"} <= results["conditions"].keys()


def test_guard_conditions_name_the_processor(monkeypatch, tmp_path):
    """The ratios depend on the processor: the conditions name it and Numba's target, and
    the guard says when the recorded ratios come from another one."""
    guard = _load("bench_guard.py", monkeypatch)
    where = guard.conditions()
    assert where["cpu"] and where["numba_target"]
    assert guard.processor_notice(where, where) is None
    other = dict(where, cpu="Other CPU", numba_target="znver4")
    assert guard.processor_notice(other, where) == (
        f"the recorded ratios come from Other CPU, znver4, this run from {where['cpu']}, "
        f"{where['numba_target']}: a ratio may differ by the processor alone"
    )
    assert guard.processor_notice({}, where).startswith(
        "the recorded ratios come from a processor not recorded, this run from"
    )
    timing = _load("_timing.py", monkeypatch)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: X\nmodel name\t: Some CPU @ 2.60GHz\n")
    assert timing.cpu_model(cpuinfo) == "Some CPU @ 2.60GHz"
    missing = timing.cpu_model(tmp_path / "absent")
    assert missing == (timing.platform.processor() or timing.platform.machine())


def test_docs_tables_are_the_results_files(monkeypatch):
    tables = _load("docs_tables.py", monkeypatch)
    texts = [doc.read_text() for doc in tables.DOCS]
    names = [m.group(2) for text in texts for m in tables.BLOCK.finditer(text)]
    # every results file has its table, once (probe and rtl-area: docs/probe.md's and
    # docs/area.md's, rendered by their scripts)
    elsewhere = {"probe"} | tables.ELSEWHERE
    assert sorted(n for n in names if n not in tables.ELSEWHERE) == sorted(
        p.stem for p in tables.RESULTS.glob("*.json") if p.stem not in elsewhere
    )
    for text in texts:
        assert tables.render(text) == text, (
            "run python benchmarks/docs_tables.py after recording results"
        )


def test_docs_tables_refuse_a_row_that_does_not_fit_the_columns(monkeypatch, tmp_path):
    tables = _load("docs_tables.py", monkeypatch)
    results = {
        "command": "python benchmarks/bench_x.py",
        "conditions": {"date": "d", "load_average": "1", "cores": 2, "machine": "m"},
        "columns": ["a", "b"],
        "rows": [["1", "2"], ["3"]],
    }
    (tmp_path / "x.json").write_text(json.dumps(results))
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    with pytest.raises(ValueError, match=r"x\.json: row \['3'\] has 1 cells, the columns 2"):
        tables.table("x")
    results["rows"].pop()
    (tmp_path / "x.json").write_text(json.dumps(results))
    assert tables.table("x").endswith("| a | b |\n|---|---|\n| 1 | 2 |\n")
    assert "Measured on 2 cores, m; " in tables.table("x")
    results["conditions"] |= {"cpu": "Some CPU", "numba_target": "znver4"}
    (tmp_path / "x.json").write_text(json.dumps(results))
    assert "Measured on 2 cores, m (Some CPU, znver4); " in tables.table("x")


def test_rtl_configs_lists_every_shipped_mx_config_once(monkeypatch):
    """bench_rtl_configs: each shipped config with scales or 8-bit elements is a unit or stands
    for one (equal resolved parameters); the table marks the units the results file lacks."""
    bench = _load("bench_rtl_configs.py", monkeypatch)
    units = bench.mx_units()
    named = [u["config"] for u in units] + [n for u in units for n in u["stands_for"]]
    assert len(named) == len(set(named))
    assert {"ocp-exact", "kulisch", "bfp-exact", "mxdotp", "b200-nvfp4", "h100-fp8"} <= set(named)
    assert "h100" not in named and "mi300" not in named  # first pairs fp16: not MX
    assert all(u["k"] >= 32 and not u.get("refused") for u in units)
    row = {**units[0], "iverilog": {"vectors": 10, "mismatches": 0}}
    stamp = {"commit": "abc1234", "date": "2026-01-01 00:00 UTC", "load_average": "1.0 1 1"}
    row["yosys"] = {"cells": 5, "transistors": 20, "depth": 3, "cpu_seconds": 1.0, **stamp}
    row["iverilog"].update(stamp)
    table = bench.table({"rows": [row], "setup": {"k": "32", "vectors": "v"}})
    assert f"| {units[0]['config']}" in table and "| 10 / – | 0 / – | 5 | 20 | 3 | 1 |" in table
    assert table.count("not run") == len(units) - 1
    # a unit synthesized module by module is marked; a unit synthesized both ways shows the
    # flat figures and gives the ratios in the footnote
    hier = {**units[1], "yosys_hierarchical": {**row["yosys"], "cells": 6, "depth": 4}}
    row["yosys_hierarchical"] = {**row["yosys"], "cells": 10, "transistors": 30, "depth": 6}
    table = bench.table({"rows": [row, hier], "setup": {"k": "32", "vectors": "v"}})
    assert "| 6 ¹ | 20 ¹ | 4 ¹ | 1 ¹ |" in table and "¹ Synthesized module by module" in table
    assert "| 5 | 20 | 3 | 1 |" in table
    assert "figures are 2.00, 1.50 and 2.00 times the flat flow's" in table


def test_bench_matmul_batched_runs_one_small_batch(monkeypatch, capsys):
    """--batched end to end on one small batch beside a small GEMM: one figure per unit and
    batch, its rate the batch's MACs over its time, printed beside the yardstick."""
    bench = _load("bench_matmul.py", monkeypatch)
    monkeypatch.setattr(bench, "BATCHES", (("heads", 3, 4, 40, 5),))
    (figure,) = bench.batched(["ocp-exact"], 32, 1)
    assert figure["config"] == "ocp-exact" and figure["shape"] == [3, 4, 40, 5]
    assert figure["ratio"] == pytest.approx(figure["gmacs"] / figure["yardstick_gmacs"])
    assert "the rate of one 32^3 GEMM" in capsys.readouterr().out


def test_bench_matmul_batched_quantizes_bfp_elements_by_the_bfp_quantizer(monkeypatch):
    # bfp-exact's batch, as its 1024^3 yardstick: MX9 operands from quantize_bfp (one shared
    # exponent per 16, a shift per pair), each group quantized alone along K.
    bench = _load("bench_matmul.py", monkeypatch)
    monkeypatch.setattr(bench, "BATCHES", (("heads", 2, 3, 32, 4),))
    taken = []
    guard = sys.modules[bench.batch_operands.__module__]  # (where the batches are quantized)
    quantize_bfp = guard.quantize_bfp
    monkeypatch.setattr(
        guard,
        "quantize_bfp",
        lambda x, spec, axis: (
            taken.append((x.shape, spec, axis)) or quantize_bfp(x, spec, axis=axis)
        ),
    )
    (figure,) = bench.batched(["bfp-exact"], 32, 1)
    assert figure["shape"] == [2, 3, 32, 4]
    assert taken == [((3, 32), "MX9", 1)] * 2 + [((32, 4), "MX9", 0)] * 2
