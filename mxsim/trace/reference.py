"""A layer's float reference output stored as its residual from the exact MX product.

A compact trace keeps a layer's input and weight as MX codes and scales
(:func:`mxsim.trace.io.build_manifest`); from those the output the model's quantized
operands give is computable exactly, and the float reference differs from it by the
quantization error. Storing that difference coarsely instead of the float32 output is what
makes a compact trace small (docs/trace-format.md, "Reference outputs"). Definitions:

* **prediction** ``P`` (:func:`mx_prediction`), float64: ``alpha * E + beta * bias`` where
  ``E`` is the exact sum of the products of the decoded operands rounded once to fp32
  (nearest even) by the exact accumulator unit (:func:`mxsim.datapath.config.exact_unit`),
  and ``bias`` the stored bias (float64 multiplies and one add per element, each rounded to
  nearest even). Defined for ``linear`` and ``matmul`` layers whose input and weight are
  both blocked along K; every machine computes the same ``P``, bit for bit.
* **residual** of mode ``residualN`` (:func:`encode_residual`): with ``r = reference - P``
  and ``rms = sqrt(mean(r**2))``, the step is ``2^s``, ``s = floor(log2(rms)) - (N - 1)``
  (``s = 0`` when ``rms`` is 0), and the stored residual is ``q = round_half_even(r / 2^s)``
  as int16. A tensor whose ``q`` does not fit int16, or whose ``r`` or reconstruction is not
  finite, or whose output is not float32, is stored whole instead.
* **reconstruction** (:func:`decode_residual`): ``float32(P + q * 2^s)`` (the sum in
  float64, then rounded to float32, nearest even). Each element is within
  ``2^(s-1) <= 2^-N * rms`` of ``reference + (the float64 sum's rounding)``, then within one
  float32 ulp more: ``|reconstructed - reference| <= 2^-N * rms + ulp(reconstructed)``.
  So the reconstructed tensor differs from the reference by at most ``2^-N`` of the
  quantization error's RMS per element, and in L2 norm by at most ``2^-N * |r|`` (plus the
  float32 rounding): an error ``e`` measured against it moves by at most that much
  (triangle inequality), whatever ``e`` is.
"""

from __future__ import annotations

import math

import numpy as np

from ..datapath import matmul
from ..datapath.config import exact_unit
from ..formats import E8M0_ONE
from ..quantize import MXTensor
from ..quantize.options import QuantOptions

#: How a layer's float reference output is stored: ``float32`` whole (exact); ``residualN``
#: as the int16 residual from the exact MX product, in steps between ``2^-N`` and
#: ``2^-(N-1)`` times the residual's RMS (mode -> N).
REFERENCE_MODES = {"float32": None, "residual8": 8}
#: The reference mode a compact trace (``floats=False``) gets unless told otherwise.
COMPACT_REFERENCE = "residual8"
RESIDUAL_DTYPE = "int16"
_RESIDUAL_LIMIT = np.iinfo(np.int16).max
#: Outputs of one exact-unit call when a batched matmul's groups share it (2^14: a few groups of
#: attention heads; one call per head costs more in call overhead, larger calls more in the
#: products of other groups they compute and drop).
_GROUPED_OUTPUTS = 1 << 14


