"""Evaluation metrics against hand-worked cases and independent oracles (scipy, torch)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mxsim.evaluate.metrics import (
    accuracy,
    causal_lm_metrics,
    classification_metrics,
    embedding_metrics,
    next_token_results,
    perplexity,
    pool,
)


def test_pooling_follows_the_mask():
    hidden = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    mask = np.array([[1, 1, 0], [1, 1, 1]])
    mean = pool(hidden, mask, "mean")
    assert mean.tolist() == [
        [1.0, 2.0],
        [8.0, 9.0],
    ]  # row 0: (0+2)/2, (1+3)/2; row 1: (6+8+10)/3, ...
    assert pool(hidden, mask, "cls").tolist() == [[0.0, 1.0], [6.0, 7.0]]
    assert pool(-hidden, mask, "max").tolist() == [[0.0, -1.0], [-6.0, -7.0]]
    assert pool(hidden, np.zeros((2, 3)), "mean").tolist() == [
        [0.0, 0.0],
        [0.0, 0.0],
    ]  # count clamped, no NaN


def test_identical_embeddings_agree_fully():
    x = np.random.default_rng(0).standard_normal((5, 8))
    got = embedding_metrics(x, 3.0 * x)  # cosine ignores scale (a Normalize module changes nothing)
    assert got["cosine_min"] == pytest.approx(1.0, abs=1e-12) and got[
        "cosine_mean"
    ] == pytest.approx(1.0, abs=1e-12)
    assert got["neighbour_agreement"] == got["order_agreement"] == 1.0
    assert got["spearman_mean"] == pytest.approx(1.0)


def test_a_swapped_neighbour_is_counted():
    # 0 and 1 are close, 2 a little further from 0 than 1 is; the unit moves 2 closer to 0 than 1.
    reference = np.array([[1.0, 0.0], [0.9, 0.3], [0.8, -0.5], [-1.0, 0.5]])
    unit = np.array([[1.0, 0.0], [0.9, 0.5], [0.9, -0.3], [-1.0, 0.5]])
    got = embedding_metrics(reference, unit)
    # nearest of 0: 1 (ref) vs 2 (unit); of 1: 0 both; of 2: 0 both; of 3: 1 both
    assert got["neighbour_agreement"] == 0.75
    cosines = [
        np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b) for a, b in zip(reference, unit)
    ]
    assert got["cosine_min"] == pytest.approx(min(cosines)) and got["cosine_mean"] == pytest.approx(
        np.mean(cosines)
    )
    # comparisons that flip: for 0, (1, 2); for 3, none (1 then 0 then 2 in both); for 1 and 2, none
    assert got["order_agreement"] == pytest.approx(11 / 12)


def test_spearman_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    for n in (3, 4, 9):
        a = rng.standard_normal((n, 6))
        b = a + 0.5 * rng.standard_normal((n, 6))
        unit_rows = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
        sa, sb = unit_rows(a) @ unit_rows(a).T, unit_rows(b) @ unit_rows(b).T
        want = np.mean(
            [stats.spearmanr(np.delete(sa[i], i), np.delete(sb[i], i)).statistic for i in range(n)]
        )
        assert embedding_metrics(a, b)["spearman_mean"] == pytest.approx(want, abs=1e-12)
    assert embedding_metrics(a[:2], b[:2])["spearman_mean"] is None


def test_next_token_nll_matches_torch_cross_entropy(torch):
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((2, 5, 7)).astype(np.float32) * 4
    ids = rng.integers(0, 7, (2, 5))
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    nll, predicted = next_token_results(logits, ids, mask)
    targets = torch.from_numpy(ids[:, 1:].copy())
    targets[torch.from_numpy(~(mask[:, 1:].astype(bool)))] = -100  # as Hugging Face labels padding
    want = torch.nn.functional.cross_entropy(
        torch.from_numpy(logits[:, :-1]).double().reshape(-1, 7),
        targets.reshape(-1),
        reduction="none",
    )
    kept = targets.reshape(-1) != -100
    assert nll.shape == (6,) and np.allclose(nll, want[kept].numpy(), rtol=0, atol=1e-12)
    assert predicted.tolist() == logits[:, :-1].argmax(-1)[mask[:, 1:].astype(bool)].tolist()
    assert perplexity(nll) == pytest.approx(math.exp(float(want[kept].mean())))
    same = causal_lm_metrics((nll, predicted), (nll, predicted))
    assert same["top1_agreement"] == 1.0 and same["perplexity"] == pytest.approx(perplexity(nll))


def test_classification_metrics():
    reference = np.array([[2.0, 1.0, 0.0], [0.0, 1.0, 3.0], [1.0, 0.0, 0.0], [0.0, 2.0, 1.0]])
    unit = reference + np.array([[0, 0, 0], [0, 2.5, 0], [0, 0, 0], [0, 0, 0.5]])
    got = classification_metrics(reference, unit, np.array([0, 1, 1, 2]))
    assert got == {"top1_agreement": 0.75, "logit_max_abs_diff": 2.5, "accuracy": 0.5}
    assert accuracy(unit, None) is None
