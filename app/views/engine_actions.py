"""The main window's actions on the engine shown: join / leave, pause, resume, snooze, settings, the
machine check and a model switch. Each is one non-blocking call; its reply comes back later on the
Qt thread, and an error is said in the log and the status bar, never raised.

A mixin of MainWindow (it uses the window's session, views and status bar), kept apart so the window
module holds the layout and the refresh loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from app.bridge import EngineSession
from app.views.machine import progress_text, short_model_name
from engine.control.status import NodeStatus
from engine.events import ModelProgress

HISTORY_LIMIT = 2000  # rounds of a model the dashboard reloads (its totals count all of them)

if TYPE_CHECKING:
    from PySide6.QtWidgets import QStatusBar

    from app.views.machine import MachineView
    from app.views.settings import SettingsView
    from engine.fleet import FleetPoller


class EngineActions:
    """The calls behind the header's buttons, the tray's menu and the Settings and Machine tabs."""

    session: EngineSession
    settings: SettingsView
    machine: MachineView
    fleet_poller: FleetPoller

    if TYPE_CHECKING:  # the window's own (QMainWindow's and MainWindow's); defined here they would shadow them
        def statusBar(self) -> QStatusBar: ...
        def _update_header(self) -> None: ...

    def refresh_status(self, session: EngineSession | None = None) -> None:
        """The header's model, device and backend change when a join loads the model or a model
        switch lands; events don't carry them, so ask for the status (one call in flight at most)."""
        s = session or self.session
        if not s.model.node.connected:
            return
        if s.status_calls:
            s.status_stale = True
            return
        s.status_calls += 1

        def reply(result: Any, _error: str | None) -> None:
            s.status_calls -= 1
            if isinstance(result, NodeStatus):
                s.model.node.apply_identity(result)
                s.model.peers.apply_status(result)
                self._update_header()
            if s.status_stale:
                s.status_stale = False
                self.refresh_status(s)
        s.bridge.call("status", None, reply)

    def reload_history(self, session: EngineSession) -> None:
        """The dashboard needs a model's stored record (the node switched models, or rounds of another
        model arrived): ask for it; the rounds, evals, totals and whose they are arrive with the reply."""
        dashboard = session.model.dashboard
        if not dashboard.wants_history or not session.model.node.connected:
            return
        dashboard.wants_history = None  # one call; a failed one waits for the next reconnect

        def reply(result: Any, _error: str | None) -> None:
            if isinstance(result, dict):
                session.model.load_history({k: result.get(k, []) for k in ("rounds", "evals")}
                                           | {"totals": result.get("totals"), "model": result.get("model")})
        session.bridge.call("history", {"limit": HISTORY_LIMIT}, reply)

    # --- actions (all non-blocking; on the engine shown unless told which) ----------------------------
    def _call(self, method: str, params: dict[str, Any] | None = None,
              done: Callable[[Any], None] | None = None, session: EngineSession | None = None) -> None:
        s = session or self.session

        def reply(result: Any, error: str | None) -> None:
            if error is not None:
                s.model.log.add("error", f"{method} failed: {error}")
                self.statusBar().showMessage(f"{method} failed: {error}", 10_000)
            elif done is not None:
                done(result)
        s.bridge.call(method, params, reply)

    def toggle_join(self, session: EngineSession | None = None) -> None:
        s = session or self.session
        node = s.model.node
        if not node.connected or s.busy:
            return
        method = "join" if node.state == "stopped" else "leave"
        if method == "leave":
            self.fleet_poller.expect_stop(s.bridge.url)  # asked for here: no "stopped training" alert
        s.busy = True
        self._update_header()

        def reply(_result: Any, error: str | None) -> None:
            s.busy = False
            if error is not None:
                s.model.log.add("error", f"{method} failed: {error}")
                self.statusBar().showMessage(f"Could not {method}: {error}", 10_000)
            self._update_header()
        s.bridge.call(method, None, reply)

    def pause_after_round(self, session: EngineSession | None = None) -> None:
        self.fleet_poller.expect_stop((session or self.session).bridge.url)
        self._call("pause", {"after_round": True}, session=session)

    def resume(self, session: EngineSession | None = None) -> None:
        self._call("resume", session=session)

    def snooze(self, seconds: float, session: EngineSession | None = None) -> None:
        s = session or self.session

        def shown_settings(result: Any) -> None:
            if s is self.session:
                self.settings.show_settings(result)
        self._call("snooze", {"seconds": seconds}, lambda _: self._call("get_settings", None, shown_settings, s), s)

    def _apply_settings(self, changes: dict[str, Any]) -> None:
        s, view = self.session, self.settings

        def reply(result: Any, error: str | None) -> None:
            if error is not None:
                view.show_error(f"Not applied: {error}")
                return
            if isinstance(result, dict):
                s.model.settings = result
                view.show_settings(result)
            view.show_info(f"Saved at {time.strftime('%H:%M:%S')}.")
        s.bridge.call("update_settings", {"changes": changes}, reply)

    def _fetch_machine(self) -> None:
        s, view = self.session, self.machine
        view.show_message("Checking…")

        def done(result: Any) -> None:
            if isinstance(result, dict):
                s.model.machine = result
                view.show_machine(result)
                view.show_message("")
        self._call("machine", None, done, s)

    def _switch_model(self, model_id: str) -> None:
        name = short_model_name(model_id)
        s, view = self.session, self.machine

        def reply(_result: Any, error: str | None) -> None:  # the same words as the progress events
            if error is not None:
                view.show_message(progress_text(ModelProgress(model_id, "error", 0, 0, error)), error=True)
                return
            view.show_message(progress_text(ModelProgress(model_id, "ready", 1, 1)))
            self.refresh_status(s)
        view.show_message(f"Switching to {name}…")
        s.bridge.call("select_model", {"model_id": model_id}, reply)
