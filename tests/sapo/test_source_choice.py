"""The source chooser: Thompson draws on discounted Beta records, on hand-built outcomes."""

from __future__ import annotations

import random

import pytest

from engine.sapo.source_choice import SourceChoice, SourceRecord


def _fed(own: tuple[int, int], suggested: tuple[int, int], rounds: int = 20) -> SourceChoice:
    choice = SourceChoice()
    for _ in range(rounds):
        choice.observe("own_pick", own[0], own[1], 4.0 * own[0])
        choice.observe("suggested", suggested[0], suggested[1], 4.0 * suggested[0])
    return choice


def _mean_slots(choice: SourceChoice, slots: int = 2, at_most: int = 2, available: int = 5) -> float:
    rng = random.Random(0)
    return sum(choice.suggested_slots(slots, at_most, available, rng) for _ in range(2000)) / 2000


def test_a_source_that_yields_more_mixed_groups_gets_the_slots() -> None:
    assert _mean_slots(_fed(own=(1, 0), suggested=(1, 1))) > 1.8  # suggestions always mixed, own never
    assert _mean_slots(_fed(own=(1, 1), suggested=(1, 0))) < 0.2
    assert 0.6 < _mean_slots(SourceChoice()) < 1.4  # nothing known yet: a coin per slot


def test_yield_is_per_second_so_a_costly_source_must_pay_for_its_time() -> None:
    choice = SourceChoice()
    for _ in range(30):  # both mixed half the time, suggestions take 4x the seconds
        choice.observe("own_pick", 2, 1, 8.0)
        choice.observe("suggested", 2, 1, 32.0)
    assert _mean_slots(choice) < 0.3


def test_the_bounds_hold_whatever_the_records_say() -> None:
    choice = _fed(own=(1, 0), suggested=(1, 1))
    rng = random.Random(1)
    assert all(choice.suggested_slots(2, 1, 5, rng) <= 1 for _ in range(200))  # the config's bound
    assert all(choice.suggested_slots(2, 2, 0, rng) == 0 for _ in range(200))  # nothing on hand
    assert all(choice.suggested_slots(0, 2, 5, rng) == 0 for _ in range(200))


def test_the_discount_lets_a_source_that_stopped_paying_lose_its_slots() -> None:
    choice = _fed(own=(1, 0), suggested=(1, 1), rounds=30)
    for _ in range(40):  # then suggestions stop coming back mixed, own picks start to
        choice.observe("own_pick", 1, 1, 4.0)
        choice.observe("suggested", 1, 0, 4.0)
    assert _mean_slots(choice) < 0.2
    record = choice.records["suggested"]
    assert record.groups < 1 / (1 - choice.keep) + 1e-6  # bounded memory: a geometric sum


def test_bad_outcomes_and_states_are_refused_or_ignored() -> None:
    choice = SourceChoice()
    for args in (("elsewhere", 1, 0, 1.0), ("own_pick", 1, 2, 1.0), ("own_pick", -1, 0, 1.0), ("own_pick", 1, 0, -1.0)):
        with pytest.raises(ValueError):
            choice.observe(*args)
    with pytest.raises(ValueError):
        SourceChoice(keep=0.0)
    saved = _fed(own=(2, 1), suggested=(1, 1)).state_dict()
    restored = SourceChoice()
    restored.load_state(saved)
    assert restored.state_dict() == saved
    for junk in (None, [], {"own_pick": {"groups": "x"}}, {"own_pick": {"groups": 1e12, "mixed": 0, "seconds": 0}},
                 {"suggested": {"groups": True, "mixed": 0, "seconds": 0}}):
        fresh = SourceChoice()
        fresh.load_state(junk)
        assert fresh.records["own_pick"] == SourceRecord() and fresh.records["suggested"] == SourceRecord()
