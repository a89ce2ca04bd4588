"""Real processes on 127.0.0.1: a bootstrap process, peer processes, and an in-test node that must
survive a peer killed with SIGKILL and a bootstrap killed and restarted (it reconnects)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from swarm_helpers import Node, async_test, free_port, swarm_config, wait_for

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def start_bootstrap(port: int) -> subprocess.Popen[str]:
    # The relay path: the in-test node only listens, and a board is pulled (fetch J per own round).
    proc = spawn("-m", "engine", "bootstrap", "--host", "127.0.0.1", "--port", str(port), "--no-nats")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=1) as resp:
                json.loads(resp.read())
                return proc
        except OSError:
            if proc.poll() is not None:
                raise AssertionError(f"bootstrap exited: {proc.stdout.read() if proc.stdout else ''}") from None
            time.sleep(0.1)
    raise AssertionError("bootstrap did not come up")


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


@async_test
async def test_survives_sigkilled_peer_and_bootstrap_restart(processes: list[subprocess.Popen[str]]) -> None:
    port = free_port()
    url = f"ws://127.0.0.1:{port}"
    bootstrap = start_bootstrap(port)
    processes.append(bootstrap)
    victim = spawn(str(HERE / "peer_process.py"), "--bootstrap", url, "--seed", "1")
    steady = spawn(str(HERE / "peer_process.py"), "--bootstrap", url, "--seed", "2")
    processes.extend([victim, steady])
    survivor = Node(swarm_config(listen=False, bootstrap_urls=(url,)))
    await survivor.service.start()
    try:
        def origins() -> set[str]:
            return {e.origin_peer for e in survivor.of_type("RolloutSeen") if e.status == "pooled"}

        await wait_for(lambda: len(origins()) == 2, timeout=40, what="groups from both peer processes")
        victim_id = next(p.peer_id for p in survivor.service.peers()
                         if p.peer_id not in _ids_of(steady, survivor))
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        await wait_for(lambda: victim_id not in survivor.peer_ids(), timeout=15, what="the killed peer gone")
        before = len(survivor.pool)
        await wait_for(lambda: len(survivor.pool) >= before + 3, timeout=15, what="groups keep coming")

        bootstrap.send_signal(signal.SIGKILL)
        bootstrap.wait(timeout=10)
        await wait_for(lambda: not survivor.service.stats()["bootstraps"], timeout=10, what="link lost")
        processes.append(start_bootstrap(port))
        await wait_for(lambda: survivor.service.stats()["bootstraps"] == [url], timeout=20, what="reconnected")
        after = len(survivor.pool)
        await wait_for(lambda: len(survivor.pool) >= after + 3, timeout=20,
                       what="groups from the steady peer after the restart")
        assert steady.poll() is None  # the other peer process also lived through it
        warnings = [e.message for e in survivor.of_type("LogRecord") if e.level == "warning"]
        assert all("connection refused — is the server running?" in w for w in warnings if "could not" in w)
    finally:
        await survivor.service.stop()


def _ids_of(proc: subprocess.Popen[str], survivor: Node) -> set[str]:
    """The peer id a peer process reports on its first status line."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return {json.loads(line)["id"]}
