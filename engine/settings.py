"""Contributor settings: what the person lending the machine controls. Persisted as TOML.

Untrusted on the way in (a hand-edited file, the control API): `from_dict` validates every field and
ignores unknown keys, so a newer settings file never stops an older engine from starting.

The weekly schedule's parser and its typed value live here too (below, after the settings), so that a
schedule is refused when the settings are made, with the part that is wrong: a schedule is a list of
windows, e.g. "Mon-Fri 18:00-08:00, Sat-Sun 00:00-24:00". A window is an optional day or day range
(ranges may wrap: "Fri-Mon"; no days = every day) and a start and end time; an end at or before its
start crosses midnight into the next day, so "Mon-Fri 18:00-08:00" also runs Saturday until 08:00.
"" = always. It is pure: the caller passes the local wall-clock time (weekday, minute of the day),
so a DST change only moves what "18:00" is, never the rule (engine/machine/guard.py reads the clock).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

SETTINGS_FILE = "settings.toml"


@dataclass(frozen=True)
class ContributorSettings:
    bootstrap_url: str = ""  # ws:// or wss:// rendezvous server; "" = LAN only
    lan_discovery: bool = True  # announce and browse `_sapo._tcp.local.` by mDNS
    cpu_cores: int = 0  # cores lent to training; 0 = automatic: every core the owner's own work leaves free
    use_gpu: bool = True  # use CUDA / MPS when present
    only_when_idle: bool = False  # pause while the user is active (where idle time is known)
    idle_minutes: int = 5  # how long without input counts as idle
    pause_on_battery: bool = True  # pause while running on battery (where known)
    snooze_until: float = 0.0  # unix seconds; paused until then ("snooze for an hour")
    start_at_login: bool = False  # register with the OS's autostart mechanism
    max_temperature_c: float = 0.0  # pause above this CPU/GPU temperature; 0 = no cap
    keep_running_on_close: bool = True  # closing the window leaves the engine contributing
    # the model last switched to in the app (catalog id, "seed" or a model directory); the engine
    # trains it after a restart unless `sapo run --model` names one. "" = the engine's default
    model: str = ""
    # wss:// bootstraps and the board's TLS servers must chain to a CA in this PEM file (a swarm that
    # runs its own CA hands it out); "" = the system's CAs. `sapo run --ca FILE` overrides it
    ca_file: str = ""
    # train only inside these weekly windows of the machine's local time, e.g. "Mon-Fri 18:00-08:00,
    # Sat-Sun 00:00-24:00" (an end at or before the start crosses midnight); "" = at any time
    schedule: str = ""
    # the engine comes up paused (`sapo run --headless --control`, at login): it trains once resumed
    # (the app's Resume, `sapo resume`)
    start_paused: bool = False

    @functools.cached_property
    def parsed_schedule(self) -> Schedule:
        """`schedule`, parsed once (validated at construction, so this never raises later)."""
        return parse_schedule(self.schedule)

    def __post_init__(self) -> None:
        if self.bootstrap_url and not self.bootstrap_url.startswith(("ws://", "wss://")):
            raise ValueError("bootstrap_url must start with ws:// or wss://")
        if len(self.bootstrap_url) > 512:
            raise ValueError("bootstrap_url is too long")
        if not 0 <= self.cpu_cores <= 1024:
            raise ValueError("cpu_cores must be between 0 and 1024")
        if not 1 <= self.idle_minutes <= 24 * 60:
            raise ValueError("idle_minutes must be between 1 and 1440")
        for name in ("snooze_until", "max_temperature_c"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0")
        if self.max_temperature_c > 150:
            raise ValueError("max_temperature_c must be at most 150")
        if len(self.model) > 1024 or any(ord(ch) < 32 or ord(ch) == 127 for ch in self.model):
            raise ValueError("model must be at most 1024 characters, without control characters")
        if len(self.ca_file) > 4096 or any(ord(ch) < 32 or ord(ch) == 127 for ch in self.ca_file):
            raise ValueError("ca_file must be a file path of at most 4096 characters, without control characters")
        _ = self.parsed_schedule  # ValueError here, with the part that is wrong, not at the next round

    @classmethod
    def from_dict(cls, data: Any, base: ContributorSettings | None = None) -> ContributorSettings:
        """Validated update of `base` (default values if None) from an untrusted mapping."""
        if not isinstance(data, dict):
            raise ValueError("settings must be an object")  # noqa: TRY004 (ValueError for every bad input)
        base = base or cls()
        changes: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            value, default = data[f.name], getattr(base, f.name)
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise ValueError(f"{f.name} must be true or false")  # noqa: TRY004 (ValueError for every bad input)
            elif isinstance(default, int):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"{f.name} must be an integer")  # noqa: TRY004 (ValueError for every bad input)
            elif isinstance(default, float):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"{f.name} must be a number")  # noqa: TRY004 (ValueError for every bad input)
                value = float(value)
            elif isinstance(default, str) and not isinstance(value, str):
                raise ValueError(f"{f.name} must be a string")  # noqa: TRY004 (ValueError for every bad input)
            changes[f.name] = value
        return dataclasses.replace(base, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def load(cls, data_dir: Path) -> ContributorSettings:
        path = data_dir / SETTINGS_FILE
        if not path.exists():
            return cls()
        with path.open("rb") as fh:
            return cls.from_dict(tomllib.load(fh))

    def save(self, data_dir: Path) -> None:
        """Atomic write (temp file + rename) so a crash never leaves a half-written file."""
        data_dir.mkdir(parents=True, exist_ok=True)
        lines = [f"{k} = {_toml_value(v)}" for k, v in self.to_dict().items()]
        tmp = data_dir / (SETTINGS_FILE + ".tmp")
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.replace(tmp, data_dir / SETTINGS_FILE)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


# ---- the weekly schedule ---------------------------------------------------------------------------
DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_DAY_INDEX = {name.lower(): i for i, name in enumerate(DAY_NAMES)}
_DAY_WORDS = {"daily": tuple(range(7)), "weekdays": tuple(range(5)), "weekends": (5, 6)}
DAY_MINUTES = 24 * 60
WEEK_MINUTES = 7 * DAY_MINUTES
MAX_WINDOWS = 32
MAX_SCHEDULE_CHARS = 512
_WINDOW_RE = re.compile(r"^(?:(?P<days>[A-Za-z]+(?:\s*-\s*[A-Za-z]+)?)\s+)?"
                        r"(?P<start>\d{1,2}:\d{2})\s*-\s*(?P<end>\d{1,2}:\d{2})$")


@dataclass(frozen=True)
class LocalTime:
    """A moment in the machine's local wall-clock time: weekday 0 = Monday, minute of the day."""

    weekday: int
    minute: int

    @property
    def week_minute(self) -> int:
        return self.weekday * DAY_MINUTES + self.minute


