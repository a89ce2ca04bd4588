"""One count of what peers sent and what was used: the store, the Peers tab and the Shared rollouts line
agree, however many verdicts a group gets (pooled, skipped, used, evicted) and across a history load."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from app.models import AppModel
from engine.events import EventError, RolloutSeen, event_from_dict
from engine.models.policy import build_tiny_policy
from engine.node import Node, NodeConfig
from engine.sapo.records import Provenance, RolloutGroup
from engine.tasks import library
from engine.tasks.library import preset as mix_preset

PEER = "q" * 43


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "model")


def _group(index: int) -> RolloutGroup:
    question = library.regenerate(mix_preset("rl").ref("basic_arithmetic", 3, index))
    return RolloutGroup(question.ref, question.hash, ("7", "8"), Provenance(PEER, "seed", 1, 1, time.time()),
                        rewards=(1.0, 0.0))


def _seen(index: int, status: str, reason: str = "", evicted: bool = False) -> RolloutSeen:
    return RolloutSeen.of(_group(index), status, reason, f"question {index}", "amber-otter", evicted=evicted)


# group 1: pooled, passed over once, used; group 2: pooled, then evicted unused; group 3: refused on arrival
VERDICTS = [(1, "pooled", ""), (1, "skipped", "not_sampled"), (1, "used", ""), (2, "pooled", ""),
            (2, "dropped", "evicted_capacity"), (3, "dropped", "duplicate")]


def _events() -> list[RolloutSeen]:
    return [_seen(i, status, reason, evicted=reason.startswith("evicted")) for i, status, reason in VERDICTS]


def test_arrival_is_the_first_verdict_only() -> None:
    assert [e.arrival for e in _events()] == [True, False, False, True, False, True]
    with pytest.raises(EventError, match="evicted"):
        event_from_dict(_seen(1, "dropped").to_dict() | {"evicted": "yes"})
    assert event_from_dict(_seen(2, "dropped", "expired", evicted=True).to_dict()).arrival is False


def test_store_peers_tab_and_feed_line_count_alike(tmp_path: Path, tiny_model: Path, qtbot: object) -> None:
    from app.views.peers import PeersView
    from app.views.rollouts import RolloutsView

    node = Node(NodeConfig(data_dir=tmp_path, model=str(tiny_model), solo=True))
    try:
        node.store.upsert_peer(PEER, "amber-otter", "seed", "mdns", "127.0.0.1:7070", seen_at=time.time())
        for event in _events():
            node.bus.publish(event)  # the node's own listener writes the store
        row = node.store.peers()[0]
        assert (row["received"], row["used"]) == (3, 1)  # 3 groups arrived, 1 trained on
        history = {"peers": node.store.peers(), "rollouts": node.store.rollouts()}
    finally:
        node.store.close()
    app = AppModel()
    app.load_history(history)  # the stored rows fill the feed without counting twice
    assert app.peers.totals() == (3, 1) and len(app.feed.rows) == 3
    app.apply_many([_seen(4, "pooled"), _seen(4, "used"), _seen(5, "pooled"),
                    _seen(5, "dropped", "expired", evicted=True)])  # live, after the load
    assert app.peers.totals() == (5, 2)
    peers, rollouts = PeersView(app.peers), RolloutsView(app.feed, app.peers)
    qtbot.addWidget(peers)  # type: ignore[attr-defined]
    qtbot.addWidget(rollouts)  # type: ignore[attr-defined]
    peers.refresh()
    rollouts.refresh()
    assert (peers.table.item(0, 6).text(), peers.table.item(0, 7).text()) == ("5", "2")
    line = rollouts.counters.text()
    assert "<b>Received</b> 5 " in line and "<b>used in training</b> 2 " in line and "all time" in line
