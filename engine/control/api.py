"""What the control server serves: the `NodeControl` protocol the engine's node implements.

The server calls the synchronous methods on its own event loop (the node's loop), so they must be
quick; the async ones may take as long as they need (`leave` waits for the round in flight) and run
as separate tasks, so a slow `leave` never blocks `status`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from engine.bus import EventBus
from engine.control.status import NodeStatus


@runtime_checkable
class NodeControl(Protocol):
    bus: EventBus

    def status(self) -> NodeStatus:
        """The node's state and counters now (engine.control.status)."""
        ...

    async def join(self) -> None:
        """Start rounds: in the swarm if one is configured or found, solo when nobody is there."""
        ...

    async def leave(self) -> None:
        """Stop after the round in flight, checkpoint, say bye to peers."""
        ...

    async def pause(self, after_round: bool = True) -> None:
        """Pause; with `after_round` the round in flight finishes first ("pausing" state)."""
        ...

    async def resume(self) -> None:
        """Lift a pause by hand and a snooze (the other rules still apply); a node not training joins."""
        ...

    async def snooze(self, seconds: float) -> None:
        """Pause now and resume by itself after `seconds`."""
        ...

    def get_settings(self) -> dict[str, Any]:
        """ContributorSettings.to_dict()."""
        ...

    async def update_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Validate and apply (ValueError -> an error reply); returns the new settings dict."""
        ...

    def history(self, limit: int = 2000) -> dict[str, Any]:
        """{"rounds": [...], "evals": [...], "totals": {...} | None, "rollouts": [...], "peers": [...]} from the
        store, oldest first. Rounds are numbered per model: rounds, evals and totals are the current model's
        (the one trained last), totals over all its rounds (`limit` bounds only the rounds sent)."""
        ...

    def machine(self) -> dict[str, Any]:
        """The `sapo doctor --json` object: {"device": {...}, "pick": {...}, "candidates": [...]}."""
        ...

    async def ask(self, specialty: str = "", text: str = "") -> dict[str, Any]:
        """A question of the node's task family ("" specialty: drawn from its mix; `text`: the contributor's
        own words) answered by the policy and the starting model between rounds, scored (engine.node.ask)."""
        ...
