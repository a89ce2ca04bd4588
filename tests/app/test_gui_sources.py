"""Where training came from (own questions / peers' questions / peers' answers) on the dashboard, and
the trainer's verdicts on peers' groups in the shared-rollouts feed: real widgets, a real store."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.models import AppModel
from app.models.dashboard import DashboardModel
from app.models.feed import FeedModel
from app.models.peers import PeersModel
from app.models.sources import SourceTally
from app.views.dashboard import DashboardView
from app.views.rollouts import RolloutsView
from engine.events import RolloutSeen, RoundCompleted
from engine.store import Store


def _sources(own: int, own_mixed: int, suggested: int = 0, suggested_mixed: int = 0, peer: int = 0,
             seconds: tuple[float, float, float] = (1.0, 0.0, 0.0)) -> dict[str, float]:
    return {"own_pick_groups": own, "own_pick_mixed": own_mixed, "suggested_groups": suggested,
            "suggested_mixed": suggested_mixed, "peer_text_groups": peer, "peer_text_mixed": peer,
            "seconds_own_pick": seconds[0], "seconds_suggested": seconds[1], "seconds_peer_text": seconds[2]}


def _round(n: int, **metrics: float) -> RoundCompleted:
    return RoundCompleted(round=n, policy_version=n, metrics={"reward_mean": 0.5, **metrics},
                          per_specialty_reward={}, phase_seconds={"generate": 1.0}, num_local=2, num_external=0)


def test_the_tally_keeps_the_newest_rounds_and_skips_rounds_without_sources() -> None:
    tally = SourceTally(window=2)
    assert tally.apply(5, _sources(2, 1, seconds=(3.0, 0.0, 0.0)))
    assert tally.apply(6, _sources(1, 1, suggested=1, suggested_mixed=1, peer=2, seconds=(1.0, 1.0, 2.0)))
    assert not tally.apply(4, _sources(9, 9))  # history older than the window arriving late
    assert not tally.apply(7, {"reward_mean": 0.5})  # an engine that does not report sources
    rows = {r.source: r for r in tally.rows()}
    assert (rows["own_pick"].groups, rows["own_pick"].mixed, rows["own_pick"].share) == (3, 2, 4 / 7)
    assert (rows["suggested"].groups, rows["peer_text"].mixed, rows["peer_text"].share) == (1, 2, 2 / 7)
    assert rows["own_pick"].label == "your own questions" and rows["peer_text"].label == "peers' answers"
    assert tally.apply(8, _sources(1, 0)) and tally.rounds == 2  # round 5 leaves the window


def test_the_dashboard_says_where_training_came_from(qtbot: QtBot) -> None:
    model = DashboardModel(window=20)
    view = DashboardView(model)
    qtbot.addWidget(view)
    view.resize(1100, 760)
    view.show()
    view.refresh(full=True)
    card = view.sources
    assert [label.text() for label in card.values["own_pick"]] == ["–", "–", "–"]
    plots_before = view.plots.geometry()
    model.apply_round(_round(1, **_sources(2, 1, peer=2, seconds=(3.0, 0.0, 1.0))))
    model.apply_round(_round(2, **_sources(1, 0, suggested=1, suggested_mixed=1, peer=2, seconds=(2.0, 2.0, 2.0))))
    view.refresh(full=True)
    qtbot.wait(10)
    assert view.plots.geometry() == plots_before  # numbers arriving relayout no plot
    assert "the last 2 rounds" in card.title.text()
    assert [label.text() for label in card.values["own_pick"]] == ["3", "1 (33%)", "50%"]
    assert [label.text() for label in card.values["suggested"]] == ["1", "1 (100%)", "20%"]
    assert [label.text() for label in card.values["peer_text"]] == ["4", "4 (100%)", "30%"]
    assert card.bar.shares == pytest.approx({"own_pick": 0.5, "suggested": 0.2, "peer_text": 0.3})
    assert card.bar.grab().width() > 0


def test_history_from_a_real_store_fills_the_card_and_keeps_the_phases_apart(tmp_path: Path) -> None:
    with Store(tmp_path / "node.db") as store:
        for n in range(1, 4):
            store.record_round(n, n, {"reward_mean": 0.2, **_sources(2, n % 2, peer=1, seconds=(2.0, 0.0, 1.0))},
                               {}, {"generate": 2.5, "update": 0.5, "total": 3.0}, 2, 1, ts=100.0 + n)
        rows = store.rounds()
    model = AppModel()
    model.load_history({"rounds": rows})
    assert model.bad_history_rows == 0
    assert set(model.dashboard.phases) == {"generate", "update", "total"}  # seconds per source are no phase
    own, _, peer = model.dashboard.sources.rows()
    assert (own.groups, own.mixed, peer.groups, peer.mixed) == (6, 2, 3, 3)
    assert abs(own.share - 2 / 3) < 1e-9


def _seen(question: str, status: str, reason: str = "") -> RolloutSeen:
    return RolloutSeen(origin_peer="p" * 43, peer_name="amber-otter", specialty="basic_arithmetic",
                       question=question, completion="<answer>7</answer>", reward=0.0, status=status, reason=reason)


def test_the_feed_shows_the_trainers_verdicts_in_words(qtbot: QtBot) -> None:
    feed = FeedModel()
    view = RolloutsView(feed, PeersModel())
    qtbot.addWidget(view)
    for event in (_seen("q1", "pooled"), _seen("q2", "pooled"), _seen("q3", "pooled"),
                  _seen("q1", "skipped", "zero_advantage"), _seen("q2", "skipped", "not_sampled"),
                  _seen("q3", "skipped", "repeated_text")):
        feed.apply(event)
    view.refresh()
    table = view.table_model
    status = {table.row_at(i).seen.question: table.data(table.index(i, 5)) for i in range(table.rowCount())}
    assert status["q1"] == "skipped: no learning signal (all answers right or all wrong)"
    assert status["q2"] == "waiting: not drawn this round"
    assert status["q3"].startswith("skipped: its answers repeat words")
    assert (len(feed.rows), feed.waiting, feed.pooled) == (3, 3, 0)
    text = view.counters.text()
    assert "<b>waiting in pool</b> 3" in text and "no learning signal" in text and "not drawn" not in text
    feed.apply(_seen("q2", "used"))  # drawn the round after
    feed.apply(_seen("q1", "dropped", "expired"))  # left the pool unused
    view.refresh()
    assert (feed.waiting, feed.skipped, feed.dropped) == (1, {"repeated_text": 1}, {"expired": 1})
    status = {table.row_at(i).seen.question: table.data(table.index(i, 5)) for i in range(table.rowCount())}
    assert status == {"q1": "dropped: waited too long in the pool", "q2": "used in training",
                      "q3": status["q3"]}
