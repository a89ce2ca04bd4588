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

from PySide6.QtCore import QTimer
from PySide6.QtGui import QCloseEvent, QShowEvent
from PySide6.QtWidgets import (
    QApplication,
    QMainWindow,
    QSystemTrayIcon,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.bridge import EngineBridge, EngineSession, LinkChange
from app.models import AppModel
from app.models.peers import swarm_where
from app.theme import app_icon
from app.tray import TrayIcon
from app.views.dashboard import DashboardView
from app.views.engine_actions import EngineActions
from app.views.fleet import LOCAL_NAME, FleetView, local_entry
from app.views.header import Header
from app.views.log import LogView
from app.views.machine import MachineView
from app.views.peers import PeersView
from app.views.rollouts import RolloutsView
from app.views.settings import SettingsView
from app.views.try_it import TryItView
from engine.control.status import NodeStatus
from engine.events import ModelProgress, StateChanged
from engine.fleet import FleetEntry, FleetPoller
from engine.paths import fleet_file as default_fleet_file
from engine.supervisor import read_last_crash

SWARM_POLL_S = 2.0  # status polls while the Peers tab is shown (refused/dropped counters)
MAX_ITEMS_PER_TICK = 3000  # bounds the work of one tick, so a burst never stalls the event loop


PER_ENGINE_TABS = (("dashboard", "Dashboard"), ("try_it", "Try it"), ("rollouts", "Shared rollouts"),
                   ("peers", "Peers"), ("machine", "Machine"), ("settings", "Settings"), ("log_view", "Log"))
FLEET_TAB_INDEX = 4  # after Peers: the one tab that is the same whichever engine is shown


class MainWindow(EngineActions, QMainWindow):
    """Shows one engine at a time: this window's own (`home`, always linked: its tray, its exit) or
    another engine of the fleet, switched to in place from the Fleet tab. The header's buttons and
    the tabs act on the engine shown; the tray always on this machine's."""

    def __init__(self, bridge: EngineBridge, model: AppModel | None = None, *, refresh_ms: int = 250,
                 stop_engine: Callable[[], None] | None = None, use_tray: bool = True,
                 fleet_file: Path | None = None) -> None:
        super().__init__()
        self.home = EngineSession(LOCAL_NAME, bridge, model or AppModel(), home=True)
        self.session = self.home
        self._stop_engine = stop_engine  # set when this app started the engine process
        self._quitting = False
        self._swarm_polled = 0.0  # last status poll for the Peers tab's swarm counters
        self._told_about_tray = False
        self._has_tray = use_tray and QSystemTrayIcon.isSystemTrayAvailable()
        self.setWindowTitle("SAPO Swarm")
        self.setWindowIcon(app_icon())
        self.resize(1280, 820)

        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self._build_header())
        layout.addWidget(self._build_tabs(bridge, fleet_file), 1)
        self.setCentralWidget(central)
        self.statusBar().showMessage(f"Connecting to the engine at {bridge.url}…")
        self.tray: TrayIcon | None = self._build_tray() if self._has_tray else None
        self._start_polling(refresh_ms)

    def _build_header(self) -> Header:
        """The header, its buttons acting on the engine shown; the window names its widgets too."""
        self.header = Header()
        h = self.header
        self.subtitle, self.state_dot, self.state_label, self.state_detail = \
            h.subtitle, h.state_dot, h.state_label, h.state_detail
        self.crash_note, self.stats = h.crash_note, h.stats
        self.pause_button, self.resume_button, self.join_button = h.pause_button, h.resume_button, h.join_button
        h.pause_button.clicked.connect(lambda: self.pause_after_round())
        h.resume_button.clicked.connect(lambda: self.resume())
        h.join_button.clicked.connect(lambda: self.toggle_join())
        h.home_button.clicked.connect(self.show_home)
        return h

    def _build_tabs(self, bridge: EngineBridge, fleet_file: Path | None) -> QTabWidget:
        """The per-engine tabs, with the Fleet tab (the same whichever engine is shown) among them."""
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.fleet_poller = FleetPoller()
        provider = getattr(bridge, "token", None)
        self.fleet = FleetView(self.fleet_poller, lambda: local_entry(bridge.url, provider) if provider else None,
                               fleet_file or default_fleet_file())
        self.fleet.show_local_requested.connect(self.show_home)
        self.fleet.show_engine_requested.connect(self.show_engine)
        self._build_views(self.model)
        for name, title in PER_ENGINE_TABS:
            self.tabs.addTab(getattr(self, name), title)
        self.tabs.insertTab(FLEET_TAB_INDEX, self.fleet, "Fleet")
        self.tabs.currentChanged.connect(lambda _: self._refresh_views())
        return self.tabs

    def _build_tray(self) -> TrayIcon:
        """The tray icon: it always acts on this machine's engine (`home`), whichever one is shown."""
        tray = TrayIcon(self)
        tray.show_action.triggered.connect(self.show_normal)
        tray.join_action.triggered.connect(lambda: self.toggle_join(self.home))
        tray.pause_action.triggered.connect(lambda: self.pause_after_round(self.home))
        tray.resume_action.triggered.connect(lambda: self.resume(self.home))
        tray.snooze_action.triggered.connect(lambda: self.snooze(3600.0, self.home))
        tray.quit_action.triggered.connect(self.quit_app)
        tray.activated.connect(self._tray_activated)
        tray.show()
        return tray

    def _start_polling(self, refresh_ms: int) -> None:
        """The tick timer (inbox -> models -> views) and the fleet's poller; then a first header."""
        self.ticks = 0
        self.timer = QTimer(self)
        self.timer.setInterval(refresh_ms)
        self.timer.timeout.connect(self.tick)
        self.timer.start()
        self.fleet_poller.start()
        self._update_header()

    @property
    def bridge(self) -> EngineBridge:
        """The link to the engine shown."""
        return self.session.bridge

    @property
    def model(self) -> AppModel:
        """The models of the engine shown."""
        return self.session.model  # type: ignore[no-any-return]

    def _build_views(self, m: AppModel) -> None:
        """The per-engine tabs, drawing `m`; built again when another engine is shown."""
        self.dashboard = DashboardView(m.dashboard)
        self.try_it = TryItView(m.node, self.session.bridge.call)  # asks the engine shown (rebuilt on a switch)
        self.rollouts = RolloutsView(m.feed, m.peers)
        self.peers = PeersView(m.peers)
        self.machine = MachineView()
        self.settings = SettingsView()
        self.settings.set_tray_available(self._has_tray)
        self.log_view = LogView(m.log)
        self.settings.apply_requested.connect(self._apply_settings)
        self.settings.pause_after_round_requested.connect(lambda: self.pause_after_round())
        self.settings.snooze_requested.connect(lambda seconds: self.snooze(seconds))
        self.settings.resume_requested.connect(lambda: self.resume())
        self.machine.refresh_requested.connect(self._fetch_machine)
        self.machine.switch_requested.connect(self._switch_model)

    # --- which engine is shown -------------------------------------------------------------------
    def show_home(self) -> None:
        """This machine's engine, on its dashboard."""
        self._show_session(self.home)

    def show_engine(self, entry: FleetEntry) -> None:
        """Another engine of the fleet, in place: its own link and models, the same tabs."""
        if not self.session.home and self.session.bridge.url == entry.url:
            self.tabs.setCurrentWidget(self.dashboard)
            return
        bridge = EngineBridge(entry.url, lambda: entry.token)
        bridge.start()
        self._show_session(EngineSession(entry.name, bridge, AppModel()))
        self.statusBar().showMessage(f"Connecting to {entry.name} at {entry.url}…")

    def _show_session(self, session: EngineSession) -> None:
        if session is not self.session:
            old = self.session
            if not old.home:
                old.bridge.stop()  # another engine is linked only while shown
            self.session = session
            olds = [getattr(self, name) for name, _ in PER_ENGINE_TABS]
            current = self.tabs.currentIndex()
            self.tabs.blockSignals(True)
            self._build_views(session.model)
            for view, (name, title) in zip(olds, PER_ENGINE_TABS):
                index = self.tabs.indexOf(view)
                self.tabs.removeTab(index)
                self.tabs.insertTab(index, getattr(self, name), title)
                view.deleteLater()
            self.tabs.setCurrentIndex(current)
            self.tabs.blockSignals(False)
            m = session.model
            if m.settings:
                self.settings.show_settings(m.settings)
            if m.machine:
                self._show_machine(m.machine)
            self.dashboard.refresh(full=True)
            self.setWindowTitle("SAPO Swarm" if session.home else f"SAPO Swarm — {session.name}")
        self.tabs.setCurrentWidget(self.dashboard)
        self._update_header()

    # --- the timer: inbox -> models -> visible views -------------------------------------------------
    def tick(self) -> None:
        self.ticks += 1
        for session in {id(s): s for s in (self.home, self.session)}.values():  # home stays current
            identity_changed = False
            for item in session.bridge.take(MAX_ITEMS_PER_TICK):  # the rest waits for the next tick, in order
                if isinstance(item, LinkChange):
                    self._link_change(session, item)
                else:
                    session.model.apply(item)
                    identity_changed |= isinstance(item, (StateChanged, ModelProgress))
                    if session.home and self.tray is not None:
                        self.tray.notify(item)  # a failed round, a lost board: rate-limited
            if identity_changed:
                self.refresh_status(session)
            self.reload_history(session)  # only after a switch to a model trained here before
        self._update_header()
        self._refresh_views()

    def _refresh_views(self) -> None:
        current = self.tabs.currentWidget()
        drawn = self.isVisible() and not self.isMinimized()  # hidden in the tray: models only, no drawing
        if drawn and current is not None and hasattr(current, "refresh"):
            current.refresh()
        now = time.monotonic()
        if drawn and current in (self.peers, self.machine) and now - self._swarm_polled >= SWARM_POLL_S:
            self._swarm_polled = now  # the swarm's and the contribution's counters come with `status` only
            self.refresh_status()
        self.machine.show_progress(self.model.progress)
        if drawn and current is self.machine:
            total = self.model.dashboard.phases.get("total")
            self.machine.show_measured(total.y if total is not None else [])
        self.dashboard.set_eval_every(self.model.node.eval_every, self.model.node.eval_every_s)
        for alert in self.fleet.tick():  # an engine of the fleet stopped, went silent or crashed
            self.home.model.log.add("warning", alert)
            self.statusBar().showMessage(alert, 15000)
            if self.tray is not None:
                self.tray.showMessage("SAPO Swarm", alert, QSystemTrayIcon.MessageIcon.Warning, 10000)
        if self.tray is not None:
            self.tray.update_from(self.home.model.node)

    def _link_change(self, session: EngineSession, change: LinkChange) -> None:
        """Into `session`'s models always; into the views only when it is the engine shown."""
        model, node, shown = session.model, session.model.node, session is self.session
        url = session.bridge.url
        if change.up and change.snapshot is not None:
            snap = change.snapshot
            status = snap.get("status")
            if isinstance(status, NodeStatus):
                node.connect(url, status)
                model.peers.apply_status(status)
                model.peers.engine_connected(status.peers)
                model.load_history(snap.get("history"))
                if isinstance(snap.get("settings"), dict):
                    model.settings = snap["settings"]
                    if shown:
                        self.settings.show_settings(snap["settings"])
                if shown:
                    self.statusBar().showMessage(f"Connected to the engine at {url}")
                model.log.add("info", f"connected to the engine at {url}")
            if isinstance(snap.get("machine"), dict):
                model.machine = snap["machine"]
                if shown:
                    self._show_machine(snap["machine"])
            return
        if not change.up:
            was = node.connected
            # a local engine's supervisor writes why it died before a restart
            node.disconnect(read_last_crash(Path(node.data_dir)) if node.data_dir and session.home else None)
            if was or change.fatal:
                model.log.add("warning", f"engine link lost: {change.reason}")
            if shown:
                hint = "" if change.fatal else " Retrying…"
                self.statusBar().showMessage(f"Not connected: {change.reason}.{hint}")

    def _show_machine(self, machine: dict[str, Any]) -> None:
        """The machine report into the Machine tab, and whether Settings may offer a temperature limit."""
        self.machine.show_machine(machine)
        device = machine.get("device")
        sensors = device.get("temperature_sensors") if isinstance(device, dict) else None
        self.settings.set_temperature_supported(sensors is not False)

    def _update_header(self) -> None:
        node = self.model.node
        self.header.show_node(node, self.session.busy, "" if self.session.home else self.session.name,
                              swarm_where(self.model.peers.swarm, node.state))
        self.machine.set_current_model(node.model, node.connected and node.state in ("stopped", "paused"))
        self.machine.giving.show_contribution(node.contribution)

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

    def shutdown(self, keep_engine: bool | None = None) -> None:
        """Stop the timer and the bridge; stop the engine too unless it should keep contributing
        (`keep_engine` None: the contributor's setting, honoured only where a tray icon shows the engine
        still at work; with no tray nothing would, so closing the window stops contributing)."""
        self._quitting = True
        self.timer.stop()
        home = self.home
        if keep_engine is None:
            keep_engine = self.tray is not None and bool(home.model.settings.get("keep_running_on_close", True))
        keep = keep_engine
        if not keep and home.model.node.connected:
            error = home.bridge.call_at_exit("shutdown")
            if error is not None and self._stop_engine is not None:
                self._stop_engine()  # SIGTERM to the child we started: it checkpoints and says bye
        if not self.session.home:
            self.session.bridge.stop()
        home.bridge.stop()
        self.fleet_poller.stop()
        if self.tray is not None:
            self.tray.hide()
