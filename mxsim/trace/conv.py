"""2-D convolution geometry, its im2col lowering to GEMM, and an independent direct convolution.

Conventions (the trace's ``conv2d`` layer, PyTorch/ONNX semantics, cross-correlation):

* input ``x``: (N, C, H, W); weight ``w``: (O, C/groups, kh, kw); output (N, O, Ho, Wo).
* ``stride`` (sh, sw), ``dilation`` (dh, dw): positive ints.
* ``padding`` ((top, bottom), (left, right)): zeros added before/after each spatial axis
  (np.pad order, asymmetric allowed, as ONNX ``pads``).
* ``groups`` g divides C and O; output channel o reads input channels
  ``(o // (O/g)) * (C/g) + c`` for c in range(C/g).
* ``Ho = (H + top + bottom - dh*(kh-1) - 1) // sh + 1`` (floor), likewise ``Wo``; both >= 1.

Output element:
``out[n, o, y, x] = sum_{c, i, j} w[o, c, i, j] * xpad[n, g(o)*C/g + c, y*sh + i*dh, x*sw + j*dw]``.

:func:`im2col` and :func:`conv2d_im2col` implement this by lowering to GEMMs (see
:mod:`mxsim.replay.lowering` for the (G, M, K) / (G, N, K) layout); :func:`conv2d_direct` is
written separately from them — explicit loops over output positions and filter taps with
bounds checks instead of a padded copy — so that tests can check one against the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import MxsimError
from ..limits import is_integer


def _pair(value, name: str) -> tuple[int, int]:
    if is_integer(value):
        value = (value, value)
    try:
        first, second = value
    except (TypeError, ValueError):
        raise MxsimError(
            f"conv2d: {name} must be an int or a pair of ints, got {value!r}"
        ) from None
    for item in (first, second):
        if not is_integer(item):
            raise MxsimError(f"conv2d: {name} must hold ints, got {value!r}")
    return int(first), int(second)


def normalize_padding(padding) -> tuple[tuple[int, int], tuple[int, int]]:
    """Padding as ((top, bottom), (left, right)).

    Accepts an int p (all sides), a pair (ph, pw) (symmetric, PyTorch), a 4-sequence
    (top, left, bottom, right) (ONNX ``pads`` order) or a pair of pairs (np.pad order).
    """
    if is_integer(padding):
        p = int(padding)
        result = ((p, p), (p, p))
    else:
        items = list(padding)
        if len(items) == 4 and all(isinstance(v, (int, np.integer)) for v in items):
            top, left, bottom, right = (int(v) for v in items)
            result = ((top, bottom), (left, right))
        elif len(items) == 2 and all(isinstance(v, (int, np.integer)) for v in items):
            ph, pw = (int(v) for v in items)
            result = ((ph, ph), (pw, pw))
        elif len(items) == 2:
            result = (_pair(items[0], "padding"), _pair(items[1], "padding"))
        else:
            raise MxsimError(f"conv2d: cannot read padding {padding!r}")
    if any(v < 0 for pair in result for v in pair):
        raise MxsimError(f"conv2d: padding must be non-negative, got {result}")
    return result


_SIZES = (
    "batch",
    "in_channels",
    "height",
    "width",
    "out_channels",
    "kernel_height",
    "kernel_width",
    "groups",
)


def _check_groups(groups, op: str) -> int:
    if not is_integer(groups) or groups < 1:
        raise MxsimError(f"{op}: groups must be a positive int, got {groups!r}")
    return int(groups)


@dataclass(frozen=True)
class _Grouped:
    """What the conv2d and conv_transpose2d geometries share: the sizes, stride and padding
    fields (each geometry adds its own after them), their checks, channel groups, and the
    shapes that follow. ``_OP`` names the operation in error messages."""

    batch: int
    in_channels: int
    height: int
    width: int
    out_channels: int
    kernel_height: int
    kernel_width: int
    stride: tuple[int, int] = (1, 1)
    padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))

    _OP = ""

    def _check_common(self) -> None:
        for name in _SIZES:
            value = getattr(self, name)
            if not is_integer(value) or value < 1:
                raise MxsimError(f"{self._OP}: {name} must be a positive int, got {value!r}")
        object.__setattr__(self, "stride", _pair(self.stride, "stride"))
        object.__setattr__(self, "dilation", _pair(self.dilation, "dilation"))
        object.__setattr__(self, "padding", normalize_padding(self.padding))
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise MxsimError(
                f"{self._OP}: groups {self.groups} must divide in_channels {self.in_channels} "
                f"and out_channels {self.out_channels}"
            )

    @property
    def channels_per_group(self) -> int:
        return self.in_channels // self.groups

    @property
    def filters_per_group(self) -> int:
        return self.out_channels // self.groups

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.in_channels, self.height, self.width)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.out_channels, self.out_height, self.out_width)


@dataclass(frozen=True)
class Conv2dGeometry(_Grouped):
    """Shapes and hyper-parameters of one 2-D convolution (validated on creation)."""

    dilation: tuple[int, int] = (1, 1)
    groups: int = 1

    _OP = "conv2d"

    def __post_init__(self):
        self._check_common()
        if min(self.stride) < 1 or min(self.dilation) < 1:
            raise MxsimError(
                f"conv2d: stride and dilation must be >= 1, got {self.stride}, {self.dilation}"
            )
        if self.out_height < 1 or self.out_width < 1:
            raise MxsimError(
                f"conv2d: the dilated kernel ({self.kernel_height}x{self.kernel_width}, dilation "
                f"{self.dilation}) does not fit the padded input ({self.height}x{self.width}, "
                f"padding {self.padding})"
            )

    @classmethod
    def from_shapes(cls, input_shape, weight_shape, stride=1, padding=0, dilation=1, groups=1):
        """Geometry from an input (N, C, H, W) and a weight (O, C/groups, kh, kw) shape."""
        if len(input_shape) != 4 or len(weight_shape) != 4:
            raise MxsimError(
                f"conv2d: input and weight must be 4-d, got {tuple(input_shape)} and {tuple(weight_shape)}"
            )
        n, c, h, w = (int(v) for v in input_shape)
        o, cg, kh, kw = (int(v) for v in weight_shape)
        groups = _check_groups(groups, "conv2d")
        if cg * groups != c:
            raise MxsimError(
                f"conv2d: weight has {cg} input channels per group x {groups} groups, "
                f"but the input has {c} channels"
            )
        return cls(n, c, h, w, o, kh, kw, stride, padding, dilation, groups)

    @property
    def out_height(self) -> int:
        (top, bottom), _ = self.padding
        span = self.dilation[0] * (self.kernel_height - 1) + 1
        return (self.height + top + bottom - span) // self.stride[0] + 1

    @property
    def out_width(self) -> int:
        _, (left, right) = self.padding
        span = self.dilation[1] * (self.kernel_width - 1) + 1
        return (self.width + left + right - span) // self.stride[1] + 1

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        return (self.out_channels, self.channels_per_group, self.kernel_height, self.kernel_width)

    @property
    def gemm_m(self) -> int:
        """GEMM rows: one per output pixel, N * Ho * Wo."""
        return self.batch * self.out_height * self.out_width

    @property
    def gemm_k(self) -> int:
        """GEMM reduction length per group: kh * kw * C/groups."""
        return self.kernel_height * self.kernel_width * self.channels_per_group


def _check_array(x: np.ndarray, shape: tuple, what: str) -> None:
    if not isinstance(x, np.ndarray):
        raise MxsimError(f"conv2d: {what} must be a numpy array, got {type(x).__name__}")
    if tuple(x.shape) != tuple(shape):
        raise MxsimError(f"conv2d: {what} has shape {tuple(x.shape)}, expected {tuple(shape)}")


def im2col(x: np.ndarray, geometry: Conv2dGeometry) -> np.ndarray:
    """Lower the input to per-group patch matrices A of shape (groups, N*Ho*Wo, kh*kw*C/groups).

    Row index ``m = (n*Ho + y)*Wo + x_out``; column index ``k = (i*kw + j)*(C/groups) + c``
    (filter tap outer, channel within the group inner: each tap contributes one contiguous
    run of C/groups channels). ``A[g, m, k] = xpad[n, g*C/groups + c, y*sh + i*dh, x*sw + j*dw]``
    where ``xpad`` is ``x`` zero-padded by ``geometry.padding``. Values are copied, never
    rounded; the dtype is ``x``'s.
    """
    gm = geometry
    _check_array(x, gm.input_shape, "input")
    (top, bottom), (left, right) = gm.padding
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    sh, sw = gm.stride
    dh, dw = gm.dilation
    ho, wo = gm.out_height, gm.out_width
    taps = []
    for i in range(gm.kernel_height):
        for j in range(gm.kernel_width):
            row0, col0 = i * dh, j * dw
            # (N, C, Ho, Wo): the input pixel this tap reads for every output pixel
            taps.append(
                padded[
                    :, :, row0 : row0 + sh * (ho - 1) + 1 : sh, col0 : col0 + sw * (wo - 1) + 1 : sw
                ]
            )
    stacked = np.stack(taps, axis=0)  # (T, N, C, Ho, Wo)
    t = len(taps)
    cg = gm.channels_per_group
    grouped = stacked.reshape(t, gm.batch, gm.groups, cg, ho, wo)
    # -> (G, N, Ho, Wo, T, Cg): rows (n, y, x), columns (tap, channel)
    lowered = grouped.transpose(2, 1, 4, 5, 0, 3)
    return np.ascontiguousarray(lowered).reshape(gm.groups, gm.gemm_m, gm.gemm_k)


def weight_matrix(w: np.ndarray, geometry: Conv2dGeometry) -> np.ndarray:
    """The weight as per-group matrices B of shape (groups, O/groups, kh*kw*C/groups).

    ``B[g, f, (i*kw + j)*(C/groups) + c] = w[g*O/groups + f, c, i, j]``: the same column
    order as :func:`im2col`, so ``A[g] @ B[g].T`` is group g's output.
    """
    gm = geometry
    _check_array(w, gm.weight_shape, "weight")
    per_group = w.reshape(
        gm.groups, gm.filters_per_group, gm.channels_per_group, gm.kernel_height, gm.kernel_width
    )
    return np.ascontiguousarray(per_group.transpose(0, 1, 3, 4, 2)).reshape(
        gm.groups, gm.filters_per_group, gm.gemm_k
    )


def col2im_output(c: np.ndarray, geometry: Conv2dGeometry) -> np.ndarray:
    """GEMM results (groups, N*Ho*Wo, O/groups) back to the output layout (N, O, Ho, Wo)."""
    gm = geometry
    _check_array(c, (gm.groups, gm.gemm_m, gm.filters_per_group), "GEMM result")
    per_pixel = c.reshape(gm.groups, gm.batch, gm.out_height, gm.out_width, gm.filters_per_group)
    # (G, N, Ho, Wo, F) -> (N, G, F, Ho, Wo); channel o = g*F + f
    return np.ascontiguousarray(per_pixel.transpose(1, 0, 4, 2, 3)).reshape(gm.output_shape)


def conv2d_im2col(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    geometry: Conv2dGeometry,
    dtype=np.float64,
) -> np.ndarray:
    """Convolution through the GEMM lowering, accumulated in ``dtype`` (float64 by default)."""
    a = im2col(x, geometry).astype(dtype, copy=False)
    b = weight_matrix(w, geometry).astype(dtype, copy=False)
    out = col2im_output(np.matmul(a, b.transpose(0, 2, 1)), geometry)
    if bias is not None:
        _check_array(bias, (geometry.out_channels,), "bias")
        out = out + bias.astype(dtype).reshape(1, -1, 1, 1)
    return out


def conv2d_direct(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    geometry: Conv2dGeometry,
    dtype=np.float64,
) -> np.ndarray:
    """Direct convolution from the definition, independent of :func:`im2col`.

    Loops over output rows/columns and filter taps; an input position outside the image
    (padding) is skipped, never materialised. Per (position, tap) the channel reduction of
    each group is one ``np.einsum`` over (batch, channel, filter). Accumulates in ``dtype``.
    """
    return _direct(x, w, bias, geometry, dtype, transposed=False)


def _direct(
    x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, gm, dtype, transposed: bool
) -> np.ndarray:
    """The loop both direct definitions share, over (position, tap) pairs: a convolution's
    output pixel gathers the input pixel under each tap (weight (O, C/groups, kh, kw)); a
    transposed convolution's input pixel scatters to the output pixel under each tap (weight
    (C, O/groups, kh, kw)). Per pair, each group's channel reduction is one ``np.einsum``."""
    _check_array(x, gm.input_shape, "input")
    _check_array(w, gm.weight_shape, "weight")
    xs, ws = x.astype(dtype, copy=False), w.astype(dtype, copy=False)
    out = np.zeros(gm.output_shape, dtype=dtype)
    cg, fg = gm.channels_per_group, gm.filters_per_group
    image, output = (gm.height, gm.width), (gm.out_height, gm.out_width)
    outer, inner = (image, output) if transposed else (output, image)
    for y, x_pos, i, j, row, col in _tap_positions(gm, outer, inner):
        for g in range(gm.groups):
            channels, filters = slice(g * cg, (g + 1) * cg), slice(g * fg, (g + 1) * fg)
            if transposed:
                out[:, filters, row, col] += np.einsum(
                    "nc,cf->nf", xs[:, channels, y, x_pos], ws[channels, :, i, j]
                )
            else:
                out[:, filters, y, x_pos] += np.einsum(
                    "nc,fc->nf", xs[:, channels, row, col], ws[filters, :, i, j]
                )
    if bias is not None:
        _check_array(bias, (gm.out_channels,), "bias")
        out += bias.astype(dtype).reshape(1, -1, 1, 1)
    return out


