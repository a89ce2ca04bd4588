from __future__ import annotations

from engine.machine.guard import MachineState, may_train, probe_machine
from engine.settings import ContributorSettings

NOW = 1_000_000.0


def test_default_settings_train_on_an_unknown_machine() -> None:
    assert may_train(ContributorSettings(), MachineState(now=NOW)).run


def test_snooze_pauses_until_it_expires() -> None:
    s = ContributorSettings(snooze_until=NOW + 3600)
    v = may_train(s, MachineState(now=NOW))
    assert not v.run and "snoozed for 60" in v.reason
    assert may_train(s, MachineState(now=NOW + 3601)).run


def test_battery_pauses_only_when_asked_and_known() -> None:
    on_battery = MachineState(now=NOW, on_battery=True)
    assert may_train(ContributorSettings(pause_on_battery=True), on_battery).reason == "on battery"
    assert may_train(ContributorSettings(pause_on_battery=False), on_battery).run
    assert may_train(ContributorSettings(pause_on_battery=True), MachineState(now=NOW, on_battery=None)).run


def test_only_when_idle_needs_the_configured_idle_time() -> None:
    s = ContributorSettings(only_when_idle=True, idle_minutes=5)
    assert not may_train(s, MachineState(now=NOW, idle_seconds=120)).run
    assert may_train(s, MachineState(now=NOW, idle_seconds=301)).run
    assert may_train(s, MachineState(now=NOW, idle_seconds=None)).run  # unknown never blocks


def test_temperature_cap() -> None:
    s = ContributorSettings(max_temperature_c=85)
    assert not may_train(s, MachineState(now=NOW, temperature_c=90)).run
    assert may_train(s, MachineState(now=NOW, temperature_c=60)).run
    assert may_train(ContributorSettings(), MachineState(now=NOW, temperature_c=120)).run


def test_probe_machine_answers_without_raising() -> None:
    state = probe_machine(NOW)
    assert state.now == NOW


def test_probe_machine_skips_probes_whose_rule_is_off() -> None:
    off = ContributorSettings(pause_on_battery=False, only_when_idle=False, max_temperature_c=0)
    state = probe_machine(NOW, off)
    assert (state.on_battery, state.idle_seconds, state.temperature_c) == (None, None, None)
