"""A dashboard curve bound to a ring buffer (app/views/dashboard.py): it uploads only when the ring
changed, and draws the whole history as at most a plot's width of bucket means."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from app.models.ring import Ring

MAX_POINTS = 400  # per curve; a plot is a few hundred pixels wide
# Fewer on narrow plots: a point every pixel or two of a noisy series is a solid block of colour.
PX_PER_POINT = 3
MIN_POINTS = 64


class Curve:
    """A plot curve bound to a ring buffer; `sync` uploads only when the ring changed."""

    def __init__(self, plot: pg.PlotItem, ring: Ring, color: str, width: float = 1.0,
                 name: str | None = None, antialias: bool = False, max_points: int = MAX_POINTS,
                 style: Qt.PenStyle = Qt.PenStyle.SolidLine) -> None:
        self.ring = ring
        self.color = color
        self.max_points = max_points
        self.item = plot.plot(pen=pg.mkPen(color, width=width, style=style), name=name, antialias=antialias)
        self.plot = plot
        self._version = -1
        self.xs, self.ys = np.zeros(0), np.zeros(0)  # what is drawn
        self._marked = False  # drawn as a dot (one point so far)

    def sync(self) -> bool:
        if self.ring.version == self._version:
            return False
        self._version = self.ring.version
        # the whole history as bucket means: bounded by the plot's width, readable at 100,000 rounds
        points = min(self.max_points, max(MIN_POINTS, int(self.plot.vb.width() / PX_PER_POINT)))
        self.xs, self.ys = self.ring.summary.means(points)
        self.item.setData(self.xs, self.ys)
        single = len(self.xs) == 1  # a line through one point draws nothing: the first round, the baseline eval
        if single != self._marked:
            self._marked = single
            self.item.setSymbol("o" if single else None)
            self.item.setSymbolSize(6)
            self.item.setSymbolPen(None)
            self.item.setSymbolBrush(self.color)
        return True
