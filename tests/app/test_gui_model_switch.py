"""The Machine tab's model switch end to end: button -> control API -> Node.select_model -> progress
events -> progress bar and label -> header; then rounds run on the new model."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EngineThread, connected_window
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.views.main_window import MainWindow
from engine.events import ModelProgress
from engine.paths import SEED_MODEL_DIR

WAIT_MS = 15_000


@pytest.fixture
def window(qtbot: QtBot, engine: EngineThread) -> Iterator[MainWindow]:
    win = connected_window(qtbot, engine)
    qtbot.waitUntil(lambda: win.machine.table.rowCount() > 0, timeout=WAIT_MS)
    win.tabs.setCurrentWidget(win.machine)
    yield win
    win.shutdown()


def _select_row(window: MainWindow, model_id: str) -> None:
    table = window.machine.table
    rows = [i for i in range(table.rowCount()) if table.item(i, 0).text() == model_id]
    assert rows, f"{model_id} is not in the Machine tab"
    table.selectRow(rows[0])


def test_switch_button_without_the_hub_shows_a_clear_error(qtbot: QtBot, window: MainWindow, engine: EngineThread,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A catalog model on a machine with no internet: the hub refuses connections, nothing is cached."""
    import huggingface_hub.constants as hub

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(hub, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)  # `make test` runs offline; this test wants a dead hub
    view = window.machine
    _select_row(window, "qwen2.5-0.5b-instruct")
    qtbot.mouseClick(view.switch_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: isinstance(window.model.progress, ModelProgress) and window.model.progress.phase == "error",
                    timeout=WAIT_MS)
    qtbot.waitUntil(lambda: "Could not switch to qwen2.5-0.5b-instruct" in view.progress_label.text(), timeout=WAIT_MS)
    assert "Connection refused" in view.progress_label.text() and view.progress_label.property("role") == "error"
    assert view.switch_button.isEnabled() and not view.progress.isVisible()
    assert window.stats["model"].text() == "tiny-a" and engine.status().model.endswith("tiny-a")


def test_switch_to_another_model_then_rounds_run_on_it(qtbot: QtBot, window: MainWindow, engine: EngineThread,
                                                       tiny_model_b: Path) -> None:
    view = window.machine
    # refused while training: the button is off, and the node itself refuses (other clients exist)
    assert view.switch_button.isEnabled()
    qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: engine.status().round >= 1, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not view.switch_button.isEnabled(), timeout=WAIT_MS)
    assert view.progress_label.text() == "Pause or leave the swarm to switch models."
    view.switch_requested.emit(str(tiny_model_b))  # what the button sends for a selected row
    qtbot.waitUntil(lambda: "pause or leave before switching" in view.progress_label.text(), timeout=WAIT_MS)
    qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)  # leave
    qtbot.waitUntil(lambda: window.model.node.state == "stopped", timeout=WAIT_MS)
    before = engine.status().round
    # stopped: the switch lands, the header shows the new model before any round runs on it
    view.switch_requested.emit(str(tiny_model_b))
    qtbot.waitUntil(lambda: window.stats["model"].text() == "tiny-b", timeout=WAIT_MS)
    qtbot.waitUntil(lambda: window.model.progress is not None and window.model.progress.phase == "ready",
                    timeout=WAIT_MS)
    assert view.progress_label.text() == "Switched to tiny-b: the next round trains it."
    # the header says it too (a switch while stopped changes no state), under no backend of the old model
    qtbot.waitUntil(lambda: window.state_detail.text() == "tiny-b is ready: Join the swarm to train it",
                    timeout=WAIT_MS)
    assert window.state_label.text() == "Not contributing" and not window.model.node.backend
    assert view.switch_button.isEnabled() and not view.progress.isVisible()
    assert view.progress_label.property("role") == "hint"
    # before B trains: its own (empty) record and round 0, not A's rounds under B's name
    qtbot.waitUntil(lambda: window.model.dashboard.model == "tiny-b", timeout=WAIT_MS)
    assert window.model.dashboard.rounds == 0 and len(window.model.dashboard.series["reward"]) == 0
    qtbot.waitUntil(lambda: window.stats["round"].text() == "0", timeout=WAIT_MS)
    qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)
    # rounds are numbered per model: B counts from its own round 1, and the dashboard shows B's rounds
    qtbot.waitUntil(lambda: window.model.dashboard.model == "tiny-b" and window.model.dashboard.rounds >= 2,
                    timeout=WAIT_MS)
    assert engine.status().model == "tiny-b" and window.stats["model"].text() == "tiny-b"
    qtbot.waitUntil(lambda: any("ready: tiny-b on cpu" in line.message for line in window.model.log.lines),
                    timeout=WAIT_MS)
    assert window.model.dashboard.series["reward"].x[0] == 1 and before >= 1
    qtbot.waitUntil(lambda: window.stats["round"].text() == f"{window.model.node.round:,}", timeout=WAIT_MS)
    assert window.model.node.round < before + window.model.dashboard.rounds  # B's count, not A's continued
    switched = list((engine.data_dir / "checkpoints" / "models").glob("tiny-b-*"))
    assert len(switched) == 1


@pytest.mark.skipif(not (SEED_MODEL_DIR / "config.json").is_file(), reason="the seed model is not built")
def test_switch_to_a_catalog_row_marks_it_as_current(qtbot: QtBot, window: MainWindow, engine: EngineThread) -> None:
    view = window.machine
    _select_row(window, "seed")
    row = view.table.currentRow()
    assert not view.table.item(row, 0).font().bold()
    qtbot.mouseClick(view.switch_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.stats["model"].text() == "seed", timeout=WAIT_MS)
    qtbot.waitUntil(lambda: view.table.item(row, 0).font().bold(), timeout=WAIT_MS)
    assert engine.status().model == "seed"
    assert sum(view.table.item(i, 0).font().bold() for i in range(view.table.rowCount())) == 1
