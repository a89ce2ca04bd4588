"""The Peers tab lists the peers that are connected or were seen lately, as the engine's peer table does
(it forgets a peer unreachable for FORGET_AFTER_S): a peer gone for 23 minutes is counted as gone, not
listed. On a real PeersView offscreen, fed events and a real store's peer history."""

from __future__ import annotations

import time
from pathlib import Path

from pytestqt.qtbot import QtBot

from app.models import AppModel
from app.models.peers import PeersModel
from app.views.peers import PeersView
from engine.events import PeerUpdated
from engine.store import Store
from engine.swarm.peers import FORGET_AFTER_S


def _peer(peer_id: str, connected: bool, seen_s_ago: float, now: float) -> PeerUpdated:
    return PeerUpdated(peer_id=peer_id, name=f"name-{peer_id}", model="tiny", found_by="mdns",
                       address=f"ws://127.0.0.1:1/{peer_id}", connected=connected, ts=now - seen_s_ago)


def _listed(view: PeersView) -> list[str]:
    return [view.table.item(i, 1).text() for i in range(view.table.rowCount())]


def test_peers_gone_longer_than_the_engine_remembers_are_not_listed(qtbot: QtBot) -> None:
    now = time.time()
    peers = PeersModel()
    assert peers.forget_after_s == FORGET_AFTER_S  # the engine's horizon, not another one
    peers.apply(_peer("gone", False, 23 * 60, now))  # left 23 minutes ago
    peers.apply(_peer("left", False, 60, now))  # left a minute ago: still listed, grey
    peers.apply(_peer("linked", True, 40 * 60, now))  # a link opened 40 minutes ago and still open
    view = PeersView(peers)
    qtbot.addWidget(view)
    view.show()
    view.refresh()
    assert _listed(view) == ["name-linked", "name-left"]  # connected first
    assert "1</b> connected of 2 recent peers" in view.summary.text()
    assert "1 more gone: not seen for 10 min or more" in view.summary.text()
    assert peers.connected == 1 and len(peers.rows) == 3  # counted, kept (a returning peer keeps its counts)

    # a gone peer that comes back is listed again; a listed one that has been away too long drops out
    peers.apply(_peer("gone", True, 0, time.time()))
    view.refresh()
    assert _listed(view) == ["name-gone", "name-linked", "name-left"]  # connected, the latest seen first
    later = time.time() + FORGET_AFTER_S + 1
    assert [r.name for r in peers.sorted_rows(later)] == ["name-gone", "name-linked"]
    assert peers.gone(later) == 1  # "left": its minute became ten


def test_the_stores_peer_history_lists_only_recent_peers(qtbot: QtBot, tmp_path: Path) -> None:
    now = time.time()
    with Store(tmp_path / "node.db") as store:  # the store keeps every peer ever met
        store.upsert_peer("p-old", "old-otter", "tiny", "bootstrap", "wss://boot", seen_at=now - 23 * 60)
        store.upsert_peer("p-new", "new-newt", "tiny", "mdns", "ws://127.0.0.1:2", seen_at=now - 30)
        history = {"rounds": [], "evals": [], "rollouts": [], "peers": store.peers()}
    model = AppModel()
    model.load_history(history)
    view = PeersView(model.peers)
    qtbot.addWidget(view)
    view.show()
    view.refresh()
    assert _listed(view) == ["new-newt"]
    assert "0</b> connected of 1 recent peer " in view.summary.text() and "1 more gone" in view.summary.text()


def test_a_reconnected_engine_with_no_peers_closes_the_links_the_app_saw() -> None:
    now = time.time()
    peers = PeersModel()
    peers.apply(_peer("a", True, 5, now))  # from an engine that then died: nothing said the link closed
    peers.engine_connected(3)  # a new engine with peers of its own: rows stay as they are
    assert peers.connected == 1
    peers.engine_connected(0)
    assert peers.connected == 0 and [r.peer_id for r in peers.sorted_rows()] == ["a"]  # listed, grey
    assert peers.gone(time.time() + FORGET_AFTER_S + 1) == 1  # and gone once the horizon passes
