"""The metrics that compare a model run on a unit with the same model in float (numpy, float64).

Each task's forward output is first reduced to a small per-input result (:func:`pool`,
:func:`next_token_results`, the classifier's logits); the metrics compare two such results.
"""

from __future__ import annotations

import math

import numpy as np


def pool(hidden: np.ndarray, mask: np.ndarray, pooling: str) -> np.ndarray:
    """Sentence embeddings (B, D) from token states ``hidden`` (B, T, D) and the attention
    ``mask`` (B, T), as sentence-transformers' Pooling module: ``mean`` = the sum of the
    unmasked token states over their count (the count clamped to at least 1e-9); ``cls`` = the
    first token's state; ``max`` = the element-wise maximum over unmasked tokens. float64."""
    hidden = np.asarray(hidden, dtype=np.float64)
    keep = np.asarray(mask, dtype=np.float64)[..., None]
    if pooling == "mean":
        return (hidden * keep).sum(axis=1) / np.maximum(keep.sum(axis=1), 1e-9)
    if pooling == "cls":
        return hidden[:, 0, :].copy()
    if pooling == "max":
        return np.where(keep > 0, hidden, -np.inf).max(axis=1)
    raise ValueError(f"pooling {pooling!r}")


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms == 0, 1.0, norms)


def _others_order(similarity: np.ndarray) -> np.ndarray:
    """Per row i, the other rows j != i from most to least similar (ties: lower index first)."""
    n = similarity.shape[0]
    order = np.argsort(-similarity, axis=1, kind="stable")
    return np.array([row[row != i] for i, row in enumerate(order)]).reshape(n, n - 1)


def _order_agreement(reference: np.ndarray, unit: np.ndarray) -> float:
    """The ``order_agreement`` of :func:`embedding_metrics` from two similarity matrices."""
    n = reference.shape[0]
    agree = total = 0
    for i in range(n):
        others = np.arange(n) != i
        a, b = reference[i, others], unit[i, others]
        j, k = np.triu_indices(n - 1, 1)
        agree += int(np.count_nonzero(np.sign(a[j] - a[k]) == np.sign(b[j] - b[k])))
        total += j.size
    return agree / total if total else 1.0


def _ranks(order: np.ndarray) -> np.ndarray:
    """(N, N) ranks 0..N-2 of the other inputs of each row (its own column 0) from their order."""
    n = order.shape[0]
    ranks = np.zeros((n, n), dtype=np.int64)
    np.put_along_axis(ranks, order, np.arange(n - 1)[None, :].repeat(n, axis=0), axis=1)
    return ranks


def embedding_metrics(reference: np.ndarray, unit: np.ndarray) -> dict:
    """Embeddings ``unit`` (N, D) against ``reference`` (N, D), N >= 2:

    * ``cosine_min``, ``cosine_mean``: cosine similarity of each input's two embeddings (a
      zero vector has cosine 0 with anything);
    * ``neighbour_agreement``: the fraction of inputs whose nearest other input by cosine
      similarity is the same under both;
    * ``order_agreement``: over every input i and every pair j < k of other inputs, the fraction
      of comparisons "is j or k more similar to i" (the sign of ``s(i,j) - s(i,k)``, cosine
      similarity s) that come out the same under both;
    * ``spearman_mean``: the mean over inputs of Spearman's rank correlation between the two
      similarity rows (the other inputs only; N >= 3, else None; ranks by the same order).
    """
    ref, got = (
        _unit_rows(np.asarray(reference, np.float64)),
        _unit_rows(np.asarray(unit, np.float64)),
    )
    n = ref.shape[0]
    cosine = (ref * got).sum(axis=1)
    ref_order, got_order = _others_order(ref @ ref.T), _others_order(got @ got.T)
    spearman = None
    if n >= 3:
        m = n - 1
        d = _ranks(ref_order) - _ranks(got_order)
        spearman = float(np.mean(1 - 6 * (d**2).sum(axis=1) / (m * (m * m - 1))))
    return {
        "cosine_min": float(cosine.min()),
        "cosine_mean": float(cosine.mean()),
        "neighbour_agreement": float(np.mean(ref_order[:, 0] == got_order[:, 0])),
        "order_agreement": _order_agreement(ref @ ref.T, got @ got.T),
        "spearman_mean": spearman,
    }


def next_token_results(
    logits: np.ndarray, ids: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(negative log-likelihood, predicted id) of every next token a causal LM predicts: the
    positions t of each row with ``mask[t]`` and ``mask[t + 1]`` set, the target ``ids[t + 1]``;
    log-softmax in float64, natural log; the prediction is the argmax (lowest id on ties)."""
    logits = np.asarray(logits, dtype=np.float64)[:, :-1, :]
    targets = np.asarray(ids)[:, 1:]
    mask = np.asarray(mask).astype(bool)
    keep = mask[:, :-1] & mask[:, 1:]
    top = logits.max(axis=-1, keepdims=True)
    log_norm = np.log(np.exp(logits - top).sum(axis=-1)) + top[..., 0]
    picked = np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return (log_norm - picked)[keep], logits.argmax(axis=-1)[keep]


def causal_lm_metrics(
    reference: tuple[np.ndarray, np.ndarray], unit: tuple[np.ndarray, np.ndarray]
) -> dict:
    """``perplexity``: exp of the mean next-token NLL of the unit's run over every predicted
    position; ``top1_agreement``: the fraction of positions whose argmax token is the float
    run's."""
    return {
        "perplexity": perplexity(unit[0]),
        "top1_agreement": float(np.mean(reference[1] == unit[1])),
    }


def perplexity(nll: np.ndarray) -> float:
    return math.exp(float(np.mean(nll)))


def classification_metrics(
    reference: np.ndarray, unit: np.ndarray, labels: np.ndarray | None
) -> dict:
    """``top1_agreement``: the fraction of inputs whose argmax class is the float run's;
    ``logit_max_abs_diff``: the largest |unit - float| logit; ``accuracy``: the fraction of
    inputs whose argmax is the label (None without labels)."""
    reference, unit = np.asarray(reference, np.float64), np.asarray(unit, np.float64)
    return {
        "top1_agreement": float(np.mean(reference.argmax(axis=1) == unit.argmax(axis=1))),
        "logit_max_abs_diff": float(np.abs(unit - reference).max()),
        "accuracy": accuracy(unit, labels),
    }


def accuracy(logits: np.ndarray, labels: np.ndarray | None) -> float | None:
    return None if labels is None else float(np.mean(np.asarray(logits).argmax(axis=1) == labels))


def result_sqnr_db(reference, other) -> float:
    """SQNR in dB of a run's per-input result against another run's (the embeddings, the
    classifier's logits, a causal LM's next-token NLLs): ``10 log10(sum ref^2 / sum (other -
    ref)^2)`` in float64; ``inf`` when the two are equal, and when both are zero."""
    if isinstance(reference, tuple):
        reference, other = reference[0], other[0]
    reference = np.asarray(reference, np.float64).ravel()
    noise = float(np.sum((np.asarray(other, np.float64).ravel() - reference) ** 2))
    signal = float(np.sum(reference**2))
    if noise == 0:
        return math.inf
    return -math.inf if signal == 0 else 10 * math.log10(signal / noise)
