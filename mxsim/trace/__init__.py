"""Traces: what each matmul/conv layer of a real model sees, captured for replay.

* :mod:`.model` — :class:`Trace`, :class:`Layer`, :class:`Network` and the format's
  vocabulary; :mod:`.validate` — the rules a trace obeys; :mod:`.io` — the on-disk format
  (YAML manifest + NPZ): :func:`load_trace`, :func:`save_trace`.
* :mod:`.quant` — per-operand quantization specs (:class:`MXQuant`, :class:`BFPQuant`,
  :class:`QDQQuant`).
* :mod:`.conv`, :mod:`.lowering` — conv2d / conv_transpose2d geometry, im2col and the GEMM
  view replay uses.
* :mod:`.operands` — a layer's operands quantized in the model's own layout and lowered
  (per-tap channel blocks), and the exact ideal result; :mod:`.replay` — replay through units.
* :mod:`.network` — running a sequential network recipe end to end.
* :mod:`.capture_torch` (``from mxsim.trace.capture_torch import capture_torch``, needs
  ``mxsim[torch]``) and :mod:`.onnx_import` (``from mxsim.trace.onnx_import import
  capture_onnx``, needs ``mxsim[onnx]``; built on :mod:`.onnx_graph`, the graph executor,
  :mod:`.onnx_layers`, which nodes are layers, :mod:`.onnx_qdq`, QDQ matching, and
  :mod:`.onnx_quark`, Quark's quantizer ops): not imported here, so ``import mxsim.trace``
  never needs torch or onnx.
"""

from .conv import (
    Conv2dGeometry,
    ConvTranspose2dGeometry,
    conv2d_direct,
    conv2d_im2col,
    conv_transpose2d_direct,
    conv_transpose2d_im2col,
    im2col,
)
from .io import load_trace, save_trace
from .lowering import GemmShape, gemm_axis, gemm_reference, gemm_shape, lift_output, lower_input, lower_weight
from .model import FORMAT_VERSION, Layer, Network, Trace
from .network import accuracy, float_layer, layer_with_input, run_network
from .quant import BFPQuant, MXQuant, QDQQuant

__all__ = [
    "FORMAT_VERSION",
    "BFPQuant",
    "Conv2dGeometry",
    "ConvTranspose2dGeometry",
    "GemmShape",
    "Layer",
    "MXQuant",
    "Network",
    "QDQQuant",
    "Trace",
    "accuracy",
    "conv2d_direct",
    "conv2d_im2col",
    "conv_transpose2d_direct",
    "conv_transpose2d_im2col",
    "float_layer",
    "gemm_axis",
    "gemm_reference",
    "gemm_shape",
    "im2col",
    "layer_with_input",
    "lift_output",
    "load_trace",
    "lower_input",
    "lower_weight",
    "run_network",
    "save_trace",
]

