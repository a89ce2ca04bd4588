"""The numpy sampler used with llama.cpp logits follows the torch sampler's rules, on hand-built logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.models.generate import SampleConfig, filter_logits
from engine.models.llamacpp import LlamaCppConfig
from engine.models.sampling_np import chunk_sums, filter_logits_np, inverse_cdf, log_softmax, sample_rows


def test_log_softmax_is_normalised_and_shift_invariant() -> None:
    x = np.array([[1.0, 2.0, 3.0], [1000.0, 1000.0, -1000.0]])
    lp = log_softmax(x)  # [2, 3]
    assert np.allclose(np.exp(lp).sum(axis=-1), 1.0)
    assert np.allclose(lp[0], log_softmax(x[:1] + 50.0)[0])
    assert np.isclose(lp[1, 0], np.log(0.5)) and np.isfinite(lp).all()


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (1, 1.0), (3, 1.0), (0, 0.5), (0, 0.9), (4, 0.7)])
def test_filter_matches_torch(top_k: int, top_p: float) -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 17)) * 3  # [B, V]
    ours = filter_logits_np(logits, top_k, top_p)
    theirs = filter_logits(torch.tensor(logits), top_k, top_p).numpy()
    assert np.array_equal(np.isinf(ours), np.isinf(theirs))
    kept = ~np.isinf(ours)
    assert np.allclose(ours[kept], logits[kept])
    assert kept[np.arange(5), logits.argmax(-1)].all()  # the most likely token always stays


def test_greedy_takes_argmax_with_its_log_prob() -> None:
    logits = np.array([[0.0, 3.0, 1.0], [5.0, -1.0, 4.0]], dtype=np.float32)
    token, logp = sample_rows(logits, SampleConfig(temperature=0.0), np.random.default_rng(1))
    assert token.tolist() == [1, 0]
    assert np.allclose(logp, log_softmax(logits)[[0, 1], [1, 0]])


def test_samples_follow_the_tempered_distribution() -> None:
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.tile(np.log(probs), (20000, 1))  # 20k independent rows of one distribution
    cfg = SampleConfig(temperature=1.0)
    token, logp = sample_rows(logits, cfg, np.random.default_rng(2))
    freq = np.bincount(token, minlength=4) / len(token)
    assert np.abs(freq - probs).max() < 0.015
    assert np.allclose(logp, np.log(probs)[token])
    hot, hot_logp = sample_rows(logits, SampleConfig(temperature=2.0), np.random.default_rng(2))
    tempered = np.exp(np.log(probs) / 2.0) / np.exp(np.log(probs) / 2.0).sum()
    assert np.abs(np.bincount(hot, minlength=4) / len(hot) - tempered).max() < 0.015
    assert np.allclose(hot_logp, np.log(tempered)[hot])


def test_truncation_changes_what_is_drawn_not_the_logged_policy() -> None:
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.tile(np.log(probs), (4000, 1))
    token, logp = sample_rows(logits, SampleConfig(top_k=2), np.random.default_rng(3))
    assert set(token.tolist()) == {0, 1}
    assert np.allclose(logp, np.log(probs)[token])  # untruncated tempered log-probs, as generate.py logs them
    token, _ = sample_rows(logits, SampleConfig(top_p=0.7), np.random.default_rng(3))
    assert set(token.tolist()) == {0, 1}  # mass before token 2 is 0.8 >= 0.7: dropped


def test_same_seed_same_draws() -> None:
    logits = np.random.default_rng(4).normal(size=(8, 50))
    a = sample_rows(logits, SampleConfig(), np.random.default_rng(9))
    b = sample_rows(logits, SampleConfig(), np.random.default_rng(9))
    c = sample_rows(logits, SampleConfig(), np.random.default_rng(10))
    assert np.array_equal(a[0], b[0]) and not np.array_equal(a[0], c[0])


@pytest.mark.parametrize("bad", [{"threads": -1}, {"sync_every": 0}, {"kv_type": "q4"}, {"gpu_layers": -2},
                                 {"kv_layout": "paged"}, {"weights": "q4_0"}, {"threads": True}])
def test_config_rejects_bad_values(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        LlamaCppConfig(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("vocab", "chunk"), [(50, 7), (64, 16), (5, 512)])
def test_two_level_inverse_cdf_matches_a_full_cumsum(vocab: int, chunk: int) -> None:
    rng = np.random.default_rng(5)
    weights = rng.random((300, vocab)) * (rng.random((300, vocab)) < 0.6)  # [B, V] with zero-weight gaps
    weights[:, 0] += 1e-3  # every row has mass
    u = rng.random(300) * weights.sum(axis=1)
    expected = np.array([np.searchsorted(np.cumsum(w), x, side="right") for w, x in zip(weights, u)])
    assert np.array_equal(inverse_cdf(weights, u, chunk=chunk), expected)
    assert np.array_equal(chunk_sums(weights, chunk).sum(axis=1).round(9), weights.sum(axis=1).round(9))


def test_inverse_cdf_never_returns_a_zero_weight_token_at_the_edges() -> None:
    weights = np.zeros((3, 40))
    weights[0, 3] = weights[1, 11] = 1.0
    weights[2, [0, 17]] = 0.5
    u = weights.sum(axis=1) * (1.0 + 1e-12)  # rounding past the end of the row
    assert inverse_cdf(weights, u, chunk=8).tolist() == [3, 11, 17]
    assert inverse_cdf(weights, np.zeros(3), chunk=8).tolist() == [3, 11, 0]


def test_scratch_buffer_is_reused_and_the_logits_are_left_untouched() -> None:
    logits = np.random.default_rng(6).normal(size=(6, 1100)).astype(np.float32)  # ragged last chunk
    before = logits.copy()
    scratch = np.empty((8, 1100), dtype=np.float32)
    token, logp = sample_rows(logits, SampleConfig(temperature=0.7), np.random.default_rng(1), scratch)
    assert np.array_equal(logits, before)
    again = sample_rows(logits, SampleConfig(temperature=0.7), np.random.default_rng(1))
    assert np.array_equal(token, again[0]) and np.allclose(logp, again[1])
    assert np.allclose(logp, log_softmax(logits / 0.7)[np.arange(6), token], atol=1e-5)
