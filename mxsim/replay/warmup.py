"""Compiling a replay's kernels on two cores: with an empty kernel cache, a replay compiles
one share of its kernels in a second process while this one compiles the rest, then loads the
second process's kernels from the shared cache. Through several units the share is some of
the units; through one, the unit's route.

Compiling is single-threaded and takes most of a first run's time (each unit's route and the
quantizers it calls: 10-30 s apiece), so on a machine with a free core a replay finishes its
first run in about the time of its longest share instead of the sum.

How it works (:func:`start`, then :meth:`Warmup.finish` before the replay's tasks):

* A unit is warmed by replaying, through it, one layer of each kind in the trace (the
  smallest: same op, operand specs and array types give the same kernel specialisations) and,
  for an end-to-end replay, the network on two samples: the replay's own code path, so the
  kernels it compiles are the ones the replay then calls. Results are thrown away.
* The units whose kernels are not known to be cached (a marker per unit and kind of work in the
  kernel cache directory, written after a replay succeeds, keyed by the unit's digest, the
  kinds of layers, the options and the mxsim source files' stamps) are split: the last half
  goes to a child process (a new Python interpreter, ``subprocess``: nothing of this process's
  ``__main__`` runs again there, and its request is JSON) that loads the trace and the
  configs from their files and warms them, this process warms the first half, then waits for
  the child, counting the wait as compiling (:func:`mxsim._compile.compiling_elsewhere`: the
  notice shows, and the replay report's "compiling kernels" includes it).
* One cold unit is split within: the child warms its route (:func:`warm_route`: the layers
  through the unit on placeholder operands of the quantizer's types, which reach the route's
  kernel signatures without compiling a quantizer, and no ideal) while this process warms
  everything else (:func:`warm_all_but_route`: the layers replayed with the route stubbed:
  quantization, the ideal, the metrics), then waits. The end-to-end network is left to the
  replay (it calls the same kernels).
* The child only fills the cache: results never come from it. If it fails, is killed or
  takes longer than :data:`WAIT_SECONDS`, this process compiles whatever is missing itself
  (a debug line on the ``mxsim`` logger says so). Numba writes each cache file to a temporary
  name and renames it, so two processes filling one cache never leave a torn file.

``MXSIM_PARALLEL_COMPILE`` (:data:`SWITCH`): ``auto`` (the default) as above, only with an
empty cache (for some unit), at least two usable cores of which one is free (load average),
an in-process runner and a trace and configs loaded from files; ``0`` never; ``1`` also when
the markers say the cache is warm or the machine is busy (for measurements and tests).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .._compile import compile_seconds, compiling_elsewhere, kernel_cache_dir
from ..errors import ArgumentError
from ..trace.model import Layer, Trace

SWITCH = "MXSIM_PARALLEL_COMPILE"
SWITCH_VALUES = ("auto", "0", "1")
#: Longest wait for the child (seconds); after it the child is stopped and this process
#: compiles what is still missing.
WAIT_SECONDS = 900.0
#: Samples of the dataset the end-to-end warm-up runs the network on.
NETWORK_SAMPLES = 2
_MARKERS = "mxsim-warm"
_log = logging.getLogger("mxsim")


def switch() -> str:
    """The value of ``MXSIM_PARALLEL_COMPILE`` (``auto`` when unset); ArgumentError naming the
    variable and the accepted values otherwise."""
    value = os.environ.get(SWITCH, "auto").strip() or "auto"
    if value not in SWITCH_VALUES:
        raise ArgumentError(
            f"{SWITCH}={value[:40]!r}: expected one of {', '.join(SWITCH_VALUES)} "
            "(auto: compile on two cores when the kernel cache is empty; 0: never; 1: always)"
        )
    return value


def _shape_free(value):
    """``value`` with every array replaced by its dtype and rank (a spec's scales differ per
    layer; the kernels they reach do not)."""
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.ndim)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return (type(value).__name__, *(_shape_free(getattr(value, f.name)) for f in fields))
    return value


def _kind(layer: Layer) -> str:
    """What decides which kernel specialisations a layer compiles: its op, reference mode,
    operand specs (arrays by dtype and rank), which operands hold codes only, and its
    arrays' dtypes and ranks."""
    return repr(
        (
            layer.op,
            layer.reference,
            sorted(layer.codes_only),
            sorted((name, repr(_shape_free(spec))) for name, spec in layer.quant.items()),
            sorted((name, _shape_free(a)) for name, a in layer.tensors.items()),
        )
    )


def representative_layers(trace: Trace) -> list[Layer]:
    """One layer of each kind (:func:`_kind`), the one with the fewest output elements, in
    trace order."""
    chosen: dict[str, Layer] = {}
    for layer in trace.layers:
        kind = _kind(layer)
        if kind not in chosen or layer.output.size < chosen[kind].output.size:
            chosen[kind] = layer
    keep = {id(layer) for layer in chosen.values()}
    return [layer for layer in trace.layers if id(layer) in keep]


