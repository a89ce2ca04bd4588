"""MODEL_CARD.md and eval.json for the shipped seed model, generated from measurements."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.models.seed.data import DEDUPE_EXEMPT

EVAL_FILE = "eval.json"
CARD_FILE = "MODEL_CARD.md"


def _table(result: dict[str, Any]) -> list[str]:
    k = result["k"]
    lines = [f"| specialty | n | greedy | pass@1 (T=1) | pass@{k} | pass@{k} − pass@1 | mixed groups | malformed | note |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name in sorted(result["per_specialty"]):
        r = result["per_specialty"][name]
        note = "**headroom**" if r["headroom"] else ("gameable" if r["gameable"] else "")
        lines.append(f"| {name} | {r['n']} | {r['greedy']:.3f} | {r['pass1']:.3f} | {r['passk']:.3f} | "
                     f"{r['gap']:.3f} | {r['mixed']:.3f} | {r['malformed']:.3f} | {note} |")
    o = result["overall"]
    lines.append(f"| **overall** | | {o['greedy']:.3f} | {o['pass1']:.3f} | {o['passk']:.3f} | "
                 f"{o['passk'] - o['pass1']:.3f} | {o['mixed']:.3f} | {o['malformed']:.3f} | |")
    return lines


def write_card(model_dir: Path, evals: dict[str, dict[str, Any]], notes: list[str] | None = None) -> None:
    """Write eval.json (the numbers) and MODEL_CARD.md (recipe, size, time, tables) into model_dir."""
    saved = json.loads((model_dir / "recipe.json").read_text())
    recipe, info = saved["recipe"], saved["training"]
    weights = model_dir / "model.safetensors"
    size_mb = weights.stat().st_size / 1e6
    (model_dir / EVAL_FILE).write_text(json.dumps(evals, indent=1) + "\n")
    easy = evals["seed-easy"]
    lines = [*_intro(), *_model(recipe, info, size_mb), *_prompt_format(), *_training(recipe, info),
             *_solve_rates(easy)]
    if "rl" in evals:
        rl = evals["rl"]
        lines += [f"## The `rl` mix (held-out seed {rl['heldout_seed']}, {rl['n_per_specialty']} per specialty)",
                  "", *_table(rl), ""]
    lines += _room_to_learn(easy, notes or [])
    (model_dir / CARD_FILE).write_text("\n".join(lines))


def _intro() -> list[str]:
    return [
        "# SAPO seed model",
        "",
        "A tiny Llama-style causal LM trained **from scratch** on this repository's ReasoningGym demonstrations,",
        "so SAPO Swarm has a policy to post-train on machines without the Hugging Face hub. No external weights",
        "or data: everything here is generated and trained by `sapo seed-model train`. License: Apache-2.0.",
        "",
        "## Reproduce",
        "```",
        "sapo seed-model train --out resources/models/seed   # seeded; same weights on the same machine/torch",
        "sapo seed-model card --model resources/models/seed   # re-runs the evals below, rewrites this card",
        "sapo seed-model eval                                 # prints the seed-easy table below (--json)",
        "```",
        "",
    ]


def _model(recipe: dict[str, Any], info: dict[str, Any], size_mb: float) -> list[str]:
    return [
        "## Model",
        f"- LlamaForCausalLM, {info['parameters'] / 1e6:.2f} M parameters, {size_mb:.1f} MB float32 safetensors.",
        (f"- hidden {recipe['hidden_size']}, {recipe['num_layers']} layers, {recipe['num_heads']} heads, SwiGLU "
         f"{recipe['intermediate_size']}, tied embeddings, RoPE; every Linear's out_features is a multiple of 32 "
         "(bitsandbytes CPU 4-bit/QLoRA)."),
        (f"- Byte-level BPE tokenizer, {recipe['vocab_size']} tokens, one digit per token, EOS `<|endoftext|>`, "
         "PAD `<|pad|>`; no BOS."),
        "- Loads offline with plain `AutoModelForCausalLM.from_pretrained(dir)` / `AutoTokenizer`.",
        "- `generation_config.json` sets true T=1 sampling (top_k=0, top_p=1).",
        "",
    ]


def _prompt_format() -> list[str]:
    return [
        "## Prompt format (the seed's own *compact* style)",
        "A short prompt built from the ReasoningGym item's metadata, a newline, then the completion:",
        "a tiny scratchpad where one helps (base_conversion writes the decimal value first) and",
        "`<answer>…</answer>`. Examples: `calc -66 * -48` → `<answer>3168</answer>`; `base 10>8 13` →",
        "`13 <answer>15</answer>`; `dist 01/11` → `<answer>0 1\\n1 2</answer>`; `day Fri +71` →",
        "`<answer>Saturday</answer>`. Question hashes always cover ReasoningGym's own text",
        "(`engine.tasks.render_prompt(q, \"compact\")`).",
        "",
    ]


def _training(recipe: dict[str, Any], info: dict[str, Any]) -> list[str]:
    return [
        "## Training recipe",
        (f"- Data: {info['demonstrations']:,} fresh demonstrations from the `{recipe['mix']}` mix (dataset seed "
         f"{recipe['seed']}), shares {json.dumps(recipe['weights'])}; {info['epochs']} epoch(s)."),
        (f"- The held-out judge set's question texts (`heldout(seed-easy, {recipe['heldout_n']}, "
         f"{recipe['heldout_seed']})`) are excluded from training, except for {', '.join(DEDUPE_EXEMPT)} "
         "whose easy spaces hold only a few hundred items (their held-out numbers partly measure recall)."),
        (f"- Loss on completion tokens only; AdamW lr {recipe['lr']} (β 0.9/0.98, wd {recipe['weight_decay']}), "
         f"{recipe['warmup_steps']} warm-up steps, cosine to {recipe['min_lr_ratio']}×; batch {recipe['batch_size']}"
         f" sequences, {recipe['steps']} steps, grad clip {recipe['grad_clip']}, seed {recipe['seed']}."),
        (f"- Time: {info['train_seconds'] / 60:.1f} min of optimisation ({info['total_seconds'] / 60:.1f} min in "
         f"all) on 2 CPU cores, {info['tokens_per_second']:,} tokens/s, {info['tokens_seen']:,} tokens; final "
         f"answer-token loss {info['final_loss']:.4f}; torch {info['torch']}."),
        "",
    ]


def _solve_rates(easy: dict[str, Any]) -> list[str]:
    return [
        (f"## Solve rates on the `seed-easy` mix (held-out seed {easy['heldout_seed']}, "
         f"{easy['n_per_specialty']} questions per specialty)"),
        (f"greedy = T=0; pass@1 = mean solve rate over {easy['k']} samples at T=1 (no top-k/top-p); "
         f"pass@{easy['k']} = any of {easy['k']} solved; mixed = groups with both solved and unsolved samples "
         f"(GRPO signal). Sampling seed {easy['seed']}. Binary reward (RG score ≥ 1)."),
        "",
        *_table(easy),
        "",
    ]


def _room_to_learn(easy: dict[str, Any], notes: list[str]) -> list[str]:
    return [
        "## Room to learn, and what a scorer lets through",
        "**headroom** marks specialties with pass@8 − pass@1 ≥ 0.15 and ≥ 30% mixed groups whose scorer a",
        ("constant or generic answer cannot satisfy. Seed-easy headroom specialties: "
         f"{', '.join(easy['headroom_specialties']) or 'none'}."),
        "- *gameable*: `propositional_logic` (RG credits any valid conclusion, e.g. the conjunction of the",
        "  premises) and `calendar_arithmetic`'s `is_leap_year` (~76% by always answering \"No\").",
        "- The `rl` preset (engine/tasks/library.py) therefore drops propositional_logic, keeps only",
        "  calendar's weekday_offset task, uses binary_matrix n=3 only (n=2 is solved), and drops bf and",
        "  arc_1d (the seed cannot sample a right answer: no RL signal).",
        "- binary_matrix: RG's own scorer runs `eval()` on the answer; ours scores exact matches only.",
        *notes,
        "",
    ]
