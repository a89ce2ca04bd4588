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
