"""Timing, the processor's name, and a command-line parser, shared by the benchmark scripts."""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
import time
from pathlib import Path


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr (the script's name and the
    message, no usage) and exit 2."""

    def error(self, message):
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


def best_seconds(run, repeats: int, clock=time.perf_counter, budget: float | None = None) -> float:
    """The shortest time of ``repeats`` calls of ``run()`` (best-of, to ignore noise) by
    ``clock``: wall time, or ``time.process_time`` for the process's CPU time. With a
    ``budget`` (seconds by ``clock``), fewer calls once they took that long in all (two at least)."""
    best, spent = float("inf"), 0.0
    for done in range(repeats):
        if budget is not None and done >= 2 and spent >= budget:
            break
        start = clock()
        run()
        seconds = clock() - start
        best, spent = min(best, seconds), spent + seconds
    return best


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The processor's model name (Linux's /proc/cpuinfo; else what ``platform`` says). The
    same-run ratios depend on it: Numba's kernels against BLAS's own differ by up to three
    times between x86-64 processors of one DGEMM speed."""
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    return platform.processor() or platform.machine()