def warm_unit(
    trace: Trace,
    layers: Sequence[Layer],
    hw,
    element_format: str | None,
    conv_order: str,
    end_to_end: bool,
) -> None:
    """Compile (or load) the kernels a replay of ``trace`` through ``hw`` calls: ``layers``
    replayed through it and, with ``end_to_end``, the network on its first samples. Results
    are discarded; errors are left to the replay itself to report."""
    from .run import replay_layer_on_units, unit_layer_fn

    for layer in layers:
        replay_layer_on_units(layer, [hw], element_format, conv_order)
    network = trace.network
    if end_to_end and network is not None and network.labels is not None:
        from .network import run_network

        inputs = trace.dataset[network.input][:NETWORK_SAMPLES]
        run_network(trace, inputs, unit_layer_fn(hw, element_format, None, conv_order, False))


def _route_skipped(hw, a, b, c=None, out_format=None):
    """A stand-in for :func:`mxsim.matmul` that computes nothing: zero output bits of the
    unit's output format (``run_layer``'s ``matmul_fn``, so that everything else of a layer's
    replay runs without the unit's route)."""
    from ..datapath import MatmulResult
    from ..datapath.api import output_dtype

    params = hw.params(a.element_format.name, b.element_format.name, out_format, None)
    bits = np.zeros((a.shape[0], b.shape[1]), dtype=output_dtype(params.output_format))
    return MatmulResult(bits, params.output_format)


def warm_all_but_route(layers: Sequence[Layer], hw, element_format: str | None, conv_order: str):
    """Compile (or load) what replaying ``layers`` through ``hw`` calls besides the unit's
    route: the operands' quantization, the ideal, the metrics (each layer replayed with
    :func:`_route_skipped` for the route). Results are discarded."""
    from .run import replay_layer_on_units

    for layer in layers:
        replay_layer_on_units(layer, [hw], element_format, conv_order, matmul_fn=_route_skipped)


def warm_route(layers: Sequence[Layer], hw, element_format: str | None, conv_order: str):
    """Compile (or load) the kernels of ``hw``'s route that replaying ``layers`` calls, on
    placeholder operands (:func:`mxsim.replay.layer.placeholder_quantization`: the
    quantization's types without its kernels), the ideal left out. Results are discarded."""
    from .layer import placeholder_quantization, run_layer

    for layer in layers:
        run_layer(
            layer,
            hw,
            None,
            element_format,
            conv_order,
            with_ideal=False,
            count_clipped=False,
            requantize=placeholder_quantization,
        )


def _source_stamp() -> list:
    """Names, sizes and modification times of mxsim's Python files (a changed kernel makes
    the markers stale, as it makes Numba's cache stale)."""
    root = Path(__file__).resolve().parent.parent
    return sorted(
        (str(path.relative_to(root)), stat.st_size, stat.st_mtime_ns)
        for path in root.rglob("*.py")
        for stat in (path.stat(),)
    )


def _marker(hw, kinds: list[str], options: tuple, stamp: list) -> Path:
    import numba

    key = json.dumps(
        [hw.digest, kinds, list(options), stamp, numba.__version__, sys.version], default=str
    )
    name = hashlib.sha256(key.encode()).hexdigest()[:32]
    return Path(kernel_cache_dir()) / _MARKERS / name


def mark_warm(trace: Trace, units: Sequence, options: tuple) -> None:
    """Record that the kernel cache holds what replaying ``trace`` through ``units`` with
    ``options`` compiles (called after an in-process replay succeeded; nothing with the
    switch at ``0``). Best effort: a cache directory that cannot be written only costs a
    warm-up later."""
    if switch() == "0":
        return
    kinds = sorted({_kind(layer) for layer in trace.layers})
    stamp = _source_stamp()
    try:
        for hw in units:
            path = _marker(hw, kinds, options, stamp)
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
    except OSError as error:
        _log.debug("kernel cache markers not written: %s", error)


