"""The residual reference of compact traces: the prediction against a Fraction twin, the stated
bounds of the reconstruction, and where a tensor must stay whole."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from mxsim.quantize import quantize
from mxsim.trace import reference
from mxsim.trace.reference import REFERENCE_MODES, decode_residual, encode_residual, mx_prediction


def _fp32_nearest_even(value: Fraction) -> float:
    """``value`` rounded to float32, nearest even, from the exact rational (no float64 step)."""
    if value == 0:
        return 0.0
    magnitude = abs(value)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1  # now 2^exponent <= magnitude < 2^(exponent + 1)
    ulp = Fraction(2) ** (max(exponent, -126) - 23)
    steps, rest = divmod(magnitude, ulp)
    if rest * 2 > ulp or (rest * 2 == ulp and steps % 2):
        steps += 1
    return math.copysign(float(steps * ulp), value)


def _exact_products(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Each output's exact sum of products x[..., m, :] . w[..., :, n] over Fractions, rounded to fp32."""
    batch = np.broadcast_shapes(x.shape[:-2], w.shape[:-2])
    xb, wb = np.broadcast_to(x, batch + x.shape[-2:]), np.broadcast_to(w, batch + w.shape[-2:])
    out = np.empty(batch + (x.shape[-2], w.shape[-1]))
    for index in np.ndindex(*out.shape):
        *group, m, n = index
        row, column = xb[tuple(group)][m], wb[tuple(group)][:, n]
        out[index] = _fp32_nearest_even(
            sum((Fraction(a) * Fraction(b) for a, b in zip(row, column)), Fraction(0))
        )
    return out


def _operand(rng, shape, fmt, axis, block, spread=40):
    """A realistic float operand whose runs of 8 elements along the last axis have magnitudes
    from 2^-spread to 2^spread, quantized by the OCP profile."""
    runs = rng.integers(-spread, spread + 1, shape[:-1] + (-(-shape[-1] // 8),))
    x = rng.standard_normal(shape) * np.exp2(np.repeat(runs, 8, axis=-1)[..., : shape[-1]])
    tensor = quantize(x, fmt, axis=axis, block_size=block)
    return tensor, tensor.dequantize(np.float64)


@pytest.mark.parametrize(
    "case, grouped",
    [
        ("linear", 0),
        ("linear 3-d input", 0),
        ("matmul 2-d weight", 0),
        ("matmul batched", 1 << 14),
        ("matmul batched", 100),
        ("matmul batched", 1),
    ],
)
def test_prediction_is_the_exact_product_rounded_once_to_fp32(case, grouped, monkeypatch):
    monkeypatch.setattr(
        reference, "_GROUPED_OUTPUTS", grouped
    )  # 6 groups of 4 x 6: per call 6, 2 or 1
    rng = np.random.default_rng(7)
    bias = rng.standard_normal(6).astype(np.float32)
    if case.startswith("linear"):
        x_shape = (2, 3, 40) if "3-d" in case else (5, 40)
        a, x = _operand(rng, x_shape, "fp8_e4m3", len(x_shape) - 1, 32)
        b, w = _operand(rng, (6, 40), "int8", 1, 8)  # a weight block of 8 inside the input's 32
        attrs = {"alpha": 0.75, "beta": -2.0}
        got = mx_prediction("linear", attrs, a, b, bias)
        want = (
            _exact_products(x[..., None, :], w.T)[..., 0, :] * 0.75 + bias.astype(np.float64) * -2.0
        )
    else:
        w_shape = (2, 1, 40, 6) if "batched" in case else (40, 6)
        a, x = _operand(rng, (1, 3, 4, 40), "fp4_e2m1", 3, 32)
        b, w = _operand(rng, w_shape, "fp8_e5m2", len(w_shape) - 2, 16)
        got = mx_prediction("matmul", {}, a, b, bias)
        want = _exact_products(x, w) + bias.astype(np.float64)
    assert got.shape == want.shape and np.array_equal(got, want)


def test_no_prediction_without_both_operands_blocked_along_k():
    rng = np.random.default_rng(3)
    a, _ = _operand(rng, (4, 32), "fp8_e4m3", 1, 32)
    across, _ = _operand(rng, (8, 32), "fp8_e4m3", 0, 4)  # the weight blocked along N
    b, _ = _operand(rng, (8, 32), "fp8_e4m3", 1, 32)
    assert mx_prediction("linear", {}, a, across, None) is None
    assert mx_prediction("conv2d", {}, a, b, None) is None
    assert mx_prediction("linear", {}, a, b, None).shape == (4, 8)


def test_reconstruction_is_within_the_stated_bound():
    rng = np.random.default_rng(11)
    bits = REFERENCE_MODES["residual8"]
    for scale in (1e-30, 1e-3, 1.0, 1e25):
        prediction = (rng.standard_normal((64, 48)) * scale).astype(np.float32).astype(np.float64)
        residual = rng.standard_normal((64, 48)) * scale * rng.choice([0.01, 0.3], (64, 48))
        reference = (prediction + residual).astype(np.float32)
        steps, exponent = encode_residual(reference, prediction, "residual8")
        assert steps.dtype == np.int16
        r = reference.astype(np.float64) - prediction
        rms = math.sqrt(np.mean(np.square(r)))
        assert rms * 2.0**-bits < 2.0**exponent <= rms * 2.0 ** -(bits - 1)  # the step
        rebuilt = decode_residual(prediction, steps, exponent)
        assert rebuilt.dtype == np.float32
        error = np.abs(rebuilt.astype(np.float64) - reference)
        assert np.all(
            error <= 2.0 ** (exponent - 1) + np.spacing(np.abs(rebuilt)).astype(np.float64)
        )
        assert np.all(error <= 2.0**-bits * rms + np.spacing(np.abs(rebuilt)).astype(np.float64))
        assert np.sqrt(np.sum(np.square(error))) <= 2.0**-bits * np.sqrt(
            np.sum(np.square(r))
        ) + np.sqrt(np.sum(np.square(np.spacing(np.abs(rebuilt)).astype(np.float64))))
        assert 0 < np.max(error)  # lossy at this scale: the bound, not equality, is what holds


def test_an_exact_prediction_gives_a_zero_residual():
    prediction = np.array([[1.5, -2.0], [0.25, 3.0]])
    steps, exponent = encode_residual(prediction.astype(np.float32), prediction, "residual8")
    assert exponent == 0 and not steps.any()
    assert np.array_equal(
        decode_residual(prediction, steps, exponent), prediction.astype(np.float32)
    )


def test_tensors_that_stay_whole():
    rng = np.random.default_rng(5)
    prediction = rng.standard_normal((300, 300))  # one spike in 90000: 300 times the RMS
    reference = prediction.astype(np.float32)
    spike = reference.copy()
    spike[0, 0] += 1e6  # one residual far beyond the RMS: its steps do not fit int16
    nonfinite = reference.copy()
    nonfinite[1, 1] = np.inf
    nan_prediction = np.where(prediction > 2, np.nan, prediction)
    for ref, pred in (
        (reference.astype(np.float64), prediction),
        (spike, prediction),
        (nonfinite, prediction),
        (reference, None),
        (reference, prediction[:50]),
        (reference, nan_prediction),
    ):
        assert encode_residual(ref, pred, "residual8") is None
