"""mxsim.replay.warmup: a replay through several units compiles one share of their kernels in
a child process when the kernel cache is cold, and a replay through one unit its route's;
results never depend on it, what the child compiled is loaded, not compiled again, a failing
or killed child is harmless, a warm cache spawns no child, and the switch refuses bad
values."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from mxsim.datapath import load_hwconfig
from mxsim.errors import ArgumentError
from mxsim.replay import warmup
from mxsim.replay.run import replay, select_layers
from mxsim.trace import load_trace

UNITS = [load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml") for name in ("ocp-exact", "h100-fp8")]


@pytest.fixture
def markers(monkeypatch, tmp_path):
    """Markers in a directory of the test's own (the kernels stay in the suite's cache)."""
    monkeypatch.setattr(warmup, "kernel_cache_dir", lambda: str(tmp_path / "cache"))
    return tmp_path / "cache" / "mxsim-warm"


@pytest.fixture
def started(monkeypatch) -> list:
    """The warm-ups replay starts (None where it started none)."""
    seen = []
    real = warmup.start

    def spy(*args):
        seen.append(real(*args))
        return seen[-1]

    monkeypatch.setattr(warmup, "start", spy)
    return seen


def _one_layer(path=REPO / "traces" / "digits-cnn"):
    return select_layers(load_trace(path), "^fc2$")


def _bits(report) -> list:
    return [row.bits for rows in report["_results"].values() for row in rows]


def test_results_are_the_same_with_and_without_the_warm_up(monkeypatch, markers, started):
    trace = _one_layer()
    monkeypatch.setattr(warmup, "_core_free", lambda: True)
    monkeypatch.setenv(warmup.SWITCH, "auto")  # no markers yet: the cache counts as cold
    on = replay(trace, UNITS)
    assert started[0].mine == UNITS[:1] and started[0].theirs == UNITS[1:]
    assert started[0].process.returncode == 0  # the child warmed its unit
    assert len(list(markers.iterdir())) == len(UNITS)  # written after the replay succeeded
    assert replay(trace, UNITS)["totals"] and started[1] is None  # now warm: no child
    monkeypatch.setenv(warmup.SWITCH, "0")
    off = replay(trace, UNITS)
    assert all(np.array_equal(a, b) for a, b in zip(_bits(off), _bits(on), strict=True))


def test_one_unit_splits_its_route_from_the_rest(monkeypatch, markers, started):
    trace = _one_layer()
    monkeypatch.setattr(warmup, "_core_free", lambda: True)
    monkeypatch.setenv(warmup.SWITCH, "auto")
    on = replay(trace, UNITS[1:])
    warm = started[0]
    assert warm.route_only and warm.mine == [] and warm.theirs == UNITS[1:]
    assert warm.process.returncode == 0 and len(list(markers.iterdir())) == 1
    assert replay(trace, UNITS[1:])["totals"] and started[1] is None  # now warm: no child
    monkeypatch.setenv(warmup.SWITCH, "0")
    off = replay(trace, UNITS[1:])
    assert all(np.array_equal(a, b) for a, b in zip(_bits(off), _bits(on), strict=True))


#: A replay through one unit with an empty kernel cache, in a process of its own: the names of
#: the kernels this process compiled (not loaded), and whether it split the unit's work.
COLD_REPLAY = """
import json, sys
from numba.core import event
from mxsim.datapath import load_hwconfig
from mxsim.replay import warmup
from mxsim.replay.run import replay, select_layers
from mxsim.trace import load_trace
compiled, split = set(), []
class Listener(event.Listener):
    def on_start(self, ev):
        compiled.add(getattr(ev.data["dispatcher"].py_func, "__name__", "?"))
    def on_end(self, ev):
        pass
event.register("numba:compile", Listener())
start = warmup.start
warmup.start = lambda *args: split.append(start(*args)) or split[-1]
trace = select_layers(load_trace(sys.argv[1]), "^fc2$")
replay(trace, [load_hwconfig(sys.argv[2])])
print(json.dumps({"compiled": sorted(compiled), "route_only": split[0].route_only,
                  "child": split[0].process.returncode}))
