"""Capture an ONNX model's MatMul / Gemm / Conv / ConvTranspose / Einsum layers into a trace (``mxsim[onnx]``).

:func:`capture_onnx` runs the model with onnxruntime on the given inputs and records, for every
MatMul, Gemm, 1-d/2-d Conv and ConvTranspose and two-operand Einsum node: the operands, the
bias, and the output, plus the quantization spec of each operand as the model itself applies
it (other matmul-like nodes are listed in ``source.skipped``):

* ``QuantizeLinear`` → ``DequantizeLinear`` feeding an operand (per-tensor, per-axis or
  blocked) → :class:`~mxsim.trace.quant.QDQQuant`; the operand recorded is the float tensor
  entering QuantizeLinear. A ``DequantizeLinear`` of a stored integer tensor (no
  QuantizeLinear) records the dequantized tensor as the operand, with its QDQ spec
  (:mod:`.onnx_qdq`).
* Quark's custom ops (domain ``com.amd.quark``, or the legacy ``com.vai.quantize`` names
  ``MXFixNeuron``/``BFPFixNeuron``): ``MXQuantizeDequantize`` → :class:`MXQuant` with the
  ``quark-onnx`` profile; ``BFPQuantizeDequantize`` → :class:`BFPQuant` (:mod:`.onnx_quark`).

The graph runs on :func:`mxsim.capture.onnx_graph.run_graph`: onnxruntime for every node but
Quark's custom ops, which onnxruntime cannot load without Quark's library and which mxsim's
quantizers compute between onnxruntime stages. Every node runs exactly once, unfused. How
nodes map to layers is :mod:`.onnx_layers`.

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

from .._optional import require
from ..errors import CaptureWarning, InputFileError, MxsimError
from ..fileio import read_npz
from ..limits import check_path
from ..trace.model import NUMERIC_DTYPES, Layer, Trace
from ..trace.validate import validate_trace
from .onnx_graph import STANDARD_DOMAINS, Graph, attributes, check_feeds, load_model, run_graph
from .onnx_layers import IDENTITY, LAYER_OP_TYPES, Skip, layer_views, plan_layers
from .onnx_qdq import qdq_spec
from .onnx_quark import QUARK_DOMAINS, quark_node_function, quark_spec


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _unique(name: str, used: set[str]) -> str:
    candidate, count = name, 1
    while candidate in used:
        count += 1
        candidate = f"{name}#{count}"
    used.add(candidate)
    return candidate


def capture_onnx(
    model,
    inputs: Mapping[str, np.ndarray],
    *,
    name: str | None = None,
    metadata: Mapping | None = None,
    dataset: Mapping[str, np.ndarray] | None = None,
    bfp_kernel: str = "cpu",
    layers=None,
) -> Trace:
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
    proto, path = load_model(model, "capture_onnx")
    ort = require("onnxruntime")
    g = Graph(proto)
    feeds = check_feeds(g, inputs, "capture_onnx")
    select = layers
    if layers is not None and not callable(layers):
        names = set(layers)
        known = {
            n.name for n in g.nodes if n.op_type in LAYER_OP_TYPES and n.domain in STANDARD_DOMAINS
        }
        if names - known:
            raise MxsimError(
                f"capture_onnx: no MatMul/Gemm/Conv node named {sorted(names - known)}"
            )

        def select_by_name(node):
            return node.name in names

        select = select_by_name
    plans, unplanned = plan_layers(g, select)
    wanted = set()
    for plan in plans:
        wanted.add(plan["output"])
        for operand in plan["operands"].values():
            wanted |= operand.names()
    quark_node = quark_node_function(bfp_kernel)
    values = run_graph(g, feeds, wanted, quark_node, QUARK_DOMAINS)
    folded = g.plan(quark_node, wanted, QUARK_DOMAINS)[0].folded  # quantized weights
    layers_out, skipped, used_names = [], list(unplanned), set()
    for plan in plans:
        node = plan["node"]
        layer_name = _unique(node.name or f"{node.op_type}_{plan['index']}", used_names)
        ops = plan["operands"]
        x, w = values[ops["input"].value], values[ops["weight"].value]
        node_attrs = attributes(node)
        try:
            if x.dtype.kind != "f" or w.dtype.kind != "f":
                raise Skip(f"non-float operands ({x.dtype}, {w.dtype})")
            op, attrs, views, details = layer_views(
                node, node_attrs, x, w, values[plan["output"]], "bias" in ops
            )
        except Skip as why:
            skipped.append({"name": layer_name, "op": node.op_type, "reason": str(why)})
            continue
        tensors = {"output": views.get("output", IDENTITY).array(values[plan["output"]])}
        quant = {}
        source = {"node": node.name, "op_type": node.op_type, **details}
        if plan["fused_add"] is not None:
            source["fused_add"] = plan["fused_add"].name
        quant_nodes = {}
        for role, operand in ops.items():
            view = views.get(role, IDENTITY)
            value = values[operand.value]
            quantized = values[operand.quantized] if operand.quantized else None
            spec, why = None, None
            if operand.kind == "quark":
                spec = quark_spec(operand.nodes[0], value.ndim, bfp_kernel)
            elif operand.kind == "qdq":
                spec, why = qdq_spec(g, operand, values, value.ndim)
            if spec is not None:
                spec, lost = view.spec(spec)
                why = why or lost
            tensors[role] = view.array(value)
            if (
                quantized is not None
            ):  # kept even when the spec was not recognised: it is what the node read
                tensors[f"{role}_quantized"] = view.array(quantized)
            quant[role] = spec
            if operand.nodes:
                quant_nodes[role] = (
                    operand.nodes[-1].name if operand.kind == "qdq" else operand.nodes[0].name
                )
            if why:
                source.setdefault("quant_notes", {})[role] = why
        if quant_nodes:
            source["quant_nodes"] = quant_nodes
        source["weight_is_constant"] = (
            g.is_constant(ops["weight"].value) or ops["weight"].value in folded
        )
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
        listed = "; ".join(
            f"{entry['name']} ({entry['op']}): {entry['reason']}" for entry in skipped[:5]
        )
        more = f"; and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        warnings.warn(
            f"capture_onnx: {len(skipped)} matmul-like node(s) not captured, listed in source.skipped: "
            f"{listed}{more}",
            CaptureWarning,
            stacklevel=2,
        )
    if layers is not None:
        trace_source["selected_layers"] = [layer.name for layer in layers_out]
    trace_name = name or (path.stem if path is not None else (proto.graph.name or "onnx-model"))
    trace = Trace(
        trace_name,
        layers_out,
        trace_source,
        dict(metadata or {}),
        None if dataset is None else {k: np.asarray(v) for k, v in dataset.items()},
    )
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
