"""The node's exchange on the trainer thread: the board fetch is its own step, so a round with no own
groups to publish still pulls the peers' groups the next round takes."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from engine.node.swarm import NodeSwarm


class _Service:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.done = threading.Event()

    async def publish(self, groups: Any) -> int:
        self.calls.append(("publish", len(groups)))
        return 0

    async def fetch(self, j: int) -> int:
        self.calls.append(("fetch", j))
        self.done.set()
        return 0

    def stats(self) -> dict[str, Any]:
        return {"refusals": {}}


class _Store:
    def record_refusals(self, delta: dict[str, int]) -> None:
        pass


def test_a_round_without_own_groups_still_fetches(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        net = NodeSwarm(config=None, settings=None, publish_event=lambda event: None, store=_Store())
        service = _Service()
        net.service, net._loop = service, loop
        net.after_round([], [])  # nothing of its own this round (e.g. every question was filtered)
        net.fetch(3)
        assert service.done.wait(5)
        assert service.calls == [("fetch", 3)]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
