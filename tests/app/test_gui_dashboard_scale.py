"""The dashboard over 100,000 rounds, on a real DashboardView offscreen: each curve draws a bounded number
of points covering the whole history (bucket means: a noisy series stays a line, not a block of solid
colour), and the tick labels of small plots are compact and spaced ("0  2k  4k", not "1,0002,0003,000")."""

from __future__ import annotations

import itertools

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtGui import QFontMetricsF
from pytestqt.qtbot import QtBot

from app.models.dashboard import DashboardModel
from app.models.ring import Buckets, Ring
from app.views.dashboard import (
    MAX_POINTS,
    MIN_POINTS,
    PX_PER_POINT,
    TICK_GAP_PX,
    DashboardView,
    fitting_ticks,
)
from engine.events import RoundCompleted

ROUNDS = 100_000


def _noisy_round(n: int) -> RoundCompleted:
    """Per-round values that jump across their whole range, as a small model's do."""
    flip = float(n % 2)
    return RoundCompleted(round=n, policy_version=n,
                          metrics={"reward_mean": flip, "frac_reward_zero_std": 1.0 - flip,
                                   "tokens_per_s": 200.0 + 100.0 * flip, "completion_len_mean": 40.0 + 20 * flip},
                          per_specialty_reward={"bf": flip}, phase_seconds={"generate": 0.5 + flip},
                          num_local=2, num_external=0)


@pytest.fixture(scope="module")
def long_model() -> DashboardModel:
    model = DashboardModel()
    for n in range(1, ROUNDS + 1):
        model.apply_round(_noisy_round(n))
    return model


def _assert_ticks_fit(plot: pg.PlotItem) -> None:
    axis = plot.getAxis("bottom")
    ticks = axis._tickLevels[0]  # the labels drawn are ours (setTicks)
    assert len(ticks) >= 2, ticks
    metrics = QFontMetricsF(axis.font())
    (low, high), width = plot.viewRange()[0], plot.vb.width()
    for (a, label_a), (b, label_b) in itertools.pairwise(ticks):
        gap_px = (b - a) / (high - low) * width
        assert gap_px >= max(metrics.horizontalAdvance(label_a), metrics.horizontalAdvance(label_b)) + TICK_GAP_PX, \
            (plot.titleLabel.text, ticks, width)
    assert all(len(label) <= 5 and "," not in label for _, label in ticks), ticks


