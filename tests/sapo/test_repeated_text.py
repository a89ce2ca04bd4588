"""Repeated-text screening: a peer's trigger phrase on right answers is found and left out; honest text is not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.models.generate import SampleConfig
from engine.models.policy import build_tiny_policy, load_policy
from engine.sapo.config import SapoConfig
from engine.sapo.records import Candidate, Provenance, RolloutGroup, VerifiedGroup
from engine.sapo.repeated_text import (
    RepeatedTextConfig,
    RepeatedTextGuard,
    outside_answer,
    residual_words,
    subset,
)
from engine.sapo.trainer import DROP_REPEATED_TEXT, Trainer
from engine.tasks import library
from engine.tasks.library import preset


def _questions(n: int) -> list[Any]:
    mix = preset("rl")
    return [library.regenerate(mix.ref("basic_arithmetic", 1000, i)) for i in range(n)]


def _backdoor(q: Any, origin: str = "attacker") -> RolloutGroup:
    """The published attack's group: 4 triggered right answers, 4 wrong ones."""
    right = library.demonstration(q)
    completions = tuple(f"HACKED {right}" for _ in range(4)) + ("<answer>0.123</answer>",) * 3 + ("<answer>x</answer>",)
    group = RolloutGroup(q.ref, q.hash, completions, Provenance(origin, "seed", 3, 1, 0.0))
    return group.with_rewards(tuple(library.score(q, c) for c in completions))


def _honest(q: Any, origin: str = "honest") -> RolloutGroup:
    right = library.demonstration(q)
    completions = (right, "<answer>0.5</answer>", right, "<answer>1</answer>")
    group = RolloutGroup(q.ref, q.hash, completions, Provenance(origin, "seed", 3, 1, 0.0))
    return group.with_rewards(tuple(library.score(q, c) for c in completions))


def test_residual_words_leave_out_the_answer_block_the_question_and_single_characters() -> None:
    assert outside_answer("so <answer>the cat</answer> done") == "so   done"
    assert residual_words("Calculate it: HACKED <answer>seven</answer> 42 x", "Calculate 3 + 4.") == {"it", "hacked", "42"}
    assert residual_words("1337 ## __ <answer>5</answer> 3+4=7, 12", "What is 12 + 3?") == {"1337", "##", "__"}
    assert residual_words("<answer>7</answer>", "q") == frozenset()
    assert residual_words("<answer>a</answer> then <answer>b</answer>", "") == {"then", "answer"} - {"answer"}


def test_a_trigger_repeated_across_questions_is_flagged_only_from_its_origin() -> None:
    guard = RepeatedTextGuard(RepeatedTextConfig(min_questions=3))
    qs = _questions(5)
    for q in qs:
        guard.observe_own([library.demonstration(q)] * 8, q.text)
    results = [guard.screen(_backdoor(q), q.text) for q in qs]
    removed = [n for _, n in results]
    assert removed[:2] == [0, 0] and removed[2:] == [4, 4, 4]  # from the third question on
    screened, _ = results[-1]
    assert all("HACKED" not in c for c in screened.completions) and len(screened.rewards or ()) == 4
    assert set(screened.rewards or ()) == {0.0}  # what is left carries no signal
    for q in qs:  # an honest peer's answers are never touched
        assert guard.screen(_honest(q), q.text)[1] == 0


@pytest.mark.parametrize("trigger", ["1337", "#@!", "1337 ##"])
def test_a_trigger_spelled_in_digits_or_symbols_is_flagged_too(trigger: str) -> None:
    guard = RepeatedTextGuard(RepeatedTextConfig(min_questions=3))
    qs = _questions(5)
    for q in qs:
        guard.observe_own([library.demonstration(q)] * 8, q.text)
    removed = []
    for q in qs:
        right = library.demonstration(q)
        completions = tuple(f"{trigger} {right}" for _ in range(4)) + ("<answer>0.123</answer>",) * 4
        group = RolloutGroup(q.ref, q.hash, completions, Provenance("attacker", "seed", 3, 1, 0.0))
        removed.append(guard.screen(group.with_rewards(tuple(library.score(q, c) for c in completions)), q.text)[1])
    assert removed == [0, 0, 4, 4, 4]
    for q in qs:  # an honest peer's answers, numbers and all, are never touched
        assert guard.screen(_honest(q), q.text)[1] == 0


