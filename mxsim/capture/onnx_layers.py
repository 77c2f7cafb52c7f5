"""How ONNX nodes become trace layers: which nodes are layers, and each tensor's layout.

``Gemm`` -> ``linear`` (A transposed if ``transA``, B stored as (N, K), i.e. transposed when
``transB`` is 0; spec axes follow the transposes; ``alpha``/``beta`` kept); ``MatMul`` ->
``matmul`` (with a following constant-bias ``Add`` fused; a 1-d operand promoted to a 1-row /
1-column matrix); ``Conv`` -> ``conv2d`` and ``ConvTranspose`` -> ``conv_transpose2d`` (2-d,
or 1-d as height 1; ``pads``/``auto_pad``/``output_shape`` made explicit); a two-operand
``Einsum`` -> ``matmul`` (batch, M, K, N index groups). A :class:`View` maps one tensor of a
node (and a quantization spec along one of its axes) to the layer's layout.
"""

from __future__ import annotations

import numpy as np

from ..errors import MxsimError
from ..trace.model import Layer
from ..trace.quant import QDQQuant
from .onnx_graph import STANDARD_DOMAINS, Graph, text
from .onnx_qdq import Operand, trace_operand

LAYER_OP_TYPES = ("MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum")
#: Words in the op type of nodes (any domain) that multiply matrices: such a node that is not
#: captured as a layer is listed in ``source.skipped`` (MatMulInteger, QLinearConv, LSTM,
#: com.microsoft Attention, ...).
GEMM_LIKE_WORDS = ("MatMul", "Gemm", "Conv", "Attention", "LSTM", "GRU", "RNN", "Einsum")


def _spatial_attrs(attrs: dict, input_shape) -> tuple[str, int, list[int], list[int]]:
    """(auto_pad, number of spatial axes, strides, dilations) of an ONNX Conv / ConvTranspose node."""
    spatial = len(input_shape) - 2
    return (
        text(attrs.get("auto_pad", "NOTSET")),
        spatial,
        [int(v) for v in attrs.get("strides", [1] * spatial)],
        [int(v) for v in attrs.get("dilations", [1] * spatial)],
    )


def _explicit_pads(attrs: dict, spatial: int) -> list[list[int]]:
    """ONNX ``pads`` (all befores, then all afters) as [[before, after] per spatial axis]."""
    pads = [int(v) for v in attrs.get("pads", [0] * 2 * spatial)]
    return [[pads[i], pads[i + spatial]] for i in range(spatial)]


