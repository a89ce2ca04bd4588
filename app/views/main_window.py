"""The main window: the Join / Leave button and the node's state on top, the views in tabs below.

A timer drains the bridge's inbox a few times a second, applies the batch to the Qt-free models,
then refreshes the header, the tray and the visible tab only. Every action is a non-blocking call
to the engine; its reply comes back later as a signal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QCloseEvent, QShowEvent
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QPushButton,
    QSystemTrayIcon,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.bridge import EngineBridge, LinkChange
from app.models import AppModel
from app.theme import STATE_COLORS, app_icon, dot
from app.tray import TrayIcon
from app.views.dashboard import DashboardView
from app.views.fleet import FleetView, local_entry
from app.views.log import LogView
from app.views.machine import MachineView, progress_text, short_model_name
from app.views.peers import PeersView
from app.views.rollouts import RolloutsView
from app.views.settings import SettingsView
from engine.control.api import ModelProgress
from engine.events import StateChanged
from engine.fleet import FleetPoller
from engine.paths import fleet_file as default_fleet_file
from engine.supervisor import read_last_crash

SWARM_POLL_S = 2.0  # status polls while the Peers tab is shown (refused/dropped counters)
MAX_ITEMS_PER_TICK = 3000  # bounds the work of one tick, so a burst never stalls the event loop


class MainWindow(QMainWindow):
    def __init__(self, bridge: EngineBridge, model: AppModel | None = None, *, refresh_ms: int = 250,
                 stop_engine: Callable[[], None] | None = None, use_tray: bool = True,
                 fleet_file: Path | None = None) -> None:
        super().__init__()
        self.bridge = bridge
        self.model = model or AppModel()
        self._stop_engine = stop_engine  # set when this app started the engine process
        self._quitting = False
        self._busy = False  # a join/leave call is in flight
        self._status_calls = 0  # status refreshes in flight (header identity)
        self._status_stale = False  # asked again while one was in flight
        self._swarm_polled = 0.0  # last status poll for the Peers tab's swarm counters
        self._told_about_tray = False
        self.setWindowTitle("SAPO Swarm")
        self.setWindowIcon(app_icon())
        self.resize(1280, 820)

        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self._build_header())
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        m = self.model
        self.dashboard = DashboardView(m.dashboard)
        self.rollouts = RolloutsView(m.feed)
        self.peers = PeersView(m.peers, m.feed)
        self.machine = MachineView()
        self.settings = SettingsView()
        self.log_view = LogView(m.log)
        self.fleet_poller = FleetPoller()
        provider = getattr(bridge, "token", None)
        self.fleet = FleetView(self.fleet_poller, lambda: local_entry(bridge.url, provider) if provider else None,
                               fleet_file or default_fleet_file())
        self.fleet.show_local_requested.connect(lambda: self.tabs.setCurrentWidget(self.dashboard))
        for view, name in ((self.dashboard, "Dashboard"), (self.rollouts, "Shared rollouts"), (self.peers, "Peers"),
                           (self.fleet, "Fleet"), (self.machine, "Machine"), (self.settings, "Settings"),
                           (self.log_view, "Log")):
            self.tabs.addTab(view, name)
        self.tabs.currentChanged.connect(lambda _: self._refresh_views())
        layout.addWidget(self.tabs, 1)
        self.setCentralWidget(central)
        self.statusBar().showMessage(f"Connecting to the engine at {bridge.url}…")

        self.settings.apply_requested.connect(self._apply_settings)
        self.settings.pause_after_round_requested.connect(self.pause_after_round)
        self.settings.snooze_requested.connect(self.snooze)
        self.settings.resume_requested.connect(self.resume)
        self.machine.refresh_requested.connect(self._fetch_machine)
        self.machine.switch_requested.connect(self._switch_model)

        self.tray: TrayIcon | None = None
        if use_tray and QSystemTrayIcon.isSystemTrayAvailable():
            self.tray = TrayIcon(self)
            self.tray.show_action.triggered.connect(self.show_normal)
            self.tray.join_action.triggered.connect(self.toggle_join)
            self.tray.pause_action.triggered.connect(self.pause_after_round)
            self.tray.resume_action.triggered.connect(self.resume)
            self.tray.snooze_action.triggered.connect(lambda: self.snooze(3600.0))
            self.tray.quit_action.triggered.connect(self.quit_app)
            self.tray.activated.connect(self._tray_activated)
            self.tray.show()

        self.ticks = 0
        self.timer = QTimer(self)
        self.timer.setInterval(refresh_ms)
        self.timer.timeout.connect(self.tick)
        self.timer.start()
        self.fleet_poller.start()
        self._update_header()

    # --- layout ----------------------------------------------------------------------------------
    def _build_header(self) -> QFrame:
        header = QFrame()
        header.setObjectName("header")
        row = QHBoxLayout(header)
        row.setContentsMargins(18, 12, 18, 12)
        icon = QLabel()
        icon.setPixmap(app_icon().pixmap(44, 44))
        row.addWidget(icon)
        titles = QVBoxLayout()
        title = QLabel("SAPO Swarm")
        title.setObjectName("title")
        self.subtitle = QLabel("")
        self.subtitle.setObjectName("subtitle")
        titles.addWidget(title)
        titles.addWidget(self.subtitle)
        row.addLayout(titles)
        row.addSpacing(16)

        state_box = QVBoxLayout()
        state_row = QHBoxLayout()
        self.state_dot = QLabel()
        self.state_label = QLabel()
        self.state_label.setObjectName("stateLabel")
        state_row.addWidget(self.state_dot)
        state_row.addWidget(self.state_label)
        state_row.addStretch(1)
        self.state_detail = QLabel()
        self.state_detail.setObjectName("stateDetail")
        self.crash_note = QLabel()
        self.crash_note.setObjectName("crashNote")
        self.crash_note.setWordWrap(True)
        self.crash_note.setStyleSheet("color: #b45309")
        self.crash_note.setToolTip("From the engine's supervisor (logs/last_crash.json in the data dir)")
        state_box.addLayout(state_row)
        state_box.addWidget(self.state_detail)
        state_box.addWidget(self.crash_note)
        row.addLayout(state_box, 1)

        self.stats: dict[str, QLabel] = {}
        for key, name in (("peers", "peers"), ("round", "round"), ("policy_version", "policy version"),
                          ("model", "model")):
            box = QVBoxLayout()
            value = QLabel("–")
            value.setProperty("role", "statValue")
            value.setAlignment(Qt.AlignmentFlag.AlignCenter)
            label = QLabel(name)
            label.setProperty("role", "stat")
            label.setAlignment(Qt.AlignmentFlag.AlignCenter)
            box.addWidget(value)
            box.addWidget(label)
            self.stats[key] = value
            row.addLayout(box)
            row.addSpacing(8)

        self.pause_button = QPushButton("Pause after this round")
        self.pause_button.clicked.connect(self.pause_after_round)
        self.resume_button = QPushButton("Resume")
        self.resume_button.clicked.connect(self.resume)
        row.addWidget(self.pause_button)
        row.addWidget(self.resume_button)
        self.join_button = QPushButton("Join the swarm")
        self.join_button.setObjectName("joinButton")
        self.join_button.setMinimumHeight(52)
        self.join_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.join_button.clicked.connect(self.toggle_join)
        row.addWidget(self.join_button)
        return header

    # --- the timer: inbox -> models -> visible views -------------------------------------------------
    def tick(self) -> None:
        self.ticks += 1
        identity_changed = False
        for item in self.bridge.take(MAX_ITEMS_PER_TICK):  # the rest waits for the next tick, in order
            if isinstance(item, LinkChange):
                self._link_change(item)
            else:
                self.model.apply(item)
                identity_changed |= isinstance(item, (StateChanged, ModelProgress))
        if identity_changed:
            self.refresh_status()
        self._update_header()
        self._refresh_views()

    def _refresh_views(self) -> None:
        current = self.tabs.currentWidget()
        drawn = self.isVisible() and not self.isMinimized()  # hidden in the tray: models only, no drawing
        if drawn and current is not None and hasattr(current, "refresh"):
            current.refresh()
        now = time.monotonic()
        if drawn and current is self.peers and now - self._swarm_polled >= SWARM_POLL_S:
            self._swarm_polled = now  # the swarm counters only come with `status`: poll while shown
            self.refresh_status()
        self.machine.show_progress(self.model.progress)
        self.dashboard.set_eval_every(self.model.node.eval_every)
        for alert in self.fleet.tick():  # an engine of the fleet stopped, went silent or crashed
            self.model.log.add("warning", alert)
            self.statusBar().showMessage(alert, 15000)
            if self.tray is not None:
                self.tray.showMessage("SAPO Swarm", alert, QSystemTrayIcon.MessageIcon.Warning, 10000)
        if self.tray is not None:
            self.tray.update_from(self.model.node)

    def _link_change(self, change: LinkChange) -> None:
        node = self.model.node
        if change.up and change.snapshot is not None:
            snap = change.snapshot
            if "status" in snap:
                node.connected = True
                node.engine_url = self.bridge.url
                if isinstance(snap["status"], dict):
                    node.apply_status(snap["status"])
                    self.model.peers.apply_status(snap["status"])
                self.model.load_history(snap.get("history"))
                if isinstance(snap.get("settings"), dict):
                    self.model.settings = snap["settings"]
                    self.settings.show_settings(snap["settings"])
                self.statusBar().showMessage(f"Connected to the engine at {self.bridge.url}")
                self.model.log.add("info", f"connected to the engine at {self.bridge.url}")
            if isinstance(snap.get("machine"), dict):
                self.model.machine = snap["machine"]
                self.machine.show_machine(snap["machine"])
                sensors = snap["machine"].get("device", {}).get("temperature_sensors") \
                    if isinstance(snap["machine"].get("device"), dict) else None
                self.settings.set_temperature_supported(sensors is not False)
            return
        if not change.up:
            was = node.connected
            node.connected = False
            if node.data_dir:  # a local engine's supervisor writes why it died before it restarts it
                node.last_crash = read_last_crash(Path(node.data_dir)) or node.last_crash
            node.version += 1
            if was or change.fatal:
                self.model.log.add("warning", f"engine link lost: {change.reason}")
            hint = "" if change.fatal else " Retrying…"
            self.statusBar().showMessage(f"Not connected: {change.reason}.{hint}")

    def _update_header(self) -> None:
        node = self.model.node
        state = node.state if node.connected else "disconnected"
        self.state_dot.setPixmap(dot(STATE_COLORS.get(state, "#8a8f98")))
        self.state_label.setText(node.label if node.connected else "Engine not connected")
        self.state_label.setStyleSheet(f"color: {STATE_COLORS.get(state, '#111827')}")
        self.state_detail.setText(node.detail if node.connected else "The app reconnects by itself.")
        note = node.crash_note()
        self.crash_note.setText(note)
        self.crash_note.setVisible(bool(note))
        self.subtitle.setText(" · ".join(p for p in (node.peer_name, node.device.upper(), node.backend) if p))
        self.stats["peers"].setText(str(node.peers))
        self.stats["round"].setText(f"{node.round:,}")
        self.stats["policy_version"].setText(f"v{node.policy_version:,}")
        self.stats["model"].setText(short_model_name(node.model) or "–")
        self.stats["model"].setToolTip(node.model)
        join_mode = node.state == "stopped"
        self.join_button.setText("Join the swarm" if join_mode else
                                 "Leaving…" if node.state == "leaving" else "Leave the swarm")
        if self.join_button.property("leave") != (not join_mode):
            self.join_button.setProperty("leave", not join_mode)
            self.join_button.style().polish(self.join_button)
        self.join_button.setEnabled(node.connected and not self._busy and node.state != "leaving")
        self.pause_button.setVisible(node.state in ("solo", "in_swarm", "joining"))
        self.pause_button.setEnabled(node.connected)
        self.resume_button.setVisible(node.state in ("paused", "pausing"))
        self.machine.set_current_model(node.model, node.connected and node.state in ("stopped", "paused"))

    def refresh_status(self) -> None:
        """The header's model, device and backend change when a join loads the model or a model
        switch lands; events don't carry them, so ask for the status (one call in flight at most)."""
        if not self.model.node.connected:
            return
        if self._status_calls:
            self._status_stale = True
            return
        self._status_calls += 1

        def reply(result: Any, _error: str | None) -> None:
            self._status_calls -= 1
            if isinstance(result, dict):
                self.model.node.apply_identity(result)
                self.model.peers.apply_status(result)
                self._update_header()
            if self._status_stale:
                self._status_stale = False
                self.refresh_status()
        self.bridge.call("status", None, reply)

    # --- actions (all non-blocking) -----------------------------------------------------------------
    def _call(self, method: str, params: dict[str, Any] | None = None,
              done: Callable[[Any], None] | None = None) -> None:
        def reply(result: Any, error: str | None) -> None:
            if error is not None:
                self.model.log.add("error", f"{method} failed: {error}")
                self.statusBar().showMessage(f"{method} failed: {error}", 10_000)
            elif done is not None:
                done(result)
        self.bridge.call(method, params, reply)

    def toggle_join(self) -> None:
        node = self.model.node
        if not node.connected or self._busy:
            return
        method = "join" if node.state == "stopped" else "leave"
        self._busy = True
        self._update_header()

        def reply(_result: Any, error: str | None) -> None:
            self._busy = False
            if error is not None:
                self.model.log.add("error", f"{method} failed: {error}")
                self.statusBar().showMessage(f"Could not {method}: {error}", 10_000)
            self._update_header()
        self.bridge.call(method, None, reply)

    def pause_after_round(self) -> None:
        self._call("pause", {"after_round": True})

    def resume(self) -> None:
        self._call("resume")

    def snooze(self, seconds: float) -> None:
        self._call("snooze", {"seconds": seconds}, lambda _: self._call("get_settings", None,
                                                                         self.settings.show_settings))

    def _apply_settings(self, changes: dict[str, Any]) -> None:
        def reply(result: Any, error: str | None) -> None:
            if error is not None:
                self.settings.show_error(f"Not applied: {error}")
                return
            if isinstance(result, dict):
                self.model.settings = result
                self.settings.show_settings(result)
            self.settings.show_info(f"Saved at {time.strftime('%H:%M:%S')}.")
        self.bridge.call("update_settings", {"changes": changes}, reply)

    def _fetch_machine(self) -> None:
        self.machine.show_message("Checking…")

        def done(result: Any) -> None:
            if isinstance(result, dict):
                self.model.machine = result
                self.machine.show_machine(result)
                self.machine.show_message("")
        self._call("machine", None, done)

    def _switch_model(self, model_id: str) -> None:
        name = short_model_name(model_id)

        def reply(_result: Any, error: str | None) -> None:  # the same words as the progress events
            if error is not None:
                self.machine.show_message(progress_text(ModelProgress(model_id, "error", 0, 0, error)), error=True)
                return
            self.machine.show_message(progress_text(ModelProgress(model_id, "ready", 1, 1)))
            self.refresh_status()
        self.machine.show_message(f"Switching to {name}…")
        self.bridge.call("select_model", {"model_id": model_id}, reply)

    # --- window and app lifetime ---------------------------------------------------------------------
    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self._refresh_views()  # back from the tray: catch up at once

    def show_normal(self) -> None:
        self.show()
        self.raise_()
        self.activateWindow()

    def _tray_activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason == QSystemTrayIcon.ActivationReason.Trigger:
            self.show_normal() if self.isHidden() else self.hide()

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.tray is not None and not self._quitting:  # like BOINC: the window hides, the tray stays
            self.hide()
            if not self._told_about_tray:
                self._told_about_tray = True
                self.tray.showMessage("SAPO Swarm", "Still here: the tray icon shows the node's state.",
                                      QSystemTrayIcon.MessageIcon.Information, 4000)
            event.ignore()
            return
        self.shutdown()
        event.accept()

    def quit_app(self) -> None:
        self._quitting = True
        self.close()
        QApplication.quit()

    def shutdown(self) -> None:
        """Stop the timer and the bridge; stop the engine too unless it should keep contributing."""
        self._quitting = True
        self.timer.stop()
        keep = bool(self.model.settings.get("keep_running_on_close", True))
        if not keep and self.model.node.connected:
            error = self.bridge.call_at_exit("shutdown")
            if error is not None and self._stop_engine is not None:
                self._stop_engine()  # SIGTERM to the child we started: it checkpoints and says bye
        self.bridge.stop()
        self.fleet_poller.stop()
        if self.tray is not None:
            self.tray.hide()
