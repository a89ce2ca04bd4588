"""`sapo doctor`'s round for the cores the contributor lends, what it assumed, and the load beside it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine import doctor
from engine.cli.doctor import lent_line
from engine.settings import ContributorSettings
from engine.store import Store


def test_the_lent_estimate_undoes_fits_every_core_and_applies_the_gain_per_thread() -> None:
    hw = doctor.hypothetical("cpu", 16, cores=4)
    rep = doctor.report(hw, can_fetch=False)
    every_core = rep["pick"]["round_seconds"]
    lent = rep["lent"]
    assert lent["cores_lent"] == lent["threads"] == 4  # automatic: every core (the governor leaves busy ones)
    assert lent["round_seconds"] == pytest.approx(every_core * 4 / (1 + 3 * doctor.THREAD_GAIN), abs=0.1)
    assert rep["pick"]["round_seconds_lent"] == lent["round_seconds"]
    assert "4 thread(s) on 4 of 4 physical cores (automatic" in lent["assumes"]
    assert lent["busy_cores"] is None and lent["round_seconds_now"] is None  # load not measured: not guessed
    for c in rep["candidates"]:
        assert c["round_seconds_lent"] == pytest.approx(c["round_seconds"] * 4 / (1 + 3 * doctor.THREAD_GAIN), abs=0.1)


def test_one_lent_core_is_fits_single_core_calibration() -> None:
    two = doctor.report(doctor.hypothetical("cpu", 16, cores=2), can_fetch=False, cpu_cores=1)
    one = doctor.report(doctor.hypothetical("cpu", 16, cores=1), can_fetch=False)
    assert two["lent"]["round_seconds"] == pytest.approx(one["pick"]["round_seconds"], abs=0.1)


def test_the_load_now_picks_the_threads_and_no_free_core_means_waiting() -> None:
    hw = doctor.hypothetical("cpu", 16, cores=4)
    busy = doctor.report(hw, can_fetch=False, cpu_cores=4, busy_cores=1.0)["lent"]
    assert busy["threads"] == 4 and busy["threads_now"] == 3
    assert busy["round_seconds_now"] == pytest.approx(doctor.lent_seconds(
        doctor.report(hw, can_fetch=False)["pick"]["round_seconds"], hw, 3), abs=0.1)
    full = doctor.report(hw, can_fetch=False, cpu_cores=4, busy_cores=3.8)["lent"]
    assert full["threads_now"] == 1 and full["round_seconds_now"] is None


def test_a_gpu_round_does_not_follow_the_cpu_threads() -> None:
    rep = doctor.report(doctor.hypothetical("cuda", 24), can_fetch=True, cpu_cores=1)
    assert rep["lent"]["round_seconds"] == rep["pick"]["round_seconds"]


def _doctor_json(*args: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-m", "engine", "doctor", "--json", "--offline", "--no-probe", *args], capture_output=True,
                         text=True, timeout=180, check=True)
    return dict(json.loads(out.stdout))


def test_the_cli_uses_the_data_dirs_setting_and_measures_this_machines_load(tmp_path: Path) -> None:
    ContributorSettings(cpu_cores=2).save(tmp_path)
    rep = _doctor_json("--data-dir", str(tmp_path))
    lent = rep["lent"]
    assert isinstance(lent, dict) and lent["cpu_cores_setting"] == 2 and lent["cores_lent"] == 2
    assert isinstance(lent["busy_cores"], float) and 1 <= lent["threads_now"] <= 2
    hypothetical = _doctor_json("--device", "cpu", "--memory-gb", "16", "--cores", "8", "--cpu-cores", "5",
                                "--data-dir", str(tmp_path))["lent"]
    assert isinstance(hypothetical, dict)
    assert hypothetical["cores_lent"] == 5 and hypothetical["busy_cores"] is None  # another machine: quiet


def test_the_table_says_the_lent_round_and_the_load() -> None:
    lent = {"round_seconds": 17.6, "assumes": "1 thread(s) on 1 of 2 physical cores", "busy_cores": 2.0,
            "threads_now": 1, "round_seconds_now": None}
    assert "~18 s for m (1 thread(s)" in lent_line("m", lent) and "no core is free" in lent_line("m", lent)
    assert "~30 s" in lent_line("m", lent | {"busy_cores": 0.5, "round_seconds_now": 30.0})
    assert "Now" not in lent_line("m", lent | {"busy_cores": None})


def _measured_store(path: Path, model: str, rounds: int, generate_s: float, update_per_row_s: float) -> Store:
    store = Store(path / "node.db")
    for r in range(1, rounds + 1):
        rows = 16 * (r % 3)  # rounds whose groups had no signal trained nothing: they still measure generation
        update = update_per_row_s * rows
        store.record_round(r, r, {"rows_trained": float(rows), "groups_trained": float(r % 3)}, {},
                           {"generate": generate_s, "score": 0.1, "prepare": 0.0, "update": update,
                            "total": generate_s + 0.1 + update}, 2, 0, model=model)
    return store


def test_this_machines_own_rounds_calibrate_the_estimate_and_say_so(tmp_path: Path) -> None:
    hw = doctor.hypothetical("cpu", 16, cores=2)
    estimated = doctor.report(hw, can_fetch=False)
    model = estimated["pick"]["model"]
    assert estimated["lent"]["source"] == "estimated" and "calibration" not in estimated["lent"]
    store = _measured_store(tmp_path, model, 40, generate_s=3.9, update_per_row_s=0.25)
    try:
        measured = doctor.stored_rounds(store)
        assert measured is not None and measured[0] == model and len(measured[1]) == doctor.CALIBRATION_ROUNDS
        rep = doctor.report(hw, can_fetch=False, measured=measured)
    finally:
        store.close()
    lent, shape = rep["lent"], rep["round"]
    full_round = 4.0 + 0.25 * shape["questions"] * shape["completions"]  # every completion trained, as estimated
    assert lent["source"] == "measured" and lent["round_seconds"] == pytest.approx(full_round, abs=0.2)
    assert lent["calibration"]["rounds"] == doctor.CALIBRATION_ROUNDS
    factor = lent["calibration"]["factor"]
    for before, after in zip(estimated["candidates"], rep["candidates"]):  # every model scaled alike
        assert after["round_seconds_lent"] == pytest.approx(before["round_seconds_lent"] * factor, rel=0.02, abs=0.1)
    assert "measured here: 32 rounds of" in lent_line(model, lent)
    assert "estimated from the catalog's rates" in lent_line(model, estimated["lent"])
    (tmp_path / "few").mkdir()
    with _measured_store(tmp_path / "few", model, 2, 3.9, 0.25) as few:  # too few rounds to tell
        assert doctor.report(hw, can_fetch=False, measured=doctor.stored_rounds(few))["lent"]["source"] == "estimated"
