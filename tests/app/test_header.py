"""The header says what is being trained, in words, and a long model name never widens the window."""

from __future__ import annotations

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.models.node import NodeModel
from app.views.header import MAX_STAT_WIDTH, Header
from engine.control.status import NodeStatus
from engine.models.catalog import about, short_name


def _shown(qtbot: QtBot, model: str) -> Header:
    header = Header()
    qtbot.addWidget(header)
    node = NodeModel()
    node.connect("ws://127.0.0.1:1", NodeStatus(state="solo", model=model, model_name=short_name(model),
                                                model_about=about(model)))
    header.show_node(node, busy=False)
    header.show()
    return header


def test_the_header_says_what_the_model_is(qtbot: QtBot) -> None:
    header = _shown(qtbot, "smollm2-135m-instruct-q4_1")
    assert header.model_line.isVisible()
    assert header.model_line.text().startswith("SmolLM2-135M-Instruct, a pretrained language model of 135M")
    stat = header.stats["model"]  # the name a contributor knows, elided only if the stat's font needs it
    assert stat.text() == stat.fontMetrics().elidedText("SmolLM2-135M-Instruct", Qt.TextElideMode.ElideMiddle,
                                                        MAX_STAT_WIDTH - 8)
    seed = _shown(qtbot, "seed")
    assert "seed model" in seed.model_line.text() and "Machine tab" in seed.model_line.text()


def test_a_long_model_name_does_not_widen_the_header(qtbot: QtBot) -> None:
    short = _shown(qtbot, "seed")
    long = _shown(qtbot, "/home/someone/models/" + "a-very-long-fine-tuned-model-name-" * 4)
    stat = long.stats["model"]
    assert stat.fontMetrics().horizontalAdvance(stat.text()) <= MAX_STAT_WIDTH
    assert "…" in stat.text() and stat.toolTip().endswith("model-name-")  # the whole name on hover
    assert stat.sizeHint().width() <= MAX_STAT_WIDTH and long.minimumSizeHint().width() == short.minimumSizeHint().width()


def test_a_long_phase_does_not_widen_the_header(qtbot: QtBot) -> None:
    """Measured under Xvfb (bench/walkthrough.md): the header's phase line took the window from 1,280 to
    1,586 px at Join, cutting off the Leave button. The same header with a long phase line is no wider
    than with a short one."""
    from engine.events import WorkProgress

    def joining(detail: str) -> Header:
        header = _shown(qtbot, "smollm2-135m-instruct-q4_1")
        node = NodeModel()
        node.connect("ws://127.0.0.1:1", NodeStatus(state="joining", model="smollm2-135m-instruct-q4_1",
                                                    model_name="SmolLM2-135M-Instruct"))
        node.apply_work(WorkProgress(phase="loading_model", round=0, done=0, total=0, detail=detail))
        header.show_node(node, busy=False)
        header.layout().activate()  # the size hints follow the new text now, not at the next event loop turn
        return header

    short = joining("x")
    long = joining("SmolLM2-135M-Instruct (a minute or two on a real model's first start)")
    assert "Loading SmolLM2" in long.state_detail.text() and long.pause_button.isVisible()
    assert long.minimumSizeHint().width() <= short.minimumSizeHint().width() + 10, (
        long.minimumSizeHint().width(), short.minimumSizeHint().width())
    assert long.subtitle.text()  # before a model loads, the line under the name is not empty


