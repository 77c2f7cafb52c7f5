"""The GEMM view of a trace layer: what a matrix unit computes for it, and how results map back.

Convention (the same for every op)::

    A: (G, M, K)   activations, one row per output position, reduction K innermost
    B: (G, N, K)   weights, one row per output channel, reduction K innermost
    C[g] = A[g] @ B[g].T            (G, M, N)

Both operands are row-major along K, so MX/BFP blocks along K are blocks along the last
axis of both (``axis=-1``), as a hardware dot-product unit consumes them; a datapath that
takes B as (K, N) (``mxsim.matmul``) gets ``B[g].T``, blocked along axis 0. ``G`` is 1 except
for grouped convolutions (G = groups) and batched matmuls whose weight has batch dims.

Per op (``x`` = layer input, ``w`` = weight):

* ``linear`` — x (..., K), w (N, K): A = x.reshape(1, -1, K), B = w[None];
  output = alpha * C[0].reshape(x.shape[:-1] + (N,)) + beta * bias.
* ``matmul`` — x (..., M, K), w (..., K, N): with a 2-d w, G = 1, A = x.reshape(1, -1, K);
  otherwise G = prod(broadcast batch dims), A = x broadcast to (batch, M, K), B = w broadcast
  to (batch, K, N) then swapped to (G, N, K). output = C reshaped to (batch..., M, N) + bias.
* ``conv2d`` — im2col (:func:`mxsim.trace.conv.im2col`): G = groups, M = N*Ho*Wo,
  K = kh*kw*(C/groups) ordered (tap, channel) so each filter tap contributes one contiguous
  run of ``k_run = C/groups`` channels; output = col2im(C) + bias per output channel.
* ``conv_transpose2d`` — the equivalent stride-1 convolution
  (:class:`mxsim.trace.conv.ConvTranspose2dGeometry`): the input zero-upsampled by the stride
  and padded, the weight flipped with its channel axes swapped, then im2col as for conv2d
  (same G, M = N*Ho*Wo, K = kh*kw*(C/groups), ``k_run = C/groups``). Every output is one dot
  product inside the unit; inserted zeros give all-zero runs.

Quantization axes: a spec's ``axis`` indexes the operand as stored in the trace;
:func:`gemm_axis` says which GEMM dimension it becomes. When it is ``"K"`` and the spec's
block size divides ``k_run``, quantizing the operand along that axis and then lowering gives
exactly the same values as lowering and then quantizing the GEMM operand along K (every block
is one block in both views; im2col's zero padding forms all-zero blocks, which stay zero).
Otherwise the two differ and replay must quantize in the operand's own layout (or pad each
K run to whole blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import MxsimError
from ..trace import conv
from ..trace.model import CONV_OPS, Layer


@dataclass(frozen=True)
class GemmShape:
    """Dimensions of a layer's GEMM view: ``groups`` GEMMs of (M x K) @ (K x N).

    ``k_run``: K is made of K / k_run runs of k_run consecutive elements of the operands'
    reduction (channel) axis — C/groups for conv2d, K itself for linear and matmul.
    """

    groups: int
    m: int
    n: int
    k: int
    k_run: int

    @property
    def macs(self) -> int:
        return self.groups * self.m * self.n * self.k


@dataclass(frozen=True)
class GemmView:
    """A layer's GEMM view, worked out once (:func:`gemm_view`) and then only read: the
    dimensions, the conv geometry and the shapes it lowers and lifts.

    ``conv``: the conv2d whose im2col is the GEMM (a conv_transpose2d's equivalent
    convolution), None for linear and matmul; ``transposed``: a conv_transpose2d's own
    geometry (its operands are turned into ``conv``'s first); ``batch``: the broadcast batch
    dims of a matmul whose weight has batch dims, else None; ``alpha``/``beta``: a linear or
    matmul layer's output scale and bias scale.
    """

    name: str
    op: str
    attrs: dict
    shape: GemmShape
    input_shape: tuple
    weight_shape: tuple
    output_shape: tuple
    conv: conv.Conv2dGeometry | None = None
    transposed: conv.ConvTranspose2dGeometry | None = None
    batch: tuple | None = None

    @property
    def alpha(self) -> float:
        return self.attrs.get("alpha", 1.0)

    @property
    def beta(self) -> float:
        return self.attrs.get("beta", 1.0)

    def with_operand_shapes(self, input_shape: tuple, weight_shape: tuple) -> GemmView:
        """The same layer's view over operands of other shapes (its reduction runs padded)."""
        return _view(
            self.name,
            self.op,
            self.attrs,
            tuple(input_shape),
            tuple(weight_shape),
            self.output_shape,
        )

    def _check(self, array: np.ndarray, name: str, shape: tuple) -> np.ndarray:
        if array.shape != shape:
            raise MxsimError(
                f"layer {self.name!r}: {name} must have shape {shape}, got {array.shape}"
            )
        return array

    def lower_input(self, x) -> np.ndarray:
        """A (G, M, K) for an array of the input's shape. Values are copied unchanged, in ``x``'s dtype."""
        x = self._check(np.asarray(x), "input", self.input_shape)
        if self.conv is not None:
            lowered = (
                x
                if self.transposed is None
                else conv.conv_transpose2d_lowered_input(x, self.transposed)
            )
            return conv.im2col(lowered, self.conv)
        k = x.shape[-1]
        if self.batch is not None:
            groups = int(
                np.prod(self.batch, dtype=np.int64)
            )  # explicit sizes: -1 is ambiguous for empty arrays
            return np.ascontiguousarray(np.broadcast_to(x, self.batch + x.shape[-2:])).reshape(
                groups, x.shape[-2], k
            )
        return np.ascontiguousarray(x).reshape(1, int(np.prod(x.shape[:-1], dtype=np.int64)), k)

    def lower_weight(self, w) -> np.ndarray:
        """B (G, N, K) for an array of the weight's shape."""
        w = self._check(np.asarray(w), "weight", self.weight_shape)
        if self.conv is not None:
            lowered = (
                w
                if self.transposed is None
                else conv.conv_transpose2d_conv_weight(w, self.transposed)
            )
            return conv.weight_matrix(lowered, self.conv)
        if self.op == "linear":
            return np.ascontiguousarray(w)[None]
        if self.batch is None:
            return np.ascontiguousarray(w.T)[None]
        full = np.broadcast_to(w, self.batch + w.shape[-2:]).reshape(
            int(np.prod(self.batch, dtype=np.int64)), *w.shape[-2:]
        )
        return np.ascontiguousarray(full.transpose(0, 2, 1))

    def lift(self, c: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        """GEMM results C (G, M, N) in the layer's output layout, ``bias`` (or None) added;
        linear and matmul layers apply ``alpha``/``beta``. Arithmetic is in C's dtype."""
        shape = self.shape
        c = np.asarray(c)
        if c.shape != (shape.groups, shape.m, shape.n):
            raise MxsimError(
                f"layer {self.name!r}: GEMM result must have shape {(shape.groups, shape.m, shape.n)}, "
                f"got {c.shape}"
            )
        if self.conv is not None:
            out = conv.col2im_output(c, self.conv)
            if bias is not None:
                out = out + np.asarray(bias, dtype=c.dtype).reshape(1, -1, 1, 1)
            return out
        out = c.reshape(self.output_shape)
        alpha, beta = self.alpha, self.beta
        if alpha != 1.0:
            out = out * c.dtype.type(alpha)
        if bias is not None:
            bias = np.asarray(bias, dtype=c.dtype)
            out = out + (bias * c.dtype.type(beta) if beta != 1.0 else bias)
        return out

    def gemm_bias(self, bias: np.ndarray | None) -> np.ndarray | None:
        """``bias`` (as the layer adds it) laid out like the GEMM result (G, M, N), float64;
        a linear or matmul layer's is a read-only broadcast view where numpy can make one
        (its rows one array: stride 0)."""
        if bias is None:
            return None
        shape = self.shape
        bias = np.asarray(bias, dtype=np.float64)
        if self.conv is not None:  # one bias per output channel, output channels grouped
            per_group = bias.reshape(shape.groups, 1, shape.n)
            return np.ascontiguousarray(
                np.broadcast_to(per_group, (shape.groups, shape.m, shape.n))
            )
        if self.op == "linear" and self.beta != 1.0:
            bias = bias * self.attrs["beta"]
        return np.broadcast_to(bias, self.output_shape).reshape(shape.groups, shape.m, shape.n)


def _view(
    name: str, op: str, attrs: dict, x: tuple, w: tuple, output_shape: tuple | None
) -> GemmView:
    """The one place a GEMM view is worked out (``output_shape`` None: from the op)."""

    def out(derived: tuple) -> tuple:
        return derived if output_shape is None else output_shape

    if op == "linear":
        k = w[1]
        shape = GemmShape(1, int(np.prod(x[:-1], dtype=np.int64)), w[0], k, k)
        return GemmView(name, op, attrs, shape, x, w, out(x[:-1] + (w[0],)))
    if op == "matmul":
        k = x[-1]
        if len(w) == 2:
            shape = GemmShape(1, int(np.prod(x[:-1], dtype=np.int64)), w[-1], k, k)
            return GemmView(name, op, attrs, shape, x, w, out(x[:-1] + (w[-1],)))
        batch = tuple(np.broadcast_shapes(x[:-2], w[:-2]))
        shape = GemmShape(int(np.prod(batch, dtype=np.int64)), x[-2], w[-1], k, k)
        return GemmView(name, op, attrs, shape, x, w, out(batch + (x[-2], w[-1])), batch=batch)
    if op in CONV_OPS:
        a = attrs
        if op == "conv2d":
            gm = conv.Conv2dGeometry.from_shapes(
                x, w, a["stride"], a["padding"], a["dilation"], a["groups"]
            )
            transposed = None
        else:
            transposed = conv.ConvTranspose2dGeometry.from_shapes(
                x, w, a["stride"], a["padding"], a["output_padding"], a["dilation"], a["groups"]
            )
            gm = transposed.equivalent_conv()
        shape = GemmShape(
            gm.groups, gm.gemm_m, gm.filters_per_group, gm.gemm_k, gm.channels_per_group
        )
        return GemmView(name, op, attrs, shape, x, w, tuple(gm.output_shape), gm, transposed)
    raise MxsimError(f"layer {name!r}: unknown op {op!r}")


def gemm_view(layer: Layer, input_shape: tuple | None = None) -> GemmView:
    """``layer``'s GEMM view (for an input of ``input_shape``, default the recorded input's:
    then a linear or matmul layer lifts to its recorded output's shape)."""
    x = layer.input.shape if input_shape is None else tuple(input_shape)
    recorded = layer.output.shape if input_shape is None and layer.op not in CONV_OPS else None
    return _view(layer.name, layer.op, layer.attrs, tuple(x), tuple(layer.weight.shape), recorded)


def gemm_shape(layer: Layer) -> GemmShape:
    """The GEMM dimensions of ``layer``."""
    return gemm_view(layer).shape


def _operand(layer: Layer, name: str, value):
    return layer.tensors[name] if value is None else np.asarray(value)


def lower_input(layer: Layer, x: np.ndarray | None = None) -> np.ndarray:
    """A (G, M, K) for the layer input, or for any array of the input's shape (e.g. a
    quantized copy). Values are copied unchanged, in ``x``'s dtype."""
    return gemm_view(layer).lower_input(_operand(layer, "input", x))


def lower_weight(layer: Layer, w: np.ndarray | None = None) -> np.ndarray:
    """B (G, N, K) for the layer weight, or for any array of the weight's shape."""
    return gemm_view(layer).lower_weight(_operand(layer, "weight", w))


def lift_output(layer: Layer, c: np.ndarray, bias: np.ndarray | None | str = "layer") -> np.ndarray:
    """Map GEMM results C (G, M, N) back to the layer's output layout and add the bias.

    ``bias``: ``"layer"`` uses the layer's own bias (if any), None adds none, or an array.
    Linear and matmul layers apply ``alpha``/``beta`` from their attrs. Arithmetic is in C's dtype.
    """
    return gemm_view(layer).lift(c, layer.bias if isinstance(bias, str) else bias)


def gemm_reference(layer: Layer, *, quantized: bool = True, dtype=np.float64) -> np.ndarray:
    """The layer's output recomputed through its GEMM view in ``dtype`` (float64 default).

    With ``quantized=True`` each operand's ``<operand>_quantized`` tensor is used where the
    trace has one (what the source model actually multiplied), else the operand itself.
    """

    def pick(name):
        value = layer.quantized(name) if quantized else None
        return layer.tensors.get(name) if value is None else value

    view = gemm_view(layer)
    a = view.lower_input(pick("input")).astype(dtype)
    b = view.lower_weight(pick("weight")).astype(dtype)
    c = np.matmul(a, b.transpose(0, 2, 1))
    bias = pick("bias")
    return view.lift(c, None if bias is None else bias.astype(dtype))


def gemm_axis(layer: Layer, operand: str, axis: int) -> str:
    """Which GEMM dimension axis ``axis`` of ``operand`` (``input`` or ``weight``) becomes.

    Returns ``"K"`` (the reduction: runs of ``k_run`` along K), ``"M"``, ``"N"``, ``"G"``
    (batch of a batched matmul), or for conv2d ``"spatial"`` (input H/W: spread over M and
    K) and ``"taps"`` (weight kh/kw: the run index within K). conv_transpose2d: input as
    conv2d; weight (C, O/groups, kh, kw): 0 → ``"K"``, 1 → ``"N"``, 2, 3 → ``"taps"``.
    """
    if operand not in ("input", "weight"):
        raise MxsimError(f"gemm_axis: operand must be 'input' or 'weight', got {operand!r}")
    ndim = layer.tensors[operand].ndim
    if not -ndim <= axis < ndim:
        raise MxsimError(f"gemm_axis: axis {axis} is out of range for the {ndim}-d {operand}")
    axis %= ndim
    if layer.op in CONV_OPS:
        if operand == "input":
            return {0: "M", 1: "K", 2: "spatial", 3: "spatial"}[axis]
        if layer.op == "conv_transpose2d":
            return {0: "K", 1: "N", 2: "taps", 3: "taps"}[axis]
        return {0: "N", 1: "K", 2: "taps", 3: "taps"}[axis]
    if layer.op == "linear":
        if operand == "input":
            return "K" if axis == ndim - 1 else "M"
        return "K" if axis == 1 else "N"
    batched = layer.weight.ndim > 2
    if operand == "input":
        if axis == ndim - 1:
            return "K"
        return "M" if axis == ndim - 2 or not batched else "G"
    if axis == ndim - 2:
        return "K"
    return "N" if axis == ndim - 1 else "G"