def _conv_padding(attrs: dict, input_shape, weight_shape) -> list[list[int]]:
    """ONNX Conv pads / auto_pad as [[before, after] per spatial axis] ([[top, bottom], [left, right]] in 2-d)."""
    auto_pad, spatial, strides, dilations = _spatial_attrs(attrs, input_shape)
    if auto_pad in ("NOTSET", ""):
        return _explicit_pads(attrs, spatial)
    if auto_pad == "VALID":
        return [[0, 0] for _ in range(spatial)]
    pairs = []
    for size, kernel, stride, dilation in zip(
        input_shape[2:], weight_shape[2:], strides, dilations
    ):
        out = -(-size // stride)
        total = max(0, (out - 1) * stride + dilation * (kernel - 1) + 1 - size)
        small, large = total // 2, total - total // 2
        pairs.append([small, large] if auto_pad == "SAME_UPPER" else [large, small])
    return pairs


def _fused_bias(g: Graph, node) -> tuple[object, str] | None:
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


def plan_layers(g: Graph, select):
    """(plans of the layers to capture, skipped entries of the matmul-like nodes that are not layers)."""
    plans, unplanned = [], []
    for index, node in enumerate(g.nodes):
        if select is not None and not select(node):
            continue
        if node.op_type not in LAYER_OP_TYPES or node.domain not in STANDARD_DOMAINS:
            if any(word in node.op_type for word in GEMM_LIKE_WORDS):
                unplanned.append(
                    {
                        "name": node.name or f"{node.op_type}_{index}",
                        "op": f"{node.domain}::{node.op_type}" if node.domain else node.op_type,
                        "reason": "a matmul-like op that capture does not lower to a GEMM layer",
                    }
                )
            continue
        if node.op_type == "Einsum" and len(node.input) != 2:
            unplanned.append(
                {
                    "name": node.name or f"Einsum_{index}",
                    "op": "Einsum",
                    "reason": f"{len(node.input)} operands (only two-operand contractions are layers)",
                }
            )
            continue
        operands = {
            "input": trace_operand(g, node.input[0]),
            "weight": trace_operand(g, node.input[1]),
        }
        output = node.output[0]
        fused = None
        if (
            node.op_type in ("Gemm", "Conv", "ConvTranspose")
            and len(node.input) > 2
            and node.input[2]
        ):
            operands["bias"] = trace_operand(g, node.input[2])
        elif node.op_type == "MatMul":
            fused = _fused_bias(g, node)
            if fused is not None:
                output = fused[0].output[0]
                operands["bias"] = Operand(fused[1])
        plans.append(
            {
                "index": index,
                "node": node,
                "operands": operands,
                "output": output,
                "fused_add": None if fused is None else fused[0],
            }
        )
    return plans, unplanned


class Skip(Exception):
    """A layer node that cannot be recorded; the message is the reason."""


class View:
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
        if (
            isinstance(spec, QDQQuant) and spec.block_size
        ):  # the blocked scale has the operand's layout
            zero = None if spec.zero_point is None else self.array(spec.zero_point)
            return QDQQuant(
                spec.dtype, self.array(spec.scale), zero, axis, spec.block_size, spec.saturate
            ), None
        return spec.with_axis(axis), None


IDENTITY = View()
_TRANSPOSE = View(lambda a: a.T, lambda axis: 1 - axis % 2)
_CONV1D = View(lambda a: a[:, :, None], lambda axis: axis % 3 + (axis % 3 >= 2))


def _einsum_views(equation: str, x: np.ndarray, w: np.ndarray):
    """A two-operand Einsum as a (batched) matmul: input (batch..., M, K), weight (batch..., K, N),
    output (batch..., M, N), where batch are the indices of both operands and the output, K the
    contracted ones, M / N the free indices of each operand (each group flattened, in order)."""
    text = equation.replace(" ", "")
    if "..." in text or "->" not in text:
        raise Skip(f"einsum {equation!r}: only explicit equations without '...' are layers")
    lhs, out = text.split("->")
    terms = lhs.split(",")
    a, b = terms
    if any(len(set(t)) != len(t) for t in (a, b, out)):
        raise Skip(f"einsum {equation!r}: a repeated index (diagonal) is not a matmul")
    batch = [c for c in a if c in b and c in out]
    contract = [c for c in a if c in b and c not in out]
    left, right = [c for c in a if c not in b], [c for c in b if c not in a]
    if set(left + right) - set(out) or set(out) - set(batch + left + right):
        raise Skip(f"einsum {equation!r}: an index summed within one operand is not a matmul")
    sizes = {c: n for term, array in ((a, x), (b, w)) for c, n in zip(term, array.shape)}
    if any(x.shape[a.index(c)] != w.shape[b.index(c)] for c in batch + contract):
        raise Skip(f"einsum {equation!r}: operand dims differ ({x.shape}, {w.shape})")
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

        return View(array, axis_map)

    m, k, n = flat(left), flat(contract), flat(right)
    return {
        "input": view(a, batch + left + contract, (m, k)),
        "weight": view(b, batch + contract + right, (k, n)),
        "output": view(out, batch + left + right, (m, n)),
    }


def _conv_transpose_padding(attrs: dict, input_shape, weight_shape) -> list[list[int]]:
    """ONNX ConvTranspose pads / output_shape / auto_pad as [[top, bottom], [left, right]]."""
    auto_pad, spatial, strides, dilations = _spatial_attrs(attrs, input_shape)
    output_padding = list(attrs.get("output_padding", [0] * spatial))
    if "output_shape" not in attrs and auto_pad in ("NOTSET", "", "VALID"):
        return (
            _explicit_pads(attrs, spatial)
            if auto_pad in ("NOTSET", "")
            else [[0, 0] for _ in range(spatial)]
        )
    targets = list(attrs.get("output_shape", []))[-spatial:] or [
        size * s for size, s in zip(input_shape[2:], strides)
    ]
    pairs = []
    for size, kernel, stride, dilation, extra, target in zip(
        input_shape[2:], weight_shape[2:], strides, dilations, output_padding, targets
    ):
        total = stride * (size - 1) + extra + (kernel - 1) * dilation + 1 - target
        if total < 0:
            raise Skip(f"output_shape {targets} is larger than the transposed convolution produces")
        # ONNX: SAME_UPPER puts the larger half at the end; otherwise at the start
        half = total // 2
        pairs.append([half, total - half] if auto_pad == "SAME_UPPER" else [total - half, half])
    return pairs


def layer_views(
    node, node_attrs: dict, x: np.ndarray, w: np.ndarray, out: np.ndarray, has_bias: bool
):
    """(op, attrs, views of input/weight/bias/output, source details) of a layer node, or Skip."""
    op_type = node.op_type
    views = {}
    details = {}
    if op_type in ("Conv", "ConvTranspose"):
        if x.ndim not in (3, 4) or w.ndim != x.ndim:
            raise Skip(f"{x.ndim - 2}-d convolution (only 1-d and 2-d are captured)")
        spatial = x.ndim - 2
        if spatial == 1:  # height 1
            views = {"input": _CONV1D, "weight": _CONV1D, "output": _CONV1D}
            details["conv1d_as_2d"] = True
        _, _, strides, dilations = _spatial_attrs(node_attrs, x.shape)
        if op_type == "Conv":
            padding = _conv_padding(node_attrs, x.shape, w.shape)
        else:
            padding = _conv_transpose_padding(node_attrs, x.shape, w.shape)
        attrs = {
            "stride": strides,
            "padding": padding,
            "dilation": dilations,
            "groups": int(node_attrs.get("group", 1)),
        }
        if spatial == 1:
            attrs = {
                "stride": [1] + strides,
                "padding": [[0, 0]] + padding,
                "dilation": [1] + dilations,
                "groups": attrs["groups"],
            }
        if op_type == "ConvTranspose":
            extra = [int(v) for v in node_attrs.get("output_padding", [0] * spatial)]
            attrs["output_padding"] = [0] + extra if spatial == 1 else extra
        op = "conv2d" if op_type == "Conv" else "conv_transpose2d"
        layer = Layer(
            "check",
            op,
            {
                "input": views.get("input", IDENTITY).array(x),
                "weight": views.get("weight", IDENTITY).array(w),
                "output": views.get("output", IDENTITY).array(out),
            },
            attrs,
        )
        try:
            expected = layer.conv_geometry().output_shape
        except MxsimError as error:
            raise Skip(str(error)) from None
        if expected != layer.output.shape:
            raise Skip(
                f"attributes give output {expected}, onnxruntime produced {layer.output.shape}"
            )
        return op, attrs, views, details
    if op_type == "Gemm":
        if node_attrs.get("transA", 0):
            views["input"] = _TRANSPOSE
        if not node_attrs.get("transB", 0):
            views["weight"] = _TRANSPOSE  # stored as (N, K)
        attrs = {
            k: float(node_attrs[k]) for k in ("alpha", "beta") if node_attrs.get(k, 1.0) != 1.0
        }
        details = {
            "transA": int(node_attrs.get("transA", 0)),
            "transB": int(node_attrs.get("transB", 0)),
        }
        return "linear", attrs, views, details
    if op_type == "Einsum":
        equation = text(node_attrs.get("equation", ""))
        return "matmul", {}, _einsum_views(equation, x, w), {"equation": equation}
    # MatMul: numpy semantics; a 1-d operand becomes a 1-row / 1-column matrix
    if x.ndim == 1 and w.ndim == 1:
        return (
            "matmul",
            {},
            {
                "input": View(lambda a: a[None, :], lambda axis: 1),
                "weight": View(lambda a: a[:, None], lambda axis: 0),
                "output": View(lambda a: a.reshape(1, 1), None),
            },
            {"promoted": "dot"},
        )
    if x.ndim == 1:
        return (
            "matmul",
            {},
            {
                "input": View(lambda a: a[None, :], lambda axis: 1),
                "output": View(lambda a: a[..., None, :], None),
            },
            {"promoted": "row"},
        )
    if w.ndim == 1:
        column = View(lambda a: a[..., None], None)
        views = {"weight": View(lambda a: a[:, None], lambda axis: 0), "output": column}
        if has_bias:
            views["bias"] = column
        return "matmul", {}, views, {"promoted": "vector"}
    return "matmul", {}, views, details
