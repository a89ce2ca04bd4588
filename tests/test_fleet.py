"""The fleet's pure parts: entries and their file, the recent-rounds summary, status parsing, alert rules."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from engine import fleet
from engine.control.protocol import ControlProtocolError, status_from_wire
from engine.control.status import recent_summary
from engine.fleet import (
    EngineReport,
    FleetEntry,
    FleetError,
    alerts,
    load_fleet,
    report_from_status,
)

TOKEN = "t" * 43


def test_entries_validate_and_the_file_round_trips_readable_by_its_owner_only(tmp_path: Path) -> None:
    good = [FleetEntry("gaming-pc", "ws://127.0.0.1:7799", TOKEN), FleetEntry("box", "wss://box.lan:443", TOKEN)]
    path = tmp_path / "fleet.json"
    fleet.save_fleet(path, good)
    assert load_fleet(path) == good
    assert os.stat(path).st_mode & 0o777 == 0o600
    for bad in (("", "ws://a:1", TOKEN), ("x", "http://a:1", TOKEN), ("x", "ws://a:1", "short"),
                ("x\n", "ws://a:1", TOKEN), ("x", "ws://", TOKEN)):
        with pytest.raises(FleetError):
            FleetEntry(*bad)
    path.write_text(json.dumps({"engines": [{"name": "ok", "url": "ws://h:1", "token": TOKEN}, {"url": 3}, "junk"]}))
    assert [e.name for e in load_fleet(path)] == ["ok"]
    assert load_fleet(tmp_path / "none.json") == []
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(FleetError):
        load_fleet(tmp_path / "bad.json")


def test_recent_summary_gives_the_rate_and_the_reward_trend() -> None:
    rounds = [(1000.0 + 6 * i, 0.1 if i < 20 else 0.3) for i in range(40)]
    s = recent_summary(rounds, now=1000.0 + 6 * 39)
    assert s["rounds_per_min"] == pytest.approx(10.0)
    assert s["reward"] == pytest.approx(0.3) and s["reward_before"] == pytest.approx(0.1)
    assert recent_summary([], 0.0) == {"rounds_per_min": None, "reward": None, "reward_before": None,
                                       "last_round_at": None}


def test_a_status_from_another_machine_is_checked_by_the_client_then_reported() -> None:
    entry = FleetEntry("box", "ws://127.0.0.1:1", TOKEN)
    r = report_from_status(entry, status_from_wire({"state": "in_swarm", "model": "seed", "round": 12,
                                                    "recent": {"rounds_per_min": 30, "reward": 0.4,
                                                               "reward_before": 0.2, "last_round_at": 99.0},
                                                    "last_crash": {"ts": 50.0, "reason": "killed (SIGKILL)"}}),
                           now=100.0)
    assert (r.reachable, r.state, r.round, r.rounds_per_min, r.trend, r.crash_at) == (True, "in_swarm", 12, 30, "↑", 50.0)
    for junk in ({"state": 5}, {"state": "flying"}, {"round": -3}, {"model": ["x"]}, {"recent": {"reward": "x"}},
                 {"last_crash": "x"}, {"round": True}, "garbage"):  # the client refuses each (ControlError)
        with pytest.raises(ControlProtocolError):
            status_from_wire(junk)
    odd = report_from_status(entry, status_from_wire({"recent": {"reward": float("nan")}, "unknown_key": 1}), 1.0)
    assert (odd.state, odd.reward) == ("stopped", None)


def _training(now: float, **changes: object) -> EngineReport:
    base = EngineReport("box", "ws://h:1", reachable=True, state="in_swarm", round=5, last_round_at=now - 5,
                        last_contact=now, checked_at=now)
    return replace(base, **changes)  # type: ignore[arg-type]


def test_alerts_fire_once_when_an_engine_stops_goes_silent_or_crashes() -> None:
    t = 10_000.0
    ok = _training(t)
    assert alerts(None, ok, t) == [] and alerts(ok, _training(t + 3), t + 3) == []
    stopped = _training(t + 3, state="stopped")
    assert alerts(ok, stopped, t + 3) == ["box stopped training"]
    assert alerts(ok, stopped, t + 3, asked=True) == []  # left or paused from this window: no news
    assert alerts(ok, _training(t + 3, state="paused"), t + 3) == []  # the contributor paused it
    # silent: unreachable, keeping its last contact; alerted when 60 s pass, once
    gone = lambda now: replace(ok, reachable=False, checked_at=now, error="connection refused")
    assert alerts(ok, gone(t + 30), t + 30) == []
    assert alerts(gone(t + 30), gone(t + 63), t + 63) == ["box went silent: no answer for 63 s (connection refused)"]
    assert alerts(gone(t + 63), gone(t + 66), t + 66) == []
    # training, reachable, but no round for 10 minutes: a stall, once
    late = fleet.STALL_AFTER_S
    assert alerts(ok, _training(t + late - 3, last_round_at=t, checked_at=t + late - 3), t + late - 3) == []
    stall = alerts(_training(t + late - 3, last_round_at=t, checked_at=t + late - 3),
                   _training(t + late + 3, last_round_at=t, checked_at=t + late + 3), t + late + 3)
    assert stall == ["box stopped training: no round for 10 min"]
    crashed = _training(t + 3, crash_at=t + 1, crash_reason="killed (SIGKILL): often the system running out of memory")
    assert alerts(ok, crashed, t + 3) == ["box crashed: killed (SIGKILL): often the system running out of memory"]
    assert alerts(crashed, _training(t + 6, crash_at=t + 1), t + 6) == []


def test_stopping_the_poller_does_not_wait_out_its_poll_interval() -> None:
    # The window stops the poller as it closes: a 30 s poll interval must not become a 30 s freeze.
    import socket
    import time

    from engine.fleet import FleetEntry, FleetPoller

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    poller = FleetPoller([FleetEntry("gone", f"ws://127.0.0.1:{port}", "t" * 43)], poll_s=30.0, timeout_s=1.0)
    poller.start()
    deadline = time.monotonic() + 20
    while poller.reports()[0].checked_at is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert poller.reports()[0].checked_at is not None  # one poll done: it now sleeps its 30 s
    started = time.monotonic()
    poller.stop()
    assert time.monotonic() - started < 2.0
    assert poller._thread is not None and not poller._thread.is_alive()
