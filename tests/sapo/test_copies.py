"""The copy screen's bound comes from this node's own groups with signal."""

from __future__ import annotations

import pytest

from engine.sapo.copies import CopiesConfig, CopyScreen, copy_share
from engine.sapo.own_sample import upper_quantile
from engine.sapo.records import Provenance, RolloutGroup
from engine.tasks.reference import TaskRef


def group(completions: tuple[str, ...], rewards: tuple[float, ...]) -> RolloutGroup:
    ref = TaskRef("basic_arithmetic", {}, 1, 0)
    return RolloutGroup(ref, "h", completions, Provenance("peer", "m", 0, 1, 0.0), rewards=rewards)


def test_copy_share_counts_respaced_and_recased_texts_as_copies() -> None:
    assert copy_share(("a b", "A  B", "ab\n", "c")) == 0.5
    assert copy_share(("x", "y", "z")) == 0.0
    assert copy_share(("x",)) == 0.0
    assert upper_quantile([0.0, 0.25, 0.5, 0.75], 0.99) == 0.75
    assert upper_quantile([0.0, 0.25, 0.5, 0.75], 0.5) == 0.25


def test_the_bound_is_the_own_groups_and_only_peers_with_signal_are_refused() -> None:
    screen = CopyScreen(CopiesConfig(min_own_groups=4, quantile=1.0))
    two_copies = group(("1", "1", "1", "2"), (1.0, 1.0, 1.0, 0.0))  # share 0.5
    assert screen.max_share() == 0.5 and not screen.refuses(two_copies)  # uncalibrated: half a group
    for _ in range(4):  # own sampling here: at most one copy in four
        screen.observe_own(group(("1", "1", "2", "3"), (1.0, 1.0, 0.0, 0.0)))
    screen.observe_own(group(("1", "1", "1", "1"), (1.0,) * 4))  # flat: says nothing about mixed groups
    assert screen.calibrated() and screen.max_share() == 0.25
    assert screen.refuses(two_copies)
    assert not screen.refuses(group(("1", "1", "2", "3"), (1.0, 1.0, 0.0, 0.0)))
    assert not screen.refuses(group(("1", "1", "1", "1"), (1.0,) * 4))  # no signal: the sampler drops it
    restored = CopyScreen(CopiesConfig(min_own_groups=4, quantile=1.0))
    restored.load_state(screen.state_dict())
    assert restored.max_share() == 0.25
    restored.load_state(["0.5", 2.0])  # a damaged checkpoint: start over, not crash
    assert not restored.calibrated()


@pytest.mark.parametrize("bad", [{"quantile": 1.5}, {"window": 0}, {"enabled": 1}, {"default_max_share": -0.1}])
def test_bad_copies_config_is_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match="copies"):
        CopiesConfig(**bad)
