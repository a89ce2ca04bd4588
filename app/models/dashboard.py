"""Dashboard view model: per-round training metrics as ring buffers, Qt-free.

Fed by RoundCompleted / EvalCompleted events and by the store's history at start-up. Metric names
come from the node's `RoundCompleted.metrics` (the store's `rounds` columns); each metric the registry
(engine/metrics.py) plots has a series, which also reads the metric's older spellings. The format warm-up
(format_rate, format_weight) has its own series, apart from the correctness reward; the curriculum's
rungs are state, not a series (one number per specialty, the latest round's); so is where the newest
rounds' groups came from (`sources`: own questions, peers' suggested questions, peers' answers).

Rounds are numbered per model: the dashboard shows one model's, the one trained last. A round or eval of
another model starts it over for that model (and asks for that model's stored history: `wants_history`).
The history's totals (every round in the store, not the window sent) set the rounds count, the
cumulative reward and the hours of training, so a restart does not shrink them to the window.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from app.models.history import Totals, clean_rungs
from app.models.ring import Ring, Window
from app.models.sources import SourceTally
from engine.events import EvalCompleted, RoundCompleted
from engine.metrics import PLOTTED, Metric, Plot

# The reward series and those derived from it (its moving average and min-max band, the cumulative
# reward), and the held-out eval's: not round metrics of their own, so not in the registry.
REWARD = "reward"
DERIVED_SERIES = ("reward_avg", "reward_lo", "reward_hi", "cumulative", "pass1", "passk")
CUMULATIVE_KEYS = ("cumulative_reward",)  # an engine's own running total, when it sends one


def metric_keys(plotted: Sequence[tuple[Metric, Plot]] = PLOTTED) -> dict[str, tuple[str, ...]]:
    """Series -> metric names that feed it, first present wins: the registry's name, then older spellings."""
    return {plot.series: (metric.name, *metric.aliases) for metric, plot in plotted}


