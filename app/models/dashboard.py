"""Dashboard view model: per-round training metrics as ring buffers, Qt-free.

Fed by RoundCompleted / EvalCompleted events and by the store's history at start-up. Metric names
come from the node's `RoundCompleted.metrics` (the store's `rounds` columns); each series accepts a
few spellings so the dashboard does not break when one is renamed. The format warm-up (format_rate,
format_weight) has its own series, apart from the correctness reward; the curriculum's rungs are state,
not a series (one number per specialty, the latest round's); so is where the newest rounds' groups came
from (`sources`: own questions, peers' suggested questions, peers' answers).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping
from typing import Any

from app.models.history import clean_rungs
from app.models.ring import Ring, Window
from app.models.sources import SourceTally
from engine.events import EvalCompleted, RoundCompleted

# series -> metric names that feed it, first present wins (engine/store.py ROUND_METRICS first)
METRIC_KEYS: dict[str, tuple[str, ...]] = {
    "reward": ("reward_mean", "reward"),
    "zero_std": ("frac_reward_zero_std", "zero_std_fraction"),
    "completion_len": ("completion_len_mean", "completion_tokens_mean"),
    "tokens_per_s": ("tokens_per_s", "tokens_per_second"),
    "cumulative": ("cumulative_reward",),
    "format_rate": ("format_rate",),
    "format_weight": ("format_weight",),
}
SCALAR_SERIES = ("reward", "reward_avg", "reward_lo", "reward_hi", "cumulative", "zero_std",
                 "completion_len", "tokens_per_s", "format_rate", "format_weight", "pass1", "passk")
FRACTIONS = ("format_rate", "format_weight")  # defined on 0..1: a value outside is a bad metric, not a point


def _metric(metrics: Mapping[str, Any], series: str) -> float | None:
    for key in METRIC_KEYS[series]:
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


class DashboardModel:
    def __init__(self, capacity: int = 5000, window: int = 20) -> None:
        self.capacity = capacity  # points kept per series (older rounds scroll out)
        self.window = window  # rounds in the moving average and the min-max band
        self.series: dict[str, Ring] = {name: Ring(capacity) for name in SCALAR_SERIES}
        self.specialty: dict[str, Ring] = {}  # moving average of each specialty's reward
        self.phases: dict[str, Ring] = {}  # seconds per phase per round
        self.sources = SourceTally(window)  # where the newest rounds' groups came from, and what they cost
        self._reward_window = Window(window)
        self._specialty_windows: dict[str, Window] = {}
        self._cumulative = 0.0
        self._seen: collections.OrderedDict[int, None] = collections.OrderedDict()  # dedupe replays
        self._seen_evals: set[int] = set()
        self.rungs: dict[str, int] = {}  # specialty -> latest curriculum rung (0 = easiest)
        self.curriculum_active = False  # the newest round reported rungs
        self._rungs_round: int | None = None  # the round `rungs` came from (older replays do not win)
        self.rounds = 0
        self.last_round: int | None = None
        self.version = 0  # bumps on any change

    def apply_round(self, event: RoundCompleted) -> bool:
        """Add one round; False when it was already seen (history then replayed events)."""
        if event.round in self._seen:
            return False
        self._seen[event.round] = None
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        x = float(event.round)
        reward = _metric(event.metrics, "reward")
        if reward is not None:
            self._reward_window.push(reward)
            self.series["reward"].append(x, reward)
            self.series["reward_avg"].append(x, self._reward_window.mean())
            self.series["reward_lo"].append(x, self._reward_window.min())
            self.series["reward_hi"].append(x, self._reward_window.max())
            cumulative = _metric(event.metrics, "cumulative")
            # Without the node's own total, sum the per-round mean (the paper sums per-round reward).
            self._cumulative = cumulative if cumulative is not None else self._cumulative + reward
            self.series["cumulative"].append(x, self._cumulative)
        for name in ("zero_std", "completion_len", "tokens_per_s", *FRACTIONS):
            value = _metric(event.metrics, name)
            if value is not None and (name not in FRACTIONS or 0.0 <= value <= 1.0):
                self.series[name].append(x, value)
        self._apply_rungs(event)
        self.sources.apply(event.round, event.metrics)
        for specialty, value in event.per_specialty_reward.items():
            if not math.isfinite(value):
                continue
            window = self._specialty_windows.setdefault(specialty, Window(self.window))
            window.push(float(value))
            self.specialty.setdefault(specialty, Ring(self.capacity)).append(x, window.mean())
        for phase, seconds in event.phase_seconds.items():
            if math.isfinite(seconds):
                self.phases.setdefault(phase, Ring(self.capacity)).append(x, float(seconds))
        self.rounds += 1
        self.last_round = event.round
        self.version += 1
        return True

    def _apply_rungs(self, event: RoundCompleted) -> None:
        if self._rungs_round is not None and event.round < self._rungs_round:
            return  # history arriving after live rounds: the newer rungs stand
        self._rungs_round = event.round
        rungs = clean_rungs(event.rungs)  # live events pass a type check, but a negative rung would too
        self.curriculum_active = bool(rungs)
        # Merged, not replaced: a round that reports some specialties keeps the others' last rung.
        self.rungs.update(rungs)

    def apply_eval(self, event: EvalCompleted) -> bool:
        if event.round in self._seen_evals:
            return False
        self._seen_evals.add(event.round)
        self.series["pass1"].append(float(event.round), event.pass1)
        self.series["passk"].append(float(event.round), event.passk)
        self.version += 1
        return True

    def load(self, rounds: Iterable[RoundCompleted], evals: Iterable[EvalCompleted] = ()) -> int:
        """History from the store, oldest first; returns how many rounds were new."""
        added = sum(self.apply_round(r) for r in sorted(rounds, key=lambda r: r.round))
        for e in sorted(evals, key=lambda e: e.round):
            self.apply_eval(e)
        return added

    def latest(self, series: str) -> float | None:
        return self.series[series].last()
