"""Fleet: every engine a contributor runs, in one table, and a notification when one stops.

This window's engine is always the first row; others are added by URL and token (kept in the fleet
file, readable by this user only). The polling and the alert rules live in `engine.fleet`; this view
only draws their reports, offers add / remove / show, and hands alerts to the window, which
shows a chosen engine's dashboard in place.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.views.peers import ago
from engine.fleet import (
    TRAINING_STATES,
    EngineReport,
    FleetEntry,
    FleetError,
    FleetPoller,
    load_fleet,
    save_fleet,
)

COLUMNS = ("Engine", "State", "Model", "Round", "Rounds / min", "Reward", "Last contact")
LOCAL_NAME = "this window's engine"
HOW_TO_REACH = ("Reach another machine's engine without opening a port: on this machine run "
                "<code>ssh -N -L 7799:127.0.0.1:&lt;its control port&gt; that-machine</code>, then add "
                "<code>ws://127.0.0.1:7799</code> with the token from its data dir "
                "(<code>control.token</code>).")


class AddEngineDialog(QDialog):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Add an engine")
        form = QFormLayout(self)
        help_text = QLabel(HOW_TO_REACH)
        help_text.setWordWrap(True)
        form.addRow(help_text)
        self.name = QLineEdit()
        self.url = QLineEdit("ws://127.0.0.1:7799")
        self.token = QLineEdit()
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        form.addRow("Name", self.name)
        form.addRow("Control URL", self.url)
        form.addRow("Token", self.token)
        self.error = QLabel()
        self.error.setStyleSheet("color: #b91c1c")
        form.addRow(self.error)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self._accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)
        self.entry: FleetEntry | None = None

    def _accept(self) -> None:
        try:
            self.entry = FleetEntry(self.name.text().strip(), self.url.text().strip(), self.token.text().strip())
        except FleetError as exc:
            self.error.setText(str(exc))
            return
        self.accept()


class FleetView(QWidget):
    """`local` gives this window's engine entry (None while unknown); `fleet_file` the saved others."""

    show_local_requested = Signal()
    show_engine_requested = Signal(object)  # a FleetEntry: show that engine in this window

    def __init__(self, poller: FleetPoller, local: Callable[[], FleetEntry | None], fleet_file: Path,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.poller, self._local, self.fleet_file = poller, local, fleet_file
        try:
            self.saved = load_fleet(fleet_file)
            load_error = ""
        except FleetError as exc:
            self.saved, load_error = [], str(exc)
        self._local_entry: FleetEntry | None = None
        self._last_local = 0.0
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 12, 12, 12)
        self.summary = QLabel(load_error)
        self.summary.setWordWrap(True)
        layout.addWidget(self.summary)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.table.cellDoubleClicked.connect(lambda row, _col: self.open_row(row))
        layout.addWidget(self.table, 1)
        buttons = QHBoxLayout()
        self.add_button = QPushButton("Add engine…")
        self.remove_button = QPushButton("Remove")
        self.open_button = QPushButton("Show dashboard")
        self.add_button.clicked.connect(self.add_dialog)
        self.remove_button.clicked.connect(self.remove_selected)
        self.open_button.clicked.connect(lambda: self.open_row(self.table.currentRow()))
        for b in (self.add_button, self.remove_button, self.open_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        layout.addLayout(buttons)
        self._sync_entries()

    # --- entries ---------------------------------------------------------------------------------
    def entries(self) -> list[FleetEntry]:
        return ([self._local_entry] if self._local_entry else []) + \
            [e for e in self.saved if not self._local_entry or e.url != self._local_entry.url]

    def _sync_entries(self) -> None:
        self.poller.set_entries(self.entries())

    def add(self, entry: FleetEntry) -> None:
        self.saved = [e for e in self.saved if e.url != entry.url] + [entry]
        save_fleet(self.fleet_file, self.saved)
        self._sync_entries()
        self.refresh()

    def add_dialog(self) -> None:
        dialog = AddEngineDialog(self)
        if dialog.exec() and dialog.entry is not None:
            self.add(dialog.entry)

    def remove_selected(self) -> None:
        row = self.table.currentRow()
        entries = self.entries()
        if 0 <= row < len(entries) and entries[row] is not self._local_entry:
            self.saved = [e for e in self.saved if e.url != entries[row].url]
            save_fleet(self.fleet_file, self.saved)
            self._sync_entries()
            self.refresh()

    def open_row(self, row: int) -> None:
        """Show that engine's dashboard in this window (this window's own, or another, switched in place)."""
        entries = self.entries()
        if not 0 <= row < len(entries):
            return
        entry = entries[row]
        if entry is self._local_entry:
            self.show_local_requested.emit()
        else:
            self.show_engine_requested.emit(entry)

    # --- the timer -------------------------------------------------------------------------------
    def tick(self) -> list[str]:
        """Refresh this window's entry now and then (its token renews when the engine restarts) and
        return the poller's new alerts."""
        now = time.monotonic()
        if now - self._last_local >= 5.0:
            self._last_local = now
            local = None
            with contextlib.suppress(FleetError, OSError, ValueError):
                local = self._local()
            if local != self._local_entry:
                self._local_entry = local
                self._sync_entries()
        return self.poller.take_alerts()

    def refresh(self) -> None:
        reports = self.poller.reports()
        now = time.time()
        self.table.setRowCount(len(reports))
        for i, r in enumerate(reports):
            for col, value in enumerate(self._cells(r, now)):
                item = self.table.item(i, col)
                if item is None:
                    item = QTableWidgetItem()
                    self.table.setItem(i, col, item)
                item.setText(value)
                item.setForeground(QColor("#111827" if r.reachable else "#9ca3af"))
                item.setToolTip(r.url + (f"\n{r.error}" if r.error else "")
                                + (f"\nlast crash: {r.crash_reason}" if r.crash_reason else ""))
        up = sum(r.reachable for r in reports)
        self.summary.setText(f"<b>{up}</b> of {len(reports)} engine{'s' if len(reports) != 1 else ''} answering. "
                             "A desktop notification says when one stops training, goes silent or crashes. "
                             "Double-click a row to show its dashboard here.")

    @staticmethod
    def _cells(r: EngineReport, now: float) -> tuple[str, ...]:
        state = (r.state if r.reachable else "checking…" if r.checked_at is None
                 else "not answering" if r.last_contact is None else f"silent ({r.state})")
        training = r.reachable and r.state in TRAINING_STATES  # a stopped engine's last rate is not its rate
        rate = f"{r.rounds_per_min:,.1f}" if r.rounds_per_min is not None and training else "–"
        reward = f"{r.reward:.3f} {r.trend}".strip() if r.reward is not None else "–"
        contact = ago(r.last_contact, now) if r.last_contact is not None else "never"
        return (r.name, state, r.model or "–", f"{r.round:,}", rate, reward, contact)


def local_entry(url: str, token_provider: Callable[[], str]) -> FleetEntry | None:
    """This window's engine as a fleet entry (None when its URL is not a control URL, e.g. in tests)."""
    try:
        return FleetEntry(LOCAL_NAME, url, token_provider())
    except (FleetError, OSError, ValueError):
        return None

