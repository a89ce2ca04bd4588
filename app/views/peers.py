"""Peers: who this node shares with, how each was found, and what they sent."""

from __future__ import annotations

import time

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.models.peers import Credit, PeersModel, board_text, credit_text, refusals_text

COLUMNS = ("", "Name", "Model", "Found by", "Address", "Last seen", "Rollouts received", "Used", "Trust")
TRUST_TIP = ("Share of this peer's rollouts that this node could use whole: rollouts with text the peer keeps "
             "repeating for no reason, answers this model finds implausible, or padding count against it. "
             "With the reputation sampler, low-trust peers are drawn less often.")
CREDIT_TIP = ("Peers that train on a group of yours send a small signed receipt. What counts: groups this node "
              "really shared, once per peer, and only from peers whose own answers this node has checked and "
              "kept (a brand-new name cannot hand out credit). A copy of your group that someone else "
              "re-signs is refused as a copy: the credit stays with whoever shared it first. Receipts are "
              "shown here and used for nothing else.")
FOUND_BY = {"mdns": "LAN (mDNS)", "bootstrap": "bootstrap server", "manual": "manual", "inbound": "incoming link"}


def ago(ts: float, now: float | None = None) -> str:
    seconds = max(0.0, (now or time.time()) - ts)
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} days ago"


def summary_text(connected: int, listed: int, gone: int, forget_after_s: float) -> str:
    """The line above the table: who is listed, and how many are not because they have been gone a while."""
    text = f"<b>{connected}</b> connected of {listed} recent peer{'s' if listed != 1 else ''}"
    if gone:
        text += (f" ({gone:,} more gone: not seen for {forget_after_s / 60:.0f} min or more, "
                 "not listed)")
    return text + (". Peers are found on the LAN by mDNS and through the bootstrap server; their rollouts "
                   "are re-scored here before use.")


class PeersView(QWidget):
    def __init__(self, peers: PeersModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.peers = peers
        self._version = -1
        self._last_ages = 0.0
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 12, 12, 12)
        self.summary = QLabel()
        layout.addWidget(self.summary)
        self.refused = QLabel()  # "Refused by the swarm": hidden when solo
        self.refused.setTextFormat(Qt.TextFormat.PlainText)  # reasons come from another process
        self.refused.setWordWrap(True)
        self.refused.setVisible(False)
        layout.addWidget(self.refused)
        self.board = QLabel()  # the internet data plane: hidden when solo
        self.board.setTextFormat(Qt.TextFormat.PlainText)
        self.board.setWordWrap(True)
        self.board.setVisible(False)
        layout.addWidget(self.board)
        self.credit = QLabel()  # what peers did with our rollouts (receipts): hidden when solo
        self.credit.setTextFormat(Qt.TextFormat.PlainText)
        self.credit.setToolTip(CREDIT_TIP)
        self.credit.setVisible(False)
        layout.addWidget(self.credit)
        self.credit_plot = pg.PlotWidget()  # peers' trainings on our groups per hour (last 48 h)
        self.credit_plot.setFixedHeight(110)
        self.credit_plot.setMouseEnabled(False, False)
        self.credit_plot.hideButtons()
        self.credit_plot.setLabel("left", "uses / h")
        self.credit_plot.getAxis("bottom").setStyle(showValues=False)
        self.credit_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush="#2563eb")
        self.credit_plot.addItem(self.credit_bars)
        self.credit_plot.setVisible(False)
        self._credit_shown: Credit | None = None
        layout.addWidget(self.credit_plot)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setAlternatingRowColors(True)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(4, QHeaderView.ResizeMode.Stretch)
        layout.addWidget(self.table, 1)
        self.refresh()

    def refresh(self) -> None:
        now = time.time()
        if self.peers.version == self._version and now - self._last_ages < 1.0:
            return  # nothing new; "last seen" ages are redrawn once a second
        self._version, self._last_ages = self.peers.version, now
        swarm = self.peers.swarm
        self.refused.setVisible(swarm is not None)
        self.refused.setText(f"Refused by the swarm: {refusals_text(swarm)}" if swarm is not None else "")
        self.board.setVisible(swarm is not None)
        self.board.setText(board_text(swarm.board, now) if swarm is not None else "")
        self._show_credit(swarm.credit if swarm is not None else None, now)
        reputation = swarm.reputation if swarm is not None else {}
        rows = self.peers.sorted_rows(now)  # connected or seen lately: peers long gone are only counted
        self.table.setRowCount(len(rows))
        for i, row in enumerate(rows):
            trust = reputation.get(row.peer_id)
            values = ("●", row.name, row.model, FOUND_BY.get(row.found_by, row.found_by), row.address,
                      ago(row.last_seen, now), f"{row.received:,}", f"{row.used:,}", f"{trust[0]:.0%}" if trust else "–")
            for col, value in enumerate(values):
                item = self.table.item(i, col)
                if item is None:
                    item = QTableWidgetItem()
                    self.table.setItem(i, col, item)
                item.setText(value)
                if col == 0:
                    item.setForeground(QColor("#16a34a" if row.connected else "#9ca3af"))
                    item.setToolTip("connected" if row.connected else "not connected")
                elif col >= 6:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if col == 8:
                    low = trust is not None and trust[0] < 0.3
                    item.setForeground(QColor("#dc2626" if low else "#111827"))
                    item.setToolTip(TRUST_TIP + (f"\nJudged on {trust[1]:,} rollouts." if trust else
                                                 "\nNo rollouts judged yet."))
        self.summary.setText(summary_text(self.peers.connected, len(rows), self.peers.gone(now),
                                          self.peers.forget_after_s))

    def _show_credit(self, credit: Credit | None, now: float) -> None:
        self.credit.setVisible(credit is not None)
        self.credit.setText(credit_text(credit))
        hours = [(t, n) for t, n in (credit.hourly if credit else ()) if t > now - 48 * 3600]
        self.credit_plot.setVisible(bool(hours))
        if credit == self._credit_shown:
            return  # the bars change only with new receipts
        self._credit_shown = credit
        self.credit_bars.setOpts(x=[(t - now) / 3600 for t, _ in hours], height=[n for _, n in hours])
        self.credit_plot.setXRange(-48, 0, padding=0.02)
