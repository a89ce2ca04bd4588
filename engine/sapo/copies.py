"""Copies inside a peer's group: the fabricator's cheapest group is a template repeated.

A peer that regenerates a question from its reference needs no model to send a group this node's
verifier scores mixed: k copies of a right answer and n - k of a wrong one (a Reliquary miner of
2026-05-25 sent exactly that, rewards [1,1,1,1,1,0,0,0]). Honest sampling at T = 1 repeats itself too,
on short answers, so the bound is measured, not guessed: the share of copies in this node's own groups
that had signal, over a window, at a high quantile. A peer's group with signal whose share of copies
is above it is refused whole and its origin flagged. A group without signal is left to the
zero-advantage filter (an honest group of four equal answers is common and trains nothing anyway).

Copies are compared after normalisation (case and every whitespace dropped), so that respacing a
template does not make it new. It cannot stop templates varied in wording: such a group is bounded by
its weight (engine/sapo/peer_weight.py). An answer in the model's own format written by hand is
indistinguishable from a sampled one.
Memory: one float per remembered own group.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.sapo.checks import check_enabled, check_ints, check_numbers
from engine.sapo.own_sample import OwnSample, upper_quantile
from engine.sapo.records import RolloutGroup

_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class CopiesConfig:
    """How many copies in a peer's group this node accepts, measured on its own groups."""

    enabled: bool = True
    window: int = 256  # own groups with signal remembered
    quantile: float = 0.99  # of the own groups' share of copies: the bound (an honest peer's tail passes)
    min_own_groups: int = 8  # below this many, the bound is `default_max_share`
    default_max_share: float = 0.5  # before calibration: at most half a group copies

    def __post_init__(self) -> None:
        check_enabled("copies", self)
        check_ints("copies", self, (("window", 1, 65536), ("min_own_groups", 1, 65536)))
        check_numbers("copies", self, (("quantile", 0, 1), ("default_max_share", 0, 1)))


def normalised(text: str) -> str:
    """The text two copies share after respacing or recasing."""
    return _SPACE.sub("", text).casefold()


def copy_share(completions: Sequence[str]) -> float:
    """(n - distinct) / n over normalised texts: 0 when all differ, (n - 1) / n when all are one."""
    n = len(completions)
    return (n - len({normalised(c) for c in completions})) / n if n > 1 else 0.0


class CopyScreen:
    """Owned by the trainer thread: `observe_own` each own group as scored, `refuses` a peer's."""

    def __init__(self, cfg: CopiesConfig) -> None:
        self.cfg = cfg
        self._own = OwnSample(cfg.window, cfg.min_own_groups, lambda share: 0.0 <= share <= 1.0)

    def observe_own(self, group: RolloutGroup) -> None:
        if group.rewards is not None and group.has_signal:
            self._own.add([copy_share(group.completions)])

    def max_share(self) -> float:
        """The share of copies an honest group reaches here ("measured" once enough own groups)."""
        if not self._own.calibrated():
            return self.cfg.default_max_share
        return upper_quantile(self._own.values(), self.cfg.quantile)

    def calibrated(self) -> bool:
        return self._own.calibrated()

    def refuses(self, group: RolloutGroup) -> bool:
        """A scored peer group with signal holding more copies than this node's own groups do."""
        if not self.cfg.enabled or group.rewards is None or not group.has_signal:
            return False
        return copy_share(group.completions) > self.max_share() + 1e-9

    def state_dict(self) -> list[float]:
        return self._own.state_dict()

    def load_state(self, state: Any) -> None:
        self._own.load_state(state)
