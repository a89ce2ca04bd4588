"""From scored rollout groups to loss rows: local re-tokenisation, advantages, round metrics.

Own groups keep the exact token ids they were sampled as. External groups are plain text from a
peer: their completions are re-tokenised with the local tokenizer after the local prompt template,
so the loss sees them exactly as if this node had produced that text.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from engine.models.generate import Completion, encode_prompts
from engine.sapo.grpo import group_advantages
from engine.sapo.records import RolloutGroup
from engine.sapo.update import TrainRow

# A sampled token's log-prob below this (e^-30) is not a plausible claim from any sampler at T ~ 1.
MIN_TOKEN_LOGPROB = -30.0


@dataclass(frozen=True)
class LocalGroup:
    """An own group as generated this round: the record plus what only the generator knows."""

    group: RolloutGroup  # rewards filled by the local verifier
    prompt: str  # rendered prompt
    completions: tuple[Completion, ...]  # sampled token ids and log-probs


def retokenize_completion(tokenizer: Any, text: str, eos_id: int, max_tokens: int) -> tuple[int, ...]:
    """A peer's completion text -> local token ids, ending with EOS as a finished sample would.

    Longer than `max_tokens`: cut to `max_tokens` without EOS, like a locally truncated sample.
    """
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if len(ids) + 1 > max_tokens:
        return tuple(ids[:max_tokens])
    return tuple(ids + [eos_id])


def receiver_view(group: RolloutGroup, tokenizer: Any, eos_id: int,
                  max_tokens: int) -> tuple[RolloutGroup, tuple[tuple[int, ...], ...], bool]:
    """A peer's group as this node trains it -> (group, token ids per completion, cut?).

    A completion that re-tokenises past the receiver's token cap is cut there, and the group then
    carries the *text of the cut tokens*: the caller re-scores it, so a completion is scored and
    trained on as the same text (8,000 spaces before a right answer earned 1 and trained 32 tokens
    of spaces before). A cut group's generator log-probs no longer describe its text: dropped.
    """
    ids = tuple(retokenize_completion(tokenizer, text, eos_id, max_tokens) for text in group.completions)
    # Without EOS the row is cut (or was a sample truncated at the same cap: then its text is unchanged)
    texts = tuple(text if row and row[-1] == eos_id else tokenizer.decode(list(row), skip_special_tokens=True)
                  for row, text in zip(ids, group.completions))
    if texts == group.completions:
        return group, ids, False
    return replace(group, completions=texts, rewards=None, generator_logprobs=None, logprob_summary=None), ids, True


def special_token_rows(ids: Sequence[tuple[int, ...]], special_ids: frozenset[int], eos_id: int) -> int:
    """Completions whose ids hold a special token before the EOS `retokenize_completion` appended: a
    peer's literal "<|endoftext|>" text tokenises to the EOS id itself, and every token after it would be
    trained as if the policy had written past its own end."""
    return sum(1 for row in ids if any(t in special_ids for t in (row[:-1] if row and row[-1] == eos_id else row)))


def special_ids_of(tokenizer: Any) -> frozenset[int]:
    """Every special token id of `tokenizer` (EOS, PAD, BOS, chat markers, added special tokens)."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", ()) or ()}
    for attr in ("eos_token_id", "pad_token_id", "bos_token_id"):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int):
            ids.add(value)
    return frozenset(ids)


def advantages_of(group: RolloutGroup, eps: float) -> list[float]:
    """Group advantages from the group's local rewards."""
    if group.rewards is None:
        raise ValueError("group is not scored")
    return group_advantages(torch.tensor([list(group.rewards)], dtype=torch.float64), eps)[0].tolist()


