"""The shipped seed model: loads offline, stays small and QLoRA-friendly, and reproduces its card."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from engine.paths import SEED_MODEL_DIR
from engine.tasks import SPECIALTIES

REPO = Path(__file__).resolve().parents[2]


def test_files_size_and_card() -> None:
    weights = SEED_MODEL_DIR / "model.safetensors"
    assert weights.is_file() and weights.stat().st_size <= 20 * 1024 * 1024
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                 "recipe.json", "eval.json", "MODEL_CARD.md"):
        assert (SEED_MODEL_DIR / name).is_file(), name
    card = (SEED_MODEL_DIR / "MODEL_CARD.md").read_text()
    for specialty in SPECIALTIES:
        assert specialty in card
    cfg = json.loads((SEED_MODEL_DIR / "config.json").read_text())
    for key in ("hidden_size", "intermediate_size", "vocab_size"):
        assert cfg[key] % 32 == 0, key  # bitsandbytes CPU 4-bit needs it


def test_loads_and_answers_offline_in_a_fresh_process() -> None:
    code = (
        "import torch\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"d = {str(SEED_MODEL_DIR)!r}\n"
        "tok = AutoTokenizer.from_pretrained(d, local_files_only=True)\n"
        "model = AutoModelForCausalLM.from_pretrained(d, local_files_only=True)\n"
        "lin = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]\n"
        "assert all(m.out_features % 32 == 0 for m in lin)\n"
        "ids = tok('calc 2 + 3\\n', return_tensors='pt').input_ids\n"
        "out = model.generate(ids, max_new_tokens=12, do_sample=False)\n"
        "print(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": "/nonexistent-hf-home"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "<answer>" in proc.stdout and "</answer>" in proc.stdout


def test_eval_on_a_small_fixed_sample_reproduces_the_card() -> None:
    from engine.cli.seed_model import run_eval

    card = json.loads((SEED_MODEL_DIR / "eval.json").read_text())["seed-easy"]
    n = 16
    small = run_eval(SEED_MODEL_DIR, "seed-easy", n=n, k=8, heldout_seed=card["heldout_seed"],
                     seed=card["seed"], threads=2)
    pooled_small, pooled_card = small["overall"]["pass1"], card["overall"]["pass1"]
    # The small sample is the first n questions of the card's held-out set: question-level sampling
    # error dominates; 3 standard errors (+ a little for the k=8 sampling noise).
    se = math.sqrt(max(pooled_card * (1 - pooled_card), 0.02) / (n * len(SPECIALTIES)))
    assert abs(pooled_small - pooled_card) <= 3 * se + 0.02, (pooled_small, pooled_card)
    for name, row in card["per_specialty"].items():
        got = small["per_specialty"][name]
        for key in ("pass1", "greedy", "passk"):
            p = row[key]
            tol = 3 * math.sqrt(max(p * (1 - p), 0.02) / n) + 0.03
            assert abs(got[key] - p) <= tol, (name, key, got[key], p)
