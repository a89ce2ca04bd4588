"""A peer group's weight in the step, on hand-built rows: subsampled to G, its mass capped at one own
group's, the denominator floored, and each group's share of the step budget."""

from __future__ import annotations

import pytest

from engine.sapo.peer_weight import (
    cap_peer_mass,
    floor_peer_rows,
    group_masses,
    loss_shares,
    step_floor,
    subsample_group,
    unit_mass,
)
from engine.sapo.records import Provenance, RolloutGroup
from engine.sapo.update import TrainRow
from engine.tasks.reference import TaskRef


def row(adv: float, tokens: int, source: int = -1) -> TrainRow:
    return TrainRow((1, 2), tuple(range(3, 3 + tokens)), adv, source >= 0, None, source)


def test_a_larger_group_is_subsampled_the_same_way_each_time() -> None:
    texts = tuple(f"answer {i}" for i in range(64))
    group = RolloutGroup(TaskRef("basic_arithmetic", {}, 1, 1), "0" * 64, texts, Provenance("p", "seed", 1, 1, 0.0)
                         ).with_rewards(tuple(float(i % 2) for i in range(64)))
    small = subsample_group(group, 16)
    assert len(small.completions) == 16 and set(small.completions) <= set(texts)
    assert all(float(int(c.split()[1]) % 2) == r for c, r in zip(small.completions, small.rewards or ()))
    assert subsample_group(group, 16) == small  # the same content, the same subsample
    assert subsample_group(small, 16) is small


def test_a_peer_group_holds_at_most_one_own_groups_mass() -> None:
    unit = unit_mass(4, [5, 5, 5, 5])  # G = 4 completions of 5 tokens: U = 20
    assert unit == 20.0
    own = [row(1.0, 5), row(-1.0, 5), row(1.0, 5), row(-1.0, 5)]  # mass 20
    flood = [row(3.0, 24, source=0) for _ in range(16)]  # mass 16 x 72 = 1152
    honest = [row(0.5, 4, source=1), row(-0.5, 4, source=1)]  # mass 4: untouched
    rows = own + flood + honest
    keep = [True] * len(rows)
    assert group_masses(rows, keep) == {0: 1152.0, 1: 4.0}
    capped = cap_peer_mass(rows, unit, keep)
    assert group_masses(capped, keep) == pytest.approx({0: 20.0, 1: 4.0})
    assert capped[:4] == own and capped[-2:] == honest  # own rows and light groups as they were
    assert all(r.advantage > 0 for r in capped[4:20])  # scaled, never flipped
    # Own groups flat (no own rows): the floor of (I + J) x U keeps the flood at 1 / (I + J).
    flat_round = cap_peer_mass(flood + honest, unit, [True] * 18)
    shares = loss_shares(flat_round, step_floor(4, unit), [True] * 18)
    assert shares[0] == pytest.approx(20.0 / 80.0) and shares[1] == pytest.approx(4.0 / 80.0)


def test_rows_the_strategy_leaves_out_weigh_nothing() -> None:
    rows = [row(2.0, 10, source=0), row(-2.0, 10, source=0)]
    assert group_masses(rows, [True, False]) == {0: 20.0}
    assert loss_shares(rows, 0.0, [False, False]) == {}


def test_peers_rows_are_divided_by_at_least_the_floor_and_own_rows_as_before() -> None:
    rows = [row(1.0, 5), row(-1.0, 5), row(2.0, 10, source=0)]
    floored = floor_peer_rows(rows, denominator=20.0, floor=80.0)  # D = 20 tokens, F = 80
    assert floored[:2] == rows[:2] and floored[2].advantage == 2.0 * 20.0 / 80.0
    assert floor_peer_rows(rows, denominator=100.0, floor=80.0) == rows  # D above the floor: unchanged
