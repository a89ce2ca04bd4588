"""A contributor's fleet: the engines they run (this machine's and others reached by URL and token),
what each is doing, and alerts when one stops training, goes silent or crashes.

Qt-free. `FleetPoller` keeps one control connection per engine on its own asyncio thread and polls
`status` every few seconds; readers take frozen `EngineReport`s and alert lines (thread-safe copies).
A remote engine is reached through an SSH port-forward (`ssh -L 7799:127.0.0.1:<port> box`, then
ws://127.0.0.1:7799) or an engine whose control listener was explicitly opened; never an open port by
default. The fleet list lives in one JSON file (mode 0600: it holds tokens). Alert rules are pure
functions of two reports (`alerts`), so they are tested by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engine.control.status import NodeStatus
from engine.control.token import TokenError, validate_token
from engine.errors import SapoError

MAX_ENGINES = 32
TRAINING_STATES = ("training", "in_swarm", "solo", "joining")  # states in which rounds are expected
SILENT_AFTER_S = 60.0  # no answer for this long after answering: "went silent"
ASKED_STOP_S = 600.0  # after this window asks an engine to leave or pause: its stopping raises no alert
STALL_AFTER_S = 600.0  # training but no new round for this long: "stopped training"


class FleetError(SapoError, ValueError):
    """A fleet entry or file that does not validate."""


@dataclass(frozen=True)
class FleetEntry:
    """One engine of the fleet: a display name, its control URL and its token."""

    name: str
    url: str
    token: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 0 < len(self.name) <= 64 or not self.name.isprintable():
            raise FleetError("an engine's name is 1-64 printable characters")
        parts = urlsplit(self.url) if isinstance(self.url, str) else None
        if parts is None or parts.scheme not in ("ws", "wss") or not parts.hostname or len(self.url) > 256:
            raise FleetError(f"{self.url!r} is not a ws:// or wss:// control URL (e.g. ws://127.0.0.1:7799)")
        try:
            validate_token(self.token if isinstance(self.token, str) else "")
        except TokenError as exc:
            raise FleetError(f"{self.name}: {exc}") from None


def load_fleet(path: Path) -> list[FleetEntry]:
    """The saved fleet (remote engines); a missing file is an empty fleet, bad entries are skipped."""
    try:
        data = json.loads(path.read_text(encoding="utf-8")[:1_000_000])
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise FleetError(f"cannot read {path}: {exc}") from None
    out: list[FleetEntry] = []
    for item in data.get("engines", []) if isinstance(data, dict) else []:
        if isinstance(item, dict) and len(out) < MAX_ENGINES:
            with contextlib.suppress(FleetError):
                out.append(FleetEntry(str(item.get("name", "")), str(item.get("url", "")), str(item.get("token", ""))))
    return out


def save_fleet(path: Path, entries: Sequence[FleetEntry]) -> None:
    """Atomically, readable by this user only (tokens)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"engines": [{"name": e.name, "url": e.url, "token": e.token} for e in entries[:MAX_ENGINES]]}, f)
    os.replace(tmp, path)


@dataclass(frozen=True)
class EngineReport:
    """What the fleet view shows of one engine."""

    name: str
    url: str
    reachable: bool = False
    state: str = "unknown"
    model: str = ""
    round: int = 0
    rounds_per_min: float | None = None
    reward: float | None = None
    reward_before: float | None = None
    last_round_at: float | None = None
    last_contact: float | None = None  # when it last answered
    checked_at: float | None = None  # when this report was made
    crash_at: float | None = None  # its supervisor's newest crash record
    crash_reason: str = ""
    error: str = ""  # why it cannot be reached, when it cannot

    @property
    def trend(self) -> str:
        if self.reward is None or self.reward_before is None:
            return ""
        delta = self.reward - self.reward_before
        return "↑" if delta > 0.02 else "↓" if delta < -0.02 else "→"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else None


def report_from_status(entry: FleetEntry, status: NodeStatus, now: float) -> EngineReport:
    """An engine's status (another machine's, already checked by the control client) -> its report."""
    recent, crash = status.recent, status.last_crash or {}
    return EngineReport(
        entry.name, entry.url, reachable=True, state=status.state, model=status.model[:128], round=status.round,
        rounds_per_min=_number(recent.get("rounds_per_min")), reward=_number(recent.get("reward")),
        reward_before=_number(recent.get("reward_before")), last_round_at=_number(recent.get("last_round_at")),
        last_contact=now, checked_at=now, crash_at=_number(crash.get("ts")),
        crash_reason=str(crash.get("reason") or "")[:300])


STATE_WORDS = {"leaving": "leaving the swarm", "stopped": "", "pausing": "pausing", "joining": "joining again"}


