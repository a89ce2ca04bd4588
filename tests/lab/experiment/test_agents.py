"""Paired question draws and per-setting task mixes."""

from __future__ import annotations

import random

import pytest

from engine.tasks.library import preset
from lab.experiment.agents import PairedQuestions, agent_mixes, sampling_rng_seed


def test_arms_with_different_i_get_the_same_first_questions() -> None:
    mix = preset("rl")
    draws = {}
    for n in (8, 6, 4, 2):
        q = PairedQuestions(mix, seed=5, agent=1, dataset_seed=1000)
        q.start_round(7)
        draws[n] = q.sample_refs(random.Random(n), n, 1000)  # the trainer's rng must not matter
    for n in (6, 4, 2):
        assert draws[n] == draws[8][:n]
    assert len({r.specialty for r in draws[8][:6]}) == 6  # one question per specialty, as in the paper


def test_draws_depend_on_seed_agent_and_round() -> None:
    mix = preset("rl")

    def draw(seed: int, agent: int, round_no: int) -> list:
        return PairedQuestions(mix, seed, agent, 1000).start_round(round_no)

    assert draw(1, 0, 1) == draw(1, 0, 1)
    assert draw(1, 0, 1) != draw(1, 0, 2)
    assert draw(1, 0, 1) != draw(1, 1, 1)
    assert draw(1, 0, 1) != draw(2, 0, 1)
    assert sampling_rng_seed(1, 0, 1) == sampling_rng_seed(1, 0, 1) != sampling_rng_seed(1, 0, 2)


def test_sample_refs_refuses_more_than_drawn_or_another_dataset_seed() -> None:
    q = PairedQuestions(preset("rl"), 1, 0, 1000)
    with pytest.raises(ValueError):
        q.sample_refs(random.Random(0), 1, 1000)  # start_round not called
    q.start_round(1)
    with pytest.raises(ValueError):
        q.sample_refs(random.Random(0), 9, 1000)
    with pytest.raises(ValueError):
        q.sample_refs(random.Random(0), 2, 999)


def test_heterogeneous_agents_rotate_through_pairs_of_specialties() -> None:
    mix = preset("rl")
    names = list(mix.specialties)
    mixes = agent_mixes(mix, "heterogeneous", 4)
    assert [list(m.specialties) for m in mixes[:3]] == [names[0:2], names[2:4], names[4:6]]
    assert list(mixes[3].specialties) == names[0:2]
    assert all(m.specialties[s].config == mix.specialties[s].config for m in mixes for s in m.specialties)
    assert agent_mixes(mix, "homogeneous", 3) == [mix, mix, mix]
    with pytest.raises(ValueError):
        agent_mixes(mix, "other", 2)
