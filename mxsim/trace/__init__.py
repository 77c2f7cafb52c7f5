"""Traces: the file format for what each matmul/conv layer of a real model sees.

* :mod:`.model` — :class:`Trace`, :class:`Layer`, :class:`Network` and the format's
  vocabulary; :mod:`.validate` — the rules a trace obeys; :mod:`.io` — the on-disk format
  (YAML manifest + NPZ): :func:`load_trace`, :func:`save_trace`.
* :mod:`.quant` — per-operand quantization specs (:class:`MXQuant`, :class:`BFPQuant`,
  :class:`QDQQuant`).
* :mod:`.reference` — a compact trace's float reference outputs as residuals from the
  exact MX product (:data:`REFERENCE_MODES`).
* :mod:`.conv` — conv2d / conv_transpose2d geometry (a conv layer's attributes), im2col and
  direct reference convolutions.

Traces are made by :mod:`mxsim.capture` and consumed by :mod:`mxsim.replay`; this package
imports neither.
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
from .model import FORMAT_VERSION, Layer, Network, Trace
from .quant import BFPQuant, MXQuant, NVFP4Quant, QDQQuant
from .reference import REFERENCE_MODES

__all__ = [
    "FORMAT_VERSION",
    "BFPQuant",
    "Conv2dGeometry",
    "ConvTranspose2dGeometry",
    "Layer",
    "MXQuant",
    "Network",
    "NVFP4Quant",
    "QDQQuant",
    "REFERENCE_MODES",
    "Trace",
    "conv2d_direct",
    "conv2d_im2col",
    "conv_transpose2d_direct",
    "conv_transpose2d_im2col",
    "im2col",
    "load_trace",
    "save_trace",
]
