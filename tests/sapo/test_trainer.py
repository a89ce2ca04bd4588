"""The round on one node with a real tiny Llama, real tasks, a real store and real checkpoints.

A random tiny model never writes a well-formed answer, so these tests score with a simple,
deterministic text reward (the verifier is a dependency of the trainer): groups get mixed rewards and
the update really runs. Learning on the real verifier is checked with the seed model (bench/learning).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.checkpoint import list_checkpoints
from engine.events import EvalCompleted, Event, RoundCompleted, WorkProgress
from engine.models.generate import SampleConfig
from engine.models.policy import build_tiny_policy, load_policy
from engine.sapo.config import SapoConfig
from engine.sapo.records import Candidate, Provenance, RolloutGroup, VerifiedGroup
from engine.sapo.repeated_text import RepeatedTextConfig
from engine.sapo.trainer import Trainer
from engine.sapo.verdicts import Verdict
from engine.store import Store
from engine.tasks.library import preset, regenerate


def odd_length_reward(question: Any, completion: str) -> float:
    return float(len(completion) % 2)


CFG = SapoConfig(num_local=2, num_external=2, completions=4, sampling=SampleConfig(max_new_tokens=6),
                 checkpoint_every=2, checkpoint_seconds=0.0, checkpoint_overhead=0.0, eval_every=0, lr=1e-3,
                 num_iterations=2,
                 # a peer is judged from its first question here: these tests are about the round, not the screen
                 repeated_text=RepeatedTextConfig(min_questions=1), quarantine_rounds=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "m", seed=11)


def _trainer(model_dir: Path, tmp: Path, cfg: SapoConfig = CFG, resume: bool = False, **kw: Any) -> Trainer:
    model, tok = load_policy(model_dir)
    make = Trainer.resume if resume else Trainer
    return make(model, tok, cfg, preset("rl"), Store(tmp / "node.db"), tmp / "ckpt", 7,
                reward_fn=odd_length_reward, **kw)


def _weights(trainer: Trainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in trainer.model.parameters()])


def test_resume_equals_an_uninterrupted_run(model_dir: Path, tmp_path: Path) -> None:
    straight = _trainer(model_dir, tmp_path / "a")
    results = [straight.run_round() for _ in range(4)]
    losses = [r.metrics.get("loss") for r in results]
    assert all(loss is not None for loss in losses) and any(loss != 0.0 for loss in losses)

    first = _trainer(model_dir, tmp_path / "b")
    head = [first.run_round().metrics.get("loss") for _ in range(3)]  # round 3 is lost in the "crash"
    assert [p.name for p in list_checkpoints(tmp_path / "b" / "ckpt")] == ["ckpt-00000002"]
    resumed = _trainer(model_dir, tmp_path / "b", resume=True)
    assert (resumed.round, resumed.policy_version) == (2, first.policy_version - 2)
    assert resumed.config_changes == []
    assert resumed.discarded_rounds == [3]  # the store no longer shows a round the weights don't hold
    assert [r["round"] for r in resumed.store.rounds()] == [1, 2]
    changed = _trainer(model_dir, tmp_path / "b", dataclasses.replace(CFG, lr=5e-4), resume=True)
    assert changed.config_changes == ["lr"]
    assert changed.optimizer.param_groups[0]["lr"] == 5e-4  # the new setting is the one in force
    tail = [resumed.run_round() for _ in range(2)]
    assert head[:2] + [r.metrics.get("loss") for r in tail] == losses
    for a, b in zip(tail, results[2:]):  # same questions, same samples
        assert [(g.ref, g.completions) for g in a.local_groups] == [(g.ref, g.completions) for g in b.local_groups]
    assert torch.equal(_weights(resumed), _weights(straight))
    rows = resumed.store.rounds() if resumed.store else []
    assert [r["round"] for r in rows] == [1, 2, 3, 4] and rows[3]["loss"] == losses[3]


def test_round_result_external_groups_and_events(model_dir: Path, tmp_path: Path) -> None:
    events: list[Event] = []
    cfg = dataclasses.replace(CFG, eval_every=2, eval_per_specialty=1, eval_k=2, checkpoint_every=0)
    trainer = _trainer(model_dir, tmp_path, cfg, on_event=events.append)
    first = trainer.run_round()
    assert first.round == 1 and len(first.local_groups) == 2
    for g in first.local_groups:
        assert g.rewards is not None and g.generator_logprobs is not None and g.is_local
        assert len(g.generator_logprobs) == len(g.completions) == 4
    q = regenerate(first.local_groups[0].ref)
    prov = Provenance("peerA", "seed", 3, 9, 0.0)
    mixed = RolloutGroup(q.ref, q.hash, ("a", "bb", "ccc", "dddd"), prov).with_rewards((1.0, 0.0, 1.0, 0.0))
    flat = RolloutGroup(q.ref, q.hash, ("x", "y", "z", "w"), prov).with_rewards((1.0, 1.0, 1.0, 1.0))
    forged = RolloutGroup(q.ref, "0" * 64, ("a", "bb", "c", "dd"), prov).with_rewards((1.0, 0.0, 1.0, 0.0))
    unscored = RolloutGroup(q.ref, q.hash, ("a", "b"), prov)
    for bad in (forged, unscored):  # neither can become a verified group, so neither reaches a trainer
        with pytest.raises(ValueError, match="verified group"):
            VerifiedGroup(bad, q)
    other = RolloutGroup(q.ref, q.hash, ("e", "ff", "g", "hh"), Provenance("peerB", "smollm2-135m", 3, 9, 0.0)
                         ).with_rewards((1.0, 0.0, 1.0, 0.0))  # a right and a wrong answer, by another model
    offered = [Candidate.of(VerifiedGroup(g, q)) for g in (mixed, flat, other)]
    second = trainer.run_round(offered)
    assert second.used_external == (offered[0],)
    # One verdict per candidate, by its key: the mixed one used, the others skipped with why.
    assert second.verdicts == (Verdict(offered[0].key, "used"), Verdict(offered[2].key, "skipped", "other_model"),
                               Verdict(offered[1].key, "skipped", "zero_advantage"))
    assert second.eval is not None and second.eval.k == 2
    progress = [(e.phase, e.round) for e in events if isinstance(e, WorkProgress)]
    baseline = progress.index(("generating", 1))  # the model's first round here began with a baseline eval
    assert baseline and set(progress[:baseline]) == {("evaluating", 0)}
    progress = progress[baseline:]
    assert progress[:4] == [("generating", 1), ("updating", 1), ("generating", 2), ("updating", 2)]
    assert {phase for phase, _ in progress[4:]} == {"evaluating"}  # before each batch of held-out questions
    events = [e for e in events if not isinstance(e, WorkProgress)]
    kinds = [type(e) for e in events]
    assert kinds == [EvalCompleted, RoundCompleted, RoundCompleted, EvalCompleted]
    assert isinstance(events[2], RoundCompleted) and events[2].num_external == 1
    assert {e.model for e in events if isinstance(e, (RoundCompleted, EvalCompleted))} == {"seed"}
    assert trainer.store is not None and [e["round"] for e in trainer.store.evals()] == [0, 2]
    assert set(second.phase_seconds) == {"generate", "score", "prepare", "update", "total"}


def test_an_external_completion_is_scored_on_the_text_it_is_trained_on(model_dir: Path, tmp_path: Path) -> None:
    """Padding before a right answer earned reward 1 on the full text while the loss saw only the
    first max_new_tokens tokens (no answer in them): cut, re-scored, the group has no signal left."""
    def has_seven(question: Any, completion: str) -> float:
        return float("7" in completion)

    model, tok = load_policy(model_dir)
    trainer = Trainer(model, tok, CFG, preset("rl"), None, None, 7, reward_fn=has_seven)
    q = regenerate(preset("rl").ref("basic_arithmetic", 3, 1))
    prov = Provenance("peerA", "seed", 3, 9, 0.0)
    padded = RolloutGroup(q.ref, q.hash, ("n", " " * 500 + "7", " " * 500 + "7", "n"), prov).with_rewards(
        (0.0, 1.0, 1.0, 0.0))  # what the pool's scoring of the full text gave
    honest = RolloutGroup(q.ref, q.hash, ("7", "n", "7", "n"), prov).with_rewards((1.0, 0.0, 1.0, 0.0))
    offered = [Candidate.of(VerifiedGroup(g, q)) for g in (padded, honest)]
    result = trainer.run_round(offered)
    assert result.used_external == (offered[1],)
    assert [(v.key, v.reason) for v in result.skipped()] == [(offered[0].key, "cut_no_signal")]


def test_another_models_answers_are_trained_on_only_when_the_config_allows(model_dir: Path, tmp_path: Path) -> None:
    model, tok = load_policy(model_dir)
    q = regenerate(preset("rl").ref("basic_arithmetic", 3, 1))
    other = RolloutGroup(q.ref, q.hash, ("7", "n", "7", "n"), Provenance("peerB", "smollm2-135m", 3, 9, 0.0)
                         ).with_rewards((1.0, 0.0, 1.0, 0.0))
    candidate = Candidate.of(VerifiedGroup(other, q))
    for same_model, used in ((True, ()), (False, (candidate,))):
        cfg = CFG.replace(num_external=1, external_same_model=same_model)
        result = Trainer(model, tok, cfg, preset("rl"), None, None, 7).run_round([candidate])
        assert result.used_external == used
