"""The contributor's weekly schedule: when this machine may train, in its own local time.

A schedule is a list of windows, e.g. "Mon-Fri 18:00-08:00, Sat-Sun 00:00-24:00". A window is an
optional day or day range (ranges may wrap: "Fri-Mon"; no days = every day) and a start and end time;
an end at or before its start crosses midnight into the next day, so "Mon-Fri 18:00-08:00" also runs
Saturday until 08:00. "" = always. Everything here is pure: the caller passes the local wall-clock
time (weekday, minute of the day), so a DST change only moves what "18:00" is, never the rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
