"""Held-out evaluation: aggregation by hand, and a real run on a tiny random policy."""

from __future__ import annotations

from typing import Any

import pytest

from engine.evaluation import EvalReport, _QuestionResult, evaluate, report_from_results
from engine.models.generate import SampleConfig
from engine.models.policy import build_tiny_policy, load_policy
from engine.tasks.library import heldout, preset


def test_aggregation_by_hand() -> None:
    results = [
        _QuestionResult("a", solved=0, k=4, malformed=4, truncated=1, tokens=40),
        _QuestionResult("a", solved=2, k=4, malformed=0, truncated=0, tokens=20),
        _QuestionResult("b", solved=4, k=4, malformed=1, truncated=0, tokens=12),
    ]
    report = report_from_results(results, k=4)
    a, b, overall = report.per_specialty["a"], report.per_specialty["b"], report.overall
    assert (a.n_questions, a.pass1, a.passk, a.mixed_fraction) == (2, 0.25, 0.5, 0.5)
    assert (a.malformed_rate, a.truncated_rate, a.mean_tokens) == (0.5, 0.125, 7.5)
    assert (b.pass1, b.passk, b.mixed_fraction) == (1.0, 1.0, 0.0)
    assert overall.pass1 == pytest.approx(1.5 / 3)
    assert overall.passk == pytest.approx(2 / 3)
    assert overall.mixed_fraction == pytest.approx(1 / 3)
    assert overall.malformed_rate == pytest.approx(5 / 12)
    assert report.solved == (0, 2, 4)  # per question, in the order asked: what a histogram reads
    again = EvalReport.from_dict(report.to_dict())
    assert again == report
    for bad in ([5, 0, 0], ["2"], [True], "024"):
        with pytest.raises(ValueError, match="solved"):
            EvalReport.from_dict(report.to_dict() | {"solved": bad})
    old = report.to_dict()
    del old["solved"]  # a report stored before the field existed
    assert EvalReport.from_dict(old).solved == ()
    table = report.table()
    assert "pass@4" in table and table.splitlines()[-1].startswith("overall")


def test_from_dict_rejects_bad_input() -> None:
    good = report_from_results([_QuestionResult("a", 1, 2, 0, 0, 3)], k=2).to_dict()
    for bad in ({**good, "k": 0}, {**good, "per_specialty": []},
                {**good, "overall": {**good["overall"], "pass1": float("nan")}}, "x"):
        with pytest.raises(ValueError):
            EvalReport.from_dict(bad)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    return load_policy(build_tiny_policy(tmp_path_factory.mktemp("tiny") / "m", seed=1))


def test_evaluate_a_random_policy(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    questions = heldout(preset("rl"), 2, seed=5)
    cfg = SampleConfig(max_new_tokens=8)
    report = evaluate(model, tok, questions, k=3, sample_cfg=cfg, prompt_style="compact", seed=1,
                      batch_prompts=5)
    assert report.k == 3 and report.overall.n_questions == len(questions)
    assert set(report.per_specialty) == set(preset("rl").specialties)
    # Random bytes never spell "<answer>...</answer>" in 8 tokens: all malformed, nothing solved.
    assert report.overall.malformed_rate == 1.0 and report.overall.pass1 == 0.0
    assert report.overall.truncated_rate > 0.5
    again = evaluate(model, tok, questions, k=3, sample_cfg=cfg, prompt_style="compact", seed=1,
                     batch_prompts=5)
    assert again.to_dict()["overall"] == report.to_dict()["overall"]
