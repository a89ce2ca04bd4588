"""Whom to trust: each origin's record of what its groups did here (the J sampler weighted by it is
`ReputationSampler` in engine/sapo/sampler.py).

A node learns about a peer from every group it offers (once, when first a candidate): *flagged*
when this node would leave some of it out for text the peer repeats that the task does not explain,
else clean; and again from the groups it trains on, flagged when the update finds completions
implausible under this node's policy, or padding cut at the token cap leaves no signal. Each origin's score is the decayed share of clean groups with a
neutral prior (a newcomer starts at 0.5, about half a clean peer's weight); the J external
groups are drawn without replacement with probability proportional to their origin's weight, which
never falls below `floor` (a peer that reformed can climb back). A peer whose groups keep being
flagged sinks to the floor within a few dozen of its groups, so its share of J falls to ~0 on its own.

Sans-I/O and owned by the trainer thread; `snapshot()` is a copy other threads may read.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from engine.sapo.checks import check_numbers

MAX_ORIGINS = 1024


@dataclass(frozen=True)
class ReputationConfig:
    """How fast a peer's record is forgotten and how far a flagged peer's weight may fall."""

    half_life: float = 64.0  # an origin's groups: after this many, an old outcome counts half
    prior: float = 1.0  # pseudo-groups of each outcome a new origin starts with
    floor: float = 0.02  # the least sampling weight an origin keeps (a clean peer's is ~1)

    def __post_init__(self) -> None:
        check_numbers("reputation", self,
                      (("half_life", 1.0, 1e6), ("prior", 0.01, 1e3), ("floor", 1e-6, 1.0)))


@dataclass
class _Record:
    clean: float = 0.0
    flagged: float = 0.0
    groups: int = 0


class Reputation:
    """Decayed clean / flagged group counts per origin (LRU-bounded)."""

    def __init__(self, cfg: ReputationConfig = ReputationConfig()) -> None:
        self.cfg = cfg
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._decay = 0.5 ** (1.0 / cfg.half_life)

    def record(self, origin: str, flagged: bool) -> None:
        rec = self._records.get(origin)
        if rec is None:
            rec = self._records[origin] = _Record()
            if len(self._records) > MAX_ORIGINS:
                self._records.popitem(last=False)
        else:
            self._records.move_to_end(origin)
        rec.clean, rec.flagged = rec.clean * self._decay, rec.flagged * self._decay
        rec.flagged += 1.0 if flagged else 0.0
        rec.clean += 0.0 if flagged else 1.0
        rec.groups += 1

    def score(self, origin: str) -> float:
        """Posterior mean share of clean groups: 0.5 for a newcomer, -> 1 clean, -> 0 flagged."""
        rec = self._records.get(origin) or _Record()
        return (rec.clean + self.cfg.prior) / (rec.clean + rec.flagged + 2 * self.cfg.prior)

    def weight(self, origin: str) -> float:
        return max(self.cfg.floor, self.score(origin))

    def snapshot(self) -> dict[str, dict[str, float]]:
        return {o: {"score": self.score(o), "groups": float(r.groups), "flagged": r.flagged}
                for o, r in self._records.items()}

    def state_dict(self) -> dict[str, Any]:
        return {o: [r.clean, r.flagged, r.groups] for o, r in self._records.items()}

    def load_state(self, state: Any) -> None:
        """Restore from a checkpoint; malformed entries are skipped."""
        self._records.clear()
        if not isinstance(state, dict):
            return
        for origin, value in list(state.items())[-MAX_ORIGINS:]:
            if not (isinstance(origin, str) and len(origin) <= 128 and isinstance(value, list) and len(value) == 3):
                continue
            clean, flagged, groups = value
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 1e9
                   for v in (clean, flagged, groups)):
                self._records[origin] = _Record(float(clean), float(flagged), int(groups))
