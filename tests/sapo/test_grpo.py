"""GRPO math on hand-built tensors with hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from engine.sapo.external import apply_external_strategy
from engine.sapo.grpo import (
    clipped_token_objective,
    group_advantages,
    kl_k3,
    loss_denominator,
    masked_loss_sum,
    nonzero_advantage_groups,
    sequence_importance_weights,
)


def test_group_advantages_by_hand() -> None:
    rewards = torch.tensor([[1.0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    adv = group_advantages(rewards, eps=1e-6)
    # group 1: mean 0.25, sample std sqrt((0.75² + 3·0.25²) / 3) = 0.5
    assert torch.allclose(adv[0], torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5)
    # group 2: mean 0.5, sample std sqrt(4·0.25 / 3) = 0.57735
    s = 0.5 / math.sqrt(1 / 3)
    assert torch.allclose(adv[1], torch.tensor([s, s, -s, -s]), atol=1e-5)
    assert torch.equal(adv[2], torch.zeros(4))
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([[1.0], [0.0]]))


def test_zero_advantage_filter() -> None:
    rewards = torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 0], [0.5, 0.5, 0.5, 0.5], [0.01, 0, 0, 0]])
    assert nonzero_advantage_groups(rewards).tolist() == [True, False, False, True]


def test_clipped_objective_by_hand() -> None:
    ratios = torch.tensor([[1.5, 0.5, 1.0], [0.5, 1.5, 1.1]])
    old = torch.zeros(2, 3)
    logp = torch.log(ratios).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    loss, binds = clipped_token_objective(logp, old, adv, eps_low=0.2, eps_high=0.28)
    # A=+1: r=1.5 -> min(1.5, 1.28) = 1.28; r=0.5 -> min(0.5, 0.8) = 0.5; r=1 -> 1
    # A=-1: r=0.5 -> min(-0.5, -0.8) = -0.8; r=1.5 -> min(-1.5, -1.28) = -1.5; r=1.1 -> -1.1
    assert torch.allclose(loss, torch.tensor([[-1.28, -0.5, -1.0], [0.8, 1.5, 1.1]]), atol=1e-6)
    assert binds.tolist() == [[True, False, False], [True, False, False]]
    loss.sum().backward()
    assert logp.grad is not None
    # Where clipping binds the gradient is zero; elsewhere d(-r·A)/dlogp = -r·A.
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -0.5, -1.0], [0.0, 1.5, 1.1]]), atol=1e-6)


def test_ratio_one_never_clips() -> None:
    logp = torch.tensor([[-0.3, -2.0], [-1.0, -0.1]], requires_grad=True)
    loss, binds = clipped_token_objective(logp, logp.detach(), torch.tensor([3.0, -2.0]))
    assert not binds.any()
    assert torch.allclose(loss, torch.tensor([[-3.0, -3.0], [2.0, 2.0]]))


def test_kl_k3_by_hand() -> None:
    kl = kl_k3(torch.log(torch.tensor([0.5, 0.25])), torch.log(torch.tensor([0.25, 0.25])))
    # delta = log(0.25/0.5): exp(delta) - delta - 1 = 0.5 + ln 2 - 1
    assert torch.allclose(kl, torch.tensor([0.5 + math.log(2) - 1, 0.0]), atol=1e-6)


def test_importance_weights_truncate() -> None:
    w = sequence_importance_weights(torch.tensor([-2.0, -3.0, -1.0]), torch.tensor([-3.0, -2.0, -1.0]), 1.0)
    assert torch.allclose(w, torch.tensor([1.0, math.exp(-1.0), 1.0]), atol=1e-6)
    w2 = sequence_importance_weights(torch.tensor([-2.0]), torch.tensor([-3.0]), 2.0)
    assert torch.allclose(w2, torch.tensor([2.0]))
    with pytest.raises(ValueError):
        sequence_importance_weights(torch.zeros(1), torch.zeros(1), 0.0)


def test_loss_denominators_by_hand() -> None:
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0], [1, 1, 1]])
    adv = torch.tensor([1.0, 0.0, -1.0])
    assert loss_denominator("tokens", mask, adv, 24) == 6
    assert loss_denominator("nonzero_tokens", mask, adv, 24) == 5
    assert loss_denominator("constant", mask, adv, 24) == 24
    assert loss_denominator("tokens", torch.zeros(1, 2), torch.zeros(1), 1) == 1  # never divides by 0
    with pytest.raises(ValueError):
        loss_denominator("mean", mask, adv, 1)
    assert masked_loss_sum(torch.ones(3, 3) * 2, mask).item() == 12


def test_external_strategies_by_hand() -> None:
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 0.5])
    ext = torch.tensor([False, False, True, True, True])
    a, keep = apply_external_strategy("plain", adv, ext)
    assert torch.equal(a, adv) and keep.all()
    a, keep = apply_external_strategy("positive-only", adv, ext)
    assert torch.equal(a, adv) and keep.tolist() == [True, True, True, False, True]
    recv = torch.tensor([-5.0, -5.0, -4.0, -2.0, -1.0])
    gen = torch.tensor([0.0, 0.0, -3.0, -3.0, 0.0])
    has = torch.tensor([False, False, True, True, False])
    a, keep = apply_external_strategy("importance-weighted", adv, ext, recv, gen, has, max_weight=1.0)
    # own rows weigh 1; ext row 2: exp(-1); ext row 3: exp(+1) truncated to 1; row 4 has no log-probs
    assert torch.allclose(a, torch.tensor([1.0, -1.0, math.exp(-1), -1.0, 0.5 * math.exp(-1)]), atol=1e-6)
    assert keep.tolist() == [True, True, True, True, False]
    with pytest.raises(ValueError):
        apply_external_strategy("trust-everyone", adv, ext)


def test_plausible_completions_judge_external_rows_by_their_mean_token_logprob() -> None:
    from engine.sapo.grpo import plausible_completions

    logp = torch.tensor([[-20.0, -20.0, 0.0], [-1.0, -2.0, 0.0], [-20.0, -1.0, -1.0], [-30.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    external = torch.tensor([True, True, True, False])
    # means: -20 (external, out), -1.5 (in), -7.33 (in at -8), -30 (own: always in)
    assert plausible_completions(logp, mask, external, -8.0).tolist() == [False, True, True, True]
    assert plausible_completions(logp, mask, external, -5.0).tolist() == [False, True, False, True]
