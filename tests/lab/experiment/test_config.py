"""Arm and preset configuration: validation, names, eval schedule, preset shapes."""

from __future__ import annotations

import pytest

from lab.experiment.config import PAPER_SPLITS, ArmConfig, preset


@pytest.mark.parametrize("changes", [
    {"agents": 0}, {"local": 0}, {"external": -1}, {"agents": 1, "external": 2}, {"rounds": 0},
    {"setting": "mixed"}, {"mode": "sync"}, {"strategy": "greedy"}, {"kl_anchor": float("nan")},
    {"completions": 1}, {"completions": 17}, {"lr": 0.0}, {"lr": float("inf")}, {"agents": True},
    {"eval_every": -1}, {"mix": ""}, {"model": 3},
])
def test_bad_values_are_refused_with_value_error(changes: dict) -> None:
    with pytest.raises(ValueError):
        ArmConfig(**changes)


def test_labels_names_and_round_trip() -> None:
    arm = ArmConfig(local=4, external=4, strategy="plain", kl_anchor=0.04, seed=3, setting="heterogeneous")
    assert arm.label == "4/4 plain+kl0.04"
    assert "/" not in arm.name and " " not in arm.name
    assert ArmConfig(local=8, external=0).label == "8/0"
    assert ArmConfig.from_dict(arm.to_dict()) == arm
    with pytest.raises(ValueError, match="unknown"):
        ArmConfig.from_dict({**arm.to_dict(), "surprise": 1})
    with pytest.raises(ValueError):
        ArmConfig.from_dict([1, 2])


def test_eval_rounds_include_the_seed_every_m_and_the_last() -> None:
    assert ArmConfig(rounds=120, eval_every=50).eval_rounds() == [0, 50, 100, 120]
    assert ArmConfig(rounds=5, eval_every=0).eval_rounds() == [0, 5]


def test_paper_small_is_paired_and_covers_every_split_in_both_settings() -> None:
    p = preset("paper-small", model="/m")
    assert {(a.local, a.external) for a in p.arms} == set(PAPER_SPLITS)
    assert {a.setting for a in p.arms} == {"homogeneous", "heterogeneous"}
    seeds = {a.seed for a in p.arms}
    assert len(seeds) >= 3
    assert all(a.model == "/m" and a.local + a.external == 8 for a in p.arms)
    # Every (setting, seed) has all four splits: the comparisons are paired.
    for setting in ("homogeneous", "heterogeneous"):
        for seed in seeds:
            assert len([a for a in p.arms if a.setting == setting and a.seed == seed]) == 4
    # The first arms run the headline comparison (8/0 vs 4/4) so a cut-short run still pairs them.
    assert {a.label.split(" ")[0] for a in p.arms[:4]} == {"8/0", "4/4"}


def test_unknown_preset() -> None:
    with pytest.raises(ValueError, match="unknown"):
        preset("huge")
    assert len(preset("smoke").arms) == 4
    assert any(a.kl_anchor > 0 for a in preset("strategies").arms)


def test_names_distinguish_learning_rate_and_mode() -> None:
    base = ArmConfig()
    names = {base.name, base.replace(lr=3e-4).name, base.replace(mode="async").name}
    assert len(names) == 3
    assert len({a.name for a in preset("tuning").arms}) == 3
    assert all(a.seed == 0 for a in preset("tuning").arms)  # never a reported seed
