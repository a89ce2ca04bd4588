"""The window says why the engine is paused (a schedule set in Settings, by hand), and the tray turns a
failed round or a lost board into a notification, a few at most."""

from __future__ import annotations

import os
import time
from pathlib import Path

from conftest import EngineThread
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget
from pytestqt.qtbot import QtBot

from app.tray import NOTICE_EVERY_S, FailureNotices, TrayIcon
from app.views.main_window import MainWindow
from engine.events import LogRecord, StateChanged
from engine.machine.guard import local_time
from engine.settings import ContributorSettings

WAIT_MS = 60_000


def closed_now() -> str:
    """A daily one-hour window two hours from now: closed at this moment."""
    now = local_time(time.time()).minute
    start, end = (now + 120) % 1440, (now + 180) % 1440
    return f"{start // 60:02d}:{start % 60:02d}-{end // 60:02d}:{end % 60:02d}"


def test_the_header_says_the_schedule_holds_the_engine(qtbot: QtBot, window: MainWindow,
                                                        engine: EngineThread) -> None:
    view = window.settings
    window.tabs.setCurrentWidget(view)
    view.pause_on_battery.setChecked(False)
    view.schedule.setText("Mon-Fri 25:00-08:00")  # refused here with what is wrong, never sent
    qtbot.mouseClick(view.apply_button, Qt.MouseButton.LeftButton)
    assert "'25:00' is not a time of day" in view.message.text()
    view.schedule.setText(closed_now())
    view.start_paused.setChecked(True)
    qtbot.mouseClick(view.apply_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: view.message.text().startswith("Saved"), timeout=WAIT_MS)
    saved = ContributorSettings.load(engine.data_dir)
    assert saved.schedule == closed_now() and saved.start_paused
    qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.model.node.state == "paused", timeout=WAIT_MS)
    assert window.state_label.text() == "Paused"
    assert window.state_detail.text().startswith("outside your schedule (next run ")
    assert engine.status().paused_by == "schedule"
    shot = os.environ.get("SAPO_SHOT_DIR")  # a picture for a person to look at, when asked for
    if shot:
        window.grab().save(str(Path(shot) / "paused_by_schedule.png"))
    qtbot.mouseClick(window.header.pause_button if window.header.pause_button.isVisible()
                     else view.pause_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.state_detail.text() == "paused by you", timeout=WAIT_MS)
    assert engine.status().paused_by == "you"


def test_failures_notify_once_per_kind_per_interval() -> None:
    notices, now = FailureNotices(), time.time()
    crash = LogRecord(level="error", message="Traceback (most recent call last):\n  ...\nRuntimeError: out of memory",
                      ts=now)
    title, text = notices.notice(crash, now) or ("", "")
    assert title == "SAPO Swarm: training stopped" and text.endswith("RuntimeError: out of memory")
    assert notices.notice(crash, now + 1) is None  # a failing loop: quiet for a while
    board = LogRecord(level="warning", message="swarm: the board connection ended (EOF); reconnecting", ts=now)
    assert notices.notice(board, now + 2) == ("SAPO Swarm: lost the board", board.message)  # its own kind
    later = now + NOTICE_EVERY_S + 5
    again = notices.notice(LogRecord(level="error", message="ValueError: bad", ts=later), later)
    assert again is not None and "(1 more since the last notice)" in again[1]
    assert notices.notice(LogRecord(level="warning", message="swarm: a peer left", ts=later), later) is None
    assert notices.notice(LogRecord(level="info", message="ready", ts=later), later) is None
    assert notices.notice(StateChanged(state="stopped", detail="x"), later) is None
    old = LogRecord(level="warning", message="swarm: the board at nats://x:4222 is unreachable", ts=later - 3600)
    assert FailureNotices().notice(old, later) is None  # replayed on connecting: history, not news


def test_the_tray_raises_a_notice_for_a_failure(qtbot: QtBot) -> None:
    parent = QWidget()
    qtbot.addWidget(parent)
    tray = TrayIcon(parent)
    tray.notify(LogRecord(level="info", message="round 3 done"))
    tray.notify(LogRecord(level="error", message="RuntimeError: the round failed"))
    tray.notify(LogRecord(level="error", message="RuntimeError: the round failed"))
    assert tray.notified == [("SAPO Swarm: training stopped",
                              "A round failed, training stopped: RuntimeError: the round failed")]
