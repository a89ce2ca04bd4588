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
from engine.tasks.library import preset


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "m", seed=11)


def _trainer(model_dir: Path, tmp: Path, resume: bool = False) -> Trainer:
    cfg = dataclasses.replace(CFG, eval_per_specialty=1, eval_k=1, checkpoint_every=1,
                              repeated_text=RepeatedTextConfig(enabled=False), quarantine_rounds=0)  # not its screens
    model, tok = load_policy(model_dir)
    make = Trainer.resume if resume else Trainer
    return make(model, tok, cfg, preset("rl"), Store(tmp / "node.db"), tmp / "ckpt", 7, reward_fn=odd_length_reward)


def test_a_judge_text_trained_on_leaves_the_eval(model_dir: Path, tmp_path: Path) -> None:
    trainer = _trainer(model_dir, tmp_path)
    judge = trainer.heldout_questions()
    assert trainer.evaluate_heldout(record=False).skipped_seen == 0
    # A question with a judge question's text, as a training draw or a peer's group may carry one.
    q = judge[0]
    mixed = RolloutGroup(q.ref, q.hash, ("a", "bb", "ccc", "dddd"), Provenance("peerA", "seed", 0, 1, 0.0)
                         ).with_rewards((1.0, 0.0, 1.0, 0.0))
    result = trainer.run_round([Candidate.of(VerifiedGroup(mixed, q))])
    assert [c.question.hash for c in result.used_external] == [q.hash], result.verdicts
    assert trainer.judge_seen == {q.hash}
    report = trainer.evaluate_heldout(record=False)
    assert report.skipped_seen == 1 and report.overall.n_questions == len(judge) - 1
    assert report.to_dict()["skipped_seen"] == 1
    resumed = _trainer(model_dir, tmp_path, resume=True)  # the round's checkpoint carries it
    assert resumed.judge_seen == {q.hash}


def test_the_nodes_judge_seed_is_its_keys(tmp_path: Path) -> None:
    seed = private_judge_seed(tmp_path / "a")
    assert seed == private_judge_seed(tmp_path / "a") and 0 <= seed < 1 << 40
    assert seed != private_judge_seed(tmp_path / "b")
