"""What a round did with each peer's group it was offered, by the group's candidate key; for the feed
and the store.

A pooled group is a candidate in every round until it is used or leaves the pool, and each round the
trainer judges it again (engine/sapo/first_look.py: screened or cut to no signal; sampler.py: no signal,
not re-scored, or not drawn into J). `round_verdicts` gives every candidate of a round one `Verdict`;
`VerdictLog` keeps the last skip reported per key, so only a new or changed skip becomes an event: a
group waiting through 50 rounds is told once, not 50 times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

from engine.events import TRAINER_VERDICTS, TrainerVerdict
from engine.sapo.records import CandidateKey

# suggested: its question was answered here (its text not trained on); used: its text entered the loss;
# skipped: passed over, it stays pooled (reason: a TrainerVerdict); pending: its origin cannot be judged
# yet (quarantine, too few questions seen: first_look.py), so it was not.
VerdictStatus = Literal["suggested", "used", "skipped", "pending"]


@dataclass(frozen=True)
class Verdict:
    key: CandidateKey
    status: VerdictStatus
    reason: str = ""  # why it was skipped (one of TRAINER_VERDICTS); "" otherwise


def trainer_verdict(reason: str) -> TrainerVerdict:
    if reason not in TRAINER_VERDICTS:
        raise ValueError(f"not a trainer verdict: {reason!r} (known: {TRAINER_VERDICTS})")
    return cast(TrainerVerdict, reason)


def round_verdicts(suggested: Sequence[CandidateKey], used: Sequence[CandidateKey],
                   skipped: Sequence[tuple[CandidateKey, str]], pending: Sequence[CandidateKey]
                   ) -> tuple[Verdict, ...]:
    """One verdict per candidate of the round, in that order; `skipped` holds (key, reason) pairs in the
    order the round left them out."""
    return (tuple(Verdict(k, "suggested") for k in suggested) + tuple(Verdict(k, "used") for k in used)
            + tuple(Verdict(k, "skipped", trainer_verdict(why)) for k, why in skipped)
            + tuple(Verdict(k, "pending") for k in pending))


class VerdictLog:
    """The skip reason last reported per candidate key; a group no longer skipped is forgotten, so a
    later skip is told again."""

    def __init__(self) -> None:
        self._last: dict[CandidateKey, str] = {}

    def changed(self, verdicts: Sequence[Verdict]) -> list[Verdict]:
        """Of this round's skips, those not reported with this reason last time."""
        skipped = [v for v in verdicts if v.status == "skipped"]
        new = [v for v in skipped if self._last.get(v.key) != v.reason]
        self._last = {v.key: v.reason for v in skipped}
        return new
