"""The dashboard's "Your model" card: one sentence on how the model does on held-out questions, against
where it started, and when it is checked next (app/models/your_model.py words it)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QFrame, QLabel, QSizePolicy, QVBoxLayout, QWidget

from app.models.dashboard import DashboardModel
from app.models.your_model import HELD_OUT_TIP, Headline, headline

TREND_COLORS = {"up": "#15803d", "down": "#b91c1c", "same": "#111827", "": "#111827"}
HEADLINE_PX = 17  # font size: the one line of the tab read first


class YourModelCard(QFrame):
    """Updated by `refresh`, which sets text only when it changed. Its height is fixed (two lines of the
    headline and one of detail): a label that rewraps would relayout every plot below it."""

    def __init__(self, model: DashboardModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.setProperty("role", "card")
        self.setToolTip(HELD_OUT_TIP)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 8, 14, 8)
        layout.setSpacing(2)
        self.text = QLabel("")
        self.text.setWordWrap(True)
        self.text.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        self.detail = QLabel("")
        self.detail.setProperty("role", "hint")
        for label in (self.text, self.detail):
            # as wide as the tab, never wider: a long model name must not widen the window
            label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            layout.addWidget(label)
        self._style("")
        font = self.text.font()
        font.setPixelSize(HEADLINE_PX)
        font.setWeight(font.Weight.DemiBold)
        self.text.setFont(font)
        self.text.setFixedHeight(2 * QFontMetrics(font).lineSpacing() + 2)
        self.detail.setFixedHeight(QFontMetrics(self.detail.font()).lineSpacing() + 2)
        self.shown = Headline("", "", "")

    def _style(self, trend: str) -> None:
        self.text.setStyleSheet(f"color: {TREND_COLORS.get(trend, TREND_COLORS[''])}; border: none;")

    def refresh(self, eval_every: int | None = None, eval_every_s: float | None = None) -> None:
        line = headline(self.model, eval_every, eval_every_s)
        if line == self.shown:
            return
        if line.trend != self.shown.trend:
            self._style(line.trend)
        if line.text != self.shown.text:
            self.text.setText(line.text)
        if line.detail != self.shown.detail:
            self.detail.setText(line.detail)
        self.shown = line
