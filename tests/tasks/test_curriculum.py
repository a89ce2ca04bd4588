"""The adaptive curriculum: ladders that generate and verify, moves that keep the pass rate in a band."""

from __future__ import annotations

import pytest

from engine.tasks import preset, regenerate, verify
from engine.tasks.curriculum import (
    ENTRY_RUNG,
    LADDERS,
    LADDERS_ID,
    Curriculum,
    CurriculumConfig,
    entry_rung,
    entry_settings,
    is_rung,
    next_rung,
    rung_of,
)
from engine.tasks.reference import TaskRef


def test_every_rung_generates_and_a_peers_rung_verifies() -> None:
    for specialty, ladder in LADDERS.items():
        assert len(ladder) >= 3, specialty
        for i, config in enumerate(ladder):
            assert rung_of(specialty, config) == i
            question = regenerate(TaskRef(specialty, dict(config), 5, 17))
            assert question.answer is not None and question.text
            # A peer at any rung: the receiver regenerates the question (its mix need not hold that rung).
            assert verify(question.ref, question.hash, preset("rl")) is not None


def test_settings_off_the_ladder_are_still_refused() -> None:
    huge = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 900}
    ref = TaskRef("basic_arithmetic", huge, 5, 17)
    assert not is_rung("basic_arithmetic", huge)
    assert verify(ref, "0" * 64) is None  # never generated: a peer can't make us build huge questions
    assert rung_of("binary_matrix", LADDERS["basic_arithmetic"][0]) is None  # rungs belong to their specialty


def test_rungs_get_harder() -> None:
    first, last = LADDERS["basic_arithmetic"][0], LADDERS["basic_arithmetic"][-1]
    assert first["max_digits"] < last["max_digits"] and first["max_terms"] < last["max_terms"]
    assert LADDERS["base_conversion"][0]["max_value"] < LADDERS["base_conversion"][-1]["max_value"]


@pytest.mark.parametrize(("rate", "rung", "expected"), [
    (0.9, 0, 1), (0.9, 4, 4), (0.1, 2, 1), (0.1, 0, 0), (0.5, 2, 2), (0.25, 2, 2), (0.65, 2, 2)])
def test_next_rung_keeps_the_pass_rate_in_the_band(rate: float, rung: int, expected: int) -> None:
    assert next_rung(rate, rung, 5, low=0.25, high=0.65) == expected


def test_curriculum_moves_on_a_full_window_and_judges_each_rung_afresh() -> None:
    cur = Curriculum(CurriculumConfig(enabled=True, window=16), ["basic_arithmetic", "calendar_arithmetic"])
    entry = entry_rung("basic_arithmetic")
    assert cur.rungs == {"basic_arithmetic": entry, "calendar_arithmetic": entry_rung("calendar_arithmetic")}
    assert cur.observe("basic_arithmetic", (1.0,) * 8) is None  # half a window: no verdict yet
    assert cur.observe("basic_arithmetic", (1.0,) * 7 + (0.0,)) == entry + 1  # 15/16 solved: up
    assert cur.pass_rates()["basic_arithmetic"] == 0.0  # the new rung starts with an empty window
    assert cur.observe("basic_arithmetic", (0.0,) * 16) == entry  # nothing solved: back down
    assert cur.observe("basic_arithmetic", (1.0, 0.0) * 8) is None  # 0.5 is in the band: stays
    assert cur.observe("basic_arithmetic", (0.0,) * 16) == entry - 1  # below the entry rung: easier still
    assert cur.observe("basic_arithmetic", (0.0,) * 16) is None  # the easiest rung is the floor
    assert cur.observe("unknown", (1.0,) * 64) is None
    mix = cur.apply(preset("rl"))
    assert mix.specialties["basic_arithmetic"].config == LADDERS["basic_arithmetic"][0]
    assert mix.specialties["basic_arithmetic"].weight == preset("rl").specialties["basic_arithmetic"].weight
    assert set(mix.specialties) == set(preset("rl").specialties)
    ref = mix.sample_refs(__import__("random").Random(1), 6, 3)[0]
    assert rung_of(ref.specialty, ref.config) is not None  # every group says its rung


