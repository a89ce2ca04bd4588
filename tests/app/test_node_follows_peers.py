"""A training node says it trains with others as soon as a peer links, not when its next round starts:
a real model's first held-out check takes minutes, and the walk-through (bench/walkthrough.md) saw
"Training solo" beside "1 link" all that time. Two real nodes on a tiny model, linked over 127.0.0.1."""

from __future__ import annotations

import asyncio
from pathlib import Path

from conftest import fast_sapo, free_port, linked_config

from engine.events import Event, RoundCompleted, StateChanged, WorkProgress
from engine.node import Node


async def _until(predicate, timeout: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_a_training_node_says_in_the_swarm_as_soon_as_a_peer_links(tmp_path: Path, tiny_model: Path) -> None:
    port = free_port()
    # a long baseline check before the first round: the peer links while it runs
    slow_start = fast_sapo(num_external=2, filter_zero_advantage=False, eval_every=1000, eval_per_specialty=48,
                           eval_k=8)
    a = Node(linked_config(tmp_path / "a", tiny_model, seed=1, listen_port=port, sapo=slow_start))
    b = Node(linked_config(tmp_path / "b", tiny_model, seed=2, peer_urls=(f"ws://127.0.0.1:{port}",)))
    seen: list[Event] = []
    a.bus.add_listener(seen.append)

    def checking() -> bool:
        return any(isinstance(e, WorkProgress) and e.phase == "evaluating" for e in seen)

    def linked() -> bool:
        return a.net.peer_count() > 0

    async def main() -> tuple[bool, bool]:
        await a.join()
        await _until(checking)
        await b.join()
        await _until(lambda: linked() or any(isinstance(e, RoundCompleted) for e in seen))
        linked_during_check = linked() and not any(isinstance(e, RoundCompleted) for e in seen)
        await _until(lambda: any(isinstance(e, RoundCompleted) for e in seen))
        said_before_round = any(isinstance(e, StateChanged) and e.state == "in_swarm"
                                for e in seen[:next(i for i, e in enumerate(seen) if isinstance(e, RoundCompleted))])
        await b.leave()
        await a.leave()
        return linked_during_check, said_before_round

    try:
        linked_during_check, said_before_round = asyncio.run(main())
    finally:
        a.store.close()
        b.store.close()
    assert linked_during_check, "the peer linked only after the check: the test did not test anything"
    assert said_before_round  # "in the swarm" while the first round's check still ran
