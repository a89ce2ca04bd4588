"""Sampling from llama.cpp logits in numpy, with the rules of `engine.models.generate`.

True temperature, optional top-k / top-p, and the log-prob of each drawn token under the tempered,
*untruncated* policy (the convention of `Completion.logprobs`). With a 49k vocabulary and 64 rows
this math runs once per decode step, so it is written to touch the [B, V] logits as few times as
possible: one max, one exp into a reused buffer, one chunked sum, and a cumulative sum over a
single chunk per row for the draw (`inverse_cdf`) instead of one over the whole vocabulary.
"""

from __future__ import annotations

import numpy as np

from engine.models.generate import SampleConfig

CDF_CHUNK = 512  # vocabulary entries per partial sum of the two-level inverse CDF


def log_softmax(x: np.ndarray) -> np.ndarray:
    """x [B, V] -> log-softmax over V in float32."""
    x = x.astype(np.float32, copy=False)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def filter_logits_np(logits: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """Logits [B, V] with everything outside top-k and the top-p nucleus set to -inf (the most likely
    token always stays). Same rule as generate.filter_logits."""
    out = logits.astype(np.float64, copy=True)
    if 0 < top_k < out.shape[-1]:
        kth = np.partition(out, -top_k, axis=-1)[:, -top_k][:, None]  # [B, 1]
        out[out < kth] = -np.inf
    if top_p < 1.0:
        order = np.argsort(-out, axis=-1, kind="stable")  # [B, V] most likely first
        sorted_logits = np.take_along_axis(out, order, axis=-1)
        probs = np.exp(log_softmax(sorted_logits))
        mass_before = np.cumsum(probs, axis=-1) - probs  # [B, V] mass of strictly more likely tokens
        drop = np.zeros_like(out, dtype=bool)
        np.put_along_axis(drop, order, mass_before >= top_p, axis=-1)
        out[drop] = -np.inf
    return out


def chunk_sums(weights: np.ndarray, chunk: int = CDF_CHUNK) -> np.ndarray:
    """weights [B, V] -> float64 sums of consecutive `chunk`-wide slices [B, ceil(V / chunk)]."""
    b, v = weights.shape
    whole = v - v % chunk
    sums = weights[:, :whole].reshape(b, -1, chunk).sum(axis=-1, dtype=np.float64)  # [B, V // chunk]
    if whole < v:  # a ragged last slice (e.g. Qwen's 151,936 with chunk 512)
        sums = np.concatenate([sums, weights[:, whole:].sum(axis=-1, dtype=np.float64)[:, None]], axis=1)
    return sums


def inverse_cdf(weights: np.ndarray, u: np.ndarray, sums: np.ndarray | None = None,
                chunk: int = CDF_CHUNK) -> np.ndarray:
    """weights [B, V] >= 0 (unnormalised), u [B] in [0, row total) -> token [B] int64: per row the
    first index whose running sum exceeds u, i.e. np.searchsorted(np.cumsum(w), u, "right").

    Two levels: find the chunk from the running chunk sums, then search one chunk. A token of zero
    weight is never returned, even when rounding puts u at a chunk's or the row's very end.
    """
    if sums is None:
        sums = chunk_sums(weights, chunk)
    running = np.cumsum(sums, axis=1)  # [B, C]
    last_chunk = running.shape[1] - 1
    token = np.empty(len(u), dtype=np.int64)
    for r in range(len(u)):
        c = min(int(np.searchsorted(running[r], u[r], side="right")), last_chunk)
        while c > 0 and sums[r, c] <= 0.0:  # rounding past the last chunk that has mass
            c -= 1
        rest = u[r] - (running[r, c - 1] if c else 0.0)
        inner = np.cumsum(weights[r, c * chunk:(c + 1) * chunk], dtype=np.float64)  # [chunk]
        i = min(int(np.searchsorted(inner, rest, side="right")), len(inner) - 1)
        t = c * chunk + i
        if weights[r, t] <= 0.0:  # u rounded onto the zero-weight tail of this chunk
            t = c * chunk + int(np.flatnonzero(weights[r, c * chunk:t + 1] > 0.0)[-1])
        token[r] = t
    return token


def sample_rows(logits: np.ndarray, cfg: SampleConfig, rng: np.random.Generator,
                scratch: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One step for B rows: logits [B, V] -> (token [B] int64, logprob [B] float32).

    logprob is log_softmax(logits / T)[token] over the full vocabulary (greedy: T = 1). `logits` is
    left untouched; `scratch` (float32, at least [B, V]) saves allocating the weights every step.
    """
    b, v = logits.shape
    rows = np.arange(b)
    temperature = cfg.temperature if cfg.temperature > 0.0 else 1.0
    top = logits.max(axis=-1)  # [B] (T > 0 keeps the argmax)
    if scratch is None or scratch.shape[0] < b or scratch.shape[1] != v or scratch.dtype != np.float32:
        scratch = np.empty((b, v), dtype=np.float32)
    weights = scratch[:b]
    np.subtract(logits, top[:, None], out=weights, dtype=np.float32)  # shifted: each row's max is 0
    if temperature != 1.0:
        weights *= np.float32(1.0 / temperature)
    np.exp(weights, out=weights)  # [B, V] unnormalised tempered probabilities
    sums = chunk_sums(weights)  # [B, C]
    total = sums.sum(axis=1)  # [B] the untruncated normaliser
    if cfg.temperature == 0.0:
        token = logits.argmax(axis=-1).astype(np.int64)
    elif cfg.top_k or cfg.top_p < 1.0:
        kept = np.exp(filter_logits_np((logits - top[:, None]) / temperature, cfg.top_k, cfg.top_p))  # 0 outside
        token = inverse_cdf(kept, rng.random(b) * kept.sum(axis=-1))
    else:
        token = inverse_cdf(weights, rng.random(b) * total, sums)
    chosen = (logits[rows, token].astype(np.float64) - top) / temperature  # [B] tempered, shifted
    return token, (chosen - np.log(total)).astype(np.float32)
