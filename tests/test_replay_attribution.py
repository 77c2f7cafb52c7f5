"""Where the error is: output channel and input column shares, input vs weight quantization."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import REPO
from mxsim.datapath import load_hwconfig
from mxsim.quantize import quantize
from mxsim.replay.attribution import (
    column_shares,
    layer_attribution,
    output_channel_shares,
    top_shares,
)
from mxsim.replay.layer import replay_layer
from mxsim.trace import Layer, MXQuant


def _quantized(x: np.ndarray, fmt: str) -> np.ndarray:
    return quantize(x, fmt, axis=-1, block_size=32).dequantize(np.float64)


def test_column_shares_equal_the_products_summed_one_by_one():
    rng = np.random.default_rng(1)
    a, b = (
        rng.standard_normal((2, 5, 64)),
        rng.standard_normal((2, 4, 64)) * np.exp(rng.normal(0, 1, 64)),
    )
    aq, bq = _quantized(a, "fp4_e2m1"), _quantized(b, "fp6_e2m3")
    # the (G, M, N, K) product errors built whole: no algebra shared with the code
    products = np.einsum("gmk,gnk->gmnk", aq, bq) - np.einsum("gmk,gnk->gmnk", a, b)
    energy = np.sum(np.square(products), axis=(0, 1, 2))
    np.testing.assert_allclose(column_shares(a, aq, b, bq), energy / energy.sum(), rtol=1e-9)


def test_output_channel_shares():
    error = np.zeros((2, 3, 4))
    error[:, :, 2] = 3.0
    error[0, 0, 1] = 3.0
    shares = output_channel_shares(Layer("l", "linear", {}), error)
    np.testing.assert_allclose(shares, [0, 1 / 7, 6 / 7, 0])
    assert top_shares(shares) == [{"index": 2, "share": 6 / 7}, {"index": 1, "share": 1 / 7}]
    conv_error = np.moveaxis(error, 2, 1)  # (N, C, ...): channels on axis 1
    np.testing.assert_allclose(output_channel_shares(Layer("c", "conv2d", {}), conv_error), shares)


def test_input_only_and_weight_only_sqnr_and_conv_folding():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((1, 6, 32)), rng.standard_normal((1, 3, 32))
    aq, bq = _quantized(a, "fp4_e2m1"), _quantized(b, "fp8_e4m3")
    found = layer_attribution(Layer("l", "linear", {}), a, aq, b, bq, 1, "kh_kw_c")
    reference = a[0] @ b[0].T
    want_input = 10 * math.log10(np.sum(reference**2) / np.sum(((aq - a)[0] @ b[0].T) ** 2))
    want_weight = 10 * math.log10(np.sum(reference**2) / np.sum((a[0] @ (bq - b)[0].T) ** 2))
    assert found["sqnr_input_only_db"] == pytest.approx(want_input)
    assert found["sqnr_weight_only_db"] == pytest.approx(want_weight)
    assert (
        found["sqnr_input_only_db"] < found["sqnr_weight_only_db"]
    )  # fp4 inputs cost more than fp8 weights
    assert found["column_kind"] == "input column"
    # 4 taps of 8 channels, K order (tap, channel): a channel's share is its columns' sum over taps
    folded = layer_attribution(Layer("c", "conv2d", {}), a, aq, b, bq, 4, "kh_kw_c")
    shares = column_shares(a, aq, b, bq).reshape(4, 8).sum(axis=0)
    assert (
        folded["input_columns"] == top_shares(shares) and folded["column_kind"] == "input channel"
    )
    assert (
        layer_attribution(
            Layer("c", "linear", {}, codes_only=frozenset({"input"})), a, aq, b, bq, 1, "kh_kw_c"
        )
        is None
    )


def test_one_outlier_output_channel_holds_the_error():
    """A weight row 100x larger than the others: its output channel holds almost all the error."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    w[5] *= 100
    spec = MXQuant("fp8_e4m3", 1, 32)
    layer = Layer(
        "fc",
        "linear",
        {"input": x, "weight": w, "output": (x.astype(np.float64) @ w.T).astype(np.float32)},
        {},
        {"input": spec, "weight": spec},
    )
    result = replay_layer(layer, load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml"))
    top = top_shares(result.channel_error_shares)
    assert top[0]["index"] == 5 and top[0]["share"] > 0.99
    assert len(result.attribution["input_columns"]) == 3
    assert result.to_dict()["attribution"] == result.attribution
