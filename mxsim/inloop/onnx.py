"""An ONNX model run with its MatMul / Gemm / Conv / ConvTranspose nodes computed by an mxsim unit
(``mxsim[onnx]``).

The graph runs on the capture's executor (:mod:`mxsim.capture.onnx_graph`): onnxruntime for
every other node (graph optimizations off), Quark's custom quantizers emulated in numpy, and
each matmul node computed between onnxruntime stages: a convolution is first run alone by
onnxruntime for its float output (its shape, and the check that the layer view is right; a
MatMul's or Gemm's output shape follows from its operands' and is not run), then lowered to
a trace layer like capture does and computed by
:func:`mxsim.replay.layer.run_layer` on the unit. The result (float64, bias added in float64:
``Conv``'s B, ``Gemm``'s ``beta * C``) is rounded to the node output's dtype. Quantizer nodes
of the model (QDQ, Quark) run as usual before the node, so the unit re-quantizes the values
they produced into its own formats. Einsum and nodes capture would skip run in onnxruntime.

A model file's graph, its stages and their onnxruntime sessions (one thread each) are kept
in memory and reused while the file is unchanged
(:func:`mxsim.capture.onnx_graph.load_graph`), so a second run of the same file only runs
the sessions and the unit; a ModelProto is prepared anew on every call. The unit's
quantizations of a node's constant weight (an initializer or Constant node) are kept with the
graph too, so a file's weights are quantized on its first run only.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .._optional import require
from ..capture.onnx_graph import (
    STANDARD_DOMAINS,
    Graph,
    attributes,
    check_feeds,
    load_graph,
    run_graph,
)
from ..capture.onnx_layers import IDENTITY, Skip, layer_views
from ..capture.onnx_quark import QUARK_DOMAINS, quark_node_function
from ..errors import MxsimError
from ..trace.model import Layer
from .torch import _unit, check_scaling, layer_on_unit

UNIT_OP_TYPES = ("MatMul", "Gemm", "Conv", "ConvTranspose")


def _node_alone(g: Graph, node, operands: list) -> np.ndarray:
    """``node`` run by itself in onnxruntime on ``operands`` (its session kept in ``g``)."""
    onnx = require("onnx")
    named = [(name, value) for name, value in zip(node.input, operands) if name]
    key = ("node alone", id(node), tuple(value.dtype for _, value in named))
    if key not in g.sessions:
        inputs = [
            onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(value.dtype), None
            )
            for name, value in named
        ]
        graph = onnx.helper.make_graph(
            [node], "node", inputs, [onnx.ValueInfoProto(name=node.output[0])]
        )
        g.sessions[key] = g.session(
            onnx.helper.make_model(
                graph, opset_imports=[onnx.helper.make_opsetid("", 21)], ir_version=10
            )
        )
    return g.sessions[key].run(None, dict(named))[0]


def _output_template(node, node_attrs: dict, x: np.ndarray, w: np.ndarray) -> np.ndarray | None:
    """An array of the shape and dtype of a float MatMul's or Gemm's output (numpy's matmul
    shapes, which ONNX's are; its values are not read: the unit computes them), without
    running the node; None for other nodes and for operands numpy refuses (then onnxruntime
    runs the node and says what is wrong)."""
    if node.op_type == "Gemm":
        if x.ndim != 2 or w.ndim != 2:
            return None
        x = x.T if node_attrs.get("transA", 0) else x
        w = w.T if node_attrs.get("transB", 0) else w
    elif node.op_type != "MatMul":
        return None
    if x.ndim == 0 or w.ndim == 0:
        return None
    rows = (1,) + x.shape if x.ndim == 1 else x.shape  # a 1-d operand is promoted, then dropped
    columns = w.shape + (1,) if w.ndim == 1 else w.shape
    try:
        batch = np.broadcast_shapes(rows[:-2], columns[:-2])
    except ValueError:
        return None
    if rows[-1] != columns[-2]:
        return None
    shape = batch + (rows[-2],) * (x.ndim > 1) + (columns[-1],) * (w.ndim > 1)
    return np.empty(shape, dtype=x.dtype)


def run_onnx_on_unit(
    model,
    inputs: Mapping[str, np.ndarray],
    hw,
    *,
    a_format: str | None = None,
    b_format: str | None = None,
    out_format: str | None = None,
    scaling: str = "auto",
    outputs=None,
    bfp_kernel: str = "cpu",
) -> dict[str, np.ndarray]:
    """Run ``model`` on ``inputs`` with every float MatMul/Gemm/Conv/ConvTranspose node
    computed by the unit ``hw``; return the graph outputs (or the values named in ``outputs``).

    ``model``, ``inputs``, ``bfp_kernel``: as for :func:`mxsim.capture.onnx.capture_onnx`;
    ``hw``, ``a_format``, ``b_format``, ``out_format``, ``scaling``: as for
    :func:`mxsim.inloop.torch_unit` (A is the node's first operand, B its second).
    """
    hw = _unit(hw)
    per_tensor_scale = check_scaling(scaling)
    g = load_graph(model, "run_onnx_on_unit")
    feeds = check_feeds(g, inputs, "run_onnx_on_unit")
    quark_node = quark_node_function(bfp_kernel)

    def unit_node(node):
        quark = quark_node(node)
        if quark is not None:
            return quark
        if node.op_type not in UNIT_OP_TYPES or node.domain not in STANDARD_DOMAINS:
            return None

        def compute(operands):
            x, w = operands[0], operands[1]
            bias = operands[2] if len(operands) > 2 else None
            if x.dtype.kind != "f" or w.dtype.kind != "f":
                return _node_alone(g, node, operands)
            node_attrs = attributes(node)
            out = _output_template(node, node_attrs, x, w)
            if out is None:
                out = _node_alone(g, node, operands)
            try:
                op, attrs, views, _ = layer_views(node, node_attrs, x, w, out, False)
            except Skip:
                return out
            tensors = {
                role: views.get(role, IDENTITY).array(value)
                for role, value in (("input", x), ("weight", w), ("output", out))
            }
            layer = Layer(node.name or node.op_type, op, tensors, attrs)
            kept = (
                None  # a constant weight's quantizations are kept with the graph (it never changes)
            )
            if g.is_constant(node.input[1]) and w is g.constants[node.input[1]]:
                kept = g.weight_quantizations.setdefault((node.input[1], id(node)), {})
            values = layer_on_unit(
                layer, hw, a_format, b_format, per_tensor_scale, out_format, kept
            )
            values = values.reshape(out.shape)  # output views only insert unit axes
            if bias is not None:
                if node.op_type == "Gemm":
                    values = values + float(node_attrs.get("beta", 1.0)) * bias.astype(np.float64)
                else:
                    values = values + bias.astype(np.float64).reshape(
                        (1, -1) + (1,) * (out.ndim - 2)
                    )
            return values.astype(out.dtype)

        return compute

    wanted = set(outputs) if outputs is not None else set(g.outputs)
    unknown = wanted - set(g.producer) - set(g.constants) - set(feeds)
    if unknown:
        raise MxsimError(f"run_onnx_on_unit: the graph has no values {sorted(unknown)}")
    values = run_graph(g, feeds, wanted, unit_node, QUARK_DOMAINS)
    return {name: values[name] for name in (outputs if outputs is not None else g.outputs)}