"""


@pytest.mark.slow
def test_the_childs_route_kernels_are_loaded_not_compiled_again(tmp_path):
    """With an empty kernel cache, the replay's process compiles the quantizers (and what the
    ideal needs) while the child compiles the unit's window route on placeholder operands; the replay's process then loads the window kernels from the cache: the
    placeholder operands reach the same kernel signatures as the real ones."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=str(REPO))
    env[warmup.SWITCH] = "1"
    result = subprocess.run(
        [sys.executable, "-c", COLD_REPLAY, "traces/digits-cnn", "hwconfigs/h100-fp8.yaml"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout.splitlines()[-1])
    assert answer["route_only"] and answer["child"] == 0
    compiled = set(answer["compiled"])
    assert {"quantize_blocks", "dequantize_blocks"} <= compiled  # this process's share
    assert not {"window_items", "unusable_rows", "finish_tree"} & compiled
    assert list(tmp_path.rglob("*window_items*.nbi"))  # the child's, in the cache


@pytest.mark.parametrize("units", [UNITS, UNITS[1:]], ids=["two units", "one unit"])
def test_a_failing_child_is_harmless(monkeypatch, markers, started, tmp_path, caplog, units):
    copy = shutil.copytree(REPO / "traces" / "digits-cnn", tmp_path / "trace")
    trace = _one_layer(copy)
    shutil.rmtree(copy)  # the child cannot load the trace
    monkeypatch.setenv(warmup.SWITCH, "1")
    with caplog.at_level(logging.DEBUG, logger="mxsim"):
        report = replay(trace, units)
    assert started[0].process.returncode != 0
    assert started[0].route_only == (len(units) == 1)
    assert "child stopped early" in caplog.text
    monkeypatch.setenv(warmup.SWITCH, "0")
    assert all(
        np.array_equal(a, b)
        for a, b in zip(_bits(replay(trace, units)), _bits(report), strict=True)
    )


def test_a_killed_child_is_harmless(monkeypatch, markers, caplog):
    trace = _one_layer()
    monkeypatch.setenv(warmup.SWITCH, "1")
    warm = warmup.start(trace, UNITS, None, "kh_kw_c", False)
    warm.process.kill()
    with caplog.at_level(logging.DEBUG, logger="mxsim"):
        seconds = warm.finish()
    assert "child stopped early" in caplog.text
    assert set(seconds) == {"ocp-exact"} and warm.process.poll() is not None


def test_no_child_where_it_cannot_pay(monkeypatch, markers):
    trace = _one_layer()
    monkeypatch.setenv(warmup.SWITCH, "1")
    assert warmup.start(trace, [], None, "kh_kw_c", False) is None  # no unit
    assert (
        warmup.start(dataclasses.replace(trace, path=None), UNITS, None, "kh_kw_c", False) is None
    )
    moved = dataclasses.replace(UNITS[1], source="/nonexistent/unit.yaml")
    assert warmup.start(trace, [UNITS[0], moved], None, "kh_kw_c", False) is None
    monkeypatch.setattr(warmup, "_usable_cores", lambda: 1)
    assert warmup.start(trace, UNITS, None, "kh_kw_c", False) is None
    monkeypatch.setattr(warmup, "_usable_cores", lambda: 2)
    monkeypatch.setenv(warmup.SWITCH, "auto")  # markers absent, but no core is free
    monkeypatch.setattr(os, "getloadavg", lambda: (1.6, 0.0, 0.0))
    assert warmup.start(trace, UNITS, None, "kh_kw_c", False) is None


def test_representative_layers_one_per_kind_the_smallest():
    trace = load_trace(REPO / "traces" / "digits-cnn")
    chosen = warmup.representative_layers(trace)
    kinds = {warmup._kind(layer) for layer in trace.layers}
    assert len(chosen) == len(kinds) and {warmup._kind(layer) for layer in chosen} == kinds
    for layer in chosen:
        same = [other for other in trace.layers if warmup._kind(other) == warmup._kind(layer)]
        assert layer.output.size == min(other.output.size for other in same)


@pytest.mark.parametrize("value", ["2", "yes", "auto ", "0x", "\x01", "a" * 500])
def test_switch_refuses_other_values(monkeypatch, value):
    monkeypatch.setenv(warmup.SWITCH, value)
    if value.strip() == "auto":
        assert warmup.switch() == "auto"
        return
    with pytest.raises(ArgumentError, match=warmup.SWITCH) as error:
        warmup.switch()
    assert "auto" in str(error.value) and len(str(error.value)) < 300


def test_cli_refuses_a_bad_switch_before_any_work(tmp_path):
    env = {"PATH": "/usr/bin:/bin", warmup.SWITCH: "fast", "NUMBA_CACHE_DIR": str(tmp_path)}
    env["PYTHONPATH"] = str(REPO)
    result = subprocess.run(
        [sys.executable, "-m", "mxsim.cli", "replay", "traces/digits-cnn"]
        + [f"--hw=hwconfigs/{hw.name}.yaml" for hw in UNITS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and warmup.SWITCH in result.stderr
    assert not [path for path in tmp_path.rglob("*") if path.is_file()]  # nothing compiled


def test_layers_differing_only_in_their_values_are_one_kind():
    """A QDQ spec's scales differ from layer to layer; the kernels they reach do not."""
    from conftest import sample_trace

    fc = next(layer for layer in sample_trace().layers if layer.name == "fc")
    other = dataclasses.replace(
        fc,
        name="fc again",
        quant={
            name: dataclasses.replace(spec, scale=np.asarray(spec.scale * 2, spec.scale.dtype))
            if spec
            else None
            for name, spec in fc.quant.items()
        },
    )
    assert warmup._kind(other) == warmup._kind(fc)
    changed = dataclasses.replace(other, quant={**other.quant, "input": None})
    assert warmup._kind(changed) != warmup._kind(fc)
