"""The curriculum rungs and the answer-format warm-up on the dashboard: model, history, real widgets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel
from pytestqt.qtbot import QtBot

from app.models import AppModel
from app.models.dashboard import DashboardModel
from app.models.history import clean_rungs, parse_history
from app.theme import task_name
from app.views.dashboard import DashboardView
from engine.events import RoundCompleted
from engine.store import Store


def _round(n: int, rungs: dict[str, int] | None = None, **metrics: float) -> RoundCompleted:
    return RoundCompleted(round=n, policy_version=n, metrics={"reward_mean": 0.25, **metrics},
                          per_specialty_reward={"basic_arithmetic": 0.25}, phase_seconds={"generate": 0.5},
                          num_local=2, num_external=0, rungs=rungs or {})


Dashboard = tuple[DashboardModel, DashboardView]


@pytest.fixture
def dashboard(qtbot: QtBot) -> Dashboard:
    """The dashboard's model and its view, shown."""
    model = DashboardModel()
    view = DashboardView(model)
    qtbot.addWidget(view)
    view.show()
    return model, view


def test_model_keeps_the_latest_rungs_and_the_format_series() -> None:
    model = DashboardModel()
    assert model.rungs == {} and not model.curriculum_active
    model.apply_round(_round(1, {"basic_arithmetic": 0, "base_conversion": 0}, format_rate=0.25, format_weight=0.5))
    model.apply_round(_round(2, {"basic_arithmetic": 1, "base_conversion": -1}, format_rate=0.75,
                             format_weight=0.4))  # a negative rung is not a rung: the old one stays
    assert model.curriculum_active
    assert model.rungs == {"basic_arithmetic": 1, "base_conversion": 0}
    np.testing.assert_allclose(model.series["format_rate"].x, [1, 2])
    np.testing.assert_allclose(model.series["format_rate"].y, [0.25, 0.75])
    np.testing.assert_allclose(model.series["format_weight"].y, [0.5, 0.4])
    np.testing.assert_allclose(model.series["reward"].y, [0.25, 0.25])  # the correctness reward is apart
    # a fraction outside 0..1 is a bad metric, not a point; an absent one adds nothing
    model.apply_round(_round(3, {"basic_arithmetic": 2}, format_rate=1.5, format_weight=0.0))
    model.apply_round(_round(4, {"basic_arithmetic": 2}))
    assert model.latest("format_rate") == 0.75 and len(model.series["format_rate"]) == 2
    np.testing.assert_allclose(model.series["format_weight"].y, [0.5, 0.4, 0.0])
    # history replayed after live rounds: an older round's rungs do not win
    model.load([_round(0, {"basic_arithmetic": 5})])
    assert model.rungs["basic_arithmetic"] == 2 and model.rounds == 5
    # the node restarted without the curriculum
    model.apply_round(_round(5, format_rate=1.0, format_weight=0.0))
    assert not model.curriculum_active


def test_clean_rungs_drops_what_is_not_a_rung() -> None:
    assert clean_rungs({"a": 1, "b": -1, "c": 1.0, "d": True, "e": "2", 3: 4, "": 1, "x" * 300: 1}) == {"a": 1}
    assert clean_rungs('{"a": 2}') == {"a": 2}  # JSON text, as a store may keep it
    for garbage in (None, 7, "rung 2", "{not json", "[1, 2]", [["a", 1]], float("nan")):
        assert clean_rungs(garbage) == {}
    assert len(clean_rungs({f"s{i}": i for i in range(1000)})) == 64


def test_history_rows_with_garbage_rungs_keep_the_round_and_drop_the_rungs() -> None:
    typed = _round(3, {"basic_arithmetic": 2}, format_rate=0.5).to_dict()
    typed_bad = {**_round(4).to_dict(), "rungs": {"basic_arithmetic": "high", "base_conversion": 1}}
    history = {"rounds": [
        {"round": 1, "reward_mean": 0.1, "format_rate": 0.2, "format_weight": 0.5, "rungs": "garbage"},
        {"round": 2, "reward_mean": 0.2, "format_rate": None, "format_weight": None, "rungs": [1, 2, 3]},
        typed, typed_bad,
        {"round": 5, "reward_mean": 0.3, "rungs": {"basic_arithmetic": -3, "base_conversion": 2.5, "x": None}},
        {"round": 6, "reward_mean": 0.4, "rungs_json": '{"basic_arithmetic": 1}'},
    ]}
    parsed, bad = parse_history(history)
    assert bad == 0
    rounds = parsed["rounds"]
    assert [e.round for e in rounds] == [1, 2, 3, 4, 5, 6]
    assert [e.rungs for e in rounds] == [{}, {}, {"basic_arithmetic": 2}, {"base_conversion": 1}, {},
                                         {"basic_arithmetic": 1}]
    assert rounds[0].metrics == {"reward_mean": 0.1, "format_rate": 0.2, "format_weight": 0.5}
    assert rounds[1].metrics == {"reward_mean": 0.2}  # NULL columns (a v1 row) are no metric
    model = AppModel()
    model.load_history(history)
    assert model.bad_history_rows == 0 and model.dashboard.rounds == 6
    assert model.dashboard.rungs == {"basic_arithmetic": 1, "base_conversion": 1}


