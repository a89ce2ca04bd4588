"""The three measures and the aggregation helpers on hand-built values."""

from __future__ import annotations

import math

import pytest

from lab.experiment import measures


def test_trained_on_reward_applies_the_filter_to_own_groups_and_counts_external_groups() -> None:
    own = [[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]]  # only the last own group has signal
    external = [[1, 1, 0, 1]]  # drawn by the sampler: enters whole
    value, groups = measures.trained_on_reward(own, external)
    assert groups == 2
    assert value == pytest.approx((1 + 3) / 8)


def test_trained_on_reward_is_zero_without_any_trained_group() -> None:
    assert measures.trained_on_reward([[0, 0], [1, 1]], []) == (0.0, 0)


def test_generated_reward_is_unfiltered_and_differs_from_trained_on() -> None:
    own = [[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]]
    assert measures.generated_reward(own) == pytest.approx(5 / 12)
    # The selection effect the issue warns about: same generations, higher "trained-on" reward.
    assert measures.trained_on_reward(own, [[1, 1, 1, 0]])[0] > measures.generated_reward(own)


def test_split_pass_weighs_by_questions_and_separates_peer_only_specialties() -> None:
    per = {"a": {"n_questions": 10, "pass1": 0.5, "passk": 1.0, "malformed_rate": 0.0},
           "b": {"n_questions": 30, "pass1": 0.1, "passk": 0.5, "malformed_rate": 0.2}}
    out = measures.split_pass(per, ["a"])
    assert out["pass1_all"] == pytest.approx((5 + 3) / 40)
    assert out["pass1_gen"] == pytest.approx(0.5)
    assert out["pass1_peer"] == pytest.approx(0.1)
    assert out["malformed_rate_peer"] == pytest.approx(0.2)
    homogeneous = measures.split_pass(per, ["a", "b"])
    assert math.isnan(homogeneous["pass1_peer"])


def test_moving_average_is_trailing_and_validated() -> None:
    assert measures.moving_average([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]
    assert measures.moving_average([2, 4], 5) == [2, 3]
    with pytest.raises(ValueError):
        measures.moving_average([1], 0)


def test_agent_average_and_band() -> None:
    rows = [{"agent": 0, "round": 1, "x": 0.0}, {"agent": 1, "round": 1, "x": 1.0},
            {"agent": 0, "round": 2, "x": 0.5}, {"agent": 1, "round": 2, "x": 0.5}]
    assert measures.agent_average(rows, "x", 2) == [0.5, 0.5]
    mean, low, high = measures.agent_band(rows, "x", 2, window=1)
    assert mean == [0.5, 0.5]
    assert low == [0.0, 0.5]
    assert high == [1.0, 0.5]


def test_spread_and_paired_differences_use_common_seeds_only() -> None:
    s = measures.spread([1.0, 3.0, math.nan])
    assert (s["mean"], s["n"], s["min"], s["max"]) == (2.0, 2, 1.0, 3.0)
    assert s["sd"] == pytest.approx(math.sqrt(2))
    d = measures.paired_differences({1: 0.5, 2: 0.7, 3: 0.9}, {1: 0.4, 2: 0.8})
    assert d["n"] == 2
    assert d["mean"] == pytest.approx(0.0)
    assert measures.spread([])["n"] == 0


def test_peer_only_split_leaves_out_what_no_peer_generates() -> None:
    per = {name: {"n_questions": 1, "pass1": p, "passk": p, "malformed_rate": 0.0}
           for name, p in (("a", 1.0), ("b", 0.5), ("c", 0.0))}
    out = measures.split_pass(per, ["a"], ["b"])
    assert out["pass1_peer"] == pytest.approx(0.5)
    assert out["pass1_all"] == pytest.approx(0.5)
