"""The trainer's verdicts on peers' groups reach the event stream, the store and the feed: a real node on
a tiny model, peers' groups offered to its real pool, real rounds."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from app.models import AppModel
from app.models.feed import status_text
from engine.control.protocol import encode_event, parse_server_message
from engine.events import TRAINER_VERDICTS, EventError, RolloutSeen, event_from_dict
from engine.models.policy import build_tiny_policy
from engine.models.resolve import stored_model_id
from engine.node import Node, NodeConfig
from engine.sapo.config import preset
from engine.sapo.first_look import DROP_COPIES, DROP_CUT_NO_SIGNAL, DROP_REPEATED_TEXT, DROP_SPECIAL_TOKENS
from engine.sapo.plan import DROP_JUDGE_QUESTION
from engine.sapo.records import Provenance, RolloutGroup, content_key
from engine.sapo.repeated_text import RepeatedTextConfig
from engine.sapo.sampler import (
    DROP_NOT_SAMPLED,
    DROP_NOT_SCORED,
    DROP_OTHER_MODEL,
    DROP_SAME_QUESTION,
    DROP_ZERO_ADVANTAGE,
)
from engine.sapo.verdicts import Verdict, VerdictLog, round_verdicts
from engine.swarm.config import SwarmConfig
from engine.tasks import library
from engine.tasks.library import preset as mix_preset

PEER = "p" * 43


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "model")


def _peer_group(index: int, completions: tuple[str, ...] | None = None, model_id: str = "seed") -> RolloutGroup:
    """A peer's group on a short arithmetic question: right + wrong answers (mixed) unless given."""
    question = library.regenerate(mix_preset("rl").ref("basic_arithmetic", 3, index))
    texts = completions or (library.demonstration(question), "no")
    return RolloutGroup(question.ref, question.hash, texts, Provenance(PEER, model_id, 1, 1, time.time()))


def test_every_trainer_reason_is_a_typed_verdict() -> None:
    assert set(TRAINER_VERDICTS) == {DROP_CUT_NO_SIGNAL, DROP_REPEATED_TEXT, DROP_ZERO_ADVANTAGE,
                                     DROP_NOT_SCORED, DROP_NOT_SAMPLED, DROP_OTHER_MODEL, DROP_SPECIAL_TOKENS, DROP_COPIES,
                                     DROP_SAME_QUESTION, DROP_JUDGE_QUESTION}
    for reason in TRAINER_VERDICTS:
        assert not status_text("skipped", reason).endswith(reason)  # each said in words
    with pytest.raises(EventError):
        event_from_dict({"type": "rollout_seen", "origin_peer": "p", "peer_name": "", "specialty": "s",
                         "question": "q", "completion": "c", "reward": None, "status": "screened"})


def test_a_verdict_is_told_once_until_it_changes() -> None:
    a, b = content_key(_peer_group(1, ("no", "nope"))), content_key(_peer_group(2))
    log = VerdictLog()
    first = round_verdicts([], [], [(a, "zero_advantage"), (b, "not_sampled")], [])
    assert log.changed(first) == [Verdict(a, "skipped", "zero_advantage"), Verdict(b, "skipped", "not_sampled")]
    used = round_verdicts([], [b], [(a, "zero_advantage")], [])
    assert used == (Verdict(b, "used"), Verdict(a, "skipped", "zero_advantage"))
    assert log.changed(used) == []  # a: told already; b was used: no skip to tell
    assert log.changed(round_verdicts([], [], [(a, "repeated_text")], [])) == [Verdict(a, "skipped", "repeated_text")]
    with pytest.raises(ValueError, match="not a trainer verdict"):
        round_verdicts([], [], [(a, "bored")], [])


def test_a_screened_group_reaches_the_feed_with_its_reason(tmp_path: Path, tiny_model: Path) -> None:
    # J = 1 and one peer: one of its two mixed groups is drawn per round, the other waits; the flat one
    # (all answers wrong) has no signal. The repeated-text screen is off: it would hold a fresh peer's
    # groups until it has seen 3 questions, which is its own tests' business.
    sapo = preset("cpu-small").replace(num_local=2, completions=4, eval_every=0, checkpoint_every=0,
                                       num_external=1, repeated_text=RepeatedTextConfig(enabled=False),
                                       quarantine_rounds=0)
    cfg = NodeConfig(data_dir=tmp_path, model=str(tiny_model), sapo=sapo, solo=False, rounds=3, seed=3,
                     swarm=SwarmConfig(listen_host="127.0.0.1", mdns=False))
    node = Node(cfg)
    seen: list[object] = []
    node.bus.add_listener(seen.append)
    same_model = stored_model_id(str(tiny_model))  # another model's answers are not trained on at all
    flat = _peer_group(1, ("no", "nope"), same_model)
    mixed = [_peer_group(2, model_id=same_model), _peer_group(3, model_id=same_model)]

    async def main() -> None:
        await node.join()  # the pool exists once join returns; the trainer is still loading
        for group in (flat, *mixed):
            assert node.net.pool.offer(group, "peer").status == "pooled"
        await asyncio.wait_for(node.finished.wait(), 300)
        await node.leave()

    asyncio.run(main())
    assert node.error is None
    rollouts = [e for e in seen if isinstance(e, RolloutSeen)]
    flat_question = library.regenerate(flat.ref).text
    verdicts = [(e.status, e.reason) for e in rollouts if e.question == flat_question]
    # judged in every round, told once: its verdict did not change (offered to the pool directly, not
    # over a link, so no "pooled" event came before)
    assert verdicts == [("skipped", "zero_advantage")]
    waited = [e for e in rollouts if e.status == "skipped" and e.reason == "not_sampled"]
    assert len(waited) == 1 and waited[0].question != flat_question
    assert sorted(e.question for e in rollouts if e.status == "used") == sorted(
        library.regenerate(g.ref).text for g in mixed)  # the waiting one was drawn the round after
    assert all(parse_server_message(encode_event(e)) == e for e in rollouts)  # through the control API too

    app = AppModel()
    app.apply_many([e for e in seen if isinstance(e, RolloutSeen)])
    row = next(r for r in app.feed.rows if r.seen.question == flat_question)
    assert status_text(row.status, row.reason) == "skipped: no learning signal (all answers right or all wrong)"
    assert (len(app.feed.rows), [r.status for r in app.feed.rows].count("used"), app.feed.waiting) == (3, 2, 1)
    assert app.feed.skipped == {"zero_advantage": 1}

    stored = [(r["status"], r["reason"]) for r in node.store.rollouts()]
    assert ("skipped", "zero_advantage") in stored and ("skipped", "not_sampled") in stored
    replayed = AppModel()  # the GUI's history after a restart shows the verdicts too
    replayed.load_history(node.history())
    assert replayed.bad_history_rows == 0 and replayed.feed.skipped == {"zero_advantage": 1}
    drew = [r for r in node.store.rounds() if r["peer_text_groups"]]
    assert len(drew) == 2 and all(r["peer_text_groups"] == r["peer_text_mixed"] == 1.0 for r in drew)
    node.store.close()


def test_unknown_statuses_never_become_events() -> None:
    group = dataclasses.replace(_peer_group(4), rewards=(1.0, 0.0))
    with pytest.raises(EventError):
        RolloutSeen.of(group, "screened")
