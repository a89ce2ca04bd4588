"""The held-out judge: a question whose text this node has trained on leaves every later eval, the
count is reported and survives a restart; the node's judge seed is its private key's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_trainer import CFG, odd_length_reward

from engine.models.policy import build_tiny_policy, load_policy
from engine.node.node import private_judge_seed
from engine.sapo.records import Candidate, Provenance, RolloutGroup, VerifiedGroup
from engine.sapo.repeated_text import RepeatedTextConfig
from engine.sapo.trainer import Trainer
from engine.store import Store
from engine.tasks.library import Question, preset, regenerate

MIX = preset("rl")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "m", seed=11)


def _trainer(model_dir: Path, tmp: Path, resume: bool = False) -> Trainer:
    cfg = dataclasses.replace(CFG, eval_per_specialty=1, eval_k=1, checkpoint_every=1,
                              repeated_text=RepeatedTextConfig(enabled=False), quarantine_rounds=0)  # not its screens
    model, tok = load_policy(model_dir)
    make = Trainer.resume if resume else Trainer
    return make(model, tok, cfg, MIX, Store(tmp / "node.db"), tmp / "ckpt", 7, reward_fn=odd_length_reward)


def _peer_group(q: Question, origin: str) -> Candidate:
    mixed = RolloutGroup(q.ref, q.hash, ("a", "bb", "ccc", "dddd"), Provenance(origin, "seed", 0, 1, 0.0)
                         ).with_rewards((1.0, 0.0, 1.0, 0.0))
    return Candidate.of(VerifiedGroup(mixed, q))


def test_a_peers_group_on_a_judge_text_is_refused_and_the_judge_keeps_it(model_dir: Path, tmp_path: Path) -> None:
    trainer = _trainer(model_dir, tmp_path)
    judge = trainer.heldout_questions()
    # A peer that enumerates a small task space sends a judge question's text from a training-range ref.
    attack, honest = _peer_group(judge[0], "peerA"), _peer_group(regenerate(MIX.ref(next(iter(MIX.specialties)), 5, 3)), "peerB")
    assert honest.question.hash not in {q.hash for q in judge}
    result = trainer.run_round([attack, honest])
    assert [c.key for c in result.used_external] == [honest.key], result.verdicts
    assert [(v.key, v.reason) for v in result.skipped()] == [(attack.key, "judge_question")]
    assert trainer.judge_seen == set()
    report = trainer.evaluate_heldout(record=False)
    assert report.skipped_seen == 0 and report.overall.n_questions == len(judge)


def test_an_own_draw_of_a_judge_text_leaves_the_eval(model_dir: Path, tmp_path: Path) -> None:
    """Seeds differ, small task spaces do not: an own training draw may repeat a judge text by chance.
    A judge made of the draws a same-seeded trainer makes shows it."""
    first = _trainer(model_dir, tmp_path / "a").run_round([])
    trainer = _trainer(model_dir, tmp_path / "b")
    drawn = [regenerate(g.ref) for g in first.local_groups]
    trainer.use_judge(drawn)
    result = trainer.run_round([])
    trained = {g.question_hash for g in result.local_groups if g.rewards and len(set(g.rewards)) > 1}
    assert trained and trainer.judge_seen == trained
    report = trainer.evaluate_heldout(record=False)
    assert report.skipped_seen == len(trained) and report.overall.n_questions == len(drawn) - len(trained)
    assert report.to_dict()["skipped_seen"] == len(trained)
    resumed = _trainer(model_dir, tmp_path / "b", resume=True)  # the round's checkpoint carries it
    assert resumed.judge_seen == trained


def test_the_nodes_judge_seed_is_its_keys(tmp_path: Path) -> None:
    seed = private_judge_seed(tmp_path / "a")
    assert seed == private_judge_seed(tmp_path / "a") and 0 <= seed < 1 << 40
    assert seed != private_judge_seed(tmp_path / "b")
