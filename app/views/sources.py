"""The dashboard's "where training came from" card: per source (the node's own questions, questions peers
suggested, peers' answers) over the newest rounds, the groups it gave, how many had signal, and its
share of the CPU, with that share as one stacked bar. Fixed size from the start: a card that grows when
the first round arrives would relayout the plots below it."""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QVBoxLayout, QWidget

from app.models.sources import SOURCE_TIPS, SOURCES, SourceRow, SourceTally

SOURCE_COLORS = {"own_pick": "#2563eb", "suggested": "#d97706", "peer_text": "#16a34a"}
HEADERS = ("groups", "with signal", "CPU")
SIGNAL_TIP = ("A group is one question with all its answers. It has signal when at least one answer is right "
              "and one wrong: only such groups teach the model anything.")
CPU_TIP = "Share of the rounds' generation, scoring and update time spent on this source's groups."


def title_text(tally: SourceTally) -> str:
    if not tally.rounds:
        return "<b>Where training came from</b>"
    rounds = "the last round" if tally.rounds == 1 else f"the last {tally.rounds} rounds"
    return f"<b>Where training came from</b> ({rounds})"


def cells(row: SourceRow) -> tuple[str, str, str]:
    """groups, with signal (and its fraction), CPU share."""
    fraction = row.signal_fraction
    signal = f"{row.mixed:,.0f}" + (f" ({fraction:.0%})" if fraction is not None else "")
    return f"{row.groups:,.0f}", signal, f"{row.share:.0%}"


class ShareBar(QWidget):
    """One bar split by each source's share of the CPU (grey until something was spent)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.shares: dict[str, float] = {}
        self.setFixedHeight(8)

    def set_shares(self, shares: dict[str, float]) -> None:
        if shares != self.shares:
            self.shares = shares
            self.update()

    def paintEvent(self, _event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.fillRect(self.rect(), QColor("#e5e7eb"))
        x, width = 0.0, float(self.width())
        for source in SOURCES:
            w = width * self.shares.get(source, 0.0)
            painter.fillRect(QRectF(x, 0, w, self.height()), QColor(SOURCE_COLORS[source]))
            x += w
        painter.end()


class SourcesCard(QFrame):
    def __init__(self, tally: SourceTally, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tally = tally
        self.setProperty("role", "card")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 6, 12, 6)
        layout.setSpacing(3)
        grid = QGridLayout()
        grid.setHorizontalSpacing(12)
        grid.setVerticalSpacing(0)
        self.title = QLabel(title_text(tally))  # the header row's first cell: one line less in height
        self.title.setProperty("role", "cardName")
        grid.addWidget(self.title, 0, 0)
        for col, (heading, tip) in enumerate(zip(HEADERS, ("", SIGNAL_TIP, CPU_TIP)), start=1):
            header = QLabel(heading)
            header.setProperty("role", "hint")
            header.setToolTip(tip)
            grid.addWidget(header, 0, col, alignment=Qt.AlignmentFlag.AlignRight)
        self.values: dict[str, tuple[QLabel, ...]] = {}
        for r, source in enumerate(SOURCES, start=1):
            row = tally.rows()[r - 1]
            name = QLabel(f"<span style='color:{SOURCE_COLORS[source]}'>&#9632;</span>&nbsp;{row.label}")
            name.setToolTip(SOURCE_TIPS[source])
            grid.addWidget(name, r, 0)
            self.values[source] = tuple(QLabel("–") for _ in range(3))
            for col, (label, widest) in enumerate(zip(self.values[source], ("9,999", "9,999 (100%)", "100%")),
                                                  start=1):
                label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                label.setMinimumWidth(label.fontMetrics().horizontalAdvance(widest))  # no reflow as counts grow
                grid.addWidget(label, r, col)
        grid.setColumnStretch(0, 1)
        layout.addLayout(grid)
        self.bar = ShareBar()
        self.bar.setToolTip(CPU_TIP)
        layout.addWidget(self.bar)
        self.setToolTip(SIGNAL_TIP)

    def refresh(self) -> None:
        self.title.setText(title_text(self.tally))
        for row in self.tally.rows():
            texts = cells(row) if self.tally.rounds else ("–", "–", "–")
            for label, text in zip(self.values[row.source], texts):
                label.setText(text)
        self.bar.set_shares({row.source: row.share for row in self.tally.rows()})
