"""The fleet: a real engine polled over its control API beside one that cannot be reached, the alerts
it raises, and the Fleet tab showing them (real widgets offscreen)."""

from __future__ import annotations

import time

from conftest import EngineThread, free_port
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from engine.fleet import FleetEntry, FleetPoller

WAIT_S = 60.0


def _wait(cond, timeout_s: float = WAIT_S) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def test_the_poller_reports_a_real_engine_and_alerts_when_it_stops(engine: EngineThread) -> None:
    dead = FleetEntry("old-laptop", f"ws://127.0.0.1:{free_port()}", "d" * 43)
    live = FleetEntry("this machine", engine.url, engine.token)
    poller = FleetPoller([live, dead], poll_s=0.2, timeout_s=2.0)
    poller.start()
    try:
        _wait(lambda: poller.reports()[0].reachable)
        first, unreachable = poller.reports()
        assert first.state == "stopped" and first.model and first.last_contact is not None
        assert not unreachable.reachable and "cannot reach" in unreachable.error
        engine.run(engine.node.join())
        _wait(lambda: poller.reports()[0].round >= 3 and poller.reports()[0].rounds_per_min is not None)
        assert poller.reports()[0].state in ("in_swarm", "solo", "training")
        poller.take_alerts()
        engine.run(engine.node.leave(), timeout=120)
        _wait(lambda: any("stopped training" in a for a in poller.take_alerts()))
        # left from this window: the person who clicked Leave needs no notification of it
        engine.run(engine.node.join())
        _wait(lambda: poller.reports()[0].state in ("in_swarm", "solo", "training"))
        poller.expect_stop(live.url)
        engine.run(engine.node.leave(), timeout=120)
        _wait(lambda: poller.reports()[0].state == "stopped")
        time.sleep(0.5)  # a few more polls
        assert not [a for a in poller.take_alerts() if "stopped training" in a]
    finally:
        poller.stop()


def test_the_fleet_tab_lists_this_engine_and_an_added_one_and_raises_their_alerts(
        qtbot: QtBot, engine: EngineThread, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from app.bridge import EngineBridge
    from app.views.fleet import LOCAL_NAME
    from app.views.main_window import MainWindow
    from engine.fleet import load_fleet

    bridge = EngineBridge(engine.url, lambda: engine.token, reconnect_s=0.1)
    fleet_file = tmp_path / "fleet.json"
    win = MainWindow(bridge, refresh_ms=50, use_tray=False, fleet_file=fleet_file)
    win.fleet_poller.poll_s = 0.2
    qtbot.addWidget(win)
    bridge.start()
    win.show()
    win.tabs.setCurrentWidget(win.fleet)
    try:
        table = win.fleet.table
        qtbot.waitUntil(lambda: table.rowCount() == 1 and table.item(0, 1).text() == "stopped", timeout=30_000)
        assert table.item(0, 0).text() == LOCAL_NAME
        # another engine, reached by URL and token: nobody answers there
        other = FleetEntry("old-laptop", f"ws://127.0.0.1:{free_port()}", "z" * 43)
        win.fleet.add(other)
        assert load_fleet(fleet_file) == [other]
        qtbot.waitUntil(lambda: table.rowCount() == 2 and table.item(1, 1).text() == "not answering", timeout=30_000)
        assert "cannot reach" in table.item(1, 0).toolTip()
        # this engine trains, then stops: the window says so
        engine.run(engine.node.join())
        qtbot.waitUntil(lambda: table.item(0, 3).text() not in ("0", "1", "2"), timeout=60_000)
        engine.run(engine.node.leave(), timeout=120)
        qtbot.waitUntil(lambda: "stopped training" in win.statusBar().currentMessage(), timeout=30_000)
        qtbot.waitUntil(lambda: table.item(0, 4).text() == "–", timeout=10_000)  # no rate for a stopped engine
        assert any("stopped training" in line.message for line in win.model.log.lines)
        win.fleet.table.selectRow(1)
        win.fleet.remove_selected()
        assert load_fleet(fleet_file) == [] and table.rowCount() == 1
        win.fleet.open_row(0)  # this window's engine: its dashboard, here
        assert win.tabs.currentWidget() is win.dashboard
    finally:
        win.shutdown()


def test_a_fleet_engine_is_shown_in_place_and_acted_on_then_back_to_this_one(
        qtbot: QtBot, engine: EngineThread, node_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from app.bridge import EngineBridge
    from app.views.main_window import MainWindow

    box_dir = tmp_path / "box"
    box_dir.mkdir()
    box = EngineThread(node_factory, box_dir)  # another machine's engine, reached by URL and token
    win = None
    try:
        box.run(box.node.join())
        _wait(lambda: box.status().round >= 3)
        box.run(box.node.leave(), timeout=120)
        trained = box.status().round

        bridge = EngineBridge(engine.url, lambda: engine.token, reconnect_s=0.1)
        win = MainWindow(bridge, refresh_ms=50, use_tray=False, fleet_file=tmp_path / "fleet.json")
        win.fleet_poller.poll_s = 0.2
        qtbot.addWidget(win)
        bridge.start()
        win.show()
        home = win.home
        qtbot.waitUntil(lambda: home.model.node.connected and home.model.node.state == "stopped", timeout=30_000)
        win.fleet.add(FleetEntry("box", box.url, box.token))
        win.tabs.setCurrentWidget(win.fleet)
        qtbot.waitUntil(lambda: win.fleet.table.rowCount() == 2, timeout=30_000)
        home_dashboard = win.dashboard

        win.fleet.open_row(1)  # the double-click: that engine's dashboard, in this window
        assert win.tabs.currentWidget() is win.dashboard and win.dashboard is not home_dashboard
        qtbot.waitUntil(lambda: win.model.node.connected and win.model.dashboard.rounds == trained, timeout=30_000)
        assert win.session is not home and win.bridge.url == box.url
        qtbot.waitUntil(lambda: win.stats["round"].text() == f"{trained:,}", timeout=10_000)
        assert win.header.subtitle.text().startswith("Showing box") and win.header.home_button.isVisible()
        assert "box" in win.windowTitle()
        assert win.tabs.indexOf(win.fleet) == 4 and win.tabs.count() == 8  # the same tabs, the fleet kept

        qtbot.mouseClick(win.join_button, Qt.MouseButton.LeftButton)  # acts on the engine shown
        _wait(lambda: box.status().round > trained)
        assert engine.status().state == "stopped" and home.model.node.state == "stopped"
        qtbot.waitUntil(lambda: win.model.dashboard.rounds > trained, timeout=30_000)  # live, not only history
        qtbot.waitUntil(lambda: win.join_button.isEnabled() and "Leave" in win.join_button.text(), timeout=30_000)
        qtbot.mouseClick(win.join_button, Qt.MouseButton.LeftButton)
        _wait(lambda: box.status().state == "stopped", timeout_s=120)

        qtbot.mouseClick(win.header.home_button, Qt.MouseButton.LeftButton)
        assert win.session is home and win.bridge.url == engine.url and win.windowTitle() == "SAPO Swarm"
        assert not win.header.home_button.isVisible() and win.model.dashboard.rounds == 0
        qtbot.waitUntil(lambda: win.stats["round"].text() == "0", timeout=10_000)
    finally:
        if win is not None:
            win.shutdown()
        box.close()
