"""Adaptive J: the discounted UCB on hand-made gains, its state, and the trainer choosing J with it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.sapo.adaptive_j import AdaptiveJConfig, JBandit, j_arms, ucb_choice


def test_arms_are_none_half_all() -> None:
    assert j_arms(4) == (0, 2, 4) and j_arms(1) == (0, 1) and j_arms(3) == (0, 2, 3)


def test_ucb_plays_unplayed_arms_first_then_the_best_mean_plus_bonus() -> None:
    rng = random.Random(0)
    assert ucb_choice([1.0, 0.0, 1.0], [0.5, 0.0, 0.9], 0.1, rng) == 1
    assert ucb_choice([10.0, 10.0, 10.0], [1.0, 5.0, 2.0], 0.1, rng) == 1  # mean 0.5 beats 0.1 and 0.2
    # a rarely played arm's bonus can outweigh a slightly better mean
    assert ucb_choice([100.0, 1.0], [30.0, 0.2], 1.0, rng) == 1


def _run(bandit: JBandit, gain_of: dict[int, float], rounds: int, rng: random.Random) -> list[int]:
    """Own reward follows the J played last round: a baseline of 0.3 plus that arm's gain, plus noise."""
    chosen, reward = [], 0.3
    for _ in range(rounds):
        bandit.observe(reward)
        j = bandit.choose()
        chosen.append(j)
        reward = 0.3 + gain_of[j] + rng.gauss(0, 0.02)
    return chosen


def test_the_helpful_j_wins_and_a_swarm_turning_bad_is_followed() -> None:
    rng = random.Random(1)
    bandit = JBandit(AdaptiveJConfig(enabled=True), 4, random.Random(2))
    first = _run(bandit, {0: 0.0, 2: 0.05, 4: 0.1}, 300, rng)
    assert first[-100:].count(4) > 70  # peers help: take all four
    later = _run(bandit, {0: 0.0, 2: -0.05, 4: -0.1}, 300, rng)  # now they hurt (poisoned, useless)
    assert later[-100:].count(0) > 70  # discounting forgets the old evidence


def test_state_round_trips_and_bad_states_start_afresh() -> None:
    bandit = JBandit(AdaptiveJConfig(enabled=True), 4, random.Random(0))
    _run(bandit, {0: 0.0, 2: 0.1, 4: 0.0}, 20, random.Random(3))
    again = JBandit(AdaptiveJConfig(enabled=True), 4, random.Random(0))
    again.load_state(bandit.state_dict())
    assert again.state_dict() == bandit.state_dict()
    for bad in (None, {"arms": [0, 1]}, {**bandit.state_dict(), "plays": [1.0, -1.0, 2.0]},
                {**bandit.state_dict(), "gains": [float("nan"), 0.0, 0.0]}, {**bandit.state_dict(), "plays": "x"}):
        fresh = JBandit(AdaptiveJConfig(enabled=True), 4, random.Random(0))
        fresh.load_state(bad)
        assert fresh.plays == [0.0, 0.0, 0.0] and fresh.pending is None


@pytest.mark.parametrize("bad", [{"discount": 0.2}, {"exploration": -1}, {"baseline_rate": 0},
                                 {"enabled": "yes"}, {"discount": float("nan")}])
def test_config_is_validated(bad: dict) -> None:
    with pytest.raises(ValueError, match="adaptive_j"):
        AdaptiveJConfig(**bad)


def test_the_trainer_chooses_j_among_the_arms_and_resumes_the_bandit(tmp_path: Path) -> None:
    from engine.models.generate import SampleConfig
    from engine.models.policy import build_tiny_policy, load_policy
    from engine.sapo.config import SapoConfig
    from engine.sapo.trainer import Trainer
    from engine.tasks.library import preset

    model, tok = load_policy(build_tiny_policy(tmp_path / "m"))
    cfg = SapoConfig(num_local=1, num_external=4, completions=2, sampling=SampleConfig(max_new_tokens=8),
                     eval_every=0, checkpoint_every=1, adaptive_j=AdaptiveJConfig(enabled=True))
    trainer = Trainer(model, tok, cfg, preset("rl"), None, tmp_path / "ckpt", 5)
    chosen = [trainer.run_round().metrics["external_j"] for _ in range(4)]
    assert set(chosen) <= {0.0, 2.0, 4.0} and len(set(chosen[:3])) == 3  # each arm tried once first
    assert trainer.j_bandit is not None
    state = trainer.j_bandit.state_dict()
    model2, tok2 = load_policy(build_tiny_policy(tmp_path / "m"))
    resumed = Trainer(model2, tok2, cfg, preset("rl"), None, tmp_path / "ckpt", 5)
    from engine.checkpoint import latest_checkpoint

    resumed.load(latest_checkpoint(tmp_path / "ckpt"))
    assert resumed.j_bandit is not None and resumed.j_bandit.state_dict() == state
    assert SapoConfig.from_dict(cfg.to_dict()).adaptive_j == cfg.adaptive_j


def test_experiment_arms_name_the_adaptive_j_and_refuse_it_without_peers() -> None:
    from lab.experiment.agents import sapo_config
    from lab.experiment.config import ArmConfig, preset

    arm = ArmConfig(adaptive_j=True)
    assert arm.label == "4/4 positive-only+adaptive-J" and "adaptive-J" in arm.name
    assert sapo_config(arm).adaptive_j.enabled and not sapo_config(ArmConfig()).adaptive_j.enabled
    with pytest.raises(ValueError, match="adaptive_j"):
        ArmConfig(local=8, external=0, adaptive_j=True)
    names = [a.name for a in preset("adaptive-j").arms]
    assert len(names) == len(set(names)) == 30
