"""What a contributor gives: totals across restarts, energy measured where a meter is readable and
labelled as an estimate where not, bad files never crash the engine."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from engine.machine import contribution as c
from engine.machine.contribution import Contribution, Totals, energy_delta_uj, read_energy_uj


def _zone(root: Path, name: str, energy: int, span: int = 262_143_328_850) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "energy_uj").write_text(f"{energy}\n")
    (zone / "max_energy_range_uj").write_text(f"{span}\n")
    return zone


def _busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_meter_is_read_per_package_and_its_wrap_is_undone(tmp_path: Path) -> None:
    assert read_energy_uj(tmp_path / "absent") is None
    _zone(tmp_path, "intel-rapl:0", 1_000_000)
    _zone(tmp_path, "intel-rapl:1", 2_000_000)
    _zone(tmp_path, "intel-rapl:0:0", 999_999_999)  # the package's core sub-zone: already counted
    assert read_energy_uj(tmp_path) == (3_000_000, 2 * 262_143_328_850)
    assert energy_delta_uj(100, 250, 1000) == 150
    assert energy_delta_uj(900, 50, 1000) == 150  # wrapped once
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("not a number")
    assert read_energy_uj(tmp_path) is None


def test_totals_survive_a_restart_and_say_the_energy_is_estimated_here(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(c, "POWERCAP", tmp_path / "no-meter")
    monkeypatch.setattr(c, "read_energy_uj", lambda root=tmp_path / "no-meter": None)
    first = Contribution(tmp_path)
    for _ in range(2):
        first.round_started()
        _busy(0.2)
        first.round_done()
    status = first.status()
    assert status["rounds"] == 2 and status["cpu_hours"] * 3600 >= 0.35
    assert status["train_hours"] >= status["cpu_hours"] / psutil.cpu_count()
    assert 0 < status["cpu_share_last_round"] <= 1.0
    assert status["energy_measured"] is False  # a guess is never shown as a measurement
    assert status["energy_wh"] == pytest.approx(status["cpu_hours"] * c.ESTIMATED_WATTS_PER_BUSY_CORE)
    assert status["memory_bytes"] > 10_000_000  # this process's resident memory
    again = Contribution(tmp_path)  # the engine restarts: totals go on from the file
    assert again.status()["rounds"] == 2 and again.totals == first.totals


def test_measured_energy_comes_from_the_meter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([(1_000_000, 10**12), (4_600_000, 10**12)])
    monkeypatch.setattr(c, "read_energy_uj", lambda root=None: next(readings))
    meter = Contribution(tmp_path)
    meter.round_done()
    status = meter.status()
    assert status["energy_measured"] is True and status["energy_wh"] == pytest.approx(3.6 / 3600)


def test_each_round_says_its_energy_and_the_totals_give_it_per_hour_and_per_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([(0, 10**12), (2_000_000, 10**12), (5_000_000, 10**12)])  # start, mid-round, round end
    monkeypatch.setattr(c, "read_energy_uj", lambda root=None: next(readings))
    meter = Contribution(tmp_path)
    assert meter.round_energy() == {"energy_j": 2.0, "energy_measured": 1.0}  # so far: what the round stores
    meter.round_done()
    status = meter.status(groups_peers_trained=4)
    assert status["wh_per_group_peers_trained"] == pytest.approx(5.0 / 3600 / 4)
    assert status["watts_training"] == pytest.approx(5.0 / (status["train_hours"] * 3600))
    assert meter.status()["groups_peers_trained"] == 0 and meter.status()["wh_per_group_peers_trained"] == 0.0
    monkeypatch.setattr(c, "read_energy_uj", lambda root=None: None)
    meter.round_started()
    _busy(0.1)
    estimated = meter.round_energy()
    assert estimated["energy_measured"] == 0.0 and estimated["energy_j"] > 0  # CPU time x the per-core figure


@pytest.mark.parametrize("content", ["", "not json", "[]", json.dumps({"rounds": "many"}),
                                     json.dumps({"cpu_seconds": float("inf")}), json.dumps({"energy_j": -1})])
def test_a_bad_totals_file_starts_from_zero(tmp_path: Path, content: str) -> None:
    (tmp_path / c.FILE).write_text(content)
    assert Contribution(tmp_path).totals == Totals()


def test_a_gap_longer_than_a_round_is_not_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, c.MAX_ROUND_GAP_S + 10.0])
    monkeypatch.setattr(c.time, "monotonic", lambda: next(clock))
    sleeper = Contribution(tmp_path)
    sleeper.round_done()  # the laptop slept between two samples
    assert sleeper.totals.rounds == 0 and sleeper.totals.train_seconds == 0.0
