"""Log: the engine's log records and the GUI's own notes, newest at the bottom, bounded."""

from __future__ import annotations

from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from app.models.node import LogModel, log_text
from engine.events import LogRecord

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
FILTERS = (("Everything", 0), ("Info and above", 20), ("Warnings and errors", 30))


class LogView(QWidget):
    def __init__(self, model: LogModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 12, 12, 12)
        top = QHBoxLayout()
        top.addWidget(QLabel("Show:"))
        self.filter = QComboBox()
        for name, level in FILTERS:
            self.filter.addItem(name, level)
        self.filter.setCurrentIndex(1)
        self.filter.currentIndexChanged.connect(self._rerender)
        top.addWidget(self.filter)
        top.addStretch(1)
        layout.addLayout(top)
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setMaximumBlockCount(model.capacity)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        layout.addWidget(self.text, 1)
        self._rerender()  # what the model already holds (a view built again for another engine)

    def _keep(self, line: LogRecord) -> bool:
        return LEVELS.get(line.level.lower(), 20) >= int(self.filter.currentData())

    def refresh(self) -> None:
        new = [log_text(line) for line in self.model.take_new() if self._keep(line)]
        if new:
            self.text.appendPlainText("\n".join(new))  # one append per batch, not per line

    def _rerender(self) -> None:
        self.model.take_new()
        self.text.setPlainText("\n".join(log_text(line) for line in self.model.lines if self._keep(line)))
