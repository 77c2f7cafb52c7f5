"""mxsim.replay.lowering: the GEMM view of linear, matmul, conv2d and conv_transpose2d layers."""

from __future__ import annotations

import numpy as np
import pytest

from mxsim import fake_quantize
from mxsim.errors import MxsimError
from mxsim.trace import Layer
from mxsim.trace.conv import conv2d_direct, conv_transpose2d_direct
from mxsim.replay.lowering import (
    GemmShape,
    gemm_axis,
    gemm_reference,
    gemm_shape,
    gemm_view,
    lift_output,
    lower_input,
    lower_weight,
)

RNG = np.random.default_rng(7)


def ints(*shape):
    """Integer-valued float64 data: every product and sum below is exact."""
    return RNG.integers(-6, 7, shape).astype(np.float64)


def linear_layer(batch=(3,), k=5, n=4, bias=True, **attrs):
    x, w = ints(*batch, k), ints(n, k)
    b = ints(n) if bias else None
    out = attrs.get("alpha", 1.0) * (x @ w.T) + (0 if b is None else attrs.get("beta", 1.0) * b)
    tensors = {"input": x, "weight": w, "output": out}
    if b is not None:
        tensors["bias"] = b
    return Layer("fc", "linear", tensors, attrs)


def conv_layer(
    x_shape=(2, 6, 5, 4),
    w_shape=(4, 3, 3, 2),
    stride=(2, 1),
    padding=((1, 0), (2, 1)),
    dilation=(1, 2),
    groups=2,
):
    x, w, b = ints(*x_shape), ints(*w_shape), ints(w_shape[0])
    attrs = {
        "stride": list(stride),
        "padding": [list(p) for p in padding],
        "dilation": list(dilation),
        "groups": groups,
    }
    layer = Layer(
        "conv", "conv2d", {"input": x, "weight": w, "bias": b, "output": np.zeros(1)}, attrs
    )
    layer.tensors["output"] = conv2d_direct(x, w, b, layer.conv_geometry())
    return layer


def test_linear_gemm_view():
    layer = linear_layer(batch=(2, 3), k=5, n=4)
    a, b = lower_input(layer), lower_weight(layer)
    assert a.shape == (1, 6, 5) and b.shape == (1, 4, 5)  # A (G, M, K), B (G, N, K)
    assert np.array_equal(a[0], layer.input.reshape(6, 5))
    assert np.array_equal(b[0], layer.weight)
    assert gemm_shape(layer) == GemmShape(groups=1, m=6, n=4, k=5, k_run=5)
    assert np.array_equal(lift_output(layer, a @ b.transpose(0, 2, 1)), layer.output)
    assert np.array_equal(gemm_reference(layer), layer.output)


def test_linear_alpha_beta_follow_onnx_gemm():
    layer = linear_layer(alpha=0.5, beta=2.0)
    assert np.array_equal(
        gemm_reference(layer), 0.5 * (layer.input @ layer.weight.T) + 2.0 * layer.bias
    )


def test_matmul_with_2d_weight_flattens_batch_into_m():
    x, w = ints(2, 3, 4, 5), ints(5, 6)
    layer = Layer("mm", "matmul", {"input": x, "weight": w, "output": x @ w})
    a, b = lower_input(layer), lower_weight(layer)
    assert a.shape == (1, 24, 5) and b.shape == (1, 6, 5)
    assert np.array_equal(b[0], w.T)
    assert gemm_shape(layer).groups == 1 and gemm_shape(layer).m == 24
    assert np.array_equal(gemm_reference(layer), x @ w)


def test_batched_matmul_broadcasts_and_groups():
    x, w = ints(3, 1, 4, 5), ints(2, 5, 6)  # batch dims broadcast to (3, 2)
    bias = ints(6)
    layer = Layer("bmm", "matmul", {"input": x, "weight": w, "bias": bias, "output": x @ w + bias})
    shape = gemm_shape(layer)
    assert (shape.groups, shape.m, shape.n, shape.k) == (6, 4, 6, 5)
    assert lower_input(layer).shape == (6, 4, 5) and lower_weight(layer).shape == (6, 6, 5)
    assert np.array_equal(gemm_reference(layer), x @ w + bias)