def test_buckets_keep_every_point_in_a_bounded_number_of_means() -> None:
    buckets = Buckets(64)
    ys = np.arange(10_000, dtype=float) % 7
    for i, y in enumerate(ys):
        buckets.append(float(i), y)
    assert len(buckets) <= 64 and buckets.total == 10_000
    xs, means = buckets.means(20)
    assert len(xs) <= 20 and np.all(np.diff(xs) > 0)
    assert xs[0] < 500 and xs[-1] > 9_500  # from the first point to the last
    counts = np.add.reduceat(buckets._n[:len(buckets)], np.arange(0, len(buckets), -(-len(buckets) // 20)))
    assert float(np.average(means, weights=counts)) == pytest.approx(float(ys.mean()))  # nothing dropped
    ring = Ring(4, summary=8)
    for i in range(3):
        ring.append(i, i)
    np.testing.assert_allclose(ring.summary.means(100)[1], [0, 1, 2])  # short series: the points themselves
    ring.clear()
    assert len(ring.summary) == 0


def test_narrow_axis_ticks_are_compact_and_spaced() -> None:
    def char_px(label: str) -> float:
        return 7.0 * len(label)

    ticks = fitting_ticks(0, 5000, 100, char_px)
    assert [label for _, label in ticks] == ["0", "2k", "4k"]
    assert [label for _, label in fitting_ticks(0, 5000, 600, char_px)] == ["0", "1k", "2k", "3k", "4k", "5k"]
    assert [label for _, label in fitting_ticks(0, 200_000, 150, char_px)] == ["0", "100k", "200k"]
    assert fitting_ticks(0, 2, 0, char_px)[-1] == (2.0, "2.0")  # not laid out yet: the usual six


def test_a_hundred_thousand_rounds_draw_bounded_readable_curves(qtbot: QtBot, long_model: DashboardModel) -> None:
    view = DashboardView(long_model)
    qtbot.addWidget(view)
    view.resize(1280, 760)
    view.show()
    qtbot.waitExposed(view)
    view.refresh(full=True)
    qtbot.wait(20)
    drawn = 0
    for curve in view._curves:
        x, _ = curve.item.getData()
        if not len(curve.ring):  # no evals nor format metrics fed: nothing to draw
            continue
        drawn += 1
        budget = max(MIN_POINTS, int(curve.plot.vb.width() / PX_PER_POINT))
        assert len(x) <= min(MAX_POINTS, budget), curve.plot.titleLabel.text
        assert x[0] < 1_000 and x[-1] > ROUNDS - 1_000  # the whole history, not the ring's newest 5,000
    assert drawn >= 9  # reward, its band and average, cumulative, all-or-nothing, length, speed, bf, generate
    # a series that flips 0/1 every round is a line at 0.5, not a block from 0 to 1
    _, zero_std = view._groups[1][0].item.getData()
    assert float(np.ptp(zero_std)) < 0.1
    for plot in (view.cumulative_plot, view.zero_std_plot, view.speed_plot, view.reward_plot, view.phase_plot):
        _assert_ticks_fit(plot)
    # a narrower window: the ticks are re-fitted to the plots' new sizes
    view.resize(760, 600)
    qtbot.wait(50)
    for plot in (view.cumulative_plot, view.zero_std_plot, view.speed_plot, view.length_plot):
        _assert_ticks_fit(plot)
    # one more round keeps the bound (and uploads only what changed)
    long_model.apply_round(_noisy_round(ROUNDS + 1))
    view.refresh(full=True)
    assert all(len(c.item.getData()[0] if c.item.getData()[0] is not None else ()) <= MAX_POINTS
               for c in view._curves)


@pytest.mark.parametrize("rounds", [4_000, 1_500])
def test_small_plots_ticks_do_not_run_together(qtbot: QtBot, rounds: int) -> None:
    model = DashboardModel()
    for n in range(1, rounds + 1):
        model.apply_round(_noisy_round(n))
    view = DashboardView(model)
    qtbot.addWidget(view)
    view.resize(1280, 760)  # the window's default size: the one-column plots are ~190 px wide
    view.show()
    qtbot.waitExposed(view)
    view.refresh(full=True)
    qtbot.wait(20)
    for plot in (view.cumulative_plot, view.zero_std_plot, view.length_plot, view.speed_plot):
        _assert_ticks_fit(plot)


def test_the_first_round_and_the_baseline_eval_are_drawn_as_dots(qtbot: QtBot) -> None:
    """A line through one point draws nothing: after a real model's first round the plots stood empty
    beside a reward card of 0.094 (bench/walkthrough.md). One point is a dot; from two on, a line."""
    from engine.events import EvalCompleted

    model = DashboardModel()
    view = DashboardView(model)
    qtbot.addWidget(view)
    view.resize(1280, 800)
    view.show()
    model.apply_round(_noisy_round(1))
    model.apply_eval(EvalCompleted(round=0, pass1=0.01, passk=0.03, k=4, per_specialty={}))
    view.refresh(full=True)
    single = [c for c in view._curves if len(c.xs) == 1]
    assert single and all(c.item.opts["symbol"] == "o" for c in single)
    assert any(c.plot is view.eval_plot for c in single)  # the baseline's pass@1, at round 0
    model.apply_round(_noisy_round(2))
    view.refresh(full=True)
    assert all(c.item.opts["symbol"] is None for c in view._curves if len(c.xs) > 1)


def test_a_refresh_redraws_one_changed_plot_and_a_cycle_redraws_them_all(qtbot: QtBot) -> None:
    """At seed speed a round lands every tick: a tick uploads and repaints one plot (a third of the
    dashboard per tick kept ticks at 20-28 ms), and every plot that changed is current after one cycle."""
    model = DashboardModel()
    view = DashboardView(model)
    qtbot.addWidget(view)
    view.show()
    for n in range(1, 50):
        model.apply_round(_noisy_round(n))
    view.refresh(full=True)
    model.apply_round(_noisy_round(50))
    plots = list({id(c.plot): c.plot for c in view._curves}.values())
    stale = {id(c.plot) for c in view._curves if c.ring.version != c._version}
    assert len(stale) >= 4  # reward, cumulative, the specialty, phase, speed... changed with the round
    drawn: list[set[int]] = []
    for _ in range(len(plots)):
        before = {id(c): c._version for c in view._curves}
        view.refresh()
        drawn.append({id(c.plot) for c in view._curves if c._version != before[id(c)]})
    assert all(len(d) <= 1 for d in drawn)  # one plot a refresh
    assert set().union(*drawn) == stale  # and every plot that changed, within one cycle
    assert all(c.ring.version == c._version for c in view._curves)
