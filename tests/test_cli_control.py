"""`sapo pause | resume | finish | status [--json]` against a real engine process (`sapo run --headless
--control` on a tiny model, started paused by the contributor's setting), and a clean one-line error
from each when no engine runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.control.launcher import find_engine, start_engine, stop_process, wait_for_engine
from engine.control.token import write_control_info
from engine.models.policy import build_tiny_policy
from engine.settings import ContributorSettings

COMMANDS = (["pause"], ["resume"], ["finish"], ["status"], ["status", "--json"])


def sapo(data_dir: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine", *args, "--data-dir", str(data_dir)], capture_output=True,
                          text=True, timeout=timeout, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})


def status(data_dir: Path) -> dict[str, Any]:
    out = sapo(data_dir, "status", "--json")
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def until(data_dir: Path, check: Any, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        now = status(data_dir)
        if check(now):
            return now
        assert time.monotonic() < deadline, f"timed out; last status {now}"
        time.sleep(0.2)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Path]:
    model = build_tiny_policy(tmp_path / "tiny")
    data_dir = tmp_path / "data"
    ContributorSettings(start_paused=True, pause_on_battery=False).save(data_dir)
    proc = start_engine(data_dir, command=[
        sys.executable, "-m", "engine", "run", "--headless", "--control", "--solo", "--no-mdns", "--data-dir",
        str(data_dir), "--model", str(model), "--preset", "cpu-small", "--local", "2", "--set", "completions=4",
        "--set", "eval_every=0"])
    try:
        wait_for_engine(data_dir, proc, timeout_s=120)
        yield data_dir
    finally:
        stop_process(proc)


@pytest.mark.timeout(300)
def test_pause_resume_finish_status_drive_a_real_engine(engine: Path) -> None:
    held = status(engine)
    assert (held["state"], held["paused_by"], held["paused"], held["training"]) == ("paused", "start", True, False)
    assert "started paused" in held["detail"] and held["engine"]["pid"] > 0
    text = sapo(engine, "status")
    assert text.returncode == 0 and text.stdout.startswith("paused: started paused")

    resumed = sapo(engine, "resume")
    assert resumed.returncode == 0, resumed.stderr
    assert not resumed.stdout.startswith("paused")
    until(engine, lambda s: s["round"] >= 1 and s["state"] == "solo")

    paused = sapo(engine, "pause")
    assert paused.returncode == 0 and ("pausing" in paused.stdout or "paused by you" in paused.stdout)
    now = until(engine, lambda s: s["state"] == "paused")
    assert (now["paused_by"], now["detail"]) == ("you", "paused by you")
    assert "paused: paused by you" in sapo(engine, "status").stdout

    assert sapo(engine, "resume").returncode == 0
    trained = until(engine, lambda s: s["round"] > now["round"])
    finished = sapo(engine, "finish")
    assert finished.returncode == 0, finished.stderr
    assert "finished after round" in finished.stdout and "sapo resume" in finished.stdout
    done = status(engine)
    assert done["state"] == "stopped" and done["round"] >= trained["round"] and not done["training"]
    assert done["detail"].startswith(f"finished after round {done['round']}")
    assert find_engine(engine) is not None  # the engine stays up


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_each_command_says_no_engine_runs_in_one_line(tmp_path: Path, args: list[str]) -> None:
    out = sapo(tmp_path, *args, timeout=60)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip().count("\n") == 0 and "Traceback" not in out.stderr
    assert f"sapo {args[0]}: no engine is running for {tmp_path}" in out.stderr


def test_a_stale_control_file_is_no_engine(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_control_info(tmp_path, "ws://127.0.0.1:9", dead.pid)  # a crashed engine's leftover
    out = sapo(tmp_path, "status", timeout=60)
    assert out.returncode == 1 and "no engine is running" in out.stderr and "Traceback" not in out.stderr
