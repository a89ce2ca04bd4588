"""Tray icon: its badge colour and tooltip follow the node; its menu holds the main controls; a failure
(training stopped by an error, the board lost) raises a desktop notification, a few at most."""

from __future__ import annotations

import time

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QSystemTrayIcon, QWidget

from app.models.node import NodeModel
from app.theme import state_icon
from engine.events import Event, LogRecord

NOTICE_EVERY_S = 600.0  # one notification per kind of failure per 10 minutes: a failing loop must not spam
NOTICE_FRESH_S = 120.0  # events replayed on connecting are history, not news
# The swarm's board client logs these when its link goes (engine/swarm/board_client.py).
BOARD_LOST = ("swarm: the board connection ended", "is unreachable")


class FailureNotices:
    """Which engine events deserve a notification, rate-limited per kind; Qt-free."""

    def __init__(self, every_s: float = NOTICE_EVERY_S) -> None:
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}  # failures of a kind kept quiet since its last notification

    def notice(self, event: Event, now: float | None = None) -> tuple[str, str] | None:
        """(title, text) to show for `event`, or None."""
        now = time.time() if now is None else now
        kind = self._kind(event)
        if kind is None or not isinstance(event, LogRecord) or now - event.ts > NOTICE_FRESH_S:
            return None
        if now - self._last.get(kind, -1e18) < self.every_s:
            self._held[kind] = self._held.get(kind, 0) + 1
            return None
        self._last[kind] = now
        held = self._held.pop(kind, 0)
        lines = [line.strip() for line in event.message.strip().splitlines() if line.strip()]
        text = (lines[-1] if lines else event.message)[:300]  # a traceback's last line says what failed
        more = f" ({held} more since the last notice)" if held else ""
        if kind == "round":
            return "SAPO Swarm: training stopped", f"A round failed, training stopped: {text}{more}"
        return "SAPO Swarm: lost the board", f"{text}{more}"

    @staticmethod
    def _kind(event: Event) -> str | None:
        if not isinstance(event, LogRecord):
            return None
        if event.level == "error":
            return "round"
        if event.level == "warning" and any(mark in event.message for mark in BOARD_LOST) \
                and "board" in event.message:
            return "board"
        return None


class TrayIcon(QSystemTrayIcon):
    def __init__(self, parent: QWidget) -> None:
        super().__init__(state_icon("disconnected"), parent)
        self.menu = QMenu(parent)
        self.show_action = QAction("Show SAPO Swarm", self.menu)
        self.join_action = QAction("Join the swarm", self.menu)
        self.pause_action = QAction("Finish this round, then pause", self.menu)
        self.resume_action = QAction("Resume", self.menu)
        self.snooze_action = QAction("Snooze for an hour", self.menu)
        self.quit_action = QAction("Quit", self.menu)
        for action in (self.show_action, None, self.join_action, self.pause_action, self.resume_action,
                       self.snooze_action, None, self.quit_action):
            if action is None:
                self.menu.addSeparator()
            else:
                self.menu.addAction(action)
        self.setContextMenu(self.menu)
        self._shown: tuple[str, bool, str] | None = None
        self.notices = FailureNotices()
        self.notified: list[tuple[str, str]] = []  # what was shown, newest last (bounded)

    def notify(self, event: Event) -> None:
        """A desktop notification for a failure event, where the desktop shows them."""
        notice = self.notices.notice(event)
        if notice is None:
            return
        self.notified = [*self.notified[-19:], notice]
        if self.isVisible() and self.supportsMessages():
            self.showMessage(notice[0], notice[1], QSystemTrayIcon.MessageIcon.Warning, 15000)

    def update_from(self, node: NodeModel) -> None:
        key = (node.state if node.connected else "disconnected", node.connected, node.tooltip())
        if key == self._shown:
            return
        self._shown = key
        self.setIcon(state_icon(key[0]))
        self.setToolTip(key[2])
        joinable = node.state == "stopped"
        self.join_action.setText("Join the swarm" if joinable else "Leave the swarm")
        self.join_action.setEnabled(node.connected and node.state != "leaving")
        self.pause_action.setEnabled(node.connected and node.state in ("solo", "in_swarm"))
        self.resume_action.setEnabled(node.connected and node.state in ("paused", "pausing"))
        self.snooze_action.setEnabled(node.connected and node.state not in ("stopped", "leaving"))
