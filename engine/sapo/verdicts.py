"""The trainer's verdicts on peers' groups it passed over, for the feed and the store.

A pooled group is a candidate in every round until it is used or leaves the pool, and each round the
trainer judges it again (engine/sapo/first_look.py: screened or cut to no signal; sampler.py: no signal,
not re-scored, or not drawn into J). `skipped_verdicts` pairs each verdict with the verified group;
`VerdictLog` keeps the last one reported per group, so only a new or changed verdict becomes an event:
a group waiting through 50 rounds is told once, not 50 times.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from engine.events import TRAINER_VERDICTS, TrainerVerdict
from engine.sapo.records import RolloutGroup, VerifiedGroup

Skipped = tuple[VerifiedGroup, TrainerVerdict]


def trainer_verdict(reason: str) -> TrainerVerdict:
    if reason not in TRAINER_VERDICTS:
        raise ValueError(f"not a trainer verdict: {reason!r} (known: {TRAINER_VERDICTS})")
    return cast(TrainerVerdict, reason)


def skipped_verdicts(candidates: Sequence[VerifiedGroup], dropped: Sequence[tuple[RolloutGroup, str]]
                     ) -> tuple[Skipped, ...]:
    """The candidates among `dropped` (the round's (group, reason) pairs, groups as the candidates hold
    them), each as its verified group with the reason."""
    by_group = {id(v.group): v for v in candidates}
    return tuple((by_group[id(g)], trainer_verdict(why)) for g, why in dropped if id(g) in by_group)


class VerdictLog:
    """The verdict last reported per group (held by its verified group, as the pool keeps it); a group
    no longer skipped is forgotten, so a later skip is told again."""

    def __init__(self) -> None:
        self._last: dict[int, Skipped] = {}

    def changed(self, skipped: Sequence[Skipped]) -> list[Skipped]:
        """Of this round's skips, those not reported with this reason last time."""
        current = {id(v): (v, why) for v, why in skipped}
        new = [(v, why) for v, why in skipped if self._last.get(id(v), (None, None))[1] != why]
        self._last = current
        return new