def test_conv_gemm_view_round_trips_to_the_direct_convolution():
    layer = conv_layer()
    shape = gemm_shape(layer)
    assert (shape.groups, shape.n, shape.k, shape.k_run) == (2, 2, 3 * 3 * 2, 3)
    assert np.array_equal(gemm_reference(layer), layer.output)


def conv_transpose_layer():
    x, w, b = ints(2, 4, 3, 3), ints(4, 3, 2, 3), ints(6)
    attrs = {
        "stride": [2, 1],
        "padding": [[1, 0], [0, 2]],
        "dilation": [1, 2],
        "groups": 2,
        "output_padding": [1, 0],
    }
    layer = Layer(
        "up", "conv_transpose2d", {"input": x, "weight": w, "bias": b, "output": np.zeros(1)}, attrs
    )
    layer.tensors["output"] = conv_transpose2d_direct(x, w, b, layer.conv_geometry())
    return layer


def test_conv_transpose_gemm_view_round_trips_to_the_direct_scatter():
    layer = conv_transpose_layer()
    shape = gemm_shape(layer)
    out = layer.output.shape
    # every output pixel is one dot product over (tap, channel): K = kh*kw*C/groups
    assert (shape.groups, shape.m, shape.n, shape.k, shape.k_run) == (
        2,
        out[0] * out[2] * out[3],
        3,
        2 * 3 * 2,
        2,
    )
    assert np.array_equal(gemm_reference(layer), layer.output)


def test_matmul_alpha_beta():
    x, w, bias = ints(2, 3, 4), ints(2, 4, 5), ints(2, 3, 5)
    layer = Layer(
        "baddbmm",
        "matmul",
        {"input": x, "weight": w, "bias": bias, "output": 2 * (x @ w) + 0.5 * bias},
        {"alpha": 2.0, "beta": 0.5},
    )
    assert np.array_equal(gemm_reference(layer), layer.output)


def test_gemm_reference_uses_the_quantized_operands_when_present():
    layer = linear_layer(bias=False)
    layer.tensors["weight_quantized"] = np.round(layer.weight / 4) * 4
    expected = layer.input @ layer.tensors["weight_quantized"].T
    assert np.array_equal(gemm_reference(layer), expected)
    assert np.array_equal(gemm_reference(layer, quantized=False), layer.output)


def test_lowering_rejects_arrays_of_another_shape():
    layer = linear_layer()
    with pytest.raises(MxsimError, match="input must have shape"):
        lower_input(layer, np.zeros((2, 2)))
    with pytest.raises(MxsimError, match="GEMM result must have shape"):
        lift_output(layer, np.zeros((1, 2, 2)))


def test_gemm_view_for_another_input_and_an_unknown_op():
    """The view of a layer for another batch (the unit in the loop) lowers and lifts it as the
    layer computes it; an op without a GEMM view is named in the error."""
    layer = conv_layer()
    x = ints(5, *layer.input.shape[1:])
    view = gemm_view(layer, x.shape)
    assert view.shape.m == 5 * gemm_shape(layer).m // layer.input.shape[0]
    c = view.lower_input(x) @ view.lower_weight(layer.weight).transpose(0, 2, 1)
    expected = conv2d_direct(x, layer.weight, layer.bias, layer.conv_geometry(x.shape))
    assert view.output_shape == expected.shape and np.array_equal(
        view.lift(c, layer.bias), expected
    )
    fc = linear_layer(batch=(3,))
    assert gemm_view(fc, (7, 5)).output_shape == (7, 4)
    with pytest.raises(MxsimError, match="layer 'x': unknown op 'conv3d'"):
        gemm_view(Layer("x", "conv3d", fc.tensors, {}))