def test_a_malformed_contribution_shows_nothing_rather_than_nonsense() -> None:
    from app.models.node import parse_contribution
    from app.views.giving import giving_rows

    good = {"train_hours": 2.0, "cpu_hours": 1.5, "rounds": 700, "cpu_share_last_round": 0.48,
            "energy_wh": 12.0, "energy_measured": False, "memory_bytes": 2 ** 31}
    rows = giving_rows(parse_contribution(good))
    assert rows["Training time"] == "2.0 h over 700 rounds" and rows["CPU time"] == "1.5 h"
    assert rows["Energy"].startswith("12.0 Wh (estimated") and rows["Memory held now"] == "2.00 GiB"
    assert rows["Share of this machine"] == "48% of its CPU in the last round"
    for junk in (None, [], good | {"rounds": "700"}, good | {"energy_wh": float("nan")},
                 good | {"cpu_hours": -1}, good | {"memory_bytes": True}):
        assert parse_contribution(junk) == {}
    assert set(giving_rows({}).values()) == {"–"}
    assert parse_contribution(good | {"energy_measured": "yes"})["energy_measured"] is False
    given = parse_contribution(good | {"watts_training": 9.6, "groups_peers_trained": 40,
                                       "wh_per_group_peers_trained": 0.3})
    assert giving_rows(given)["Energy"].startswith("12.0 Wh, 10 W while training, 0.30 Wh per group peers "
                                                   "trained on (40 groups) (estimated")
    assert parse_contribution(good | {"watts_training": float("nan")})["watts_training"] == 0.0  # dropped, not shown


def test_the_header_says_what_the_engine_is_doing_and_for_how_long(qtbot: QtBot) -> None:
    from engine.events import StateChanged, WorkProgress

    header = _shown(qtbot, "seed")
    node = NodeModel()
    node.connected = True
    node.apply_state(StateChanged(state="joining"))
    node.apply_work(WorkProgress(phase="loading_model", detail="SmolLM2-135M-Instruct", ts=100.0))
    assert node.activity(now=112.4) == "Loading SmolLM2-135M-Instruct · 12 s"
    node.apply_work(WorkProgress(phase="generating", round=413, total=32, detail="2 questions x 16 answers", ts=200.0))
    assert node.activity(now=203.0) == "Round 413: writing 32 answers (2 questions x 16 answers) · 3 s"
    node.apply_work(WorkProgress(phase="evaluating", round=413, done=0, total=128, ts=300.0))
    node.apply_work(WorkProgress(phase="evaluating", round=413, done=16, total=128, ts=340.0))
    # timed from the phase's start, not the last question's; what is left at the pace so far
    assert node.activity(now=360.0) == "Checking held-out questions: 16 of 128 · 60 s, about 7 min left"
    node.apply_work(WorkProgress(phase="evaluating", round=0, done=3, total=96, ts=400.0))
    assert node.activity(now=430.0) == ("Checking where your model starts: 3 of 96 held-out questions · 30 s, "
                                        "about 16 min left")
    header.show_node(node, busy=False)
    assert header.state_detail.text().startswith("Checking where your model starts")
    node.apply_state(StateChanged(state="paused", detail="on battery"))
    header.show_node(node, busy=False)
    assert node.activity() == "" and header.state_detail.text() == "on battery"  # why it waits, not old work


def test_the_header_says_which_swarm_this_is(qtbot: QtBot) -> None:
    from app.models.peers import parse_swarm, swarm_where

    board = {"links": 0, "board": {"connected": True, "urls": ["nats://boot.example.org:7701"], "nodes_on_board": 42}}
    assert swarm_where(parse_swarm(board), "in_swarm") == "swarm of boot.example.org · 42 nodes on its board"
    assert swarm_where(parse_swarm({"links": 1, "known_peers": 1}), "in_swarm") == "LAN swarm · 1 link"
    assert swarm_where(parse_swarm({}), "solo") == "training alone"
    assert swarm_where(parse_swarm(board), "stopped") == ""
    header = _shown(qtbot, "seed")
    node = NodeModel()
    node.connected, node.peer_name, node.device = True, "solar-toucan", "cpu"
    header.show_node(node, busy=False, swarm=swarm_where(parse_swarm(board), "in_swarm"))
    assert header.subtitle.text() == "solar-toucan · CPU · swarm of boot.example.org · 42 nodes on its board"
