"""The desktop app against a live engine (real control server on 127.0.0.1), widgets offscreen.

The Qt thread only draws: the engine runs on its own thread and loop, the bridge on another.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import EngineThread
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.bridge import EngineBridge
from app.views.main_window import MainWindow
from engine.control.server import ControlServer
from engine.control.token import create_token, read_control_info, read_token, write_control_info

WAIT_MS = 10_000


def _window(qtbot: QtBot, bridge: EngineBridge) -> MainWindow:
    window = MainWindow(bridge, refresh_ms=50, use_tray=False)
    qtbot.addWidget(window)
    bridge.start()
    window.show()
    return window


@pytest.fixture
def window(qtbot: QtBot, engine: EngineThread) -> Iterator[MainWindow]:
    bridge = EngineBridge(engine.url, lambda: read_token(engine.data_dir), reconnect_s=0.1,
                          url_provider=lambda: (info := read_control_info(engine.data_dir)) and info.url)
    win = _window(qtbot, bridge)
    qtbot.waitUntil(lambda: win.model.node.connected, timeout=WAIT_MS)
    yield win
    win.shutdown()


def test_join_events_reach_models_and_widgets_then_leave(qtbot: QtBot, window: MainWindow,
                                                         engine: EngineThread) -> None:
    model = window.model
    assert window.join_button.text() == "Join the swarm" and window.join_button.isEnabled()
    assert window.state_label.text() == "Not contributing"
    qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: model.node.state == "in_swarm" and model.dashboard.rounds >= 12, timeout=WAIT_MS)
    # header
    assert window.state_label.text() == "In the swarm"
    assert window.join_button.text() == "Leave the swarm"
    qtbot.waitUntil(lambda: window.stats["peers"].text() == "3", timeout=WAIT_MS)
    assert window.stats["round"].text() == f"{model.node.round:,}"
    # dashboard: the curves hold what the model holds
    qtbot.waitUntil(lambda: len(window.dashboard._curves[0].item.getData()[0]) == len(
        model.dashboard.series["reward"]), timeout=WAIT_MS)
    assert window.dashboard.redraws > 0
    assert window.dashboard.cards["reward_avg"].text() != "–"
    assert set(window.dashboard._specialty_curves) == set(model.dashboard.specialty) != set()
    assert len(model.dashboard.series["pass1"]) >= 1
    # shared rollouts: incremental table, counters, detail on selection
    window.tabs.setCurrentWidget(window.rollouts)
    qtbot.waitUntil(lambda: window.rollouts.table_model.rowCount() == len(model.feed.rows) > 0, timeout=WAIT_MS)
    assert f"<b>Received</b> {model.feed.received:,}" in window.rollouts.counters.text()
    window.rollouts.table.selectRow(0)
    newest = model.feed.newest_first(0)
    assert newest.question in window.rollouts.detail.toPlainText()
    assert window.rollouts.per_peer.rowCount() == len(model.feed.per_peer)
    # peers and log
    window.tabs.setCurrentWidget(window.peers)
    qtbot.waitUntil(lambda: window.peers.table.rowCount() == 3, timeout=WAIT_MS)
    names = {window.peers.table.item(i, 1).text() for i in range(3)}
    assert names == {"amber-falcon", "quiet-heron", "brisk-otter"}
    window.tabs.setCurrentWidget(window.log_view)
    qtbot.waitUntil(lambda: "round " in window.log_view.text.toPlainText(), timeout=WAIT_MS)
    # leave
    qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: model.node.state == "stopped", timeout=WAIT_MS)
    qtbot.waitUntil(lambda: window.join_button.text() == "Join the swarm" and window.join_button.isEnabled(),
                    timeout=WAIT_MS)
    assert engine.node.calls == ["join", "leave"]
    assert model.peers.connected == 0


def test_pause_after_round_then_resume(qtbot: QtBot, window: MainWindow, engine: EngineThread) -> None:
    model = window.model
    qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: model.node.state == "in_swarm" and window.pause_button.isVisible(), timeout=WAIT_MS)
    engine.loop.call_soon_threadsafe(engine.node.gate.clear)  # hold the round in flight
    qtbot.mouseClick(window.pause_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: model.node.state == "pausing", timeout=WAIT_MS)
    assert window.state_label.text() == "Pausing after this round" and window.resume_button.isVisible()
    held = engine.node.round
    engine.loop.call_soon_threadsafe(engine.node.gate.set)
    qtbot.waitUntil(lambda: model.node.state == "paused", timeout=WAIT_MS)
    assert engine.node.round == held + 1  # the round in flight finished, then it paused
    qtbot.wait(300)
    assert engine.node.round == held + 1
    assert engine.node.calls[-1] == "pause:True"
    qtbot.mouseClick(window.resume_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: model.node.state == "in_swarm" and engine.node.round > held + 2, timeout=WAIT_MS)


def test_settings_apply_validate_and_snooze(qtbot: QtBot, window: MainWindow, engine: EngineThread) -> None:
    view = window.settings
    window.tabs.setCurrentWidget(view)
    assert view.cpu_cores.value() == 0 and view.keep_running_on_close.isChecked()
    view.cpu_cores.setValue(2)
    view.pause_on_battery.setChecked(False)
    assert view.changes() == {"cpu_cores": 2, "pause_on_battery": False}
    qtbot.mouseClick(view.apply_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: view.message.text().startswith("Saved"), timeout=WAIT_MS)
    assert engine.node.settings.cpu_cores == 2 and not engine.node.settings.pause_on_battery
    view.bootstrap_url.setText("http://not-a-websocket")  # refused here, never sent
    qtbot.mouseClick(view.apply_button, Qt.MouseButton.LeftButton)
    assert "ws://" in view.message.text() and view.message.property("role") == "error"
    assert engine.node.settings.bootstrap_url == ""
    qtbot.mouseClick(view.snooze_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: view.snooze_label.text().startswith("Snoozed until"), timeout=WAIT_MS)
    assert "snooze:3600" in engine.node.calls
    qtbot.waitUntil(lambda: window.model.node.state == "paused", timeout=WAIT_MS)


def test_machine_tab_and_an_unsupported_model_switch(qtbot: QtBot, window: MainWindow) -> None:
    view = window.machine
    window.tabs.setCurrentWidget(view)
    qtbot.waitUntil(lambda: view.table.rowCount() == 2, timeout=WAIT_MS)
    assert "Stand-in CPU" in view.labels["False:Device"].text()
    assert view.labels["False:Memory budget"].text() == "8.0 GiB"
    assert "fits well" in view.labels["True:Verdict"].text()
    view.table.selectRow(1)
    qtbot.mouseClick(view.switch_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "cannot switch models" in view.progress_label.text(), timeout=WAIT_MS)


def test_wrong_token_is_shown_and_nothing_is_allowed(qtbot: QtBot, engine: EngineThread) -> None:
    bridge = EngineBridge(engine.url, lambda: "A" * 43, reconnect_s=0.1)
    win = _window(qtbot, bridge)
    qtbot.waitUntil(lambda: "wrong control token" in win.statusBar().currentMessage(), timeout=WAIT_MS)
    assert not win.model.node.connected and not win.join_button.isEnabled()
    assert win.state_label.text() == "Engine not connected"
    assert engine.node.calls == []
    win.shutdown()


def test_reconnects_when_the_engine_comes_back_on_a_new_port(qtbot: QtBot, window: MainWindow,
                                                             engine: EngineThread) -> None:
    engine.run(engine.server.close())
    qtbot.waitUntil(lambda: not window.model.node.connected, timeout=WAIT_MS)
    assert "Not connected" in window.statusBar().currentMessage()

    async def restart() -> ControlServer:
        server = ControlServer(engine.node, create_token(engine.data_dir))  # a new token too
        await server.start()
        return server
    engine.server = engine.run(restart())
    write_control_info(engine.data_dir, engine.server.url)
    qtbot.waitUntil(lambda: window.model.node.connected, timeout=WAIT_MS)
    assert window.bridge.url == engine.server.url
    qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.model.node.state == "in_swarm", timeout=WAIT_MS)


def test_hidden_window_keeps_its_models_but_draws_nothing(qtbot: QtBot, window: MainWindow) -> None:
    qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.model.dashboard.rounds >= 3, timeout=WAIT_MS)
    window.hide()  # as when closed to the tray
    qtbot.wait(100)
    redraws, rounds = window.dashboard.redraws, window.model.dashboard.rounds
    qtbot.waitUntil(lambda: window.model.dashboard.rounds >= rounds + 5, timeout=WAIT_MS)
    assert window.dashboard.redraws == redraws
    window.show()
    qtbot.waitUntil(lambda: window.dashboard.redraws > redraws, timeout=WAIT_MS)
