"""The engine's supervisor: `sapo run --supervised` runs the engine as a child and restarts it.

A volunteer's engine dies for reasons nobody is there to see (the OOM killer, a native crash, an
exception in a round). The supervisor restarts it with exponential backoff, gives up after repeated
fast crashes (a broken install would otherwise restart forever), and writes why it died to
`logs/last_crash.json`, which the engine's status, the app and `sapo doctor` show. A clean exit
(code 0: the contributor left, or SIGTERM) ends the supervisor too. Both the desktop app and the
autostart entry start the engine this way.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.control.launcher import ENGINE_LOG, log_tail

CRASH_FILE = "last_crash.json"
LOG_ROTATE_BYTES = 16 * 2**20  # engine.log moves to engine.log.1 past this at a (re)start
MAX_REASON = 500
EXIT_ENGINE_CRASHED = 70  # EX_SOFTWARE: the engine's training crashed; the supervisor restarts it
EXIT_NO_RESTART = 78  # EX_CONFIG: a condition a restart cannot fix (this identity runs elsewhere)
NO_RESTART_CODES = (2, EXIT_NO_RESTART)  # 2: a bad command line


@dataclass(frozen=True)
class SupervisorConfig:
    backoff_initial_s: float = 2.0  # the first restart waits this long
    backoff_max_s: float = 300.0  # doubling stops here
    healthy_after_s: float = 120.0  # a run this long resets the count of fast crashes
    max_fast_crashes: int = 5  # consecutive crashes, each sooner than healthy_after_s, before giving up

    def __post_init__(self) -> None:
        for name in ("backoff_initial_s", "backoff_max_s", "healthy_after_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0")
        if not 1 <= self.max_fast_crashes <= 1000:
            raise ValueError("max_fast_crashes must be between 1 and 1000")


@dataclass(frozen=True)
class CrashRecord:
    ts: float  # unix time of the exit
    exit_code: int  # the process's code; negative: killed by that signal (POSIX)
    reason: str  # one line for people
    ran_s: float  # how long that run lasted
    restarts: int  # restarts so far by this supervisor
    gave_up: bool  # no restart follows
    next_restart_s: float  # the wait before the restart (0 when gave_up)


def restart_delay(fast_crashes: int, cfg: SupervisorConfig) -> float | None:
    """Wait before restart number `fast_crashes` in a row -> seconds, or None: give up."""
    if fast_crashes >= cfg.max_fast_crashes:
        return None
    return min(cfg.backoff_max_s, cfg.backoff_initial_s * 2 ** max(0, fast_crashes - 1))


_SIGNAL_HINTS = {
    "SIGKILL": "killed (SIGKILL): often the system running out of memory (see `dmesg`), or a forced stop",
    "SIGSEGV": "crashed in native code (SIGSEGV)",
    "SIGABRT": "aborted (SIGABRT), usually by a native library",
    "SIGBUS": "crashed in native code (SIGBUS)",
}


def crash_reason(exit_code: int, tail: str) -> str:
    """Why a run ended, in one line: the signal, or the last exception line of its log."""
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        return _SIGNAL_HINTS.get(name, f"killed by {name}")
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Interrupt", "Exit")) and " " not in head:
            return f"exited with code {exit_code}: {line}"[:MAX_REASON]
    last = lines[-1] if lines else "no output"
    return f"exited with code {exit_code}: {last}"[:MAX_REASON]


def _log_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "logs"


def write_crash(data_dir: Path, record: CrashRecord) -> None:
    path = _log_dir(data_dir) / CRASH_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(record)))
    os.replace(tmp, path)


def read_last_crash(data_dir: Path) -> dict[str, Any] | None:
    """The last crash record, validated (a hand-edited or torn file gives None, never an error)."""
    try:
        return parse_crash(json.loads((_log_dir(data_dir) / CRASH_FILE).read_text(encoding="utf-8")[:8192]))
    except (OSError, ValueError):
        return None


def parse_crash(data: Any) -> dict[str, Any] | None:
    """A crash record from a file or another process -> a clean dict, or None when it is not one."""
    if not isinstance(data, dict):
        return None

    def number(key: str) -> bool:
        v = data.get(key)
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0

    def integer(key: str) -> bool:
        return isinstance(data.get(key), int) and not isinstance(data.get(key), bool)

    if not (all(number(k) for k in ("ts", "ran_s", "next_restart_s")) and integer("exit_code")
            and integer("restarts") and data["restarts"] >= 0 and isinstance(data.get("reason"), str)
            and isinstance(data.get("gave_up"), bool)):
        return None
    return {"ts": float(data["ts"]), "exit_code": data["exit_code"], "reason": data["reason"][:MAX_REASON],
            "ran_s": float(data["ran_s"]), "restarts": data["restarts"], "gave_up": data["gave_up"],
            "next_restart_s": float(data["next_restart_s"])}


def crash_text(crash: dict[str, Any] | None, now: float | None = None) -> str:
    """One line for the app and `sapo doctor`; "" when there was none."""
    if not crash:
        return ""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(crash["ts"]))
    then = ("it was not restarted (see logs/engine.log)" if crash["gave_up"]
            else f"restarted after {crash['next_restart_s']:.0f} s")
    return f"The engine stopped at {when}: {crash['reason']}; {then}."


def _rotate(log: Path) -> None:
    try:
        if log.stat().st_size > LOG_ROTATE_BYTES:
            os.replace(log, log.with_name(log.name + ".1"))
    except OSError:
        pass


class Supervisor:
    """Run `command` until it exits cleanly; restart it when it crashes (see the module doc)."""

    def __init__(self, command: Sequence[str], data_dir: Path, cfg: SupervisorConfig | None = None, *,
                 say: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic) -> None:
        self.command = list(command)
        self.data_dir = Path(data_dir)
        self.cfg = cfg or SupervisorConfig()
        self.say = say
        self.clock = clock
        self.restarts = 0
        self.child: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()

    def stop(self) -> None:
        """Stop supervising: the child gets SIGTERM (it checkpoints and leaves), then no restart."""
        self._stop.set()
        child = self.child
        if child is not None and child.poll() is None:
            child.terminate()

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def run(self) -> int:
        fast = 0
        log = _log_dir(self.data_dir) / ENGINE_LOG
        while True:
            log.parent.mkdir(parents=True, exist_ok=True)
            _rotate(log)
            started = self.clock()
            with open(log, "ab") as out:
                self.child = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=out,
                                              stderr=subprocess.STDOUT)
            if self._stop.is_set():  # a stop that raced the start
                self.child.terminate()
            code = self._wait(self.child)
            if code == 0 or self._stop.is_set():
                return code
            ran = self.clock() - started
            fast = fast + 1 if ran < self.cfg.healthy_after_s else 1
            delay = None if code in NO_RESTART_CODES else restart_delay(fast, self.cfg)
            reason = crash_reason(code, log_tail(self.data_dir, lines=400))
            record = CrashRecord(ts=time.time(), exit_code=code, reason=reason,
                                 ran_s=round(ran, 3), restarts=self.restarts, gave_up=delay is None,
                                 next_restart_s=0.0 if delay is None else delay)
            write_crash(self.data_dir, record)
            if delay is None:
                why = ("a restart cannot fix this" if code in NO_RESTART_CODES else
                       f"it crashed {fast} times in a row, each within {self.cfg.healthy_after_s:g} s")
                self.say(f"sapo: not restarting the engine ({why}). Last: {record.reason}")
                return code if code > 0 else 1
            self.say(f"sapo: the engine stopped ({record.reason}); restarting in {delay:g} s")
            if self._stop.wait(delay):
                return code if code > 0 else 1
            self.restarts += 1

    def _wait(self, child: subprocess.Popen[bytes]) -> int:
        while True:
            try:
                return child.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                continue