@dataclass(frozen=True)
class Window:
    days: tuple[int, ...]  # the weekdays the window starts on
    start: int  # minute of the day
    end: int  # minute of the day, 1..1440; <= start: ends the next day

    def spans(self) -> list[tuple[int, int]]:
        """[start, end) in minutes of the week, one per day it starts on (an end past the week wraps)."""
        length = self.end - self.start if self.end > self.start else self.end + DAY_MINUTES - self.start
        return [(d * DAY_MINUTES + self.start, d * DAY_MINUTES + self.start + length) for d in self.days]


@dataclass(frozen=True)
class Schedule:
    windows: tuple[Window, ...] = ()  # empty: always

    @property
    def always(self) -> bool:
        return not self.windows

    def allows(self, at: LocalTime) -> bool:
        if self.always:
            return True
        now = at.week_minute
        for window in self.windows:
            for start, end in window.spans():
                # a span past Sunday 24:00 goes on into Monday: test both weeks
                if start <= now < end or start <= now + WEEK_MINUTES < end:
                    return True
        return False

    def next_start(self, at: LocalTime) -> LocalTime | None:
        """When the schedule next lets the machine train (None: it never does, or always does)."""
        if self.always:
            return None
        now = at.week_minute
        starts = [start for window in self.windows for start, _ in window.spans()]
        if not starts:
            return None
        ahead = min((start - now) % WEEK_MINUTES or WEEK_MINUTES for start in starts)
        moment = (now + ahead) % WEEK_MINUTES
        return LocalTime(moment // DAY_MINUTES, moment % DAY_MINUTES)


def format_time(at: LocalTime) -> str:
    return f"{DAY_NAMES[at.weekday]} {at.minute // 60:02d}:{at.minute % 60:02d}"


def _minute(text: str, *, end: bool) -> int:
    hours, minutes = (int(part) for part in text.split(":"))
    if minutes > 59 or hours > 24 or (hours == 24 and (minutes or not end)):
        raise ValueError(f"{text!r} is not a time of day (00:00 to 23:59{', or 24:00 as an end' if end else ''})")
    return hours * 60 + minutes


def _day(name: str) -> int:
    index = _DAY_INDEX.get(name.strip().lower()[:3]) if len(name.strip()) >= 3 else None
    full = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
    if index is None or not full[index].startswith(name.strip().lower()):
        raise ValueError(f"{name.strip()!r} is not a day (Mon, Tue, Wed, Thu, Fri, Sat, Sun)")
    return index


def _days(text: str | None) -> tuple[int, ...]:
    if text is None:
        return tuple(range(7))
    word = _DAY_WORDS.get(text.strip().lower())
    if word is not None:
        return word
    first, _, last = text.partition("-")
    lo = _day(first)
    hi = _day(last) if last else lo
    return tuple((lo + i) % 7 for i in range((hi - lo) % 7 + 1))  # "Fri-Mon" wraps through the weekend


def parse_schedule(text: str) -> Schedule:
    """The typed schedule of a settings string; ValueError naming the part that is wrong."""
    if len(text) > MAX_SCHEDULE_CHARS:
        raise ValueError(f"schedule is longer than {MAX_SCHEDULE_CHARS} characters")
    parts = [part.strip() for part in re.split(r"[,;]", text)]
    if not any(parts):
        return Schedule()
    if len(parts) > MAX_WINDOWS:
        raise ValueError(f"schedule has more than {MAX_WINDOWS} windows")
    windows = []
    for part in parts:
        match = _WINDOW_RE.match(part)
        if match is None:
            raise ValueError(f"schedule: {part!r} is not a window like 'Mon-Fri 18:00-08:00' or '22:00-07:00'")
        try:
            start = _minute(match["start"], end=False)
            end = _minute(match["end"], end=True)
            days = _days(match["days"])
        except ValueError as exc:
            raise ValueError(f"schedule: {part!r}: {exc}") from None
        if start == end:
            raise ValueError(f"schedule: {part!r} starts and ends at the same time (00:00-24:00 is a whole day)")
        windows.append(Window(days, start, end))
    return Schedule(tuple(windows))