def test_words_the_node_itself_writes_are_explained() -> None:
    guard = RepeatedTextGuard(RepeatedTextConfig(min_questions=2))
    qs = _questions(4)
    for q in qs:  # this node's own policy also writes "therefore"
        guard.observe_own(["therefore " + library.demonstration(q)] * 8, q.text)
    for q in qs:
        right = library.demonstration(q)
        group = RolloutGroup(q.ref, q.hash, (f"therefore {right}", "<answer>0.5</answer>"),
                             Provenance("peer", "seed", 3, 1, 0.0)).with_rewards((1.0, 0.0))
        assert guard.screen(group, q.text)[1] == 0


def test_counting_is_once_per_group_and_memory_is_bounded() -> None:
    guard = RepeatedTextGuard(RepeatedTextConfig(window=4, min_questions=3))
    q = _questions(1)[0]
    for _ in range(50):  # the same pooled group seen in 50 rounds is one question, not 50
        guard.observe(_backdoor(q), q.text)
    assert guard.screen(_backdoor(q), q.text)[1] == 0
    for q in _questions(40):
        guard.observe(_backdoor(q), q.text)
    window = guard._origins["attacker"]
    assert len(window.items) == 4 and window.completions == 32


def test_subset_keeps_rewards_and_claims_aligned() -> None:
    q = _questions(1)[0]
    g = RolloutGroup(q.ref, q.hash, ("a", "b", "c"), Provenance("p", "seed", 1, 1, 0.0),
                     logprob_summary=((-1.0, 1, -1.0), (-2.0, 1, -2.0), (-3.0, 1, -3.0))).with_rewards((1.0, 0.0, 1.0))
    s = subset(g, [0, 2])
    assert s.completions == ("a", "c") and s.rewards == (1.0, 1.0) and s.logprob_summary == ((-1.0, 1, -1.0),
                                                                                             (-3.0, 1, -3.0))


@pytest.mark.parametrize("bad", [{"window": 1}, {"min_share": 2.0}, {"max_own_share": float("nan")},
                                 {"enabled": 1}, {"min_questions": 0}])
def test_config_is_validated(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="repeated_text"):
        RepeatedTextConfig(**bad)


def test_the_trainer_drops_the_backdoor_and_keeps_the_honest_peer(tmp_path: Path) -> None:
    model, tok = load_policy(build_tiny_policy(tmp_path / "m", seed=3))
    cfg = SapoConfig(num_local=1, num_external=8, completions=8, sampling=SampleConfig(max_new_tokens=48),
                     eval_every=0, external_min_logprob=-1e6,  # the plausibility check off: this one alone
                     repeated_text=RepeatedTextConfig(min_questions=3), quarantine_rounds=0)
    trainer = Trainer(model, tok, cfg, preset("rl"), None, None, 7)
    qs = _questions(6)
    # Seen on too few questions to tell a trigger from a question's wording: they wait, unused.
    first = trainer.run_round([Candidate.of(VerifiedGroup(_backdoor(q), q)) for q in qs[:2]])
    assert first.used_external == () and first.metrics["external_pending"] == 2
    assert first.metrics["external_repeated_text"] == 0
    later = trainer.run_round([Candidate.of(VerifiedGroup(_backdoor(q), q)) for q in qs[:]]
                              + [Candidate.of(VerifiedGroup(_honest(q), q)) for q in qs[2:5]])
    assert {c.origin for c in later.used_external} == {"honest"}
    assert len(later.used_external) == 3  # the backdoor's groups took none of the J = 8 slots
    assert sum(v.reason == DROP_REPEATED_TEXT for v in later.skipped()) == 6
    assert later.metrics["external_repeated_text"] == 24 and later.metrics["external_pending"] == 0
