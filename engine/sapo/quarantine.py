"""A new identity's groups wait before any is trained on: received, shown, judged, never in the loss.

Identities are free, so a fresh key must not buy a round's update the moment it speaks: its groups are
pooled and shown like any peer's, and become trainable once the origin has been a candidate here for
`rounds` of this node's rounds (its first round counts as round 0). A crowd of fresh keys waits too, in
parallel: quarantine bounds a burst, the per-group weight bound (engine/sapo/peer_weight.py) bounds the
rest. What it costs an honest newcomer: its first `rounds` rounds of groups here teach nothing
(docs/SECURITY.md).

Memory is bounded twice: origins still waiting (where a flood of keys lands) and origins released
(peers with a history) are kept apart, so a flood of fresh keys cannot push an honest peer back into
quarantine. Owned by the trainer thread; checkpointed with the trainer.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

MAX_WAITING = 4096
MAX_RELEASED = 4096


class Quarantine:
    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self._waiting: OrderedDict[str, int] = OrderedDict()  # origin -> the round it was first a candidate
        self._released: OrderedDict[str, None] = OrderedDict()

    def ready(self, origin: str, round_no: int) -> bool:
        """Whether `origin`'s groups may be trained on in round `round_no` (its first call starts its wait)."""
        if origin in self._released:
            self._released.move_to_end(origin)
            return True
        first = self._waiting.setdefault(origin, round_no)
        if len(self._waiting) > MAX_WAITING:
            self._waiting.popitem(last=False)
        if round_no - first < self.rounds:
            return False
        self._waiting.pop(origin, None)
        self._released[origin] = None
        if len(self._released) > MAX_RELEASED:
            self._released.popitem(last=False)
        return True

    def waiting(self) -> int:
        return len(self._waiting)

    def state_dict(self) -> dict[str, Any]:
        return {"waiting": dict(self._waiting), "released": list(self._released)}

    def load_state(self, state: Any) -> None:
        """Restore from a checkpoint; anything malformed is skipped (a peer then waits again)."""
        self._waiting.clear()
        self._released.clear()
        if not isinstance(state, dict):
            return
        waiting, released = state.get("waiting"), state.get("released")
        for origin, first in list(waiting.items() if isinstance(waiting, dict) else ())[-MAX_WAITING:]:
            if isinstance(origin, str) and len(origin) <= 128 and isinstance(first, int) and not isinstance(first, bool):
                self._waiting[origin] = first
        for origin in list(released if isinstance(released, list) else ())[-MAX_RELEASED:]:
            if isinstance(origin, str) and len(origin) <= 128:
                self._released[origin] = None