def alerts(before: EngineReport | None, after: EngineReport, now: float, asked: bool = False) -> list[str]:
    """What deserves a desktop notification between two reports of one engine (`asked`: the person at
    this window just asked it to leave or pause, so its stopping is no news)."""
    out: list[str] = []
    name = after.name
    if after.crash_at is not None and (before is None or before.crash_at is None or after.crash_at > before.crash_at) \
            and now - after.crash_at < 3600 and before is not None:
        out.append(f"{name} crashed: {after.crash_reason or 'see its log'}")
    if before is None:
        return out
    then = before.checked_at if before.checked_at is not None else now

    def crossed(since: float | None, limit: float) -> bool:  # over the limit now, and not at the last check
        return since is not None and now - since >= limit > then - since

    if not after.reachable and crossed(after.last_contact, SILENT_AFTER_S):
        out.append(f"{name} went silent: no answer for {now - (after.last_contact or now):.0f} s "
                   f"({after.error or 'unreachable'})")
    if after.reachable and before.state in TRAINING_STATES and after.state not in TRAINING_STATES \
            and after.state not in ("paused",) and not asked:
        words = STATE_WORDS.get(after.state, after.state)
        out.append(f"{name} stopped training" + (f" ({words})" if words else ""))
    if after.reachable and after.state in TRAINING_STATES and crossed(after.last_round_at, STALL_AFTER_S):
        out.append(f"{name} stopped training: no round for {(now - (after.last_round_at or now)) / 60:.0f} min")
    return out


class FleetPoller:
    """Polls every engine's `status` on a private asyncio thread; `reports()` and `take_alerts()`
    return copies. Entries may change at any time (`set_entries`)."""

    def __init__(self, entries: Sequence[FleetEntry] = (), poll_s: float = 3.0, timeout_s: float = 5.0) -> None:
        self.poll_s, self.timeout_s = poll_s, timeout_s
        self._lock = threading.Lock()
        self._entries = list(entries)[:MAX_ENGINES]
        self._reports: dict[str, EngineReport] = {}
        self._alerts: list[str] = []
        self._asked: dict[str, float] = {}  # url -> until when (monotonic) its stopping was asked for here
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None  # set by stop(): the poll loop's sleep ends at once

    def set_entries(self, entries: Sequence[FleetEntry]) -> None:
        with self._lock:
            self._entries = list(entries)[:MAX_ENGINES]
            urls = {e.url for e in self._entries}
            self._reports = {u: r for u, r in self._reports.items() if u in urls}

    def entries(self) -> list[FleetEntry]:
        with self._lock:
            return list(self._entries)

    def reports(self) -> list[EngineReport]:
        with self._lock:
            return [self._reports.get(e.url) or EngineReport(e.name, e.url) for e in self._entries]

    def expect_stop(self, url: str, seconds: float = ASKED_STOP_S) -> None:
        """This window asked the engine at `url` to leave or pause: no "stopped training" alert for it
        for `seconds` (a round in flight ends first)."""
        now = time.monotonic()
        with self._lock:
            self._asked = {u: t for u, t in self._asked.items() if t > now}  # bounded by the engines asked
            self._asked[url] = now + seconds

    def take_alerts(self) -> list[str]:
        with self._lock:
            out, self._alerts = self._alerts, []
        return out

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="sapo-fleet", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(wake.set)
        if self._thread is not None:
            self._thread.join(timeout_s)

    async def _run(self) -> None:
        from engine.control.client import ControlClient, ControlError

        clients: dict[str, tuple[FleetEntry, ControlClient]] = {}
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        try:
            while not self._stop.is_set():
                entries = self.entries()
                for url in [u for u in clients if u not in {e.url for e in entries}]:
                    with contextlib.suppress(Exception):
                        await clients.pop(url)[1].close()
                for entry in entries:
                    now = time.time()
                    try:
                        known = clients.get(entry.url)
                        if known is None or not known[1].connected or known[0].token != entry.token:
                            if known is not None:
                                with contextlib.suppress(Exception):
                                    await known[1].close()
                            client = ControlClient(entry.url, entry.token, timeout_s=self.timeout_s)
                            clients[entry.url] = (entry, client)
                            await client.connect(open_timeout_s=self.timeout_s)
                        report = report_from_status(entry, await clients[entry.url][1].status(), time.time())
                    except (ControlError, OSError, TimeoutError) as exc:
                        failed = clients.pop(entry.url, None)
                        if failed is not None:  # a call that timed out leaves its connection open
                            with contextlib.suppress(Exception):
                                await failed[1].close()
                        report = EngineReport(entry.name, entry.url, error=str(exc)[:200])
                    self._record(entry, report, now)
                with contextlib.suppress(TimeoutError):  # the window closing must not wait out a poll
                    await asyncio.wait_for(self._wake.wait(), self.poll_s)
        finally:
            for _, client in clients.values():
                with contextlib.suppress(Exception):
                    await client.close()

    def _record(self, entry: FleetEntry, report: EngineReport, now: float) -> None:
        with self._lock:
            before = self._reports.get(entry.url)
            if not report.reachable and before is not None:  # keep what it last said, marked unreachable
                report = replace(before, reachable=False, error=report.error, checked_at=now)
            elif not report.reachable:
                report = replace(report, checked_at=now)
            asked = time.monotonic() < self._asked.get(entry.url, 0.0)
            self._alerts += alerts(before, report, now, asked=asked)
            self._reports[entry.url] = report
