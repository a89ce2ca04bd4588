"""Seed-model recipe, tokenizer and trainer on a tiny configuration (fast, real torch)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from engine.models.seed.recipe import SeedRecipe

TINY = SeedRecipe(vocab_size=320, hidden_size=64, num_layers=1, num_heads=2, intermediate_size=128,
                  steps=40, batch_size=8, warmup_steps=5, threads=1, heldout_n=2, lr=3e-3)


@pytest.mark.parametrize("change", [
    {"hidden_size": 250}, {"intermediate_size": 100}, {"vocab_size": 1000}, {"vocab_size": 256},
    {"num_heads": 5}, {"steps": 0}, {"lr": 0.0}, {"grad_clip": 0.0}, {"weights": {"bf": -1.0}},
    {"weights": {}}, {"min_lr_ratio": 2.0},
])
def test_recipe_validation(change: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(SeedRecipe(), **change)


def test_every_linear_output_is_a_multiple_of_32() -> None:
    import torch

    from engine.models.seed.tokenizer import build_tokenizer
    from engine.models.seed.train import build_model

    recipe = SeedRecipe()
    tok = build_tokenizer(["calc 1 + 2\n<answer>3</answer>"] * 10, recipe.vocab_size)
    # The real tokenizer fills the vocabulary; pad this toy one to the recipe's size for the check.
    tok.add_tokens([f"<extra{i}>" for i in range(recipe.vocab_size - len(tok))])
    model = build_model(recipe, tok)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.out_features % 32 == 0 for m in linears)


def test_tokenizer_splits_digits_and_round_trips_offline(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from engine.models.seed.tokenizer import build_tokenizer

    texts = [f"calc {a} * {b}\n<answer>{a * b}</answer>" for a in range(60) for b in range(20)]
    tok = build_tokenizer(texts, 400)
    ids = tok("1234 ∧ ¬P", add_special_tokens=False)["input_ids"]
    assert [tok.decode([i]) for i in ids[:4]] == ["1", "2", "3", "4"]
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = "dist 01/11\n<answer>0 1\n1 2</answer> Saturday ∨ ¬Q"
    assert again.decode(again(text)["input_ids"]) == text
    assert again("<answer>", add_special_tokens=False)["input_ids"] == tok("<answer>", add_special_tokens=False)["input_ids"]
    assert again.eos_token == "<|endoftext|>" and again.pad_token_id != again.eos_token_id


def test_tiny_training_learns_and_is_reproducible(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from engine.models.seed.train import train

    info_a = train(TINY, tmp_path / "a", log=lambda _: None, checkpoint_every=0, log_every=10)
    info_b = train(TINY, tmp_path / "b", log=lambda _: None, checkpoint_every=0, log_every=10)
    a = load_file(tmp_path / "a" / "model.safetensors")
    b = load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert info_a["final_loss"] == info_b["final_loss"]
    hist = info_a["history"]
    assert len(hist) == 4 and hist[-1]["loss"] < 0.8 * hist[0]["loss"]
    saved = json.loads((tmp_path / "a" / "recipe.json").read_text())
    assert saved["recipe"]["steps"] == TINY.steps
    other = train(dataclasses.replace(TINY, seed=TINY.seed + 1), tmp_path / "c", log=lambda _: None,
                  checkpoint_every=0, log_every=10)
    assert other["final_loss"] != info_a["final_loss"]
