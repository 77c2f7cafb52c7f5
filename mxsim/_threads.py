"""How many threads a parallel kernel call may use: one for small work.

A parallel kernel call (:func:`run_in_threads`) wakes every thread of its pool and waits for
all of them at its end.
On an idle machine that costs tens of microseconds; when the cores are shared (other
processes, test workers, another kernel's threads) a woken thread may wait a whole scheduler
time slice, and a call of a few dozen elements then takes milliseconds instead of
microseconds. Work below :data:`SERIAL_BELOW` items runs on the calling thread alone, where no
thread is waited for; the results do not depend on the thread count.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numba

#: Work items (elements, products) below which a parallel kernel call uses one thread: the
#: size where the single-threaded loop takes roughly as long as waking a second thread.
SERIAL_BELOW = 1 << 14
#: Products below which a GEMM route's call (a batch of attention heads, a small layer) runs
#: on one thread: a few milliseconds of work at most, where a woken thread that waits for a
#: time slice on a shared machine costs more than the split saves.
SERIAL_GEMM_BELOW = 1 << 22


@contextmanager
def threads_for(work: int, below: int = SERIAL_BELOW):
    """Within the block, parallel kernel calls on this thread (:func:`run_in_threads`) use one
    thread when ``work`` (the call's elements or products) is below ``below``
    (:data:`SERIAL_BELOW`, or :data:`SERIAL_GEMM_BELOW` for a GEMM's products); otherwise the
    thread count is left as it is."""
    threads = numba.get_num_threads()
    if work >= below or threads == 1:
        yield
        return
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(threads)


_pool: tuple[int, int, ThreadPoolExecutor] | None = None  # (process id, size, pool)


def _threads_pool(size: int) -> ThreadPoolExecutor:
    """A pool of ``size`` threads kept for the process (a forked child makes its own: the
    parent's threads do not exist there)."""
    global _pool
    if _pool is None or _pool[0] != os.getpid() or _pool[1] < size:
        _pool = (os.getpid(), size, ThreadPoolExecutor(size, thread_name_prefix="mxsim"))
    return _pool[2]


def run_in_threads(call, items: int, threads: int | None = None) -> None:
    """``call(start, stop)`` over ``range(items)`` cut into contiguous chunks, on as many
    threads as Numba's thread count allows here (one inside :func:`threads_for`'s small-work
    block: then on the calling thread alone), or as ``threads`` where given (1: the calling
    thread, without reading or changing Numba's thread count): ``call`` runs a GIL-free
    (``nogil``) kernel, so the chunks run at the same time. Four chunks a thread even out
    chunks of unequal cost; a kernel's exception reaches the caller."""
    threads = min(numba.get_num_threads() if threads is None else threads, items)
    if threads <= 1:
        call(0, items)
        return
    chunks = min(items, 4 * threads)
    bounds = [i * items // chunks for i in range(chunks + 1)]
    for _ in _threads_pool(threads).map(call, bounds[:-1], bounds[1:]):
        pass
