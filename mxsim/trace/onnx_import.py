"""Capture an ONNX model's MatMul / Gemm / Conv layers into a trace (``mxsim[onnx]``).

:func:`capture_onnx` runs the model with onnxruntime on the given inputs and records, for every
MatMul, Gemm and 2-D Conv node: the operands, the bias, and the output, plus the quantization
spec of each operand as the model itself applies it:

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
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..errors import InputFileError, MxsimError, UnknownNameError
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
LAYER_OP_TYPES = ("MatMul", "Gemm", "Conv")
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
        raise MxsimError(f"{where}: unknown attribute(s) {sorted(unknown)}")
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
    """Quark's custom op on ``x`` with mxsim's quantizers; float16 goes through float32, as Quark does."""
    if x.dtype not in (np.float32, np.float16):
        raise MxsimError(f"node {node.name!r} ({node.op_type}): input must be float32 or float16, got {x.dtype}")
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


def _run_stages(g: _Graph, feeds: dict[str, np.ndarray], wanted: set[str], bfp_kernel: str) -> dict[str, np.ndarray]:
    """Run the graph (see the module docstring) and return every value in ``wanted``."""
    onnx = require("onnx")
    ort = require("onnxruntime")
    values: dict[str, np.ndarray] = dict(feeds)
    stage: dict[str, int] = {name: 0 for name in feeds}
    stage_nodes: dict[int, list] = {}
    custom_after: dict[int, list] = {}
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
        if _is_quark(node):
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
                later.update(n.input[0] for n in customs)
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
            x = values[node.input[0]] if node.input[0] in values else g.constants[node.input[0]]
            values[node.output[0]] = _evaluate_quark(node, x, bfp_kernel)
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
    """ONNX Conv pads / auto_pad as [[top, bottom], [left, right]]."""
    auto_pad = _decode(attrs.get("auto_pad", "NOTSET"))
    strides = list(attrs.get("strides", [1, 1]))
    dilations = list(attrs.get("dilations", [1, 1]))
    if auto_pad in ("NOTSET", ""):
        top, left, bottom, right = list(attrs.get("pads", [0, 0, 0, 0]))
        return [[top, bottom], [left, right]]
    if auto_pad == "VALID":
        return [[0, 0], [0, 0]]
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
    plans = []
    for index, node in enumerate(g.nodes):
        if node.op_type not in LAYER_OP_TYPES or node.domain not in STANDARD_DOMAINS:
            continue
        if select is not None and not select(node):
            continue
        operands = {"input": _trace_operand(g, node.input[0]), "weight": _trace_operand(g, node.input[1])}
        output = node.output[0]
        fused = None
        bias_name = None
        if node.op_type in ("Gemm", "Conv") and len(node.input) > 2 and node.input[2]:
            operands["bias"] = _trace_operand(g, node.input[2])
        elif node.op_type == "MatMul":
            fused = _fused_bias(g, node)
            if fused is not None:
                output = fused[0].output[0]
                bias_name = fused[1]
                operands["bias"] = _Operand(bias_name)
        plans.append({"index": index, "node": node, "operands": operands, "output": output,
                      "fused_add": None if fused is None else fused[0]})
    return plans


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
    ``MatMul`` -> ``matmul`` (with a following constant-bias ``Add`` fused; skipped if an
    operand is 1-d); ``Conv`` with a 4-d input -> ``conv2d`` (``pads``/``auto_pad`` made
    explicit). Skipped nodes are listed in ``source.skipped`` with the reason.
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
    plans = _plan_layers(g, select)
    wanted = set()
    for plan in plans:
        wanted.add(plan["output"])
        for operand in plan["operands"].values():
            wanted |= operand.names()
    values = _run_stages(g, feeds, wanted, bfp_kernel)
    layers_out, skipped, used_names = [], [], set()
    for plan in plans:
        node = plan["node"]
        layer_name = _unique(node.name or f"{node.op_type}_{plan['index']}", used_names)
        ops = plan["operands"]
        x, w = values[ops["input"].value], values[ops["weight"].value]
        attrs, op = {}, None
        transposed = set()
        node_attrs = _attributes(node)
        if x.dtype.kind != "f" or w.dtype.kind != "f":
            skipped.append({"node": node.name, "op_type": node.op_type,
                            "reason": f"non-float operands ({x.dtype}, {w.dtype})"})
            continue
        if node.op_type == "Conv":
            if x.ndim != 4 or w.ndim != 4:
                skipped.append({"node": node.name, "op_type": "Conv",
                                "reason": f"not a 2-D convolution (input {x.shape})"})
                continue
            op = "conv2d"
            attrs = {"stride": [int(v) for v in node_attrs.get("strides", [1, 1])],
                     "padding": _conv_padding(node_attrs, x.shape, w.shape),
                     "dilation": [int(v) for v in node_attrs.get("dilations", [1, 1])],
                     "groups": int(node_attrs.get("group", 1))}
        elif node.op_type == "Gemm":
            op = "linear"
            if node_attrs.get("transA", 0):
                transposed.add("input")
            if not node_attrs.get("transB", 0):
                transposed.add("weight")  # stored as (N, K)
            attrs = {k: float(node_attrs[k]) for k in ("alpha", "beta") if node_attrs.get(k, 1.0) != 1.0}
        else:
            if x.ndim < 2 or w.ndim < 2:
                skipped.append({"node": node.name, "op_type": "MatMul", "reason": "1-d operand"})
                continue
            op = "matmul"
        tensors = {"output": values[plan["output"]]}
        quant = {}
        source = {"node": node.name, "op_type": node.op_type}
        if plan["fused_add"] is not None:
            source["fused_add"] = plan["fused_add"].name
        if node.op_type == "Gemm":
            source.update({"transA": int(node_attrs.get("transA", 0)), "transB": int(node_attrs.get("transB", 0))})
        quant_nodes = {}
        for role, operand in ops.items():
            value = values[operand.value]
            quantized = values[operand.quantized] if operand.quantized else None
            spec, why = None, None
            if operand.kind == "quark":
                spec = quark_spec(operand.nodes[0], value.ndim, bfp_kernel)
            elif operand.kind == "qdq":
                spec, why = _qdq_spec(g, operand, values, value.ndim)
            if role in transposed:
                value = np.ascontiguousarray(value.T)
                quantized = None if quantized is None else np.ascontiguousarray(quantized.T)
                if spec is not None and spec.axis is not None:
                    spec = spec.with_axis(1 - spec.axis)
                if isinstance(spec, QDQQuant) and spec.block_size:
                    spec = QDQQuant(spec.dtype, np.ascontiguousarray(spec.scale.T),
                                    None if spec.zero_point is None else np.ascontiguousarray(spec.zero_point.T),
                                    spec.axis, spec.block_size, spec.saturate)
            tensors[role] = value
            if quantized is not None:  # kept even when the spec was not recognised: it is what the node read
                tensors[f"{role}_quantized"] = quantized
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
