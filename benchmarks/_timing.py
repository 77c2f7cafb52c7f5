"""Timing shared by the benchmark scripts."""

from __future__ import annotations

import time


def best_seconds(run, repeats: int) -> float:
    """The shortest wall time of ``repeats`` calls of ``run()`` (best-of, to ignore noise)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best