@pytest.mark.parametrize(
    "op, operand, axis, expected",
    [
        ("conv2d", "input", 1, "K"),
        ("conv2d", "input", 0, "M"),
        ("conv2d", "input", 3, "spatial"),
        ("conv2d", "weight", 0, "N"),
        ("conv2d", "weight", 1, "K"),
        ("conv2d", "weight", -1, "taps"),
        ("linear", "input", -1, "K"),
        ("linear", "input", 0, "M"),
        ("linear", "weight", 1, "K"),
        ("linear", "weight", 0, "N"),
        ("matmul", "input", 3, "K"),
        ("matmul", "input", 2, "M"),
        ("matmul", "input", 0, "G"),
        ("matmul", "weight", 1, "K"),
        ("matmul", "weight", 2, "N"),
        ("matmul", "weight", 0, "G"),
        ("conv_transpose2d", "input", 1, "K"),
        ("conv_transpose2d", "input", 2, "spatial"),
        ("conv_transpose2d", "weight", 0, "K"),
        ("conv_transpose2d", "weight", 1, "N"),
        ("conv_transpose2d", "weight", 3, "taps"),
    ],
)
def test_gemm_axis(op, operand, axis, expected):
    if op == "conv2d":
        layer = conv_layer()
    elif op == "conv_transpose2d":
        layer = conv_transpose_layer()
    elif op == "linear":
        layer = linear_layer()
    else:
        x, w = ints(2, 1, 3, 4), ints(2, 4, 5)
        layer = Layer("bmm", "matmul", {"input": x, "weight": w, "output": x @ w})
    assert gemm_axis(layer, operand, axis) == expected


@pytest.mark.parametrize("block_size", [1, 2, 4])
def test_channel_blocks_equal_k_blocks_when_the_block_divides_the_channel_run(block_size):
    # conv with C/groups = 4 channels per K run: blocks of 1, 2 or 4 channels never straddle taps
    layer = conv_layer(
        x_shape=(2, 8, 5, 5),
        w_shape=(6, 4, 3, 3),
        stride=(1, 2),
        padding=((1, 1), (0, 2)),
        dilation=(1, 1),
        groups=2,
    )
    x = RNG.standard_normal(layer.input.shape)
    w = RNG.standard_normal(layer.weight.shape)
    quantize_then_lower = lower_input(
        layer, fake_quantize(x, "fp4_e2m1", axis=1, block_size=block_size)
    )
    lower_then_quantize = fake_quantize(
        lower_input(layer, x), "fp4_e2m1", axis=-1, block_size=block_size
    )
    assert np.array_equal(quantize_then_lower, lower_then_quantize)
    weight_first = lower_weight(layer, fake_quantize(w, "fp8_e4m3", axis=1, block_size=block_size))
    weight_after = fake_quantize(lower_weight(layer, w), "fp8_e4m3", axis=-1, block_size=block_size)
    assert np.array_equal(weight_first, weight_after)


def test_channel_blocks_differ_from_k_blocks_when_they_straddle_taps():
    # C = 3 per run with blocks of 2: K blocks mix two taps, channel blocks never do
    layer = conv_layer(
        x_shape=(1, 3, 4, 4),
        w_shape=(2, 3, 2, 2),
        stride=(1, 1),
        padding=((0, 0), (0, 0)),
        dilation=(1, 1),
        groups=1,
    )
    x = RNG.standard_normal(layer.input.shape) * np.array([1.0, 1.0, 1000.0]).reshape(1, 3, 1, 1)
    quantize_then_lower = lower_input(layer, fake_quantize(x, "fp4_e2m1", axis=1, block_size=2))
    lower_then_quantize = fake_quantize(lower_input(layer, x), "fp4_e2m1", axis=-1, block_size=2)
    assert not np.array_equal(quantize_then_lower, lower_then_quantize)


@pytest.mark.parametrize("block_size", [1, 2])
def test_conv_transpose_channel_blocks_equal_k_blocks(block_size):
    # C/groups = 2 channels per K run; inserted zeros and padding form all-zero blocks
    layer = conv_transpose_layer()
    x = RNG.standard_normal(layer.input.shape)
    w = RNG.standard_normal(layer.weight.shape)
    assert np.array_equal(
        lower_input(layer, fake_quantize(x, "fp4_e2m1", axis=1, block_size=block_size)),
        fake_quantize(lower_input(layer, x), "fp4_e2m1", axis=-1, block_size=block_size),
    )
    assert np.array_equal(
        lower_weight(layer, fake_quantize(w, "fp8_e4m3", axis=0, block_size=block_size)),
        fake_quantize(lower_weight(layer, w), "fp8_e4m3", axis=-1, block_size=block_size),
    )
