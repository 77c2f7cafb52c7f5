"""The ONNX graph executor of capture and in-loop runs (``mxsim[onnx]``).

:func:`run_graph` runs a model with onnxruntime, except for the nodes that a ``python_node``
hook computes in numpy (Quark's custom quantizers, which onnxruntime cannot load without
Quark's library; a unit's matmul nodes in :mod:`mxsim.inloop.onnx`). The graph is cut at
every such node. Each one gets a *stage*: one more than the stage of its latest input;
every other node runs in the stage of its latest input. Stage 0 runs first as its own
onnxruntime session (a sub-model holding only that stage's nodes, with every value that
later stages need added as graph outputs); then the hook's nodes whose inputs were produced
in that stage are computed; their outputs feed the next stage's session as graph inputs;
and so on. A hook's node whose inputs are all constants (weights) is computed once per run
before any session, and read as a constant (a graph input of the sessions, so that a
session does not depend on it). Every node therefore runs exactly once, and
intermediate values are exact onnxruntime (or hook) results. Graph optimizations are
disabled (``ORT_DISABLE_ALL``) so each node computes its own op, unfused. A stage's
sub-model declares its graph inputs' dtypes, not their shapes.

:class:`Graph` folds ``Constant`` nodes into constants and maps producers and consumers,
and keeps the :class:`Plan` (the stages) made for each set of hook nodes, and with
``keep_sessions`` the stages' onnxruntime sessions, for the next run: the in-loop runner
gets its graphs from :func:`load_graph`, which keeps the graphs of model files in memory
(nothing is written to disk). :func:`load_model` and :func:`check_feeds` read a model and
check its inputs.
"""

from __future__ import annotations

from collections import OrderedDict
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
    for key, dtype in (
        ("value_float", np.float32),
        ("value_floats", np.float32),
        ("value_int", np.int64),
        ("value_ints", np.int64),
    ):
        if key in value:
            array = np.array(value[key], dtype=dtype)
            return array, numpy_helper.from_array(array, node.output[0])
    raise MxsimError(
        f"Constant node {node.name!r}: only value/value_float(s)/value_int(s) are supported"
    )


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
    """The model with Constant nodes folded into constants, and its producer/consumer maps.

    A Graph also keeps the executor's plans (:meth:`plan`), so that running it again reuses
    them; it is never modified otherwise. ``keep_sessions``: the plans keep each stage's
    onnxruntime session too (:attr:`sessions` is for its users' own, and
    :attr:`weight_quantizations` for their quantized constant weights, as
    :func:`mxsim.replay.layer.run_layer` keeps them), and every session runs on the calling
    thread (one intra-op thread: a thread pool per kept session would multiply threads, and
    its threads would spin between stages while Python works); else a session is made per
    stage and run, on onnxruntime's default threads, and dropped."""

    def __init__(self, model, keep_sessions: bool = False):
        onnx = require("onnx")
        graph = model.graph
        self.model = model
        self.keep_sessions = keep_sessions
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
        self._plans: dict[tuple, Plan] = {}
        self.sessions: dict = {}
        # (constant name, id(node)) -> a user's quantizations of that node's constant weight
        self.weight_quantizations: dict[tuple, dict] = {}

    def is_constant(self, name: str) -> bool:
        return name in self.constants

    def session(self, model):
        """An onnxruntime CPU session of ``model`` (a ModelProto), graph optimizations off,
        on one thread if the graph keeps its sessions."""
        ort = require("onnxruntime")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if self.keep_sessions:
            options.intra_op_num_threads = 1
        return ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )

    def plan(
        self, python_node, wanted: set[str], python_domains: tuple[str, ...] = ()
    ) -> tuple[Plan, list]:
        """(the :class:`Plan` that runs this graph with the nodes ``python_node`` claims computed
        by it, their functions by node position): plans are made once per set of claimed nodes,
        ``wanted`` and ``python_domains`` (see :func:`run_graph`), then reused."""
        functions = [python_node(node) if python_node is not None else None for node in self.nodes]
        claimed = frozenset(
            index for index, function in enumerate(functions) if function is not None
        )
        key = (claimed, frozenset(wanted), tuple(python_domains))
        if key not in self._plans:
            self._plans[key] = Plan(self, claimed, set(wanted), python_domains)
        return self._plans[key], functions


