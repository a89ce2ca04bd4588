"""Fixtures: the real node (engine/node/node.py) on a tiny random model, behind a real control server on
127.0.0.1, on its own thread and event loop, as in production where the engine is another process
and the GUI never shares its loop.

`engine` is one solo node; `swarm_engine` is a node linked directly (listener on 127.0.0.1, no mDNS)
to a second real node, so that peers and shared rollouts exist. A random tiny model scores 0 on
every question: the zero-advantage filter is off so that peers' groups get trained on (the filter
has its own tests).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pytestqt.qtbot import QtBot

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the Machine tab probes the model hub only when downloads are on

from app.bridge import EngineBridge
from app.views.main_window import MainWindow
from engine.control.api import NodeControl
from engine.control.server import ControlServer
from engine.control.status import NodeStatus
from engine.control.token import (
    create_token,
    read_control_info,
    read_token,
    remove_control_info,
    write_control_info,
)
from engine.node import Node, NodeConfig
from engine.sapo.config import SapoConfig, preset
from engine.swarm.config import SwarmConfig

T = TypeVar("T")
NodeFactory = Callable[[Path], NodeControl | Awaitable[NodeControl]]


def fast_sapo(**changes: Any) -> SapoConfig:
    """Rounds of ~0.1 s on the tiny model: 2 questions x 4 completions, a 2-question held-out eval
    every 4 rounds (so pass@1 points reach the dashboard), a checkpoint every 2 rounds."""
    fields: dict[str, Any] = {"num_local": 2, "completions": 4, "eval_every": 4, "eval_per_specialty": 1,
                              "eval_k": 2, "checkpoint_every": 2}
    return preset("cpu-small").replace(**{**fields, **changes})


def solo_config(data_dir: Path, model: Path | str, seed: int = 3) -> NodeConfig:
    return NodeConfig(data_dir=data_dir, model=str(model), sapo=fast_sapo(), solo=True, seed=seed)


def linked_config(data_dir: Path, model: Path | str, seed: int, peer_urls: tuple[str, ...] = (),
                  listen_port: int = 0, sapo: SapoConfig | None = None) -> NodeConfig:
    """A swarm node on 127.0.0.1 only: a listener and direct links, no mDNS, no bootstrap."""
    swarm = SwarmConfig(listen_host="127.0.0.1", listen_port=listen_port, mdns=False, peer_urls=peer_urls)
    sapo = sapo or fast_sapo(num_external=2, filter_zero_advantage=False)
    return NodeConfig(data_dir=data_dir, model=str(model), sapo=sapo, swarm=swarm, seed=seed)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EngineThread:
    """A node and its control server on a private asyncio loop in a background thread.
    `node_factory` may be a coroutine function (it runs on that loop); `extra_nodes` (peers the
    factory started on the same loop) are left and closed with it."""

    def __init__(self, node_factory: NodeFactory, data_dir: Path, extra_nodes: list[Node] | None = None) -> None:
        self.data_dir = data_dir
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-engine", daemon=True)
        self._thread.start()
        self.token = create_token(data_dir)
        self.shutdown_requested = threading.Event()
        self.extra_nodes = extra_nodes if extra_nodes is not None else []

        async def build() -> tuple[NodeControl, ControlServer]:
            made = node_factory(data_dir)
            node = await made if inspect.isawaitable(made) else made
            server = ControlServer(node, self.token, on_shutdown=self.shutdown_requested.set)
            await server.start()
            return node, server

        self.node, self.server = self.run(build())
        self.url = self.server.url
        write_control_info(data_dir, self.url)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run a coroutine on the engine loop and wait for it (from the test thread)."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def status(self) -> NodeStatus:
        """The node's status, read on the engine loop as the control server reads it."""
        async def read() -> NodeStatus:
            return self.node.status()
        return self.run(read())

    def close(self) -> None:
        remove_control_info(self.data_dir)
        self.run(self.server.close())
        for node in [self.node, *self.extra_nodes]:
            self.run(node.leave(), timeout=120)  # the worker thread ends and checkpoints
            store = getattr(node, "store", None)
            if store is not None:
                store.close()

        async def cancel_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(cancel_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Llama + byte tokenizer, built once per session."""
    from engine.models.policy import build_tiny_policy

    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "tiny-a")


@pytest.fixture(scope="session")
def tiny_model_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another tiny model, of a different shape (for switching models)."""
    from engine.models.policy import build_tiny_policy

    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "tiny-b", seed=1, hidden=32, layers=1, heads=2,
                             intermediate=64)


@pytest.fixture
def node_factory(tiny_model: Path) -> NodeFactory:
    return lambda data_dir: Node(solo_config(data_dir, tiny_model))


@pytest.fixture
def engine(tmp_path: Path, node_factory: NodeFactory) -> Iterator[EngineThread]:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    eng = EngineThread(node_factory, data_dir)
    try:
        yield eng
    finally:
        eng.close()


async def start_first(node: Node, timeout_s: float = 60.0) -> None:
    """Join and wait for the first round: two model loads at once in one process break transformers
    5's loading (meta-device init is process-wide), so a second node in the process loads after."""
    await node.join()
    deadline = time.monotonic() + timeout_s
    while node.status().round < 1:
        if node.error is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the first node did not start: {node.error or 'timed out'}")
        await asyncio.sleep(0.05)


@pytest.fixture
def swarm_engine(tmp_path: Path, tiny_model: Path) -> Iterator[EngineThread]:
    """The engine's node dials a second real node (already training) on 127.0.0.1."""
    peer_port = free_port()
    peers: list[Node] = []

    async def factory(data_dir: Path) -> Node:  # runs on the engine loop
        peer = Node(linked_config(tmp_path / "peer", tiny_model, seed=1, listen_port=peer_port))
        peers.append(peer)
        await start_first(peer)
        return Node(linked_config(data_dir, tiny_model, seed=2, peer_urls=(f"ws://127.0.0.1:{peer_port}",)))

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    eng = EngineThread(factory, data_dir, extra_nodes=peers)
    try:
        yield eng
    finally:
        eng.close()


@pytest.fixture
def slow_engine(tmp_path: Path, tiny_model: Path) -> Iterator[EngineThread]:
    """A solo node whose rounds take ~1 s (8 completions of 256 tokens): long enough that a round is
    still in flight a few milliseconds after the previous one completed, so a test can act mid-round."""
    from engine.models.generate import SampleConfig

    sapo = fast_sapo(completions=8, eval_every=0, sampling=SampleConfig(max_new_tokens=256))
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    eng = EngineThread(lambda d: Node(NodeConfig(data_dir=d, model=str(tiny_model), sapo=sapo, solo=True)), data_dir)
    try:
        yield eng
    finally:
        eng.close()


def open_window(qtbot: QtBot, bridge: EngineBridge) -> MainWindow:
    window = MainWindow(bridge, refresh_ms=50, use_tray=False)
    qtbot.addWidget(window)
    bridge.start()
    window.show()
    return window


def connected_window(qtbot: QtBot, engine: EngineThread) -> MainWindow:
    bridge = EngineBridge(engine.url, lambda: read_token(engine.data_dir), reconnect_s=0.1,
                          url_provider=lambda: (info := read_control_info(engine.data_dir)) and info.url)
    win = open_window(qtbot, bridge)
    qtbot.waitUntil(lambda: win.model.node.connected, timeout=10_000)
    return win


@pytest.fixture
def window(qtbot: QtBot, engine: EngineThread) -> Iterator[MainWindow]:
    win = connected_window(qtbot, engine)
    yield win
    win.shutdown()
