"""Capture: traces (:mod:`mxsim.trace`) recorded from real models.

* :mod:`.torch` — :func:`~mxsim.capture.torch.capture_torch` (``mxsim[torch]``): every matmul
  and convolution a PyTorch model runs, intercepted at the call and at ATen.
* :mod:`.onnx` — :func:`~mxsim.capture.onnx.capture_onnx` (``mxsim[onnx]``), built on
  :mod:`.onnx_graph`, the graph executor, :mod:`.onnx_layers`, which nodes are layers,
  :mod:`.onnx_qdq`, QDQ matching, and :mod:`.onnx_quark`, Quark's quantizer ops.

Nothing is imported here, so ``import mxsim.capture`` never needs torch or onnx.
"""