def test_history_from_a_real_store_carries_rungs_and_format(tmp_path: Path) -> None:
    with Store(tmp_path / "node.db") as store:
        for n in range(1, 4):
            store.record_round(n, n, {"reward_mean": 0.1 * n, "format_rate": 0.3 * n, "format_weight": 1 - 0.25 * n},
                               {"basic_arithmetic": 0.1}, {"generate": 1.0}, 2, 0, ts=1000.0 + n,
                               rungs={"basic_arithmetic": n - 1, "base_conversion": 0})
        rows = store.rounds()
    assert json.dumps(rows)  # what the control API sends: plain JSON
    model = AppModel()
    model.load_history({"rounds": rows})
    dash = model.dashboard
    assert model.bad_history_rows == 0 and dash.rounds == 3
    assert dash.curriculum_active and dash.rungs == {"basic_arithmetic": 2, "base_conversion": 0}
    np.testing.assert_allclose(dash.series["format_rate"].y, [0.3, 0.6, 0.9])
    np.testing.assert_allclose(dash.series["format_weight"].y, [0.75, 0.5, 0.25])
    np.testing.assert_allclose(dash.series["reward"].y, [0.1, 0.2, 0.3])


def test_view_shows_rungs_and_draws_the_format_curves(qtbot: QtBot, dashboard: Dashboard) -> None:
    model, view = dashboard
    view.refresh(full=True)
    assert "No rounds yet" in view.status_line.text()  # no rounds: the hint speaks
    plots_before = view.plots.geometry()
    model.apply_round(_round(1, {"basic_arithmetic": 0, "base_conversion": 0}, format_rate=0.25, format_weight=0.5))
    model.apply_round(_round(2, {"basic_arithmetic": 2, "base_conversion": 1}, format_rate=0.5, format_weight=0.25))
    view.refresh(full=True)
    qtbot.wait(10)  # a pending relayout would run here
    assert view.plots.geometry() == plots_before  # the first round resizes no plot (it was the longest stall)
    text = view.status_line.text()
    assert "No rounds yet" not in text and view.status_line.toolTip()
    assert "basic arithmetic: level 3" in text and "base conversion: level 2" in text  # rung + 1
    assert text.index("base conversion") < text.index("basic arithmetic")  # sorted: a stable order
    for curve, ring in ((view.format_rate, model.series["format_rate"]),
                        (view.format_weight, model.series["format_weight"])):
        x, y = curve.item.getData()
        np.testing.assert_allclose(x, ring.x)
        np.testing.assert_allclose(y, ring.y)
    assert view.format_weight.item.opts["pen"].style() == Qt.PenStyle.DashLine  # a schedule, not a measurement
    assert view.format_rate.item not in view.reward_plot.listDataItems()  # apart from the correctness reward
    assert "Answer format" in view.format_plot.titleLabel.text
    # incremental: nothing changed, nothing uploaded; one more round uploads only what changed
    redraws = view.redraws
    view.refresh(full=True)
    assert view.redraws == redraws
    model.apply_round(_round(3, format_rate=1.0))  # the curriculum went off; no bonus weight this round
    view.refresh(full=True)
    assert view.format_rate.item.getData()[1][-1] == 1.0 and len(view.format_weight.item.getData()[1]) == 2
    assert "off" in view.status_line.text() and "level" not in view.status_line.text()


def test_contributor_wording_sane_empty_axes_and_when_the_held_out_eval_comes(dashboard: Dashboard) -> None:
    from engine.events import EvalCompleted

    model, view = dashboard
    view.refresh(full=True)
    for plot in (view.reward_plot, view.cumulative_plot, view.length_plot, view.eval_plot, view.speed_plot):
        (x0, x1), (y0, y1) = plot.viewRange()
        assert (x0, x1) == (0, 10) and -0.05 <= y0 <= 0 and 1 <= y1 <= 1.05  # not -4..4 before any data
    frame = view.cards["zero_std"].parentWidget()
    assert "zero-std" in frame.toolTip().lower()  # the technical term lives in the tooltip
    assert "all right or all wrong" in " ".join(w.text() for w in frame.findChildren(QLabel))
    assert "All right or all wrong" in view.zero_std_plot.titleLabel.text
    view.set_eval_every(100)  # before any round: the baseline check comes first
    assert "the first before round 1: where your model starts" in view.eval_plot.titleLabel.text
    model.apply_round(_round(1))  # a node without a baseline (an old store): the schedule's first
    view.refresh(full=True)
    assert "the first after round 100" in view.eval_plot.titleLabel.text
    view.set_eval_every(0)
    assert "held-out evals are off" in view.eval_plot.titleLabel.text
    view.set_eval_every(5)
    for r in range(1, 7):
        model.apply_round(_round(r))
    view.refresh(full=True)
    assert "next after round 10" in view.eval_plot.titleLabel.text  # round 5's eval has not arrived yet
    model.apply_eval(EvalCompleted(round=5, pass1=0.2, passk=0.5, k=4, per_specialty={}))
    view.refresh(full=True)
    assert "after round" not in view.eval_plot.titleLabel.text and "one answer right" in view.eval_plot.titleLabel.text


