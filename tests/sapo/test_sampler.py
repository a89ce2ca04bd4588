"""I own + J external groups: the zero-advantage filter first, then a uniform draw."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from engine.sapo.records import Provenance, RolloutGroup
from engine.sapo.sampler import DROP_SAME_QUESTION, UniformSampler, make_sampler, select_groups
from engine.tasks.reference import TaskRef


def group(index: int, rewards: tuple[float, ...] | None, peer: str = "peer", question: str = "") -> RolloutGroup:
    prov = Provenance(peer, "seed", 1, 1, 0.0)
    g = RolloutGroup(TaskRef("bf", {}, 1, index), question or f"h{index}", tuple("abcd"[: len(rewards or (0, 0))]),
                     prov)
    return g if rewards is None else g.with_rewards(rewards)


def test_uniform_draw_is_uniform_and_without_replacement() -> None:
    rng = random.Random(0)
    candidates = [group(i, (1.0, 0.0)) for i in range(4)]
    counts: Counter[int] = Counter()
    for _ in range(4000):
        drawn = UniformSampler().draw(candidates, 2, rng)
        assert len({g.ref.index for g in drawn}) == 2
        counts.update(g.ref.index for g in drawn)
    assert all(abs(c / 8000 - 0.25) < 0.02 for c in counts.values())  # 2000 draws each, sd ~0.005
    assert UniformSampler().draw(candidates[:1], 5, rng) == candidates[:1]
    assert UniformSampler().draw(candidates, 0, rng) == []
    with pytest.raises(ValueError):
        make_sampler("top-k")


def test_filter_before_sampling_with_reasons() -> None:
    own = [group(0, (1.0, 0.0), "local"), group(1, (0.0, 0.0), "local")]
    mixed = [group(10 + i, (1.0, 0.0, 0.0, 1.0)) for i in range(3)]
    flat = [group(20, (1.0, 1.0)), group(21, (0.0, 0.0))]
    unscored = group(30, None)
    sel = select_groups(own, [*flat, *mixed, unscored], 2, UniformSampler(), random.Random(1))
    assert [g.ref.index for g in sel.own] == [0]
    assert len(sel.external) == 2 and all(g in mixed for g in sel.external)
    reasons = Counter(why for _, why in sel.dropped)
    assert reasons == {"zero_advantage": 3, "not_rescored": 1, "not_sampled": 1}  # own flat group counted
    # With the filter off, flat groups are eligible and own groups are all kept.
    off = select_groups(own, flat, 5, UniformSampler(), random.Random(1), filter_zero_advantage=False)
    assert len(off.own) == 2 and len(off.external) == 2


def test_one_origin_cannot_fill_a_rounds_external_groups() -> None:
    from engine.sapo.sampler import per_origin_cap

    loud = [group(40 + i, (1.0, 0.0), "loud") for i in range(20)]
    quiet = [group(60, (1.0, 0.0), "quiet"), group(61, (0.0, 1.0), "other")]
    for seed in range(20):
        sel = select_groups([], [*loud, *quiet], 4, UniformSampler(), random.Random(seed), max_origin_share=0.5)
        origins = Counter(g.provenance.origin_peer for g in sel.external)
        assert len(sel.external) == 4 and origins["loud"] == 2 and origins["quiet"] == origins["other"] == 1
    only = select_groups([], loud, 4, UniformSampler(), random.Random(0), max_origin_share=0.5)
    assert len(only.external) == 2  # the cap holds even when nobody else offers groups
    assert Counter(why for _, why in only.dropped) == {"not_sampled": 18}
    assert [per_origin_cap(j, 0.5) for j in (1, 2, 3, 4)] == [1, 1, 2, 2]
    assert per_origin_cap(4, 1.0) == 4


def test_at_most_one_peer_group_per_question_in_a_round() -> None:
    """Identities sending the same question cannot stack its weight: the second waits in the pool."""
    same = [group(i, (1.0, 0.0), peer=f"sybil-{i}", question="q") for i in range(3)]
    other = group(9, (1.0, 0.0), peer="honest")
    sel = select_groups([], same + [other], 3, UniformSampler(), random.Random(1))
    assert sorted(g.question_hash for g in sel.external) == ["h9", "q"]
    assert sorted(why for _, why in sel.dropped) == [DROP_SAME_QUESTION, DROP_SAME_QUESTION]
