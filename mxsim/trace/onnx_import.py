"""Capture an ONNX model's MatMul / Gemm / Conv / ConvTranspose / Einsum layers into a trace (``mxsim[onnx]``).

:func:`capture_onnx` runs the model with onnxruntime on the given inputs and records, for every
MatMul, Gemm, 1-d/2-d Conv and ConvTranspose and two-operand Einsum node: the operands, the
bias, and the output, plus the quantization spec of each operand as the model itself applies
it (other matmul-like nodes are listed in ``source.skipped``):

* ``QuantizeLinear`` → ``DequantizeLinear`` feeding an operand (per-tensor, per-axis or
  blocked) → :class:`~mxsim.trace.quant.QDQQuant`; the operand recorded is the float tensor
  entering QuantizeLinear. A ``DequantizeLinear`` of a stored integer tensor (no
  QuantizeLinear) records the dequantized tensor as the operand, with its QDQ spec.
* Quark's custom ops (domain ``com.amd.quark``, or the legacy ``com.vai.quantize`` names
  ``MXFixNeuron``/``BFPFixNeuron``): ``MXQuantizeDequantize`` → :class:`MXQuant` with the
  ``quark-onnx`` profile; ``BFPQuantizeDequantize`` → :class:`BFPQuant`.

How the custom ops run without Quark's library (onnxruntime cannot load them): the graph is
cut at every custom node. Each custom node gets a *stage*: one more than the stage of its
input; every other node runs in the stage of its latest input. Stage 0 runs first as its own
onnxruntime session (a sub-model holding only that stage's nodes, with every value that
later stages need added as graph outputs); then the custom nodes whose input was produced in
that stage are evaluated in numpy with mxsim's quantizers (:func:`mxsim.fake_quantize` for MX,
:func:`mxsim.quantize_bfp` for BFP); their outputs feed the next stage's session as graph
inputs; and so on. Custom nodes whose input is a constant (weights) are evaluated once before
any session. Every node therefore runs exactly once, and intermediate values are exact
onnxruntime (or mxsim) results. Graph optimizations are disabled (``ORT_DISABLE_ALL``) so each
node computes its own op, unfused.

Recorded per layer: ``<operand>`` is the float value before the model's quantizer,
``<operand>_quantized`` the value the node consumed (only when a spec was found), ``output``
the node's result (the following ``Add`` of a constant bias is fused into a MatMul layer).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..errors import CaptureWarning, InputFileError, MxsimError, UnknownNameError
from ..fileio import read_npz
from ..limits import check_path
from ..formats import get_format
from ..quantize import BFPSpec
from ._optional import require
from .format import NUMERIC_DTYPES, Layer, Trace, validate_trace
from .quant import QDQ_FLOAT_TYPES, QDQ_INTEGER_RANGES, BFPQuant, MXQuant, QDQQuant

QUARK_DOMAINS = ("com.amd.quark", "com.vai.quantize")
MX_OP_TYPES = ("MXQuantizeDequantize", "MXFixNeuron")
BFP_OP_TYPES = ("BFPQuantizeDequantize", "BFPFixNeuron")
LAYER_OP_TYPES = ("MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum")
#: Words in the op type of nodes (any domain) that multiply matrices: such a node that is not
#: captured as a layer is listed in ``source.skipped`` (MatMulInteger, QLinearConv, LSTM,
#: com.microsoft Attention, ...).
GEMM_LIKE_WORDS = ("MatMul", "Gemm", "Conv", "Attention", "LSTM", "GRU", "RNN", "Einsum")
STANDARD_DOMAINS = ("", "ai.onnx")

#: Quark ``MXQuantizeDequantize.rounding_mode`` -> mxsim element rounding; Quark applies it to
#: int8 elements only (fp elements always round half to even; docs/profiles.md).
QUARK_INT8_ROUNDING = {0: "nearest_away", 1: "nearest_toward_positive", 2: "nearest_even"}
#: Attribute defaults of Quark's custom ops (Quark's op documentation / custom_op_*.h).
MX_DEFAULTS = {"element_dtype": "int8", "axis": 1, "block_size": 32, "rounding_mode": 0}
BFP_DEFAULTS = {"bfp_method": "to_bfp", "axis": 1, "bit_width": 16, "block_size": 8, "rounding_mode": 0,
                "sub_block_size": 2, "sub_block_shift_bits": 1, "convert_to_bfloat_before_bfp": 0,
                "use_compiler_version_cpu_kernel": 0}


def _attributes(node) -> dict:
    onnx = require("onnx")
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _decode(value):
    return value.decode() if isinstance(value, bytes) else value


def _is_quark(node) -> bool:
    return node.domain in QUARK_DOMAINS and node.op_type in MX_OP_TYPES + BFP_OP_TYPES


def quark_spec(node, rank: int, bfp_kernel: str = "cpu") -> MXQuant | BFPQuant:
    """The mxsim spec equivalent to a Quark MX/BFP custom node applied to a rank-``rank`` tensor.

    MX: ``element_dtype`` -> format, ``axis`` (rank 1: 0), ``block_size``; profile
    ``quark-onnx``; ``rounding_mode`` sets the int8 element rounding (0 half away, 1 half
    toward +inf, 2 half even) and is ignored for fp elements, as Quark does. BFP:
    ``bfp_method`` (``to_bfp_prime_shared`` read as ``to_bfp_prime``), ``bit_width``,
    ``block_size``, ``sub_block_size``, ``sub_block_shift_bits`` (``to_bfp`` has none),
    ``rounding_mode``; ``bfp_kernel`` picks whose kernel semantics (cpu or cuda) to reproduce.
    Both bypass one-element tensors like Quark's op wrapper.
    """
    where = f"node {node.name!r} ({node.domain}::{node.op_type})"
    mx = node.op_type in MX_OP_TYPES
    defaults = MX_DEFAULTS if mx else BFP_DEFAULTS
    attrs = {**defaults, **{k: _decode(v) for k, v in _attributes(node).items()}}
    unknown = set(attrs) - set(defaults)
    if unknown:
        raise MxsimError(f"{where}: unknown attribute(s) {sorted(unknown, key=str)}")
    axis = attrs["axis"]
    if rank == 1:
        axis = 0  # Quark: "when the rank of the input is 1, the axis ... is fixed to 0"
    elif not -rank <= axis < rank:
        raise MxsimError(f"{where}: axis {axis} is out of range for a rank-{rank} input")
    axis %= rank
    try:
        if mx:
            fmt = get_format(attrs["element_dtype"])
            rounding = attrs["rounding_mode"]
            if rounding not in QUARK_INT8_ROUNDING:
                raise MxsimError(f"rounding_mode must be 0, 1 or 2, got {rounding!r}")
            options = {"element_rounding": QUARK_INT8_ROUNDING[rounding]} if fmt.name == "int8" else {}
            return MXQuant(fmt.name, axis, attrs["block_size"], "quark-onnx", options, bypass_single_element=True)
        if attrs["convert_to_bfloat_before_bfp"]:
            raise MxsimError("convert_to_bfloat_before_bfp=1 is not modelled by mxsim")
        if attrs["use_compiler_version_cpu_kernel"]:
            raise MxsimError("use_compiler_version_cpu_kernel=1 is not modelled by mxsim")
        method = "to_bfp_prime" if attrs["bfp_method"] == "to_bfp_prime_shared" else attrs["bfp_method"]
        if method == "to_bfp":  # Quark ignores the sub-block attributes for plain BFP
            sub, shift = attrs["block_size"], 0
        else:
            sub, shift = attrs["sub_block_size"], attrs["sub_block_shift_bits"]
        spec = BFPSpec(method, attrs["bit_width"], attrs["block_size"], sub, shift, attrs["rounding_mode"], bfp_kernel)
        return BFPQuant(spec, axis, bypass_single_element=True)
    except (MxsimError, UnknownNameError) as error:
        raise MxsimError(f"{where}: {error}") from None


def _evaluate_quark(node, x: np.ndarray, bfp_kernel: str) -> np.ndarray:
    """Quark's custom op on ``x`` with mxsim's quantizers; float16 goes through float32, as Quark does.

    A tensor of one element (rank 0 included, e.g. hardswish's constants 3 and 6) passes
    through unchanged, as Quark's runtime passes it."""
    if x.dtype not in (np.float32, np.float16):
        raise MxsimError(f"node {node.name!r} ({node.op_type}): input must be float32 or float16, got {x.dtype}")
    if x.size == 1:
        quark_spec(node, max(x.ndim, 1), bfp_kernel)  # attributes are still checked
        return x.copy()
    spec = quark_spec(node, x.ndim, bfp_kernel)
    return np.asarray(spec.fake_quantize(x.astype(np.float32))).astype(x.dtype)


def _constant_node_value(node):
    onnx = require("onnx")
    numpy_helper = onnx.numpy_helper
    attrs = {a.name: a for a in node.attribute}
    if "value" in attrs:
        return numpy_helper.to_array(attrs["value"].t), attrs["value"].t
    value = _attributes(node)
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in value:
            array = np.array(value[key], dtype=dtype)
            return array, numpy_helper.from_array(array, node.output[0])
    raise MxsimError(f"Constant node {node.name!r}: only value/value_float(s)/value_int(s) are supported")


def _subgraph_references(graph) -> set[str]:
    """Names a subgraph reads from enclosing scopes."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    used = set()
    for node in graph.node:
        used.update(i for i in node.input if i)
        used.update(_implicit_inputs(node))
        defined.update(node.output)
    return used - defined


def _implicit_inputs(node) -> set[str]:
    onnx = require("onnx")
    names = set()
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            names |= _subgraph_references(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for graph in attr.graphs:
                names |= _subgraph_references(graph)
    return names


def _node_inputs(node) -> list[str]:
    return [i for i in node.input if i] + sorted(_implicit_inputs(node))


class _Graph:
    """The model with Constant nodes folded into constants, and its producer/consumer maps."""

    def __init__(self, model):
        onnx = require("onnx")
        graph = model.graph
        self.model = model
        self.constants: dict[str, np.ndarray] = {}
        self.constant_protos: dict = {}
        for tensor in graph.initializer:
            self.constants[tensor.name] = onnx.numpy_helper.to_array(tensor)
            self.constant_protos[tensor.name] = tensor
        self.nodes = []
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in STANDARD_DOMAINS:
                value, proto = _constant_node_value(node)
                self.constants[node.output[0]] = value
                proto = onnx.TensorProto.FromString(proto.SerializeToString())
                proto.name = node.output[0]
                self.constant_protos[node.output[0]] = proto
            else:
                self.nodes.append(node)
        self.inputs = [i for i in graph.input if i.name not in self.constants]
        self.outputs = [o.name for o in graph.output]
        self.producer = {o: n for n in self.nodes for o in n.output if o}
        self.consumers: dict[str, list] = {}
        for node in self.nodes:
            for name in _node_inputs(node):
                self.consumers.setdefault(name, []).append(node)

    def is_constant(self, name: str) -> bool:
        return name in self.constants


def _elem_type(array: np.ndarray) -> int:
    onnx = require("onnx")
    return onnx.helper.np_dtype_to_tensor_dtype(array.dtype)


def _run_stages(g: _Graph, feeds: dict[str, np.ndarray], wanted: set[str], bfp_kernel: str,
                python_nodes=None) -> dict[str, np.ndarray]:
    """Run the graph (see the module docstring) and return every value in ``wanted``.

    ``python_nodes``: None, or ``callable(node) -> None | callable(inputs) -> output``: a
    node for which it returns a function is computed by that function (on its input arrays,
    an empty input as None) between stages, like Quark's custom ops, instead of by onnxruntime."""
    onnx = require("onnx")
    ort = require("onnxruntime")
    values: dict[str, np.ndarray] = dict(feeds)
    stage: dict[str, int] = {name: 0 for name in feeds}
    stage_nodes: dict[int, list] = {}
    custom_after: dict[int, list] = {}
    evaluators: dict[int, object] = {}
    for node in g.nodes:
        inputs = _node_inputs(node)
        for name in inputs:
            if name not in stage and not g.is_constant(name):
                raise MxsimError(f"node {node.name!r} ({node.op_type}) reads {name!r}, which no earlier node, "
                                 "graph input or initializer defines (is the graph topologically sorted?)")
        if node.domain in QUARK_DOMAINS and not _is_quark(node):
            raise MxsimError(f"node {node.name!r}: {node.domain}::{node.op_type} needs Quark's custom-op library "
                             "and is not emulated by mxsim (supported: MXQuantizeDequantize, BFPQuantizeDequantize)")
        if _is_quark(node) and all(g.is_constant(i) for i in inputs):
            # weights: quantize once, the result becomes a constant
            result = _evaluate_quark(node, g.constants[node.input[0]], bfp_kernel)
            g.constants[node.output[0]] = result
            g.constant_protos[node.output[0]] = onnx.numpy_helper.from_array(result, node.output[0])
            continue
        level = max([stage[i] for i in inputs if i in stage], default=0)
        computed_by = python_nodes(node) if python_nodes is not None and not _is_quark(node) else None
        if computed_by is not None:
            evaluators[id(node)] = computed_by
        if _is_quark(node) or computed_by is not None:
            custom_after.setdefault(level, []).append(node)
            stage[node.output[0]] = level + 1
        else:
            stage_nodes.setdefault(level, []).append(node)
            for name in node.output:
                if name:
                    stage[name] = level
    last = max(stage.values(), default=0)
    session_options = ort.SessionOptions()
    session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opsets = [o for o in g.model.opset_import if o.domain not in QUARK_DOMAINS]
    for level in range(last + 1):
        nodes = stage_nodes.get(level, [])
        if nodes:
            produced = [o for n in nodes for o in n.output if o]
            produced_set = set(produced)
            consumed = {i for n in nodes for i in _node_inputs(n)}
            later = set(wanted) | set(g.outputs)
            for other_level, other_nodes in stage_nodes.items():
                if other_level > level:
                    later.update(i for n in other_nodes for i in _node_inputs(n))
            for customs in custom_after.values():
                later.update(i for n in customs for i in _node_inputs(n))
            graph_inputs = sorted(consumed - produced_set - set(g.constants))
            sub_graph = onnx.helper.make_graph(
                nodes, f"{g.model.graph.name or 'graph'}_stage{level}",
                [onnx.helper.make_tensor_value_info(name, _elem_type(values[name]), values[name].shape)
                 for name in graph_inputs],
                [onnx.ValueInfoProto(name=name) for name in produced if name in later],
                initializer=[g.constant_protos[name] for name in sorted(consumed & set(g.constants))],
                value_info=[v for v in g.model.graph.value_info if v.name in produced_set],
            )
            sub_model = onnx.helper.make_model(sub_graph, opset_imports=opsets, ir_version=g.model.ir_version)
            sub_model.functions.extend(g.model.functions)
            output_names = [o.name for o in sub_graph.output]
            if output_names:
                try:
                    session = ort.InferenceSession(sub_model.SerializeToString(), session_options,
                                                   providers=["CPUExecutionProvider"])
                    results = session.run(output_names, {name: values[name] for name in graph_inputs})
                except Exception as error:  # onnxruntime raises its own exception types
                    raise MxsimError(f"onnxruntime failed on stage {level} of the graph: {error}") from None
                values.update(zip(output_names, (np.asarray(r) for r in results)))
        for node in custom_after.get(level, []):
            operands = [None if not name else values[name] if name in values else g.constants[name]
                        for name in node.input]
            if id(node) in evaluators:
                values[node.output[0]] = np.asarray(evaluators[id(node)](operands))
            else:
                values[node.output[0]] = _evaluate_quark(node, operands[0], bfp_kernel)
    missing = [name for name in wanted if name not in values and not g.is_constant(name)]
    if missing:
        raise MxsimError(f"capture_onnx: values {missing} were not computed")
    return {name: values[name] if name in values else g.constants[name] for name in wanted}


_QDQ_TYPE_NAMES = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 17: "float8e4m3fn",
    18: "float8e4m3fnuz", 19: "float8e5m2", 20: "float8e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4e2m1",
    24: "float8e8m0", 25: "uint2", 26: "int2",
}


