"""The ONNX graph executor of capture and in-loop runs (``mxsim[onnx]``).

:func:`run_graph` runs a model with onnxruntime, except for the nodes that a ``python_node``
hook computes in numpy (Quark's custom quantizers, which onnxruntime cannot load without
Quark's library; a unit's matmul nodes in :mod:`mxsim.inloop.onnx`). The graph is cut at
every such node. Each one gets a *stage*: one more than the stage of its latest input;
every other node runs in the stage of its latest input. Stage 0 runs first as its own
onnxruntime session (a sub-model holding only that stage's nodes, with every value that
later stages need added as graph outputs); then the hook's nodes whose inputs were produced
in that stage are computed; their outputs feed the next stage's session as graph inputs;
and so on. A hook's node whose inputs are all constants (weights) is computed once before
any session and becomes a constant. Every node therefore runs exactly once, and
intermediate values are exact onnxruntime (or hook) results. Graph optimizations are
disabled (``ORT_DISABLE_ALL``) so each node computes its own op, unfused.

:class:`Graph` folds ``Constant`` nodes into constants and maps producers and consumers;
:func:`load_model` and :func:`check_feeds` read a model and check its inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .._optional import require
from ..errors import MxsimError

STANDARD_DOMAINS = ("", "ai.onnx")


def attributes(node) -> dict:
    """A node's attributes as Python values (strings stay bytes; see :func:`text`)."""
    onnx = require("onnx")
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def text(value):
    """A string attribute's value as str (ONNX stores bytes)."""
    return value.decode() if isinstance(value, bytes) else value


def _constant_node_value(node):
    onnx = require("onnx")
    numpy_helper = onnx.numpy_helper
    attrs = {a.name: a for a in node.attribute}
    if "value" in attrs:
        return numpy_helper.to_array(attrs["value"].t), attrs["value"].t
    value = attributes(node)
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


def node_inputs(node) -> list[str]:
    """The names a node reads: its inputs, then what its subgraphs read from enclosing scopes."""
    return [i for i in node.input if i] + sorted(_implicit_inputs(node))


class Graph:
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
            for name in node_inputs(node):
                self.consumers.setdefault(name, []).append(node)

    def is_constant(self, name: str) -> bool:
        return name in self.constants


def _elem_type(array: np.ndarray) -> int:
    onnx = require("onnx")
    return onnx.helper.np_dtype_to_tensor_dtype(array.dtype)


def run_graph(g: Graph, feeds: dict[str, np.ndarray], wanted: set[str], python_node=None,
              python_domains: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Run the graph (see the module docstring) and return every value in ``wanted``.

    ``python_node``: None, or ``callable(node) -> None | callable(inputs) -> output``: a node
    for which it returns a function is computed by that function (on its input arrays, an
    empty input as None) instead of by onnxruntime; it may raise for a node that neither can
    run. ``python_domains``: opset domains onnxruntime cannot load, left out of every
    session's model (only ``python_node`` computes their nodes)."""
    onnx = require("onnx")
    ort = require("onnxruntime")
    values: dict[str, np.ndarray] = dict(feeds)
    stage: dict[str, int] = {name: 0 for name in feeds}
    stage_nodes: dict[int, list] = {}
    computed_after: dict[int, list] = {}
    functions: dict[int, object] = {}
    for node in g.nodes:
        inputs = node_inputs(node)
        for name in inputs:
            if name not in stage and not g.is_constant(name):
                raise MxsimError(f"node {node.name!r} ({node.op_type}) reads {name!r}, which no earlier node, "
                                 "graph input or initializer defines (is the graph topologically sorted?)")
        function = python_node(node) if python_node is not None else None
        if function is not None and all(g.is_constant(i) for i in inputs):
            # weights: computed once, the result becomes a constant
            result = np.asarray(function([None if not i else g.constants[i] for i in node.input]))
            g.constants[node.output[0]] = result
            g.constant_protos[node.output[0]] = onnx.numpy_helper.from_array(result, node.output[0])
            continue
        level = max([stage[i] for i in inputs if i in stage], default=0)
        if function is not None:
            functions[id(node)] = function
            computed_after.setdefault(level, []).append(node)
            stage[node.output[0]] = level + 1
        else:
            stage_nodes.setdefault(level, []).append(node)
            for name in node.output:
                if name:
                    stage[name] = level
    last = max(stage.values(), default=0)
    session_options = ort.SessionOptions()
    session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opsets = [o for o in g.model.opset_import if o.domain not in python_domains]
    for level in range(last + 1):
        nodes = stage_nodes.get(level, [])
        if nodes:
            produced = [o for n in nodes for o in n.output if o]
            produced_set = set(produced)
            consumed = {i for n in nodes for i in node_inputs(n)}
            later = set(wanted) | set(g.outputs)
            for other_level, other_nodes in stage_nodes.items():
                if other_level > level:
                    later.update(i for n in other_nodes for i in node_inputs(n))
            for computed in computed_after.values():
                later.update(i for n in computed for i in node_inputs(n))
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
        for node in computed_after.get(level, []):
            operands = [None if not name else values[name] if name in values else g.constants[name]
                        for name in node.input]
            values[node.output[0]] = np.asarray(functions[id(node)](operands))
    missing = [name for name in wanted if name not in values and not g.is_constant(name)]
    if missing:
        raise MxsimError(f"values {missing} were not computed")
    return {name: values[name] if name in values else g.constants[name] for name in wanted}


def load_model(model, caller: str):
    """(ModelProto, its path or None) of a ``.onnx`` path or a ModelProto; errors name ``caller``."""
    onnx = require("onnx")
    if isinstance(model, onnx.ModelProto):
        return model, None
    path = Path(model)
    if not path.is_file():
        raise MxsimError(f"{caller}: no such model file {path}")
    try:
        return onnx.load(str(path)), path
    except Exception as error:  # protobuf's DecodeError and friends
        raise MxsimError(f"{caller}: {path} is not a readable ONNX model ({error})") from None


def check_feeds(g: Graph, inputs: Mapping[str, np.ndarray], caller: str) -> dict[str, np.ndarray]:
    """The graph inputs as arrays, checked against the declared dtypes and fixed dimensions."""
    onnx = require("onnx")
    if not isinstance(inputs, Mapping):
        raise MxsimError(f"{caller}: inputs must map input names to numpy arrays")
    names = [i.name for i in g.inputs]
    missing = [n for n in names if n not in inputs]
    extra = [n for n in inputs if n not in names]
    if missing or extra:
        raise MxsimError(f"{caller}: the model's inputs are {names}; missing {missing}, unexpected {extra}")
    feeds = {}
    for info in g.inputs:
        array = np.asarray(inputs[info.name])
        elem_type = info.type.tensor_type.elem_type
        if elem_type:
            expected = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
            if array.dtype != expected:
                raise MxsimError(f"{caller}: input {info.name!r} must be {expected}, got {array.dtype}")
        dims = info.type.tensor_type.shape.dim
        if info.type.tensor_type.HasField("shape"):
            if len(dims) != array.ndim:
                raise MxsimError(f"{caller}: input {info.name!r} must be {len(dims)}-d, got shape {array.shape}")
            for axis, (dim, size) in enumerate(zip(dims, array.shape)):
                if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != size:
                    raise MxsimError(f"{caller}: input {info.name!r} axis {axis} must be {dim.dim_value}, "
                                     f"got shape {array.shape}")
        feeds[info.name] = array
    return feeds

