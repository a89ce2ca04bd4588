"""Intake: peers' rollout groups into the pool. Re-scoring is CPU work, so each batch is offered to the
pool in one worker thread and the asyncio loop stays responsive; every decision (pooled or dropped, and
why) is reported as a RolloutSeen event."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from engine.events import Event, RolloutSeen
from engine.sapo.records import RolloutGroup
from engine.swarm.identity import name_for
from engine.swarm.pool import PoolDecision, RolloutPool


def _describe(group: RolloutGroup) -> str:
    return f"{group.ref.specialty} #{group.ref.index}"


class Intake:
    """Called on the service's loop; `close` waits for the worker thread."""

    def __init__(self, pool: RolloutPool, emit: Callable[[Event], None]) -> None:
        self.pool = pool
        self._emit = emit
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="swarm-pool")

    async def take(self, groups: tuple[RolloutGroup, ...], source: str = "") -> None:
        """Re-score and pool `groups` and report each; `source`: the direct peer's host that sent them
        (one pool quota per host), "" from the board or a bootstrap's relay."""
        loop = asyncio.get_running_loop()
        decisions = await loop.run_in_executor(self._executor, self._offer_all, groups, source)
        for decision in decisions:  # a pooled group's feed text is its verified question's
            text = decision.question.text if decision.question is not None else _describe(decision.group)
            self._emit(RolloutSeen.of(decision.group, decision.status, decision.reason, text,
                                      name_for(decision.peer)))

    def _offer_all(self, groups: tuple[RolloutGroup, ...], source: str = "") -> list[PoolDecision]:
        """Worker thread: re-score and pool each group."""
        return [self.pool.offer(group, name_for(group.provenance.origin_peer), source) for group in groups]

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
