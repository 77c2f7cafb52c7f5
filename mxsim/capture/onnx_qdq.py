"""Which quantizer feeds a GEMM operand of an ONNX graph, and the QDQ spec it applies.

An operand is traced back through its producer: ``QuantizeLinear`` -> ``DequantizeLinear``
(per-tensor, per-axis or blocked) gives :class:`~mxsim.trace.quant.QDQQuant` with the float
tensor entering QuantizeLinear as the operand; a ``DequantizeLinear`` of a stored integer
tensor (no QuantizeLinear) gives the dequantized tensor as the operand, with its QDQ spec;
a Quark quantizer node (:mod:`.onnx_quark`) gives the tensor entering it.
"""

from __future__ import annotations

import numpy as np

from ..trace.quant import QDQ_FLOAT_TYPES, QDQ_INTEGER_RANGES, QDQQuant
from .onnx_graph import STANDARD_DOMAINS, Graph, attributes
from .onnx_quark import is_quark

#: ONNX TensorProto data types -> the names QDQQuant takes.
_QDQ_TYPE_NAMES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    17: "float8e4m3fn",
    18: "float8e4m3fnuz",
    19: "float8e5m2",
    20: "float8e5m2fnuz",
    21: "uint4",
    22: "int4",
    23: "float4e2m1",
    24: "float8e8m0",
    25: "uint2",
    26: "int2",
}


class Operand:
    """Where one GEMM operand comes from: the float tensor, the quantized tensor, how."""

    def __init__(self, value: str, quantized: str | None = None, kind: str | None = None, nodes=()):
        self.value = value
        self.quantized = quantized
        self.kind = kind  # None, "quark", "qdq"
        self.nodes = list(nodes)  # the quantizer node(s), nearest the layer first

    def names(self) -> set[str]:
        out = {self.value}
        if self.quantized:
            out.add(self.quantized)
        if self.kind == "qdq":
            for node in self.nodes:
                out.update(i for i in node.input[1:] if i)
        return out


def trace_operand(g: Graph, name: str) -> Operand:
    """Where the operand ``name`` comes from: its quantizer node(s), if any."""
    producer = g.producer.get(name)
    if producer is None:
        return Operand(name)
    if is_quark(producer):
        return Operand(producer.input[0], name, "quark", [producer])
    if producer.op_type == "DequantizeLinear" and producer.domain in STANDARD_DOMAINS:
        quantize = g.producer.get(producer.input[0])
        if (
            quantize is not None
            and quantize.op_type == "QuantizeLinear"
            and quantize.domain in STANDARD_DOMAINS
        ):
            return Operand(quantize.input[0], name, "qdq", [producer, quantize])
        return Operand(name, None, "qdq", [producer])
    return Operand(name)


def _qdq_type(g: Graph, dq, q) -> str:
    zero_name = dq.input[2] if len(dq.input) > 2 and dq.input[2] else None
    if zero_name and zero_name in g.constant_protos:
        return _QDQ_TYPE_NAMES.get(g.constant_protos[zero_name].data_type, "unknown")
    if q is not None:
        output_dtype = attributes(q).get("output_dtype", 0)
        if output_dtype:
            return _QDQ_TYPE_NAMES.get(output_dtype, "unknown")
    if q is None and dq.input[0] in g.constant_protos:
        return _QDQ_TYPE_NAMES.get(g.constant_protos[dq.input[0]].data_type, "unknown")
    return "uint8"  # ONNX QuantizeLinear default without a zero point


def qdq_spec(
    g: Graph, operand: Operand, values: dict, rank: int
) -> tuple[QDQQuant | None, str | None]:
    """The QDQ spec of an operand, or (None, why not)."""
    dq = operand.nodes[0]
    q = operand.nodes[1] if len(operand.nodes) > 1 else None
    dtype = _qdq_type(g, dq, q)
    if dtype not in QDQ_INTEGER_RANGES and dtype not in QDQ_FLOAT_TYPES:
        return None, f"quantized type {dtype} is not recognised"
    scale = np.asarray(values[dq.input[1]])
    zero_name = dq.input[2] if len(dq.input) > 2 and dq.input[2] else None
    zero = None if zero_name is None else np.asarray(values[zero_name])
    if q is not None:
        q_scale = np.asarray(values[q.input[1]])
        q_zero_name = q.input[2] if len(q.input) > 2 and q.input[2] else None
        q_zero = None if q_zero_name is None else np.asarray(values[q_zero_name])
        zero_values = np.zeros(1) if zero is None else zero.astype(np.float64)
        q_zero_values = np.zeros(1) if q_zero is None else q_zero.astype(np.float64)
        try:
            same_zero = np.array_equal(*np.broadcast_arrays(zero_values, q_zero_values))
        except ValueError:  # shapes that do not even broadcast
            same_zero = False
        if not np.array_equal(scale, q_scale) or not same_zero:
            return None, "QuantizeLinear and DequantizeLinear parameters differ"
    attrs = attributes(dq)
    block_size = int(attrs.get("block_size", 0))
    per_tensor = scale.size == 1 and block_size == 0
    axis = None if per_tensor else int(attrs.get("axis", 1)) % rank
    if zero is not None:
        zero = zero.astype(np.float32) if dtype in QDQ_FLOAT_TYPES else zero.astype(np.int64)
    saturate = bool(attributes(q).get("saturate", 1)) if q is not None else True
    return QDQQuant(
        dtype,
        scale.astype(np.float32) if scale.dtype != np.float64 else scale,
        zero,
        axis,
        block_size,
        saturate,
    ), None