def local_rows(groups: Sequence[LocalGroup], tokenizer: Any, eps: float) -> list[TrainRow]:
    rows: list[TrainRow] = []
    for lg in groups:
        prompt_ids = tuple(encode_prompts(tokenizer, [lg.prompt])[0])
        for comp, adv in zip(lg.completions, advantages_of(lg.group, eps)):
            rows.append(TrainRow(prompt_ids, comp.token_ids, adv, False, math.fsum(comp.logprobs)))
    return rows


def claimed_logprob_sums(group: RolloutGroup) -> tuple[float, ...] | None:
    """The generator's sequence log-probs, if the claim is plausible: one finite value per token in
    [MIN_TOKEN_LOGPROB, 0] (a peer claiming -1e6 would otherwise win the largest importance weight)."""
    summary = group.summarized_logprobs()
    if summary is None or len(summary) != len(group.completions):
        return None
    for total, tokens, lowest in summary:  # every token in [MIN, 0] <=> the lowest is, and the sum fits
        if not (math.isfinite(total) and math.isfinite(lowest) and MIN_TOKEN_LOGPROB <= lowest <= 0.0
                and tokens * MIN_TOKEN_LOGPROB <= total <= 0.0 and (tokens > 0 or total == 0.0)):
            return None
    return tuple(total for total, _, _ in summary)


def external_rows(groups: Sequence[RolloutGroup], prompts: Sequence[str], token_ids: Sequence[Sequence[tuple[int, ...]]],
                  tokenizer: Any, eps: float) -> list[TrainRow]:
    """Rows for external groups: prompts[i] is the local rendering of groups[i]'s regenerated question,
    token_ids[i] its completions as `receiver_view` gave them (the text the rewards were scored on)."""
    rows: list[TrainRow] = []
    for source, (group, prompt, ids) in enumerate(zip(groups, prompts, token_ids)):
        prompt_ids = tuple(encode_prompts(tokenizer, [prompt])[0])
        sums = claimed_logprob_sums(group)  # malformed or implausible claims: treated as absent
        for i, adv in enumerate(advantages_of(group, eps)):
            rows.append(TrainRow(prompt_ids, ids[i], adv, True, None if sums is None else sums[i], source))
    return rows


def rollout_metrics(groups: Sequence[LocalGroup]) -> tuple[dict[str, float], dict[str, float]]:
    """Training-reward and length metrics of this round's own generation -> (metrics, per specialty).
    Each key is an entry of engine/metrics.py (what it means, whether it is stored and drawn)."""
    rewards = [r for lg in groups for r in (lg.group.rewards or ())]
    lengths = [len(c.token_ids) for lg in groups for c in lg.completions]
    if not rewards:
        return {}, {}
    zero_std = sum(1 for lg in groups if not lg.group.has_signal)
    by_spec: dict[str, list[float]] = {}
    for lg in groups:
        by_spec.setdefault(lg.group.ref.specialty, []).extend(lg.group.rewards or ())
    metrics = {
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards),
        "frac_reward_zero_std": zero_std / len(groups),
        "completion_len_mean": statistics.fmean(lengths),
        "completion_len_max": float(max(lengths)),
        "completion_clipped_ratio": sum(1 for lg in groups for c in lg.completions if c.truncated) / len(lengths),
    }
    return metrics, {s: statistics.fmean(v) for s, v in sorted(by_spec.items())}


def score_group(group: RolloutGroup, question: Any, reward_fn: Callable[[Any, str], float]) -> RolloutGroup:
    """Re-score every completion with the local verifier (a peer's rewards are never used)."""
    return group.with_rewards(tuple(float(reward_fn(question, c)) for c in group.completions))


def shape_rewards(group: RolloutGroup, format_weight: float) -> RolloutGroup:
    """The training reward: the verifier's correctness + format_weight x a well-formed answer block
    (the fading format warm-up). Unchanged when the weight is 0."""
    from engine.tasks.library import format_reward

    if format_weight <= 0 or group.rewards is None:
        return group
    return group.with_rewards(tuple(r + format_weight * format_reward(c)
                                    for r, c in zip(group.rewards, group.completions)))
