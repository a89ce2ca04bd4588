"""Three real node processes and a real bootstrap on 127.0.0.1 share rollouts and train on them: through
the board (the bootstrap's embedded nats-server with JetStream: store one, fetch J), and through the
old broadcast relay (`--no-nats`)."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from engine.models.policy import build_tiny_policy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return json.loads(resp.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("data_plane", ["board", "relay"])
def test_three_nodes_and_a_bootstrap_train_on_each_others_rollouts(tmp_path: Path, data_plane: str) -> None:
    model = build_tiny_policy(tmp_path / "model")
    port = free_port()
    plane = ["--nats-port", "0", "--nats-ws-port", "0"] if data_plane == "board" else ["--no-nats"]
    boot = subprocess.Popen([sys.executable, "-m", "engine", "bootstrap", "--host", "127.0.0.1", "--port",
                             str(port), *plane], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        wait_http(f"http://127.0.0.1:{port}/status")
        for i in range(3):
            # A random tiny model solves nothing, so every group has zero advantage: turn the filter
            # off here so that peers' groups are eligible (the filter has its own tests).
            cmd = [sys.executable, "-m", "engine", "run", "--headless", "--model", str(model),
                   "--data-dir", str(tmp_path / f"n{i}"), "--rounds", "30", "--bootstrap",
                   f"ws://127.0.0.1:{port}", "--no-mdns", "--listen", "127.0.0.1:0", "--local", "2",
                   "--external", "2", "--set", "filter_zero_advantage=false", "--set", "completions=4",
                   "--set", "eval_every=0", "--seed", str(i)]
            nodes.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        for proc in nodes:
            _, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err.decode()[-3000:]
        status = wait_http(f"http://127.0.0.1:{port}/status")
        assert not status["refusals"]
        if data_plane == "board":  # rollouts never went through the bootstrap: only through the board
            assert status["board"]["urls"] and status["frames"]["rollouts"] == 0
            assert status["board"]["credentials_issued"] >= 3  # each node wrote with its own credential
            plane = status["board"]["data_plane"]  # the embedded nats-server's own figures
            assert plane["reachable"] and isinstance(plane["connections"], int) and plane["stream_messages"] >= 1
        else:
            assert status["frames"]["relayed"] > 0
    finally:
        for proc in nodes + [boot]:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    names = set()
    for i in range(3):
        db = sqlite3.connect(tmp_path / f"n{i}" / "node.db")
        used = db.execute("SELECT COUNT(*) FROM rollouts WHERE status = 'used'").fetchone()[0]
        # one builder for every RolloutSeen: pooled rows carry their task reference like used ones
        assert db.execute("SELECT COUNT(*) FROM rollouts WHERE ref_key = ''").fetchone()[0] == 0
        peers = db.execute("SELECT name, received, used FROM peers").fetchall()
        external = db.execute("SELECT SUM(num_external) FROM rounds").fetchone()[0]
        db.close()
        assert used > 0 and external > 0, f"node {i} never trained on a peer's group"
        assert len(peers) == 2 and all(received > 0 for _, received, _ in peers)
        names.update(name for name, _, _ in peers)
        if data_plane == "board":  # the peers that trained on its groups said so (receipts, display only)
            receipts = json.loads((tmp_path / f"n{i}" / "receipts.json").read_text())
            assert receipts["used"] > 0 and 1 <= len(receipts["peers"]) <= 2, receipts
    assert len(names) == 3  # each node saw the two others, by their derived names


def _rows_since(db_path: Path, since: float, status: str) -> int:
    if not db_path.exists():
        return 0
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
    try:
        return int(db.execute("SELECT COUNT(*) FROM rollouts WHERE status = ? AND ts > ?", (status, since)).fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


@pytest.mark.timeout(300)
def test_nodes_keep_sharing_through_the_board_when_the_bootstrap_restarts(tmp_path: Path) -> None:
    """kill -9 the bootstrap (its nats-server goes with it) and start it again on the same ports and
    data dir: the nodes' board clients reconnect with their credentials (same authority), the new
    bootstrap remakes the board and renews credentials, and sharing resumes."""
    model = build_tiny_policy(tmp_path / "model")
    port, nats_port, ws_port = free_port(), free_port(), free_port()
    boot_cmd = [sys.executable, "-m", "engine", "bootstrap", "--host", "127.0.0.1", "--port", str(port),
                "--nats-port", str(nats_port), "--nats-ws-port", str(ws_port), "--data-dir", str(tmp_path / "boot")]
    boot = subprocess.Popen(boot_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        wait_http(f"http://127.0.0.1:{port}/status")
        for i in range(2):
            nodes.append(subprocess.Popen(
                [sys.executable, "-m", "engine", "run", "--headless", "--model", str(model), "--data-dir",
                 str(tmp_path / f"n{i}"), "--bootstrap", f"ws://127.0.0.1:{port}", "--no-mdns", "--listen",
                 "127.0.0.1:0", "--local", "2", "--external", "2", "--set", "filter_zero_advantage=false",
                 "--set", "completions=4", "--set", "eval_every=0", "--seed", str(i)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def wait_used(since: float, what: str) -> None:
            """Both nodes pooled newly fetched groups (not leftovers) and trained on peers' groups."""
            deadline = time.monotonic() + 120
            while not all(_rows_since(tmp_path / f"n{i}" / "node.db", since, status) > 0
                          for i in range(2) for status in ("pooled", "used")):
                assert all(n.poll() is None for n in nodes), "a node exited"
                assert time.monotonic() < deadline, f"timed out waiting for {what}"
                time.sleep(0.5)

        wait_used(0.0, "sharing through the board")
        boot.kill()
        boot.wait(10)
        time.sleep(2.0)  # a few rounds without a bootstrap or a board
        boot = subprocess.Popen(boot_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(f"http://127.0.0.1:{port}/status")
        restarted = time.time()
        wait_used(restarted, "sharing again after the restart")
        status = wait_http(f"http://127.0.0.1:{port}/status")
        assert status["frames"]["rollouts"] == 0  # still nothing through the bootstrap itself
    finally:
        for proc in nodes + [boot]:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
