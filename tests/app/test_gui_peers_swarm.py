"""The Peers tab's "Refused by the swarm" line, fed a `status` reply through the window's own
paths (the link-up snapshot and a status refresh), with real widgets and a stand-in bridge."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytestqt.qtbot import QtBot

from app.bridge import LinkChange
from app.models.peers import FRAME_REASON_WORDS, parse_swarm
from app.views.main_window import MainWindow
from engine.control.protocol import ControlProtocolError, status_from_wire
from engine.control.status import NodeStatus
from engine.swarm.errors import REASONS

SWARM = {"frames_accepted": 500, "frames_refused": {"bad_signature": 3, "replay": 1},
         "groups_received": 120, "groups_pooled": 80, "groups_used": 40,
         "groups_dropped": {"forged_ref": 2, "oversized": 1, "duplicate": 4, "zero_advantage": 0},
         "links": 2, "known_peers": 3}


class FakeBridge:
    """What MainWindow uses of EngineBridge: an inbox and calls answered at once with `status`."""

    url = "http://127.0.0.1:1"

    def __init__(self, status: dict[str, Any]) -> None:
        self.status = status
        self.inbox: list[Any] = []

    def take(self, max_items: int = 1_000_000) -> list[Any]:
        items, self.inbox = self.inbox[:max_items], self.inbox[max_items:]
        return items

    def call(self, method: str, params: Any, reply: Callable[[Any, str | None], None]) -> None:
        if method != "status":
            reply(None, None)
            return
        try:  # as the real bridge answers: the control client's parse, or its error
            reply(status_from_wire(self.status), None)
        except ControlProtocolError as exc:
            reply(None, str(exc))

    def call_at_exit(self, method: str, timeout_s: float = 2.0) -> str | None:
        return None

    def stop(self) -> None:
        pass


def _parsed(status: dict[str, Any]) -> NodeStatus:
    """A link-up snapshot's status, as the bridge hands it over: parsed by the control client."""
    return status_from_wire(status)


def _window(qtbot: QtBot, status: dict[str, Any]) -> tuple[MainWindow, FakeBridge]:
    bridge = FakeBridge(status)
    win = MainWindow(bridge, refresh_ms=20, use_tray=False)  # type: ignore[arg-type]
    qtbot.addWidget(win)
    win.timer.stop()  # ticks driven by hand
    win.show()
    win.tabs.setCurrentWidget(win.peers)
    return win, bridge


def test_refusals_reach_the_peers_tab(qtbot: QtBot) -> None:
    win, bridge = _window(qtbot, {"state": "in_swarm", "swarm": SWARM})
    bridge.inbox.append(LinkChange(up=True, snapshot={"status": _parsed({"state": "in_swarm", "swarm": SWARM})}))
    win.tick()
    label = win.peers.refused
    assert label.isVisible()
    # reasons in words; a code this app does not know ("replay") as it came
    assert label.text() == ("Refused by the swarm: messages refused: bad signature 3 · replay 1 — groups dropped: "
                            "same content as a group already received 4 · the question "
                            "does not match its reference 2 · an answer longer than this model could write 1 "
                            "(since the engine started: received 120, pooled 80, used 40)")
    # a later status poll (the Peers tab asks while shown) with everything at zero
    bridge.status = {"swarm": {**SWARM, "frames_refused": {"replay": 0}, "groups_dropped": {}}}
    win._swarm_polled = 0.0
    win.tick()
    win.tick()  # the poll is answered after this tick drew; the next one draws it
    assert label.text() == ("Refused by the swarm: nothing refused (since the engine started: received 120, "
                            "pooled 80, used 40)")
    # solo: {} hides it
    bridge.status = {"swarm": {}}
    win._swarm_polled = 0.0
    win.tick()
    win.tick()  # the poll is answered after this tick drew; the next one draws it
    assert not label.isVisible() and win.model.peers.swarm is None


def test_every_refusal_reason_is_said_in_words() -> None:
    assert set(FRAME_REASON_WORDS) == set(REASONS)


def test_garbage_swarm_values_are_dropped_not_raised(qtbot: QtBot) -> None:
    garbage = {"frames_accepted": "lots", "frames_refused": {"bad_signature": -1, "replay": True, 7: 2,
                                                            "<b>x</b>": 5, "ok": 2.5, "x" * 100: 1},
               "groups_received": -4, "groups_pooled": None, "groups_used": 9,
               "groups_dropped": ["forged_ref", 2], "links": 1.5, "known_peers": {}}
    win, bridge = _window(qtbot, {"swarm": garbage})
    bridge.inbox.append(LinkChange(up=True, snapshot={"status": _parsed({"state": "solo", "swarm": garbage})}))
    win.tick()
    swarm = win.model.peers.swarm
    assert swarm is not None and swarm.frames_refused == {"<b>x</b>": 5} and swarm.groups_dropped == {}
    assert (swarm.frames_accepted, swarm.groups_received, swarm.groups_used, swarm.links) == (0, 0, 9, 0)
    assert win.peers.refused.text() == ("Refused by the swarm: messages refused: <b>x</b> 5 — groups dropped: none "
                                        "(since the engine started: received 0, pooled 0, used 9)")  # plain text
    for bad in (None, [], "swarm", 3, {}):
        assert parse_swarm(bad) is None
    shown = win.peers.refused.text()
    bridge.status = {"swarm": "nonsense"}  # a malformed reply is refused whole: the last good view stays
    win._swarm_polled = 0.0
    win.tick()
    win.tick()  # the poll is answered after this tick drew; the next one draws it
    assert win.peers.refused.text() == shown


