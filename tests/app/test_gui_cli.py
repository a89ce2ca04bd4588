"""`sapo gui` / `sapo start` entry points and the tray icon, without a running engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.main import run_gui, token_from
from app.models.node import NodeModel
from app.tray import TrayIcon
from engine.cli.start import has_display
from engine.events import StateChanged


def test_remote_engine_needs_a_token(tmp_path: Path, capsys: pytest.CaptureFixture[str], qtbot: QtBot) -> None:
    assert run_gui(tmp_path, engine_url="ws://127.0.0.1:9", token=None) == 2
    assert "needs the engine's token" in capsys.readouterr().err


def test_no_start_without_a_running_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str], qtbot: QtBot) -> None:
    assert run_gui(tmp_path, start=False) == 1
    assert "no engine is serving" in capsys.readouterr().err


def test_token_from_file_or_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = tmp_path / "token"
    good.write_text("A" * 43 + "\n")
    assert token_from(good) == "A" * 43
    bad = tmp_path / "bad"
    bad.write_text("not a token")
    with pytest.raises(SystemExit, match="cannot read a control token"):
        token_from(bad)
    monkeypatch.setenv("SAPO_CONTROL_TOKEN", "B" * 43)
    assert token_from(None) == "B" * 43


def test_start_picks_the_app_only_where_a_display_exists() -> None:
    assert has_display("linux", {"DISPLAY": ":0"})
    assert has_display("linux", {"WAYLAND_DISPLAY": "wayland-0"})
    assert not has_display("linux", {})
    assert has_display("darwin", {}) and has_display("win32", {})


def test_gui_help_is_fast_and_imports_no_qt() -> None:
    code = ("import sys; from engine.cli import main\n"
            "try:\n    main(['gui', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('qt' if 'PySide6' in sys.modules else 'no-qt')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert "--engine URL" in out.stdout and out.stdout.strip().endswith("no-qt")


def test_tray_icon_follows_the_node(qtbot: QtBot) -> None:
    from PySide6.QtWidgets import QWidget

    parent = QWidget()
    qtbot.addWidget(parent)
    tray = TrayIcon(parent)
    node = NodeModel()
    tray.update_from(node)
    assert tray.toolTip() == "SAPO Swarm: engine not connected" and not tray.join_action.isEnabled()
    first = tray.icon().pixmap(32, 32).toImage()
    node.connected = True
    node.apply_state(StateChanged(state="in_swarm", detail="3 peers"))
    node.round, node.peers = 12, 3
    tray.update_from(node)
    assert "In the swarm" in tray.toolTip() and "round 12 · 3 peers" in tray.toolTip()
    assert tray.join_action.text() == "Leave the swarm" and tray.pause_action.isEnabled()
    assert not tray.resume_action.isEnabled()
    assert tray.icon().pixmap(32, 32).toImage() != first  # the badge colour changed
    node.apply_state(StateChanged(state="paused"))
    tray.update_from(node)
    assert tray.resume_action.isEnabled() and not tray.pause_action.isEnabled()