def _metric(metrics: Mapping[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


class DashboardModel:
    def __init__(self, capacity: int = 5000, window: int = 20,
                 plotted: Sequence[tuple[Metric, Plot]] = PLOTTED) -> None:
        self.capacity = capacity  # points kept per series (older rounds scroll out)
        self.window = window  # rounds in the moving average and the min-max band
        self.plotted = tuple(plotted)  # the registry's drawn metrics: the view reads them here
        self._keys = metric_keys(self.plotted)
        self._plain = [plot for _, plot in self.plotted if plot.series != REWARD]  # the reward's are derived
        self.series: dict[str, Ring] = {name: Ring(capacity) for name in (*self._keys, *DERIVED_SERIES)}
        self.specialty: dict[str, Ring] = {}  # moving average of each specialty's reward
        self.phases: dict[str, Ring] = {}  # seconds per phase per round
        self.sources = SourceTally(window)  # where the newest rounds' groups came from, and what they cost
        self._reward_window = Window(window)
        self._specialty_windows: dict[str, Window] = {}
        self._cumulative = 0.0
        # round -> (reward, seconds) of rounds applied: dedupes replays, and counts rounds newer than totals
        self._seen: collections.OrderedDict[int, tuple[float, float]] = collections.OrderedDict()
        self._seen_evals: set[int] = set()
        self.model: str | None = None  # whose rounds these are (None: not told; "" from older engines)
        self.wants_history: str | None = None  # switched to this model: its stored record is not loaded yet
        self.train_seconds = 0.0  # the model's training seconds so far (its rounds' own time)
        self.eval_pass1: dict[int, float] = {}  # round -> held-out pass@1 (round 0: the baseline)
        self.eval_seconds: dict[int, float] = {}  # round -> training seconds up to that eval
        self.eval_due_in_s: float | None = None  # training seconds to the next eval, as of the newest live round
        self.rungs: dict[str, int] = {}  # specialty -> latest curriculum rung (0 = easiest)
        self.curriculum_active = False  # the newest round reported rungs
        self._rungs_round: int | None = None  # the round `rungs` came from (older replays do not win)
        self.rounds = 0
        self.last_round: int | None = None
        self.version = 0  # bumps on any change

    def apply_round(self, event: RoundCompleted) -> bool:
        """Add one round; False when it was already seen (history then replayed events)."""
        self._follow(event.model)
        if event.round in self._seen:
            return False
        x = float(event.round)
        reward = _metric(event.metrics, self._keys[REWARD])
        seconds = event.phase_seconds.get("total", 0.0)
        seconds = seconds if math.isfinite(seconds) and seconds >= 0 else 0.0
        self._seen[event.round] = (reward or 0.0, seconds)
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        self.train_seconds += seconds
        due = event.metrics.get("eval_due_in_s")
        if isinstance(due, (int, float)) and math.isfinite(due) and due >= 0 and event.round >= (self.last_round or 0):
            self.eval_due_in_s = float(due)
        if reward is not None:
            self._reward_window.push(reward)
            self.series["reward"].append(x, reward)
            self.series["reward_avg"].append(x, self._reward_window.mean())
            self.series["reward_lo"].append(x, self._reward_window.min())
            self.series["reward_hi"].append(x, self._reward_window.max())
            cumulative = _metric(event.metrics, CUMULATIVE_KEYS)
            # Without the node's own total, sum the per-round mean (the paper sums per-round reward).
            self._cumulative = cumulative if cumulative is not None else self._cumulative + reward
            self.series["cumulative"].append(x, self._cumulative)
        self._apply_plain(x, event.metrics)
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
        self.last_round = max(event.round, self.last_round or 0)
        self.version += 1
        return True

    def _apply_plain(self, x: float, metrics: Mapping[str, Any]) -> None:
        for plot in self._plain:
            value = _metric(metrics, self._keys[plot.series])
            if value is not None and (not plot.bounded or 0.0 <= value <= 1.0):
                self.series[plot.series].append(x, value)

    def _follow(self, model: str) -> None:
        """A round or eval of `model`: another model than the one shown starts the dashboard over for it."""
        if not model or model == self.model:
            return
        if self.model is not None:
            self.reset()
            self.wants_history = model
        self.model = model

    def reset(self) -> None:
        """Empty every series in place (the views keep their curves) and forget the model shown."""
        for ring in (*self.series.values(), *self.specialty.values(), *self.phases.values()):
            ring.clear()
        self._reward_window = Window(self.window)
        self._specialty_windows.clear()
        self.sources.clear()  # in place: the sources card holds it
        self._cumulative = self.train_seconds = 0.0
        self._seen.clear()
        self._seen_evals.clear()
        self.eval_pass1.clear()
        self.eval_seconds.clear()
        self.rungs.clear()
        self.curriculum_active, self._rungs_round = False, None
        self.rounds, self.last_round, self.eval_due_in_s = 0, None, None
        self.model = self.wants_history = None
        self.version += 1

    def _apply_rungs(self, event: RoundCompleted) -> None:
        if self._rungs_round is not None and event.round < self._rungs_round:
            return  # history arriving after live rounds: the newer rungs stand
        self._rungs_round = event.round
        rungs = clean_rungs(event.rungs)  # live events pass a type check, but a negative rung would too
        self.curriculum_active = bool(rungs)
        # Merged, not replaced: a round that reports some specialties keeps the others' last rung.
        self.rungs.update(rungs)

    def apply_eval(self, event: EvalCompleted) -> bool:
        self._follow(event.model)
        if event.round in self._seen_evals:
            return False
        self._seen_evals.add(event.round)
        self.eval_pass1[event.round] = event.pass1
        if event.round >= (self.last_round or 0):
            self.eval_due_in_s = None  # the check announced has come; the next round says when the next is
        self.eval_seconds.setdefault(event.round, self.train_seconds)  # live: it follows its round
        self.series["pass1"].append(float(event.round), event.pass1)
        self.series["passk"].append(float(event.round), event.passk)
        self.version += 1
        return True

    def load(self, rounds: Iterable[RoundCompleted], evals: Iterable[EvalCompleted] = (),
             totals: Totals | None = None, model: str = "") -> int:
        """History from the store, oldest first; returns how many rounds were new. `model`: whose record
        it is (the node's selected model; engines before it said so only through `totals` or the rounds).
        With `totals` (the model's every round, not only those sent), the rounds count, cumulative reward
        and training seconds are the store's; rounds of another model than the history's are not its."""
        rounds = sorted(rounds, key=lambda r: r.round)
        model = model or (totals.model if totals is not None
                          else next((r.model for r in reversed(rounds) if r.model), ""))
        self._follow(model)  # a model switched to, with no record yet, starts the charts over too
        if self.wants_history is not None:  # asked for (a switch, a model of its own): this is the answer
            self.wants_history = None
        rounds = [r for r in rounds if not model or r.model in ("", model)]
        evals = [e for e in evals if not model or e.model in ("", model)]
        if totals is not None:
            self._take_totals(totals, [r for r in rounds if r.round not in self._seen])
        added = sum(self.apply_round(r) for r in rounds)
        for e in sorted(evals, key=lambda e: e.round):
            # without the store's figure, the training seconds of the rounds loaded up to it
            self.eval_seconds.setdefault(e.round, sum(s for n, (_, s) in self._seen.items() if n <= e.round))
            self.apply_eval(e)
        return added

    def _take_totals(self, totals: Totals, new: list[RoundCompleted]) -> None:
        """Counters such that, once `new` rounds are applied, they equal the totals (plus any live round
        already applied beyond them)."""
        pending = [r for r in new if r.round <= totals.last_round]
        beyond = [value for number, value in self._seen.items() if number > totals.last_round]
        self.rounds = totals.rounds - len(pending) + len(beyond)
        self._cumulative = totals.reward_sum + sum(reward for reward, _ in beyond) - sum(
            _metric(r.metrics, self._keys[REWARD]) or 0.0 for r in pending)
        self.train_seconds = totals.seconds + sum(seconds for _, seconds in beyond) - sum(
            max(0.0, r.phase_seconds.get("total", 0.0)) for r in pending)
        self.eval_seconds.update(totals.eval_seconds)

    def latest(self, series: str) -> float | None:
        return self.series[series].last()
