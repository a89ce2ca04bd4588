"""This node's own frontier questions, asked again: the solo counterpart of a peer's suggestion.

A question whose answers here held both a right and a wrong one sat at this policy's frontier, and
frontier questions stay there (on SmolLM2's starting weights: mixed again with probability 0.65,
against 0.23 for one that was not). Late in a run half of a lone SmolLM2 node's own groups come back
all wrong (bench/swarm_learning.md), generation spent for no gradient. So a node may fill part of its
I own questions from its own recent mixed ones: on-policy, its own verifier, nothing from a peer.
This is also the control that tells whether a peer's suggested question pays for more than being a
frontier question: the same node replaying its own.

Measured (bench/swarm_learning.md, heterogeneous, 3 SmolLM2 nodes x 30 rounds, 3 seeds): replayed
questions came back mixed 0.70 of the time against 0.42 for fresh ones, yet held-out pass@1 fell,
-0.026 +/- 0.020 against the same nodes without replay and -0.068 +/- 0.005 against question sharing at
equal CPU-seconds. More gradient on questions already seen teaches those questions, not the skill; a
peer's frontier question pays because it is new here. So the default is 0, and a mixed group is not by
itself a measure of what a source is worth (sapo/source_choice.py weighs only sources of new questions).

Each question is re-asked at most `max_replays` times (then it is dropped: a few reads of a question
teach it, many teach its answer) and only while it keeps coming back mixed. The buffer is bounded and
forgets the oldest, and is checkpointed with the trainer (a resumed run asks what it would have asked).

Pure: `draw` chooses, the trainer asks and reports back with `observe_fresh` / `observe_replayed`.
"""

from __future__ import annotations

import random
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from engine.tasks.reference import TaskRef, TaskRefError

_HASH = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ReplayEntry:
    ref: TaskRef
    replays: int  # times it has been asked again so far


class FrontierReplay:
    """Owned by the trainer thread. Keyed by question hash: one entry per question."""

    def __init__(self, capacity: int = 64, max_replays: int = 2) -> None:
        if capacity < 1 or max_replays < 1:
            raise ValueError("capacity and max_replays must be >= 1")
        self._entries: OrderedDict[str, ReplayEntry] = OrderedDict()
        self._capacity, self._max_replays = capacity, max_replays

    def __len__(self) -> int:
        return len(self._entries)

    def draw(self, n: int, rng: random.Random) -> list[tuple[str, ReplayEntry]]:
        """Up to n entries, drawn uniformly and taken out (one that comes back mixed is put back by
        `observe_replayed`). n <= 0 or an empty buffer draws nothing from `rng`."""
        if n <= 0 or not self._entries:
            return []
        keys = rng.sample(list(self._entries), min(n, len(self._entries)))
        return [(key, self._entries.pop(key)) for key in keys]

    def observe_fresh(self, question_hash: str, ref: TaskRef, mixed: bool) -> None:
        """One of this round's fresh own questions: kept for a replay when its group was mixed."""
        if mixed:
            self._put(question_hash, ReplayEntry(ref, 0))

    def observe_replayed(self, question_hash: str, entry: ReplayEntry, mixed: bool) -> None:
        """A replayed question's outcome: back in the buffer while mixed and under `max_replays`."""
        replays = entry.replays + 1
        if mixed and replays < self._max_replays:
            self._put(question_hash, ReplayEntry(entry.ref, replays))

    def state_dict(self) -> list[dict[str, Any]]:
        return [{"hash": key, "ref": e.ref.to_dict(), "replays": e.replays} for key, e in self._entries.items()]

    def load_state(self, state: object) -> None:
        """Restore from a checkpoint (a file: untrusted); malformed entries are skipped."""
        if not isinstance(state, list):
            return
        self._entries.clear()
        for item in state[-self._capacity:]:
            if not isinstance(item, dict):
                continue
            key, replays = item.get("hash"), item.get("replays")
            if not isinstance(key, str) or not _HASH.fullmatch(key) or isinstance(replays, bool) \
                    or not isinstance(replays, int) or not 0 <= replays < self._max_replays:
                continue
            try:
                ref = TaskRef.from_dict(item.get("ref"))
            except TaskRefError:
                continue
            self._entries[key] = ReplayEntry(ref, replays)

    def _put(self, question_hash: str, entry: ReplayEntry) -> None:
        self._entries.pop(question_hash, None)
        self._entries[question_hash] = entry
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
