"""A bounded window of values measured on this node's own groups or rows: what a peer screen's bound
is calibrated on (engine/sapo/copies.py, engine/sapo/plausibility.py), kept in checkpoints."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any


def upper_quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of `values` by the nearest rank at or above it (no interpolation: a bound)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class OwnSample:
    """Owned by the trainer thread. The newest `window` values `accepts` lets in; calibrated once it
    holds `min_count` of them."""

    def __init__(self, window: int, min_count: int, accepts: Callable[[float], bool]) -> None:
        self._values: deque[float] = deque(maxlen=window)
        self._min_count, self._accepts = min_count, accepts

    def add(self, values: Iterable[float]) -> None:
        self._values.extend(v for v in values if self._accepts(v))

    def calibrated(self) -> bool:
        return len(self._values) >= self._min_count

    def values(self) -> list[float]:
        return list(self._values)

    def state_dict(self) -> list[float]:
        return list(self._values)

    def load_state(self, state: Any) -> None:
        """Restore the window; anything malformed (a damaged checkpoint) starts it empty."""
        self._values.clear()
        if isinstance(state, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                           and self._accepts(float(v)) for v in state):
            self.add(float(v) for v in state)
