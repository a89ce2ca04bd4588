"""Prompts per model family: demonstrations from their own seed, chat turns, base-model few-shot."""

from __future__ import annotations

import pytest

from engine.tasks import DEMO_SEED, HELDOUT_SEED_BASE, preset, regenerate, score
from engine.tasks.curriculum import LADDERS
from engine.tasks.prompts import PromptBuilder, PromptSpec, answer_only, chat_messages, demonstrations
from engine.tasks.reference import TaskRef


def _question(specialty: str = "basic_arithmetic", index: int = 4):
    return regenerate(TaskRef(specialty, dict(LADDERS[specialty][0]), 3, index))


def test_demonstrations_share_the_rung_and_come_from_their_own_seed() -> None:
    q = _question()
    demos = demonstrations(q, 3)
    assert len(demos) == 3 and len({d.text for d in demos}) == 3
    for d in demos:
        assert d.ref.seed == DEMO_SEED and d.ref.config == q.ref.config and d.specialty == q.specialty
        assert d.text != q.text
        assert score(d, answer_only(d)) == 1.0  # every shown answer is right by the verifier
    assert 1000 < DEMO_SEED < HELDOUT_SEED_BASE  # neither a training draw nor a held-out question
    assert demonstrations(q, 3) == demos  # reproducible: every node renders the same prompt
    assert demonstrations(_question(index=5), 1)[0] != demos[0]  # but they vary across questions


def test_answer_only_demonstrations_for_every_laddered_specialty() -> None:
    for specialty in LADDERS:
        q = _question(specialty, 2)
        text = answer_only(q)
        assert text.startswith("<answer>") and text.endswith("</answer>") and len(text) < 80
        assert score(q, text) == 1.0


def test_chat_fewshot_messages() -> None:
    q = _question()
    messages = chat_messages(q, PromptSpec("chat-fewshot", shots=2))
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "<answer>" in messages[0]["content"] and messages[-1]["content"] == q.text.strip()
    assert messages[2]["content"].startswith("<answer>")
    assert [m["role"] for m in chat_messages(q, PromptSpec("chat-fewshot", shots=0, system=""))] == ["user"]


def test_builder_renders_each_style() -> None:
    q = _question()
    assert PromptBuilder(PromptSpec("compact"))(q).endswith("\n")
    base = PromptBuilder(PromptSpec("fewshot", shots=2))(q)
    assert base.count("Question:") == 3 and base.endswith(f"Question: {q.text.strip()}\nAnswer:")
    transcript = PromptBuilder(PromptSpec("chat-fewshot"))(q)  # no tokenizer, no template: readable turns
    assert transcript.startswith("system:") and transcript.endswith("assistant:")
    assert not PromptBuilder(PromptSpec("chat-fewshot")).templated


def test_builder_applies_a_chat_template() -> None:
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert tokenize is False and add_generation_prompt is True
            return "|".join(f"{m['role']}={m['content']}" for m in messages) + "|assistant="

    q = _question()
    builder = PromptBuilder(PromptSpec("chat-fewshot", shots=1), Tok())
    text = builder(q)
    assert builder.templated and text.startswith("system=") and text.endswith(f"user={q.text.strip()}|assistant=")
    assert builder(q) is text  # cached per reference
    chat_text = PromptBuilder(PromptSpec("chat-text"), Tok())(q)
    assert chat_text.startswith("user=") and "<answer>" in chat_text


@pytest.mark.parametrize("bad", [{"style": "fancy"}, {"shots": 9}, {"shots": -1}, {"shots": True},
                                 {"system": 3}])
def test_prompt_spec_is_validated(bad: dict) -> None:
    with pytest.raises(ValueError):
        PromptSpec(**bad)


def test_training_seeds_stay_off_the_demonstration_seed() -> None:
    import random

    with pytest.raises(ValueError, match="demonstrations"):
        preset("rl").sample_refs(random.Random(0), 2, DEMO_SEED)
