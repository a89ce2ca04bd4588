"""I own + J external groups: the zero-advantage filter first, then a uniform draw."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from engine.sapo.records import CandidateKey, Provenance, RolloutGroup, content_key
from engine.sapo.reputation import Reputation
from engine.sapo.sampler import DROP_SAME_QUESTION, Drawable, UniformSampler, make_sampler, select_groups
from engine.tasks.reference import TaskRef


def own(index: int, rewards: tuple[float, ...]) -> RolloutGroup:
    g = RolloutGroup(TaskRef("bf", {}, 1, index), f"h{index}", tuple("abcd"[: len(rewards)]),
                     Provenance("local", "seed", 1, 1, 0.0))
    return g.with_rewards(rewards)


def group(index: int, rewards: tuple[float, ...] | None, peer: str = "peer", question: str = "") -> Drawable:
    prov = Provenance(peer, "seed", 1, 1, 0.0)
    g = RolloutGroup(TaskRef("bf", {}, 1, index), question or f"h{index}", tuple("abcd"[: len(rewards or (0, 0))]),
                     prov)
    g = g if rewards is None else g.with_rewards(rewards)
    return Drawable(content_key(g), g)


def keys(drawn: list[Drawable]) -> set[CandidateKey]:
    return {d.key for d in drawn}


def test_uniform_draw_is_uniform_and_without_replacement() -> None:
    rng = random.Random(0)
    candidates = [group(i, (1.0, 0.0)) for i in range(4)]
    counts: Counter[int] = Counter()
    for _ in range(4000):
        drawn = UniformSampler().draw(candidates, 2, rng)
        assert len({d.group.ref.index for d in drawn}) == 2
        counts.update(d.group.ref.index for d in drawn)
    assert all(abs(c / 8000 - 0.25) < 0.02 for c in counts.values())  # 2000 draws each, sd ~0.005
    assert UniformSampler().draw(candidates[:1], 5, rng) == candidates[:1]
    assert UniformSampler().draw(candidates, 0, rng) == []
    with pytest.raises(ValueError):
        make_sampler("top-k", Reputation())
    assert make_sampler("uniform", Reputation()).name == "uniform"


def test_filter_before_sampling_with_reasons() -> None:
    ours = [own(0, (1.0, 0.0)), own(1, (0.0, 0.0))]
    mixed = [group(10 + i, (1.0, 0.0, 0.0, 1.0)) for i in range(3)]
    flat = [group(20, (1.0, 1.0)), group(21, (0.0, 0.0))]
    unscored = group(30, None)
    sel = select_groups(ours, [*flat, *mixed, unscored], 2, UniformSampler(), random.Random(1))
    assert sel.own == [0]  # own groups by their index: the flat one is left out
    assert len(sel.external) == 2 and all(d in mixed for d in sel.external)
    reasons = Counter(why for _, why in sel.dropped)
    assert reasons == {"zero_advantage": 2, "not_rescored": 1, "not_sampled": 1}  # peers' groups, by key
    assert {k for k, _ in sel.dropped} == keys([*flat, *mixed, unscored]) - keys(sel.external)
    # With the filter off, flat groups are eligible and own groups are all kept.
    off = select_groups(ours, flat, 5, UniformSampler(), random.Random(1), filter_zero_advantage=False)
    assert off.own == [0, 1] and len(off.external) == 2


def test_one_origin_cannot_fill_a_rounds_external_groups() -> None:
    from engine.sapo.sampler import per_origin_cap

    loud = [group(40 + i, (1.0, 0.0), "loud") for i in range(20)]
    quiet = [group(60, (1.0, 0.0), "quiet"), group(61, (0.0, 1.0), "other")]
    for seed in range(20):
        sel = select_groups([], [*loud, *quiet], 4, UniformSampler(), random.Random(seed), max_origin_share=0.5)
        origins = Counter(d.origin for d in sel.external)
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
    assert sorted(d.group.question_hash for d in sel.external) == ["h9", "q"]
    assert sorted(why for _, why in sel.dropped) == [DROP_SAME_QUESTION, DROP_SAME_QUESTION]
