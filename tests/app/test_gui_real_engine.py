"""The app against the real engine process (`sapo run --headless --control`), as `sapo gui` runs it:
started detached at low priority, found through control.json, driven over the control API."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.bridge import EngineBridge
from app.views.main_window import MainWindow
from engine.control.launcher import find_engine, start_engine, stop_process, wait_for_engine
from engine.control.token import read_token

pytestmark = pytest.mark.slow  # a real engine process: torch import, model load, real rounds


@pytest.fixture
def real_engine(tmp_path: Path) -> Iterator[Path]:
    from engine.models.policy import build_tiny_policy

    model = build_tiny_policy(tmp_path / "tiny")
    data_dir = tmp_path / "data"
    proc = start_engine(data_dir, command=[sys.executable, "-m", "engine", "run", "--headless", "--control",
                                           "--solo", "--paused", "--data-dir", str(data_dir), "--model", str(model)])
    try:
        wait_for_engine(data_dir, proc, timeout_s=120)
        yield data_dir
    finally:
        stop_process(proc)
    assert find_engine(data_dir) is None  # it removed its control.json on the way out


def test_join_rounds_and_leave_with_the_real_engine(qtbot: QtBot, real_engine: Path) -> None:
    info = find_engine(real_engine)
    assert info is not None
    bridge = EngineBridge(info.url, lambda: read_token(real_engine))
    window = MainWindow(bridge, refresh_ms=100, use_tray=False)
    qtbot.addWidget(window)
    bridge.start()
    window.show()
    try:
        qtbot.waitUntil(lambda: window.model.node.connected, timeout=30_000)
        qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: window.model.dashboard.rounds >= 2, timeout=120_000)
        assert window.model.node.state == "solo"
        assert len(window.model.dashboard.series["tokens_per_s"]) >= 2
        assert "generate" in window.model.dashboard.phases
        qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: window.model.node.state == "stopped", timeout=120_000)
    finally:
        window.shutdown()
