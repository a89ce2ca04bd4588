"""Peers' frontier questions answered on-policy: which are picked (mixed when re-scored here, one
per origin, not asked lately), that the node generates its own answers to them, that a forged one
never gets here, and what each source gave and cost, down to the store."""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path

import pytest

from engine.models.generate import SampleConfig
from engine.models.policy import build_tiny_policy, load_policy
from engine.node.peer_groups import make_pool
from engine.sapo.config import SapoConfig
from engine.sapo.frontier import RecentQuestions, Suggestions, pick_suggestions, source_metrics
from engine.sapo.records import Candidate, Provenance, RolloutGroup, VerifiedGroup
from engine.sapo.repeated_text import RepeatedTextConfig
from engine.sapo.reputation import ReputationConfig
from engine.sapo.step import PoolExchange, step
from engine.sapo.trainer import Trainer
from engine.store import Store
from engine.swarm.config import PoolConfig
from engine.tasks.library import preset, regenerate

CFG = SapoConfig(num_local=2, num_external=1, num_suggested=1, completions=4,
                 sampling=SampleConfig(max_new_tokens=24), checkpoint_every=0, eval_every=0, lr=1e-3,
                 repeated_text=RepeatedTextConfig(min_questions=1), quarantine_rounds=0)
RIGHT, WRONG = "right", "wrong"


def _group(index: int, answers: tuple[str, ...], origin: str = "peerA", specialty: str = "basic_arithmetic",
           forge: bool = False) -> RolloutGroup:
    q = regenerate(preset("rl").ref(specialty, 1000, index))
    texts = tuple(f"<answer>{q.answer if a == RIGHT else 'x'}</answer>" for a in answers)
    return RolloutGroup(q.ref, "0" * 64 if forge else q.hash, texts, Provenance(origin, "seed", 1, 1, time.time()))


def _verified(index: int, rewards: tuple[float, ...], origin: str) -> Candidate:
    group = _group(index, tuple(RIGHT if r else WRONG for r in rewards), origin)
    return Candidate.of(VerifiedGroup(group.with_rewards(rewards), regenerate(group.ref)))


def test_suggestions_follow_what_each_origin_yielded_and_one_address_counts_as_one() -> None:
    suggestions = Suggestions(ReputationConfig())
    for _ in range(40):  # A's suggestions came back mixed here, B's flat
        suggestions.observe("A", mixed=True)
        suggestions.observe("B", mixed=False)
    rng = random.Random(0)
    firsts = [suggestions.pick([_verified(i, (1.0, 0.0), "B"), _verified(50 + i, (0.0, 1.0), "A")], 1, 1, rng)[0]
              for i in range(200)]
    share_a = sum(c.origin == "A" for c in firsts) / len(firsts)
    assert share_a > 0.9  # weights ~0.98 vs 0.02: A's question first almost always, B's still sometimes
    assert share_a < 1.0
    # ten identities behind one address fill one slot, as one origin would
    sybils = [dataclasses.replace(_verified(70 + k, (1.0, 0.0), f"s{k}"), source="192.0.2.9") for k in range(10)]
    honest = dataclasses.replace(_verified(90, (0.0, 1.0), "H"), source="192.0.2.10")
    picked = suggestions.pick(sybils + [honest], 4, 1, random.Random(1))
    assert len(picked) == 2 and {c.source for c in picked} == {"192.0.2.9", "192.0.2.10"}
    restored = Suggestions(ReputationConfig())  # kept in checkpoints
    restored.load_state(suggestions.state_dict())
    assert restored.yields.score("A") == suggestions.yields.score("A") > 0.9
    assert restored.yields.score("B") < 0.1


def test_picks_mixed_questions_one_per_origin_and_not_asked_lately() -> None:
    mixed_a = [_verified(i, (1.0, 0.0, 1.0), "A") for i in range(3)]
    mixed_b = [_verified(10 + i, (0.0, 1.0, 0.0), "B") for i in range(3)]
    flat = [_verified(20 + i, (1.0, 1.0, 1.0), "C") for i in range(3)] + [_verified(30, (0.0, 0.0, 0.0), "D")]
    recent = RecentQuestions(remember=4)
    picked = pick_suggestions(mixed_a + mixed_b + flat, 4, 1, random.Random(0), recent)
    assert sorted(v.group.provenance.origin_peer for v in picked) == ["A", "B"]  # C and D held no signal
    assert len(pick_suggestions(mixed_a + mixed_b, 4, 2, random.Random(0), recent)) == 4
    for v in mixed_a:
        recent.add(v.group.question_hash)
    assert {v.group.provenance.origin_peer for v in pick_suggestions(mixed_a + mixed_b, 4, 3, random.Random(0),
                                                                      recent)} == {"B"}
    rng = random.Random(5)
    state = rng.getstate()
    assert pick_suggestions(mixed_a, 0, 1, rng, recent) == [] and rng.getstate() == state  # n = 0 draws nothing
    for i in range(10):  # the memory is bounded
        recent.add(f"h{i}")
    assert mixed_b[0].group.question_hash not in recent and "h9" in recent and "h5" not in recent