def _core_free() -> bool:
    """Whether the machine has a core to spare: a load average (last minute) at most half a
    core above the other cores' count. On a busy machine a second process only competes
    with this one: it compiles the units' shared kernels once more, for no gain in time."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not available here
        return True
    return load <= _usable_cores() - 0.5


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def child_main() -> None:
    """The child's work (``python -c "from mxsim.replay.warmup import child_main; child_main()"``):
    read the request (JSON on standard input), warm each unit, and print its digest when done."""
    from ..datapath import load_hwconfig
    from ..trace import load_trace

    answers, sys.stdout = sys.stdout, sys.stderr  # only the digests go to the parent
    request = json.loads(sys.stdin.read())
    trace = load_trace(request["trace"])
    by_name = {layer.name: layer for layer in trace.layers}
    layers = [by_name[name] for name in request["layers"]]
    element_format, conv_order, end_to_end = request["options"]
    for source, digest in request["units"]:
        hw = load_hwconfig(source)
        if hw.digest == digest and request["route_only"]:
            warm_route(layers, hw, element_format, conv_order)
        elif hw.digest == digest:
            warm_unit(trace, layers, hw, element_format, conv_order, end_to_end)
        print(digest, file=answers, flush=True)


def _lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.strip())
    lines.put(None)


@dataclasses.dataclass
class Warmup:
    """A replay's warm-up (:func:`start`): this process's units (``mine``), and the child
    warming the others (``theirs``), or with ``route_only`` only their routes, the rest of
    them warmed here. :meth:`finish` warms this process's share, waits for the child and
    returns the compile seconds per unit name (to be added to the replay's per-unit compile
    time)."""

    trace: Trace
    layers: list[Layer]
    mine: list
    theirs: list
    options: tuple
    process: subprocess.Popen
    lines: queue.Queue
    route_only: bool = False

    def finish(self) -> dict[str, float]:
        seconds: dict[str, float] = {}
        element_format, conv_order, _ = self.options
        try:
            for hw in self.mine:
                seconds[hw.name] = self._warm(
                    hw, warm_unit, self.trace, self.layers, hw, *self.options
                )
            if self.route_only:  # the child warms their routes: the rest of them here
                for hw in self.theirs:
                    seconds[hw.name] = self._warm(
                        hw, warm_all_but_route, self.layers, hw, element_format, conv_order
                    )
            waited = self._wait()
            return {
                name: seconds.get(name, 0.0) + waited.get(name, 0.0) for name in {*seconds, *waited}
            }
        except BaseException:  # interrupted: the child goes too
            self.process.kill()
            self.process.wait()
            raise

    @staticmethod
    def _warm(hw, warm, *arguments) -> float:
        """Seconds spent compiling in ``warm(*arguments)``; its errors are the replay's to report."""
        before = compile_seconds()
        try:
            warm(*arguments)
        except Exception as error:
            _log.debug("warm-up of %s failed: %s", hw.name, error)
        return compile_seconds() - before

    def _wait(self) -> dict[str, float]:
        """Wait for the child's units in turn, the wait counted as compiling each."""
        seconds = {}
        deadline = time.monotonic() + WAIT_SECONDS
        pending = {hw.digest: hw for hw in self.theirs}
        while pending:
            before = compile_seconds()
            with compiling_elsewhere():
                try:
                    digest = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    digest = "timed out"
            if digest not in pending:
                reason = digest or f"exit code {self.process.wait()}"
                _log.debug("kernel warm-up child stopped early (%s)", reason)
                break
            seconds[pending.pop(digest).name] = compile_seconds() - before
        try:
            self.process.wait(0 if pending else 10)  # done: let it exit by itself
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return seconds


def start(
    trace: Trace,
    units: Sequence,
    element_format: str | None,
    conv_order: str,
    end_to_end: bool,
) -> Warmup | None:
    """A warm-up for replaying ``trace`` through ``units`` on an in-process runner, its child
    already started; None when it would not pay (see the module docstring)."""
    mode = switch()
    options = (element_format, conv_order, bool(end_to_end))
    if mode == "0" or not units or trace.path is None or _usable_cores() < 2:
        return None
    if not all(os.path.isfile(hw.source) for hw in units):
        return None
    layers = representative_layers(trace)
    cold = list(units)
    if mode == "auto":
        if not _core_free():
            return None
        kinds = sorted({_kind(layer) for layer in trace.layers})
        stamp = _source_stamp()
        cold = [hw for hw in units if not _marker(hw, kinds, options, stamp).exists()]
        if not cold:
            return None
    route_only = len(cold) == 1  # one unit: its route there, the rest of it here
    theirs = cold[(len(cold) + 1) // 2 :] or cold
    mine = [hw for hw in cold if hw not in theirs]
    request = {
        "trace": str(trace.path),
        "layers": [layer.name for layer in layers],
        "units": [[str(hw.source), hw.digest] for hw in theirs],
        "options": list(options),
        "route_only": route_only,
    }
    package_root = str(Path(__file__).resolve().parent.parent.parent)
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=package_root + (os.pathsep + path if path else ""))
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", "from mxsim.replay.warmup import child_main; child_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # this process shows the notice
            env=env,
            text=True,
        )
    except OSError as error:
        _log.debug("kernel warm-up child not started: %s", error)
        return None
    try:
        process.stdin.write(json.dumps(request))
        process.stdin.close()
    except OSError:  # it died at once: its exit code is reported while waiting
        pass
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(process.stdout, lines), daemon=True).start()
    return Warmup(trace, layers, mine, theirs, options, process, lines, route_only)
