"""The dashboard draws what the metric registry (engine/metrics.py) says: every plotted entry is a curve
on its panel, with the panel's title, legend and tooltip, and a new plotted metric is one entry."""

from __future__ import annotations

import numpy as np
from pytestqt.qtbot import QtBot

from app.models.dashboard import DashboardModel
from app.views.dashboard import BOUNDED, GRID, DashboardView
from engine.events import RoundCompleted
from engine.metrics import PLOTTED, Metric, Plot


def _round(n: int, metrics: dict[str, float]) -> RoundCompleted:
    return RoundCompleted(round=n, policy_version=n, metrics=metrics, per_specialty_reward={},
                          phase_seconds={"total": 1.0}, num_local=2, num_external=0)


def _view(qtbot: QtBot, model: DashboardModel) -> DashboardView:
    view = DashboardView(model)
    qtbot.addWidget(view)
    view.show()
    return view


def test_every_plotted_registry_entry_is_drawn_on_its_panel(qtbot: QtBot) -> None:
    model = DashboardModel()
    view = _view(qtbot, model)
    model.apply_round(_round(1, {m.name: 0.5 for m, _ in PLOTTED}))
    view.refresh(full=True)
    for metric, plot in PLOTTED:
        panel = view.panel_plots[plot.panel]
        curves = [c for c in view._curves if c.ring is model.series[plot.series]]
        assert len(curves) == 1 and curves[0].plot is panel, metric.name
        assert list(curves[0].item.getData()[1]) == [0.5], metric.name
        assert plot.title in panel.titleLabel.text and plot.legend in panel.titleLabel.text
        assert metric.doc in panel.toolTip()
        assert (panel in view._bounded) == plot.bounded
    for key in GRID:  # the derived panels are still there too
        assert view.panel_plots[key].titleLabel.text


def test_older_spellings_still_feed_their_series() -> None:
    model = DashboardModel()
    model.apply_round(_round(1, {alias: 0.25 for m, _ in PLOTTED for alias in m.aliases}))
    for metric, plot in PLOTTED:
        if metric.aliases:
            assert model.latest(plot.series) == 0.25, metric.name


def test_a_new_plotted_metric_is_one_entry(qtbot: QtBot) -> None:
    new = Metric("surprise_rate", "Share of answers that surprised the checker.", "fraction", None,
                 Plot("surprise", "Surprises (fraction)", "surprise", bounded=True, color=4))
    assert new.plot is not None
    model = DashboardModel(plotted=(*PLOTTED, (new, new.plot)))
    view = _view(qtbot, model)
    positions = {key: view.plots.ci.items[plot] for key, plot in view.panel_plots.items()}
    model.apply_round(_round(1, {"reward_mean": 0.5, "surprise_rate": 0.25}))
    model.apply_round(_round(2, {"reward_mean": 0.5, "surprise_rate": 1.5}))  # a fraction above 1: bad, not drawn
    view.refresh(full=True)
    panel = view.panel_plots["surprise"]
    assert positions["surprise"] == [(3, 0)]  # a row of its own below the grid: the others stay put
    assert positions["reward"] == [(0, 0), (0, 1)] and positions["eval"] == [(2, 3)]
    assert "Surprises (fraction)" in panel.titleLabel.text and new.doc in panel.toolTip()
    np.testing.assert_allclose(model.series["surprise"].y, [0.25])
    [curve] = [c for c in view._curves if c.plot is panel]
    assert list(curve.item.getData()[1]) == [0.25] and curve in view._groups[1] + view._groups[2]
    assert tuple(panel.viewRange()[1]) == BOUNDED
