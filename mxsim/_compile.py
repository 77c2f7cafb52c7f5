"""Numba compilation: where compiled kernels are cached, a notice while they compile (a
spinner on a terminal, one log line per process elsewhere), and how long compiling took (so
run times can leave it out).

Compiled kernels are cached in ``NUMBA_CACHE_DIR`` when the user set it, else in the
per-user cache directory (``platformdirs.user_cache_dir("mxsim")``), never inside the
installed package: files written there are not in the wheel's RECORD, so an uninstall
would leave them behind as a namespace package shadowing the next install. The per-user
cache has a directory per digest of the kernel modules' sources
(:func:`kernel_sources_digest`): Numba keys a cached kernel by its own file's stamp alone,
while a kernel carries compiled into it the functions it calls from other modules, so a
change to one of those would otherwise leave callers cached with the old code.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pathlib
import re
import shutil
import sys
import threading
import time

CACHE_ENV = "NUMBA_CACHE_DIR"
#: Digest directories the per-user kernel cache keeps (the current one and the most recently
#: used others: other installed versions, or a checkout's recent states), a few tens of MB each.
KEPT_KERNEL_CACHES = 4
_DIGEST_NAME = re.compile(r"[0-9a-f]{16}")
_OLD_LAYOUT_NAME = re.compile(r"[A-Za-z0-9_]+_[0-9a-f]{40}")
# Seconds the README's replay spends compiling on an idle machine (measured: the wall seconds
# of its run with an empty kernel cache less those of its cached run, recorded in
# benchmarks/results/coldstart.txt; the warm-up child of mxsim.replay.warmup compiles a share
# of the units on the other core meanwhile, so the replay's wall time is what a user waits).
TYPICAL_COMPILE_SECONDS = 11
_NOTICE_DELAY_SECONDS = 0.5  # compiles shorter than this show nothing
_SPINNER = "|/-\\"


def kernel_cache_dir() -> str:
    """The directory Numba caches mxsim's compiled kernels in: ``NUMBA_CACHE_DIR`` when set,
    else the per-user cache's directory for this :func:`kernel_sources_digest`."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return configured
    import platformdirs

    return os.path.join(platformdirs.user_cache_dir("mxsim"), "numba", kernel_sources_digest())


@functools.lru_cache(maxsize=None)
def kernel_sources_digest(root: str = os.path.dirname(os.path.abspath(__file__))) -> str:
    """16 hex digits of a SHA-256 over the path and bytes of every module under ``root``
    whose name begins with one underscore (mxsim's kernels live in such modules, and so do
    the helpers they call): any change to them names a new cache directory."""
    digest = hashlib.sha256()
    for path in sorted(pathlib.Path(root).rglob("_*.py")):
        if not path.name.startswith("__"):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def configure_cache() -> str:
    """Point Numba's cache at :func:`kernel_cache_dir`, before any kernel is defined.

    Numba reads ``NUMBA_CACHE_DIR`` when it is imported and again whenever the environment's
    ``NUMBA_*`` variables change, so the variable is set for both cases, and Numba's config
    too when Numba was imported before mxsim. In the per-user cache, the directory's time is
    set to now (what :func:`prune_kernel_caches` keeps by), and a new directory (kernels
    that changed since the last run) first prunes the others. Returns the directory.
    """
    user_cache = not os.environ.get(CACHE_ENV)
    path = kernel_cache_dir()
    if user_cache:
        if os.path.isdir(path):
            with contextlib.suppress(OSError):
                os.utime(path)
        else:
            prune_kernel_caches(os.path.dirname(path), keep=KEPT_KERNEL_CACHES - 1)
    os.environ[CACHE_ENV] = path
    config = sys.modules.get("numba.core.config")
    if config is not None:
        config.CACHE_DIR = path
    return path


