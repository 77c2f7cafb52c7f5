"""Run a trace's network end to end, with a pluggable layer computation.

Replay computes each captured layer through a hardware datapath; this module only walks the
recipe (:class:`mxsim.trace.model.Network`): layer steps call ``layer_fn(layer, x)`` on
the running value, op steps (``relu``, ``flatten``, ``identity``) are applied in numpy.
A network rebuilt from ``network.model`` (a language model) runs in PyTorch, with its
matmuls on a unit: :func:`mxsim.inloop.network.perplexity`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import MxsimError
from ..trace.model import Layer, Trace
from .lowering import gemm_view


def layer_with_input(layer: Layer, x: np.ndarray, output_shape: tuple | None = None) -> Layer:
    """A copy of ``layer`` whose input is ``x`` (the batch may differ): weights, bias, attrs
    and specs kept, the recorded input_quantized dropped and the output replaced by zeros of
    the new shape (``output_shape`` when the caller has worked it out), so that the lowering
    helpers apply to ``x``."""
    tensors = {
        k: v for k, v in layer.tensors.items() if k not in ("input", "input_quantized", "output")
    }
    tensors["input"] = x
    if output_shape is None:
        output_shape = gemm_view(layer, x.shape).output_shape
    tensors["output"] = np.zeros(output_shape, dtype=np.float64)
    return Layer(
        layer.name,
        layer.op,
        tensors,
        layer.attrs,
        layer.quant,
        layer.source,
        layer.codes_only - {"input"},
    )


def float_layer(layer: Layer, x: np.ndarray) -> np.ndarray:
    """The layer applied to ``x`` with its float weights and bias, through the GEMM view in
    float64 (the default ``layer_fn`` of :func:`run_network`)."""
    view = gemm_view(layer, x.shape)
    a = view.lower_input(x).astype(np.float64)
    b = view.lower_weight(layer.weight).astype(np.float64)
    bias = None if layer.bias is None else layer.bias.astype(np.float64)
    return view.lift(np.matmul(a, b.transpose(0, 2, 1)), bias)


def run_network(
    trace: Trace,
    inputs: np.ndarray | None = None,
    layer_fn: Callable[[Layer, np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """Run ``trace.network`` on ``inputs`` (default: its dataset input array) and return the
    last value. ``layer_fn(layer, x)`` computes a layer step (default :func:`float_layer`)."""
    network = trace.network
    if network is None:
        raise MxsimError(
            f"trace {trace.name!r} has no network recipe (only per-layer replay is possible)"
        )
    if inputs is None:
        inputs = trace.dataset[network.input]
    layer_fn = layer_fn or float_layer
    x = np.asarray(inputs)
    for step in network.steps:
        if "layer" in step:
            x = np.asarray(layer_fn(trace.layer(step["layer"]), x))
        elif step["op"] == "relu":
            x = np.maximum(x, 0)
        elif step["op"] == "flatten":
            start = step.get("start_dim", 1)
            x = x.reshape(x.shape[:start] + (-1,))
        elif step["op"] != "identity":
            raise MxsimError(f"unknown network op {step['op']!r}")
    return x


def accuracy(
    trace: Trace, layer_fn: Callable[[Layer, np.ndarray], np.ndarray] | None = None
) -> float:
    """Top-1 accuracy of the network on its dataset: argmax of the last value vs the labels."""
    network = trace.network
    if network is None or network.labels is None:
        raise MxsimError(f"trace {trace.name!r} has no network with labels")
    logits = run_network(trace, layer_fn=layer_fn)
    labels = trace.dataset[network.labels]
    return float(np.mean(np.argmax(logits.reshape(len(labels), -1), axis=1) == labels))
