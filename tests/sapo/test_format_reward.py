"""The format warm-up: a bonus for a well-formed answer that fades to zero, kept apart from correctness."""

from __future__ import annotations

import pytest

from engine.sapo.records import Provenance, RolloutGroup
from engine.sapo.trainer import shape_rewards
from engine.tasks import format_weight_at
from engine.tasks.reference import TaskRef


@pytest.mark.parametrize(("round_no", "expected"), [(1, 0.5), (2, 0.45), (6, 0.25), (10, 0.05), (11, 0.0), (50, 0.0)])
def test_format_weight_fades_linearly_to_zero(round_no: int, expected: float) -> None:
    assert format_weight_at(round_no, 0.5, 10) == pytest.approx(expected)


def test_format_weight_off() -> None:
    assert format_weight_at(1, 0.0, 10) == 0.0 and format_weight_at(1, 0.5, 0) == 0.0


def test_shaped_rewards_add_the_bonus_to_well_formed_completions_only() -> None:
    group = RolloutGroup(TaskRef("basic_arithmetic", {}, 1, 1), "h", ("<answer>9</answer>", "<answer>8</answer>",
                                                                    "nine", "<answer>9"),
                         Provenance.local("seed", 0, 1)).with_rewards((1.0, 0.0, 0.0, 0.0))
    shaped = shape_rewards(group, 0.25)
    assert shaped.rewards == (1.25, 0.25, 0.0, 0.0)
    assert group.rewards == (1.0, 0.0, 0.0, 0.0)  # the correctness record is untouched
    assert shape_rewards(group, 0.0) is group
