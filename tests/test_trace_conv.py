"""mxsim.trace.conv: im2col lowering vs the independent direct convolution vs torch's conv2d /
conv_transpose2d (float64 on integer values, so every result is exact)."""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mxsim.errors import MxsimError
from mxsim.trace.conv import (
    Conv2dGeometry,
    ConvTranspose2dGeometry,
    col2im_output,
    conv2d_direct,
    conv2d_im2col,
    conv_transpose2d_direct,
    conv_transpose2d_im2col,
    im2col,
    normalize_padding,
    weight_matrix,
)


@st.composite
def conv_cases(draw):
    """A valid small geometry plus integer-valued float64 operands (so every sum is exact)."""
    groups = draw(st.integers(1, 3))
    geometry = None
    while geometry is None:
        kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        dilation = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        padding = (
            (draw(st.integers(0, 2)), draw(st.integers(0, 2))),
            (draw(st.integers(0, 2)), draw(st.integers(0, 2))),
        )
        height, width = draw(st.integers(1, 7)), draw(st.integers(1, 7))
        span_h, span_w = dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1
        if height + sum(padding[0]) < span_h or width + sum(padding[1]) < span_w:
            continue
        geometry = Conv2dGeometry(
            batch=draw(st.integers(1, 2)),
            in_channels=groups * draw(st.integers(1, 3)),
            height=height,
            width=width,
            out_channels=groups * draw(st.integers(1, 3)),
            kernel_height=kh,
            kernel_width=kw,
            stride=(draw(st.integers(1, 3)), draw(st.integers(1, 3))),
            padding=padding,
            dilation=dilation,
            groups=groups,
        )
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x = rng.integers(-8, 9, geometry.input_shape).astype(np.float64)
    w = rng.integers(-8, 9, geometry.weight_shape).astype(np.float64)
    bias = (
        rng.integers(-8, 9, geometry.out_channels).astype(np.float64)
        if draw(st.booleans())
        else None
    )
    return geometry, x, w, bias


def test_direct_convolution_matches_a_hand_computed_example():
    # 1 image, 1 channel 3x3, kernel 2x2 of ones, stride 1, padding 1 on the bottom/right only
    x = np.arange(1, 10, dtype=np.float64).reshape(1, 1, 3, 3)
    w = np.ones((1, 1, 2, 2))
    geometry = Conv2dGeometry.from_shapes(x.shape, w.shape, padding=[0, 0, 1, 1])
    expected = np.array([[12, 16, 9], [24, 28, 15], [15, 17, 9]], dtype=np.float64)  # window sums
    assert geometry.output_shape == (1, 1, 3, 3)
    assert np.array_equal(conv2d_direct(x, w, None, geometry)[0, 0], expected)
    assert np.array_equal(conv2d_im2col(x, w, None, geometry)[0, 0], expected)


def test_im2col_orders_columns_by_tap_then_channel():
    # 2 channels, 2x2 kernel, no padding, one output pixel: row = [tap(0,0) c0, c1, tap(0,1) c0, c1, ...]
    x = np.arange(8, dtype=np.float64).reshape(1, 2, 2, 2)  # channel 0: 0..3, channel 1: 4..7
    geometry = Conv2dGeometry.from_shapes(x.shape, (1, 2, 2, 2))
    assert im2col(x, geometry).tolist() == [[[0, 4, 1, 5, 2, 6, 3, 7]]]
    w = np.arange(8, dtype=np.float64).reshape(1, 2, 2, 2)
    assert weight_matrix(w, geometry).tolist() == [[[0, 4, 1, 5, 2, 6, 3, 7]]]


def test_im2col_splits_groups_and_orders_rows_by_image_then_pixel():
    x = np.arange(2 * 4 * 2 * 1, dtype=np.float64).reshape(2, 4, 2, 1)  # N=2, C=4, H=2, W=1
    geometry = Conv2dGeometry.from_shapes(x.shape, (2, 2, 1, 1), groups=2)
    lowered = im2col(x, geometry)
    assert lowered.shape == (2, 4, 2)  # (groups, N*Ho*Wo, kh*kw*C/groups)
    for g in range(2):
        for n in range(2):
            for y in range(2):
                assert lowered[g, n * 2 + y].tolist() == x[n, 2 * g : 2 * g + 2, y, 0].tolist()