class _Operand:
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


def _trace_operand(g: _Graph, name: str) -> _Operand:
    producer = g.producer.get(name)
    if producer is None:
        return _Operand(name)
    if _is_quark(producer):
        return _Operand(producer.input[0], name, "quark", [producer])
    if producer.op_type == "DequantizeLinear" and producer.domain in STANDARD_DOMAINS:
        quantize = g.producer.get(producer.input[0])
        if quantize is not None and quantize.op_type == "QuantizeLinear" and quantize.domain in STANDARD_DOMAINS:
            return _Operand(quantize.input[0], name, "qdq", [producer, quantize])
        return _Operand(name, None, "qdq", [producer])
    return _Operand(name)


def _qdq_type(g: _Graph, dq, q) -> str:
    zero_name = dq.input[2] if len(dq.input) > 2 and dq.input[2] else None
    if zero_name and zero_name in g.constant_protos:
        return _QDQ_TYPE_NAMES.get(g.constant_protos[zero_name].data_type, "unknown")
    if q is not None:
        output_dtype = _attributes(q).get("output_dtype", 0)
        if output_dtype:
            return _QDQ_TYPE_NAMES.get(output_dtype, "unknown")
    if q is None and dq.input[0] in g.constant_protos:
        return _QDQ_TYPE_NAMES.get(g.constant_protos[dq.input[0]].data_type, "unknown")
    return "uint8"  # ONNX QuantizeLinear default without a zero point


