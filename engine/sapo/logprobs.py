"""Per-token log-probs of completions under a policy, in one padded forward pass.

Same convention as `engine.models.generate`: log_softmax(logits / T)[token] over the full vocabulary,
T the sampling temperature (T = 0 is treated as 1). So on the first pass over freshly generated
groups the recomputed log-probs equal the generation ones up to float noise, and the PPO ratio is 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TokenBatch:
    """prompt + completion rows, right-padded.

    input_ids:        [B, T] prompt then completion tokens, then padding
    attention_mask:   [B, T] 1 on real tokens
    completion_ids:   [B, C] completion tokens, right-padded (C = longest completion)
    completion_mask:  [B, C] 1 on real completion tokens
    prompt_lengths:   [B]
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    prompt_lengths: torch.Tensor

    def to(self, device: Any) -> TokenBatch:
        return TokenBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.completion_ids,
                                                   self.completion_mask, self.prompt_lengths)))


def build_batch(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                pad_id: int) -> TokenBatch:
    """Pack rows of (prompt, completion) token ids into a TokenBatch."""
    if len(prompt_ids) != len(completion_ids) or not prompt_ids:
        raise ValueError("need one prompt per completion, at least one row")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("empty prompt")
    rows = len(prompt_ids)
    width = max(len(p) + len(c) for p, c in zip(prompt_ids, completion_ids))
    c_width = max(1, max(len(c) for c in completion_ids))
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    comp = torch.full((rows, c_width), pad_id, dtype=torch.long)
    comp_mask = torch.zeros((rows, c_width), dtype=torch.float32)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        seq = list(p) + list(c)
        input_ids[i, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[i, :len(seq)] = 1
        if c:
            comp[i, :len(c)] = torch.tensor(list(c), dtype=torch.long)
            comp_mask[i, :len(c)] = 1.0
    lengths = torch.tensor([len(p) for p in prompt_ids], dtype=torch.long)
    return TokenBatch(input_ids, attention, comp, comp_mask, lengths)


def token_logprobs(model: Any, batch: TokenBatch, temperature: float,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """-> (logp [B, C], entropy [B, C] or None); zeros where completion_mask is 0.

    Differentiable (call under torch.no_grad() for old/reference log-probs). Only the positions from the
    shortest prompt on are projected to the vocabulary, to keep [B, T, V] small for large vocabularies.
    """
    t = temperature if temperature > 0 else 1.0
    first = int(batch.prompt_lengths.min().item()) - 1  # first position whose logits predict a completion token
    width = batch.input_ids.shape[1]
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False,
                logits_to_keep=width - first)
    logits = out.logits  # [B, width - first, V]: positions first .. width-1
    c_width = batch.completion_ids.shape[1]
    # Row b, completion token j is predicted at sequence position prompt_len_b - 1 + j.
    pos = (batch.prompt_lengths[:, None] - 1 - first) + torch.arange(c_width, device=logits.device)[None, :]
    pos = pos.clamp(max=logits.shape[1] - 1)  # [B, C]; padding positions clamp and are masked below
    picked = torch.gather(logits, 1, pos[:, :, None].expand(-1, -1, logits.shape[-1]))  # [B, C, V]
    logp_all = torch.log_softmax(picked.float() / t, dim=-1)  # [B, C, V]
    logp = torch.gather(logp_all, 2, batch.completion_ids[:, :, None]).squeeze(-1)  # [B, C]
    logp = logp * batch.completion_mask
    entropy = None
    if with_entropy:
        with torch.no_grad():  # a metric, never differentiated
            entropy = -(logp_all.exp() * logp_all).sum(-1) * batch.completion_mask  # [B, C]
    return logp, entropy


@dataclass(frozen=True)
class PrefixBatch:
    """Rows that share prompts: each distinct prompt is run once, its KV cache gathered per row.

    prompt_ids:       [P, Tp] distinct prompts, left-padded
    prompt_mask:      [P, Tp]
    row_prompt:       [B] index into the prompts for each row
    completion_ids:   [B, C] right-padded
    completion_mask:  [B, C] float, 1 on real tokens
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    row_prompt: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor

    def to(self, device: Any) -> PrefixBatch:
        return PrefixBatch(*(t.to(device) for t in (self.prompt_ids, self.prompt_mask, self.row_prompt,
                                                    self.completion_ids, self.completion_mask)))


def build_prefix_batch(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                       pad_id: int) -> PrefixBatch:
    """Pack rows, deduplicating identical prompts (a GRPO group's L rows share one)."""
    if len(prompt_ids) != len(completion_ids) or not prompt_ids:
        raise ValueError("need one prompt per completion, at least one row")
    if any(len(p) == 0 for p in prompt_ids) or any(len(c) == 0 for c in completion_ids):
        raise ValueError("empty prompt or completion")
    index: dict[tuple[int, ...], int] = {}
    row_prompt = [index.setdefault(tuple(p), len(index)) for p in prompt_ids]
    distinct = list(index)
    width = max(len(p) for p in distinct)
    p_ids = torch.full((len(distinct), width), pad_id, dtype=torch.long)
    p_mask = torch.zeros((len(distinct), width), dtype=torch.long)
    for i, p in enumerate(distinct):
        p_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        p_mask[i, width - len(p):] = 1
    c_width = max(len(c) for c in completion_ids)
    comp = torch.full((len(completion_ids), c_width), pad_id, dtype=torch.long)
    comp_mask = torch.zeros((len(completion_ids), c_width), dtype=torch.float32)
    for i, c in enumerate(completion_ids):
        comp[i, :len(c)] = torch.tensor(list(c), dtype=torch.long)
        comp_mask[i, :len(c)] = 1.0
    return PrefixBatch(p_ids, p_mask, torch.tensor(row_prompt, dtype=torch.long), comp, comp_mask)


def prefix_token_logprobs(model: Any, batch: PrefixBatch, temperature: float,
                          with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Same result as `token_logprobs` on the unshared rows, with each prompt computed once.

    The prompt pass keeps its KV cache *with* gradients; gathering it per row and running the
    completions against it lets backward flow into the shared prompt positions, so the gradient is
    the same as with per-row prompts, at a fraction of the prompt compute.
    -> (logp [B, C], entropy [B, C] or None), zeros where completion_mask is 0.
    """
    from transformers import DynamicCache

    t = temperature if temperature > 0 else 1.0
    p_pos = (batch.prompt_mask.cumsum(-1) - 1).clamp(min=0)  # [P, Tp]
    cache = DynamicCache()
    out = model(input_ids=batch.prompt_ids, attention_mask=batch.prompt_mask, position_ids=p_pos,
                cache=cache, use_cache=True, logits_to_keep=1)
    first = out.logits[batch.row_prompt]  # [B, 1, V]: predicts each row's first completion token
    c_width = batch.completion_ids.shape[1]
    if c_width > 1:
        cache.batch_select_indices(batch.row_prompt)  # [P, ...] -> [B, ...], differentiable gather
        inputs = batch.completion_ids[:, :-1]  # [B, C-1]: token j predicts token j+1
        mask = torch.cat([batch.prompt_mask[batch.row_prompt], batch.completion_mask[:, :-1].long()], dim=-1)
        start = batch.prompt_mask.sum(-1)[batch.row_prompt]  # [B] first completion position
        pos = start[:, None] + torch.arange(c_width - 1, device=start.device)[None, :]
        rest = model(input_ids=inputs, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True).logits
        logits = torch.cat([first, rest], dim=1)  # [B, C, V]
    else:
        logits = first
    logp_all = torch.log_softmax(logits.float() / t, dim=-1)  # [B, C, V]
    logp = torch.gather(logp_all, 2, batch.completion_ids[:, :, None]).squeeze(-1) * batch.completion_mask
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1) * batch.completion_mask  # [B, C]
    return logp, entropy