def test_source_metrics_split_what_the_round_gave_and_cost() -> None:
    m = source_metrics(1, [True, False, True], kept=[0, 2], peer_text=2, gen_seconds=6.0, train_seconds=8.0)
    assert (m["suggested_groups"], m["suggested_mixed"], m["own_pick_groups"], m["own_pick_mixed"]) == (1, 1, 2, 1)
    assert m["peer_text_groups"] == 2
    assert m["seconds_suggested"] == pytest.approx(6 / 3 + 8 / 4)
    assert m["seconds_own_pick"] == pytest.approx(6 * 2 / 3 + 8 / 4)
    assert m["seconds_peer_text"] == pytest.approx(8 * 2 / 4)
    assert sum(m[f"seconds_{s}"] for s in ("own_pick", "suggested", "peer_text")) == pytest.approx(14.0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "m", seed=11)


def test_a_round_answers_a_peers_frontier_question_itself_and_stores_each_source(model_dir: Path,
                                                                                 tmp_path: Path) -> None:
    model, tok = load_policy(model_dir)
    store = Store(tmp_path / "node.db")
    trainer = Trainer(model, tok, CFG, preset("rl"), store, None, 7)
    pool = make_pool(PoolConfig(), 24, False, preset("rl"))
    forged = _group(7, (RIGHT, WRONG, RIGHT, WRONG), origin="liar", forge=True)
    assert pool.offer(forged, "liar").reason == "forged_ref"  # never a candidate, never a suggestion
    frontier = _group(3, (RIGHT, WRONG, RIGHT, WRONG), origin="peerA")
    assert pool.offer(frontier, "peerA").status == "pooled"
    exchange = PoolExchange(pool)
    result = step(trainer, exchange)
    (taken,) = result.suggested
    assert taken.group.question_hash == frontier.question_hash
    ours = [g for g in result.local_groups if g.question_hash == frontier.question_hash]
    assert len(ours) == 1 and ours[0].completions != frontier.completions  # our own answers, on-policy
    assert ours[0].provenance.origin_peer != "peerA"
    assert taken not in result.used_external  # not also trained on as text
    assert frontier.question_hash not in {v.group.question_hash for v in pool.candidates()}  # retired
    m = result.metrics
    assert (m["suggested_groups"], m["own_pick_groups"], m["peer_text_groups"]) == (1.0, 1.0, 0.0)
    (row,) = store.rounds()
    assert row["suggested_groups"] == 1.0 and row["own_pick_groups"] == 1.0 and row["seconds_suggested"] > 0
    assert "peerA" in trainer.reputation.snapshot()  # the suggestion's yield is on the origin's record
    store.close()


def test_config_bounds_suggestions_by_the_own_questions() -> None:
    with pytest.raises(ValueError, match="num_suggested"):
        SapoConfig(num_local=2, num_suggested=3)
    with pytest.raises(ValueError, match="suggested_per_origin"):
        SapoConfig(num_local=2, num_suggested=1, suggested_per_origin=0)


def test_adaptive_sources_learn_what_each_source_yields_and_keep_it_across_a_checkpoint(model_dir: Path,
                                                                                      tmp_path: Path) -> None:
    """With adaptive_sources the number of suggested questions per round is the chooser's (never above
    num_suggested nor the suggestions on hand), and what each source gave is recorded and checkpointed."""
    import dataclasses

    model, tok = load_policy(model_dir)
    cfg = dataclasses.replace(CFG, num_external=0, num_suggested=2, adaptive_sources=True, checkpoint_every=1)
    trainer = Trainer(model, tok, cfg, preset("rl"), None, tmp_path / "ckpt", 7)
    pool = make_pool(PoolConfig(), 24, False, preset("rl"))
    for i in range(3):
        assert pool.offer(_group(40 + i, (RIGHT, WRONG, RIGHT, WRONG), origin=f"peer{i}"), f"peer{i}").status == "pooled"
    exchange = PoolExchange(pool)
    taken = [len(step(trainer, exchange).suggested) for _ in range(3)]
    assert all(0 <= n <= 2 for n in taken) and sum(taken) <= 3  # each suggestion is answered once
    records = trainer.sources.records
    assert records["own_pick"].groups > 0  # own picks counted every round
    assert (records["suggested"].groups > 0) == (sum(taken) > 0)
    saved = trainer.sources.state_dict()
    again = Trainer.resume(load_policy(model_dir)[0], tok, cfg, preset("rl"), None, tmp_path / "ckpt", 7)
    assert again.round == 3 and again.sources.state_dict() == saved
    with pytest.raises(ValueError, match="adaptive_sources"):
        SapoConfig(num_local=2, num_suggested=1, adaptive_sources=1)  # type: ignore[arg-type]
