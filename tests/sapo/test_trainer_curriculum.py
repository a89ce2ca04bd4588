"""The trainer with the curriculum and the format warm-up: rungs move, are stored, and survive a resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.events import RoundCompleted
from engine.models.generate import SampleConfig
from engine.models.policy import build_tiny_policy, load_policy
from engine.sapo.config import SapoConfig, preset
from engine.sapo.trainer import Trainer
from engine.store import Store
from engine.tasks.curriculum import LADDERS, CurriculumConfig, entry_rung, rung_of
from engine.tasks.library import preset as mix_preset


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "m", seed=11)


def solves_arithmetic(question: Any, completion: str) -> float:
    """Arithmetic is 'solved' by every completion, the rest by odd-length ones (mixed groups)."""
    return 1.0 if question.specialty == "basic_arithmetic" else float(len(completion) % 2)


CFG = SapoConfig(num_local=2, completions=4, sampling=SampleConfig(max_new_tokens=6), checkpoint_every=3,
                 eval_every=0, curriculum=CurriculumConfig(enabled=True, window=8), format_reward=0.5,
                 format_reward_rounds=4)


def _trainer(model_dir: Path, tmp: Path, events: list[Any], resume: bool = False) -> Trainer:
    model, tok = load_policy(model_dir)
    make = Trainer.resume if resume else Trainer
    return make(model, tok, CFG, mix_preset("rl"), Store(tmp / "node.db"), tmp / "ckpt", 3,
                reward_fn=solves_arithmetic, on_event=events.append)


def test_rungs_move_are_recorded_and_resume(model_dir: Path, tmp_path: Path) -> None:
    events: list[Any] = []
    trainer = _trainer(model_dir, tmp_path, events)
    results = [trainer.run_round() for _ in range(6)]
    for result in results:
        for group in result.local_groups:
            assert rung_of(group.ref.specialty, group.ref.config) is not None  # each group says its rung
    arithmetic = [g for r in results for g in r.local_groups if g.ref.specialty == "basic_arithmetic"]
    assert arithmetic, "the rl mix samples basic_arithmetic within 6 rounds of 2 questions"
    assert trainer.curriculum.rungs["basic_arithmetic"] > entry_rung("basic_arithmetic")  # always solved: it climbed
    assert all(trainer.curriculum.rungs[s] == entry_rung(s) for s in trainer.curriculum.rungs
               if s != "basic_arithmetic" and trainer.curriculum.pass_rates()[s] >= 0.25)
    rounds = trainer.store.rounds()
    assert [r["rungs"] for r in rounds][-1] == trainer.curriculum.rungs
    assert [r["format_weight"] for r in rounds][:5] == pytest.approx([0.5, 0.375, 0.25, 0.125, 0.0])
    assert all(0.0 <= r["format_rate"] <= 1.0 for r in rounds)
    completed = [e for e in events if isinstance(e, RoundCompleted)]
    assert completed[-1].rungs == trainer.curriculum.rungs
    assert all(0.0 <= r["reward_mean"] <= 1.0 for r in rounds)  # correctness only, never the bonus

    # Round 6 was checkpointed: a resumed trainer is on the same rungs with the same windows.
    again = _trainer(model_dir, tmp_path, [], resume=True)
    assert again.round == 6 and again.curriculum.state_dict() == trainer.curriculum.state_dict()
    next_ref = again.curriculum.apply(again.mix).specialties["basic_arithmetic"].config
    assert next_ref == LADDERS["basic_arithmetic"][trainer.curriculum.rungs["basic_arithmetic"]]


def test_cpu_real_preset_is_valid_and_uses_the_new_parts() -> None:
    cfg = preset("cpu-real")
    assert cfg.prompt_style == "chat-fewshot" and cfg.curriculum.enabled and cfg.format_reward > 0
    again = SapoConfig.from_dict(cfg.to_dict())
    assert again == cfg
    with pytest.raises(ValueError, match="curriculum"):
        SapoConfig.from_dict(cfg.to_dict() | {"curriculum": {"bogus": 1}})
