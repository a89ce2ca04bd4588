"""Dashboard: "Your model" on top, then live training curves (pyqtgraph), redrawn only where a series
changed. The curves are the current model's (rounds are numbered per model).

Each metric the registry plots (engine/metrics.py) is a curve on its panel, with the panel's title, the
metric's doc as the panel's tooltip and its legend entry; a panel the grid below does not place yet
flows in after the others. The reward's band and average, the cumulative reward, the per-specialty and
per-phase curves and the held-out eval are derived here, not registry metrics."""

from __future__ import annotations

import html
import zlib

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from app.models.dashboard import REWARD, DashboardModel
from app.models.ring import Ring
from app.models.your_model import duration
from app.theme import PLOT_COLORS, task_name
from app.views.axes import (
    TICK_GAP_PX,
    axis_ticks,
    fitting_ticks,
    nice_above,
    set_axis_range,
    set_axis_ticks,
    stepped_range,
)
from app.views.curve import MAX_POINTS, MIN_POINTS, PX_PER_POINT, Curve
from app.views.sources import SourcesCard
from app.views.your_model import YourModelCard
from engine.metrics import PLOTTED, Plot, panels
from engine.store import PHASES
from engine.tasks.specialties import SPECIALTIES

__all__ = ["MAX_POINTS", "MIN_POINTS", "PX_PER_POINT", "TICK_GAP_PX", "DashboardView", "axis_ticks", "eval_note",
           "fitting_ticks", "nice_above", "series_color", "stepped_range"]

# Antialiasing and grid lines each cost several times the rest of a repaint in Qt's raster engine
# (measured: 1,000 rounds took ~0.9 s to draw with both, ~20 ms without): off, except where noted.
# Pens are 1 px too: wider pens are stroked as paths, several times slower than plain lines.
pg.setConfigOptions(antialias=False, background="w", foreground="#374151")
BOUNDED = (-0.02, 1.02)  # plots of fractions and rewards keep this y range (0..1, the edges visible)
COLUMNS = 4
# The grid in reading order: panel -> (columns it spans, redraw group: see `_make_curves`). The wide
# panels leave their title legends room. Registry panels not listed flow in after these, one column each.
GRID: dict[str, tuple[int, int]] = {
    "reward": (2, 0), "specialty": (2, 1), "cumulative": (1, 0), "zero_std": (1, 1), "length": (1, 1),
    "format": (1, 1), "speed": (1, 2), "phase": (2, 2), "eval": (1, 2)}
# Titles of the panels drawn from derived series (the registry's panels carry their own).
DERIVED_TITLES = {"specialty": "Reward per specialty (moving average)", "cumulative": "Cumulative reward",
                  "phase": "Seconds per phase", "eval": "Held-out questions solved"}
SERIES_DOCS = {plot.series: metric.doc for metric, plot in PLOTTED}


NEW_CURVES_PER_REFRESH = 2  # a new curve costs a few ms to make: the first round's dozen are spread out
VALUE_AXIS_WIDTH = 56  # px: room for "-0.25", "1.5k" or "12k" beside the ticks
NO_ROUNDS_HINT = ("No rounds yet: the curves fill in as rounds complete (<b>Join the swarm</b> starts them; a "
                  "real model's first round takes a few minutes: it loads, then checks where it starts).")
CURRICULUM_TIP = ("How hard this node's questions are now, per task (level 1 = its easiest). A task moves up a "
                  "level when most recent answers to it are right, down when most are wrong.")
# the held-out plot's two curves: pass@1 (one sampled answer right) and pass@k (any of k right)
EVAL_ONE, EVAL_ANY = "one answer right", "any of k right"


def curriculum_text(model: DashboardModel) -> str:
    """The Difficulty line: each task's level (1 = its easiest; the curriculum's rung + 1), or fixed."""
    if not model.curriculum_active:
        return "<b>Difficulty</b>&nbsp; fixed (the adaptive curriculum is off)"
    levels = " &nbsp;·&nbsp; ".join(f"{html.escape(task_name(name))}: level {rung + 1}"
                                    for name, rung in sorted(model.rungs.items()))
    return f"<b>Difficulty</b>&nbsp; {levels}"