def test_col2im_is_the_inverse_layout_of_the_gemm_result():
    geometry = Conv2dGeometry.from_shapes((2, 4, 3, 3), (6, 2, 1, 1), groups=2)
    out = np.arange(2 * 6 * 3 * 3, dtype=np.float64).reshape(2, 6, 3, 3)
    c = (
        out.reshape(2, 2, 3, 3, 3).transpose(1, 0, 3, 4, 2).reshape(2, 18, 3)
    )  # (G, M, F) by definition
    assert np.array_equal(col2im_output(c, geometry), out)


@settings(max_examples=60, deadline=None)
@given(conv_cases())
def test_im2col_lowering_equals_direct_convolution(case):
    geometry, x, w, bias = case
    lowered = conv2d_im2col(x, w, bias, geometry)
    direct = conv2d_direct(x, w, bias, geometry)
    assert lowered.shape == geometry.output_shape
    assert np.array_equal(lowered, direct)  # integer-valued operands: both sums are exact


@settings(max_examples=60, deadline=None)
@given(case=conv_cases())
def test_im2col_lowering_equals_torch_conv2d(torch, case):
    geometry, x, w, bias = case
    (top, bottom), (left, right) = geometry.padding
    padded = torch.nn.functional.pad(torch.from_numpy(x), (left, right, top, bottom))
    expected = torch.nn.functional.conv2d(
        padded,
        torch.from_numpy(w),
        None if bias is None else torch.from_numpy(bias),
        stride=geometry.stride,
        dilation=geometry.dilation,
        groups=geometry.groups,
    ).numpy()
    assert np.array_equal(conv2d_im2col(x, w, bias, geometry), expected)
    assert np.array_equal(conv2d_direct(x, w, bias, geometry), expected)


def test_output_size_uses_floor_division():
    geometry = Conv2dGeometry(
        1, 1, 7, 6, 1, 3, 2, stride=(2, 3), padding=((1, 0), (0, 2)), dilation=(2, 1)
    )
    # H: (7 + 1 - 5) // 2 + 1 = 2;  W: (6 + 2 - 2) // 3 + 1 = 3
    assert (geometry.out_height, geometry.out_width) == (2, 3)
    assert geometry.gemm_m == 6 and geometry.gemm_k == 6


@pytest.mark.parametrize(
    "padding, expected",
    [
        (1, ((1, 1), (1, 1))),
        ((1, 2), ((1, 1), (2, 2))),
        ([1, 2, 3, 4], ((1, 3), (2, 4))),  # ONNX pads: top, left, bottom, right
        (((0, 1), (2, 3)), ((0, 1), (2, 3))),
    ],
)
def test_padding_forms(padding, expected):
    assert normalize_padding(padding) == expected


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(groups=3), "groups 3 must divide"),
        (dict(kernel_height=9), "does not fit"),
        (dict(stride=(0, 1)), "stride and dilation"),
        (dict(padding=-1), "non-negative"),
        (dict(batch=0), "batch must be a positive int"),
    ],
)
def test_invalid_geometry_is_rejected(kwargs, message):
    base = dict(
        batch=1, in_channels=4, height=5, width=5, out_channels=4, kernel_height=3, kernel_width=3
    )
    with pytest.raises(MxsimError, match=message):
        Conv2dGeometry(**{**base, **kwargs})


def test_from_shapes_checks_channels_against_groups():
    with pytest.raises(MxsimError, match="weight has 3 input channels per group x 2 groups"):
        Conv2dGeometry.from_shapes((1, 4, 5, 5), (4, 3, 3, 3), groups=2)


def test_operands_of_the_wrong_shape_are_rejected():
    geometry = Conv2dGeometry.from_shapes((1, 2, 4, 4), (3, 2, 3, 3))
    with pytest.raises(MxsimError, match="input has shape"):
        im2col(np.zeros((1, 2, 4, 5)), geometry)
    with pytest.raises(MxsimError, match="weight has shape"):
        conv2d_direct(np.zeros((1, 2, 4, 4)), np.zeros((3, 2, 2, 2)), None, geometry)


# ----------------------------------------------------------------------------- transposed convolution


