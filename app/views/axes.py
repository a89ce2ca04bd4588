"""Plot axes that stay cheap and readable: ranges that move in steps, and as many tick labels as fit."""

from __future__ import annotations

import math
from collections.abc import Callable

import pyqtgraph as pg
from PySide6.QtGui import QFontMetricsF

TICK_GAP_PX = 12  # between neighbouring tick labels


def nice_above(value: float) -> float:
    """The smallest 1, 2 or 5 x 10^k at or above `value` (10 for nothing yet)."""
    if not math.isfinite(value) or value <= 0:
        return 10.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(step * power for step in (1.0, 2.0, 5.0, 10.0) if step * power >= value * (1 - 1e-12))


def stepped_range(current: tuple[float, float] | None, low: float, high: float) -> tuple[float, float]:
    """An axis range that moves in steps: kept while the data fits and fills more than a fifth of it,
    else the next nice range. A range that changes every round makes pyqtgraph redo the axis ticks and
    repaint the whole plot every round; this way it happens a few times per order of magnitude."""
    bottom = 0.0 if low >= 0 else -nice_above(-low * 1.1)
    if current is not None and current[0] == bottom and high <= current[1] \
            and (high - bottom) >= 0.2 * (current[1] - bottom):
        return current
    return bottom, nice_above(high * 1.1) if high > 0 else (0.0 if low < 0 else 10.0)


def tick_label(value: float, decimals: int) -> str:
    """Compact: "1.5k", "200k", "2M" (a narrow axis has room for four or five characters a tick)."""
    size = abs(value)
    if size >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if size >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:.{decimals}f}"


def axis_ticks(low: float, high: float, max_ticks: int = 6) -> list[tuple[float, str]]:
    """About `max_ticks` labelled ticks on a 1-2-5 step across [low, high]. Given to pyqtgraph explicitly,
    so a repaint draws them instead of searching tick spacings (most of an axis's paint time)."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return []
    step = nice_above((high - low) / max(1, max_ticks))
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    ticks = []
    for k in range(math.ceil(low / step - 1e-9), math.floor(high / step + 1e-9) + 1):
        value = round(k * step, decimals + 1)
        ticks.append((value, tick_label(value, decimals)))
    return ticks


def fitting_ticks(low: float, high: float, length_px: float, label_px: Callable[[str], float],
                  gap_px: float = TICK_GAP_PX) -> list[tuple[float, str]]:
    """The most ticks (six at most) whose labels, `label_px` long each along an axis of `length_px`,
    leave `gap_px` between neighbours: on a small plot "1,0002,0003,000" became "0  2k  4k"."""
    ticks = axis_ticks(low, high)
    if length_px <= 0:  # not laid out yet: the resize that follows fits them
        return ticks
    for count in range(6, 1, -1):
        ticks = axis_ticks(low, high, count)
        if len(ticks) < 2:
            return ticks
        spacing = length_px * (ticks[1][0] - ticks[0][0]) / (high - low)
        if spacing >= max(label_px(label) for _, label in ticks) + gap_px:
            return ticks
    return ticks[::2] if len(ticks) > 2 else ticks


def set_axis_range(plot: pg.PlotItem, x_range: tuple[float, float], y_range: tuple[float, float]) -> None:
    plot.setRange(xRange=x_range, yRange=y_range, padding=0)
    set_axis_ticks(plot, x_range, y_range)


def set_axis_ticks(plot: pg.PlotItem, x_range: tuple[float, float], y_range: tuple[float, float]) -> None:
    """Ticks that fit the plot's size now (called again when it is resized)."""
    bottom, left = plot.getAxis("bottom"), plot.getAxis("left")
    metrics = QFontMetricsF(bottom.style.get("tickFont") or bottom.font())
    line = metrics.height()
    bottom.setTicks([fitting_ticks(*x_range, plot.vb.width(), metrics.horizontalAdvance)])
    left.setTicks([fitting_ticks(*y_range, plot.vb.height(), lambda _label: line, gap_px=2)])
