"""Adaptive J: how many peers' groups to train on, chosen by what they did for this node's own reward.

SAPO fixes I own + J external groups per round; the paper's best split (4/4) is a property of its
swarm, and a swarm changes (peers come and go, some are useless, some lie). Here J is an arm of a
discounted UCB bandit (Garivier & Moulines 2011, "On Upper-Confidence Bound Policies for Switching
Bandit Problems") over a few values in [0, J_max]. The reward of the J used in round t is the gain
the node saw next: its own groups' mean reward in round t+1 minus a slow running baseline of it, a
self-generated signal a peer cannot fake except by actually helping.

    N_a <- gamma * N_a + [a == a_t]          (discounted plays)
    S_a <- gamma * S_a + [a == a_t] * gain_t (discounted gains)
    a_t = argmax_a  S_a / N_a + c * sqrt(log(sum_b N_b) / N_a)     (unplayed arms first)

Pure and small: the trainer asks `choose()` before selecting groups and reports `observe(gain)`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from engine.sapo.checks import check_enabled, check_numbers


@dataclass(frozen=True)
class AdaptiveJConfig:
    """The bandit over J (off: J = num_external every round)."""

    enabled: bool = False
    discount: float = 0.97  # per round: old evidence fades (half-life ~23 rounds) as the swarm changes
    exploration: float = 0.1  # UCB bonus scale, in units of reward (rewards are in [0, 1])
    baseline_rate: float = 0.05  # how fast the own-reward baseline follows (EMA weight per round)

    def __post_init__(self) -> None:
        check_enabled("adaptive_j", self)
        check_numbers("adaptive_j", self, (("discount", 0.5, 1.0), ("exploration", 0.0, 10.0),
                                           ("baseline_rate", 1e-4, 1.0)))


def j_arms(j_max: int) -> tuple[int, ...]:
    """The values of J tried: none, half, all (distinct, ascending)."""
    return tuple(sorted({0, (j_max + 1) // 2, j_max}))


def ucb_choice(plays: Sequence[float], gains: Sequence[float], exploration: float, rng: random.Random) -> int:
    """Index of the arm to play: an unplayed one first (at random), else the best mean + bonus."""
    fresh = [i for i, n in enumerate(plays) if n <= 1e-9]
    if fresh:
        return rng.choice(fresh)
    total = sum(plays)
    scores = [g / n + exploration * math.sqrt(max(math.log(total), 0.0) / n) for n, g in zip(plays, gains)]
    best = max(scores)
    return rng.choice([i for i, s in enumerate(scores) if s >= best - 1e-12])


class JBandit:
    """Discounted UCB over `j_arms(j_max)`; see the module docstring."""

    def __init__(self, config: AdaptiveJConfig, j_max: int, rng: random.Random) -> None:
        self.config = config
        self.arms = j_arms(j_max)
        self._rng = rng
        self.plays = [0.0] * len(self.arms)
        self.gains = [0.0] * len(self.arms)
        self.baseline: float | None = None  # running mean of the node's own reward
        self.pending: int | None = None  # the arm played last round, awaiting its gain

    def choose(self) -> int:
        """J for this round (remembered until `observe`)."""
        self.pending = ucb_choice(self.plays, self.gains, self.config.exploration, self._rng)
        return self.arms[self.pending]

    def observe(self, own_reward: float) -> float | None:
        """This round's own mean reward: the gain of the J played last round -> that gain (None at first)."""
        if not math.isfinite(own_reward):
            return None
        gain = None
        if self.pending is not None and self.baseline is not None:
            gain = own_reward - self.baseline
            g = self.config.discount
            self.plays = [g * n for n in self.plays]
            self.gains = [g * s for s in self.gains]
            self.plays[self.pending] += 1.0
            self.gains[self.pending] += gain
        rate = self.config.baseline_rate
        self.baseline = own_reward if self.baseline is None else (1 - rate) * self.baseline + rate * own_reward
        return gain

    def state_dict(self) -> dict[str, Any]:
        return {"arms": list(self.arms), "plays": list(self.plays), "gains": list(self.gains),
                "baseline": self.baseline, "pending": self.pending}

    def load_state(self, state: Any) -> None:
        """From a checkpoint; a state for other arms (J changed) or a malformed one starts afresh."""
        if not isinstance(state, dict) or state.get("arms") != list(self.arms):
            return
        plays, gains, baseline, pending = (state.get(k) for k in ("plays", "gains", "baseline", "pending"))

        def numbers(value: Any) -> TypeGuard[list[float]]:
            return isinstance(value, list) and len(value) == len(self.arms) and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in value)

        if not (numbers(plays) and numbers(gains)) or any(n < 0 for n in plays):
            return
        self.plays, self.gains = [float(x) for x in plays], [float(x) for x in gains]
        self.baseline = float(baseline) if isinstance(baseline, (int, float)) and math.isfinite(baseline) else None
        self.pending = pending if isinstance(pending, int) and 0 <= pending < len(self.arms) else None
