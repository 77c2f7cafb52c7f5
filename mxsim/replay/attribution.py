"""Where a layer's error comes from: output channels, input columns, input vs weight quantization.

``docs/replay.md`` ("Where the error is") states the definitions; in short, for one layer on
one unit, with float operands A (M, K), B (N, K) and the operands the unit multiplied Aq, Bq
(every group of the GEMM view together, float64):

* **output channel share**: for each output channel n, the sum over all other output axes of
  ``(unit output - float reference)**2``, divided by that sum over every output element;
* **input column share**: for each reduction column k, the energy of its product error
  ``P_k[m, n] = Aq[m, k] Bq[n, k] - A[m, k] B[n, k]``, ``sum_mn P_k**2``, divided by its sum
  over k (exact through ``P_k = dA_k Bq_k + A_k dB_k``: no (M, N, K) array is built); a conv
  column is folded onto its input channel (the sum over the filter taps);
* **input / weight quantization**: the SQNR of the layer (in dB, reference ``A Bᵀ``) were only
  the input quantized, ``10 log10(|A Bᵀ|² / |(Aq - A) Bᵀ|²)``, and were only the weight
  quantized, ``10 log10(|A Bᵀ|² / |A (Bq - B)ᵀ|²)``; the lower one names the operand whose
  quantization costs more. Operands the model left in float have dA = 0 (or dB = 0).
"""

from __future__ import annotations

import math

import numpy as np

from ..trace.model import Layer

#: How many channels / columns a report lists.
TOP = 3


def _sqnr_db(signal: float, noise: float) -> float:
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def top_shares(shares: np.ndarray, count: int = TOP) -> list[dict]:
    """The ``count`` largest nonzero shares, largest first: ``[{index, share}]``."""
    order = np.argsort(-shares, kind="stable")[:count]
    return [{"index": int(i), "share": float(shares[i])} for i in order if shares[i] > 0]


def output_channel_shares(layer: Layer, error: np.ndarray) -> np.ndarray:
    """Each output channel's share of the squared error (``error``: unit output - float
    reference, in the layer's output layout; channels: axis 1 of a convolution's output, the
    last axis otherwise). Non-finite errors count as zero."""
    squared = np.square(np.where(np.isfinite(error), error, 0.0))
    axis = 1 if layer.op in ("conv2d", "conv_transpose2d") else squared.ndim - 1
    per_channel = np.moveaxis(squared, axis, 0).reshape(squared.shape[axis], -1).sum(axis=1)
    total = per_channel.sum()
    return per_channel / total if total > 0 else np.zeros_like(per_channel)


def column_shares(a: np.ndarray, aq: np.ndarray, b: np.ndarray, bq: np.ndarray) -> np.ndarray:
    """Each reduction column's share of the product-error energy (module docstring), from the
    (G, M, K) / (G, N, K) operands."""
    da, db = aq - a, bq - b
    # sum_mn (da[m] bq[n] + a[m] db[n])^2 per group g and column k, then summed over the groups
    energy = np.sum(
        np.einsum("gmk,gmk->gk", da, da) * np.einsum("gnk,gnk->gk", bq, bq)
        + 2 * np.einsum("gmk,gmk->gk", da, a) * np.einsum("gnk,gnk->gk", bq, db)
        + np.einsum("gmk,gmk->gk", a, a) * np.einsum("gnk,gnk->gk", db, db),
        axis=0,
    )
    energy = np.where(np.isfinite(energy), energy, 0.0)
    total = energy.sum()
    return energy / total if total > 0 else np.zeros_like(energy)


def layer_attribution(
    layer: Layer,
    a: np.ndarray,
    aq: np.ndarray,
    b: np.ndarray,
    bq: np.ndarray,
    taps: int,
    order: str,
) -> dict | None:
    """Input column shares (folded onto input channels for a convolution: ``taps`` filter taps
    of ``K / taps`` columns each, in conv ``order``) and the input-only / weight-only SQNRs of
    float operands ``a`` (G, M, K), ``b`` (G, N, K) quantized as ``aq``, ``bq`` (what the unit
    multiplied). None for a layer whose trace keeps no float for an operand
    (``Layer.codes_only``): its quantization error is unknown."""
    if layer.codes_only:
        return None
    shares = column_shares(a, aq, b, bq)
    if taps > 1:  # (tap, channel) columns for kh_kw_c, (channel, tap) for c_kh_kw
        grid = shares.reshape(taps, -1) if order == "kh_kw_c" else shares.reshape(-1, taps).T
        shares = grid.sum(axis=0)
    reference = np.matmul(a, b.transpose(0, 2, 1))
    signal = float(np.sum(np.square(reference)))
    input_noise = float(np.sum(np.square(np.matmul(aq - a, b.transpose(0, 2, 1)))))
    weight_noise = float(np.sum(np.square(np.matmul(a, (bq - b).transpose(0, 2, 1)))))
    return {
        "input_columns": top_shares(shares),
        "column_kind": "input channel" if taps > 1 else "input column",
        "sqnr_input_only_db": _sqnr_db(signal, input_noise),
        "sqnr_weight_only_db": _sqnr_db(signal, weight_noise),
    }
