"""Batched sampling on a real tiny random Llama with a byte-level tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.models.generate import SampleConfig, filter_logits, generate
from engine.models.policy import build_tiny_policy, load_policy
from engine.sapo.logprobs import build_batch, token_logprobs

PROMPTS = ["7+5=", "a much longer prompt, so rows need left padding: 12*3="]


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    path = build_tiny_policy(tmp_path_factory.mktemp("tiny") / "model", seed=3)
    return load_policy(path)


def test_deterministic_for_a_seed(policy: tuple[Any, Any]) -> None:
    model, tok = policy
    cfg = SampleConfig(max_new_tokens=12)
    a = generate(model, tok, PROMPTS, 3, cfg, seed=7)
    b = generate(model, tok, PROMPTS, 3, cfg, seed=7)
    c = generate(model, tok, PROMPTS, 3, cfg, seed=8)
    assert a == b
    assert a != c
    assert [len(g) for g in a] == [3, 3]
    for group in a:
        for comp in group:
            assert len(comp.token_ids) == len(comp.logprobs) <= 12
            assert all(lp <= 0.0 for lp in comp.logprobs)


def test_logprobs_match_a_full_forward(policy: tuple[Any, Any]) -> None:
    """Cache + left padding + pruning finished rows must not change what the policy computes."""
    model, tok = policy
    cfg = SampleConfig(temperature=0.7, max_new_tokens=10)
    groups = generate(model, tok, PROMPTS, 4, cfg, seed=1)
    prompt_ids = [tok(p)["input_ids"] for p in PROMPTS]
    rows_p = [prompt_ids[i] for i, g in enumerate(groups) for _ in g]
    rows_c = [list(c.token_ids) for g in groups for c in g]
    batch = build_batch(rows_p, rows_c, tok.pad_token_id)
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch, cfg.temperature)
    for r, comp in enumerate(c for g in groups for c in g):
        expected = torch.tensor(comp.logprobs)
        assert torch.allclose(logp[r, :len(comp.logprobs)], expected, atol=1e-4)


def test_greedy_batched_equals_one_prompt_at_a_time(policy: tuple[Any, Any]) -> None:
    model, tok = policy
    cfg = SampleConfig(temperature=0.0, max_new_tokens=8)
    batched = generate(model, tok, PROMPTS, 2, cfg, seed=0)
    for prompt, group in zip(PROMPTS, batched):
        alone = generate(model, tok, [prompt], 1, cfg, seed=123)[0][0]
        assert group[0].token_ids == group[1].token_ids == alone.token_ids


def test_top_k_one_and_tiny_top_p_are_greedy(policy: tuple[Any, Any]) -> None:
    model, tok = policy
    greedy = generate(model, tok, PROMPTS, 1, SampleConfig(temperature=0.0, max_new_tokens=6), seed=0)
    top1 = generate(model, tok, PROMPTS, 2, SampleConfig(top_k=1, max_new_tokens=6), seed=5)
    nucleus = generate(model, tok, PROMPTS, 2, SampleConfig(top_p=1e-6, max_new_tokens=6), seed=9)
    for g, a, b in zip(greedy, top1, nucleus):
        assert {c.token_ids for c in a} == {c.token_ids for c in b} == {g[0].token_ids}


def test_true_temperature_sampling_ignores_generation_config(policy: tuple[Any, Any]) -> None:
    """The tiny model's generation_config says top_k=50; T=1 sampling must reach beyond the top 50."""
    model, tok = policy
    assert model.generation_config.top_k == 50
    groups = generate(model, tok, ["x"], 64, SampleConfig(max_new_tokens=1), seed=2)
    ids = tok("x", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1]
    rank = {int(t): r for r, t in enumerate(torch.argsort(logits, descending=True))}
    assert max(rank[c.token_ids[0]] for c in groups[0]) >= 50


def test_stops_at_eos_and_flags_truncation(policy: tuple[Any, Any], tmp_path: Path) -> None:
    model, tok = policy
    cfg = SampleConfig(max_new_tokens=5)
    saved = model.generation_config.eos_token_id
    try:
        model.generation_config.eos_token_id = list(range(len(tok)))  # every token ends the completion
        stopped = generate(model, tok, PROMPTS, 2, cfg, seed=0)
    finally:
        model.generation_config.eos_token_id = saved
    for comp in (c for g in stopped for c in g):
        assert len(comp.token_ids) == 1 and not comp.truncated and comp.text == ""
    model.generation_config.eos_token_id = saved
    long = generate(model, tok, ["y"], 8, cfg, seed=0)[0]
    truncated = [c for c in long if c.truncated]
    assert truncated and all(len(c.token_ids) == 5 for c in truncated)
    assert all(c.token_ids[-1] == tok.eos_token_id for c in long if not c.truncated)


def test_filter_logits_by_hand() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, 2, 1.0)).tolist() == [[False, False, True, True]]
    # top_p 0.8: 0.5 + 0.3 reaches it, so the third token (mass before 0.8) is dropped.
    assert torch.isinf(filter_logits(logits, 0, 0.8)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, 0, 0.81)).tolist() == [[False, False, False, True]]


@pytest.mark.parametrize("kwargs", [{"temperature": -1.0}, {"temperature": float("nan")}, {"top_p": 0.0},
                                    {"top_p": 1.5}, {"top_k": -1}, {"max_new_tokens": 0}, {"top_k": 1.5}])
def test_sample_config_rejects_bad_values(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        SampleConfig(**kwargs)
