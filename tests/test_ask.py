"""Try it (engine/node/ask.py): a question answered by the policy and the starting model on a real node
with a tiny real model, between rounds; scoring; bad input; the starting model of a LoRA policy."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from test_node import small_config, wait_for

from engine.events import LogRecord, RoundCompleted, WorkProgress
from engine.models.generate import SampleConfig
from engine.models.policy import LoraSpec, build_tiny_policy, load_policy
from engine.node import Node
from engine.node.ask import MAX_PENDING, MAX_QUESTION_CHARS, AskDesk, AskError, AskRequest
from engine.sapo.config import SapoConfig
from engine.sapo.trainer import Trainer
from engine.tasks import preset as task_mix
from engine.tasks.library import regenerate
from engine.tasks.specialties import ground_truth


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "model")


def test_a_stopped_node_says_join_first(tmp_path: Path, tiny_model: Path) -> None:
    node = Node(small_config(tmp_path, tiny_model))
    with pytest.raises(AskError, match="join first"):
        asyncio.run(node.ask())
    node.store.close()


def test_an_ask_is_answered_between_rounds_while_training(tmp_path: Path, tiny_model: Path) -> None:
    node = Node(small_config(tmp_path, tiny_model))
    seen: list[object] = []
    node.bus.add_listener(seen.append)

    async def main() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        await node.join()
        await wait_for(lambda: node.status().round >= 2)
        drawn = await node.ask()
        named = await node.ask(specialty="basic_arithmetic")
        recent = node.recent_groups()
        await node.leave()
        return drawn, named, recent

    drawn, named, recent = asyncio.run(main())
    node.store.close()
    for result in (drawn, named):
        assert result["round"] >= 2 and result["question"] and result["expected"]
        assert result["yours"]["correct"] in (True, False)  # scored by the node's verifier
        assert result["start"] is not None and result["start"]["correct"] in (True, False), result["start_note"]
        assert result["difficulty"] is None or 1 <= result["difficulty"]["level"] <= result["difficulty"]["levels"]
    assert named["specialty"] == "basic_arithmetic"
    # Between rounds: each answer follows round R's completion and comes before round R + 1 starts.
    for result in (drawn, named):
        r = result["round"]
        at = next(i for i, e in enumerate(seen) if isinstance(e, LogRecord) and "answered your" in e.message
                  and f"after round {r}:" in e.message)
        done = next(i for i, e in enumerate(seen) if isinstance(e, RoundCompleted) and e.round == r)
        started = [i for i, e in enumerate(seen) if isinstance(e, WorkProgress) and e.phase == "generating"
                   and e.round == r + 1]
        assert done < at and all(at < i for i in started)
    groups = recent["groups"]
    assert groups and groups[0]["round"] >= groups[-1]["round"]  # newest first
    assert groups[0]["question"] and groups[0]["completions"] and groups[0]["total"] == 4
    assert all(c["reward"] in (0.0, 1.0) for g in groups for c in g["completions"])
    assert "basic_arithmetic" in recent["specialties"]


def test_a_paused_node_answers_at_once(tmp_path: Path, tiny_model: Path) -> None:
    node = Node(small_config(tmp_path, tiny_model))

    async def main() -> tuple[int, dict[str, Any]]:
        await node.join()
        await wait_for(lambda: node.status().round >= 1)
        await node.pause()
        await wait_for(lambda: node.status().state == "paused")
        paused_at = node.status().round
        result = await asyncio.wait_for(node.ask(), 30)  # no round runs: the ask woke the worker
        assert node.status().round == paused_at
        await node.leave()
        return paused_at, result

    paused_at, result = asyncio.run(main())
    node.store.close()
    assert result["round"] == paused_at


def test_bad_questions_get_clear_errors(tmp_path: Path, tiny_model: Path) -> None:
    node = Node(small_config(tmp_path, tiny_model))

    async def main() -> None:
        await node.join()
        with pytest.raises(AskError, match="unknown specialty"):
            await node.ask(specialty="poetry")
        with pytest.raises(AskError, match="not in this node's task mix"):
            await node.ask(specialty="bf")  # a specialty the "rl" mix leaves out
        with pytest.raises(AskError, match=f"at most {MAX_QUESTION_CHARS}"):
            await node.ask(text="x" * (MAX_QUESTION_CHARS + 1))
        with pytest.raises(AskError, match="own short task prompts"):  # the tiny model reads compact prompts
            await node.ask(text="What is 2 + 2?")
        await node.leave()

    asyncio.run(main())
    node.store.close()


def test_the_queue_is_bounded_and_leaving_fails_what_waits() -> None:
    desk = AskDesk(["basic_arithmetic"])
    desk.open()
    waiting = [desk.submit("", "") for _ in range(MAX_PENDING)]
    with pytest.raises(AskError, match="already waiting"):
        desk.submit("", "")
    desk.close("the node left before answering")
    for future in waiting:
        with pytest.raises(AskError, match="left before answering"):
            future.result(1)
    with pytest.raises(AskError, match="join first"):
        desk.submit("", "")


def tiny_trainer(model: Any, tok: Any, tmp_path: Path) -> Trainer:
    cfg = SapoConfig(num_local=1, completions=2, sampling=SampleConfig(max_new_tokens=8), eval_every=0)
    return Trainer(model, tok, cfg, task_mix("rl"), None, tmp_path / "ckpt", 5)


def test_answers_are_scored_by_the_local_verifier(tmp_path: Path, tiny_model: Path) -> None:
    trainer = tiny_trainer(*load_policy(tiny_model), tmp_path)
    desk = AskDesk(["basic_arithmetic"])
    question = regenerate(task_mix("rl").ref("basic_arithmetic", 0, 11))
    drawn = AskRequest("basic_arithmetic", "")
    right = desk._verdict(trainer, question, drawn, f"<answer>{ground_truth(question.entry)}</answer>", 0.1)
    wrong = desk._verdict(trainer, question, drawn, "<answer>nonsense</answer>", 0.1)
    assert right["correct"] is True and right["answer"] == ground_truth(question.entry)
    assert wrong["correct"] is False
    typed = desk._verdict(trainer, question, AskRequest("", "what is 1+1?"), "<answer>2</answer>", 0.1)
    assert typed["correct"] is None  # a typed question has no ground truth: not scored


def test_a_lora_policy_answers_beside_its_base_with_the_adapter_off(tmp_path: Path, tiny_model: Path) -> None:
    import torch

    model, tok = load_policy(tiny_model, lora=LoraSpec(target_modules=("q_proj", "v_proj", "o_proj")))
    torch.manual_seed(0)
    with torch.no_grad():  # an adapter that moves the policy far from its base
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 2.0)
    desk = AskDesk(list(task_mix("rl").specialties))
    desk.open()

    def ask_with(trainer: Trainer) -> dict[str, Any]:
        desk._rng.seed(0)  # the same question for both trainers
        answer = desk.submit("base_conversion", "")
        assert desk.answer(trainer, str(tiny_model)) == 1
        return answer.result(1)

    lora = ask_with(tiny_trainer(model, tok, tmp_path / "lora"))
    base = ask_with(tiny_trainer(*load_policy(tiny_model), tmp_path / "base"))
    assert lora["question"] == base["question"]
    assert lora["start"] is not None and lora["start_note"] == ""
    assert lora["start"]["text"] == base["yours"]["text"]  # adapter off: the plain base model's own answer
    assert lora["yours"]["text"] != lora["start"]["text"]  # adapter on: the policy's
