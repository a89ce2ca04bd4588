"""Node.select_model on the real node: switching between two local tiny models (stopped and paused),
and the clear errors (unknown id, GGUF not here, a running node, the hub unreachable)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.checkpoint import latest_checkpoint
from engine.control.model_switch import hub_progress_class
from engine.events import Event, ModelProgress, RoundCompleted, StateChanged
from engine.node import Node, NodeConfig
from engine.sapo.config import preset


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two tiny random models of different shapes: one's checkpoint can never load into the other."""
    from engine.models.policy import build_tiny_policy

    root = tmp_path_factory.mktemp("models")
    return (build_tiny_policy(root / "tiny-a"),
            build_tiny_policy(root / "tiny-b", seed=1, hidden=32, layers=1, heads=2, intermediate=64))


def make_node(data_dir: Path, model: Path) -> tuple[Node, list[Event]]:
    sapo = preset("cpu-small").replace(num_local=2, completions=4, eval_every=0, checkpoint_every=2)
    node = Node(NodeConfig(data_dir=data_dir, model=str(model), sapo=sapo, solo=True, seed=3))
    seen: list[Event] = []
    node.bus.add_listener(seen.append)
    return node, seen


async def wait_for(node: Node, predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert node.error is None, node.error  # the worker died: say why at once
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def progress(seen: list[Event]) -> list[tuple[str, str]]:
    return [(e.phase, e.message) for e in seen if isinstance(e, ModelProgress)]


def model_of(checkpoint: Path | None) -> str:
    assert checkpoint is not None
    return str(json.loads((checkpoint / "state.json").read_text())["extra"]["model_id"])


def test_switch_while_stopped_then_rounds_run_on_the_new_model(tmp_path: Path, models: tuple[Path, Path]) -> None:
    model_a, model_b = models
    node, seen = make_node(tmp_path, model_a)

    before = 0

    async def main() -> None:
        nonlocal before
        await node.join()
        await wait_for(node, lambda: node.status().round >= 2)
        await node.leave()
        before = node.status().round
        assert node.status().backend  # the model that trained
        await node.select_model(str(model_b))
        status = node.status()
        assert status.model == "tiny-b" and status.state == "stopped"
        # the header's line says what the next Join trains; the old model's backend is not shown under B
        assert status.detail == "tiny-b is ready: Join the swarm to train it" and status.backend == ""
        assert [e for e in seen if isinstance(e, StateChanged)][-1].detail == status.detail
        await node.join()
        await wait_for(node, lambda: sum(isinstance(e, RoundCompleted) and e.model == "tiny-b" for e in seen) >= 3)
        await node.leave()

    asyncio.run(main())
    phases = [phase for phase, _ in progress(seen)]
    assert phases == ["load", "ready"]
    status = node.status()
    assert status.model == "tiny-b" and node.error is None
    # rounds are numbered per model: B starts at its own round 1, A's rounds stay A's; the history is B's
    rounds = [r["round"] for r in node.history()["rounds"]]
    assert rounds == list(range(1, status.round + 1))
    events = [(e.model, e.round) for e in seen if isinstance(e, RoundCompleted)]
    assert events == [("tiny-a", n) for n in range(1, before + 1)] + [("tiny-b", n) for n in rounds]
    assert [r["round"] for r in node.store.rounds(model="tiny-a")] == list(range(1, before + 1))
    # each model checkpoints into its own folder: B's weights never load into A or the other way
    assert model_of(latest_checkpoint(tmp_path / "checkpoints")) == "tiny-a"
    b_dirs = list((tmp_path / "checkpoints" / "models").iterdir())
    assert len(b_dirs) == 1 and b_dirs[0].name.startswith("tiny-b-")
    assert model_of(latest_checkpoint(b_dirs[0])) == "tiny-b"
    assert json.loads((latest_checkpoint(b_dirs[0]) / "state.json").read_text())["round"] == status.round
    node.store.close()
    restart_trains_the_switched_model(tmp_path, model_a, model_b, status.round)


def restart_trains_the_switched_model(data_dir: Path, model_a: Path, model_b: Path, rounds_so_far: int) -> None:
    """The switch is remembered: `sapo run` without --model starts on model B, whose checkpoints stay
    in B's own folder (the top folder still belongs to A), and rounds count on in the store."""
    from engine.cli import run as run_cli
    from engine.settings import ContributorSettings

    assert ContributorSettings.load(data_dir).model == str(model_b)
    parser = argparse.ArgumentParser()
    run_cli.register(parser.add_subparsers())
    args = parser.parse_args(["run", "--solo", "--data-dir", str(data_dir)])
    config = run_cli.build_config(args)
    assert config.model == str(model_b)
    assert run_cli.build_config(parser.parse_args(["run", "--data-dir", str(data_dir), "--model", "seed"])).model \
        == "seed"  # an explicit --model wins for that run
    sapo = preset("cpu-small").replace(num_local=2, completions=4, eval_every=0, checkpoint_every=2)
    node = Node(dataclasses.replace(config, sapo=sapo, seed=3))

    async def main() -> None:
        await node.join()
        await wait_for(node, lambda: node.status().round >= rounds_so_far + 2)
        await node.leave()

    asyncio.run(main())
    assert node.error is None and node.status().model in ("tiny-b", str(model_b))
    rounds = [r["round"] for r in node.history()["rounds"]]
    assert rounds == list(range(1, node.status().round + 1))  # none overwritten, none skipped
    assert model_of(latest_checkpoint(data_dir / "checkpoints")) == "tiny-a"
    (b_dir,) = (data_dir / "checkpoints" / "models").iterdir()
    assert json.loads((latest_checkpoint(b_dir) / "state.json").read_text())["round"] == node.status().round
    with pytest.raises(ValueError, match="select_model"):
        asyncio.run(node.update_settings({"model": "seed"}))
    node.store.close()


def test_switch_while_paused_takes_effect_on_resume_and_back(tmp_path: Path, models: tuple[Path, Path]) -> None:
    model_a, model_b = models
    node, seen = make_node(tmp_path, model_a)

    async def switch_paused(model: Path, label: str) -> None:
        await node.pause()
        await wait_for(node, lambda: node.status().state == "paused")
        await node.select_model(str(model))
        assert node.status().model == label and node.status().detail == f"{label} is ready: Resume to train it"
        # the switched-to model's own record at once, before it trains: rounds are numbered per model
        held, own = node.status().round, node.history()
        assert own["model"] == label and [r["round"] for r in own["rounds"]] == list(range(1, held + 1))
        await asyncio.sleep(0.3)
        assert node.status().round == held  # still paused: nothing trains until resume
        await node.resume()
        await wait_for(node, lambda: node.status().round >= held + 2)

    async def main() -> None:
        await node.join()
        await wait_for(node, lambda: node.status().round >= 2)
        await switch_paused(model_b, "tiny-b")  # new: round 0, no record
        await switch_paused(model_a, "tiny-a")  # back: A's record and round count; it resumes from its checkpoint
        await node.leave()

    asyncio.run(main())
    assert node.error is None and node.status().model == "tiny-a"
    rounds = [r["round"] for r in node.history()["rounds"]]
    assert rounds == list(range(1, node.status().round + 1))
    assert [p for p, _ in progress(seen)] == ["load", "ready", "load", "ready"]
    loads = [e.message for e in seen if getattr(e, "message", "").startswith("loading ")]
    assert len(loads) == 3 and "tiny-b" in loads[1] and "tiny-a" in loads[2]  # A, then B, then A again
    assert model_of(latest_checkpoint(tmp_path / "checkpoints")) == "tiny-a"
    node.store.close()


def test_unknown_and_unusable_models_give_clear_errors(tmp_path: Path, models: tuple[Path, Path]) -> None:
    model_a, _ = models
    node, seen = make_node(tmp_path, model_a)
    not_a_model = tmp_path / "empty-dir"
    not_a_model.mkdir()

    async def main() -> None:
        with pytest.raises(ValueError, match="unknown model 'no-such-model'.*known: .*qwen2.5-0.5b-instruct"):
            await node.select_model("no-such-model")
        with pytest.raises(ValueError, match="GGUF file is not on this machine"):
            await node.select_model("qwen2.5-0.5b-instruct-q4_k_m")
        with pytest.raises(ValueError, match="not a model directory"):
            await node.select_model(str(not_a_model))
        assert node.status().model == str(model_a)  # unchanged
        await node.join()
        await wait_for(node, lambda: node.status().round >= 1)
        with pytest.raises(ValueError, match="pause or leave before switching"):
            await node.select_model(str(models[1]))
        await node.leave()

    asyncio.run(main())
    errors = [m for phase, m in progress(seen) if phase == "error"]
    assert len(errors) == 3 and "no-such-model" in errors[0]
    assert node.status().model == "tiny-a" and node.error is None  # it trained the model it had
    node.store.close()


def test_a_catalog_model_without_the_hub_fails_fast_with_an_error_event(
        tmp_path: Path, models: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine with no internet: the hub endpoint refuses connections, the cache is empty."""
    import socket

    import huggingface_hub.constants as hub

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(hub, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)  # `make test` runs offline; this test wants a dead hub
    node, seen = make_node(tmp_path / "data", models[0])
    t0 = time.monotonic()
    unreachable = "cannot download qwen2.5-0.5b-instruct: the Hugging Face hub is unreachable .*Connection refused"
    with pytest.raises(ValueError, match=unreachable):
        asyncio.run(node.select_model("qwen2.5-0.5b-instruct"))
    assert time.monotonic() - t0 < 10
    phases = progress(seen)
    assert [p for p, _ in phases] == ["download", "error"]
    assert "Qwen/Qwen2.5-0.5B-Instruct" in phases[0][1] and "internet connection" in phases[1][1]
    assert node.status().model == str(models[0])
    node.store.close()


def test_hub_progress_reports_bytes_written_only() -> None:
    seen: list[Event] = []
    cls = hub_progress_class("qwen", seen.append)
    transfer = cls(total=2000, unit="B", desc="Downloading bytes")
    files = cls(total=3, desc="Fetching 3 files")
    written = cls(total=0, unit="B", desc="Reconstructing (incomplete total...)")
    written.total = 1000  # the hub grows the total as files start
    for bar in (transfer, files, written):
        bar.update(400 if bar is not files else 1)
        bar.update(600 if bar is not files else 2)
        bar.close()
    reported = [e for e in seen if isinstance(e, ModelProgress)]
    assert reported and all(e.model_id == "qwen" and e.phase == "download" for e in reported)
    assert (reported[-1].done, reported[-1].total) == (1000.0, 1000.0)
    assert [e.done for e in reported] == sorted(e.done for e in reported)
    assert reported[-1].message.endswith(" MiB")
