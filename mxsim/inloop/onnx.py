"""An ONNX model run with its MatMul / Gemm / Conv / ConvTranspose nodes computed by an mxsim unit
(``mxsim[onnx]``).

The graph runs on the capture's executor (:mod:`mxsim.capture.onnx_graph`): onnxruntime for
every other node (graph optimizations off), Quark's custom quantizers emulated in numpy, and
each matmul node computed between onnxruntime stages: the node is first run alone by
onnxruntime for its float output (its shape, and the check that the layer view is right),
then lowered to a trace layer like capture does and computed by
:func:`mxsim.replay.run.run_layer` on the unit. The result (float64, bias added in float64:
``Conv``'s B, ``Gemm``'s ``beta * C``) is rounded to the node output's dtype. Quantizer nodes
of the model (QDQ, Quark) run as usual before the node, so the unit re-quantizes the values
they produced into its own formats. Einsum and nodes capture would skip run in onnxruntime.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .._optional import require
from ..capture.onnx_graph import STANDARD_DOMAINS, Graph, attributes, check_feeds, load_model, run_graph
from ..capture.onnx_layers import IDENTITY, Skip, layer_views
from ..capture.onnx_quark import QUARK_DOMAINS, quark_node_function
from ..errors import MxsimError
from ..replay.run import run_layer
from ..trace.model import Layer
from .torch import _unit, check_scaling

UNIT_OP_TYPES = ("MatMul", "Gemm", "Conv", "ConvTranspose")


def _node_alone(node, operands: list) -> np.ndarray:
    """``node`` run by itself in onnxruntime on ``operands``."""
    onnx = require("onnx")
    ort = require("onnxruntime")
    names = [name for name in node.input if name]
    inputs = [onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
              for name, value in zip(node.input, operands) if name]
    graph = onnx.helper.make_graph([node], "node", inputs, [onnx.ValueInfoProto(name=node.output[0])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)], ir_version=10)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {name: value for name, value in zip(node.input, operands) if name}
    return session.run(None, {name: feeds[name] for name in names})[0]


def run_onnx_on_unit(model, inputs: Mapping[str, np.ndarray], hw, *, a_format: str | None = None,
                     b_format: str | None = None, out_format: str | None = None, scaling: str = "auto",
                     outputs=None, bfp_kernel: str = "cpu") -> dict[str, np.ndarray]:
    """Run ``model`` on ``inputs`` with every float MatMul/Gemm/Conv/ConvTranspose node
    computed by the unit ``hw``; return the graph outputs (or the values named in ``outputs``).

    ``model``, ``inputs``, ``bfp_kernel``: as for :func:`mxsim.capture.onnx.capture_onnx`;
    ``hw``, ``a_format``, ``b_format``, ``out_format``, ``scaling``: as for
    :func:`mxsim.inloop.torch_unit` (A is the node's first operand, B its second).
    """
    hw = _unit(hw)
    per_tensor_scale = check_scaling(scaling)
    proto, _ = load_model(model, "run_onnx_on_unit")
    g = Graph(proto)
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
            out = _node_alone(node, operands)
            if x.dtype.kind != "f" or w.dtype.kind != "f":
                return out
            node_attrs = attributes(node)
            try:
                op, attrs, views, _ = layer_views(node, node_attrs, x, w, out, False)
            except Skip:
                return out
            tensors = {role: views.get(role, IDENTITY).array(value)
                       for role, value in (("input", x), ("weight", w), ("output", out))}
            layer = Layer(node.name or node.op_type, op, tensors, attrs)
            values = run_layer(layer, hw, element_format=a_format, weight_format=b_format,
                               per_tensor_scale=per_tensor_scale, out_format=out_format, with_ideal=False).values
            values = values.reshape(out.shape)  # output views only insert unit axes
            if bias is not None:
                if node.op_type == "Gemm":
                    values = values + float(node_attrs.get("beta", 1.0)) * bias.astype(np.float64)
                else:
                    values = values + bias.astype(np.float64).reshape((1, -1) + (1,) * (out.ndim - 2))
            return values.astype(out.dtype)

        return compute

    wanted = set(outputs) if outputs is not None else set(g.outputs)
    unknown = wanted - set(g.producer) - set(g.constants) - set(feeds)
    if unknown:
        raise MxsimError(f"run_onnx_on_unit: the graph has no values {sorted(unknown)}")
    values = run_graph(g, feeds, wanted, unit_node, QUARK_DOMAINS)
    return {name: values[name] for name in (outputs if outputs is not None else g.outputs)}
