"""Shared-rollouts view model: the live feed of peers' groups, what waits in the pool and what was dropped
(received and used, per peer and in all, are the Peers model's: one count, the store's).

A group may be reported more than once (first "pooled", then "skipped" by a round's trainer while it
waits, later "used" or "dropped"): the feed keeps one row per (origin peer, question) and updates its
status, so counts are per group, not per event. `status_text` says each status and reason in words a
contributor knows.
Rows live in a bounded deque (newest first in views); `changes` lets a table view insert/update rows
incrementally instead of resetting.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field, replace

from engine.events import ROLLOUT_STATUSES, RolloutSeen

STATUSES = ROLLOUT_STATUSES
# The reasons of the trainer (skipped: the group stays in the pool) and of the pool (dropped: it left).
REASON_WORDS = {
    "zero_advantage": "no learning signal (all answers right or all wrong)",
    "repeated_text": "its answers repeat words this peer keeps using that the question doesn't explain "
                     "(possible planted text)",
    "cut_no_signal": "answers longer than this model writes: cut short, no learning signal left",
    "special_tokens": "its answers contain the model's control tokens (such as end-of-text) written as text",
    "copied_answers": "the same answer repeated more often than this model's own answers ever repeat "
                      "(answers written from a template, not sampled)",
    "same_question": "another peer's answers to the same question were used this round",
    "not_rescored": "could not be scored here",
    "not_sampled": "not drawn this round",
    "other_model": "made by another model: its answers are not this model's to learn from",
    "judge_question": "its question is one this node tests its model on: never trained on, so the test "
                      "stays fair",
    "local_group": "one of this node's own groups",
    "duplicate": "same content as a group already received",
    "copied": "a copy of another peer's answers: the peer who shared them first gets the credit",
    "oversized": "an answer longer than this model could write",
    "over_cpu_budget": "the peer used up its share of checking time",
    "forged_ref": "the question does not match its reference",
    "heldout_question": "a question kept for testing models, never for training",
    "rescore_error": "this node's checker failed on it",
    "stale_policy": "made by an old version of the peer's model",
    "question_used_up": "this question was already learned from enough peers' answers",
    "expired": "waited too long in the pool",
    "evicted_peer_share": "the peer had more than its share of the pool",
    "evicted_address_share": "too many groups from one address",
    "evicted_capacity": "the pool was full; the oldest made room",
    "unspecified": "no reason given",
}


def reason_words(reason: str) -> str:
    """A reason in plain words; "code: detail" reasons by their code; unknown codes as they are."""
    return REASON_WORDS.get(reason.split(":", 1)[0].strip(), reason)


def status_text(status: str, reason: str) -> str:
    """What became of a group, for a contributor: "used in training", "skipped: ...", "dropped: ..."."""
    if status == "used":
        return "used in training"
    if status == "skipped":
        return "waiting: not drawn this round" if reason == "not_sampled" else f"skipped: {reason_words(reason)}"
    if status == "dropped":
        return f"dropped: {reason_words(reason)}"
    return "waiting in the pool"


@dataclass
class FeedRow:
    """One group: the sighting that brought it (`seen`, its reward and completion kept from the latest
    sighting that had them) and its verdict now (`status` normalised, `reason` never empty when dropped
    or skipped)."""

    seq: int  # arrival number, increasing; the view orders rows by it
    seen: RolloutSeen
    status: str = "pooled"
    reason: str = ""


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
        self.pooled = 0  # received and still waiting in the pool, not judged by a round yet
        self.skipped: collections.Counter[str] = collections.Counter()  # reason -> groups waiting, passed over
        self.dropped: collections.Counter[str] = collections.Counter()  # reason -> groups
        self._changes = FeedChanges()
        self.version = 0

    def apply(self, event: RolloutSeen) -> None:
        status = event.status if event.status in STATUSES else "pooled"
        reason = event.reason or ("unspecified" if status in ("dropped", "skipped") else "")
        key = (event.origin_peer, event.question)
        row = self._by_key.get(key)
        if row is None:
            row = FeedRow(self._seq, event)
            self._seq += 1
            self.rows.append(row)
            self._by_key[key] = row
            self._changes.added += 1
            self.pooled += 1
            if len(self.rows) > self.capacity:
                old = self.rows.popleft()
                self._by_key.pop((old.seen.origin_peer, old.seen.question), None)
                self._changes.removed += 1
                self._changes.updated.discard(old.seq)
        elif (row.status, row.reason) != (status, reason):
            self._changes.updated.add(row.seq)
        self._set_status(row, status, reason)
        reward = row.seen.reward if event.reward is None else event.reward
        row.seen = replace(row.seen, reward=reward, completion=event.completion or row.seen.completion)
        self.version += 1

    def _set_status(self, row: FeedRow, status: str, reason: str) -> None:
        """Move the group's count from its old status (and reason) to the new one (a group counts once)."""
        if (row.status, row.reason) == (status, reason):
            return
        self._count(row.status, row.reason, -1)
        row.status, row.reason = status, reason
        self._count(status, reason, +1)

    def _count(self, status: str, reason: str, delta: int) -> None:
        if status == "pooled":
            self.pooled += delta
        elif status != "used":
            by_reason = self.dropped if status == "dropped" else self.skipped
            by_reason[reason] += delta
            if by_reason[reason] <= 0:
                del by_reason[reason]

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

    @property
    def waiting(self) -> int:
        """Groups still in the pool: not judged yet, or passed over by the last round that saw them."""
        return self.pooled + sum(self.skipped.values())