def _tap_positions(gm, outer: tuple[int, int], inner: tuple[int, int]):
    """(y, x, i, j, row, col) for every position (y, x) of the ``outer`` grid and filter tap
    (i, j) whose ``row = y*sh + i*dh - top``, ``col = x*sw + j*dw - left`` lie in the ``inner``
    grid: outer is the output and inner the input for a convolution, the other way round for a
    transposed one. Positions outside (padding) are skipped, never materialised."""
    (top, _), (left, _) = gm.padding
    for y in range(outer[0]):
        for x in range(outer[1]):
            for i in range(gm.kernel_height):
                row = y * gm.stride[0] + i * gm.dilation[0] - top
                if not 0 <= row < inner[0]:
                    continue
                for j in range(gm.kernel_width):
                    col = x * gm.stride[1] + j * gm.dilation[1] - left
                    if 0 <= col < inner[1]:
                        yield y, x, i, j, row, col


# ----------------------------------------------------------------------------- transposed convolution


@dataclass(frozen=True)
class ConvTranspose2dGeometry(_Grouped):
    """Shapes and hyper-parameters of one 2-D transposed convolution (validated on creation).

    PyTorch ``conv_transpose2d`` / ONNX ``ConvTranspose`` semantics: input (N, C, H, W),
    weight (C, O/groups, kh, kw), output (N, O, Ho, Wo) with
    ``Ho = (H - 1)*sh - top - bottom + dh*(kh - 1) + output_padding_h + 1`` (likewise ``Wo``).
    Every input pixel scatters its channel vector through the filter taps:
    ``out[n, g*O/g + o, y*sh - top + i*dh, x*sw - left + j*dw] += x[n, g*C/g + c, y, x] * w[g*C/g + c, o, i, j]``
    (positions outside the output are dropped; ``output_padding`` only extends the output
    at the bottom/right).

    The GEMM lowering (:meth:`equivalent_conv`, :func:`conv_transpose2d_lowered_input`,
    :func:`conv_transpose2d_conv_weight`): the same output is a stride-1 convolution, with
    dilation (dh, dw), of the input *zero-upsampled* by the stride (sh - 1 zero rows between
    input rows, likewise columns) and padded by ``dh*(kh - 1) - top`` before and
    ``dh*(kh - 1) - bottom + output_padding_h`` after (a negative amount crops), with the
    filter flipped in both spatial axes and its channel axes swapped per group:
    ``w_conv[g*O/g + o, c, i, j] = w[g*C/g + c, o, kh-1-i, kw-1-j]``. Each output pixel is
    then one dot product of length kh*kw*C/groups (runs of C/groups channels per tap, as for
    conv2d); taps that land on inserted zeros or padding contribute all-zero runs.
    """

    output_padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1

    _OP = "conv_transpose2d"

    def __post_init__(self):
        self._check_common()
        object.__setattr__(self, "output_padding", _pair(self.output_padding, "output_padding"))
        if min(self.stride) < 1 or min(self.dilation) < 1 or min(self.output_padding) < 0:
            raise MxsimError(
                f"conv_transpose2d: stride and dilation must be >= 1 and output_padding >= 0, got "
                f"{self.stride}, {self.dilation}, {self.output_padding}"
            )
        if self.out_height < 1 or self.out_width < 1:
            raise MxsimError(
                f"conv_transpose2d: padding {self.padding} leaves no output "
                f"({self.out_height}x{self.out_width})"
            )

    @classmethod
    def from_shapes(
        cls, input_shape, weight_shape, stride=1, padding=0, output_padding=0, dilation=1, groups=1
    ):
        """Geometry from an input (N, C, H, W) and a weight (C, O/groups, kh, kw) shape."""
        if len(input_shape) != 4 or len(weight_shape) != 4:
            raise MxsimError(
                f"conv_transpose2d: input and weight must be 4-d, got {tuple(input_shape)} "
                f"and {tuple(weight_shape)}"
            )
        n, c, h, w = (int(v) for v in input_shape)
        cw, og, kh, kw = (int(v) for v in weight_shape)
        groups = _check_groups(groups, "conv_transpose2d")
        if cw != c:
            raise MxsimError(f"conv_transpose2d: weight has {cw} input channels, the input has {c}")
        return cls(
            n, c, h, w, og * groups, kh, kw, stride, padding, output_padding, dilation, groups
        )

    def _out(
        self,
        size: int,
        stride: int,
        before: int,
        after: int,
        dilation: int,
        kernel: int,
        extra: int,
    ) -> int:
        return (size - 1) * stride - before - after + dilation * (kernel - 1) + extra + 1

    @property
    def out_height(self) -> int:
        (top, bottom), _ = self.padding
        return self._out(
            self.height,
            self.stride[0],
            top,
            bottom,
            self.dilation[0],
            self.kernel_height,
            self.output_padding[0],
        )

    @property
    def out_width(self) -> int:
        _, (left, right) = self.padding
        return self._out(
            self.width,
            self.stride[1],
            left,
            right,
            self.dilation[1],
            self.kernel_width,
            self.output_padding[1],
        )

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        return (self.in_channels, self.filters_per_group, self.kernel_height, self.kernel_width)

    def _edges(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """Rows/columns added (negative: cropped) before and after the upsampled input."""
        (top, bottom), (left, right) = self.padding
        span_h = self.dilation[0] * (self.kernel_height - 1)
        span_w = self.dilation[1] * (self.kernel_width - 1)
        return (
            (span_h - top, span_h - bottom + self.output_padding[0]),
            (span_w - left, span_w - right + self.output_padding[1]),
        )

    @property
    def gemm_m(self) -> int:
        """Rows of the GEMM replay runs: those of :meth:`equivalent_conv`'s im2col."""
        return self.equivalent_conv().gemm_m

    @property
    def gemm_k(self) -> int:
        """The GEMM's K: that of :meth:`equivalent_conv`."""
        return self.equivalent_conv().gemm_k

    def equivalent_conv(self) -> Conv2dGeometry:
        """The stride-1 conv2d over the upsampled, padded input that computes this output."""
        (before_h, after_h), (before_w, after_w) = self._edges()
        height = (self.height - 1) * self.stride[0] + 1 + before_h + after_h
        width = (self.width - 1) * self.stride[1] + 1 + before_w + after_w
        return Conv2dGeometry(
            self.batch,
            self.in_channels,
            height,
            width,
            self.out_channels,
            self.kernel_height,
            self.kernel_width,
            (1, 1),
            ((0, 0), (0, 0)),
            self.dilation,
            self.groups,
        )


def conv_transpose2d_lowered_input(x: np.ndarray, geometry: ConvTranspose2dGeometry) -> np.ndarray:
    """The input zero-upsampled by the stride and padded (or cropped) for :meth:`equivalent_conv`."""
    gm = geometry
    _check_array(x, gm.input_shape, "input")
    sh, sw = gm.stride
    up = np.zeros(
        (gm.batch, gm.in_channels, (gm.height - 1) * sh + 1, (gm.width - 1) * sw + 1), dtype=x.dtype
    )
    up[:, :, ::sh, ::sw] = x
    (before_h, after_h), (before_w, after_w) = gm._edges()
    up = np.pad(
        up,
        ((0, 0), (0, 0), (max(before_h, 0), max(after_h, 0)), (max(before_w, 0), max(after_w, 0))),
    )
    rows = slice(max(-before_h, 0), up.shape[2] - max(-after_h, 0))
    cols = slice(max(-before_w, 0), up.shape[3] - max(-after_w, 0))
    return np.ascontiguousarray(up[:, :, rows, cols])


def conv_transpose2d_conv_weight(w: np.ndarray, geometry: ConvTranspose2dGeometry) -> np.ndarray:
    """The (O, C/groups, kh, kw) conv2d weight of :meth:`equivalent_conv`: flipped taps, channels swapped per group."""
    gm = geometry
    _check_array(w, gm.weight_shape, "weight")
    g, cg, fg = gm.groups, gm.channels_per_group, gm.filters_per_group
    per_group = w.reshape(g, cg, fg, gm.kernel_height, gm.kernel_width)[:, :, :, ::-1, ::-1]
    swapped = per_group.transpose(0, 2, 1, 3, 4)  # (G, F, Cg, kh, kw)
    return np.ascontiguousarray(swapped).reshape(
        gm.out_channels, cg, gm.kernel_height, gm.kernel_width
    )


def conv_transpose2d_im2col(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    geometry: ConvTranspose2dGeometry,
    dtype=np.float64,
) -> np.ndarray:
    """Transposed convolution through the GEMM lowering, accumulated in ``dtype``."""
    return conv2d_im2col(
        conv_transpose2d_lowered_input(x, geometry),
        conv_transpose2d_conv_weight(w, geometry),
        bias,
        geometry.equivalent_conv(),
        dtype,
    )


def conv_transpose2d_direct(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    geometry: ConvTranspose2dGeometry,
    dtype=np.float64,
) -> np.ndarray:
    """Transposed convolution from its scatter definition, independent of the lowering.

    Loops over input rows/columns and filter taps; each input pixel's channel vector times the
    tap's (C/groups, O/groups) slice is added at its output position, dropped when that lies
    outside the output. Accumulates in ``dtype``.
    """
    return _direct(x, w, bias, geometry, dtype, transposed=True)
