"""The supervisor: backoff and giving up on hand-built histories, crash reasons, and a real engine
killed with -9 under `sapo run --supervised` coming back with the reason in its status."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.control.client import ControlClient
from engine.control.token import read_control_info, read_token
from engine.models.policy import build_tiny_policy
from engine.supervisor import (
    CRASH_FILE,
    Supervisor,
    SupervisorConfig,
    crash_reason,
    crash_text,
    read_last_crash,
    restart_delay,
)


def test_backoff_doubles_to_its_cap_and_gives_up_after_repeated_fast_crashes() -> None:
    cfg = SupervisorConfig(backoff_initial_s=2, backoff_max_s=10, max_fast_crashes=5)
    assert [restart_delay(n, cfg) for n in range(1, 6)] == [2, 4, 8, 10, None]


def test_crash_reasons_name_the_signal_or_the_exception() -> None:
    assert "out of memory" in crash_reason(-signal.SIGKILL, "")
    assert "SIGSEGV" in crash_reason(-signal.SIGSEGV, "")
    tail = "Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: CUDA out of memory\nbye\n"
    assert crash_reason(70, tail) == "exited with code 70: RuntimeError: CUDA out of memory"
    assert crash_reason(1, "") == "exited with code 1: no output"


def test_a_torn_or_hostile_crash_file_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    path = tmp_path / "logs" / CRASH_FILE
    assert read_last_crash(tmp_path) is None
    for text in ("{", "[]", json.dumps({"ts": "now"}), json.dumps({"ts": float("inf")}).replace("Infinity", "1e999")):
        path.write_text(text)
        assert read_last_crash(tmp_path) is None
    assert crash_text(None) == ""


def test_a_command_that_always_fails_is_given_up_on(tmp_path: Path) -> None:
    said: list[str] = []
    cmd = [sys.executable, "-c", "import sys; print('ValueError: no model here'); sys.exit(3)"]
    sup = Supervisor(cmd, tmp_path, SupervisorConfig(backoff_initial_s=0.05, max_fast_crashes=3), say=said.append)
    assert sup.run() == 3 and sup.restarts == 2
    crash = read_last_crash(tmp_path)
    assert crash is not None and crash["gave_up"] and crash["reason"] == "exited with code 3: ValueError: no model here"
    assert "not restarting" in said[-1] and "not restarted" in crash_text(crash)


def test_exit_codes_a_restart_cannot_fix_are_not_restarted(tmp_path: Path) -> None:
    sup = Supervisor([sys.executable, "-c", "raise SystemExit(78)"], tmp_path, say=lambda _: None)
    assert sup.run() == 78 and sup.restarts == 0


async def _status(data_dir: Path) -> dict:
    info = read_control_info(data_dir)
    assert info is not None
    async with ControlClient(info.url, read_token(data_dir), timeout_s=10) as client:
        return await client.call("status")


def _wait_engine(data_dir: Path, not_pid: int | None, timeout_s: float = 120) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = read_control_info(data_dir)
        if info is not None and info.pid != not_pid:
            with contextlib.suppress(Exception):  # still starting
                asyncio.run(_status(data_dir))
                return info.pid
        time.sleep(0.3)
    raise AssertionError("the engine did not come up")


@pytest.mark.timeout(300)
def test_a_killed_engine_is_restarted_and_says_why_it_died(tmp_path: Path) -> None:
    model = build_tiny_policy(tmp_path / "model")
    data = tmp_path / "node"
    cmd = [sys.executable, "-m", "engine", "run", "--headless", "--control", "--supervised", "--solo", "--model",
           str(model), "--preset", "cpu-small", "--data-dir", str(data), "--set", "completions=4", "--local", "2",
           "--set", "eval_every=0"]
    sup = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
    try:
        first = _wait_engine(data, None)
        assert asyncio.run(_status(data))["last_crash"] is None
        os.kill(first, signal.SIGKILL)  # what the OOM killer does
        second = _wait_engine(data, first)
        status = asyncio.run(_status(data))
        crash = status["last_crash"]
        assert crash["exit_code"] == -signal.SIGKILL and "SIGKILL" in crash["reason"] and not crash["gave_up"]
        assert "restarted after" in crash_text(crash)
        deadline = time.monotonic() + 60
        while asyncio.run(_status(data))["round"] == 0:  # the restarted engine trains
            assert time.monotonic() < deadline
            time.sleep(0.3)
        sup.send_signal(signal.SIGTERM)  # a clean stop ends both, with no restart
        assert sup.wait(timeout=60) == 0
        assert not psutil_alive(second)
    finally:
        if sup.poll() is None:
            sup.kill()


def psutil_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_training_crash_ends_the_engine_with_its_reason_for_the_supervisor(tmp_path: Path) -> None:
    from engine.supervisor import EXIT_ENGINE_CRASHED

    (tmp_path / "empty").mkdir()
    out = subprocess.run([sys.executable, "-m", "engine", "run", "--headless", "--solo", "--model",
                          str(tmp_path / "empty"), "--data-dir", str(tmp_path / "node")], check=False,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == EXIT_ENGINE_CRASHED
    assert crash_reason(out.returncode, out.stderr).startswith("exited with code 70: FileNotFoundError: no model at")


def test_doctor_shows_the_last_crash(tmp_path: Path) -> None:
    from engine.supervisor import CrashRecord, write_crash

    write_crash(tmp_path, CrashRecord(ts=time.time(), exit_code=-9, reason=crash_reason(-9, ""), ran_s=3.0,
                                      restarts=1, gave_up=False, next_restart_s=4.0))
    out = subprocess.run([sys.executable, "-m", "engine", "doctor", "--offline", "--no-probe", "--data-dir", str(tmp_path)],
                         check=True, capture_output=True, text=True, timeout=120)
    assert "Last crash:" in out.stdout and "SIGKILL" in out.stdout and "restarted after 4 s" in out.stdout
    data = json.loads(subprocess.run([sys.executable, "-m", "engine", "doctor", "--json", "--offline", "--no-probe", "--data-dir",
                                      str(tmp_path)], check=True, capture_output=True, text=True, timeout=120).stdout)
    assert data["last_crash"]["exit_code"] == -9 and data["last_crash"]["restarts"] == 1
