"""The thread governor on a hand-built load: it re-chooses at safe points inside a round, not more often
than its recheck interval, only for the thread that runs the round, and never off CPUs."""

from __future__ import annotations

import threading
from typing import Any

from engine.machine import governor
from engine.machine.governor import ThreadGovernor
from engine.machine.load import ThreadPacer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Load:
    """A probe whose answer the test sets: how many cores the owner's work keeps busy."""

    def __init__(self) -> None:
        self.busy = 0.0

    def others_busy(self) -> float:
        return self.busy


def make(physical: int = 2, setting: int = 0) -> tuple[ThreadGovernor, Clock, Load, list[int]]:
    clock, load, applied = Clock(), Load(), []
    pacer = ThreadPacer(probe=load, physical=physical)  # type: ignore[arg-type]  # duck-typed probe

    def apply(device: str, threads: int, generator: Any) -> None:
        applied.append(threads)

    return ThreadGovernor(pacer, recheck_s=0.5, clock=clock, apply=apply), clock, load, applied


def test_an_idle_machine_gets_every_core_and_the_owner_takes_one_back_mid_round() -> None:
    gov, clock, load, applied = make(physical=2)
    with gov.governing("cpu", 0, None) as chosen:
        assert chosen["threads"] == 2 and chosen["lent"] == 2  # automatic lends both cores
        load.busy = 1.0  # the owner starts a build
        governor.safe_point()
        assert applied == [2]  # too soon after the last look: nothing re-measured
        clock.now = 0.6
        governor.safe_point()
        assert applied == [2, 1]
        clock.now = 1.2
        governor.safe_point()
        assert applied == [2, 1]  # same answer: nothing applied again
        load.busy, clock.now = 0.0, 1.8  # the owner is gone
        governor.safe_point()
    assert applied == [2, 1, 2]
    record = gov.round_record()
    assert (record["threads"], record["threads_low"], record["threads_high"], record["thread_changes"]) == (2, 1, 2, 2)
    clock.now = 5.0
    governor.safe_point()  # the round ended: no governor installed, nothing happens
    assert applied == [2, 1, 2]


def test_the_setting_caps_the_threads_and_other_threads_cannot_steer() -> None:
    gov, clock, load, applied = make(physical=8)
    with gov.governing("cpu", 3, None) as chosen:
        assert chosen["threads"] == 3
        load.busy, clock.now = 6.0, 1.0
        other = threading.Thread(target=governor.safe_point)
        other.start()
        other.join()
        assert applied == [3]  # a safe point reached by another thread (e.g. a chat request) does nothing
        governor.safe_point()
        assert applied == [3, 2]  # 8 cores, 6 busy: 2 free


def test_off_cpu_nothing_is_chosen_or_applied() -> None:
    gov, clock, _, applied = make()
    with gov.governing("cuda", 0, None) as chosen:
        clock.now = 10.0
        governor.safe_point()
    assert chosen == {} and applied == [] and gov.round_record() == {}
