"""Aggregation on hand-built arms: paired differences, the sum variant (a'), the table."""

from __future__ import annotations

import pytest

from lab.experiment.config import ArmConfig
from lab.experiment.report import arm_values, markdown_table, summarise


def _arm(local: int, external: int, seed: int, reward: float, groups: int, pass1: float) -> dict:
    cfg = ArmConfig(agents=2, local=local, external=external, rounds=2, seed=seed)
    rounds = [{"agent": str(a), "round": str(r), "reward_trained": str(reward), "groups_trained": str(groups)}
              for a in range(2) for r in (1, 2)]
    summary = {"cum_trained": 2 * reward, "cum_generated": 0.2, "updates_per_agent": 2.0,
               "groups_per_update": float(groups), "external_per_update": float(external),
               "evals": {"0": {"pass1_all": 0.1}, "2": {"pass1_all": pass1, "pass1_peer": None}}}
    return {"cfg": cfg, "summary": summary, "rounds": rounds, "evals": []}


def test_sum_variant_grows_with_groups_trained_while_the_mean_does_not() -> None:
    solo, shared = arm_values(_arm(8, 0, 1, 0.25, 3, 0.1)), arm_values(_arm(4, 4, 1, 0.25, 6, 0.1))
    assert solo["cum_trained"] == shared["cum_trained"] == pytest.approx(0.5)
    assert solo["cum_trained_sum"] == pytest.approx(2 * 0.25 * 3)
    assert shared["cum_trained_sum"] == pytest.approx(2 * solo["cum_trained_sum"])


def test_paired_differences_use_the_same_seed_and_setting() -> None:
    arms = [_arm(8, 0, 1, 0.25, 3, 0.10), _arm(8, 0, 2, 0.25, 3, 0.20),
            _arm(4, 4, 1, 0.25, 5, 0.13), _arm(4, 4, 2, 0.25, 5, 0.21)]
    summary = summarise(arms)["homogeneous"]
    diff = summary["4/4 positive-only"]["vs_8_0"]["pass1_all"]
    assert diff["n"] == 2
    assert diff["mean"] == pytest.approx(0.02)
    assert diff["min"] == pytest.approx(0.01)
    assert "vs_8_0" not in summary["8/0"]
    table = markdown_table({"homogeneous": summary})
    assert "| homogeneous | 4/4 positive-only | 2 | 1093.31 |" in table
    assert "+95%" in table  # the paper's own 4/4 vs 8/0 ratio, printed beside ours
