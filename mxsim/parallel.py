"""Independent tasks run in this process or on a Dask cluster, with progress and per-task failures.

Replay and sweep describe their work as :class:`Task` lists (a key naming the task, a
module-level function, its arguments) and hand them to a runner:

* :class:`InProcess` (the default) calls them one after the other, in list order.
* :class:`DaskRunner` submits them to a ``dask.distributed`` cluster (the optional extra
  ``mxsim[dask]``): a ``LocalCluster`` of ``workers`` worker processes with one thread each,
  or a running scheduler at ``scheduler``. Results arrive as tasks finish (Dask's
  ``as_completed``) and feed the progress bar.

A task's result does not depend on where it runs: tasks are pure functions of their
arguments and the kernels are bit-exact, so a cluster returns the same objects as the
in-process loop. A task that raises is recorded as a :class:`TaskFailure` (key, message,
traceback) and the other tasks still run; their results are kept and handed to
``on_result`` as they arrive, so callers can store finished work before a failure is reported.
Large objects that many tasks need (a whole trace) go through :meth:`share` once instead of
travelling with every task.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import threading
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ArgumentError, MxsimError
from .limits import check_int, shown


@dataclass(frozen=True)
class Task:
    """One unit of work: ``function(*args)``, named ``key`` in progress and failure reports."""

    key: str
    function: Callable[..., Any]
    args: tuple = ()


@dataclass(frozen=True)
class TaskFailure:
    """A task that raised: its key, the error message (mxsim errors as they are, other
    exceptions prefixed by their type), whether it was an mxsim (user input) error, and the
    traceback text."""

    key: str
    message: str
    user_error: bool
    traceback: str


class TaskFailures(MxsimError):
    """Tasks of a run failed on bad input; ``failures`` lists them (the message names each)."""

    def __init__(self, message: str, failures: Sequence[TaskFailure]):
        self.failures = list(failures)
        super().__init__(message)


def raise_failures(what: str, total: int, failures: Sequence[TaskFailure]) -> None:
    """Raise for failed tasks, if any: :class:`TaskFailures` when every one was an mxsim
    error, else a RuntimeError carrying the first internal error's traceback."""
    if not failures:
        return
    details = "; ".join(f"{failure.key}: {failure.message}" for failure in failures)
    message = f"{len(failures)} of {total} {what} tasks failed: {details}"
    internal = [failure for failure in failures if not failure.user_error]
    if internal:
        raise RuntimeError(f"{message}\n{internal[0].key}:\n{internal[0].traceback}")
    raise TaskFailures(message, failures)


def _failure(key: str, error: BaseException, trace: str) -> TaskFailure:
    user_error = isinstance(error, MxsimError)
    return TaskFailure(
        key, str(error) if user_error else f"{type(error).__name__}: {error}", user_error, trace
    )


