"""Replay: a trace's layers computed through hardware datapaths, and its network run end to end.

* :mod:`.lowering` — the GEMM view of a layer (linear, matmul, conv2d / conv_transpose2d
  through im2col), worked out once per layer: :func:`gemm_view` (a :class:`GemmView`),
  :func:`gemm_shape`, :func:`lower_input`, :func:`lower_weight`, :func:`lift_output`.
* :mod:`.operands` — a layer's operands quantized in the model's own layout and lowered
  (per-tap channel blocks), and the exact ideal result.
* :mod:`.choice` — what a unit gets for each operand, and why (the policy replay and the
  unit in the loop share).
* :mod:`.layer` — one layer on one unit: :func:`run_layer` (what :mod:`mxsim.inloop` calls)
  and a replay row with its metrics (``replay_layer``).
* :mod:`.run` — :func:`replay`: a trace's layers through units, checked before any work.
* :mod:`.report` — the report and its terminal table (:func:`format_report`).
* :mod:`.plots` — the report's PNG plots (:func:`write_plots`).
* :mod:`.attribution` — where a layer's error is: output channels, input columns, input vs
  weight quantization.
* :mod:`.network` — running a sequential network recipe end to end in numpy.

A language model's end to end runs in PyTorch (:func:`mxsim.inloop.network.perplexity`, passed
to :func:`replay` as ``perplexity_fn``); this package never imports :mod:`mxsim.inloop`.
"""

from .layer import run_layer
from .lowering import (
    GemmShape,
    GemmView,
    gemm_axis,
    gemm_reference,
    gemm_shape,
    gemm_view,
    lift_output,
    lower_input,
    lower_weight,
)
from .network import accuracy, float_layer, layer_with_input, run_network
from .plots import write_plots
from .report import format_report
from .run import replay

__all__ = [
    "GemmShape",
    "GemmView",
    "accuracy",
    "float_layer",
    "format_report",
    "gemm_axis",
    "gemm_reference",
    "gemm_shape",
    "gemm_view",
    "layer_with_input",
    "lift_output",
    "lower_input",
    "lower_weight",
    "replay",
    "run_layer",
    "run_network",
    "write_plots",
]
