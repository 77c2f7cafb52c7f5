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


def _matmul_batch(layer: Layer) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(layer.input.shape[:-2], layer.weight.shape[:-2]))


def gemm_shape(layer: Layer) -> GemmShape:
    """The GEMM dimensions of ``layer``."""
    x, w = layer.input.shape, layer.weight.shape
    if layer.op == "linear":
        k = w[1]
        return GemmShape(1, int(np.prod(x[:-1], dtype=np.int64)), w[0], k, k)
    if layer.op == "matmul":
        k = x[-1]
        if len(w) == 2:
            return GemmShape(1, int(np.prod(x[:-1], dtype=np.int64)), w[-1], k, k)
        batch = _matmul_batch(layer)
        return GemmShape(int(np.prod(batch, dtype=np.int64)), x[-2], w[-1], k, k)
    if layer.op in CONV_OPS:
        gm = _conv2d_geometry(layer)
        return GemmShape(gm.groups, gm.gemm_m, gm.filters_per_group, gm.gemm_k, gm.channels_per_group)
    raise MxsimError(f"layer {layer.name!r}: unknown op {layer.op!r}")


def _conv2d_geometry(layer: Layer) -> conv.Conv2dGeometry:
    """The conv2d whose GEMM view is the layer's (a conv_transpose2d's equivalent convolution)."""
    gm = layer.conv_geometry()
    return gm if layer.op == "conv2d" else gm.equivalent_conv()


def _as_conv2d_operand(layer: Layer, array: np.ndarray, from_transposed) -> np.ndarray:
    """A conv layer's operand as :func:`_conv2d_geometry`'s conv2d reads it: unchanged for a
    conv2d, ``from_transposed(array, geometry)`` for a conv_transpose2d."""
    return array if layer.op == "conv2d" else from_transposed(array, layer.conv_geometry())


def _operand(layer: Layer, name: str, value):
    array = layer.tensors[name] if value is None else np.asarray(value)
    if array.shape != layer.tensors[name].shape:
        raise MxsimError(f"layer {layer.name!r}: {name} must have shape {layer.tensors[name].shape}, got {array.shape}")
    return array


def lower_input(layer: Layer, x: np.ndarray | None = None) -> np.ndarray:
    """A (G, M, K) for the layer input, or for any array of the input's shape (e.g. a
    quantized copy). Values are copied unchanged, in ``x``'s dtype."""
    x = _operand(layer, "input", x)
    if layer.op in CONV_OPS:
        return conv.im2col(_as_conv2d_operand(layer, x, conv.conv_transpose2d_lowered_input), _conv2d_geometry(layer))
    k = x.shape[-1]
    if layer.op == "matmul" and layer.weight.ndim > 2:
        batch = _matmul_batch(layer)
        return np.ascontiguousarray(np.broadcast_to(x, batch + x.shape[-2:])).reshape(-1, x.shape[-2], k)
    return np.ascontiguousarray(x).reshape(1, -1, k)


def lower_weight(layer: Layer, w: np.ndarray | None = None) -> np.ndarray:
    """B (G, N, K) for the layer weight, or for any array of the weight's shape."""
    w = _operand(layer, "weight", w)
    if layer.op in CONV_OPS:
        return conv.weight_matrix(_as_conv2d_operand(layer, w, conv.conv_transpose2d_conv_weight),
                                  _conv2d_geometry(layer))
    if layer.op == "linear":
        return np.ascontiguousarray(w)[None]
    if w.ndim == 2:
        return np.ascontiguousarray(w.T)[None]
    batch = _matmul_batch(layer)
    full = np.broadcast_to(w, batch + w.shape[-2:]).reshape(-1, *w.shape[-2:])
    return np.ascontiguousarray(full.transpose(0, 2, 1))


def lift_output(layer: Layer, c: np.ndarray, bias: np.ndarray | None | str = "layer") -> np.ndarray:
    """Map GEMM results C (G, M, N) back to the layer's output layout and add the bias.

    ``bias``: ``"layer"`` uses the layer's own bias (if any), None adds none, or an array.
    Linear and matmul layers apply ``alpha``/``beta`` from their attrs. Arithmetic is in C's dtype.
    """
    shape = gemm_shape(layer)
    c = np.asarray(c)
    if c.shape != (shape.groups, shape.m, shape.n):
        raise MxsimError(f"layer {layer.name!r}: GEMM result must have shape {(shape.groups, shape.m, shape.n)}, "
                         f"got {c.shape}")
    if isinstance(bias, str):
        bias = layer.bias
    if layer.op in CONV_OPS:
        out = conv.col2im_output(c, _conv2d_geometry(layer))
        if bias is not None:
            out = out + np.asarray(bias, dtype=c.dtype).reshape(1, -1, 1, 1)
        return out
    out = c.reshape(layer.output.shape)
    alpha = layer.attrs.get("alpha", 1.0)
    beta = layer.attrs.get("beta", 1.0)
    if alpha != 1.0:
        out = out * c.dtype.type(alpha)
    if bias is not None:
        bias = np.asarray(bias, dtype=c.dtype)
        out = out + (bias * c.dtype.type(beta) if beta != 1.0 else bias)
    return out


def gemm_reference(layer: Layer, *, quantized: bool = True, dtype=np.float64) -> np.ndarray:
    """The layer's output recomputed through its GEMM view in ``dtype`` (float64 default).

    With ``quantized=True`` each operand's ``<operand>_quantized`` tensor is used where the
    trace has one (what the source model actually multiplied), else the operand itself.
    """
    def pick(name):
        value = layer.quantized(name) if quantized else None
        return layer.tensors.get(name) if value is None else value

    a = lower_input(layer, pick("input")).astype(dtype)
    b = lower_weight(layer, pick("weight")).astype(dtype)
    c = np.matmul(a, b.transpose(0, 2, 1))
    bias = pick("bias")
    return lift_output(layer, c, None if bias is None else bias.astype(dtype))


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
