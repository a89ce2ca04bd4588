"""Find a running engine through `control.json`, or start one as a child process.

The engine outlives the window (BOINC and F@H work that way), so it runs in its own session and
at idle CPU priority with OpenMP workers that sleep while they wait (engine/machine/load.py): the
person at the keyboard always comes first, and the GUI stays responsive while the engine trains.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from engine.control.token import ControlInfo, read_control_info
from engine.errors import SapoError
from engine.machine import load as machine_load

ENGINE_LOG = "engine.log"


class EngineStartError(SapoError, RuntimeError):
    """The engine process exited or never became reachable; the message holds its last log lines."""


def _port_open(url: str, timeout_s: float = 0.5) -> bool:
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        return False
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=timeout_s):
            return True
    except OSError:
        return False


def find_engine(data_dir: Path) -> ControlInfo | None:
    """The engine serving this data dir, if its process is alive and its port answers."""
    info = read_control_info(data_dir)
    if info is None or not psutil.pid_exists(info.pid) or not _port_open(info.url):
        return None
    return info


def engine_command(data_dir: Path, extra_args: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "engine", "run", "--headless", "--control", "--supervised", "--data-dir",
            str(data_dir), *extra_args]


def engine_env(low_priority: bool, base: dict[str, str] | None = None) -> dict[str, str]:
    """The engine child's environment: passive OpenMP waits (read when torch and llama.cpp load, so
    only the environment can set them in time) and the priority `sapo run` puts itself at."""
    env = machine_load.passive_wait_env(dict(os.environ) if base is None else base)
    env[machine_load.PRIORITY_ENV] = "idle" if low_priority else "normal"
    return env


def start_engine(data_dir: Path, extra_args: Sequence[str] = (), low_priority: bool = True,
                 command: Sequence[str] | None = None) -> subprocess.Popen[bytes]:
    """Start `sapo run --headless --control` detached from this process; output goes to logs/engine.log.
    low_priority: idle CPU priority (the default); else normal."""
    data_dir = Path(data_dir)
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cmd = list(command) if command is not None else engine_command(data_dir, extra_args)
    with open(logs / ENGINE_LOG, "ab") as log_file:
        kwargs: dict[str, object] = {}
        if os.name == "nt":
            kwargs["creationflags"] = (getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)
                                       | getattr(subprocess, "DETACHED_PROCESS", 0))
        else:
            kwargs["start_new_session"] = True  # Ctrl+C on the GUI's terminal must not kill the engine
        proc: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
            cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=engine_env(low_priority),
            **kwargs)
    if low_priority:  # at once, before the child starts threads; `sapo run` lowers itself too
        machine_load.apply_priority("idle", pid=proc.pid)
    return proc


def log_tail(data_dir: Path, lines: int = 20) -> str:
    path = Path(data_dir) / "logs" / ENGINE_LOG
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - 16384))
            return "\n".join(fh.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""


def poll_engine(data_dir: Path, proc: subprocess.Popen[bytes] | None) -> ControlInfo | None:
    """One non-blocking check: the engine's address once it serves, None while it starts.

    Raises EngineStartError when the child process has exited.
    """
    if proc is not None and proc.poll() is not None:
        raise EngineStartError(f"the engine exited with code {proc.returncode}:\n{log_tail(data_dir)}")
    return find_engine(data_dir)  # may name another engine that won the race for this data dir: fine


def wait_for_engine(data_dir: Path, proc: subprocess.Popen[bytes] | None, timeout_s: float = 120.0,
                    interval_s: float = 0.2) -> ControlInfo:
    """Blocking version of `poll_engine` for the CLI (never on the Qt thread)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = poll_engine(data_dir, proc)
        if info is not None:
            return info
        time.sleep(interval_s)
    raise EngineStartError(f"the engine did not start serving within {timeout_s:g} s:\n{log_tail(data_dir)}")


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 30.0) -> int | None:
    """SIGTERM (an engine checkpoints and says bye), then SIGKILL if it will not go within `timeout_s`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(5)
    return proc.returncode
