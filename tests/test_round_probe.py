"""The doctor's short probe: what a stored probe must be to count, and how it calibrates the estimate
before this machine has rounds of its own (the real probe runs in tests/fast/test_round_probe_real.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import doctor
from engine.cli.doctor import lent_line
from engine.round_probe import PROBE_FILE, PROBE_VERSION, save_probe, stored_probe

HW = doctor.hypothetical("cpu", 16, cores=2)


def _probe(model: str, threads: int, **changes: Any) -> dict[str, Any]:
    return {"version": PROBE_VERSION, "model": model, "threads": threads, "rounds_probed": 2,
            "completions_probed": 16, "generate_seconds": 3.0, "update_seconds_per_completion": 0.15,
            "round_seconds": 7.8, "probe_seconds": 12.0, "measured_at": 0.0} | changes


def test_a_stored_probe_counts_only_for_its_model_threads_and_version(tmp_path: Path) -> None:
    save_probe(tmp_path, _probe("m", 2))
    assert stored_probe(tmp_path, "m", 2) is not None
    assert stored_probe(tmp_path, "other", 2) is None and stored_probe(tmp_path, "m", 1) is None
    for bad in ({"version": PROBE_VERSION + 1}, {"round_seconds": -1.0}, {"round_seconds": True},
                {"round_seconds": "7"}, {"round_seconds": float("inf")}):
        save_probe(tmp_path, _probe("m", 2, **bad))
        assert stored_probe(tmp_path, "m", 2) is None, bad
    for text in ("not json", "[1, 2]", ""):
        (tmp_path / PROBE_FILE).write_text(text)
        assert stored_probe(tmp_path, "m", 2) is None
    assert stored_probe(tmp_path / "missing", "m", 2) is None
    assert not list(tmp_path.glob(".probe-*"))  # every write replaced the file whole


def test_a_probe_calibrates_the_estimate_until_measured_rounds_replace_it(tmp_path: Path) -> None:
    estimated = doctor.report(HW, can_fetch=False)
    model, threads = estimated["pick"]["model"], estimated["lent"]["threads"]
    save_probe(tmp_path, _probe(model, threads))
    rep = doctor.report(HW, can_fetch=False, probe_dir=tmp_path)
    lent = rep["lent"]
    assert lent["source"] == "probed" and lent["round_seconds"] == pytest.approx(7.8, abs=0.1)
    factor = lent["calibration"]["factor"]
    assert factor == pytest.approx(7.8 / estimated["lent"]["round_seconds"], rel=0.02)
    for before, after in zip(estimated["candidates"], rep["candidates"]):  # every model scaled alike
        assert after["round_seconds_lent"] == pytest.approx(before["round_seconds_lent"] * factor, rel=0.02, abs=0.1)
    assert "probed here: a round of" in lent_line(model, lent)
    other_threads = doctor.report(HW, can_fetch=False, probe_dir=tmp_path, cpu_cores=1)["lent"]
    assert other_threads["source"] == "estimated"  # probed at 2 threads: says nothing of 1
    rows = [{"seconds_total": 5.0, "seconds_generate": 2.0, "seconds_score": 0.0, "seconds_prepare": 0.0,
             "seconds_update": 3.0, "rows_trained": 32.0}] * doctor.MIN_CALIBRATION_ROUNDS
    measured = doctor.report(HW, can_fetch=False, probe_dir=tmp_path, measured=(model, rows))["lent"]
    assert measured["source"] == "measured"  # the machine's own rounds beat the probe


def test_the_cli_table_and_json_read_a_stored_probe(tmp_path: Path) -> None:
    import subprocess
    import sys

    def doctor_json(*args: str) -> dict[str, Any]:
        out = subprocess.run([sys.executable, "-m", "engine", "doctor", "--json", "--offline", "--no-probe",
                              "--data-dir", str(tmp_path), *args], capture_output=True, text=True, timeout=120,
                             check=True)
        assert "Probing" not in out.stderr  # --no-probe: never runs one
        parsed: dict[str, Any] = json.loads(out.stdout)
        return parsed

    first = doctor_json()
    model, threads = first["pick"]["model"], first["lent"]["threads"]
    if first["device"]["kind"] != "cpu":
        pytest.skip("the probe calibrates CPU rounds")
    save_probe(tmp_path, _probe(model, threads, round_seconds=first["lent"]["round_seconds"] / 2))
    lent = doctor_json()["lent"]
    assert lent["source"] == "probed" and lent["round_seconds"] == pytest.approx(first["lent"]["round_seconds"] / 2, abs=0.2)
