"""The desktop app against a live engine: the real node on a tiny model behind the real control
server on 127.0.0.1, widgets offscreen.

The Qt thread only draws: the engine runs on its own thread and loop, the bridge on another.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from conftest import EngineThread, connected_window, open_window
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.bridge import EngineBridge
from app.views.machine import human_bytes
from app.views.main_window import MainWindow
from engine.control.server import ControlServer
from engine.control.token import create_token, write_control_info
from engine.settings import ContributorSettings

WAIT_MS = 10_000


@pytest.fixture
def swarm_window(qtbot: QtBot, swarm_engine: EngineThread) -> Iterator[MainWindow]:
    win = connected_window(qtbot, swarm_engine)
    yield win
    win.shutdown()


def test_join_events_reach_models_and_widgets_then_leave(qtbot: QtBot, swarm_window: MainWindow,
                                                         swarm_engine: EngineThread) -> None:
    window, engine = swarm_window, swarm_engine
    peer_name = engine.extra_nodes[0].status().peer_name
    model = window.model
    assert window.join_button.text() == "Join the swarm" and window.join_button.isEnabled()
    assert window.state_label.text() == "Not contributing"
    qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: model.node.state == "in_swarm" and model.dashboard.rounds >= 8, timeout=WAIT_MS)
    # header: the state, the peer, and what the join loaded (from a status refresh)
    assert window.state_label.text() == "In the swarm"
    assert window.join_button.text() == "Leave the swarm"
    qtbot.waitUntil(lambda: window.stats["peers"].text() == "1", timeout=WAIT_MS)
    qtbot.waitUntil(lambda: "CPU" in window.subtitle.text() and "transformers" in window.subtitle.text(),
                    timeout=WAIT_MS)
    assert window.stats["model"].text() == "tiny-a"
    assert window.stats["round"].text() == f"{model.node.round:,}"
    # dashboard: RoundCompleted metrics fill the rings, the curves hold what the rings hold
    assert len(model.dashboard.series["reward"]) == model.dashboard.rounds
    assert len(model.dashboard.series["tokens_per_s"]) == model.dashboard.rounds
    assert not model.dashboard.series["reward"].y.any()  # a random model solves nothing
    window.tabs.setCurrentWidget(window.dashboard)
    qtbot.waitUntil(lambda: len(window.dashboard._curves[0].item.getData()[0]) == len(
        model.dashboard.series["reward"]) > 0, timeout=WAIT_MS)
    assert window.dashboard.redraws > 0
    assert window.dashboard.cards["reward_avg"].text() != "–"
    assert "generate" in model.dashboard.phases
    qtbot.waitUntil(lambda: len(model.dashboard.series["pass1"]) >= 1, timeout=WAIT_MS)  # eval every 4 rounds
    assert set(window.dashboard._specialty_curves) == set(model.dashboard.specialty) != set()
    # shared rollouts from the real peer: incremental table, counters, detail on selection
    window.tabs.setCurrentWidget(window.rollouts)
    qtbot.waitUntil(lambda: model.peers.totals()[1] > 0
                    and window.rollouts.table_model.rowCount() == len(model.feed.rows), timeout=WAIT_MS)
    assert {r.seen.peer_name for r in model.feed.rows} == {peer_name}
    window.rollouts.refresh()
    assert f"<b>Received</b> {model.peers.totals()[0]:,} " in window.rollouts.counters.text()
    window.rollouts.table.selectRow(0)
    newest = model.feed.newest_first(0)
    assert newest.seen.question in window.rollouts.detail.toPlainText()
    # peers and log
    window.tabs.setCurrentWidget(window.peers)
    qtbot.waitUntil(lambda: window.peers.table.rowCount() == 1, timeout=WAIT_MS)
    assert window.peers.table.item(0, 1).text() == peer_name
    assert window.peers.table.item(0, 3).text() == "manual"  # dialled from SwarmConfig.peer_urls
    # the real peer trains on our groups and says so (receipts): the credit line counts them
    qtbot.waitUntil(lambda: model.peers.swarm is not None and model.peers.swarm.credit is not None
                    and model.peers.swarm.credit.uses > 0, timeout=3 * WAIT_MS)  # a status poll every 2 s
    credit = model.peers.swarm.credit
    assert credit.peers == 1 and 0 < credit.used <= credit.shared
    # the label is drawn on the next tick, from the newest status (which may count more receipts)
    qtbot.waitUntil(lambda: window.peers.credit.isVisible() and "peers trained on" in window.peers.credit.text()
                    and f"of them ({model.peers.swarm.credit.uses:,} times" in window.peers.credit.text(),
                    timeout=WAIT_MS)
    window.tabs.setCurrentWidget(window.log_view)
    qtbot.waitUntil(lambda: "ready: tiny-a on cpu" in window.log_view.text.toPlainText(), timeout=WAIT_MS)
    # leave: the round in flight finishes, the link closes, everything the dashboard saw is stored
    qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: model.node.state == "stopped", timeout=WAIT_MS)
    qtbot.waitUntil(lambda: window.join_button.text() == "Join the swarm" and window.join_button.isEnabled(),
                    timeout=WAIT_MS)
    assert engine.status().state == "stopped"
    qtbot.waitUntil(lambda: model.peers.connected == 0, timeout=WAIT_MS)
    stored = [r["round"] for r in engine.node.history()["rounds"]]
    qtbot.waitUntil(lambda: model.dashboard.rounds == len(stored), timeout=WAIT_MS)
    assert stored == list(range(1, len(stored) + 1)) and model.node.round == stored[-1]


def test_pause_after_round_then_resume(qtbot: QtBot, slow_engine: EngineThread) -> None:
    engine = slow_engine
    window = connected_window(qtbot, engine)
    model = window.model
    qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: engine.status().round >= 1 and window.pause_button.isVisible(), timeout=WAIT_MS)
    held = engine.status().round  # round held + 1 (~1 s) is in flight
    qtbot.mouseClick(window.pause_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: model.node.state == "pausing", timeout=WAIT_MS)
    assert window.state_label.text() == "Pausing after this round" and window.resume_button.isVisible()
    assert engine.status().round == held
    qtbot.waitUntil(lambda: model.node.state == "paused", timeout=WAIT_MS)
    assert engine.status().round == held + 1  # the round in flight finished, then it paused
    assert window.state_label.text() == "Paused" and not window.pause_button.isVisible()
    qtbot.wait(1500)  # longer than a round
    assert engine.status().round == held + 1 and engine.status().state == "paused"
    assert [r["round"] for r in engine.node.history()["rounds"]][-1] == held + 1
    qtbot.mouseClick(window.resume_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: model.node.state == "solo" and engine.status().round >= held + 2, timeout=WAIT_MS)
    window.shutdown()


def test_with_no_tray_closing_the_window_stops_the_engine(qtbot: QtBot, engine: EngineThread) -> None:
    """Nothing would show an engine left running: the keep-running option waits for a tray."""
    window = connected_window(qtbot, engine)
    assert window.tray is None and window.model.settings.get("keep_running_on_close", True)
    option = window.settings.keep_running_on_close
    assert not option.isEnabled() and "needs a system tray" in option.text()
    window.close()  # a person closing the window
    assert engine.shutdown_requested.wait(5)  # the engine was asked to stop (it checkpoints and says bye)


def test_settings_apply_validate_and_snooze(qtbot: QtBot, window: MainWindow, engine: EngineThread) -> None:
    view = window.settings
    window.tabs.setCurrentWidget(view)
    assert view.cpu_cores.value() == 0 and view.keep_running_on_close.isChecked()
    view.cpu_cores.setValue(1)  # (2 torch threads on this shared 2-core machine crawl)
    view.pause_on_battery.setChecked(False)
    assert view.changes() == {"cpu_cores": 1, "pause_on_battery": False}
    qtbot.mouseClick(view.apply_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: view.message.text().startswith("Saved"), timeout=WAIT_MS)
    saved = ContributorSettings.load(engine.data_dir)  # what the node wrote to settings.toml
    assert saved.cpu_cores == 1 and not saved.pause_on_battery
    view.bootstrap_url.setText("http://not-a-websocket")  # refused here, never sent
    qtbot.mouseClick(view.apply_button, Qt.MouseButton.LeftButton)
    assert "ws://" in view.message.text() and view.message.property("role") == "error"
    assert ContributorSettings.load(engine.data_dir).bootstrap_url == ""
    # snooze a training node: it pauses after its round, for the reason given, and stays paused
    qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: engine.status().round >= 1, timeout=WAIT_MS)
    qtbot.mouseClick(view.snooze_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: view.snooze_label.text().startswith("Snoozed until"), timeout=WAIT_MS)
    assert ContributorSettings.load(engine.data_dir).snooze_until > time.time() + 3500
    qtbot.waitUntil(lambda: window.model.node.state == "paused", timeout=WAIT_MS)
    assert "snoozed" in window.state_detail.text()
    held = engine.status().round
    qtbot.wait(300)
    assert engine.status().round == held


def test_machine_tab_shows_the_doctor_report(qtbot: QtBot, window: MainWindow, engine: EngineThread) -> None:
    view = window.machine
    window.tabs.setCurrentWidget(view)
    qtbot.waitUntil(lambda: bool(window.model.machine) and view.table.rowCount() > 0, timeout=WAIT_MS)
    report = window.model.machine  # the report shown (memory figures move between two probes)
    assert view.table.rowCount() == len(report["candidates"])
    assert view.labels["False:Device"].text().startswith(report["device"]["kind"].upper())
    assert view.labels["False:Memory budget"].text() == human_bytes(report["device"]["budget_bytes"])
    assert report["pick"]["verdict"] in view.labels["True:Verdict"].text()
    assert {view.table.item(i, 0).text() for i in range(view.table.rowCount())} == \
        {c["model"] for c in report["candidates"]}
    fast = view.labels["False:Fast paths"].text()
    assert ("bf16 LoRA updates" if report["fast_paths"]["torch_cpu_bf16"] else "fp32 updates") in fast
    assert ("not installed" not in fast) == bool(report["fast_paths"]["llamacpp"])
    # tests run with HF_HUB_OFFLINE: nothing is "yes" on faith, the seed is installed
    available = {view.table.item(i, 0).text(): view.table.item(i, 6) for i in range(view.table.rowCount())}
    assert available["seed"].text() == "installed" and "train now" in available["seed"].toolTip()
    assert {item.text() for item in available.values()} <= {"installed", "not installed (downloads are off)",
                                                            "not installed"}
    lent = report["lent"]  # the estimate is for the cores lent, and rounds measured here stand beside it
    assert view.labels["True:Round time"].text().startswith(f"~{lent['round_seconds']:,.0f} s per round on the")
    engine.run(engine.node.join())
    qtbot.waitUntil(lambda: "median of the last" in view.labels["True:Measured"].text(), timeout=WAIT_MS)


def test_round_time_texts_read_malformed_reports_safely() -> None:
    from app.views.machine import measured_text, round_estimate_text

    assert round_estimate_text({"round_seconds": 12.4, "threads": 1, "round_seconds_now": 30.0}, 8.0) == \
        "~12 s per round on the 1 core you lend (~30 s beside what else runs now)"
    assert round_estimate_text({"round_seconds": 12.4, "threads": 2, "source": "measured"}, 8.0) == \
        "~12 s per round on the 2 cores you lend, from this machine's own rounds"
    assert round_estimate_text({"round_seconds": 9.0, "threads": 2, "source": "probed"}, 8.0).endswith(
        "from a short probe of this machine (no rounds measured here yet)")
    assert round_estimate_text({"round_seconds": "x"}, 8.0) == "~8 s per round"
    assert round_estimate_text(None, float("nan")) is None
    assert measured_text([]) == "no round yet"
    assert measured_text([5.0] * 30 + [9.0, 11.0]) == "5 s per round (median of the last 20 here)"


def test_fast_paths_text_survives_a_malformed_report() -> None:
    from app.views.machine import fast_paths_text

    assert fast_paths_text(None) == fast_paths_text([1]) == "unknown"
    assert fast_paths_text({"llamacpp": 3, "torch_cpu_bf16": "yes"}) == "llama.cpp not installed · fp32 updates"
    assert fast_paths_text({"llamacpp": "xllamacpp 2026.10.11549", "llamacpp_bf16": True, "torch_cpu_bf16": True}) == \
        "llama.cpp from xllamacpp 2026.10.11549 with bf16 weights · bf16 LoRA updates"


def test_wrong_token_is_shown_and_nothing_is_allowed(qtbot: QtBot, engine: EngineThread) -> None:
    bridge = EngineBridge(engine.url, lambda: "A" * 43, reconnect_s=0.1)
    win = open_window(qtbot, bridge)
    qtbot.waitUntil(lambda: "wrong control token" in win.statusBar().currentMessage(), timeout=WAIT_MS)
    assert not win.model.node.connected and not win.join_button.isEnabled()
    assert win.state_label.text() == "Engine not connected"
    qtbot.mouseClick(win.join_button, Qt.MouseButton.LeftButton)  # disabled: nothing is sent
    qtbot.wait(200)
    assert engine.status().state == "stopped" and engine.node.history()["rounds"] == []
    assert engine.server.refused >= 1
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
    qtbot.waitUntil(lambda: window.model.node.state == "solo" and engine.status().round >= 1, timeout=WAIT_MS)


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


def test_the_header_says_why_the_engine_died_and_that_it_came_back(qtbot: QtBot, window: MainWindow,
                                                                    engine: EngineThread) -> None:
    from engine.supervisor import CrashRecord, crash_reason, read_last_crash, write_crash

    assert not window.crash_note.isVisible()
    engine.run(engine.server.close())  # the engine is gone; its supervisor writes why, then restarts it
    write_crash(engine.data_dir, CrashRecord(ts=time.time(), exit_code=-9, reason=crash_reason(-9, ""), ran_s=40.0,
                                             restarts=0, gave_up=False, next_restart_s=2.0))
    qtbot.waitUntil(lambda: not window.model.node.connected, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: window.crash_note.isVisible(), timeout=WAIT_MS)
    assert "SIGKILL" in window.crash_note.text() and "restarted after 2 s" in window.crash_note.text()

    engine.node._last_crash = read_last_crash(engine.data_dir)  # what the restarted engine reads at start

    async def restart() -> ControlServer:
        server = ControlServer(engine.node, create_token(engine.data_dir))
        await server.start()
        return server
    engine.server = engine.run(restart())
    write_control_info(engine.data_dir, engine.server.url)
    qtbot.waitUntil(lambda: window.model.node.connected, timeout=WAIT_MS)
    assert "SIGKILL" in window.crash_note.text()  # still said once back, from the engine's own status
    window.model.node.last_crash = None
    window.model.node.version += 1
    qtbot.waitUntil(lambda: not window.crash_note.isVisible(), timeout=WAIT_MS)


def test_machine_tab_says_what_this_machine_gave(qtbot: QtBot, window: MainWindow, engine: EngineThread) -> None:
    """Rounds trained by the real node show as time, CPU, share, energy (labelled measured or estimated)
    and memory, from the engine's own totals; a restart keeps them (engine.machine.contribution's file)."""
    giving = window.machine.giving
    window.tabs.setCurrentWidget(window.machine)
    qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: engine.status().round >= 2, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: "over" in giving.labels["Training time"].text()
                    and int(giving.labels["Training time"].text().split("over ")[1].split()[0]) >= 2,
                    timeout=WAIT_MS)
    given = engine.status().contribution
    assert given["rounds"] >= 2 and given["cpu_hours"] > 0 and given["memory_bytes"] > 0
    energy = giving.labels["Energy"].text()
    assert ("measured" in energy) != ("estimated" in energy)
    assert ("measured" in energy) == given["energy_measured"]
    assert giving.labels["Memory held now"].text().endswith("GiB")
    assert "% of its CPU" in giving.labels["Share of this machine"].text()


def test_the_header_shows_the_engines_work_as_it_happens(qtbot: QtBot, window: MainWindow,
                                                         engine: EngineThread) -> None:
    seen: set[str] = set()
    qtbot.mouseClick(window.join_button, Qt.MouseButton.LeftButton)

    def watch() -> bool:
        text = window.header.state_detail.text()
        if "Loading" in text or "writing" in text or "learning from" in text:
            seen.add(text.split(" ")[0] if text.startswith("Loading") else text.split(": ")[1].split(" ")[0])
        return engine.status().round >= 3 and bool(seen)
    qtbot.waitUntil(watch, timeout=WAIT_MS)
    assert seen & {"Loading", "writing", "learning"}
