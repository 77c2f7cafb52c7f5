"""Timing shared by the benchmark scripts."""

from __future__ import annotations

import time


def best_seconds(run, repeats: int, clock=time.perf_counter) -> float:
    """The shortest time of ``repeats`` calls of ``run()`` (best-of, to ignore noise) by
    ``clock``: wall time, or ``time.process_time`` for the process's CPU time."""
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        run()
        best = min(best, clock() - start)
    return best
