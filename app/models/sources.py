"""Where recent rounds' training came from, per source: the node's own questions, questions peers
suggested (answered here), and peers' answers (their text groups). Qt-free.

Per source over the newest `window` rounds: groups it gave, how many had signal (at least one right and
one wrong answer: only those teach anything), and its share of the rounds' seconds. The numbers are the
round metrics the trainer computes (engine/sapo/frontier.py `source_metrics`, the store's v5/v6
columns); rounds from an engine that does not report them are left out, not counted as zeros.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SOURCES = ("own_pick", "suggested", "peer_text")
SOURCE_LABELS = {"own_pick": "your own questions", "suggested": "questions peers suggested",
                 "peer_text": "peers' answers"}
SOURCE_TIPS = {
    "own_pick": "Questions this node picked and answered itself.",
    "suggested": ("Questions peers found at the edge of what their model can do, answered here by your own "
                  "model: nothing of the peer's text is trained on."),
    "peer_text": "Peers' own answers to their questions, re-checked here and trained on.",
}


@dataclass(frozen=True)
class SourceRow:
    source: str
    label: str
    groups: float  # groups this source gave over the window
    mixed: float  # of them, with signal
    seconds: float  # seconds spent on them
    share: float  # of all sources' seconds (0 when nothing was spent)

    @property
    def signal_fraction(self) -> float | None:
        return self.mixed / self.groups if self.groups else None


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return float(value) if ok else None


def round_sources(metrics: Mapping[str, Any]) -> dict[str, tuple[float, float, float]] | None:
    """{source: (groups, mixed, seconds)} of one round's metrics; None when the round has none. A missing
    `peer_text_mixed` (engines before it was recorded) counts every peer text group as mixed, as the
    zero-advantage filter leaves them."""
    if _number(metrics.get("own_pick_groups")) is None:
        return None
    out = {}
    for source in SOURCES:
        groups = _number(metrics.get(f"{source}_groups")) or 0.0
        mixed = _number(metrics.get(f"{source}_mixed"))
        mixed = groups if mixed is None and source == "peer_text" else min(mixed or 0.0, groups)
        out[source] = (groups, mixed, _number(metrics.get(f"seconds_{source}")) or 0.0)
    return out


class SourceTally:
    """The newest `window` rounds' per-source numbers (by round number: history that arrives after live
    rounds does not push the newest out)."""

    def __init__(self, window: int = 20) -> None:
        self.window = window
        self._rounds: dict[int, dict[str, tuple[float, float, float]]] = {}

    def apply(self, round_no: int, metrics: Mapping[str, Any]) -> bool:
        """Count one round; False when it reports no sources or is older than the window holds."""
        sources = round_sources(metrics)
        if sources is None:
            return False
        if len(self._rounds) >= self.window and round_no < min(self._rounds):
            return False
        self._rounds[round_no] = sources
        while len(self._rounds) > self.window:
            del self._rounds[min(self._rounds)]
        return True

    def clear(self) -> None:
        """Forget every round (the dashboard switched to another model, whose rounds count from 1)."""
        self._rounds.clear()

    @property
    def rounds(self) -> int:
        return len(self._rounds)

    def rows(self) -> list[SourceRow]:
        totals = {s: [sum(r[s][k] for r in self._rounds.values()) for k in range(3)] for s in SOURCES}
        spent = sum(t[2] for t in totals.values())
        return [SourceRow(s, SOURCE_LABELS[s], t[0], t[1], t[2], t[2] / spent if spent > 0 else 0.0)
                for s, t in totals.items()]