def prune_kernel_caches(root: str, keep: int) -> list[str]:
    """Remove from ``root`` (the per-user cache's ``numba`` directory) all but the ``keep``
    most recently used digest directories (16 hex digits: :func:`kernel_cache_dir`'s, by
    their time, which each run sets) and every directory of the layout before them (a
    module name, an underscore, 40 hex digits); nothing else is touched, and a directory
    that cannot be removed is left. Returns the paths removed."""
    try:
        entries = [entry for entry in os.scandir(root) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    digests = [entry for entry in entries if _DIGEST_NAME.fullmatch(entry.name)]
    digests.sort(key=lambda entry: entry.stat(follow_symlinks=False).st_mtime, reverse=True)
    stale = digests[keep:] + [entry for entry in entries if _OLD_LAYOUT_NAME.fullmatch(entry.name)]
    removed = []
    for entry in stale:
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.exists(entry.path):
            removed.append(entry.path)
    return removed


def _message() -> str:
    return f"mxsim: compiling kernels (first run only, ~{TYPICAL_COMPILE_SECONDS} s)"


class _CompileWatch:
    """Listens to Numba's compile events: total seconds spent compiling (outermost compiles
    only, so nested ones are not counted twice) and a notice once a compile has run for
    half a second: on a terminal a one-line spinner, cleared afterwards, at every such
    compile; elsewhere (a log, a pipe) one line, at the first such compile of the process,
    naming the cache the kernels are kept in."""

    def __init__(self, stream=None):
        self.stream = stream
        self.depth = 0
        self.total_seconds = 0.0
        self.logged = False
        self._started = 0.0
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def on_start(self, _event) -> None:
        self.depth += 1
        if self.depth == 1:
            self._started = time.perf_counter()
            stream = self.stream or sys.stderr
            notice = self._spin if stream.isatty() else None if self.logged else self._log
            if notice is not None:
                self._stop = threading.Event()
                self._thread = threading.Thread(
                    target=notice, args=(stream, self._stop), daemon=True
                )
                self._thread.start()

    def on_end(self, _event) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.total_seconds += time.perf_counter() - self._started
            if self._thread is not None:
                self._stop.set()
                self._thread.join()
                self._thread = self._stop = None

    def _log(self, stream, stop: threading.Event) -> None:
        if stop.wait(_NOTICE_DELAY_SECONDS):
            return
        self.logged = True
        stream.write(f"{_message()}; later runs load them from {kernel_cache_dir()}\n")
        stream.flush()

    def _spin(self, stream, stop: threading.Event) -> None:
        if stop.wait(_NOTICE_DELAY_SECONDS):
            return
        message = _message()
        turn = 0
        while not stop.wait(0.2):
            elapsed = time.perf_counter() - self._started
            stream.write(f"\r{message} {_SPINNER[turn % len(_SPINNER)]} {elapsed:.0f} s")
            stream.flush()
            turn += 1
        stream.write("\r" + " " * (len(message) + 12) + "\r")
        stream.flush()


_watch: _CompileWatch | None = None


def watch_compiles() -> _CompileWatch:
    """Start listening to Numba's compile events (once per process); kernel modules call
    this when they are imported, so nothing is listened to before a kernel can compile."""
    global _watch
    if _watch is None:
        from numba.core import event

        watch = _CompileWatch()

        class Listener(event.Listener):
            def on_start(self, ev):
                watch.on_start(ev)

            def on_end(self, ev):
                watch.on_end(ev)

        event.register("numba:compile", Listener())
        _watch = watch
    return _watch


@contextlib.contextmanager
def compiling_elsewhere():
    """Time spent in this block counts as compiling, and shows the notice: for waiting on
    kernels another process compiles into the shared cache (:mod:`mxsim.replay.warmup`)."""
    watch = watch_compiles()
    watch.on_start(None)
    try:
        yield
    finally:
        watch.on_end(None)


def compile_seconds() -> float:
    """Seconds this process has spent compiling kernels so far (cache loads excluded)."""
    return 0.0 if _watch is None else _watch.total_seconds


#: Compile options of every kernel and stage that allocates nothing: no reference counting
#: (Numba's ``_nrt``), which would otherwise increment and decrement, atomically, every array
#: passed to every stage call. Stages are separate functions, not inlined in Numba's IR
#: (``inline="always"``): LLVM still inlines them where it pays, and IR inlining recompiled each
#: stage inside every caller, which multiplied compile times.
NO_REFCOUNTS = {"_nrt": False}

#: Compile options of a stage only other kernels call: :data:`NO_REFCOUNTS`, and neither the
#: wrapper that lets Python call it nor the C-callable one, which Numba would otherwise build
#: (and optimize, and cache) for every stage of every kernel.
STAGE = {**NO_REFCOUNTS, "no_cpython_wrapper": True, "no_cfunc_wrapper": True}


def generic_calls(dispatcher):
    """Decorator (above ``@njit``): calls from other kernels compile this function once for
    the plain argument types, not once more for every combination of constants
    (``Literal[int](1)``) that call sites pass, which Numba does by default and which
    multiplies the compile time of the helpers called with constant rounding modes."""
    from numba.core import types

    specialise = dispatcher.get_call_template

    def get_call_template(args, kws):
        return specialise(
            tuple(types.unliteral(a) for a in args), {k: types.unliteral(v) for k, v in kws.items()}
        )

    dispatcher.get_call_template = get_call_template
    return dispatcher