class Plan:
    """How :func:`run_graph` runs a graph for one set of nodes computed in Python: the nodes
    folded into constants, and per stage the nodes onnxruntime runs (its sub-model: the
    stage's nodes, the constants they read as initializers, every value that later stages
    need as outputs) and the Python nodes computed after it. A stage's onnxruntime session is
    made for the dtypes of its graph inputs, and kept if the graph keeps its sessions.

    ``folded``: the names of the Python nodes' outputs computed from constants alone."""

    def __init__(
        self, g: Graph, claimed: frozenset[int], wanted: set[str], python_domains: tuple[str, ...]
    ):
        self.g = g
        stage: dict[str, int] = {info.name: 0 for info in g.inputs}
        self.folded_nodes: list[
            int
        ] = []  # positions of claimed nodes with constant inputs, in order
        self.folded: set[str] = set()
        stage_nodes: dict[int, list] = {}
        self.computed_after: dict[int, list[int]] = {}
        for index, node in enumerate(g.nodes):
            inputs = node_inputs(node)
            for name in inputs:
                if name not in stage and not g.is_constant(name) and name not in self.folded:
                    raise MxsimError(
                        f"node {node.name!r} ({node.op_type}) reads {name!r}, which no earlier node, "
                        "graph input or initializer defines (is the graph topologically sorted?)"
                    )
            if index in claimed and all(g.is_constant(i) or i in self.folded for i in inputs):
                # weights: computed once per run, before any stage, the result read as a constant
                self.folded_nodes.append(index)
                self.folded.add(node.output[0])
                continue
            level = max([stage[i] for i in inputs if i in stage], default=0)
            if index in claimed:
                self.computed_after.setdefault(level, []).append(index)
                stage[node.output[0]] = level + 1
            else:
                stage_nodes.setdefault(level, []).append(node)
                for name in node.output:
                    if name:
                        stage[name] = level
        self.levels = max(stage.values(), default=0) + 1
        later_all = set(wanted) | set(g.outputs)
        for indices in self.computed_after.values():
            later_all.update(i for index in indices for i in node_inputs(g.nodes[index]))
        self.stages: dict[int, _Stage] = {}
        for level, nodes in stage_nodes.items():
            later = set(later_all)
            for other_level, other_nodes in stage_nodes.items():
                if other_level > level:
                    later.update(i for n in other_nodes for i in node_inputs(n))
            self.stages[level] = _Stage(g, level, nodes, later, python_domains)

    def run(self, feeds: dict[str, np.ndarray], functions: list) -> dict[str, np.ndarray]:
        """Every value of the run (graph inputs ``feeds``, the Python nodes' ``functions`` by
        node position): the stages' outputs, the Python nodes' outputs, and the folded ones."""
        g = self.g
        values: dict[str, np.ndarray] = dict(feeds)

        def read(name):
            return None if not name else values[name] if name in values else g.constants[name]

        for index in self.folded_nodes:
            node = g.nodes[index]
            values[node.output[0]] = np.asarray(
                functions[index]([read(name) for name in node.input])
            )
        for level in range(self.levels):
            if level in self.stages:
                values.update(self.stages[level].run(values))
            for index in self.computed_after.get(level, []):
                node = g.nodes[index]
                values[node.output[0]] = np.asarray(
                    functions[index]([read(name) for name in node.input])
                )
        return values


