"""Runners: per-task failures, and replay on a 2-worker Dask cluster equal to the in-process run."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import REPO
from mxsim.datapath import load_hwconfig
from mxsim.errors import MxsimError
from mxsim.parallel import DaskRunner, InProcess, Task, TaskFailures, TiledMatmul, make_runner, raise_failures
from mxsim.trace import load_trace
from mxsim.replay import replay

HW = {name: load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml") for name in ("ocp-exact", "h100-fp8")}


def half(x):
    if x == 3:
        raise MxsimError("three is not allowed")
    if x == 5:
        raise ZeroDivisionError("five")
    return x / 2


TASKS = [Task(f"t{x}", half, (x,)) for x in range(7)]


def check_failures(results, failures):
    assert results == {f"t{x}": x / 2 for x in range(7) if x not in (3, 5)}
    assert [(f.key, f.message, f.user_error) for f in failures] == [
        ("t3", "three is not allowed", True), ("t5", "ZeroDivisionError: five", False)]
    assert "ZeroDivisionError" in failures[1].traceback


def test_in_process_reports_failures_per_task_and_keeps_the_rest():
    seen = []
    results, failures = InProcess().run(TASKS, on_result=lambda key, value: seen.append(key))
    check_failures(results, failures)
    assert seen == ["t0", "t1", "t2", "t4", "t6"]


def test_raise_failures():
    _, failures = InProcess().run(TASKS)
    with pytest.raises(RuntimeError, match="2 of 7 demo tasks failed: t3: three is not allowed; t5: ZeroDivisionError"):
        raise_failures("demo", 7, failures)
    with pytest.raises(TaskFailures, match="1 of 7 demo tasks failed: t3: three is not allowed"):
        raise_failures("demo", 7, failures[:1])
    raise_failures("demo", 7, [])
    with pytest.raises(ValueError, match="distinct"):
        InProcess().run([TASKS[0], TASKS[0]])


def test_runner_choice():
    assert isinstance(make_runner(), InProcess)
    with pytest.raises(MxsimError, match="exactly one"):
        DaskRunner(workers=2, scheduler="tcp://127.0.0.1:1")


def test_tiled_matmul_outside_a_worker_is_matmul():
    from mxsim import matmul, quantize_mx as quantize

    rng = np.random.default_rng(0)
    a = quantize(rng.standard_normal((40, 64)), "fp8_e4m3", axis=1)
    b = quantize(rng.standard_normal((64, 24)), "fp8_e4m3", axis=0)
    np.testing.assert_array_equal(TiledMatmul(tile_macs=64 * 24)(HW["ocp-exact"], a, b).bits,
                                  matmul(HW["ocp-exact"], a, b).bits)


def test_dask_runner_reports_failures_per_task(dask_runner):
    seen = []
    results, failures = dask_runner.run(TASKS, on_result=lambda key, value: seen.append(key))
    check_failures(results, failures)
    assert sorted(seen) == ["t0", "t1", "t2", "t4", "t6"]


def test_replay_on_a_cluster_is_bit_identical(dask_runner):
    trace = load_trace(REPO / "traces" / "digits-cnn")
    units = [HW["ocp-exact"], HW["h100-fp8"]]
    from distributed import get_task_stream

    local = replay(trace, units, end_to_end=True)
    with get_task_stream(dask_runner.client) as stream:
        distributed = replay(trace, units, end_to_end=True, runner=dask_runner)
    for name in ("ocp-exact", "h100-fp8"):
        for here, there in zip(local["_results"][name], distributed["_results"][name], strict=True):
            assert here.bits.dtype == there.bits.dtype
            np.testing.assert_array_equal(here.bits, there.bits)
            a, b = here.to_dict(), there.to_dict()
            a.pop("seconds"), b.pop("seconds")
            assert a == b
    assert local["end_to_end"] == distributed["end_to_end"]
    assert local["agreement"] == distributed["agreement"]
    # The GEMMs above 2^16 MACs really were split into tile tasks.
    assert sum(str(task["key"]).startswith("mxsim-tile-") for task in stream.data) > 10
