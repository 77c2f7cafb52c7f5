"""Replay a trace's layers through hardware datapaths and measure what they do to the numbers:
the orchestration. :func:`replay` checks the request (:func:`check_replay`), runs each layer
through every unit as one task (:func:`replay_layer_on_units`, rows from
:mod:`mxsim.replay.layer`) and each unit's end-to-end run, and builds the report
(:mod:`mxsim.replay.report`); :func:`select_layers` picks layers by name.

``docs/replay.md`` defines everything precisely. The operand policy lives in
:mod:`mxsim.replay.choice`, one layer on one unit in :mod:`mxsim.replay.layer`, the text
report in :mod:`mxsim.replay.report` and the plots in :mod:`mxsim.replay.plots`; their public
names are importable from here too.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import re
from collections.abc import Callable, Sequence

from ..datapath import HardwareConfig
from ..errors import IncompleteResultError, MxsimError
from ..formats import get_format
from ..limits import shown
from ..parallel import InProcess, Task, raise_failures
from ..trace.model import Layer, Trace
from . import warmup
from .choice import MARKS, STATUSES, OperandChoice, choose_operand
from .layer import LayerResult, LayerRun, replay_layer, run_layer
from .network import accuracy
from .operands import CONV_ORDERS, OperandPlan, ideal_gemm, layer_operands, operand_plans
from .plots import plot_ceiling, write_plots
from .report import build_report, format_report, reference_line, worst_layers

__all__ = [
    "LAYERS_MATCH_SECONDS",
    "MARKS",
    "STATUSES",
    "LayerResult",
    "LayerRun",
    "OperandChoice",
    "check_replay",
    "choose_operand",
    "end_to_end_accuracy",
    "format_report",
    "plot_ceiling",
    "reference_line",
    "replay",
    "replay_layer",
    "replay_layer_on_units",
    "run_layer",
    "select_layers",
    "worst_layers",
    "write_plots",
]


def replay_layer_on_units(
    layer: Layer,
    units: Sequence[HardwareConfig],
    element_format: str | None = None,
    conv_order: str = "kh_kw_c",
    strict: bool = False,
    matmul_fn: Callable | None = None,
) -> list[LayerResult]:
    """:func:`replay_layer` through each unit, the layer's operands quantized and its ideal
    computed once for all of them. ``strict``: MxsimError for a ``replaced`` row (:func:`choose_operand`)."""
    operands = layer_operands(layer, conv_order)
    memo = {}

    def ideal():  # computed once, if a unit takes the model's operands
        if "ideal" not in memo:
            memo["ideal"] = ideal_gemm(operands)
        return memo["ideal"]

    return [
        replay_layer(layer, hw, element_format, conv_order, ideal, operands, matmul_fn, strict)
        for hw in units
    ]


def end_to_end_accuracy(
    trace: Trace,
    hw: HardwareConfig,
    element_format: str | None = None,
    matmul_fn: Callable | None = None,
    conv_order: str = "kh_kw_c",
    strict: bool = False,
) -> float:
    """Top-1 accuracy of the trace's network with every layer computed by ``hw`` (no ideal)."""
    return accuracy(trace, unit_layer_fn(hw, element_format, matmul_fn, conv_order, strict))


def unit_layer_fn(
    hw: HardwareConfig,
    element_format: str | None,
    matmul_fn: Callable | None,
    conv_order: str,
    strict: bool,
) -> Callable:
    """The network step of an end-to-end run: a layer's output values with ``hw`` computing it."""
    return lambda layer, x: (
        run_layer(
            layer,
            hw,
            x,
            element_format,
            conv_order,
            with_ideal=False,
            matmul_fn=matmul_fn,
            strict=strict,
            count_clipped=False,
        ).values
    )


#: Seconds the layer-name search of :func:`select_layers` may take (a time bound: Python's
#: regular expressions backtrack, and a pattern such as ``^(a+)+$`` takes exponential time).
LAYERS_MATCH_SECONDS = 10.0


def _search_child(compiled, names, connection) -> None:
    connection.send_bytes(bytes(compiled.search(name) is not None for name in names))
    connection.close()


