"""The weekly schedule: parsing (with errors that name the bad part) and the rule, on hand-built local
times. Local time is passed in, so these hold in any time zone and across a DST change."""

from __future__ import annotations

import time

import pytest

from engine.machine.guard import MachineState, local_time, may_train
from engine.settings import ContributorSettings, LocalTime, format_time, parse_schedule

NOW = 1_000_000.0
MON, TUE, FRI, SAT, SUN = 0, 1, 4, 5, 6


def at(day: int, hhmm: str) -> LocalTime:
    hours, minutes = hhmm.split(":")
    return LocalTime(day, int(hours) * 60 + int(minutes))


EVENINGS = parse_schedule("Mon-Fri 18:00-08:00, Sat-Sun 00:00-24:00")


@pytest.mark.parametrize(("day", "hhmm", "allowed"), [
    (MON, "17:59", False), (MON, "18:00", True), (MON, "23:59", True),
    (TUE, "00:00", True), (TUE, "07:59", True), (TUE, "08:00", False), (TUE, "12:00", False),
    (MON, "07:00", False),  # Sunday's window is 00:00-24:00: it does not spill into Monday
    (FRI, "20:00", True), (SAT, "07:00", True), (SAT, "12:00", True), (SUN, "23:59", True),
])
def test_windows_cross_midnight_into_the_next_day(day: int, hhmm: str, allowed: bool) -> None:
    assert EVENINGS.allows(at(day, hhmm)) is allowed


def test_a_window_starting_on_sunday_wraps_into_monday() -> None:
    night = parse_schedule("Sun 22:00-06:00")
    assert night.allows(at(SUN, "23:00")) and night.allows(at(MON, "05:59"))
    assert not night.allows(at(MON, "06:00")) and not night.allows(at(SAT, "23:00"))


def test_next_start_is_the_next_window_opening() -> None:
    assert format_time(EVENINGS.next_start(at(TUE, "12:00")) or at(0, "0:00")) == "Tue 18:00"
    assert EVENINGS.next_start(at(MON, "08:30")) == at(MON, "18:00")
    weekly = parse_schedule("Mon 09:00-10:00")
    assert weekly.next_start(at(MON, "10:00")) == at(MON, "09:00")  # a week later, the same slot
    assert weekly.next_start(at(SUN, "23:00")) == at(MON, "09:00")


def test_day_forms_and_no_days_mean_every_day() -> None:
    assert parse_schedule("22:00-07:00").allows(at(TUE, "23:30"))
    assert parse_schedule("Fri-Mon 10:00-11:00").windows[0].days == (FRI, SAT, SUN, MON)
    assert parse_schedule("weekends 10:00-11:00").windows[0].days == (SAT, SUN)
    assert parse_schedule("monday 10:00-11:00; Tuesday 10:00-11:00").windows[1].days == (TUE,)
    assert parse_schedule("  ").always and parse_schedule("").allows(at(MON, "03:00"))


@pytest.mark.parametrize(("text", "says"), [
    ("Mon-Fri 18:00", "is not a window like"),
    ("Mon-Fri 25:00-08:00", "'25:00' is not a time of day"),
    ("Mon 10:60-11:00", "is not a time of day"),
    ("Mon 24:00-08:00", "is not a time of day"),  # 24:00 only ends a window
    ("Mun 10:00-11:00", "'Mun' is not a day"),
    ("Mo 10:00-11:00", "'Mo' is not a day"),
    ("Mon 10:00-10:00", "starts and ends at the same time"),
    ("Mon 10:00-11:00,", "'' is not a window"),
    ("x" * 600, "longer than"),
])
def test_bad_schedules_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_schedule(text)
    with pytest.raises(ValueError, match=says):  # the setting refuses it the same way, at once
        ContributorSettings.from_dict({"schedule": text})


def test_may_train_refuses_outside_the_schedule_with_the_next_run() -> None:
    s = ContributorSettings(schedule="Mon-Fri 18:00-08:00, Sat-Sun 00:00-24:00")
    verdict = may_train(s, MachineState(now=NOW, local=at(TUE, "12:00")))
    assert not verdict.run and verdict.cause == "schedule"
    assert verdict.reason == "outside your schedule (next run Tue 18:00)"
    assert may_train(s, MachineState(now=NOW, local=at(TUE, "03:00"))).run
    assert may_train(s, MachineState(now=NOW)).run  # local time unknown: never blocks
    assert may_train(ContributorSettings(), MachineState(now=NOW, local=at(TUE, "12:00"))).run


def test_each_refusal_names_its_cause() -> None:
    m = MachineState(now=NOW, on_battery=True, idle_seconds=1, temperature_c=99, local=at(TUE, "12:00"))
    s = ContributorSettings(snooze_until=NOW + 60, schedule="Mon 00:00-01:00", pause_on_battery=True,
                            only_when_idle=True, max_temperature_c=80)
    causes = []
    for change in ({}, {"snooze_until": 0.0}, {"schedule": ""}, {"pause_on_battery": False},
                   {"only_when_idle": False}):
        s = ContributorSettings.from_dict(change, base=s)
        causes.append(may_train(s, m).cause)
    assert causes == ["snooze", "schedule", "battery", "owner", "temperature"]


def test_the_schedule_is_parsed_once_and_round_trips_through_the_file(tmp_path: object) -> None:
    from pathlib import Path

    s = ContributorSettings(schedule="Sat-Sun 00:00-24:00", start_paused=True)
    assert s.parsed_schedule is s.parsed_schedule
    s.save(Path(str(tmp_path)))
    back = ContributorSettings.load(Path(str(tmp_path)))
    assert back == s and back.parsed_schedule.windows == s.parsed_schedule.windows
    assert "parsed_schedule" not in back.to_dict()


def test_local_time_reads_the_machines_zone() -> None:
    now = time.time()
    t = time.localtime(now)
    assert local_time(now) == LocalTime(t.tm_wday, t.tm_hour * 60 + t.tm_min)


def test_a_dst_change_moves_the_clock_not_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Europe/Berlin springs forward on Sun 2026-03-29 at 02:00 -> 03:00: an hour of UTC apart, the
    wall clock reads 01:30 then 03:30, and the schedule is read on the wall clock."""
    if not hasattr(time, "tzset"):
        pytest.skip("no tzset on this OS")
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        before, after = 1_774_744_200.0, 1_774_747_800.0  # 00:30 and 01:30 UTC
        assert local_time(before) == at(SUN, "01:30") and local_time(after) == at(SUN, "03:30")
        s = ContributorSettings(schedule="Sun 03:00-04:00")
        assert not may_train(s, MachineState(now=before, local=local_time(before))).run
        assert may_train(s, MachineState(now=after, local=local_time(after))).run
    finally:
        monkeypatch.undo()
        time.tzset()
