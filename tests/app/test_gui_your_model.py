"""The dashboard's "Your model" headline and what it stands on: evals against the baseline with the
training time between them, totals from the store after a restart (not the window of rounds loaded),
one model's rounds at a time, and specialty colours that do not depend on arrival order. Real widgets
offscreen, a real SQLite store, a real node and engine on a tiny model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import EngineThread
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.bridge import EngineBridge
from app.models import AppModel
from app.models.dashboard import DashboardModel
from app.models.your_model import duration, headline
from app.theme import PLOT_COLORS
from app.views.dashboard import DashboardView, series_color
from app.views.main_window import MainWindow
from engine.control.token import read_token
from engine.events import EvalCompleted, RoundCompleted
from engine.node import Node, NodeConfig
from engine.sapo.config import preset
from engine.store import Store
from engine.tasks.specialties import SPECIALTIES

WAIT_MS = 20_000
SMOL = "smollm2-135m-instruct-q4_1"


def _round(n: int, model: str = SMOL, reward: float = 0.25, seconds: float = 30.0, **metrics: float) -> RoundCompleted:
    return RoundCompleted(round=n, policy_version=n, metrics={"reward_mean": reward, **metrics},
                          per_specialty_reward={"basic_arithmetic": reward}, phase_seconds={"total": seconds},
                          num_local=2, num_external=0, model=model)


def _eval(n: int, pass1: float, model: str = SMOL) -> EvalCompleted:
    return EvalCompleted(round=n, pass1=pass1, passk=min(1.0, 2 * pass1), k=4, per_specialty={}, model=model)


def test_the_headline_in_words_from_no_check_to_up_from_the_baseline() -> None:
    model = DashboardModel()
    assert headline(model).text == "Your model is checked on held-out questions before it starts training: " \
                                   "that is where it starts from."
    assert headline(model, 0, 0.0).text == "Your model: held-out checks are off in this node's settings."
    model.apply_eval(_eval(0, 0.06))  # the baseline, before round 1
    assert headline(model, 0, 1800.0) == headline(model, 0, 1800.0)
    line = headline(model, 0, 1800.0)
    assert line.text == "Your SmolLM2-135M-Instruct solves 6% of held-out questions (before training)."
    assert line.detail == "Checked on held-out questions every 30 min of training."
    for n in range(1, 241):  # two hours of 30 s rounds
        model.apply_round(_round(n, eval_due_in_s=max(0.0, 7200.0 - 30 * n)))
    assert headline(model).detail == "Checking it on held-out questions now…"
    model.apply_eval(_eval(240, 0.29))
    model.apply_round(_round(241, eval_due_in_s=1770.0))
    line = headline(model, 0, 1800.0)
    assert line.text == ("Your SmolLM2-135M-Instruct solves 29% of held-out questions, up from 6% when you started "
                         "· 2.0 h of training")
    assert line.trend == "up" and line.detail == "Next check in ~30 min of training."
    model.apply_eval(_eval(300, 0.02))
    assert "down from 6% when you started" in headline(model).text and headline(model).trend == "down"
    seed = DashboardModel()
    seed.apply_eval(_eval(0, 0.1, model="seed"))
    assert headline(seed).text.startswith("Your seed model solves 10%")
    assert [duration(s) for s in (5, 89, 600, 5400, 36_000 * 1.5)] == ["5 s", "89 s", "10 min", "1.5 h", "15 h"]


def test_a_model_that_trained_before_its_baseline_existed_gets_a_first_check_in_time() -> None:
    model = DashboardModel()
    model.apply_round(_round(7, eval_due_in_s=1500.0))  # rounds, no eval yet (trained before this release)
    assert headline(model, 0, 1800.0).text == \
        "Your SmolLM2-135M-Instruct: first check on held-out questions in ~25 min of training."
    model.apply_eval(_eval(60, 0.1))
    model.apply_eval(_eval(120, 0.1))
    assert "the same as at round 60" in headline(model).text


def test_a_restart_loads_totals_from_the_store_not_the_window_of_rounds(tmp_path: Path, tiny_model: Path) -> None:
    """3,647 rounds in the store, 2,000 sent: the rounds card and the cumulative reward count all of them."""
    rewards = np.random.default_rng(0).random(3647) * 0.3
    model = tiny_model.name  # the node's model, as the store keys it
    with Store(tmp_path / "node.db") as store:
        for n in range(1, 101):  # another model trained before: its rounds are not this model's
            store.record_round(n, n, {"reward_mean": 0.9}, {}, {"total": 1.0}, 2, 0, model="seed")
        store.record_eval(0, 0, {"k": 4, "overall": {"pass1": 0.06, "passk": 0.1}}, model=model)
        for n, reward in enumerate(rewards, start=1):
            store.record_round(n, n, {"reward_mean": float(reward)}, {"basic_arithmetic": float(reward)},
                               {"total": 2.0}, 2, 0, model=model)
        store.record_eval(3647, 3647, {"k": 4, "overall": {"pass1": 0.29, "passk": 0.5}}, model=model)
    sapo = preset("cpu-small").replace(num_local=2, completions=4, eval_every=0)
    node = Node(NodeConfig(data_dir=tmp_path, model=str(tiny_model), sapo=sapo, solo=True))
    history = node.history()  # what the control API's `history` replies
    node.store.close()
    assert len(history["rounds"]) == 2000 and {r["model"] for r in history["rounds"]} == {model}
    app = AppModel()
    app.load_history(history)
    dash = app.dashboard
    assert dash.model == model and dash.rounds == 3647 and app.node.round == 3647
    assert dash.latest("cumulative") == pytest.approx(float(rewards.sum()))
    assert dash.series["reward"].x[0] == 1648  # the window: its own round numbers, from the model's round 1
    assert headline(dash).text.endswith("up from 6% when you started · 2.0 h of training")  # 3,647 x 2 s
    dash.apply_round(_round(3648, model=model, reward=0.5))  # training goes on from the totals
    assert dash.rounds == 3648 and dash.latest("cumulative") == pytest.approx(float(rewards.sum()) + 0.5)


def test_a_switched_model_starts_its_own_charts_and_asks_for_its_record(qtbot: QtBot) -> None:
    app = AppModel()
    view = DashboardView(app.dashboard)
    qtbot.addWidget(view)
    for n in range(1, 6):
        app.apply(_round(n, model="seed", reward=0.5))
    app.apply(_eval(5, 0.2, model="seed"))
    view.refresh(full=True)
    rings = dict(app.dashboard.series)
    app.apply(_eval(0, 0.05))  # the new model's baseline comes first
    dash = app.dashboard
    assert dash.model == SMOL and dash.wants_history == SMOL and dash.rounds == 0
    assert len(dash.series["reward"]) == 0 and dash.eval_pass1 == {0: 0.05}
    assert all(dash.series[name] is ring for name, ring in rings.items())  # cleared in place: curves stay bound
    app.apply(_round(1))
    app.apply(_round(2))
    view.refresh(full=True)
    assert list(dash.series["reward"].x) == [1.0, 2.0] and view.cards["rounds"].text() == "2"
    assert app.node.round == 2 and app.node.round_model == SMOL  # the header follows the new model's count
    assert view._curves[0].item.getData()[0].tolist() == [1.0, 2.0]
    assert "before training" in view.your_model.text.text()
    app.load_history({"rounds": [], "evals": [], "totals": {"model": SMOL, "rounds": 2, "reward_sum": 0.5,
                                                             "seconds": 60.0, "last_round": 2}})
    assert dash.wants_history is None and dash.rounds == 2


def test_a_switch_shows_the_selected_models_own_record_before_it_trains() -> None:
    """Switched while stopped: no round of the new model arrives until Join, so the switch itself asks
    for the record, and the reply (the node's selected model's) starts the charts over: empty for a
    model new here, the old record for a model switched back to."""
    from engine.events import ModelProgress

    app = AppModel()
    for n in range(1, 4):
        app.apply(_round(n, reward=0.5))
    dash = app.dashboard
    app.apply(ModelProgress(model_id="seed", phase="ready", done=1, total=1, message="seed: the next round trains it"))
    assert dash.wants_history == "seed" and dash.model == SMOL  # asked; nothing shown changes until the reply
    app.load_history({"rounds": [], "evals": [], "totals": None, "model": "seed"})
    assert dash.model == "seed" and dash.rounds == 0 and len(dash.series["reward"]) == 0 and dash.wants_history is None
    app.apply(ModelProgress(model_id=SMOL, phase="ready", done=1, total=1, message="back"))
    app.load_history({"rounds": [_round(n, reward=0.5).to_dict() for n in range(1, 4)], "evals": [], "model": SMOL,
                      "totals": {"model": SMOL, "rounds": 3, "reward_sum": 1.5, "seconds": 90.0, "last_round": 3}})
    assert dash.model == SMOL and dash.rounds == 3 and list(dash.series["reward"].x) == [1.0, 2.0, 3.0]
    assert dash.latest("cumulative") == pytest.approx(1.5)


def test_specialty_colours_do_not_depend_on_the_order_they_arrive_in(qtbot: QtBot) -> None:
    views = []
    for order in (list(SPECIALTIES[:4]), list(reversed(SPECIALTIES[:4])) + ["not_a_task_yet"]):
        model = DashboardModel()
        model.apply_round(RoundCompleted(round=1, policy_version=1, metrics={"reward_mean": 0.5},
                                         per_specialty_reward={name: 0.5 for name in order},
                                         phase_seconds={"update": 1.0, "generate": 2.0}, num_local=2, num_external=0))
        view = DashboardView(model)
        qtbot.addWidget(view)
        view.refresh(full=True)
        views.append(view)
    first, second = ({n: c.color for n, c in v._specialty_curves.items()} for v in views)
    assert {n: second[n] for n in first} == first
    assert first[SPECIALTIES[3]] == PLOT_COLORS[3] and second["not_a_task_yet"] == series_color("not_a_task_yet", SPECIALTIES)
    assert views[0]._phase_curves["update"].color == views[1]._phase_curves["update"].color == PLOT_COLORS[3]


def test_the_headline_on_the_dashboard_of_a_real_engine(qtbot: QtBot, engine: EngineThread, tmp_path: Path) -> None:
    """Join: the baseline check comes before round 1, the next after round 4 (eval every 4 rounds); the
    card compares them, and the store keeps the baseline at round 0."""
    bridge = EngineBridge(engine.url, lambda: read_token(engine.data_dir), reconnect_s=0.1)
    window = MainWindow(bridge, refresh_ms=50, use_tray=False)
    qtbot.addWidget(window)
    bridge.start()
    window.show()
    try:
        qtbot.waitUntil(lambda: window.model.node.connected, timeout=WAIT_MS)
        card = window.dashboard.your_model
        assert "before it starts training" in card.text.text()
        qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: "when you started" in card.text.text(), timeout=WAIT_MS)
        assert card.text.text().startswith("Your tiny-a solves 0% of held-out questions, the same as when you started")
        assert window.model.node.eval_every == 4
        qtbot.waitUntil(lambda: card.detail.text() == "Next check within a minute of training.", timeout=WAIT_MS)

        async def evals() -> list[int]:
            return [e["round"] for e in engine.node.store.evals()]
        assert engine.run(evals())[:2] == [0, 4]
        assert window.dashboard.grab().save(str(tmp_path / "dashboard.png"))  # drawn, not only laid out
    finally:
        window.shutdown()
