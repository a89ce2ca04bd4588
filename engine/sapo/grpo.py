"""GRPO/SAPO math as small pure functions on tensors (shapes in comments).

Notation: G groups (questions), L completions per group, B = rows (completions) in a batch,
C = completion tokens (padded). A_i is the advantage of completion i, r_t(θ) = π_θ(y_t) / π_old(y_t).

About `num_iterations` (passes over one round's batch, one optimizer step each): on the first pass
π_old is the policy that is being differentiated, so r_t = 1 exactly and the clipped objective equals
the plain policy gradient: clipping can only act from the second pass on. That is why the public
reference implementation (one pass, old = logp.detach()) is REINFORCE with group-normalised advantages.
"""

from __future__ import annotations

import math

import torch

LOSS_NORMS = ("tokens", "nonzero_tokens", "constant")


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """A = (r - mean_group) / (std_group + eps).  rewards [G, L] -> advantages [G, L].

    std is the sample standard deviation (Bessel-corrected, as in DeepSeekMath/TRL); L must be >= 2.
    A group whose rewards are all equal gets all-zero advantages.
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError("rewards must be [G, L] with L >= 2")
    mean = rewards.mean(dim=1, keepdim=True)  # [G, 1]
    std = rewards.std(dim=1, keepdim=True)  # [G, 1]
    return (rewards - mean) / (std + eps)


def nonzero_advantage_groups(rewards: torch.Tensor, tol: float = 1e-9) -> torch.Tensor:
    """The zero-advantage filter: keep [G] (bool) where the group's rewards are not all equal.

    Such groups carry no policy-gradient signal; SAPO drops them before sampling the J external ones.
    """
    if rewards.dim() != 2:
        raise ValueError("rewards must be [G, L]")
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) > tol


def clipped_token_objective(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                            eps_low: float = 0.2, eps_high: float = 0.28) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate loss (to minimise) and where clipping binds.

    logp, old_logp [B, C]; advantages [B] (one per completion, broadcast over its tokens).
    loss_t = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)                       -> [B, C]
    clipped_t = the clipped branch is the smaller one and differs (gradient is zero)     -> [B, C] bool
    """
    ratio = torch.exp(logp - old_logp)  # [B, C]
    adv = advantages[:, None]  # [B, 1]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    binds = ((ratio > 1.0 + eps_high) & (adv > 0)) | ((ratio < 1.0 - eps_low) & (adv < 0))
    return loss, binds


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(π_θ || π_ref) estimator k3 = exp(ref - logp) - (ref - logp) - 1 >= 0.  [B, C] -> [B, C]."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def sequence_importance_weights(receiver_logp_sum: torch.Tensor, generator_logp_sum: torch.Tensor,
                                max_weight: float = 1.0) -> torch.Tensor:
    """w_i = min(exp(log π_receiver(y_i) - log μ_generator(y_i)), max_weight).  [B], [B] -> [B].

    Sequence level because the generator may tokenise differently: a whole text's log-prob is
    comparable across tokenisations, a token's is not. Truncated above (max_weight) because the
    generator's log-probs are untrusted: a peer claiming its sample was improbable cannot inflate
    its weight past max_weight. Not differentiated (a weight, not an objective).
    """
    if not math.isfinite(max_weight) or max_weight <= 0:
        raise ValueError("max_weight must be a positive finite number")
    log_w = (receiver_logp_sum - generator_logp_sum).detach()
    return torch.exp(torch.clamp(log_w, max=math.log(max_weight)))


def plausible_completions(logp: torch.Tensor, mask: torch.Tensor, external: torch.Tensor,
                          min_mean_logp: float) -> torch.Tensor:
    """keep [B] bool: own rows always; an external row when its mean per-token log-prob under the
    receiver is >= min_mean_logp.  logp, mask [B, C]; external [B] bool.

    A peer's text this policy finds very unlikely (a trigger phrase, another language, padding)
    is not a sample this policy could have drawn: learning from it moves the policy far, for one
    peer's say-so. Not differentiated."""
    return ~external | (mean_token_logprob(logp, mask) >= min_mean_logp)


def mean_token_logprob(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B]: each row's mean per-token log-prob over its masked tokens. logp, mask [B, C]. Not differentiated."""
    lengths = mask.sum(-1).clamp(min=1.0)  # [B]
    return (logp.detach() * mask).sum(-1) / lengths


def loss_denominator(mode: str, token_mask: torch.Tensor, advantages: torch.Tensor,
                     constant: float) -> float:
    """What the summed per-token loss is divided by. token_mask [B, C] (tokens entering the loss),
    advantages [B].

    tokens          every token entering the loss (DAPO's token-level mean). If zero-advantage groups
                    are kept (filter off) they dilute the step.
    nonzero_tokens  only tokens of completions with a non-zero advantage: the step size no longer
                    depends on how many zero-advantage groups were in the batch (with the filter on
                    and binary rewards this equals `tokens`).
    constant        a fixed number (e.g. groups x L x max_new_tokens, as in Dr. GRPO): the step grows
                    with the amount of signal in the batch.
    """
    if mode == "tokens":
        count = float(token_mask.sum().item())
    elif mode == "nonzero_tokens":
        count = float((token_mask * (advantages != 0)[:, None]).sum().item())
    elif mode == "constant":
        count = float(constant)
    else:
        raise ValueError(f"loss normalisation must be one of {LOSS_NORMS}, got {mode!r}")
    return max(count, 1.0)


def masked_loss_sum(token_loss: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """Σ_t loss_t over tokens entering the loss. [B, C], [B, C] -> scalar."""
    return (token_loss * token_mask).sum()
