"""Batched sampling with a KV cache, returning the log-probs RL needs.

Why not `model.generate`: it silently applies the checkpoint's generation config (e.g. top_k=50),
and it does not hand back the per-token log-probs of the policy in the form the trainer recomputes.
This loop does true temperature sampling (top_k=0 and top_p=1 mean *off*), prefills each distinct
prompt once and repeats its cache n times, and drops finished rows from the batch as they stop.

Log-probs convention (what `Completion.logprobs` holds, and what the trainer recomputes):
    logprob_t = log_softmax(logits_t / T)[token_t]
i.e. the tempered policy over the *full* vocabulary, before any top-k / top-p truncation. With
top_k=0 and top_p=1 (the RL default) that is exactly the distribution the token was drawn from; with
truncation it is still the policy the loss optimises, so a first PPO pass starts at ratio 1.
With temperature 0 (greedy) the log-probs are those of log_softmax(logits).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.machine.governor import safe_point

MAX_BATCH_ROWS = 4096  # prompts x n in one call: a guard against accidental huge batches


@dataclass(frozen=True)
class SampleConfig:
    """How completions are sampled."""

    temperature: float = 1.0  # softmax temperature; 0 means greedy (argmax)
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]; 1 keeps the full distribution
    top_k: int = 0  # keep the k most likely tokens; 0 turns it off
    max_new_tokens: int = 48  # hard cap on completion length (a completion that hits it is `truncated`)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0.0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or not 1 <= self.max_new_tokens <= 65536:
            raise ValueError(f"max_new_tokens must be an int in [1, 65536], got {self.max_new_tokens!r}")


@dataclass(frozen=True)
class Completion:
    """One sampled completion.

    token_ids include the EOS token when the model stopped (it is part of what the policy chose and
    what the loss trains); `text` is the decoded completion without special tokens.
    logprobs: one per token id, see the module docstring for the convention.
    truncated: the completion hit max_new_tokens without emitting EOS.
    """

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    truncated: bool


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every token id that ends a completion: the tokenizer's EOS and the model config's."""
    ids: set[int] = set()
    for source in (getattr(tokenizer, "eos_token_id", None),
                   getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                   getattr(getattr(model, "config", None), "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    return ids


def encode_prompts(tokenizer: Any, prompts: Sequence[str]) -> list[list[int]]:
    """Prompt token ids exactly as generation sees them (the tokenizer's own special tokens)."""
    return [list(tokenizer(p, add_special_tokens=True)["input_ids"]) for p in prompts]


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token rows -> (input_ids [B, T], attention_mask [B, T])."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row):] = torch.tensor(list(row), dtype=torch.long)
            mask[i, width - len(row):] = 1
    return ids, mask


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits [B, V] outside top-k and the top-p nucleus with -inf (the first token always stays)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs  # [B, V]: mass of strictly more likely tokens
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def _pad_id(tokenizer: Any, eos: set[int]) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    if isinstance(pad, int):
        return pad
    return min(eos) if eos else 0


def generate(model: Any, tokenizer: Any, prompts: list[str], n: int, cfg: SampleConfig,
             seed: int | None = None) -> list[list[Completion]]:
    """Sample n completions for each prompt in one batch -> result[prompt_index][sample_index].

    Deterministic for a given seed on a given machine (a private torch.Generator, not the global RNG).
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    if not prompts:
        return []
    if len(prompts) * n > MAX_BATCH_ROWS:
        raise ValueError(f"{len(prompts)} prompts x {n} samples exceeds {MAX_BATCH_ROWS} rows")
    from transformers import DynamicCache

    device = next(model.parameters()).device
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed) if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
    eos = eos_token_ids(model, tokenizer)
    eos_tensor = torch.tensor(sorted(eos) or [-1], dtype=torch.long, device=device)
    prompt_rows = encode_prompts(tokenizer, prompts)
    if any(len(r) == 0 for r in prompt_rows):
        raise ValueError("a prompt tokenized to zero tokens")
    ids, mask = left_pad(prompt_rows, _pad_id(tokenizer, eos))
    ids, mask = ids.to(device), mask.to(device)

    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            cache = DynamicCache()
            logits, mask, next_pos = _prefill(model, cache, ids, mask, n)
            tokens, logps, stopped = _decode(model, cache, logits, mask, next_pos, cfg, gen, eos_tensor)
    finally:
        if was_training:
            model.train()
    return _completions(tokenizer, tokens, logps, stopped, len(prompts), n)


def _prefill(model: Any, cache: Any, ids: torch.Tensor, mask: torch.Tensor,
             n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefill each distinct prompt once (ids, mask [P, T], left-padded), then give every sample its own
    copy of the cache (the cache object is updated in place by each forward) -> (next-token logits
    [B, V], attention mask [B, T], next position [B]), B = P * n, prompt-major."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [P, T]: left padding shifts positions
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                cache=cache, use_cache=True, logits_to_keep=1)
    cache.batch_repeat_interleave(n)
    logits = out.logits[:, -1, :].float().repeat_interleave(n, dim=0)  # [B, V]
    next_pos = positions[:, -1].repeat_interleave(n, dim=0) + 1  # [B]
    return logits, mask.repeat_interleave(n, dim=0), next_pos


def _decode(model: Any, cache: Any, logits: torch.Tensor, mask: torch.Tensor, next_pos: torch.Tensor,
            cfg: SampleConfig, gen: torch.Generator,
            eos_tensor: torch.Tensor) -> tuple[list[list[int]], list[list[float]], list[bool]]:
    """Sample token by token until every row stopped or hit the cap -> per row (tokens, log-probs,
    stopped at EOS)."""
    rows = logits.shape[0]
    tokens: list[list[int]] = [[] for _ in range(rows)]
    logps: list[list[float]] = [[] for _ in range(rows)]
    stopped = [False] * rows
    alive = torch.arange(rows, device=mask.device)  # original row index of each batch row
    for step in range(cfg.max_new_tokens):
        token, logp = _sample(logits, cfg, gen)  # [b], [b]
        alive_list = alive.tolist()
        for j, (t, lp) in enumerate(zip(token.tolist(), logp.tolist())):
            tokens[alive_list[j]].append(t)
            logps[alive_list[j]].append(lp)
        done = torch.isin(token, eos_tensor)  # [b]
        for j in torch.nonzero(done).flatten().tolist():
            stopped[alive_list[j]] = True
        if step == cfg.max_new_tokens - 1 or bool(done.all()):
            break
        if bool(done.any()):
            # Finished rows leave the batch: later steps only pay for the ones still going.
            keep = torch.nonzero(~done).flatten()
            cache.batch_select_indices(keep)
            alive, token, mask, next_pos = alive[keep], token[keep], mask[keep], next_pos[keep]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)  # [b, T + 1]
        safe_point()  # the owner's load may have come or gone since the last step
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                    cache=cache, use_cache=True)
        logits = out.logits[:, -1, :].float()  # [b, V]
        next_pos = next_pos + 1
    return tokens, logps, stopped


def _completions(tokenizer: Any, tokens: list[list[int]], logps: list[list[float]], stopped: list[bool],
                 prompts: int, n: int) -> list[list[Completion]]:
    """Prompt-major rows -> result[prompt_index][sample_index]; the text leaves out the EOS token."""
    result: list[list[Completion]] = []
    for p in range(prompts):
        group = []
        for s in range(n):
            r = p * n + s
            body = tokens[r][:-1] if stopped[r] else tokens[r]
            text = tokenizer.decode(body, skip_special_tokens=True)
            group.append(Completion(text=text, token_ids=tuple(tokens[r]), logprobs=tuple(logps[r]),
                                    truncated=not stopped[r]))
        result.append(group)
    return result


def _sample(logits: torch.Tensor, cfg: SampleConfig, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One sampling step: logits [B, V] -> (token [B], logprob [B]) per the module's convention."""
    if cfg.temperature == 0.0:
        logprobs = torch.log_softmax(logits, dim=-1)
        token = torch.argmax(logits, dim=-1)
    else:
        scaled = logits / cfg.temperature
        logprobs = torch.log_softmax(scaled, dim=-1)  # [B, V] the tempered policy, untruncated
        probs = torch.softmax(filter_logits(scaled, cfg.top_k, cfg.top_p), dim=-1)
        token = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
    return token, logprobs.gather(-1, token[:, None]).squeeze(-1)
