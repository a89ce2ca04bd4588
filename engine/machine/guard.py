"""Should this machine train right now? The contributor's rules, as one pure function.

The node asks between rounds (never mid-round: a round in flight finishes, so no work is lost) and
pauses with the reason shown to the user. Probes that answer "unknown" never block training: a
desktop without a battery sensor is not "on battery".
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.settings import ContributorSettings


@dataclass(frozen=True)
class MachineState:
    """What the probes saw just now; None = unknown."""

    now: float
    on_battery: bool | None = None
    idle_seconds: float | None = None
    temperature_c: float | None = None


@dataclass(frozen=True)
class Verdict:
    run: bool
    reason: str = ""


def may_train(settings: ContributorSettings, machine: MachineState) -> Verdict:
    if settings.snooze_until > machine.now:
        minutes = (settings.snooze_until - machine.now) / 60
        return Verdict(False, f"snoozed for {minutes:.0f} more min")
    if settings.pause_on_battery and machine.on_battery:
        return Verdict(False, "on battery")
    if settings.only_when_idle and machine.idle_seconds is not None \
            and machine.idle_seconds < settings.idle_minutes * 60:
        return Verdict(False, "you are using the computer")
    if settings.max_temperature_c > 0 and machine.temperature_c is not None \
            and machine.temperature_c >= settings.max_temperature_c:
        return Verdict(False, f"too hot ({machine.temperature_c:.0f} °C)")
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
                        temperature_c=hardware.max_temperature_c() if want_temp else None)
