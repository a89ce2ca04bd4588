"""The three measures, as small pure functions (no torch, no I/O).

(a) trained_on_reward: the paper's quantity. Per agent and round, the mean reward over every
    completion of every group that entered the update (own groups that passed the zero-advantage
    filter + the external groups drawn). A round with no such group contributes 0. SAPO draws
    external groups only from peers' non-zero-advantage groups, so (a) rises with J by selection
    alone: it is reported because the paper reports it, not as evidence of learning.
(b) generated_reward: the mean reward over every completion the agent generated itself this round
    (all I own groups, before any filter). Unbiased by the filter: the policy's own solve rate on
    fresh training questions.
(c) held-out pass@1 / pass@k on a fixed judge set (engine.evaluation), split into specialties the
    agent generates and those it sees only from peers.
Cumulative = sum over rounds of the agent-averaged per-round value (the paper sums over agents and
rounds; dividing by N gives the same ranking and a per-agent scale; both are reported).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

SOLVED = 1.0 - 1e-6


def mean_or(values: Sequence[float], default: float = 0.0) -> float:
    return statistics.fmean(values) if values else default


def has_signal(rewards: Sequence[float], tol: float = 1e-9) -> bool:
    """The zero-advantage filter on one group: True when its rewards are not all equal."""
    return len(rewards) >= 2 and max(rewards) - min(rewards) > tol


def trained_on_reward(own_rewards: Sequence[Sequence[float]], used_external_rewards: Sequence[Sequence[float]],
                      ) -> tuple[float, int]:
    """(a) -> (mean reward over completions of groups trained on, number of such groups).

    own_rewards: per own group, its L rewards (the filter is applied here, as the trainer does);
    used_external_rewards: per external group drawn into the update, its L local rewards.
    """
    groups = [list(g) for g in own_rewards if has_signal(g)] + [list(g) for g in used_external_rewards]
    flat = [r for g in groups for r in g]
    return mean_or(flat), len(groups)


def generated_reward(own_rewards: Sequence[Sequence[float]]) -> float:
    """(b) -> mean reward over every completion the agent generated (no filter)."""
    return mean_or([r for g in own_rewards for r in g])


def split_pass(per_specialty: Mapping[str, Mapping[str, float]], generated: Iterable[str],
               ) -> dict[str, float]:
    """(c) -> question-weighted pass@1 / pass@k / malformed over all specialties, the generated ones,
    and the peer-only ones. per_specialty[name] holds n_questions, pass1, passk, malformed_rate.
    A split with no specialty gets NaN (e.g. peer-only in the homogeneous setting)."""
    gen = set(generated)
    out: dict[str, float] = {}
    for split, names in (("all", list(per_specialty)), ("gen", [s for s in per_specialty if s in gen]),
                         ("peer", [s for s in per_specialty if s not in gen])):
        n = sum(per_specialty[s]["n_questions"] for s in names)
        for key in ("pass1", "passk", "malformed_rate"):
            total = sum(per_specialty[s][key] * per_specialty[s]["n_questions"] for s in names)
            out[f"{key}_{split}"] = total / n if n else math.nan
    return out


def agent_average(rows: Sequence[Mapping[str, Any]], key: str, rounds: int) -> list[float]:
    """Per round 1..rounds: the mean over agents of rows[key] (rows carry "round")."""
    by_round: dict[int, list[float]] = {}
    for row in rows:
        by_round.setdefault(int(row["round"]), []).append(float(row[key]))
    return [mean_or(by_round.get(r, [])) for r in range(1, rounds + 1)]


def agent_band(rows: Sequence[Mapping[str, Any]], key: str, rounds: int, window: int,
               ) -> tuple[list[float], list[float], list[float]]:
    """Fig. 2's curves: per round, the moving average (over `window` rounds) of the agent-average,
    and the min and max over agents of each agent's own moving average -> (mean, low, high)."""
    agents = sorted({int(r["agent"]) for r in rows})
    per_agent = [moving_average(agent_average([r for r in rows if int(r["agent"]) == a], key, rounds), window)
                 for a in agents]
    mean = moving_average(agent_average(rows, key, rounds), window)
    low = [min(v[i] for v in per_agent) for i in range(rounds)] if per_agent else []
    high = [max(v[i] for v in per_agent) for i in range(rounds)] if per_agent else []
    return mean, low, high


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average; the first window-1 points average what exists so far.  [R] -> [R]."""
    if window < 1:
        raise ValueError("window must be >= 1")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def cumulative(values: Iterable[float]) -> float:
    return math.fsum(values)


def spread(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample standard deviation, min and max over seeds (NaN-free input)."""
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return {"mean": math.nan, "sd": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {"mean": statistics.fmean(vals), "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "min": min(vals), "max": max(vals), "n": len(vals)}


def paired_differences(arm: Mapping[int, float], baseline: Mapping[int, float]) -> dict[str, float]:
    """Per-seed differences arm - baseline on the seeds both have -> spread of the differences."""
    seeds = sorted(set(arm) & set(baseline))
    return spread([arm[s] - baseline[s] for s in seeds])
