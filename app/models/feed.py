"""Shared-rollouts view model: the live feed of peers' groups, counters and a per-peer breakdown.

A group may be reported more than once (first "pooled", later "used" or "dropped"): the feed keeps one
row per (origin peer, question) and updates its status, so counts are per group, not per event.
Rows live in a bounded deque (newest first in views); `changes` lets a table view insert/update rows
incrementally instead of resetting.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from engine.events import RolloutSeen

STATUSES = ("pooled", "used", "dropped")


@dataclass
class FeedRow:
    seq: int  # arrival number, increasing; the view orders rows by it
    ts: float
    origin_peer: str
    peer_name: str
    specialty: str
    question: str
    completion: str
    reward: float | None
    status: str
    reason: str


@dataclass
class PeerCounts:
    name: str
    received: int = 0
    used: int = 0
    dropped: int = 0


@dataclass
class FeedChanges:
    """What changed since the last `take_changes`: for incremental table updates."""

    added: int = 0  # new rows at the top
    updated: set[int] = field(default_factory=set)  # seqs of rows whose status changed
    removed: int = 0  # rows that fell off the bottom


class FeedModel:
    def __init__(self, capacity: int = 1000) -> None:
        self.capacity = capacity
        self.rows: collections.deque[FeedRow] = collections.deque()  # oldest first
        self._by_key: dict[tuple[str, str], FeedRow] = {}
        self._seq = 0
        self.received = 0
        self.used = 0
        self.pooled = 0  # received and still waiting in the pool
        self.dropped: collections.Counter[str] = collections.Counter()  # reason -> groups
        self.per_peer: dict[str, PeerCounts] = {}
        self._changes = FeedChanges()
        self.version = 0

    def apply(self, event: RolloutSeen) -> None:
        status = event.status if event.status in STATUSES else "pooled"
        reason = event.reason or ("unspecified" if status == "dropped" else "")
        key = (event.origin_peer, event.question)
        peer = self.per_peer.setdefault(event.origin_peer, PeerCounts(event.peer_name or event.origin_peer[:8]))
        if event.peer_name:
            peer.name = event.peer_name
        row = self._by_key.get(key)
        if row is None:
            self.received += 1
            peer.received += 1
            row = FeedRow(self._seq, event.ts, event.origin_peer, event.peer_name, event.specialty,
                          event.question, event.completion, event.reward, "pooled", "")
            self._seq += 1
            self.rows.append(row)
            self._by_key[key] = row
            self._changes.added += 1
            self.pooled += 1
            if len(self.rows) > self.capacity:
                old = self.rows.popleft()
                self._by_key.pop((old.origin_peer, old.question), None)
                self._changes.removed += 1
                self._changes.updated.discard(old.seq)
        elif row.status != status:
            self._changes.updated.add(row.seq)
        self._set_status(row, peer, status, reason)
        if event.reward is not None:
            row.reward = event.reward
        if event.completion:
            row.completion = event.completion
        self.version += 1

    def _set_status(self, row: FeedRow, peer: PeerCounts, status: str, reason: str) -> None:
        """Move the group's count from its old status to the new one (a group counts once)."""
        if row.status == status:
            return
        if row.status == "pooled":
            self.pooled -= 1
        elif row.status == "used":
            self.used -= 1
            peer.used -= 1
        elif row.status == "dropped":
            self.dropped[row.reason] -= 1
            peer.dropped -= 1
            if self.dropped[row.reason] <= 0:
                del self.dropped[row.reason]
        row.status, row.reason = status, reason
        if status == "pooled":
            self.pooled += 1
        elif status == "used":
            self.used += 1
            peer.used += 1
        else:
            self.dropped[reason] += 1
            peer.dropped += 1

    def newest_first(self, index: int) -> FeedRow:
        return self.rows[len(self.rows) - 1 - index]

    def index_of(self, seq: int) -> int | None:
        """Row index (newest first) of arrival `seq`, or None when it scrolled out."""
        if not self.rows or seq < self.rows[0].seq:
            return None
        index = self.rows[-1].seq - seq
        return index if 0 <= index < len(self.rows) else None

    def take_changes(self) -> FeedChanges:
        changes, self._changes = self._changes, FeedChanges()
        return changes

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())