def test_axis_ranges_move_in_steps_and_hold_the_data(dashboard: Dashboard) -> None:
    """pyqtgraph's auto-range moved every axis every round, and redoing the ticks was most of a
    repaint; ranges now step through 1-2-5 values and always contain the data."""
    from app.views.dashboard import axis_ticks, nice_above, stepped_range

    assert axis_ticks(0, 10) == [(0, "0"), (2, "2"), (4, "4"), (6, "6"), (8, "8"), (10, "10")]
    assert [label for _, label in axis_ticks(-0.02, 1.02)] == ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]
    assert [label for _, label in axis_ticks(-5, 10)] == ["-5", "0", "5", "10"]
    assert [label for _, label in axis_ticks(0, 50_000)][-1] == "50k" and axis_ticks(1, 1) == []

    assert [nice_above(v) for v in (0, 0.3, 1, 1.1, 3, 7, 12, 450)] == [10, 0.5, 1, 2, 5, 10, 20, 500]
    assert stepped_range(None, 0, 9) == (0, 10) and stepped_range((0, 10), 0, 9.5) == (0, 10)
    assert stepped_range((0, 10), 0, 12) == (0, 20) and stepped_range((0, 100), 0, 3) == (0, 5)  # shrinks too
    assert stepped_range(None, -3, 5) == (-5, 10) and stepped_range(None, -3, -1) == (-5, 0)
    model, view = dashboard
    ranges = set()
    for r in range(1, 121):
        model.apply_round(_round(r))
        view.refresh(full=True)
        ranges.add(tuple(view.length_plot.viewRange()[0]))
        (x0, x1), (y0, y1) = view.cumulative_plot.viewRange()
        cumulative = model.series["cumulative"]
        assert x0 <= 0 and x1 >= r and y0 <= min(cumulative.y) and y1 >= max(cumulative.y)
    assert len(ranges) <= 4  # 120 rounds: a handful of x ranges, not 120
    (_, _), (y0, y1) = view.reward_plot.viewRange()
    assert -0.05 < y0 < 0 and 1 < y1 < 1.05  # a fraction keeps 0..1
    x_ticks = view.cumulative_plot.getAxis("bottom")._tickLevels[0]  # the labels drawn are ours
    assert x_ticks == axis_ticks(*view.cumulative_plot.viewRange()[0]) or x_ticks == axis_ticks(
        *view._ranges[(id(view.cumulative_plot), "x")])


def test_the_first_rounds_curves_are_made_a_few_per_refresh(dashboard: Dashboard) -> None:
    # The first round brings a curve per specialty and per phase: made all at once, they were one stall.
    import itertools

    from app.views.dashboard import NEW_CURVES_PER_REFRESH

    model, view = dashboard
    specialties = {f"specialty_{i}": 0.1 * i for i in range(4)}
    phases = {"generate": 1.0, "score": 0.1, "update": 2.0}
    model.apply_round(RoundCompleted(round=1, policy_version=1, metrics={"reward_mean": 0.25},
                                     per_specialty_reward=specialties, phase_seconds=phases, num_local=2,
                                     num_external=0))
    made = []
    for _ in range(4):
        view.refresh()
        made.append(len(view._specialty_curves) + len(view._phase_curves))
    assert made[0] == NEW_CURVES_PER_REFRESH and made[-1] == len(specialties) + len(phases)
    assert all(b - a <= NEW_CURVES_PER_REFRESH for a, b in itertools.pairwise(made))
    assert all(task_name(name) in view.specialty_plot.titleLabel.text for name in specialties)  # every legend entry
    for r in range(2, 31):  # the plots of such curves re-range as rounds come, like the others
        model.apply_round(RoundCompleted(round=r, policy_version=r, metrics={"reward_mean": 0.25},
                                         per_specialty_reward=specialties, phase_seconds=phases, num_local=2,
                                         num_external=0))
        view.refresh(full=True)
    for plot in (view.specialty_plot, view.phase_plot):
        assert plot.viewRange()[0][1] >= 30, plot.titleLabel.text
