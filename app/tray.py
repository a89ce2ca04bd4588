"""Tray icon: its badge colour and tooltip follow the node; its menu holds the main controls."""

from __future__ import annotations

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QSystemTrayIcon, QWidget

from app.models.node import NodeModel
from app.theme import state_icon


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