class _Stage:
    """One stage's onnxruntime nodes: the sub-model's parts, and its sessions by input dtypes."""

    def __init__(
        self, g: Graph, level: int, nodes: list, later: set[str], python_domains: tuple[str, ...]
    ):
        self.g, self.level, self.nodes, self.python_domains = g, level, nodes, python_domains
        produced = [o for n in nodes for o in n.output if o]
        self.produced = set(produced)
        consumed = {i for n in nodes for i in node_inputs(n)}
        self.inputs = sorted(consumed - self.produced - set(g.constants))
        self.initializers = sorted(consumed & set(g.constants))
        self.outputs = [name for name in produced if name in later]
        self.sessions: dict[tuple, object] = {}

    def _session(self, dtypes: tuple):
        onnx = require("onnx")
        g = self.g
        sub_graph = onnx.helper.make_graph(
            self.nodes,
            f"{g.model.graph.name or 'graph'}_stage{self.level}",
            [
                onnx.helper.make_tensor_value_info(
                    name, onnx.helper.np_dtype_to_tensor_dtype(dtype), None
                )
                for name, dtype in zip(self.inputs, dtypes)
            ],
            [onnx.ValueInfoProto(name=name) for name in self.outputs],
            initializer=[g.constant_protos[name] for name in self.initializers],
            value_info=[v for v in g.model.graph.value_info if v.name in self.produced],
        )
        opsets = [o for o in g.model.opset_import if o.domain not in self.python_domains]
        sub_model = onnx.helper.make_model(
            sub_graph, opset_imports=opsets, ir_version=g.model.ir_version
        )
        sub_model.functions.extend(g.model.functions)
        return g.session(sub_model)

    def run(self, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The stage's outputs that later stages or the caller read, from ``values``."""
        if not self.outputs:
            return {}
        feeds = {name: values[name] for name in self.inputs}
        dtypes = tuple(feeds[name].dtype for name in self.inputs)
        try:
            session = self.sessions.get(dtypes)
            if session is None:
                session = self._session(dtypes)
                if self.g.keep_sessions:
                    self.sessions[dtypes] = session
            results = session.run(self.outputs, feeds)
        except Exception as error:  # onnxruntime raises its own exception types
            raise MxsimError(
                f"onnxruntime failed on stage {self.level} of the graph: {error}"
            ) from None
        return dict(zip(self.outputs, (np.asarray(r) for r in results)))


def run_graph(
    g: Graph,
    feeds: dict[str, np.ndarray],
    wanted: set[str],
    python_node=None,
    python_domains: tuple[str, ...] = (),
) -> dict[str, np.ndarray]:
    """Run the graph (see the module docstring) and return every value in ``wanted``.

    ``python_node``: None, or ``callable(node) -> None | callable(inputs) -> output``: a node
    for which it returns a function is computed by that function (on its input arrays, an
    empty input as None) instead of by onnxruntime; it may raise for a node that neither can
    run. ``python_domains``: opset domains onnxruntime cannot load, left out of every
    session's model (only ``python_node`` computes their nodes). The plan and its sessions
    are kept in ``g`` (:meth:`Graph.plan`) for the next run."""
    plan, functions = g.plan(python_node, wanted, python_domains)
    values = plan.run(feeds, functions)
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


#: Graphs of model files kept by :func:`load_graph` (the most recently used ones).
GRAPHS_KEPT = 2
_graphs: OrderedDict = OrderedDict()


def load_graph(model, caller: str) -> Graph:
    """The :class:`Graph` of a ``.onnx`` path or a ModelProto; errors name ``caller``.

    The Graph of a file is kept in memory, with its plans and sessions, and returned again
    while the file is unchanged (same resolved path, size, modification time and inode): the
    :data:`GRAPHS_KEPT` most recently used files (each holds the model, its weights as arrays,
    and the sessions' copies of the weights). A ModelProto gets a new Graph each time (it may
    have been changed in place since)."""
    onnx = require("onnx")
    if isinstance(model, onnx.ModelProto):
        return Graph(model, keep_sessions=True)
    path = Path(model)
    try:
        stat = path.stat()
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    except OSError:
        key = None  # load_model says what is wrong
    if key is not None and key in _graphs:
        _graphs.move_to_end(key)
        return _graphs[key]
    proto, _ = load_model(path, caller)
    g = Graph(proto, keep_sessions=True)
    if key is not None:
        _graphs[key] = g
    while len(_graphs) > GRAPHS_KEPT:
        _graphs.popitem(last=False)
    return g


def check_feeds(g: Graph, inputs: Mapping[str, np.ndarray], caller: str) -> dict[str, np.ndarray]:
    """The graph inputs as arrays, checked against the declared dtypes and fixed dimensions."""
    onnx = require("onnx")
    if not isinstance(inputs, Mapping):
        raise MxsimError(f"{caller}: inputs must map input names to numpy arrays")
    names = [i.name for i in g.inputs]
    missing = [n for n in names if n not in inputs]
    extra = [n for n in inputs if n not in names]
    if missing or extra:
        raise MxsimError(
            f"{caller}: the model's inputs are {names}; missing {missing}, unexpected {extra}"
        )
    feeds = {}
    for info in g.inputs:
        array = np.asarray(inputs[info.name])
        elem_type = info.type.tensor_type.elem_type
        if elem_type:
            expected = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
            if array.dtype != expected:
                raise MxsimError(
                    f"{caller}: input {info.name!r} must be {expected}, got {array.dtype}"
                )
        dims = info.type.tensor_type.shape.dim
        if info.type.tensor_type.HasField("shape"):
            if len(dims) != array.ndim:
                raise MxsimError(
                    f"{caller}: input {info.name!r} must be {len(dims)}-d, got shape {array.shape}"
                )
            for axis, (dim, size) in enumerate(zip(dims, array.shape)):
                if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != size:
                    raise MxsimError(
                        f"{caller}: input {info.name!r} axis {axis} must be {dim.dim_value}, "
                        f"got shape {array.shape}"
                    )
        feeds[info.name] = array
    return feeds