def _qdq_spec(g: _Graph, operand: _Operand, values: dict, rank: int) -> tuple[QDQQuant | None, str | None]:
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
    attrs = _attributes(dq)
    block_size = int(attrs.get("block_size", 0))
    per_tensor = scale.size == 1 and block_size == 0
    axis = None if per_tensor else int(attrs.get("axis", 1)) % rank
    if zero is not None:
        zero = zero.astype(np.float32) if dtype in QDQ_FLOAT_TYPES else zero.astype(np.int64)
    saturate = bool(_attributes(q).get("saturate", 1)) if q is not None else True
    return QDQQuant(dtype, scale.astype(np.float32) if scale.dtype != np.float64 else scale, zero, axis,
                    block_size, saturate), None


def _conv_padding(attrs: dict, input_shape, weight_shape) -> list[list[int]]:
    """ONNX Conv pads / auto_pad as [[before, after] per spatial axis] ([[top, bottom], [left, right]] in 2-d)."""
    auto_pad = _decode(attrs.get("auto_pad", "NOTSET"))
    spatial = len(input_shape) - 2
    strides = list(attrs.get("strides", [1] * spatial))
    dilations = list(attrs.get("dilations", [1] * spatial))
    if auto_pad in ("NOTSET", ""):
        pads = [int(v) for v in attrs.get("pads", [0] * 2 * spatial)]
        return [[pads[i], pads[i + spatial]] for i in range(spatial)]
    if auto_pad == "VALID":
        return [[0, 0] for _ in range(spatial)]
    pairs = []
    for size, kernel, stride, dilation in zip(input_shape[2:], weight_shape[2:], strides, dilations):
        out = -(-size // stride)
        total = max(0, (out - 1) * stride + dilation * (kernel - 1) + 1 - size)
        small, large = total // 2, total - total // 2
        pairs.append([small, large] if auto_pad == "SAME_UPPER" else [large, small])
    return pairs


def _fused_bias(g: _Graph, node) -> tuple[object, str] | None:
    """A following ``Add`` of a constant bias (1-d or (1, ..., N)) to a MatMul's output."""
    consumers = g.consumers.get(node.output[0], [])
    if len(consumers) != 1 or node.output[0] in g.outputs:
        return None
    add = consumers[0]
    if add.op_type != "Add" or add.domain not in STANDARD_DOMAINS:
        return None
    other = [i for i in add.input if i != node.output[0]]
    if len(other) != 1 or not g.is_constant(other[0]):
        return None
    bias = g.constants[other[0]]
    if bias.ndim == 0 or any(d != 1 for d in bias.shape[:-1]):
        return None
    return add, other[0]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _plan_layers(g: _Graph, select):
    """(plans of the layers to capture, skipped entries of the matmul-like nodes that are not layers)."""
    plans, unplanned = [], []
    for index, node in enumerate(g.nodes):
        if select is not None and not select(node):
            continue
        if node.op_type not in LAYER_OP_TYPES or node.domain not in STANDARD_DOMAINS:
            if any(word in node.op_type for word in GEMM_LIKE_WORDS):
                unplanned.append({"name": node.name or f"{node.op_type}_{index}",
                                  "op": f"{node.domain}::{node.op_type}" if node.domain else node.op_type,
                                  "reason": "a matmul-like op that capture does not lower to a GEMM layer"})
            continue
        if node.op_type == "Einsum" and len(node.input) != 2:
            unplanned.append({"name": node.name or f"Einsum_{index}", "op": "Einsum",
                              "reason": f"{len(node.input)} operands (only two-operand contractions are layers)"})
            continue
        operands = {"input": _trace_operand(g, node.input[0]), "weight": _trace_operand(g, node.input[1])}
        output = node.output[0]
        fused = None
        if node.op_type in ("Gemm", "Conv", "ConvTranspose") and len(node.input) > 2 and node.input[2]:
            operands["bias"] = _trace_operand(g, node.input[2])
        elif node.op_type == "MatMul":
            fused = _fused_bias(g, node)
            if fused is not None:
                output = fused[0].output[0]
                operands["bias"] = _Operand(fused[1])
        plans.append({"index": index, "node": node, "operands": operands, "output": output,
                      "fused_add": None if fused is None else fused[0]})
    return plans, unplanned


class _Skip(Exception):
    """A layer node that cannot be recorded; the message is the reason."""


class _View:
    """How one tensor of a node maps to the trace layer's layout: ``array(a)`` rearranges it
    (values copied, never rounded); ``axis_map(axis)`` is the new index of an operand axis, or
    None where that axis was merged with others (a spec along it does not survive)."""

    def __init__(self, array=None, axis_map=None):
        self._array = array
        self._axis_map = axis_map

    def array(self, a: np.ndarray) -> np.ndarray:
        return a if self._array is None else np.ascontiguousarray(self._array(a))

    def spec(self, spec):
        """(spec in the layer's layout or None, why not)."""
        if self._array is None or spec.axis is None:
            return spec, None
        axis = self._axis_map(spec.axis)
        if axis is None:
            return None, f"the spec's axis {spec.axis} is merged with other axes in the GEMM layout"
        if isinstance(spec, QDQQuant) and spec.block_size:  # the blocked scale has the operand's layout
            zero = None if spec.zero_point is None else self.array(spec.zero_point)
            return QDQQuant(spec.dtype, self.array(spec.scale), zero, axis, spec.block_size, spec.saturate), None
        return spec.with_axis(axis), None


_IDENTITY = _View()
_TRANSPOSE = _View(lambda a: a.T, lambda axis: 1 - axis % 2)
_CONV1D = _View(lambda a: a[:, :, None], lambda axis: axis % 3 + (axis % 3 >= 2))


def _einsum_views(equation: str, x: np.ndarray, w: np.ndarray):
    """A two-operand Einsum as a (batched) matmul: input (batch..., M, K), weight (batch..., K, N),
    output (batch..., M, N), where batch are the indices of both operands and the output, K the
    contracted ones, M / N the free indices of each operand (each group flattened, in order)."""
    text = equation.replace(" ", "")
    if "..." in text or "->" not in text:
        raise _Skip(f"einsum {equation!r}: only explicit equations without '...' are layers")
    lhs, out = text.split("->")
    terms = lhs.split(",")
    a, b = terms
    if any(len(set(t)) != len(t) for t in (a, b, out)):
        raise _Skip(f"einsum {equation!r}: a repeated index (diagonal) is not a matmul")
    batch = [c for c in a if c in b and c in out]
    contract = [c for c in a if c in b and c not in out]
    left, right = [c for c in a if c not in b], [c for c in b if c not in a]
    if set(left + right) - set(out) or set(out) - set(batch + left + right):
        raise _Skip(f"einsum {equation!r}: an index summed within one operand is not a matmul")
    sizes = {c: n for term, array in ((a, x), (b, w)) for c, n in zip(term, array.shape)}
    if any(x.shape[a.index(c)] != w.shape[b.index(c)] for c in batch + contract):
        raise _Skip(f"einsum {equation!r}: operand dims differ ({x.shape}, {w.shape})")
    batch_sizes = tuple(sizes[c] for c in batch)

    def flat(group):
        return int(np.prod([sizes[c] for c in group], dtype=np.int64))

    def view(term, order, tail):
        def array(t):
            return t.transpose([term.index(c) for c in order]).reshape(batch_sizes + tail)

        def axis_map(axis):
            c = term[axis]
            if c in batch:
                return batch.index(c)
            group = next(g for g in (left, contract, right) if c in g)
            if len(group) != 1:
                return None
            return len(batch) + (0 if order.index(c) == len(batch) else 1)
        return _View(array, axis_map)

    m, k, n = flat(left), flat(contract), flat(right)
    return {"input": view(a, batch + left + contract, (m, k)), "weight": view(b, batch + contract + right, (k, n)),
            "output": view(out, batch + left + right, (m, n))}


def _conv_transpose_padding(attrs: dict, input_shape, weight_shape) -> list[list[int]]:
    """ONNX ConvTranspose pads / output_shape / auto_pad as [[top, bottom], [left, right]]."""
    auto_pad = _decode(attrs.get("auto_pad", "NOTSET"))
    spatial = len(input_shape) - 2
    strides = list(attrs.get("strides", [1] * spatial))
    dilations = list(attrs.get("dilations", [1] * spatial))
    output_padding = list(attrs.get("output_padding", [0] * spatial))
    if "output_shape" not in attrs and auto_pad in ("NOTSET", "", "VALID"):
        pads = list(attrs.get("pads", [0] * 2 * spatial)) if auto_pad in ("NOTSET", "") else [0] * 2 * spatial
        return [[pads[i], pads[i + spatial]] for i in range(spatial)]
    targets = list(attrs.get("output_shape", []))[-spatial:] or [size * s for size, s in zip(input_shape[2:], strides)]
    pairs = []
    for size, kernel, stride, dilation, extra, target in zip(input_shape[2:], weight_shape[2:], strides, dilations,
                                                              output_padding, targets):
        total = stride * (size - 1) + extra + (kernel - 1) * dilation + 1 - target
        if total < 0:
            raise _Skip(f"output_shape {targets} is larger than the transposed convolution produces")
        # ONNX: SAME_UPPER puts the larger half at the end; otherwise at the start
        half = total // 2
        pairs.append([half, total - half] if auto_pad == "SAME_UPPER" else [total - half, half])
    return pairs


def _layer_views(node, node_attrs: dict, x: np.ndarray, w: np.ndarray, out: np.ndarray, has_bias: bool):
    """(op, attrs, views of input/weight/bias/output, source details) of a layer node, or _Skip."""
    op_type = node.op_type
    views = {}
    details = {}
    if op_type in ("Conv", "ConvTranspose"):
        if x.ndim not in (3, 4) or w.ndim != x.ndim:
            raise _Skip(f"{x.ndim - 2}-d convolution (only 1-d and 2-d are captured)")
        spatial = x.ndim - 2
        if spatial == 1:  # height 1
            views = {"input": _CONV1D, "weight": _CONV1D, "output": _CONV1D}
            details["conv1d_as_2d"] = True
        strides = [int(v) for v in node_attrs.get("strides", [1] * spatial)]
        dilations = [int(v) for v in node_attrs.get("dilations", [1] * spatial)]
        if op_type == "Conv":
            padding = _conv_padding(node_attrs, x.shape, w.shape)
        else:
            padding = _conv_transpose_padding(node_attrs, x.shape, w.shape)
        attrs = {"stride": strides, "padding": padding, "dilation": dilations, "groups": int(node_attrs.get("group", 1))}
        if spatial == 1:
            attrs = {"stride": [1] + strides, "padding": [[0, 0]] + padding, "dilation": [1] + dilations,
                     "groups": attrs["groups"]}
        if op_type == "ConvTranspose":
            extra = [int(v) for v in node_attrs.get("output_padding", [0] * spatial)]
            attrs["output_padding"] = [0] + extra if spatial == 1 else extra
        op = "conv2d" if op_type == "Conv" else "conv_transpose2d"
        layer = Layer("check", op, {"input": views.get("input", _IDENTITY).array(x),
                                    "weight": views.get("weight", _IDENTITY).array(w),
                                    "output": views.get("output", _IDENTITY).array(out)}, attrs)
        try:
            expected = layer.conv_geometry().output_shape
        except MxsimError as error:
            raise _Skip(str(error)) from None
        if expected != layer.output.shape:
            raise _Skip(f"attributes give output {expected}, onnxruntime produced {layer.output.shape}")
        return op, attrs, views, details
    if op_type == "Gemm":
        if node_attrs.get("transA", 0):
            views["input"] = _TRANSPOSE
        if not node_attrs.get("transB", 0):
            views["weight"] = _TRANSPOSE  # stored as (N, K)
        attrs = {k: float(node_attrs[k]) for k in ("alpha", "beta") if node_attrs.get(k, 1.0) != 1.0}
        details = {"transA": int(node_attrs.get("transA", 0)), "transB": int(node_attrs.get("transB", 0))}
        return "linear", attrs, views, details
    if op_type == "Einsum":
        equation = _decode(node_attrs.get("equation", ""))
        return "matmul", {}, _einsum_views(equation, x, w), {"equation": equation}
    # MatMul: numpy semantics; a 1-d operand becomes a 1-row / 1-column matrix
    if x.ndim == 1 and w.ndim == 1:
        return "matmul", {}, {"input": _View(lambda a: a[None, :], lambda axis: 1),
                              "weight": _View(lambda a: a[:, None], lambda axis: 0),
                              "output": _View(lambda a: a.reshape(1, 1), None)}, {"promoted": "dot"}
    if x.ndim == 1:
        return "matmul", {}, {"input": _View(lambda a: a[None, :], lambda axis: 1),
                              "output": _View(lambda a: a[..., None, :], None)}, {"promoted": "row"}
    if w.ndim == 1:
        column = _View(lambda a: a[..., None], None)
        views = {"weight": _View(lambda a: a[:, None], lambda axis: 0), "output": column}
        if has_bias:
            views["bias"] = column
        return "matmul", {}, views, {"promoted": "vector"}
    return "matmul", {}, views, details


def _load_model(model):
    onnx = require("onnx")
    if isinstance(model, onnx.ModelProto):
        return model, None
    path = Path(model)
    if not path.is_file():
        raise MxsimError(f"capture_onnx: no such model file {path}")
    try:
        return onnx.load(str(path)), path
    except Exception as error:  # protobuf's DecodeError and friends
        raise MxsimError(f"capture_onnx: {path} is not a readable ONNX model ({error})") from None


def _check_feeds(g: _Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    onnx = require("onnx")
    if not isinstance(inputs, Mapping):
        raise MxsimError("capture_onnx: inputs must map input names to numpy arrays")
    names = [i.name for i in g.inputs]
    missing = [n for n in names if n not in inputs]
    extra = [n for n in inputs if n not in names]
    if missing or extra:
        raise MxsimError(f"capture_onnx: the model's inputs are {names}; missing {missing}, unexpected {extra}")
    feeds = {}
    for info in g.inputs:
        array = np.asarray(inputs[info.name])
        elem_type = info.type.tensor_type.elem_type
        if elem_type:
            expected = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
            if array.dtype != expected:
                raise MxsimError(f"capture_onnx: input {info.name!r} must be {expected}, got {array.dtype}")
        dims = info.type.tensor_type.shape.dim
        if info.type.tensor_type.HasField("shape"):
            if len(dims) != array.ndim:
                raise MxsimError(f"capture_onnx: input {info.name!r} must be {len(dims)}-d, got shape {array.shape}")
            for axis, (dim, size) in enumerate(zip(dims, array.shape)):
                if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != size:
                    raise MxsimError(f"capture_onnx: input {info.name!r} axis {axis} must be {dim.dim_value}, "
                                     f"got shape {array.shape}")
        feeds[info.name] = array
    return feeds


def _unique(name: str, used: set[str]) -> str:
    candidate, count = name, 1
    while candidate in used:
        count += 1
        candidate = f"{name}#{count}"
    used.add(candidate)
    return candidate


def capture_onnx(model, inputs: Mapping[str, np.ndarray], *, name: str | None = None,
                 metadata: Mapping | None = None, dataset: Mapping[str, np.ndarray] | None = None,
                 bfp_kernel: str = "cpu", layers=None) -> Trace:
    """Run an ONNX model on ``inputs`` and capture its MatMul/Gemm/2-D Conv layers as a trace.

    Args:
        model: path of a ``.onnx`` file (external data next to it is loaded) or a ModelProto.
        inputs: one numpy array per graph input (initializers excluded), with the declared
            dtype and fixed dimensions.
        name: the trace name (default: the file's stem, or the graph name).
        metadata, dataset: stored with the trace (see :class:`mxsim.trace.Trace`).
        bfp_kernel: which Quark BFP kernel's semantics to emulate for
            ``BFPQuantizeDequantize`` (``"cpu"``, Quark's default build, or ``"cuda"``).
        layers: None (every MatMul/Gemm/Conv), a collection of node names, or
            ``callable(node) -> bool``: which layers to record (the whole graph still runs).

    Layers: ``Gemm`` -> ``linear`` (A transposed if ``transA``, B stored as (N, K), i.e.
    transposed when ``transB`` is 0; spec axes follow the transposes; ``alpha``/``beta`` kept);
    ``MatMul`` -> ``matmul`` (with a following constant-bias ``Add`` fused; a 1-d operand
    promoted to a 1-row / 1-column matrix); ``Conv`` -> ``conv2d`` and ``ConvTranspose`` ->
    ``conv_transpose2d`` (2-d, or 1-d as height 1; ``pads``/``auto_pad``/``output_shape``
    made explicit); a two-operand ``Einsum`` -> ``matmul`` (batch, M, K, N index groups).
    Skipped nodes, and matmul-like nodes of other types, are listed in ``source.skipped``
    (name, op, reason) and reported with a :class:`mxsim.errors.CaptureWarning`.
    """
    proto, path = _load_model(model)
    ort = require("onnxruntime")
    g = _Graph(proto)
    feeds = _check_feeds(g, inputs)
    select = layers
    if layers is not None and not callable(layers):
        names = set(layers)
        known = {n.name for n in g.nodes if n.op_type in LAYER_OP_TYPES and n.domain in STANDARD_DOMAINS}
        if names - known:
            raise MxsimError(f"capture_onnx: no MatMul/Gemm/Conv node named {sorted(names - known)}")

        def select_by_name(node):
            return node.name in names

        select = select_by_name
    plans, unplanned = _plan_layers(g, select)
    wanted = set()
    for plan in plans:
        wanted.add(plan["output"])
        for operand in plan["operands"].values():
            wanted |= operand.names()
    values = _run_stages(g, feeds, wanted, bfp_kernel)
    layers_out, skipped, used_names = [], list(unplanned), set()
    for plan in plans:
        node = plan["node"]
        layer_name = _unique(node.name or f"{node.op_type}_{plan['index']}", used_names)
        ops = plan["operands"]
        x, w = values[ops["input"].value], values[ops["weight"].value]
        node_attrs = _attributes(node)
        try:
            if x.dtype.kind != "f" or w.dtype.kind != "f":
                raise _Skip(f"non-float operands ({x.dtype}, {w.dtype})")
            op, attrs, views, details = _layer_views(node, node_attrs, x, w, values[plan["output"]],
                                                     "bias" in ops)
        except _Skip as why:
            skipped.append({"name": layer_name, "op": node.op_type, "reason": str(why)})
            continue
        tensors = {"output": views.get("output", _IDENTITY).array(values[plan["output"]])}
        quant = {}
        source = {"node": node.name, "op_type": node.op_type, **details}
        if plan["fused_add"] is not None:
            source["fused_add"] = plan["fused_add"].name
        quant_nodes = {}
        for role, operand in ops.items():
            view = views.get(role, _IDENTITY)
            value = values[operand.value]
            quantized = values[operand.quantized] if operand.quantized else None
            spec, why = None, None
            if operand.kind == "quark":
                spec = quark_spec(operand.nodes[0], value.ndim, bfp_kernel)
            elif operand.kind == "qdq":
                spec, why = _qdq_spec(g, operand, values, value.ndim)
            if spec is not None:
                spec, lost = view.spec(spec)
                why = why or lost
            tensors[role] = view.array(value)
            if quantized is not None:  # kept even when the spec was not recognised: it is what the node read
                tensors[f"{role}_quantized"] = view.array(quantized)
            quant[role] = spec
            if operand.nodes:
                quant_nodes[role] = operand.nodes[-1].name if operand.kind == "qdq" else operand.nodes[0].name
            if why:
                source.setdefault("quant_notes", {})[role] = why
        if quant_nodes:
            source["quant_nodes"] = quant_nodes
        source["weight_is_constant"] = g.is_constant(ops["weight"].value)
        layers_out.append(Layer(layer_name, op, tensors, attrs, quant, source))
    trace_source = {
        "framework": "onnx",
        "model": path.name if path is not None else (proto.graph.name or "model"),
        "producer": f"{proto.producer_name} {proto.producer_version}".strip(),
        "opsets": {o.domain or "ai.onnx": int(o.version) for o in proto.opset_import},
        "onnxruntime_version": ort.__version__,
        "inputs": {k: {"shape": list(v.shape), "dtype": v.dtype.name} for k, v in feeds.items()},
    }
    if path is not None:
        trace_source["sha256"] = _sha256(path)
    if skipped:
        trace_source["skipped"] = skipped
        listed = "; ".join(f"{entry['name']} ({entry['op']}): {entry['reason']}" for entry in skipped[:5])
        more = f"; and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        warnings.warn(f"capture_onnx: {len(skipped)} matmul-like node(s) not captured, listed in source.skipped: "
                      f"{listed}{more}", CaptureWarning, stacklevel=2)
    if layers is not None:
        trace_source["selected_layers"] = [layer.name for layer in layers_out]
    trace_name = name or (path.stem if path is not None else (proto.graph.name or "onnx-model"))
    trace = Trace(trace_name, layers_out, trace_source, dict(metadata or {}),
                  None if dataset is None else {k: np.asarray(v) for k, v in dataset.items()})
    validate_trace(trace)
    return trace


def load_inputs_npz(path) -> dict[str, np.ndarray]:
    """Model inputs from an ``.npz`` (one array per input name), never unpickling.

    For the CLI's ``mxsim capture onnx MODEL.onnx --inputs FILE.npz``.
    """
    path = check_path(path, "inputs")
    if not path.is_file():
        raise InputFileError(f"{path}: no such file")

    def fail(member, message):
        raise InputFileError(message if member is None else f"input {member!r}: {message}")

    return read_npz(path, NUMERIC_DTYPES, fail, label=str(path))
