"""Shared rollouts: the live feed of peers' groups, its counters and a detail pane (per peer: the Peers
tab). The table model follows the Qt-free FeedModel incrementally (insert at top, trim at bottom)."""

from __future__ import annotations

import collections
import html
import time
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QPlainTextEdit,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from app.models.feed import FeedModel, FeedRow, reason_words, status_text
from app.models.peers import PeersModel

COLUMNS = ("Time", "From", "Specialty", "Question", "Reward", "Status")
STATUS_COLORS = {"used": "#15803d", "dropped": "#b91c1c", "pooled": "#6b7280", "skipped": "#b45309"}
Index = QModelIndex | QPersistentModelIndex


class FeedTableModel(QAbstractTableModel):
    """Rows newest first. `_top` is the arrival seq shown in row 0, `_shown` how many rows the view
    knows: the view's picture changes only inside begin/end calls, as Qt requires."""

    def __init__(self, feed: FeedModel) -> None:
        super().__init__()
        self.feed = feed
        self._top = -1
        self._shown = 0

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008 (Qt's signature)
        return 0 if parent.isValid() else self._shown

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def row_at(self, row: int) -> FeedRow | None:
        rows = self.feed.rows
        if not rows or not 0 <= row < self._shown:
            return None
        offset = (self._top - row) - rows[0].seq
        return rows[offset] if 0 <= offset < len(rows) else None

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return COLUMNS[section]
        return None

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        row = self.row_at(index.row())
        if row is None:
            return None
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            if col == 0:
                return time.strftime("%H:%M:%S", time.localtime(row.seen.ts))
            if col == 1:
                return row.seen.peer_name or row.seen.origin_peer[:10]
            if col == 2:
                return row.seen.specialty
            if col == 3:
                return " ".join(row.seen.question.split())[:140]
            if col == 4:
                return "–" if row.seen.reward is None else f"{row.seen.reward:.2f}"
            return status_text(row.status, row.reason)
        if role == Qt.ItemDataRole.ForegroundRole and col == 5:
            # a group not drawn this round is waiting like a pooled one, not screened out
            shown = "pooled" if (row.status, row.reason) == ("skipped", "not_sampled") else row.status
            return QColor(STATUS_COLORS.get(shown, "#374151"))
        if role == Qt.ItemDataRole.ToolTipRole and col == 3:
            return row.seen.question[:2000]
        if role == Qt.ItemDataRole.ToolTipRole and col == 5:
            return status_text(row.status, row.reason)
        return None

    def sync(self) -> None:
        changes = self.feed.take_changes()
        rows = self.feed.rows
        if not rows:
            return
        oldest, newest = rows[0].seq, rows[-1].seq
        lowest_shown = self._top - self._shown + 1
        gone = min(self._shown, max(0, oldest - lowest_shown))
        if gone:
            self.beginRemoveRows(QModelIndex(), self._shown - gone, self._shown - 1)
            self._shown -= gone
            self.endRemoveRows()
        if self._shown == 0:
            self._top = max(self._top, oldest - 1)
        new = newest - self._top
        if new > 0:
            self.beginInsertRows(QModelIndex(), 0, new - 1)
            self._top, self._shown = newest, self._shown + new
            self.endInsertRows()
        for seq in changes.updated:
            row = self._top - seq
            if 0 <= row < self._shown:
                self.dataChanged.emit(self.index(row, 0), self.index(row, len(COLUMNS) - 1))


def counters_text(feed: FeedModel, peers: PeersModel) -> str:
    """The line above the feed. Received and used are the Peers tab's totals (the store's, for all time:
    one count, shown alike in both tabs); waiting is the pool now; skipped and dropped are verdicts this
    window has seen."""
    def why(counts: collections.Counter[str]) -> str:
        return ", ".join(f"{html.escape(reason_words(reason))} {n:,}" for reason, n in counts.most_common())

    received, used = peers.totals()
    skipped = collections.Counter({r: n for r, n in feed.skipped.items() if r != "not_sampled"})
    waiting = f"<b>waiting in pool</b> {feed.waiting:,}"
    if skipped:
        waiting += f" (skipped by the trainer: {why(skipped)})"
    dropped = f"<b>dropped</b> {feed.dropped_total:,}" + (f" ({why(feed.dropped)})" if feed.dropped else "")
    return (f"<b>Received</b> {received:,} &nbsp;·&nbsp; <b>used in training</b> {used:,} (all time; per peer on "
            f"the Peers tab) &nbsp;·&nbsp; {waiting} &nbsp;·&nbsp; {dropped} since this window opened")


class RolloutsView(QWidget):
    def __init__(self, feed: FeedModel, peers: PeersModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.feed = feed
        self.peers = peers
        self._version = (-1, -1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 12, 12, 12)
        self.counters = QLabel()
        self.counters.setWordWrap(True)
        layout.addWidget(self.counters)

        self.table_model = FeedTableModel(feed)
        self.table = QTableView()
        self.table.setModel(self.table_model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setAlternatingRowColors(True)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(22)
        header = self.table.horizontalHeader()
        for col, width in enumerate((70, 120, 150, 0, 60, 320)):
            if width:
                self.table.setColumnWidth(col, width)
        header.setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        self.table.selectionModel().currentRowChanged.connect(self._show_detail)

        self.detail = QPlainTextEdit()
        self.detail.setReadOnly(True)
        self.detail.setPlaceholderText("Select a rollout to see its full question and completion.")
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.table)
        split.addWidget(self.detail)
        split.setSizes([420, 200])
        layout.addWidget(split, 1)
        self.refresh()

    def refresh(self) -> None:
        version = (self.feed.version, self.peers.version)
        if version == self._version:
            return
        self._version = version
        self.table_model.sync()
        self.counters.setText(counters_text(self.feed, self.peers))

    def _show_detail(self, current: QModelIndex, _previous: QModelIndex) -> None:
        row = self.table_model.row_at(current.row())
        if row is None:
            self.detail.clear()
            return
        seen = row.seen
        reward = "not scored" if seen.reward is None else f"{seen.reward:.3f} (re-scored here)"
        status = status_text(row.status, row.reason)
        self.detail.setPlainText(
            f"From {seen.peer_name or seen.origin_peer} · {seen.specialty} · reward {reward} · {status}\n\n"
            f"QUESTION\n{seen.question}\n\nCOMPLETION\n{seen.completion}")