def test_the_board_line_says_where_how_many_and_until_when(qtbot: QtBot) -> None:
    import time

    expires = time.time() + 1800
    board = {"connected": True, "urls": ["nats://boot.example:7701"], "nodes_on_board": 12,
             "credential_expires_at": expires, "frames_used": 40}
    win, bridge = _window(qtbot, {"swarm": {**SWARM, "board": board}})
    bridge.inbox.append(LinkChange(up=True, snapshot={"status": _parsed({"state": "in_swarm",
                                                                  "swarm": {**SWARM, "board": board}})}))
    win.tick()
    when = time.strftime("%H:%M", time.localtime(expires))
    assert win.peers.board.isVisible()
    assert win.peers.board.text() == (f"Board: nats://boot.example:7701 · 12 nodes on it · 40 peers' frames fetched"
                                      f" · may write until {when} (renewed by the bootstrap)")
    # expired, then a swarm without a board, then garbage in the board value
    bridge.status = {"swarm": {**SWARM, "board": {**board, "credential_expires_at": time.time() - 60}}}
    win._swarm_polled = 0.0
    win.tick()
    win.tick()
    assert "credential expired at" in win.peers.board.text()
    for value in ({}, None, {"urls": "nats://x", "nodes_on_board": -3}, {"connected": "yes", "urls": [7]}):
        bridge.status = {"swarm": {**SWARM, "board": value}}
        win._swarm_polled = 0.0
        win.tick()
        win.tick()
        assert win.peers.board.text().startswith("Board:")
    bridge.status = {"swarm": {**SWARM}}
    win._swarm_polled = 0.0
    win.tick()
    win.tick()
    assert win.peers.board.text() == "Board: none (LAN links and relays only)"


def test_each_peers_trust_is_a_column_and_low_trust_stands_out(qtbot: QtBot) -> None:
    import time

    from engine.events import PeerUpdated

    reputation = [{"peer": "honest-id", "score": 0.97, "groups": 120}, {"peer": "poison-id", "score": 0.08, "groups": 40},
                  {"peer": "x", "score": 7.0, "groups": 1}, {"peer": "y", "score": 0.5, "groups": -1}, "junk"]
    status = {"state": "in_swarm", "swarm": {**SWARM, "reputation": reputation}}
    win, bridge = _window(qtbot, status)
    now = time.time()
    for i, (peer, name) in enumerate((("honest-id", "calm-otter"), ("poison-id", "loud-crow"), ("new-id", "shy-fox"))):
        bridge.inbox.append(PeerUpdated(peer_id=peer, name=name, model="seed", found_by="bootstrap", address="",
                                        connected=True, ts=now - i))
    bridge.inbox.append(LinkChange(up=True, snapshot={"status": _parsed(status)}))
    win.tick()
    assert win.model.peers.swarm is not None and set(win.model.peers.swarm.reputation) == {"honest-id", "poison-id"}
    table = win.peers.table
    trust = {table.item(r, 1).text(): table.item(r, 8) for r in range(table.rowCount())}
    assert {name: item.text() for name, item in trust.items()} == {"calm-otter": "97%", "loud-crow": "8%",
                                                                   "shy-fox": "–"}
    assert trust["loud-crow"].foreground().color().name() == "#dc2626"
    assert "Judged on 40 rollouts" in trust["loud-crow"].toolTip()
    assert "No rollouts judged yet" in trust["shy-fox"].toolTip()


def test_the_credit_line_and_plot_show_what_peers_did_with_our_groups(qtbot: QtBot) -> None:
    import time

    from app.models.peers import parse_credit

    hour = int(time.time() // 3600) * 3600
    receipts = {"shared": 120, "used": 30, "uses": 45, "gradient_uses": 28, "peers": 3,
                "hourly": [[hour - 7200, 20], [hour, 25]],
                "ignored": {}, "sent": 9}
    win, bridge = _window(qtbot, {"swarm": {**SWARM, "receipts": receipts}})
    bridge.inbox.append(LinkChange(up=True, snapshot={"status": _parsed({"state": "in_swarm",
                                                                  "swarm": {**SWARM, "receipts": receipts}})}))
    win.tick()
    assert win.peers.credit.isVisible() and win.peers.credit_plot.isVisible()
    assert win.peers.credit.text() == ("Your work: 120 groups shared; peers trained on 30 of them "
                                       "(45 times, by 3 peers); 28 of those updates learned from your group "
                                       "(in the others the peer's answers to it were all right or all wrong).")
    assert list(win.peers.credit_bars.opts["height"]) == [20, 25]
    bridge.status = {"swarm": {**SWARM, "receipts": {**receipts, "uses": 0, "used": 0, "hourly": []}}}
    win._swarm_polled = 0.0
    win.tick()
    win.tick()
    assert win.peers.credit.text() == "Your work: 120 groups shared; no peer has said it trained on one yet."
    assert not win.peers.credit_plot.isVisible()
    for bad in (None, [], {"shared": -1, "used": 0, "uses": 0, "peers": 0}, {"shared": 1},
                {"shared": True, "used": 0, "uses": 0, "peers": 0}):
        assert parse_credit(bad) is None
    odd = parse_credit({"shared": 1, "used": 1, "uses": 1, "peers": 1,
                        "hourly": [[hour, 1], ["x", 2], [hour, -1], [1e12, 3], [hour, 2, 3]]})
    assert odd is not None and odd.hourly == ((float(hour), 1),)
