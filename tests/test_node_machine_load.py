"""The node on a machine that is also in use: it re-chooses its threads every round, and a long pause
gives the model's memory back (checkpointed first) and loads it again on resume."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from test_node import small_config as node_small_config
from test_node import wait_for

from engine.events import LogRecord, RoundCompleted, StateChanged
from engine.machine import load as machine_load
from engine.machine.load import apply_threads
from engine.models.policy import build_tiny_policy
from engine.models.resolve import release_model
from engine.node import Node, NodeConfig
from engine.node import node as node_module
from engine.settings import ContributorSettings


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "model")


def small_config(data_dir: Path, model: Path) -> NodeConfig:
    """test_node's small solo node, on the CPU, with no checkpoints of its own between rounds."""
    node = node_small_config(data_dir, model)
    return dataclasses.replace(node, sapo=node.sapo.replace(checkpoint_every=0), device="cpu")


def test_each_round_runs_on_the_threads_chosen_for_it(tmp_path: Path, tiny_model: Path) -> None:
    node = Node(small_config(tmp_path, tiny_model), settings=ContributorSettings(cpu_cores=2))
    ran: list[tuple[int, dict[str, Any]]] = []

    def on_round(event: object) -> None:  # on the trainer's thread: torch's thread count is per thread
        if isinstance(event, RoundCompleted):
            ran.append((torch.get_num_threads(), node.status().threads))

    node.bus.add_listener(on_round)

    async def main() -> None:
        await node.join()
        await wait_for(lambda: len(ran) >= 2)
        await node.leave()

    try:
        asyncio.run(main())
        machine = node.machine()  # reads the store: its own rounds calibrate the estimate
    finally:
        node.store.close()
    for torch_threads, choice in ran:
        assert choice["setting"] == 2 and choice["lent"] == 2 and 1 <= choice["threads"] <= 2
        # the governor may re-choose inside the round (the owner's load came or went): within the lent cores
        assert choice["others_busy"] >= 0.0 and 1 <= torch_threads <= choice["lent"]
    assert machine["lent"]["cpu_cores_setting"] == 2
    assert machine["lent"]["busy_cores"] == node.status().threads["others_busy"]


def test_a_long_pause_releases_the_model_and_resume_loads_it_again(
        tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_load, "RELEASE_MODEL_AFTER_PAUSE_S", 0.2)
    monkeypatch.setattr(node_module, "GUARD_RECHECK_S", 0.1)  # a paused node re-checks its rules this often
    node = Node(small_config(tmp_path, tiny_model))
    seen: list[object] = []
    node.bus.add_listener(seen.append)

    async def main() -> None:
        await node.join()
        await wait_for(lambda: node.status().round >= 1)
        await node.pause()
        await wait_for(lambda: node.status().model_released)
        assert list((tmp_path / "checkpoints").rglob("*.safetensors"))  # checkpointed before it was released
        paused_at = node.status().round
        await node.resume()
        await wait_for(lambda: node.status().round > paused_at and not node.status().model_released)
        await node.leave()

    try:
        asyncio.run(main())
        rounds = [r["round"] for r in node.history()["rounds"]]
    finally:
        node.store.close()
    assert node.error is None
    assert any(isinstance(e, LogRecord) and "released" in e.message for e in seen)
    assert any(isinstance(e, StateChanged) and "loading the model again" in e.detail for e in seen)
    assert rounds == list(range(1, len(rounds) + 1))  # resumed where it stopped


class Stub:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.generator = self

    def save_checkpoint(self) -> None:
        self.calls.append("checkpoint")

    def close(self) -> None:
        self.calls.append("close")

    def set_threads(self, n: int) -> None:
        self.calls.append(f"threads {n}")


def test_release_checkpoints_then_frees_the_generators_own_copy() -> None:
    stub, published = Stub(), []
    release_model(stub, published.append)
    assert stub.calls == ["checkpoint", "close"] and isinstance(published[0], LogRecord)


def test_threads_go_to_torch_and_to_a_generator_that_has_its_own() -> None:
    before = torch.get_num_threads()
    stub = Stub()
    try:
        apply_threads("cpu", 1, stub)
        assert torch.get_num_threads() == 1 and stub.calls == ["threads 1"]
        apply_threads("cuda", 3, stub)  # a GPU round: the CPU threads are left alone
        assert torch.get_num_threads() == 1 and stub.calls == ["threads 1"]
    finally:
        torch.set_num_threads(before)
