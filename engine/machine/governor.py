"""Threads re-chosen inside a round: at every decode step and every update chunk, when the owner's load
comes or goes.

Choosing threads only between rounds (10-30 s apart) forced a choice: lend every core and stall when the
owner takes one mid-round (a preempted OpenMP worker holds up its siblings at every barrier), or keep a
core back for good (an idle 2-core machine then trained 1.72x slower: issue 46). Here the choice is made
again at the points where changing it is free: between llama.cpp decode calls (`llama_set_n_threads`)
and between the update's micro-batches (`torch.set_num_threads`). A stall then costs at most the one
step or chunk that was running when the load appeared.

Thread counts are process state (torch has one intra-op pool per process), so the governor is installed
once for the process (`install`) and the generators and the update call `safe_point()`; with none
installed a safe point costs one attribute read. Only the thread that installed it re-chooses: a safe
point reached from another thread does nothing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from engine.machine.load import ThreadChoice, ThreadPacer, apply_threads

RECHECK_S = 0.5  # how often a safe point looks at the load again (shorter windows are noise)


class ThreadGovernor:
    """Keeps the training thread's threads on the cores other work leaves free, between rounds and
    inside them. Counts what it changed for the round's record."""

    def __init__(self, pacer: ThreadPacer, device: str = "cpu", setting: int = 0, generator: Any = None,
                 recheck_s: float = RECHECK_S, clock: Callable[[], float] = time.monotonic,
                 apply: Callable[[str, int, Any], None] = apply_threads) -> None:
        self.pacer, self.device, self.setting, self.generator = pacer, device, setting, generator
        self.recheck_s, self._clock, self._apply = recheck_s, clock, apply
        self._owner = threading.get_ident()
        self._last_check = -float("inf")
        self.choice: ThreadChoice | None = None
        self.changes = 0  # thread-count changes inside the current round
        self.low = self.high = 0  # the fewest and most threads the current round ran on

    @contextlib.contextmanager
    def governing(self, device: str, setting: int, generator: Any = None) -> Iterator[dict[str, Any]]:
        """One round under this governor: its threads chosen now (-> the choice), re-chosen at every safe
        point the round reaches, installed for the process until the round ends."""
        chosen = self.begin_round(device, setting, generator)
        install(self)
        try:
            yield chosen
        finally:
            install(None)

    def begin_round(self, device: str, setting: int, generator: Any = None) -> dict[str, Any]:
        """Choose the round's threads now (the contributor may have changed the setting) -> the choice."""
        self.device, self.setting, self.generator = device, setting, generator
        self.changes = 0
        self._owner = threading.get_ident()
        if self.device != "cpu":  # a GPU round's speed does not follow the CPU threads
            return {}
        self._choose()
        assert self.choice is not None
        self.low = self.high = self.choice.threads
        return self.choice.to_dict()

    def round_record(self) -> dict[str, Any]:
        """The round's threads in words a dashboard can show: the last choice, its range and changes."""
        if self.choice is None:
            return {}
        return {**self.choice.to_dict(), "threads_low": self.low, "threads_high": self.high,
                "thread_changes": self.changes}

    def checkpoint(self) -> None:
        """A safe point: re-choose when RECHECK_S has passed since the last look."""
        if (self.choice is None or threading.get_ident() != self._owner
                or self._clock() - self._last_check < self.recheck_s):
            return
        before = self.choice.threads
        self._choose()
        assert self.choice is not None
        if self.choice.threads != before:
            self.changes += 1
            self.low, self.high = min(self.low, self.choice.threads), max(self.high, self.choice.threads)

    def _choose(self) -> None:
        self._last_check = self._clock()
        choice = self.pacer.choose(self.setting)
        if self.choice is None or choice.threads != self.choice.threads:
            self._apply(self.device, choice.threads, self.generator)
        self.choice = choice


_installed: ThreadGovernor | None = None


def install(governor: ThreadGovernor | None) -> None:
    """The process's governor (None: threads stay as they are between safe points)."""
    global _installed
    _installed = governor


def safe_point() -> None:
    """Called where the thread count may change for free: between decode calls and update chunks."""
    governor = _installed
    if governor is not None:
        governor.checkpoint()
