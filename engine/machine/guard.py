"""Should this machine train right now? The contributor's rules, as one pure function.

Rules: snooze, the weekly schedule (engine/settings.py), battery, the owner's use, temperature.
The node asks between rounds (never mid-round: a round in flight finishes, so no work is lost) and
pauses with the reason shown to the user. Probes that answer "unknown" never block training: a
desktop without a battery sensor is not "on battery".
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.settings import ContributorSettings, LocalTime, format_time

# Why a verdict refuses, for scripts and the GUI (`status().paused_by`); the reason is the sentence.
CAUSES = ("snooze", "schedule", "battery", "owner", "temperature")


@dataclass(frozen=True)
class MachineState:
    """What the probes saw just now; None = unknown."""

    now: float
    on_battery: bool | None = None
    idle_seconds: float | None = None
    temperature_c: float | None = None
    local: LocalTime | None = None  # the local wall-clock time the schedule is read in


@dataclass(frozen=True)
class Verdict:
    run: bool
    reason: str = ""  # what the contributor reads
    cause: str = ""  # one of CAUSES when refused


def local_time(now: float) -> LocalTime:
    """The machine's local weekday and minute at unix time `now` (the OS's zone, DST included)."""
    t = time.localtime(now)
    return LocalTime(t.tm_wday, t.tm_hour * 60 + t.tm_min)


def may_train(settings: ContributorSettings, machine: MachineState) -> Verdict:
    if settings.snooze_until > machine.now:
        minutes = (settings.snooze_until - machine.now) / 60
        return Verdict(False, f"snoozed for {minutes:.0f} more min", "snooze")
    schedule = settings.parsed_schedule
    if machine.local is not None and not schedule.allows(machine.local):
        upcoming = schedule.next_start(machine.local)
        return Verdict(False, "outside your schedule" + (f" (next run {format_time(upcoming)})" if upcoming else ""),
                       "schedule")
    if settings.pause_on_battery and machine.on_battery:
        return Verdict(False, "on battery", "battery")
    if settings.only_when_idle and machine.idle_seconds is not None \
            and machine.idle_seconds < settings.idle_minutes * 60:
        return Verdict(False, "you are using the computer", "owner")
    if settings.max_temperature_c > 0 and machine.temperature_c is not None \
            and machine.temperature_c >= settings.max_temperature_c:
        return Verdict(False, f"too hot ({machine.temperature_c:.0f} °C)", "temperature")
    return Verdict(True)


def probe_machine(now: float, settings: ContributorSettings | None = None) -> MachineState:
    """Probe only what the contributor's rules need (idle time opens an X connection, temperature
    reads sensors): with `settings`, rules that are off cost nothing each round."""
    from engine.machine import hardware

    want_battery = settings is None or settings.pause_on_battery
    want_idle = settings is None or settings.only_when_idle
    want_temp = settings is None or settings.max_temperature_c > 0
    on_battery = None
    if want_battery:
        bat = hardware.battery()
        on_battery = None if bat.plugged_in is None else (bat.present is True and not bat.plugged_in)
    return MachineState(now=now, on_battery=on_battery,
                        idle_seconds=hardware.idle_seconds() if want_idle else None,
                        temperature_c=hardware.max_temperature_c() if want_temp else None,
                        local=local_time(now))
