"""The walk-through's Qt driver: one app process's window, engines, clicks, waits, screenshots and steps.

Imported only by the walk-through's app processes (lab/bench/walkthrough_steps.py), never by the parent
(lab/bench/walkthrough.py), which stays Qt-free: Qt's platform is fixed per process, and only the
children get the Xvfb display.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QPoint, Qt, QTimer
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QTableWidget, QWidget

from app import main as app_main
from app.bridge import EngineBridge
from app.views.main_window import MainWindow
from engine.control.launcher import stop_process
from engine.control.token import read_control_info, read_token
from lab.bench.walkthrough import PIDS_FILE, SCREEN


class Walk:
    """One app process of the walk-through: its Qt application, the window it opens, the engines it starts.
    `t0` is the walk-through's start (the parent's time.monotonic(), the same clock in every process), so
    that steps' `at_s` and the budget run across both app processes."""

    def __init__(self, work: Path, shots: Path, t0: float, timeout_s: float) -> None:
        self.work, self.shots = work, shots
        self.t0 = t0
        self.deadline = self.t0 + timeout_s
        self.steps: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.app = app_main.make_app()
        # The walk pumps events itself (no app.exec()) and still waits for the engine after the window closes.
        self.app.setQuitOnLastWindowClosed(False)
        self.engines: list[subprocess.Popen[bytes]] = []
        self.window: Any = None
        self.proc: subprocess.Popen[bytes] | None = None  # the window's engine
        self.wider = self.solo = False  # noted once each (see `step`)

    # helpers
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def say(self, text: str) -> None:
        print(f"walkthrough [{self.elapsed():6.1f} s] {text}", file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.say(f"note: {text}")

    def remaining(self, cap: float) -> float:
        return max(0.0, min(cap, self.deadline - time.monotonic()))

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            self.app.processEvents()
            if time.monotonic() >= end:
                return
            time.sleep(0.005)

    def wait(self, done: Callable[[], bool], cap: float, what: str,
             each: Callable[[], None] | None = None, quiet: bool = False) -> float | None:
        """Pump Qt until `done()`; its seconds, or None (noted unless `quiet`: the caller says it in its
        own words) when `cap` or the budget ran out first."""
        start = time.monotonic()
        end = start + self.remaining(cap)
        while True:
            self.app.processEvents()
            if done():
                return time.monotonic() - start
            if each is not None:
                each()
            if time.monotonic() >= end:
                if not quiet:
                    self.note(f"timed out after {time.monotonic() - start:.0f} s waiting for {what}")
                return None
            time.sleep(0.005)

    def click(self, widget: QWidget) -> float:
        """A left click on `widget`, as a contributor's; the time of the click."""
        clicked = time.monotonic()
        QTest.mouseClick(widget, Qt.MouseButton.LeftButton)
        return clicked

    def select_row(self, table: QTableWidget, text: str) -> bool:
        """Click the row whose first cell reads `text` (scrolled into view first), as a contributor picks it."""
        for row in range(table.rowCount()):
            item = table.item(row, 0)
            if item is None or item.text() != text:
                continue
            table.scrollToItem(item)
            self.pump(0.2)
            centre: QPoint = table.visualItemRect(item).center()
            QTest.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, centre)
            self.pump(0.2)
            return table.currentRow() == row
        return False

    def track(self, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.engines.append(proc)
        with (self.work / PIDS_FILE).open("a") as fh:
            fh.write(f"{proc.pid}\n")
        return proc

    def shot(self, name: str, view: Any = None) -> str:
        """The whole X screen, with `view` the current tab (the dashboard when None and a window is shown)."""
        window = self.window
        if window is not None and window.isVisible():
            window.tabs.setCurrentWidget(view if view is not None else window.dashboard)
            self.pump(0.6)  # the tab's first refresh and paint
        path = self.shots / f"walkthrough_{name}.png"
        try:
            subprocess.run(["import", "-window", "root", str(path)], check=True, timeout=60,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except (OSError, subprocess.SubprocessError) as exc:
            self.note(f"screenshot {path.name} failed: {exc}")
            return ""
        return str(path)

    def header(self) -> str:
        """What the header says now: state, detail, and the round / model stats."""
        w = self.window
        if w is None:
            return ""
        detail = w.state_detail.text()
        return (f"{w.state_label.text()}{' · ' + detail if detail else ''} · round {w.stats['round'].text()} · "
                f"peers {w.stats['peers'].text()} · {w.stats['model'].text()}")

    def values(self) -> dict[str, str]:
        """What the restart and the switch back must bring back: the header's round and model, the
        dashboard's rounds and cumulative reward cards."""
        win = self.window
        cards = win.dashboard.cards
        return {"round": win.stats["round"].text(), "model": win.stats["model"].text(),
                "rounds": cards["rounds"].text(), "cumulative_reward": cards["cumulative"].text()}

    def step(self, name: str, seconds: float | None, screenshot: str, shows: str = "", **extra: Any) -> None:
        window = self.window if self.window is not None and self.window.isVisible() else None
        size = [window.width(), window.height()] if window is not None else None
        self.steps.append({"name": name, "seconds": None if seconds is None else round(seconds, 3),
                           "at_s": round(self.elapsed(), 1), "screenshot": screenshot,
                           "shows": shows or self.header(), **({"window_px": size} if size else {}), **extra})
        if size and size[0] > SCREEN[0] and not self.wider:
            self.wider = True
            self.note(f"from step {name} on the window is {size[0]} px wide on a {SCREEN[0]} px screen (it was "
                      f"{SCREEN[0]} at the first start): the header's right end is off the screen")
        if window is not None and window.model.node.state == "solo" and window.model.node.peers > 0 and not self.solo:
            self.solo = True
            self.note(f"at step {name} the header says '{window.state_label.text()}' with "
                      f"{window.model.node.peers} peer(s) connected")
        took = "timed out" if seconds is None else f"{seconds:.2f} s"
        self.say(f"step {name}: {took} · {self.steps[-1]['shows']}")

    # the engine, as `sapo gui` starts it, and its window
    def open_window(self, data_dir: Path, engine_args: tuple[str, ...], dialog_shot: str = "") -> tuple[float, float]:
        """Start the engine (app.main.start_engine), wait with the app's own progress dialog
        (app.main.wait_for_start), then the MainWindow linked through an EngineBridge, as run_gui does.
        Returns (seconds until the engine served, seconds until the window showed the engine's model)."""
        start = time.monotonic()
        proc = self.track(app_main.start_engine(data_dir, engine_args))
        self.proc = proc
        dialog_timer = QTimer()
        dialog_timer.setSingleShot(True)
        shot: list[str] = []
        if dialog_shot:
            dialog_timer.timeout.connect(lambda: shot.append(self.shot(dialog_shot)))
            dialog_timer.start(1500)
        waited = app_main.wait_for_start(data_dir, proc)
        dialog_timer.stop()
        served = time.monotonic() - start
        if isinstance(waited, str):
            raise RuntimeError(f"the engine could not start: {waited}")  # noqa: TRY004 - not a type error
        if shot and shot[0]:
            self.step("engine_starting", served, shot[0], shows="the app's 'Starting the SAPO engine…' dialog",
                      engine_pid=proc.pid)

        def current_url() -> str | None:
            found = read_control_info(data_dir)
            return found.url if found else None
        bridge = EngineBridge(waited.url, lambda: read_token(data_dir), url_provider=current_url)
        self.window = MainWindow(bridge, stop_engine=proc.terminate, fleet_file=self.work / "fleet.json")
        self.window.move(0, 0)
        bridge.start()
        self.window.show()
        node = self.window.model.node
        shown = self.wait(lambda: node.connected and bool(node.model) and self.window.join_button.isEnabled(),
                          60, "the window to connect to the engine")
        return served, (time.monotonic() - start) if shown is not None else float("nan")

    def close_window(self) -> float | None:
        """Close the window as a contributor does; without a tray the engine stops. Seconds until its
        process (the supervisor and its engine) exited."""
        start = time.monotonic()
        self.window.close()
        self.pump(0.2)
        self.window.deleteLater()
        self.window = None
        proc = self.proc
        assert proc is not None
        gone = self.wait(lambda: proc.poll() is not None, 90, "the engine to exit after the window closed")
        if gone is None:
            stop_process(proc)
            return None
        return time.monotonic() - start

    def stop_all(self) -> None:
        if self.window is not None:
            try:
                self.window.shutdown(keep_engine=False)
            except Exception as exc:  # noqa: BLE001 - cleanup goes on
                self.note(f"window shutdown failed: {exc}")
        for proc in self.engines:
            if proc.poll() is None:
                stop_process(proc)
