"""The per-token log-prob floor a peer's completion must clear, calibrated on this node's own rows.

A fixed floor (-8 nats/token) lets through any hand-written text far less likely than anything this
policy samples (a plain answer here is ~-0.3/token). The floor is instead set by what this node's own
trained completions score under its own policy: the low `quantile` of their mean per-token log-prob
over a window, less a `margin` for honest peers (their policies have drifted from this one), and
never below the config's `external_min_logprob`, which is also the floor until `min_rows` own rows
were seen. It cannot refuse text this policy finds likely: an answer in its own format written by
hand passes (bounded by its weight, engine/sapo/peer_weight.py).
Memory: one float per remembered own row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from engine.sapo.own_sample import OwnSample, upper_quantile

QUANTILE = 0.01  # of own rows' mean log-prob: their least likely 1%
WINDOW = 1024  # own rows remembered
MIN_ROWS = 32  # own rows before the floor is calibrated


class PlausibilityFloor:
    """Owned by the trainer thread: `floor()` before an update, `observe` its own rows' means after."""

    def __init__(self, lowest: float, margin: float) -> None:
        self.lowest, self.margin = lowest, margin
        self._own = OwnSample(WINDOW, MIN_ROWS, lambda v: math.isfinite(v) and v <= 0.0)

    def observe(self, own_mean_logps: Iterable[float]) -> None:
        self._own.add(own_mean_logps)

    def calibrated(self) -> bool:
        return self._own.calibrated()

    def floor(self) -> float:
        if not self.calibrated():
            return self.lowest
        low = -upper_quantile([-v for v in self._own.values()], 1.0 - QUANTILE)  # the QUANTILE-th lowest
        return max(self.lowest, low - self.margin)

    def state_dict(self) -> list[float]:
        return self._own.state_dict()

    def load_state(self, state: Any) -> None:
        self._own.load_state(state)
