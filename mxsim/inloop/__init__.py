"""Run whole models with every matmul and convolution computed by an mxsim unit.

:func:`torch_unit` (``mxsim[torch]``) for PyTorch models, :func:`run_onnx_on_unit`
(``mxsim[onnx]``) for ONNX graphs. Each intercepted layer is computed by
:func:`mxsim.replay.run_layer`: its GEMM view is quantized (the layer's recorded
spec if the unit can run it, else the caller's formats, else the unit's first format;
one power-of-two scale per operand tensor on units without block scales) and every output
bit comes from :func:`mxsim.matmul`. :mod:`.network` rebuilds a trace's language model and
gives its perplexity (the end to end :func:`mxsim.replay.replay` takes as ``perplexity_fn``).

This package sits on top of capture (interception, the ONNX executor) and replay (the
per-layer computation); neither imports it.
"""

from .onnx import run_onnx_on_unit
from .torch import UnitInLoop, torch_unit

__all__ = ["UnitInLoop", "run_onnx_on_unit", "torch_unit"]
