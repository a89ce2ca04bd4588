"""Supervised training of the seed model (answer-token loss), fixed steps, seeded end to end."""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.models.seed.data import Demo, build_demos
from engine.models.seed.recipe import SeedRecipe
from engine.models.seed.tokenizer import build_tokenizer

IGNORE = -100


def build_model(recipe: SeedRecipe, tokenizer: Any) -> Any:
    """A Llama-style causal LM with tied embeddings; every Linear's out_features is a multiple of 32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=recipe.hidden_size, intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers, num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_heads, max_position_embeddings=256, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        rms_norm_eps=1e-5, rope_theta=10000.0,
    )
    return LlamaForCausalLM(cfg)


def encode(tokenizer: Any, demos: list[Demo], max_len: int) -> list[tuple[list[int], int]]:
    """(token ids of prompt+completion+EOS, prompt length); over-long sequences are dropped."""
    prompts = tokenizer([d.prompt for d in demos], add_special_tokens=True)["input_ids"]
    completions = tokenizer([d.completion for d in demos], add_special_tokens=False)["input_ids"]
    out = []
    for p, c in zip(prompts, completions):
        ids = list(p) + list(c) + [tokenizer.eos_token_id]
        if len(ids) <= max_len:
            out.append((ids, len(p)))
    return out


def make_batches(seqs: list[tuple[list[int], int]], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Index batches of similar length (less padding): sort within chunks of 32 batches, shuffle."""
    order = list(range(len(seqs)))
    rng.shuffle(order)
    chunk = batch_size * 32
    batches: list[list[int]] = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start:start + chunk], key=lambda i: len(seqs[i][0]))
        batches.extend(part[i:i + batch_size] for i in range(0, len(part), batch_size))
    rng.shuffle(batches)
    return batches


def collate(seqs: list[tuple[list[int], int]], idx: list[int], pad_id: int) -> tuple[Any, Any, Any]:
    import torch

    # Widths rounded up to a multiple of 8: CPU kernels pay a large one-off cost per new shape
    # (measured: ~1.4k tok/s with free widths vs ~6k tok/s with a handful of shapes).
    width = -(-max(len(seqs[i][0]) for i in idx) // 8) * 8
    ids = torch.full((len(idx), width), pad_id, dtype=torch.long)  # [B, T]
    labels = torch.full((len(idx), width), IGNORE, dtype=torch.long)  # [B, T]; loss on completion only
    mask = torch.zeros((len(idx), width), dtype=torch.long)  # [B, T]
    for row, i in enumerate(idx):
        toks, plen = seqs[i]
        ids[row, :len(toks)] = torch.tensor(toks)
        labels[row, plen:len(toks)] = torch.tensor(toks[plen:])
        mask[row, :len(toks)] = 1
    return ids, mask, labels


def lr_at(step: int, recipe: SeedRecipe) -> float:
    """Linear warm-up then cosine decay to min_lr_ratio * lr."""
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    span = max(1, recipe.steps - recipe.warmup_steps)
    progress = min(1.0, (step - recipe.warmup_steps) / span)
    floor = recipe.min_lr_ratio
    return recipe.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(recipe: SeedRecipe, out: Path, log: Callable[[str], None] = print,
          checkpoint_every: int = 1000, log_every: int = 100) -> dict[str, Any]:
    """Build tokenizer + model, train, save to `out` (safetensors + tokenizer + recipe.json)."""
    import torch

    torch.set_num_threads(recipe.threads)  # after imports: a module setting it at import doubled threads
    torch.manual_seed(recipe.seed)
    t0 = time.time()
    demos = build_demos(recipe)
    log(f"{len(demos)} demonstrations in {time.time() - t0:.1f}s")
    corpus_rng = random.Random(recipe.seed)
    corpus = [d.prompt + d.completion for d in corpus_rng.sample(demos, min(len(demos), 40000))]
    tokenizer = build_tokenizer(corpus, recipe.vocab_size)
    seqs = encode(tokenizer, demos, recipe.max_seq_len)
    log(f"tokenizer {len(tokenizer)} tokens; {len(seqs)} sequences kept; {time.time() - t0:.1f}s")
    model = build_model(recipe, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model {n_params / 1e6:.2f}M parameters")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=recipe.lr, betas=(0.9, 0.98))
    rng = random.Random(recipe.seed + 1)
    batches: list[list[int]] = []
    model.train()
    history: list[dict[str, float]] = []
    tokens = 0
    t_train = time.time()
    run_loss, run_n = 0.0, 0
    for step in range(recipe.steps):
        if not batches:
            batches = make_batches(seqs, recipe.batch_size, rng)
        ids, mask, labels = collate(seqs, batches.pop(), tokenizer.pad_token_id)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, recipe)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()
        tokens += int(mask.sum())
        run_loss, run_n = run_loss + float(loss.detach()), run_n + 1
        if (step + 1) % log_every == 0 or step + 1 == recipe.steps:
            elapsed = time.time() - t_train
            history.append({"step": step + 1, "loss": run_loss / run_n, "elapsed_s": elapsed})
            log(f"step {step + 1}/{recipe.steps} loss {run_loss / run_n:.4f} lr {lr_at(step, recipe):.2e} "
                f"{tokens / elapsed:.0f} tok/s {elapsed:.0f}s")
            run_loss, run_n = 0.0, 0
        if checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < recipe.steps:
            save(model, tokenizer, out / "checkpoint", recipe, {"step": step + 1})
    train_s = time.time() - t_train
    info = {"parameters": n_params, "demonstrations": len(seqs), "tokens_seen": tokens,
            "train_seconds": round(train_s, 1), "total_seconds": round(time.time() - t0, 1),
            "tokens_per_second": round(tokens / train_s), "final_loss": history[-1]["loss"] if history else None,
            "epochs": round(recipe.steps * recipe.batch_size / max(1, len(seqs)), 3),
            "torch": torch.__version__, "history": history}
    save(model, tokenizer, out, recipe, info)
    return info


def save(model: Any, tokenizer: Any, out: Path, recipe: SeedRecipe, info: dict[str, Any]) -> None:
    """safetensors weights + tokenizer + generation defaults that mean true sampling (no top-k)."""
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.do_sample = True
    model.generation_config.top_k = 0
    model.generation_config.top_p = 1.0
    model.generation_config.temperature = 1.0
    model.generation_config.max_new_tokens = 48
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "recipe.json").write_text(json.dumps({"recipe": recipe.to_dict(), "training": info}, indent=1))