def _along_k(tensor: MXTensor, length: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes (..., length) and scales (..., length / block) of a tensor blocked along K,
    padded with zero codes and unit scales, each scale repeated over the sub-blocks."""
    codes = tensor.codes
    scales = np.repeat(tensor.scales, tensor.block_size // block, axis=-1)
    extra = length - codes.shape[-1]
    pad = [(0, 0)] * (codes.ndim - 1)
    codes = np.pad(codes, pad + [(0, extra)])
    scales = np.pad(
        scales, pad + [(0, length // block - scales.shape[-1])], constant_values=E8M0_ONE
    )
    return codes, scales


def mx_prediction(
    op: str, attrs: dict, a: MXTensor, b: MXTensor, bias: np.ndarray | None
) -> np.ndarray | None:
    """``P`` of the module docstring for a layer with input ``a`` and weight ``b`` (the
    model's MX codes of its input and weight, as :func:`mxsim.quantize_mx` gives them), or
    None when the layer is not a linear or matmul layer with both operands blocked along K."""
    x_shape, w_shape = tuple(a.shape), tuple(b.shape)
    if op == "linear":
        weight_k_axis = 1
    elif op == "matmul":
        weight_k_axis = len(w_shape) - 2
    else:
        return None
    if (
        a.axis != len(x_shape) - 1
        or b.axis != weight_k_axis
        or a.tensor_scale_exponent
        or b.tensor_scale_exponent
    ):
        return None
    block = math.gcd(a.block_size, b.block_size)
    length = max(a.codes.shape[-1], b.codes.shape[-1])
    a_codes, a_scales = _along_k(a, length, block)
    b_codes, b_scales = _along_k(
        b, length, block
    )  # (..., N, length): the weight's K axis moved last
    unit = exact_unit(a.element_format.name, b.element_format.name, block)

    def product(rows_a, scales_a, rows_b, scales_b) -> np.ndarray:
        left = MXTensor(
            a.element_format,
            np.ascontiguousarray(rows_a),
            np.ascontiguousarray(scales_a),
            rows_a.shape,
            1,
            block,
            0,
            QuantOptions(),
        )
        right = MXTensor(
            b.element_format,
            np.ascontiguousarray(rows_b),
            np.ascontiguousarray(scales_b),
            (length, rows_b.shape[0]),
            0,
            block,
            0,
            QuantOptions(),
        )
        return (
            matmul(unit, left, right).bits.view(np.float32).astype(np.float64)
        )  # the unit's fp32 results

    if len(w_shape) == 2:  # one weight for every row of the input
        rows = product(
            a_codes.reshape(-1, length), a_scales.reshape(-1, length // block), b_codes, b_scales
        )
        out = rows.reshape(x_shape[:-1] + (rows.shape[-1],))
    else:  # several groups per call: each group's block of the (rows x rows) product is its result
        batch = np.broadcast_shapes(x_shape[:-2], w_shape[:-2])
        rows, columns, groups = x_shape[-2], w_shape[-1], math.prod(batch)
        a_codes, a_scales, b_codes, b_scales = (
            np.broadcast_to(v, batch + v.shape[-2:]).reshape((groups,) + v.shape[-2:])
            for v in (a_codes, a_scales, b_codes, b_scales)
        )
        out = np.empty((groups, rows, columns), dtype=np.float64)
        step = max(1, math.isqrt(_GROUPED_OUTPUTS // max(1, rows * columns)))
        for start in range(0, groups, step):
            part = slice(start, min(start + step, groups))
            count = part.stop - start
            every = product(
                a_codes[part].reshape(count * rows, -1),
                a_scales[part].reshape(count * rows, -1),
                b_codes[part].reshape(count * columns, -1),
                b_scales[part].reshape(count * columns, -1),
            )
            own = np.arange(count)
            out[part] = every.reshape(count, rows, count, columns)[own, :, own, :]
        out = out.reshape(batch + (rows, columns))
    out = out * float(attrs.get("alpha", 1.0))
    if bias is not None:
        out = out + np.asarray(bias, dtype=np.float64) * float(attrs.get("beta", 1.0))
    return out


def encode_residual(
    reference: np.ndarray, prediction: np.ndarray | None, mode: str
) -> tuple[np.ndarray, int] | None:
    """``(q, s)`` of the module docstring for a ``residualN`` mode, or None where the
    reference must be stored whole (no prediction, not float32, not finite, or a residual
    too wide for int16)."""
    if prediction is None or reference.dtype != np.float32 or prediction.shape != reference.shape:
        return None
    residual = reference.astype(np.float64) - prediction
    if not np.all(np.isfinite(residual)):
        return None
    rms = math.sqrt(float(np.mean(np.square(residual)))) if residual.size else 0.0
    # frexp: rms = m * 2^e with 0.5 <= m < 1, so floor(log2(rms)) = e - 1 exactly
    exponent = math.frexp(rms)[1] - 1 - (REFERENCE_MODES[mode] - 1) if rms > 0 else 0
    steps = np.rint(np.ldexp(residual, -exponent))
    if steps.size and np.max(np.abs(steps)) > _RESIDUAL_LIMIT:
        return None
    steps = steps.astype(np.int16)
    if not np.all(np.isfinite(decode_residual(prediction, steps, exponent))):
        return None
    return steps, exponent


def decode_residual(prediction: np.ndarray, steps: np.ndarray, exponent: int) -> np.ndarray:
    """The reconstructed reference ``float32(P + q * 2^s)`` (module docstring)."""
    with np.errstate(over="ignore"):  # a hostile exponent gives inf, which the reader refuses
        return (prediction + np.ldexp(steps.astype(np.float64), exponent)).astype(np.float32)
