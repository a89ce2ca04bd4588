"""Learning curves and the equal-CPU comparison of `sapo bench swarm-learning` (lab/bench/swarm_learning.py).

An arm that costs more CPU per round than solo is read against solo's (and question's, text's) measured
curve at the same CPU-seconds per node, paired by seed: never extrapolated beyond the longest run.
"""

from __future__ import annotations

import statistics
from typing import Any

CURVE_ARMS = ("solo", "question", "text")  # arms whose learning curve (from their -long runs) others meet at equal CPU


def learning_curves(runs: list[dict[str, Any]], base: float) -> dict[tuple[str, str, int], list[tuple[float, float]]]:
    """Measured (CPU-seconds per node, held-out pass@1) points per (arm, setting, seed) for the CURVE_ARMS:
    the start (0 CPU-s, the judge before) and every judge along their -long run. Only the -long runs: a
    curve's points share one run's conditions (CPU time inflates when other work shares the cores, and
    runs of one arm made on other days with other neighbours measured 30 rounds at 183 and at 277 CPU-s)."""
    curves: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for run_ in runs:
        name = run_["arm"].removesuffix("-long")
        if name not in CURVE_ARMS or not run_["arm"].endswith("-long"):
            continue
        points = curves.setdefault((name, run_["setting"], run_["seed"]), [(0.0, base)])
        for mark in [*run_.get("midway", []), run_]:
            points.append((statistics.fmean(mark["cpu_seconds"]),
                           statistics.fmean(j["pass_at_1"] for j in mark["after"])))
    return {key: _merge_near(sorted(points)) for key, points in curves.items()}


def curves_json(curves: dict[tuple[str, str, int], list[tuple[float, float]]]) -> list[dict[str, Any]]:
    return [{"arm": arm, "setting": setting, "seed": seed, "cpu_seconds": [c for c, _ in points],
             "pass_at_1": [v for _, v in points]} for (arm, setting, seed), points in sorted(curves.items())]


def _merge_near(points: list[tuple[float, float]], within: float = 0.05) -> list[tuple[float, float]]:
    """Points within 5% CPU of each other (the same round count measured twice) averaged into one, so
    that the judge's noise between two runs is not read as a slope."""
    merged: list[list[tuple[float, float]]] = []
    for point in points:
        if merged and point[0] <= merged[-1][0][0] * (1 + within):
            merged[-1].append(point)
        else:
            merged.append([point])
    return [(statistics.fmean(c for c, _ in m), statistics.fmean(v for _, v in m)) for m in merged]


def curve_at(points: list[tuple[float, float]], cpu: float) -> float | None:
    """A curve's pass@1 at `cpu` CPU-seconds, linear between its two nearest measured points; None beyond
    its longest run: an extrapolation is not a result."""
    if not points or cpu > points[-1][0] * 1.02:  # 2%: the same round count measures a little apart
        return None
    below = [p for p in points if p[0] <= cpu] or points[:1]
    above = [p for p in points if p[0] >= cpu] or points[-1:]
    (c0, v0), (c1, v1) = below[-1], above[0]
    return v0 if c1 <= c0 else v0 + (v1 - v0) * (cpu - c0) / (c1 - c0)


def equal_cpu(per_seed: dict[int, dict[str, Any]], curves: dict[tuple[str, str, int], list[tuple[float, float]]],
              setting: str, against: str = "solo") -> dict[str, Any]:
    """The arm against `against`'s curve at the same CPU-seconds per node, paired by seed, at the arm's
    latest judge inside that curve (a -long arm's end may lie a little past the other's: then its judge
    before); None where none is inside. Keys delta_vs_{against}_equal_cpu_{per_seed,at_cpu,mean,sd}."""
    deltas: list[float | None] = []
    at_cpu: list[float | None] = []
    for seed in sorted(per_seed):
        curve = curves.get((against, setting, seed), [])
        read = [(cpu, value, curve_at(curve, cpu)) for cpu, value in per_seed[seed].get("judged", [])]
        inside = [(cpu, value - at) for cpu, value, at in read if at is not None]
        deltas.append(inside[-1][1] if inside else None)
        at_cpu.append(inside[-1][0] if inside else None)
    known = [d for d in deltas if d is not None]
    key = f"delta_vs_{against}_equal_cpu"
    complete = len(known) == len(deltas)
    return {f"{key}_per_seed": deltas, f"{key}_at_cpu": at_cpu,
            f"{key}_mean": statistics.fmean(known) if complete and known else None,
            f"{key}_sd": statistics.stdev(known) if complete and len(known) > 1 else None,
            f"{key}_ci95": t_interval(known) if complete else None}


# Student's t, two-sided 95%, by degrees of freedom (beyond the table: the normal's 1.96, within 2%
# from 30 on): the interval over seeds carries the seeds' own spread at the few seeds a bench can run.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t_interval(values: list[float]) -> list[float] | None:
    """[lo, hi] of the 95% t-interval of the mean of `values` (None below 2 values)."""
    n = len(values)
    if n < 2:
        return None
    df = n - 1
    t = _T975.get(df) or next((v for k, v in sorted(_T975.items()) if k >= df), 1.96)
    half = t * statistics.stdev(values) / n ** 0.5
    mean = statistics.fmean(values)
    return [mean - half, mean + half]
