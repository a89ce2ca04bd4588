"""Background tasks for the swarm's asyncio side: one supervised spawner and a reconnect backoff.

Every long-running coroutine goes through `TaskSet.spawn`, so none is lost (asyncio keeps only weak
references), a crash is reported instead of vanishing, and `cancel_all` ends them on shutdown.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any


class Backoff:
    """Exponential reconnect delays with jitter: initial, 2x, 4x ... capped at maximum."""

    def __init__(self, initial: float, maximum: float, rng: Callable[[], float] = random.random) -> None:
        self.initial, self.maximum, self._rng = initial, maximum, rng
        self._next = initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self.maximum, self._next * 2)
        # +-20% jitter so peers dropped together by one bootstrap restart don't reconnect in lockstep.
        return delay * (0.8 + 0.4 * self._rng())

    def reset(self) -> None:
        self._next = self.initial


class TaskSet:
    """Owns background tasks; reports (never swallows) an unexpected crash through `on_crash`."""

    def __init__(self, on_crash: Callable[[str, BaseException], None]) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._on_crash = on_crash

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._on_crash(task.get_name(), task.exception())  # type: ignore[arg-type]

    async def cancel_all(self) -> None:
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __len__(self) -> int:
        return len(self._tasks)