def _search_bounded(compiled, names: list[str], pattern: str, seconds: float) -> list[bool]:
    """``compiled.search`` over ``names`` in a forked child stopped after ``seconds`` (the
    answer comes back as bytes, never pickled)."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_search_child, args=(compiled, names, sender), daemon=True)
    child.start()
    sender.close()
    try:
        if not receiver.poll(seconds):
            raise MxsimError(
                f"--layers {shown(pattern)}: matching the layer names took more than {seconds:g} s "
                "(a pattern that backtracks, such as nested repetition); simplify it"
            )
        try:
            mask = receiver.recv_bytes()
        except EOFError:  # the child died (out of memory)
            raise MxsimError(
                f"--layers {shown(pattern)}: matching the layer names failed"
            ) from None
    finally:
        receiver.close()
        if child.is_alive():
            child.kill()
        child.join()
    return [bool(flag) for flag in mask]


def select_layers(trace: Trace, pattern: str) -> Trace:
    """``trace`` with only the layers whose name matches the regular expression ``pattern``
    (``re.search``); its network and dataset are dropped (a subset cannot run end to end).
    MxsimError for an invalid pattern, one that matches no layer, or a search of the names
    taking more than :data:`LAYERS_MATCH_SECONDS` (run in a child process that is then
    stopped; Python's engine backtracks)."""
    try:
        compiled = re.compile(pattern)
    except (re.error, TypeError, RecursionError, OverflowError, ValueError) as error:
        raise MxsimError(
            f"--layers {shown(pattern)}: not a regular expression: {shown(str(error))}"
        ) from None
    names = [layer.name for layer in trace.layers]
    mask = _search_bounded(compiled, names, pattern, LAYERS_MATCH_SECONDS)
    layers = [layer for layer, keep in zip(trace.layers, mask) if keep]
    if not layers:
        first = f" (first: {shown(trace.layers[0].name)})" if trace.layers else ""
        raise MxsimError(
            f"--layers {shown(pattern)} matches none of the trace's {len(trace.layers)} layers{first}"
        )
    return dataclasses.replace(trace, layers=layers, network=None, dataset=None)


def check_replay(
    trace: Trace,
    units: Sequence[HardwareConfig],
    end_to_end: bool = False,
    element_format: str | None = None,
    conv_order: str = "kh_kw_c",
    strict: bool = False,
    perplexity_fn: Callable | None = None,
) -> None:
    """Every check :func:`replay` makes before it starts any work; MxsimError for a request
    that cannot be met: no units or two of one name, an unknown conv order, end to end on a
    trace whose network cannot give a metric, a caller's format a unit does not take, and,
    with ``strict``, a recorded spec a unit cannot take as it is (from the specs alone:
    :func:`mxsim.replay.operands.operand_plans`)."""
    if not units:
        raise MxsimError("replay needs at least one hardware config")
    if conv_order not in CONV_ORDERS:
        raise MxsimError(f"conv order must be one of {', '.join(CONV_ORDERS)}, got {conv_order!r}")
    names = [hw.name for hw in units]
    if len(set(names)) != len(names):
        raise MxsimError(f"hardware configs must have distinct names, got {names}")
    network = trace.network
    if end_to_end:
        if network is None or (network.labels is None and network.targets is None):
            raise MxsimError(
                f"trace {trace.name!r}: end to end needs a network with labels (accuracy) or targets "
                "(perplexity); this trace has "
                + ("no network" if network is None else "a network without labels or targets")
            )
        if network.targets is not None and perplexity_fn is None:
            raise MxsimError(
                f"trace {trace.name!r} is a language model: its end to end runs in PyTorch; pass "
                "perplexity_fn=mxsim.inloop.network.perplexity"
            )
    if element_format is not None:  # the caller's format for every operand: one check per unit
        blank = OperandPlan(get_format("bf16"), False, 0, "float", "unquantized")
        for hw in units:
            for name in ("input", "weight"):
                choose_operand(blank, name, None, hw, element_format)
    elif strict:
        for layer in trace.layers:
            plans = operand_plans(layer, conv_order)
            for hw in units:
                for name in ("input", "weight"):
                    try:
                        choose_operand(
                            plans[name], name, layer.quant.get(name), hw, None, strict=True
                        )
                    except MxsimError as error:
                        raise MxsimError(f"layer {layer.name!r} on {error}") from None


def replay(
    trace: Trace,
    units: Sequence[HardwareConfig],
    end_to_end: bool = False,
    progress: bool = False,
    on_layer: Callable[[LayerResult], None] | None = None,
    element_format: str | None = None,
    conv_order: str = "kh_kw_c",
    strict: bool = False,
    runner=None,
    perplexity_fn: Callable[..., float] | None = None,
) -> dict:
    """Replay every layer of ``trace`` through each unit; totals, the worst layers, pairwise bit
    agreement and, with ``end_to_end``, the task metric with every layer computed by each unit:
    accuracy for a network with labels, perplexity for one with targets. A language model runs
    in PyTorch with the unit in the loop, in this process, through ``perplexity_fn(trace)``
    (float) and ``perplexity_fn(trace, hw, a_format=element_format)``: pass
    :func:`mxsim.inloop.network.perplexity` (this package does not import the in-the-loop
    runner).

    ``element_format``: every operand quantized to it (OCP profile) instead of the trace's
    specs. ``conv_order``: one of :data:`mxsim.replay.operands.CONV_ORDERS`. ``strict``: raise
    MxsimError when a unit cannot take a recorded spec (a ``replaced`` row) instead of
    marking the row (:func:`choose_operand`).

    Every request that cannot be met is refused before any work (:func:`check_replay`).
    With an in-process runner and a cold kernel cache, the kernels are compiled on two cores
    first (:mod:`mxsim.replay.warmup`; results do not depend on it).
    Each layer (through every unit, sharing its operands and ideal) and each unit's end-to-end
    run is one task of ``runner`` (default in-process; :class:`mxsim.parallel.DaskRunner`
    spreads them over a cluster, with the same results). When tasks fail, the others still
    finish, and :class:`mxsim.errors.IncompleteResultError` is raised with the report of the
    layers that succeeded as its ``partial`` (``report["failures"]`` lists what failed); an
    internal error is re-raised with the same ``partial`` attribute.
    """
    check_replay(trace, units, end_to_end, element_format, conv_order, strict, perplexity_fn)
    runner = runner or InProcess()
    language_model = trace.network is not None and trace.network.targets is not None
    options = (element_format, conv_order, bool(end_to_end and not language_model))
    in_process = isinstance(runner, InProcess)
    warm = warmup.start(trace, units, *options) if in_process else None
    compiled_first = warm.finish() if warm is not None else {}
    tasks = [
        Task(
            f"layer {layer.name}",
            replay_layer_on_units,
            (layer, units, element_format, conv_order, strict, runner.matmul),
        )
        for layer in trace.layers
    ]
    if end_to_end and not language_model:
        shared = runner.share(trace)
        tasks += [
            Task(
                f"end to end on {hw.name}",
                end_to_end_accuracy,
                (shared, hw, element_format, runner.matmul, conv_order, strict),
            )
            for hw in units
        ]

    def layer_done(key, value):
        if on_layer and key.startswith("layer "):
            for result in value:
                on_layer(result)

    done, failures = runner.run(tasks, progress=progress, unit="task", on_result=layer_done)
    report = build_report(trace, units, element_format, conv_order, done, compiled_first)
    if in_process and not failures:
        warmup.mark_warm(trace, units, options)
    try:
        raise_failures("replay", len(tasks), failures)
        if end_to_end and language_model:
            report["end_to_end"] = {
                "float_perplexity": perplexity_fn(trace),
                "perplexity": {
                    hw.name: perplexity_fn(trace, hw, a_format=element_format) for hw in units
                },
            }
        elif end_to_end:
            report["end_to_end"] = {
                "float_accuracy": accuracy(trace),
                "accuracy": {hw.name: done[f"end to end on {hw.name}"] for hw in units},
            }
    except MxsimError as error:
        report["failures"] = [{"task": f.key, "error": f.message} for f in failures] or [
            {"task": "end to end", "error": str(error)}
        ]
        raise IncompleteResultError(str(error), report) from error
    except Exception as error:
        report["failures"] = [{"task": f.key, "error": f.message} for f in failures]
        error.partial = report
        raise
    return report
