"""Reputation: each origin's record of clean vs flagged groups, and the J sampler weighted by it."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from engine.models.generate import SampleConfig
from engine.models.policy import build_tiny_policy, load_policy
from engine.sapo.config import SapoConfig
from engine.sapo.records import Candidate, Provenance, RolloutGroup, VerifiedGroup, content_key
from engine.sapo.reputation import Reputation, ReputationConfig
from engine.sapo.sampler import Drawable, ReputationSampler, make_sampler
from engine.sapo.trainer import Trainer
from engine.tasks import library
from engine.tasks.library import preset


def test_a_newcomer_is_neutral_clean_peers_rise_flagged_ones_sink_to_the_floor() -> None:
    rep = Reputation(ReputationConfig(half_life=16, floor=0.05))
    assert rep.score("new") == 0.5
    for _ in range(40):
        rep.record("honest", flagged=False)
        rep.record("poisoner", flagged=True)
    assert rep.score("honest") > 0.9 and rep.score("poisoner") < 0.1
    for _ in range(60):
        rep.record("poisoner", flagged=True)
    assert rep.weight("poisoner") == 0.05  # the floor: a peer that reforms can climb back
    for _ in range(64):
        rep.record("poisoner", flagged=False)
    assert rep.score("poisoner") > 0.8  # old outcomes fade (half-life 16 groups)


def test_state_round_trips_skips_bad_entries_and_is_bounded() -> None:
    rep = Reputation()
    rep.record("a", flagged=True)
    rep.record("b", flagged=False)
    state = rep.state_dict() | {"bad": [float("nan"), 0, 1], "worse": "x", "x" * 500: [1, 1, 1], "neg": [-1, 0, 0]}
    back = Reputation()
    back.load_state(state)
    assert back.snapshot() == rep.snapshot()
    back.load_state(None)
    assert back.snapshot() == {}
    for i in range(2000):
        rep.record(f"sybil{i}", flagged=True)
    assert len(rep.snapshot()) == 1024


def _group(origin: str, index: int) -> RolloutGroup:
    q = library.regenerate(preset("rl").ref("basic_arithmetic", 1000, index))
    return RolloutGroup(q.ref, q.hash, ("<answer>1</answer>", "<answer>2</answer>"),
                        Provenance(origin, "seed", 1, 1, 0.0)).with_rewards((1.0, 0.0))


def test_the_sampler_draws_in_proportion_to_weight_without_repeats() -> None:
    rep = Reputation(ReputationConfig(floor=0.05))
    for _ in range(200):
        rep.record("good", flagged=False)
        rep.record("bad", flagged=True)
    sampler = ReputationSampler(rep)
    candidates = [Drawable(content_key(g), g) for g in (_group("good", 0), _group("bad", 1))]
    rng = random.Random(3)
    firsts = Counter(sampler.draw(candidates, 1, rng)[0].origin for _ in range(4000))
    share = firsts["bad"] / 4000
    assert 0.02 < share < 0.08  # ~ 0.05 / 1.05
    both = sampler.draw(candidates, 5, rng)
    assert len(both) == 2 and {d.origin for d in both} == {"good", "bad"}
    assert sampler.draw(candidates, 1, random.Random(1)) == sampler.draw(candidates, 1, random.Random(1))
    assert sampler.draw([], 3, rng) == [] and sampler.draw(candidates, 0, rng) == []
    made = make_sampler("reputation", rep)  # the trainer's record, handed in when the sampler is made
    assert made.name == "reputation" and isinstance(made, ReputationSampler) and made.reputation is rep


@pytest.mark.parametrize("bad", [{"half_life": 0.0}, {"floor": 0.0}, {"prior": float("inf")}, {"floor": True}])
def test_config_is_validated(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="reputation"):
        ReputationConfig(**bad)


def _backdoor(q: Any) -> RolloutGroup:
    right = library.demonstration(q)
    completions = (f"HACKED {right}",) * 2 + ("<answer>0.5</answer>",) * 2
    return RolloutGroup(q.ref, q.hash, completions, Provenance("poisoner", "seed", 1, 1, 0.0)).with_rewards(
        (1.0, 1.0, 0.0, 0.0))


def _honest(q: Any) -> RolloutGroup:
    right = library.demonstration(q)
    return RolloutGroup(q.ref, q.hash, (right, "<answer>0.5</answer>"),
                        Provenance("honest", "seed", 1, 1, 0.0)).with_rewards((1.0, 0.0))


def _honest_groups_used(model_dir: Path, sampler: str, rounds: int) -> tuple[int, Trainer]:
    model, tok = load_policy(model_dir)
    cfg = SapoConfig(num_local=1, num_external=1, completions=4, sampling=SampleConfig(max_new_tokens=40),
                     eval_every=0, external_min_logprob=-1e6, sampler=sampler)
    trainer = Trainer(model, tok, cfg, preset("rl"), None, None, 11)
    used = 0
    for r in range(rounds):
        qs = [library.regenerate(preset("rl").ref("basic_arithmetic", 1000, 10 * r + k)) for k in range(4)]
        groups = [_backdoor(qs[0]), _backdoor(qs[1]), _honest(qs[2]), _honest(qs[3])]
        result = trainer.run_round([Candidate.of(VerifiedGroup(g, q)) for g, q in zip(groups, qs)])
        used += sum(c.origin == "honest" for c in result.used_external)
    return used, trainer


def test_a_poisoners_score_falls_and_honest_groups_take_its_j_slots_under_either_sampler(tmp_path: Path) -> None:
    model_dir = build_tiny_policy(tmp_path / "m", seed=4)
    uniform, _ = _honest_groups_used(model_dir, "uniform", 24)
    weighted, trainer = _honest_groups_used(model_dir, "reputation", 24)
    snap = trainer.reputation_snapshot
    assert snap["poisoner"]["score"] < 0.2 and snap["honest"]["score"] > 0.8
    # The first look drops the screened poisoner before the draw, under either sampler: its groups
    # take no J slot, and the honest groups are drawn every round after the first few.
    assert weighted >= 20 and uniform >= 20