def progress_bar(total: int | None, unit: str, enabled: bool):
    """A tqdm bar on stderr if tqdm is installed, else a plain counter; None when disabled.
    ``total`` None: a count without a total (work whose size is not known beforehand)."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm

        return tqdm(total=total, unit=unit, file=sys.stderr)
    except ImportError:

        class Counter:
            done = 0

            def update(self, n=1):
                self.done += n
                of = "" if total is None else f"/{total}"
                print(f"\r{self.done}{of} {unit}s", end="", file=sys.stderr, flush=True)

            def close(self):
                print(file=sys.stderr)

        return Counter()


TILE_MACS = 1 << 26  # about 0.1 s of the slowest datapath kernel: a worthwhile task
Results = tuple[dict[str, Any], list[TaskFailure]]


def _check_keys(tasks: Sequence[Task]) -> None:
    keys = [task.key for task in tasks]
    if len(set(keys)) != len(keys):
        raise ValueError(f"task keys must be distinct: {keys}")


class InProcess:
    """Runs tasks one after the other in this process (the default runner)."""

    matmul = None  # tasks call mxsim.matmul directly

    def share(self, value):
        return value

    def run(
        self,
        tasks: Sequence[Task],
        on_result: Callable[[str, Any], None] | None = None,
        progress: bool = False,
        unit: str = "task",
    ) -> Results:
        """Run every task; (results by key, failures in task order)."""
        _check_keys(tasks)
        bar = progress_bar(len(tasks), unit, progress)
        results: dict[str, Any] = {}
        failures = []
        try:
            for task in tasks:
                try:
                    value = task.function(*task.args)
                except Exception as error:  # reported per task; the others still run
                    failures.append(_failure(task.key, error, traceback.format_exc()))
                else:
                    results[task.key] = value
                    if on_result is not None:
                        on_result(task.key, value)
                if bar:
                    bar.update(1)
        finally:
            if bar:
                bar.close()
        return results, failures

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _run_with_threads(numba_threads: int | None, function: Callable[..., Any], *args):
    """``function(*args)`` on a worker with at most ``numba_threads`` threads in numba's
    parallel kernels (None: the worker's default), so that workers sharing a machine do
    not oversubscribe its cores."""
    if numba_threads is not None:
        import numba

        numba.set_num_threads(min(numba_threads, numba.config.NUMBA_NUM_THREADS))
    return function(*args)


def _row_tile(tensor, start: int, stop: int):
    """Rows start:stop of an MXTensor quantized along axis 1 (its blocks lie inside rows)."""
    import dataclasses

    return dataclasses.replace(
        tensor,
        codes=tensor.codes[start:stop],
        scales=tensor.scales[start:stop],
        shape=(stop - start, tensor.shape[1]),
    )


@dataclass(frozen=True)
class TiledMatmul:
    """``mxsim.matmul(hw, A, B)`` that, inside a Dask task and for a GEMM of more than
    ``tile_macs`` multiply-adds, runs tiles of A's rows as further tasks on the cluster.

    Output rows depend only on their own row of A and on B, so the concatenated tiles are the
    same bits as one call. The calling task secedes from its worker's thread pool while the
    tiles run (Dask's ``worker_client``), so a cluster busy with layer tasks cannot deadlock.
    """

    tile_macs: int
    numba_threads: int | None = None

    def __call__(self, hw, A, B, c=None):
        import numpy as np

        from .datapath import matmul
        from .datapath.api import MatmulResult

        rows, depth = A.shape
        columns = B.shape[1]
        tile_rows = max(1, self.tile_macs // max(1, depth * columns))
        if rows <= tile_rows:
            return matmul(hw, A, B, c=c)
        try:
            from distributed import get_worker, worker_client

            get_worker()
        except (ImportError, ValueError):  # not inside a Dask task
            return matmul(hw, A, B, c=c)
        with worker_client() as client:
            shared_b = client.scatter(B, hash=False)
            futures = [
                client.submit(
                    _run_with_threads,
                    self.numba_threads,
                    _matmul_with_c,
                    hw,
                    _row_tile(A, start, min(start + tile_rows, rows)),
                    shared_b,
                    None if c is None else c[start : start + tile_rows],
                    key=f"mxsim-tile-{uuid.uuid4().hex}",
                    pure=False,
                )
                for start in range(0, rows, tile_rows)
            ]
            tiles = client.gather(futures)
        return MatmulResult(
            np.concatenate([tile.bits for tile in tiles]),
            tiles[0].out_format,
            tiles[0].scale_exponent,
        )


def _matmul_with_c(hw, A, B, c):
    from .datapath import matmul

    return matmul(hw, A, B, c=c)


#: Seconds to reach a running scheduler (a refused port or a silent peer fails after this).
CONNECT_SECONDS = 10.0
#: Seconds to wait for a running scheduler to have at least one worker.
WORKER_WAIT_SECONDS = 30.0
SCHEDULER_PROTOCOLS = ("tcp", "tls")
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\]")


def parse_scheduler_address(address) -> str:
    """``address`` (``tcp://host:port``, ``tls://host:port`` or ``host:port``) checked and
    normalised to ``protocol://host:port``, before any connection: a host name or IPv4
    address (an IPv6 address in brackets) and a port 1..65535. Anything else (no port, a
    non-numeric or out-of-range port, an empty host, another protocol such as ``inproc://``)
    is an ArgumentError naming the address."""
    if not isinstance(address, str):
        raise ArgumentError(
            f"--scheduler: expected an address such as tcp://host:8786, got {type(address).__name__}"
        )
    expected = "expected tcp://HOST:PORT, tls://HOST:PORT or HOST:PORT with a port 1..65535"
    if len(address) > 300:
        raise ArgumentError(f"--scheduler {shown(address)}: {expected} (at most 300 characters)")
    protocol, separator, rest = address.strip().partition("://")
    if not separator:
        protocol, rest = "tcp", address.strip()
    if protocol not in SCHEDULER_PROTOCOLS:
        raise ArgumentError(
            f"--scheduler {shown(address)}: protocol {protocol[:20]!r} is not accepted; {expected}"
        )
    host, colon, port = rest.rpartition(":")
    if not colon or not host:
        raise ArgumentError(f"--scheduler {shown(address)}: {expected}")
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535):
        raise ArgumentError(
            f"--scheduler {shown(address)}: the port must be an integer 1..65535; {expected}"
        )
    if not _HOST.fullmatch(host):
        raise ArgumentError(
            f"--scheduler {shown(address)}: {shown(host, 40)} is not a host name or address; {expected}"
        )
    return f"{protocol}://{host}:{int(port)}"


def _require_distributed():
    try:
        import distributed
    except ImportError as error:
        raise MxsimError(
            f"--workers/--scheduler need dask.distributed ({error}); install it with: pip install 'mxsim[dask]'"
        ) from None
    return distributed


def _probe_scheduler(address: str, timeout: float) -> None:
    """Check that a Dask scheduler answers at ``address`` within ``timeout`` seconds.

    dask.distributed's ``Client`` bounds the TCP connection by its timeout but not the
    handshake after it, so a peer that accepts and then stays silent would hang it for ever:
    this asks the peer for its identity under one overall deadline (in a thread of its own,
    with its own event loop, so it works whether or not the caller runs one)."""
    from distributed.comm import connect

    async def identity():
        comm = await asyncio.wait_for(connect(address, timeout=timeout), timeout)
        try:
            await asyncio.wait_for(comm.write({"op": "identity"}), timeout)
            return await asyncio.wait_for(comm.read(), timeout)
        finally:
            comm.abort()

    outcome: dict[str, Any] = {}

    def probe():
        try:
            outcome["reply"] = asyncio.run(identity())
        except BaseException as error:  # reported below, in the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=probe, name="mxsim-scheduler-probe", daemon=True)
    thread.start()
    thread.join(3 * timeout + 5)  # connect, write and read each have ``timeout``
    reply = outcome.get("reply")
    if not isinstance(reply, dict) or reply.get("type") != "Scheduler":
        error = outcome.get("error")
        if error is None:
            detail = "no answer" if "reply" not in outcome else "the peer is not a Dask scheduler"
        elif isinstance(error, (asyncio.TimeoutError, TimeoutError)) and not str(error):
            detail = "no answer (a silent peer)"
        else:
            detail = " ".join(str(error).split())[:200] or type(error).__name__
        raise MxsimError(
            f"cannot reach the Dask scheduler at {address} within {timeout:g} s: {detail}"
        )


class DaskRunner:
    """Runs tasks on a Dask cluster: a new ``LocalCluster`` of ``workers`` processes (one
    thread each; numba's parallel kernels get cores // workers threads each), or the running
    scheduler at ``scheduler`` (``tcp://host:8786``, checked by :func:`parse_scheduler_address`
    before connecting; its workers keep their own settings). ``timeout`` (seconds) bounds
    starting a local cluster's workers; a running scheduler must answer within
    ``connect_timeout`` and have a worker within ``worker_timeout``, else an MxsimError says
    which. GEMMs of more than ``tile_macs`` multiply-adds are split into row tiles
    (:class:`TiledMatmul`)."""

    def __init__(
        self,
        workers: int | None = None,
        scheduler: str | None = None,
        timeout: float = 120.0,
        tile_macs: int = TILE_MACS,
        connect_timeout: float = CONNECT_SECONDS,
        worker_timeout: float = WORKER_WAIT_SECONDS,
    ):
        if (workers is None) == (scheduler is None):
            raise MxsimError(
                "give exactly one of workers (a local cluster) or scheduler (a running cluster)"
            )
        if scheduler is not None:
            scheduler = parse_scheduler_address(scheduler)
        else:
            workers = check_int(workers, "--workers", 1, 4096)
        distributed = _require_distributed()
        self.cluster = None
        self.numba_threads = None
        if scheduler is not None:
            self.client = self._connect(distributed, scheduler, connect_timeout, worker_timeout)
            self.matmul = TiledMatmul(tile_macs)
            return
        self.numba_threads = max(1, (os.cpu_count() or 1) // workers)
        self.cluster = distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            death_timeout=timeout,
            # No dashboard; the scheduler's small HTTP server on a free port, not 8787.
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": ":0"},
        )
        self.client = distributed.Client(self.cluster, timeout=timeout)
        self.matmul = TiledMatmul(tile_macs, self.numba_threads)

    @staticmethod
    def _connect(distributed, scheduler: str, connect_timeout: float, worker_timeout: float):
        """A client of the scheduler at ``scheduler`` that has at least one worker."""
        _probe_scheduler(scheduler, connect_timeout)
        try:
            client = distributed.Client(scheduler, timeout=connect_timeout)
        except (OSError, asyncio.TimeoutError, ValueError, TypeError) as error:
            detail = " ".join(str(error).split())[:200] or type(error).__name__
            raise MxsimError(
                f"cannot reach the Dask scheduler at {scheduler} within {connect_timeout:g} s: "
                f"{detail}"
            ) from None
        try:
            client.wait_for_workers(1, timeout=worker_timeout)
        except (OSError, asyncio.TimeoutError):
            client.close()
            raise MxsimError(
                f"the Dask scheduler at {scheduler} has no workers (waited {worker_timeout:g} s); "
                f"start some with: dask worker {scheduler}"
            ) from None
        return client

    def share(self, value):
        """A handle to ``value`` stored once on every worker; pass it as a task argument."""
        return self.client.scatter(value, broadcast=True, hash=False)

    def run(
        self,
        tasks: Sequence[Task],
        on_result: Callable[[str, Any], None] | None = None,
        progress: bool = False,
        unit: str = "task",
    ) -> Results:
        """Submit every task, collect results as they finish; (results by key, failures in task order)."""
        distributed = _require_distributed()
        bar = progress_bar(len(tasks), unit, progress)
        _check_keys(tasks)
        futures = {}
        for task in tasks:
            future = self.client.submit(
                _run_with_threads,
                self.numba_threads,
                task.function,
                *task.args,
                key=f"mxsim-{task.key}-{uuid.uuid4().hex}",
                pure=False,
                retries=0,
            )
            futures[future] = task.key
        results: dict[str, Any] = {}
        failed: dict[str, TaskFailure] = {}
        try:
            for future in distributed.as_completed(list(futures)):
                key = futures[future]
                if future.status == "finished":
                    value = future.result()
                    results[key] = value
                    if on_result is not None:
                        on_result(key, value)
                elif future.status == "error":
                    error = future.exception()
                    trace = (
                        "".join(traceback.format_tb(future.traceback()))
                        if future.traceback()
                        else ""
                    )
                    failed[key] = _failure(key, error, trace)
                else:  # cancelled, e.g. the cluster lost it
                    failed[key] = TaskFailure(
                        key, f"task {future.status} by the cluster", False, ""
                    )
                future.release()
                if bar:
                    bar.update(1)
        finally:
            if bar:
                bar.close()
        return results, [failed[task.key] for task in tasks if task.key in failed]

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_runner(workers: int | None = None, scheduler: str | None = None, timeout: float = 120.0):
    """:class:`InProcess` when neither is given, else a :class:`DaskRunner` (``timeout``:
    starting a local cluster; a running scheduler gets CONNECT_SECONDS and WORKER_WAIT_SECONDS)."""
    if workers is None and scheduler is None:
        return InProcess()
    return DaskRunner(workers=workers, scheduler=scheduler, timeout=timeout)