def _card(name: str) -> tuple[QFrame, QLabel]:
    frame = QFrame()
    frame.setProperty("role", "card")
    layout = QVBoxLayout(frame)
    layout.setContentsMargins(14, 8, 14, 8)
    value = QLabel("–")
    value.setProperty("role", "cardValue")
    label = QLabel(name)
    label.setProperty("role", "cardName")
    layout.addWidget(value)
    layout.addWidget(label)
    return frame, value


CARD_TIPS = {
    "zero_std": SERIES_DOCS["zero_std"],
    "reward_avg": "Share of this node's own completions the verifier scored correct, averaged over recent rounds.",
    "cumulative": "The sum of every round's mean reward so far.",
    "tokens_per_s": SERIES_DOCS["tokens_per_s"],
}


def eval_note(every: int | None, evals: int, rounds: int, every_s: float | None = None) -> str:
    """Under the held-out plot's title until its first point: when one comes, or that none will."""
    if evals or every is None:
        return ""
    if rounds == 0 and (every or every_s):  # the node checks before its first update (trainer._baseline_eval)
        return "the first before round 1: where your model starts"
    if every_s:
        return f"the first within {duration(every_s)} of training"
    if every == 0:
        return "none for this model: held-out evals are off in its preset"
    return f"the first after round {every:,}" if rounds < every else f"next after round {(rounds // every + 1) * every:,}"


def series_color(name: str, known: tuple[str, ...]) -> str:
    """The same colour for a name whatever order names arrive in: by its place in `known` (the task
    library's specialties, the store's phases), else by a hash of the name."""
    index = known.index(name) if name in known else zlib.crc32(name.encode())
    return PLOT_COLORS[index % len(PLOT_COLORS)]


