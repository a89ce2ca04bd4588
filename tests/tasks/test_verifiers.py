"""Every specialty's verifier on right / wrong / malformed / empty answers (real RG scorers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.tasks import SPECIALTIES, Question, demonstration, heldout, preset, score
from engine.tasks.specialties import WEEKDAYS, wrap_answer


def _truth(q: Question) -> str:
    return q.answer if q.answer is not None else q.entry["metadata"]["example_answer"]


def _wrong(q: Question) -> str:
    """A plausible but wrong answer, per specialty."""
    m, truth = q.entry["metadata"], _truth(q)
    if q.specialty in ("basic_arithmetic", "base_conversion"):
        return str(int(truth) + 1)
    if q.specialty == "decimal_arithmetic":
        return str(float(truth) + 1.5)
    if q.specialty == "fraction_simplification":
        return f"{m['simplified_numerator'] + 1}/{m['simplified_denominator']}"
    if q.specialty == "arc_1d":
        cells = truth.split()
        return " ".join(cells[1:] + cells[:1]) if len(set(cells)) > 1 else " ".join(["9"] * len(cells))
    if q.specialty == "bf":
        return truth[::-1] + "x"
    if q.specialty == "propositional_logic":
        return "(P ∧ ¬P)"  # a contradiction follows from consistent premises never
    if q.specialty == "calendar_arithmetic":
        if truth in ("Yes", "No"):
            return "No" if truth == "Yes" else "Yes"
        return WEEKDAYS[(WEEKDAYS.index(truth) + 1) % 7]
    if q.specialty == "binary_matrix":
        return truth.replace("0", "7", 1)
    raise AssertionError(q.specialty)


QUESTIONS = heldout(preset("seed-easy"), 6, 3)


def _by_specialty(name: str) -> list[Question]:
    return [q for q in QUESTIONS if q.specialty == name]


@pytest.mark.parametrize("specialty", SPECIALTIES)
def test_right_answers_score_one(specialty: str) -> None:
    for q in _by_specialty(specialty):
        assert score(q, wrap_answer(_truth(q))) == 1.0, q.text
        assert score(q, "some words first " + demonstration(q)) == 1.0


@pytest.mark.parametrize("specialty", SPECIALTIES)
def test_wrong_answers_score_zero(specialty: str) -> None:
    for q in _by_specialty(specialty):
        assert score(q, wrap_answer(_wrong(q))) == 0.0, (q.text, _wrong(q))
        # The last answer block counts: a right answer followed by a wrong one is wrong.
        assert score(q, wrap_answer(_truth(q)) + " " + wrap_answer(_wrong(q))) == 0.0


@pytest.mark.parametrize("specialty", SPECIALTIES)
def test_malformed_and_empty_score_zero(specialty: str) -> None:
    for q in _by_specialty(specialty):
        truth = _truth(q)
        for bad in (truth, f"<answer>{truth}", f"{truth}</answer>", f"<answer {truth}</answer>",
                    f"<answer>{truth}<answer></answer>", "", "<answer></answer>", "<answer>   </answer>",
                    wrap_answer(truth) + " " * 9000):
            assert score(q, bad) == 0.0, (specialty, bad[:60])
            assert score(q, bad, partial_credit=True) <= 0.05 or bad == truth


def test_partial_credit_only_when_asked() -> None:
    frac = _by_specialty("fraction_simplification")[0]
    m = frac.entry["metadata"]
    near = wrap_answer(f"{m['numerator']}/{m['denominator'] + 1}")  # RG gives 0.1 for a kept numerator
    assert score(frac, near) == 0.0
    assert score(frac, near, partial_credit=True) == pytest.approx(0.1)
    logic = _by_specialty("propositional_logic")[0]
    tautology = wrap_answer("(P ∨ ¬P)")
    assert score(logic, tautology) == 0.0
    assert score(logic, tautology, partial_credit=True) == pytest.approx(0.25)


def test_binary_matrix_never_evals_the_answer(tmp_path: Path) -> None:
    # RG's own binary_matrix scorer calls eval() on the answer; ours must not.
    q = _by_specialty("binary_matrix")[0]
    marker = tmp_path / "pwned"
    attack = wrap_answer(f"__import__('pathlib').Path({str(marker)!r}).write_text('x')")
    assert score(q, attack, partial_credit=True) == 0.0
    assert not marker.exists()


def test_hostile_answers_do_not_crash() -> None:
    for q in QUESTIONS:
        for junk in ("(" * 500 + "P" + ")" * 500, "9" * 1000, "1e999999999", "\x00\ud800", "∨∧→↔¬" * 100,
                     "nan", "inf", "-0/0", "1/0"):
            value = score(q, wrap_answer(junk), partial_credit=True)
            assert 0.0 <= value <= 1.0
