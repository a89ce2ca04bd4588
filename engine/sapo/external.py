"""How external (peer-generated) completions enter the loss: an explicit strategy.

The paper leaves this open; its reference code trains on them as if the receiver had sampled them
(`plain`). A pilot here found `plain` harmful for a small policy (ENVIRONMENT.md), hence:

plain                 advantages used as they are, like own on-policy samples.
positive-only         external completions with a negative advantage are left out of the loss (learn
                      from peers' successes, not their failures); own groups keep both signs.
importance-weighted   each external completion's advantage is multiplied by the truncated sequence
                      ratio min(π_receiver(y) / μ_generator(y), max_weight) (`sequence_importance_weights`);
                      an external group without generator log-probs cannot be weighted and is left out.
An optional KL anchor to the seed policy (SapoConfig.external_kl_anchor) is applied by the trainer
on external completions' tokens, whatever the strategy.
"""

from __future__ import annotations

import torch

from engine.sapo.grpo import sequence_importance_weights

EXTERNAL_STRATEGIES = ("plain", "positive-only", "importance-weighted")


def apply_external_strategy(strategy: str, advantages: torch.Tensor, is_external: torch.Tensor,
                            receiver_logp_sum: torch.Tensor | None = None,
                            generator_logp_sum: torch.Tensor | None = None,
                            has_generator_logp: torch.Tensor | None = None,
                            max_weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (effective advantages [B], keep [B] bool: completion enters the loss).

    advantages [B]; is_external [B] bool; for importance-weighted also receiver_logp_sum [B] (the
    receiver's sequence log-probs before the update), generator_logp_sum [B], has_generator_logp [B].
    """
    keep = torch.ones_like(is_external, dtype=torch.bool)
    if strategy == "plain":
        return advantages, keep
    if strategy == "positive-only":
        return advantages, keep & ~(is_external & (advantages < 0))
    if strategy == "importance-weighted":
        if receiver_logp_sum is None or generator_logp_sum is None or has_generator_logp is None:
            raise ValueError("importance-weighted needs receiver and generator sequence log-probs")
        weights = sequence_importance_weights(receiver_logp_sum, generator_logp_sum, max_weight)  # [B]
        weights = torch.where(is_external, weights, torch.ones_like(weights))
        keep = keep & ~(is_external & ~has_generator_logp)
        return advantages * weights, keep
    raise ValueError(f"external strategy must be one of {EXTERNAL_STRATEGIES}, got {strategy!r}")