@st.composite
def conv_transpose_cases(draw):
    """A valid small transposed-conv geometry (asymmetric padding, output padding, groups,
    dilation) plus integer-valued float64 operands."""
    groups = draw(st.integers(1, 3))
    geometry = None
    while geometry is None:
        kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
        output_padding = (
            draw(st.integers(0, max(stride[0], dilation[0]) - 1)),
            draw(st.integers(0, max(stride[1], dilation[1]) - 1)),
        )
        padding = (
            (draw(st.integers(0, 2)), draw(st.integers(0, 2))),
            (draw(st.integers(0, 2)), draw(st.integers(0, 2))),
        )
        try:
            geometry = ConvTranspose2dGeometry(
                batch=draw(st.integers(1, 2)),
                in_channels=groups * draw(st.integers(1, 3)),
                height=draw(st.integers(1, 5)),
                width=draw(st.integers(1, 5)),
                out_channels=groups * draw(st.integers(1, 3)),
                kernel_height=kh,
                kernel_width=kw,
                stride=stride,
                padding=padding,
                output_padding=output_padding,
                dilation=dilation,
                groups=groups,
            )
        except MxsimError:  # padding larger than the output
            continue
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.integers(-8, 9, geometry.input_shape).astype(np.float64)
    w = rng.integers(-8, 9, geometry.weight_shape).astype(np.float64)
    bias = (
        rng.integers(-8, 9, geometry.out_channels).astype(np.float64)
        if draw(st.booleans())
        else None
    )
    return geometry, x, w, bias


def torch_conv_transpose2d(torch, geometry, x, w, bias):
    """torch's conv_transpose2d in float64; asymmetric padding as symmetric padding min(before, after),
    then the surplus rows/columns cropped from the output (torch only takes symmetric padding)."""
    (top, bottom), (left, right) = geometry.padding
    out = torch.nn.functional.conv_transpose2d(
        torch.from_numpy(x),
        torch.from_numpy(w),
        None if bias is None else torch.from_numpy(bias),
        stride=geometry.stride,
        padding=(min(top, bottom), min(left, right)),
        output_padding=geometry.output_padding,
        dilation=geometry.dilation,
        groups=geometry.groups,
    ).numpy()
    rows = slice(top - min(top, bottom), out.shape[2] - (bottom - min(top, bottom)))
    cols = slice(left - min(left, right), out.shape[3] - (right - min(left, right)))
    return out[:, :, rows, cols]


@settings(max_examples=80, deadline=None)
@given(case=conv_transpose_cases())
def test_conv_transpose_lowering_and_direct_equal_torch(torch, case):
    geometry, x, w, bias = case
    expected = torch_conv_transpose2d(torch, geometry, x, w, bias)
    assert expected.shape == geometry.output_shape
    assert np.array_equal(conv_transpose2d_direct(x, w, bias, geometry), expected)
    assert np.array_equal(conv_transpose2d_im2col(x, w, bias, geometry), expected)


def test_conv_transpose_direct_matches_a_hand_computed_example():
    # 1x1 input channel, 2x2 image, 2x2 kernel, stride 2: every input pixel stamps the kernel
    x = np.array([[[[1.0, 2.0], [3.0, 4.0]]]])
    w = np.array([[[[1.0, 10.0], [100.0, 1000.0]]]])
    geometry = ConvTranspose2dGeometry.from_shapes(x.shape, w.shape, stride=2)
    expected = np.array(
        [[1, 10, 2, 20], [100, 1000, 200, 2000], [3, 30, 4, 40], [300, 3000, 400, 4000]], float
    )
    assert np.array_equal(conv_transpose2d_direct(x, w, None, geometry)[0, 0], expected)
    # padding crops the output's border, output padding extends it at the bottom/right
    cropped = ConvTranspose2dGeometry.from_shapes(
        x.shape, w.shape, stride=2, padding=((1, 0), (0, 1)), output_padding=(1, 0)
    )
    assert cropped.output_shape == (1, 1, 4, 3)
    result = conv_transpose2d_direct(x, w, None, cropped)[0, 0]
    assert np.array_equal(result[:3], expected[1:, :3]) and not result[3].any()


def test_conv_transpose_geometry_is_validated():
    with pytest.raises(MxsimError, match="weight has 3 input channels, the input has 4"):
        ConvTranspose2dGeometry.from_shapes((1, 4, 3, 3), (3, 2, 2, 2))
    with pytest.raises(MxsimError, match="groups 3 must divide"):
        ConvTranspose2dGeometry.from_shapes((1, 4, 3, 3), (4, 2, 2, 2), groups=3)
    with pytest.raises(MxsimError, match="leaves no output"):
        ConvTranspose2dGeometry.from_shapes((1, 1, 1, 1), (1, 1, 1, 1), padding=1)
    with pytest.raises(MxsimError, match="output_padding >= 0"):
        ConvTranspose2dGeometry.from_shapes((1, 1, 2, 2), (1, 1, 2, 2), output_padding=-1)
