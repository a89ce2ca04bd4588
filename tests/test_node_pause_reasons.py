"""The node says why it is paused (by hand, the schedule, started paused), starts paused when asked,
finishes after the round in flight, and resume trains again: one real node on a tiny model."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from test_node import small_config, wait_for

from engine.control.status import NodeStatus
from engine.machine.guard import local_time
from engine.models.policy import build_tiny_policy
from engine.node import Node
from engine.node import node as node_module
from engine.settings import ContributorSettings


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "model")


def closed_now() -> str:
    """A daily one-hour window two hours from now: the schedule is closed at this moment."""
    now = local_time(time.time()).minute
    start, end = (now + 120) % 1440, (now + 180) % 1440
    return f"{start // 60:02d}:{start % 60:02d}-{end // 60:02d}:{end % 60:02d}"


def test_started_paused_then_each_pause_says_why(tmp_path: Path, tiny_model: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_module, "GUARD_RECHECK_S", 0.1)
    node = Node(small_config(tmp_path, tiny_model), settings=ContributorSettings(start_paused=True,
                                                                                pause_on_battery=False))
    seen: dict[str, NodeStatus] = {}

    async def main() -> None:
        node.hold()
        seen["held"] = node.status()
        await node.resume()  # nothing was training: it joins
        await wait_for(lambda: node.status().round >= 1)
        await node.pause()
        seen["pausing"] = node.status()
        await wait_for(lambda: node.status().state == "paused")
        seen["by_hand"] = node.status()
        await node.update_settings({"schedule": closed_now()})
        await node.resume()
        await wait_for(lambda: node.status().paused_by == "schedule")
        seen["schedule"] = node.status()
        await node.update_settings({"schedule": ""})
        await wait_for(lambda: node.status().state == "solo")
        seen["training"] = node.status()
        await node.finish()
        seen["finished"] = node.status()
        at = node.status().round
        await node.resume()  # finished: it joins again
        await wait_for(lambda: node.status().round > at)
        await node.leave()

    try:
        asyncio.run(main())
    finally:
        node.store.close()
    assert node.error is None
    assert (seen["held"].state, seen["held"].paused_by) == ("paused", "start")
    assert "started paused" in str(seen["held"].detail) and seen["held"].round == 0
    assert (seen["pausing"].state, seen["pausing"].paused_by) == ("pausing", "you")
    assert (seen["by_hand"].paused_by, seen["by_hand"].detail) == ("you", "paused by you")
    assert str(seen["schedule"].detail).startswith("outside your schedule (next run ")
    assert seen["training"].paused_by == ""
    assert seen["finished"].state == "stopped" and seen["finished"].paused_by == ""
    assert str(seen["finished"].detail).startswith(f"finished after round {seen['finished'].round}")
