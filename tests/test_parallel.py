"""Runners: per-task failures, and replay on a 2-worker Dask cluster equal to the in-process run."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import REPO, without_compile_notice
from mxsim.datapath import load_hwconfig
from mxsim.errors import ArgumentError, MxsimError
from mxsim.parallel import (
    DaskRunner,
    InProcess,
    Task,
    TaskFailures,
    TiledMatmul,
    make_runner,
    parse_scheduler_address,
    raise_failures,
)
from mxsim.trace import load_trace
from mxsim.replay import replay

HW = {
    name: load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml") for name in ("ocp-exact", "h100-fp8")
}


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
        ("t3", "three is not allowed", True),
        ("t5", "ZeroDivisionError: five", False),
    ]
    assert "ZeroDivisionError" in failures[1].traceback


def test_in_process_reports_failures_per_task_and_keeps_the_rest():
    seen = []
    results, failures = InProcess().run(TASKS, on_result=lambda key, value: seen.append(key))
    check_failures(results, failures)
    assert seen == ["t0", "t1", "t2", "t4", "t6"]


def test_raise_failures():
    _, failures = InProcess().run(TASKS)
    with pytest.raises(
        RuntimeError,
        match="2 of 7 demo tasks failed: t3: three is not allowed; t5: ZeroDivisionError",
    ):
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
    np.testing.assert_array_equal(
        TiledMatmul(tile_macs=64 * 24)(HW["ocp-exact"], a, b).bits,
        matmul(HW["ocp-exact"], a, b).bits,
    )


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


# ----------------------------------------------------------------------------- scheduler addresses


@pytest.mark.parametrize(
    "address, message",
    [
        ("127.0.0.1:abc", "the port must be an integer 1..65535"),
        ("tcp://", "expected tcp://HOST:PORT"),
        ("", "expected tcp://HOST:PORT"),
        ("localhost", "expected tcp://HOST:PORT"),
        ("inproc://", "protocol 'inproc' is not accepted"),
        ("tcp://host:" + "9" * 5000, "at most 300 characters"),
        ("tcp://host:99999", "the port must be an integer 1..65535"),
        ("tcp://host:0", "the port must be an integer 1..65535"),
        ("tcp://:8786", "expected tcp://HOST:PORT"),
        ("tcp://a b:8786", "is not a host name or address"),
        ("ucx://host:8786", "protocol 'ucx' is not accepted"),
        (8786, "got int"),
    ],
)
def test_scheduler_addresses_are_checked_before_connecting(address, message, monkeypatch):
    import distributed

    monkeypatch.setattr(distributed, "Client", lambda *a, **k: pytest.fail("connected"))
    with pytest.raises(ArgumentError, match=message.replace("(", r"\(")) as error:
        DaskRunner(scheduler=address)
    assert len(str(error.value)) < 300


@pytest.mark.parametrize(
    "address, normalised",
    [
        ("tcp://hostA:8786", "tcp://hostA:8786"),
        ("hostA:8786", "tcp://hostA:8786"),
        ("tls://10.0.0.1:1", "tls://10.0.0.1:1"),
        ("[::1]:8786", "tcp://[::1]:8786"),
    ],
)
def test_good_scheduler_addresses(address, normalised):
    assert parse_scheduler_address(address) == normalised


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_refused_port_fails_within_the_connect_timeout():
    import time

    started = time.monotonic()
    with pytest.raises(
        MxsimError, match=r"cannot reach the Dask scheduler at tcp://127.0.0.1:\d+ within 1 s"
    ):
        DaskRunner(scheduler=f"127.0.0.1:{_free_port()}", connect_timeout=1)
    assert time.monotonic() - started < 10


def test_a_silent_peer_fails_within_the_connect_timeout():
    import socket
    import time

    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never speaks
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        started = time.monotonic()
        with pytest.raises(MxsimError, match="within 1 s: no answer"):
            DaskRunner(scheduler=f"127.0.0.1:{silent.getsockname()[1]}", connect_timeout=1)
        assert time.monotonic() - started < 10


def test_a_scheduler_without_workers_fails_within_the_worker_timeout():
    import time

    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=0, processes=False, protocol="tcp", host="127.0.0.1", dashboard_address=None
    ) as cluster:
        started = time.monotonic()
        with pytest.raises(
            MxsimError, match=r"has no workers \(waited 1 s\); start some with: dask worker tcp://"
        ):
            DaskRunner(scheduler=cluster.scheduler_address, connect_timeout=2, worker_timeout=1)
        assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--scheduler", "127.0.0.1:abc"], "the port must be an integer"),
        (["--scheduler", ""], "expected tcp://HOST:PORT"),
        (["--workers", "0"], "--workers: expected an integer 1..4096, got 0"),
        (["--workers", "1000000"], "--workers: expected an integer 1..4096"),
    ],
)
def test_command_line_refuses_bad_cluster_options_in_one_line(argv, message, capsys):
    from mxsim.cli import main

    status = main(
        [
            "replay",
            str(REPO / "traces/digits-cnn"),
            "--hw",
            str(REPO / "hwconfigs/ocp-exact.yaml"),
            *argv,
        ]
    )
    err = without_compile_notice(capsys.readouterr().err)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1
