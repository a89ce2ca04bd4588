"""A seeded short solo run on the shipped seed model raises held-out pass@1 (slow; needs the seed).

Deterministic for its seeds on one machine: the assertion is on a fixed seed, never on a time.
"""

from __future__ import annotations

import pytest
import torch

from engine.models.policy import load_policy
from engine.paths import SEED_MODEL_DIR
from engine.sapo.config import preset
from engine.sapo.trainer import Trainer
from engine.tasks.library import preset as mix_preset

ROUNDS = 300


@pytest.mark.slow
@pytest.mark.skipif(not (SEED_MODEL_DIR / "config.json").is_file(), reason="the seed model is not built")
def test_short_solo_run_raises_heldout_pass1() -> None:
    torch.set_num_threads(1)
    model, tok = load_policy(SEED_MODEL_DIR)
    # lr 1e-4 with a KL anchor to the seed: at 2e-4 this run's pass@8 fell 0.51 -> 0.37 in 200 rounds.
    cfg = preset("paper").replace(lr=1e-4, beta=0.04, eval_every=0, checkpoint_every=0, eval_per_specialty=64)
    trainer = Trainer(model, tok, cfg, mix_preset("rl"), None, None, seed=0)
    before = trainer.evaluate_heldout(record=False)
    for _ in range(ROUNDS):
        trainer.run_round()
    after = trainer.evaluate_heldout(record=False)
    assert trainer.policy_version > ROUNDS // 2  # most rounds had a group with signal and stepped
    # The eval's sampling noise at 64 questions x 6 specialties x 8 is sd ~0.003 (bench/learning.md).
    assert after.pass1 > before.pass1 + 0.015, (before.table(), after.table())
    assert after.passk > before.passk - 0.05  # sharpening, not collapse
