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
class PackedBatch:
    """Rows packed without padding between them: each distinct prompt once, then its completions
    back to back, each completion attending to its prompt and to itself only (a block mask), its
    positions restarting after the prompt. Several prompts' units may share one packed sequence.

    input_ids:        [S, T] packed sequences, right-padded
    position_ids:     [S, T]
    attention:        [S, 1, T, T] bool, True = may attend
    row_seq:          [B] packed sequence of each row
    predict_pos:      [B, C] position in its sequence whose logits predict completion token j
    completion_ids:   [B, C] right-padded
    completion_mask:  [B, C] float, 1 on real tokens
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention: torch.Tensor
    row_seq: torch.Tensor
    predict_pos: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor

    def to(self, device: Any) -> PackedBatch:
        return PackedBatch(*(t.to(device) for t in (self.input_ids, self.position_ids, self.attention, self.row_seq,
                                                    self.predict_pos, self.completion_ids, self.completion_mask)))


def build_packed_batch(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                       pad_id: int, max_len: int | None = None) -> PackedBatch:
    """Pack rows; rows with identical prompt ids form one unit (a GRPO group's L rows share a prompt).

    Units go first-fit, longest first, into packed sequences of at most `max_len` positions (a longer
    unit gets its own); `max_len=None` gives every unit its own sequence. Attention work grows with
    the square of a sequence's length, padding with the spread of lengths: a few hundred suits both.
    """
    if len(prompt_ids) != len(completion_ids) or not prompt_ids:
        raise ValueError("need one prompt per completion, at least one row")
    if any(len(p) == 0 for p in prompt_ids) or any(len(c) == 0 for c in completion_ids):
        raise ValueError("empty prompt or completion")
    units: dict[tuple[int, ...], list[int]] = {}  # prompt -> its rows
    for i, p in enumerate(prompt_ids):
        units.setdefault(tuple(p), []).append(i)
    sizes = {p: len(p) + sum(len(completion_ids[i]) for i in rows) for p, rows in units.items()}
    seqs, used = _first_fit(sizes, max_len)
    width, c_width, n_rows = max(used), max(len(c) for c in completion_ids), len(prompt_ids)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # [S, T]
    pos = torch.zeros((len(seqs), width), dtype=torch.long)  # [S, T]
    doc = torch.full((len(seqs), width), -1, dtype=torch.long)  # [S, T] which unit; -1 padding
    segment = torch.zeros((len(seqs), width), dtype=torch.long)  # [S, T] 0 prompt, k+1 completion k
    row_seq = torch.zeros(n_rows, dtype=torch.long)  # [B]
    predict = torch.zeros((n_rows, c_width), dtype=torch.long)  # [B, C]
    comp = torch.full((n_rows, c_width), pad_id, dtype=torch.long)  # [B, C]
    comp_mask = torch.zeros((n_rows, c_width), dtype=torch.float32)  # [B, C]
    for s, unit_prompts in enumerate(seqs):
        at = 0
        for u, prompt in enumerate(unit_prompts):
            n_p, start = len(prompt), at
            ids[s, at:at + n_p] = torch.tensor(prompt, dtype=torch.long)
            pos[s, at:at + n_p] = torch.arange(n_p)
            doc[s, at:at + n_p + sizes[prompt] - n_p] = u
            at += n_p
            for k, r in enumerate(units[prompt]):
                c = list(completion_ids[r])
                ids[s, at:at + len(c)] = torch.tensor(c, dtype=torch.long)
                pos[s, at:at + len(c)] = torch.arange(n_p, n_p + len(c))
                segment[s, at:at + len(c)] = k + 1
                row_seq[r] = s
                # token 0 is predicted by the prompt's last position, token j by the completion's token j-1
                predict[r, 0] = start + n_p - 1
                predict[r, 1:len(c)] = torch.arange(at, at + len(c) - 1)
                comp[r, :len(c)] = torch.tensor(c, dtype=torch.long)
                comp_mask[r, :len(c)] = 1.0
                at += len(c)
    return PackedBatch(ids, pos, _block_mask(doc, segment), row_seq, predict, comp, comp_mask)


def _first_fit(sizes: dict[tuple[int, ...], int],
               max_len: int | None) -> tuple[list[list[tuple[int, ...]]], list[int]]:
    """Units (prompt -> packed size) into sequences, first fit, longest first -> (each sequence's
    prompts in packing order, each sequence's used length)."""
    seqs: list[list[tuple[int, ...]]] = []
    used: list[int] = []
    for p in sorted(sizes, key=lambda q: -sizes[q]):  # stable: ties keep first-seen order
        fit = next((s for s, n in enumerate(used) if max_len is not None and n + sizes[p] <= max_len), None)
        if fit is None:
            seqs.append([p])
            used.append(sizes[p])
        else:
            seqs[fit].append(p)
            used[fit] += sizes[p]
    return seqs, used


def _block_mask(doc: torch.Tensor, segment: torch.Tensor) -> torch.Tensor:
    """doc, segment [S, T] -> attention [S, 1, T, T], True = may attend: within one unit its prompt is
    visible to all its tokens, a completion only to itself, causally."""
    width = doc.shape[1]
    causal = torch.ones((width, width), dtype=torch.bool).tril()  # [T, T]
    q_doc, k_doc = doc[:, :, None], doc[:, None, :]  # [S, T, 1], [S, 1, T]
    q_seg, k_seg = segment[:, :, None], segment[:, None, :]
    visible = (q_doc == k_doc) & (q_doc >= 0) & ((k_seg == 0) | (q_seg == k_seg))
    pad_self = (q_doc < 0) & torch.eye(width, dtype=torch.bool)[None]  # padding sees itself (no empty rows)
    return ((visible & causal[None]) | pad_self)[:, None]  # [S, 1, T, T]


def packed_token_logprobs(model: Any, batch: PackedBatch, temperature: float,
                          with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Same result as `token_logprobs` on the unpacked rows -> (logp [B, C], entropy [B, C] or None)."""
    t = temperature if temperature > 0 else 1.0
    # Only positions that predict a completion token are projected to the vocabulary: a prompt's
    # positions are as many as its completions' and the projection is ~1/5 of a small model's work.
    keep = torch.unique(batch.predict_pos)  # [K] sorted positions some row predicts from
    logits = model(input_ids=batch.input_ids, position_ids=batch.position_ids, attention_mask=batch.attention,
                   use_cache=False, logits_to_keep=keep).logits  # [S, K, V]
    picked = logits[batch.row_seq[:, None], torch.searchsorted(keep, batch.predict_pos)]  # [B, C, V]
    logp_all = torch.log_softmax(picked.float() / t, dim=-1)  # [B, C, V]
    logp = torch.gather(logp_all, 2, batch.completion_ids[:, :, None]).squeeze(-1) * batch.completion_mask
    entropy = None
    if with_entropy:
        with torch.no_grad():  # a metric, never differentiated
            entropy = -(logp_all.exp() * logp_all).sum(-1) * batch.completion_mask  # [B, C]
    return logp, entropy
