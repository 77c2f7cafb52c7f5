"""How many threads a parallel kernel call may use: one for small work.

A Numba ``prange`` loop wakes every thread of its pool and waits for all of them at its end.
On an idle machine that costs tens of microseconds; when the cores are shared (other
processes, test workers, another kernel's threads) a woken thread may wait a whole scheduler
time slice, and a call of a few dozen elements then takes milliseconds instead of
microseconds. Work below :data:`SERIAL_BELOW` items runs on the calling thread alone, where no
thread is waited for; the results do not depend on the thread count.
"""

from __future__ import annotations

from contextlib import contextmanager

import numba

#: Work items (elements, products) below which a parallel kernel call uses one thread: the
#: size where the single-threaded loop takes roughly as long as waking a second thread.
SERIAL_BELOW = 1 << 14


@contextmanager
def threads_for(work: int):
    """Within the block, Numba's parallel kernels on this thread use one thread when ``work``
    (the call's elements or products) is below :data:`SERIAL_BELOW`; otherwise the thread
    count is left as it is."""
    threads = numba.get_num_threads()
    if work >= SERIAL_BELOW or threads == 1:
        yield
        return
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(threads)
