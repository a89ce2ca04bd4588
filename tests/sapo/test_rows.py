"""External completions become loss rows through the local tokenizer and prompt template."""

from __future__ import annotations

import math
from typing import Any

import pytest

from engine.models.policy import build_byte_tokenizer
from engine.sapo.records import Provenance, RolloutGroup
from engine.sapo.rows import advantages_of, external_rows, receiver_view, retokenize_completion
from engine.tasks.reference import TaskRef


@pytest.fixture(scope="module")
def tok() -> Any:
    return build_byte_tokenizer()


def test_retokenize_appends_eos_or_truncates(tok: Any) -> None:
    eos = tok.eos_token_id
    ids = retokenize_completion(tok, "<answer>7</answer>", eos, 48)
    assert ids[-1] == eos and tok.decode(ids[:-1]) == "<answer>7</answer>"
    cut = retokenize_completion(tok, "x" * 100, eos, 10)
    assert len(cut) == 10 and eos not in cut


def test_external_rows_use_local_prompt_and_drop_bad_logprobs(tok: Any) -> None:
    ref = TaskRef("basic_arithmetic", {}, 1, 2)
    prov = Provenance("peer", "other-model", 1, 1, 0.0)
    good = RolloutGroup(ref, "h", ("a", "bb"), prov, generator_logprobs=((-1.0,), (-0.5, -0.5))
                        ).with_rewards((1.0, 0.0))
    liar = RolloutGroup(ref, "h", ("a", "bb"), prov, generator_logprobs=((-1.0,), (float("nan"),))
                        ).with_rewards((0.0, 1.0))
    short = RolloutGroup(ref, "h", ("a", "bb"), prov, generator_logprobs=((-1.0,),)).with_rewards((0.0, 1.0))
    ids = [receiver_view(g, tok, tok.eos_token_id, 48)[1] for g in (good, liar, short)]
    rows = external_rows([good, liar, short], ["P1\n", "P2\n", "P3\n"], ids, tok, 1e-6)
    assert len(rows) == 6 and all(r.external for r in rows)
    assert tok.decode(rows[0].prompt_ids) == "P1\n" and tok.decode(rows[3].prompt_ids) == "P2\n"
    assert [r.generator_logp_sum for r in rows[:2]] == [-1.0, -1.0]
    assert rows[2].generator_logp_sum is None and rows[5].generator_logp_sum is None
    # (1, 0): mean 0.5, sample std 0.7071 -> +-0.7071
    assert rows[0].advantage == pytest.approx(1 / math.sqrt(2), abs=1e-5)
    assert advantages_of(good, 1e-6) == pytest.approx([0.70710, -0.70710], abs=1e-4)


def test_claimed_logprobs_must_be_plausible(tok: Any) -> None:
    ref = TaskRef("basic_arithmetic", {}, 1, 2)
    prov = Provenance("peer", "other-model", 1, 1, 0.0)
    ids = [(5, tok.eos_token_id), (6, tok.eos_token_id)]
    for claim in (((-1e6,), (-1.0,)), ((-1e300,), (-1.0,)), ((0.5,), (-1.0,))):  # too improbable, or > 0
        group = RolloutGroup(ref, "h", ("a", "b"), prov, generator_logprobs=claim).with_rewards((1.0, 0.0))
        rows = external_rows([group], ["P\n"], [ids], tok, 1e-6)
        assert [r.generator_logp_sum for r in rows] == [None, None]  # importance-weighted leaves them out


def test_a_completion_past_the_token_cap_is_cut_and_carries_the_cut_text(tok: Any) -> None:
    ref = TaskRef("basic_arithmetic", {}, 1, 2)
    prov = Provenance("peer", "other-model", 1, 1, 0.0)
    padded = " " * 8000 + "<answer>7</answer>"  # scored on its full text it earned 1; 32 tokens of it hold no answer
    group = RolloutGroup(ref, "h", ("<answer>7</answer>", padded), prov,
                         generator_logprobs=((-1.0,), (-1.0,))).with_rewards((1.0, 1.0))
    view, ids, cut = receiver_view(group, tok, tok.eos_token_id, 32)
    assert cut and view.rewards is None and view.generator_logprobs is None  # re-scored by the caller
    assert view.completions[0] == "<answer>7</answer>" and ids[0][-1] == tok.eos_token_id
    assert len(ids[1]) == 32 and tok.eos_token_id not in ids[1]
    assert view.completions[1] == tok.decode(list(ids[1])) and "<answer>" not in view.completions[1]
    same, same_ids, was_cut = receiver_view(group, tok, tok.eos_token_id, 100_000)
    assert same is group and not was_cut and same_ids[1][-1] == tok.eos_token_id


def test_claims_from_a_wire_summary_are_checked_like_per_token_ones() -> None:
    from engine.sapo.rows import claimed_logprob_sums

    ref = TaskRef("basic_arithmetic", {}, 1, 2)
    prov = Provenance("peer", "m", 1, 1, 0.0)

    def claim(*summary: tuple[float, int, float]) -> tuple[float, ...] | None:
        return claimed_logprob_sums(RolloutGroup(ref, "h", ("a", "bb"), prov, logprob_summary=summary))

    assert claim((-1.0, 1, -1.0), (-1.0, 2, -0.5)) == (-1.0, -1.0)
    assert claim((-1.0, 1, -1.0), (-100.0, 2, -50.0)) is None  # a token below -30 nats
    assert claim((-1.0, 1, -1.0), (-61.0, 2, -29.0)) is None  # a sum no two tokens in [-30, 0] make
    assert claim((-1.0, 1, -1.0), (-1.0, 0, 0.0)) is None  # a sum from no tokens
    assert claim((-1.0, 1, -1.0)) is None  # one claim for two completions
