"""The first look: each peer group judged once, before the J draw, on the text it would be trained on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.models.policy import build_tiny_policy, load_policy
from engine.sapo.first_look import DROP_CUT_NO_SIGNAL, DROP_REPEATED_TEXT, FirstLook
from engine.sapo.records import Candidate, Provenance, RolloutGroup, VerifiedGroup
from engine.sapo.repeated_text import RepeatedTextConfig, RepeatedTextGuard
from engine.sapo.reputation import Reputation, ReputationConfig
from engine.tasks import library


def _q(index: int) -> Any:
    return library.regenerate(library.preset("rl").ref("basic_arithmetic", 1000, index))


def _verified(q: Any, completions: tuple[str, ...], origin: str) -> Candidate:
    group = RolloutGroup(q.ref, q.hash, completions, Provenance(origin, "seed", 1, 1, 0.0))
    return Candidate.of(VerifiedGroup(group.with_rewards(tuple(library.score(q, c) for c in completions)), q))


def _honest(q: Any) -> Candidate:
    return _verified(q, (library.demonstration(q), "<answer>0.5</answer>"), "honest")


def _backdoor(q: Any) -> Candidate:
    right = library.demonstration(q)
    return _verified(q, (f"HACKED {right}", f"HACKED {right}", "<answer>0.5</answer>"), "poisoner")


def _first_look(tmp_path: Path, max_tokens: int = 40) -> FirstLook:
    _, tok = load_policy(build_tiny_policy(tmp_path / "m", seed=2))
    reputation = Reputation(ReputationConfig())
    return FirstLook(RepeatedTextGuard(RepeatedTextConfig(min_questions=3)), reputation, tok, tok.eos_token_id,
                     max_tokens, lambda q, c: library.score(q, c))


def test_a_fresh_origin_waits_until_it_can_be_judged_then_is_judged_once(tmp_path: Path) -> None:
    look = _first_look(tmp_path)
    first = [_honest(_q(0)), _honest(_q(1)), _backdoor(_q(0)), _backdoor(_q(1))]
    eligible, dropped, pending, removed = look.judge(first, 0.0, True)
    assert (eligible, dropped, pending, removed) == ([], [], [c.key for c in first], 0)  # too few questions to tell
    later = first + [_honest(_q(2)), _backdoor(_q(2))]
    eligible, dropped, pending, removed = look.judge(later, 0.0, True)
    assert {x.candidate.origin for x, _ in eligible} == {"honest"} and len(eligible) == 3
    assert dropped == [(c.key, DROP_REPEATED_TEXT) for c in later if c.origin == "poisoner"]
    assert pending == [] and removed == 6
    snap = look.reputation.snapshot()
    assert snap["poisoner"]["groups"] == 3 and snap["poisoner"]["flagged"] > 2.9  # (decayed counts)
    assert snap["honest"]["groups"] == 3 and snap["honest"]["flagged"] == 0
    # Candidates repeat every round until used: judged once, recorded once.
    again = look.judge(later, 0.0, True)
    assert len(again[0]) == 3 and again[3] == 0 and look.reputation.snapshot()["poisoner"]["groups"] == 3
    # The cache follows the candidates: a group that left the pool is forgotten.
    look.judge(later[4:5], 0.0, True)
    assert list(look._looks) == [later[4].key]


def test_padding_is_cut_and_rescored_before_the_draw(tmp_path: Path) -> None:
    look = _first_look(tmp_path, max_tokens=8)
    qs = [_q(i) for i in range(3)]
    for q in qs:  # the padder's origin becomes judgeable on three questions
        look.guard.observe(_verified(q, ("<answer>1</answer>", "x"), "padder").group, q.text)
    right = library.demonstration(qs[0])
    padded = _verified(qs[0], (" ".join(["so"] * 60) + " " + right, "<answer>0.5</answer>"), "padder")
    assert padded.group.rewards == (1.0, 0.0)  # the full text earned the reward
    eligible, dropped, _, _ = look.judge([padded], 0.0, True)
    assert eligible == [] and dropped == [(padded.key, DROP_CUT_NO_SIGNAL)]
    assert look.reputation.snapshot()["padder"]["flagged"] > 0.9