def test_entry_rungs_are_the_judges_settings_with_easier_rungs_below() -> None:
    # The held-out judge (bench real-learning) uses the entry rungs: these were the easiest rungs before
    # easier ones went in below them, so before/after numbers stay comparable across versions.
    assert entry_settings("basic_arithmetic")["operators"] == ["+", "-"]
    assert entry_settings("decimal_arithmetic")["max_num_decimal_places"] == 1
    assert entry_settings("fraction_simplification")["max_factor"] == 3
    assert entry_settings("base_conversion")["max_value"] == 10
    for specialty, entry in ENTRY_RUNG.items():
        assert 0 < entry < len(LADDERS[specialty]) - 1, specialty  # room to move either way
    assert entry_rung("binary_matrix") == 0
    cur = Curriculum(CurriculumConfig(enabled=True, start_rung=1), ["decimal_arithmetic", "binary_matrix"])
    assert cur.rungs == {"decimal_arithmetic": entry_rung("decimal_arithmetic") + 1, "binary_matrix": 1}


def test_the_entry_rung_can_be_the_floor() -> None:
    cur = Curriculum(CurriculumConfig(enabled=True, window=4, below_entry=False), ["fraction_simplification"])
    assert cur.observe("fraction_simplification", (0.0,) * 4) is None  # all wrong, yet it stays
    assert cur.rungs["fraction_simplification"] == entry_rung("fraction_simplification")


def test_a_checkpoint_under_other_ladders_is_not_restored() -> None:
    cfg = CurriculumConfig(enabled=True, window=4)
    cur = Curriculum(cfg, ["basic_arithmetic"])
    cur.observe("basic_arithmetic", (1.0,) * 4)
    state = cur.state_dict()
    older = {k: v for k, v in state.items() if k != "ladders"}  # saved before the ladders had an id
    again = Curriculum(cfg, ["basic_arithmetic"])
    again.load_state(older)
    assert again.rungs == {"basic_arithmetic": entry_rung("basic_arithmetic")}  # indices of other ladders
    again.load_state(state)
    assert again.rungs == cur.rungs


def test_curriculum_state_round_trips_and_ignores_garbage() -> None:
    cfg = CurriculumConfig(enabled=True, window=4)
    cur = Curriculum(cfg, ["basic_arithmetic", "base_conversion"])
    cur.observe("basic_arithmetic", (1.0, 1.0, 1.0, 1.0))
    cur.observe("base_conversion", (1.0, 0.0))
    again = Curriculum(cfg, ["basic_arithmetic", "base_conversion"])
    again.load_state(cur.state_dict())
    assert again.state_dict() == cur.state_dict()
    again.load_state({"rungs": {"basic_arithmetic": 999, "base_conversion": "x"}, "recent": {"base_conversion": [7]},
                      "ladders": LADDERS_ID})
    assert again.rungs == cur.rungs
    again.load_state(None)


def test_disabled_curriculum_leaves_the_mix_alone() -> None:
    cur = Curriculum(CurriculumConfig(), ["basic_arithmetic"])
    assert cur.apply(preset("rl")) is preset("rl") or cur.apply(preset("rl")) == preset("rl")
    assert cur.observe("basic_arithmetic", (1.0,) * 100) is None


@pytest.mark.parametrize("bad", [{"low": 0.7, "high": 0.6}, {"low": -0.1}, {"window": 1}, {"enabled": 1},
                                 {"below_entry": "no"},
                                 {"high": float("nan")}])
def test_curriculum_config_is_validated(bad: dict) -> None:
    with pytest.raises(ValueError):
        CurriculumConfig(**bad)
