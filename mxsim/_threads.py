"""How many threads a parallel kernel call may use: one for small work.

A parallel kernel call (:func:`run_in_threads`) wakes every thread of its pool and waits for
all of them at its end.
On an idle machine that costs tens of microseconds; when the cores are shared (other
processes, test workers, another kernel's threads) a woken thread may wait a whole scheduler
time slice, and a call of a few dozen elements then takes milliseconds instead of
microseconds. Work below :data:`SERIAL_BELOW` items runs on the calling thread alone, where no
thread is waited for; the results do not depend on the thread count.

A thread starts with the floating point mode of the thread that started it (flush-to-zero
and denormals-are-zero included, as POSIX threads inherit it), and routes whose float
arithmetic must keep subnormals check the calling thread's mode (:func:`subnormals_work`):
the pool's threads are therefore always started by a thread in the caller's mode: one pool
is kept per mode, so callers that alternate modes each keep theirs.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numba

#: Work items (elements, products) below which a parallel kernel call uses one thread: the
#: size where the single-threaded loop takes roughly as long as waking a second thread.
SERIAL_BELOW = 1 << 14
#: Elements below which a block quantization (MX or NVFP4) runs on one thread: its kernel
#: streams the tensor at a few nanoseconds an element after serial copies, and on two cores a
#: second thread gained nothing below about 2^18 elements (at 2^16 it took half as long again
#: and a third more CPU time: an attention head's or a small layer's activations).
SERIAL_QUANTIZE_BELOW = 1 << 19
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


#: The least normal float64 and one, module globals so that the products below are computed
#: at run time (a literal product would be folded when the code is compiled).
_LEAST_NORMAL, _ONE = 2.0**-1022, 1.0


def subnormals_work() -> bool:
    """Whether this thread's floating point keeps subnormals (no flush-to-zero or
    denormals-are-zero mode, as a library built with -ffast-math may set). Python's float
    arithmetic runs on the same unit and mode as the kernels' (SSE/AVX under MXCSR, or
    AArch64 under FPCR, whose flush bits cover float32 and float64 alike): half the least
    normal float64 is a subnormal result (flush-to-zero makes it 0), and times one a
    subnormal operand (denormals-are-zero reads it as 0)."""
    produced = _LEAST_NORMAL * 0.5
    consumed = produced * _ONE
    return produced != 0.0 and consumed != 0.0


# whether its threads keep subnormals -> (process id, size, pool)
_pools: dict[bool, tuple[int, int, ThreadPoolExecutor]] = {}
_pool_lock = threading.Lock()
_worker = threading.local()  # ``inside`` set in the kept pools' threads


def _mark_worker() -> None:
    _worker.inside = True


def in_kept_pool() -> bool:
    """Whether this thread is one of a kept pool's (:func:`kept_pool`): work it hands to
    the pool and waits for could wait on itself, once every thread of the pool waits so."""
    return getattr(_worker, "inside", False)


def kept_pool(size: int) -> ThreadPoolExecutor:
    """A pool of ``size`` threads kept for the process (one of another size replaced: no
    more of a caller's work runs at once than it asked for), whose threads keep subnormals
    exactly when the calling thread does (one pool kept per mode, module docstring); a forked
    child makes its own:
    the parent's threads do not exist there. A replaced pool is not shut down: a call on
    another thread may still be submitting to it, and its threads end once it is no longer
    referenced. Callers running on a pool's thread (:func:`in_kept_pool`) run their work
    there instead of waiting on the pool."""
    keeps = subnormals_work()
    with _pool_lock:  # (the pool checked is the one returned, whatever other threads do)
        kept = _pools.get(keeps)
        if kept is None or kept[0] != os.getpid() or kept[1] != size:
            pool = ThreadPoolExecutor(size, thread_name_prefix="mxsim", initializer=_mark_worker)
            kept = _pools[keeps] = (os.getpid(), size, pool)
    return kept[2]


def run_in_threads(call, items: int, threads: int | None = None) -> None:
    """``call(start, stop)`` over ``range(items)`` cut into contiguous chunks, on as many
    threads as Numba's thread count allows here (one inside :func:`threads_for`'s small-work
    block: then on the calling thread alone), or as ``threads`` where given (1: the calling
    thread, without reading or changing Numba's thread count); on a kept pool's own thread
    (:func:`in_kept_pool`) on that thread alone. ``call`` runs a GIL-free (``nogil``)
    kernel, so the chunks run at the same time. Four chunks a thread even out chunks of
    unequal cost; a kernel's exception reaches the caller."""
    count = numba.get_num_threads() if threads is None else threads
    threads = min(count, items)
    if threads <= 1 or in_kept_pool():
        call(0, items)
        return
    chunks = min(items, 4 * threads)
    bounds = [i * items // chunks for i in range(chunks + 1)]
    # the pool of the full count (fewer items: as many chunks, so no more run at once),
    # which a call of few items then does not replace
    for _ in kept_pool(count).map(call, bounds[:-1], bounds[1:]):
        pass
