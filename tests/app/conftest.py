"""Fixtures: an engine (node + real control server on 127.0.0.1) on its own thread and event loop,
as in production where the engine is another process and the GUI never shares its loop.

The node is injected by the `node_factory` fixture: today the scripted stand-in (standin_node.py);
switch it to the real `engine.node` once that exists.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).parent))  # for standin_node (tests/ is not a package)

from standin_node import StandInNode

from engine.control.api import NodeControl
from engine.control.server import ControlServer
from engine.control.token import create_token, remove_control_info, write_control_info

T = TypeVar("T")


class EngineThread:
    """A node and its control server on a private asyncio loop in a background thread."""

    def __init__(self, node_factory: Callable[[Path], NodeControl], data_dir: Path) -> None:
        self.data_dir = data_dir
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-engine", daemon=True)
        self._thread.start()
        self.token = create_token(data_dir)
        self.shutdown_requested = threading.Event()

        async def build() -> tuple[NodeControl, ControlServer]:
            node = node_factory(data_dir)
            server = ControlServer(node, self.token, on_shutdown=self.shutdown_requested.set)
            await server.start()
            return node, server

        self.node, self.server = self.run(build())
        self.url = self.server.url
        write_control_info(data_dir, self.url)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run a coroutine on the engine loop and wait for it (from the test thread)."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def close(self) -> None:
        remove_control_info(self.data_dir)
        self.run(self.server.close())

        async def cancel_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(cancel_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


@pytest.fixture
def node_factory() -> Callable[[Path], NodeControl]:
    return lambda data_dir: StandInNode(data_dir, round_s=0.05)


@pytest.fixture
def engine(tmp_path: Path, node_factory: Callable[[Path], NodeControl]) -> Iterator[EngineThread]:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    eng = EngineThread(node_factory, data_dir)
    try:
        yield eng
    finally:
        eng.close()