class DashboardView(QWidget):
    def __init__(self, model: DashboardModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self._specialty_curves: dict[str, Curve] = {}
        self._phase_curves: dict[str, Curve] = {}
        self.redraws = 0  # curve uploads so far (tests and the bench read it)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 12, 12, 12)
        self.your_model = YourModelCard(model)
        layout.addWidget(self.your_model)
        self._card_row(layout)
        self._status_row(layout)
        self._plot_grid(layout)
        self._make_curves()
        self._eval_every: int | None = None
        self._eval_every_s: float | None = None
        self._eval_note = ""  # under the held-out plot's legend until its first point
        self._legend(self.eval_plot, {EVAL_ONE: PLOT_COLORS[0], EVAL_ANY: PLOT_COLORS[1]})
        self._registry_legends()
        self._status_text = NO_ROUNDS_HINT
        self._seen_version = -1
        self._next_plot = 0  # the plot the next refresh looks at first (round robin)

    def _card_row(self, layout: QVBoxLayout) -> None:
        """The latest numbers, one card each, in a row above the plots."""
        cards = QHBoxLayout()
        self.cards: dict[str, QLabel] = {}
        for key, name in (("reward_avg", f"reward ({self.model.window}-round average)"),
                          ("cumulative", "cumulative reward"), ("rounds", "rounds"),
                          ("zero_std", "questions all right or all wrong"), ("tokens_per_s", "tokens / s")):
            frame, value = _card(name)
            frame.setToolTip(CARD_TIPS.get(key, ""))
            self.cards[key] = value
            cards.addWidget(frame)
        layout.addLayout(cards)

    def _plot_grid(self, layout: QVBoxLayout) -> None:
        """The plots, empty: rows of a four-column grid (`GRID`) that takes the rest of the height."""
        self.plots = pg.GraphicsLayoutWidget()
        self.plots.ci.setSpacing(6)
        layout.addWidget(self.plots, 1)
        grid = self.plots.ci
        self._ranges: dict[tuple[int, str], tuple[float, float]] = {}  # (plot, axis) -> the range shown
        registry = panels(self.model.plotted)
        titles = {**DERIVED_TITLES, **{key: entries[0][1].title for key, entries in registry.items()}}
        self.panel_plots: dict[str, pg.PlotItem] = {}
        self._titles: dict[pg.PlotItem, str] = {}
        row = col = 0
        for key in [*GRID, *(key for key in registry if key not in GRID)]:
            span = GRID.get(key, (1, 0))[0]
            if col + span > COLUMNS:
                row, col = row + 1, 0
            plot = self.panel_plots[key] = self._plot(grid, row, col, titles[key], colspan=span)
            self._titles[plot] = titles[key]
            col += span
            tips = [f"{p.legend}: {m.doc}" if p.legend else m.doc for m, p in registry.get(key, [])]
            plot.setToolTip("\n".join(tips) or CARD_TIPS.get(key, ""))
        for col in range(COLUMNS):
            grid.layout.setColumnStretchFactor(col, 1)
        p = self.panel_plots  # the grid's panels by name too: the rest of the view and the tests read them
        self.reward_plot, self.specialty_plot, self.cumulative_plot = p["reward"], p["specialty"], p["cumulative"]
        self.zero_std_plot, self.length_plot, self.format_plot = p["zero_std"], p["length"], p["format"]
        self.speed_plot, self.phase_plot, self.eval_plot = p["speed"], p["phase"], p["eval"]
        # No setXLink: pyqtgraph links views by screen geometry, which skews plots of unequal width.
        self._bounded = {self.eval_plot, *(p[key] for key, entries in registry.items()
                                           if any(plot.bounded for _, plot in entries))}

    def _make_curves(self) -> None:
        """The fixed curves, bound to the model's series, in the redraw groups (`refresh`)."""
        model = self.model
        s = model.series
        raw = Curve(self.reward_plot, s[REWARD], "#93c5fd", 1.0, "per round")
        # the band's edges are drawn in the fill colour and coarse: the fill is the costliest thing drawn
        lo = Curve(self.reward_plot, s["reward_lo"], "#dbeafe", max_points=160)
        hi = Curve(self.reward_plot, s["reward_hi"], "#dbeafe", max_points=160)
        self.band = pg.FillBetweenItem(lo.item, hi.item, brush=pg.mkBrush("#dbeafe"))  # opaque, under the lines
        for item in (self.band, lo.item, hi.item):
            item.setZValue(-10)
        self.reward_plot.addItem(self.band)
        avg = Curve(self.reward_plot, s["reward_avg"], PLOT_COLORS[0], 2.0, f"{model.window}-round average",
                     antialias=True)
        # Redraw groups (group 1 also takes the per-specialty curves, group 2 the per-phase ones) say where
        # a curve is made; a refresh redraws one plot that changed (round robin), so that a tick costs one
        # plot's upload and repaint, not a third of the dashboard's (a third was still 20-28 ms ticks at
        # seed speed), and each plot still updates within a dozen ticks (~3 s).
        self._groups: list[list[Curve]] = [[raw, lo, hi, avg, Curve(self.cumulative_plot, s["cumulative"],
                                                                      PLOT_COLORS[1])], [], []]
        self.metric_curves: dict[str, Curve] = {}  # series -> its curve, for each registry metric drawn
        for _, plot in self.model.plotted:
            if plot.series != REWARD:  # the reward's curves are above
                self._metric_curve(plot)
        self._groups[GRID["eval"][1]] += [Curve(self.eval_plot, s["pass1"], PLOT_COLORS[0], name=EVAL_ONE),
                                          Curve(self.eval_plot, s["passk"], PLOT_COLORS[1], name=EVAL_ANY)]
        self._curves = [c for group in self._groups for c in group]
        # The format warm-up's two curves by name: its own panel, apart from the correctness reward.
        self.format_rate, self.format_weight = (self.metric_curves[k] for k in ("format_rate", "format_weight"))

    def _metric_curve(self, plot: Plot) -> None:
        """A registry metric's curve, in its panel's redraw group (a panel `GRID` does not place: the
        group with the fewest curves)."""
        fewest = min(range(len(self._groups)), key=lambda g: len(self._groups[g]))
        group = GRID[plot.panel][1] if plot.panel in GRID else fewest
        style = Qt.PenStyle.DashLine if plot.dashed else Qt.PenStyle.SolidLine
        curve = Curve(self.panel_plots[plot.panel], self.model.series[plot.series],
                       PLOT_COLORS[plot.color % len(PLOT_COLORS)], name=plot.legend or None, style=style)
        self.metric_curves[plot.series] = curve
        self._groups[group].append(curve)

    def _registry_legends(self) -> None:
        """Panels whose registry curves are named get their legend in the title."""
        for key, entries in panels(self.model.plotted).items():
            named = [p for _, p in entries if p.legend]
            solid = {p.legend: PLOT_COLORS[p.color % len(PLOT_COLORS)] for p in named if not p.dashed}
            dashed = {p.legend: PLOT_COLORS[p.color % len(PLOT_COLORS)] for p in named if p.dashed}
            if solid or dashed:
                self._legend(self.panel_plots[key], solid, dashed=dashed)

    def _status_row(self, layout: QVBoxLayout) -> None:
        """The status line and, beside it, where the rounds' groups came from."""
        # A line that speaks before the first round (how to start) and after it (each specialty's rung),
        # at a fixed height: a label that appears, hides or rewraps would relayout the plots below it, and
        # resizing every plot at once was the longest stall of a training session (the first round's).
        self.status_line = QLabel(NO_ROUNDS_HINT)
        self.status_line.setProperty("role", "hint")
        self.status_line.setWordWrap(True)
        self.status_line.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        # The sources card (own / peers' questions / peers' answers) sits here: in the cards' row it made
        # the window's narrowest width half as wide again. The line takes its height (4 lines: room for
        # every specialty's rung beside it).
        self.sources = SourcesCard(self.model.sources)
        self.status_line.setFixedHeight(self.sources.sizeHint().height())
        row = QHBoxLayout()
        row.addWidget(self.status_line, 1, Qt.AlignmentFlag.AlignTop)
        row.addWidget(self.sources)
        layout.addLayout(row)

    def _plot(self, grid: pg.GraphicsLayout, row: int, col: int, title: str, colspan: int = 1) -> pg.PlotItem:
        plot = grid.addPlot(row=row, col=col, colspan=colspan, title=title)
        plot.setLabel("bottom", "round")
        plot.getAxis("bottom").setStyle(tickTextOffset=4)
        plot.getAxis("bottom").enableAutoSIPrefix(False)  # "round (x0.001)" helps nobody
        # A fixed width for the value axis: left to itself it follows its widest tick label, and each
        # change ("0.5" -> "0.25") re-lays the whole grid out, so every plot redoes its ticks at once: the
        # longest stalls while training (80-170 ms) were such cascades.
        plot.getAxis("left").setWidth(VALUE_AXIS_WIDTH)
        # A sane empty axis until data arrives; then ranges that move in steps (`_fit_ranges`), not pyqtgraph's
        # auto-range, which changes them every round and with them the ticks to draw.
        set_axis_range(plot, (0, 10), (0, 1))
        plot.disableAutoRange()
        plot.setMenuEnabled(False)
        # as many tick labels as its new size has room for (a resize is rare: a window resize, a relayout)
        plot.vb.sigResized.connect(lambda _vb, p=plot: set_axis_ticks(p, *self._shown_range(p)))
        return plot

    def _shown_range(self, plot: pg.PlotItem) -> tuple[tuple[float, float], tuple[float, float]]:
        return self._ranges.get((id(plot), "x"), (0.0, 10.0)), self._ranges.get((id(plot), "y"), (0.0, 1.0))

    def _dynamic(self, curves: dict[str, Curve], rings: dict[str, Ring], plot: pg.PlotItem, group: int,
                 budget: int, known: tuple[str, ...]) -> int:
        """Curves for names seen for the first time, at most `budget` of them (the rest at the next
        refresh: the first round brings a dozen at once); returns how many were made."""
        new = [(name, ring) for name, ring in rings.items() if name not in curves][:budget]
        for name, ring in new:
            curves[name] = Curve(plot, ring, series_color(name, known), name=task_name(name))
            self._groups[group].append(curves[name])
            self._curves.append(curves[name])  # its plot's ranges follow it too
        if new:  # one title change for all of them
            self._legend(plot, {task_name(n): c.color for n, c in curves.items()})
        return len(new)

    def _legend(self, plot: pg.PlotItem, entries: dict[str, str], dashed: dict[str, str] | None = None) -> None:
        """The legend lives in the title: a legend box inside the plot would cover the newest points."""
        keys = [f"<span style='color:{color}'>&#9644;&nbsp;{html.escape(name)}</span>"
                for name, color in entries.items()]
        keys += [f"<span style='color:{color}'>- -&nbsp;{html.escape(name)}</span>"
                 for name, color in (dashed or {}).items()]
        rows = ["&nbsp; ".join(keys[i:i + 3]) for i in range(0, len(keys), 3)]  # 3 a line: columns stay even
        if plot is self.eval_plot and self._eval_note:
            rows.append(f"<i>{html.escape(self._eval_note)}</i>")
        plot.setTitle(f"{self._titles[plot]}<br><span style='font-size:8pt'>{'<br>'.join(rows)}</span>")

    def set_eval_every(self, every: int | None, every_s: float | None = None) -> None:
        """The node's held-out schedule: every `every` rounds and/or `every_s` seconds of training."""
        if (every, every_s) != (self._eval_every, self._eval_every_s):
            self._eval_every, self._eval_every_s = every, every_s
            self._update_eval_note()
            self.your_model.refresh(every, every_s)

    def _update_eval_note(self) -> None:
        note = eval_note(self._eval_every, len(self.model.series["pass1"]), self.model.rounds, self._eval_every_s)
        if note != self._eval_note:
            self._eval_note = note
            self._legend(self.eval_plot, {EVAL_ONE: PLOT_COLORS[0], EVAL_ANY: PLOT_COLORS[1]})

    def refresh(self, full: bool = False) -> None:
        """Redraw the next group of plots that changed (all of them with `full`)."""
        model = self.model
        budget = len(model.specialty) + len(model.phases) if full else NEW_CURVES_PER_REFRESH
        budget -= self._dynamic(self._specialty_curves, model.specialty, self.specialty_plot, 1, budget, SPECIALTIES)
        self._dynamic(self._phase_curves, model.phases, self.phase_plot, 2, budget, PHASES)
        plots = list({id(c.plot): c.plot for c in self._curves}.values())  # in the grid's order
        for _ in range(len(plots)):
            plot = plots[self._next_plot % len(plots)]
            self._next_plot = (self._next_plot + 1) % len(plots)
            changed = [curve for curve in self._curves if curve.plot is plot and curve.sync()]
            self.redraws += len(changed)
            if changed:
                self._fit_ranges([plot])
                if not full:
                    break
        if model.version == self._seen_version:
            return
        self._seen_version = model.version
        self._update_eval_note()
        self.your_model.refresh(self._eval_every, self._eval_every_s)
        text = curriculum_text(model) if model.rounds else NO_ROUNDS_HINT
        if text != self._status_text:  # the rungs change every few rounds at most
            self._status_text = text
            self.status_line.setText(text)
            self.status_line.setToolTip(CURRICULUM_TIP if model.rounds else "")
        self._set_card("reward_avg", model.latest("reward_avg"), "{:.3f}")
        self._set_card("cumulative", model.latest("cumulative"), "{:,.1f}")
        self._set_card("zero_std", model.latest("zero_std"), "{:.0%}")
        self._set_card("tokens_per_s", model.latest("tokens_per_s"), "{:,.0f}")
        self.cards["rounds"].setText(f"{model.rounds:,}")
        self.sources.refresh()

    def _fit_ranges(self, plots: object) -> None:
        """Axis ranges in steps (see `stepped_range`); the bounded plots keep 0..1."""
        for plot in plots:  # type: ignore[attr-defined]
            curves = [c for c in self._curves if c.plot is plot and len(c.ring)]
            if not curves:
                continue
            x_high = max(float(c.ring.x[-1]) for c in curves)
            xr = stepped_range(self._ranges.get((id(plot), "x")), 0.0, x_high)
            ys = [c.ys[np.isfinite(c.ys)] for c in curves]  # what is drawn: bucket means of the whole history
            ys = [y for y in ys if len(y)]
            yr = BOUNDED if plot in self._bounded or not ys else stepped_range(
                self._ranges.get((id(plot), "y")), min(float(y.min()) for y in ys), max(float(y.max()) for y in ys))
            if (xr, yr) != (self._ranges.get((id(plot), "x")), self._ranges.get((id(plot), "y"))):
                self._ranges[(id(plot), "x")], self._ranges[(id(plot), "y")] = xr, yr
                set_axis_range(plot, xr, yr)

    def _set_card(self, key: str, value: float | None, fmt: str) -> None:
        self.cards[key].setText("–" if value is None else fmt.format(value))
