"""An operator's own NATS cluster carries the board with credentials: `sapo bootstrap --nats-auth-out`
writes the operator-mode lines, three real nats-servers (routes on 127.0.0.1) include them, and
`sapo bootstrap --nats ... --data-dir` issues each node a credential for its own key there. Two real
nodes train on each other's groups through the cluster; anonymous clients are refused; a bootstrap
whose keys the cluster does not know, or a cluster open to anyone, is refused with what to do."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from test_swarm_nodes import free_port, wait_http

from engine.models.policy import build_tiny_policy
from engine.swarm.nats_server import NatsServer, NatsServerConfig


def _bootstrap(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine", "bootstrap", *args], check=False, capture_output=True,
                          text=True, timeout=timeout)


def _cluster(auth_config: str) -> list[NatsServer]:
    route_ports = [free_port() for _ in range(3)]
    servers = []
    for i, port in enumerate(route_ports):
        routes = tuple(f"nats-route://127.0.0.1:{q}" for j, q in enumerate(route_ports) if j != i)
        servers.append(NatsServer(NatsServerConfig(websocket_port=None, monitor_port=None, cluster_port=port,
                                                   routes=routes, server_name=f"op{i}", auth_config=auth_config)))
    for server in servers:
        server.start()
    return servers


def _anonymous_connects(urls: list[str]) -> bool:
    import nats

    async def main() -> bool:
        async def quiet(exc: Exception) -> None:
            pass

        try:
            nc = await nats.connect(servers=urls, connect_timeout=3, allow_reconnect=False, error_cb=quiet)
        except Exception:  # noqa: BLE001 -- refused
            return False
        await nc.close()
        return True

    return asyncio.run(main())


def test_nats_without_keys_or_open_is_refused_with_what_to_do(tmp_path: Path) -> None:
    proc = _bootstrap("--nats", "nats://127.0.0.1:4222", "--port", "0")
    assert proc.returncode == 2 and "--data-dir" in proc.stderr and "--nats-open" in proc.stderr
    proc = _bootstrap("--nats-auth-out", str(tmp_path / "auth.conf"))
    assert proc.returncode == 2 and "--data-dir" in proc.stderr


@pytest.mark.timeout(240)
def test_two_nodes_train_through_an_operators_cluster_with_credentials(tmp_path: Path) -> None:
    boot_dir, auth_file = tmp_path / "boot", tmp_path / "sapo-auth.conf"
    proc = _bootstrap("--data-dir", str(boot_dir), "--nats-auth-out", str(auth_file))
    assert proc.returncode == 0, proc.stderr
    assert "include it" in proc.stderr and "operator:" in auth_file.read_text()
    servers = _cluster(auth_file.read_text())
    urls = [s.url for s in servers]
    boot = nodes = None
    try:
        assert not _anonymous_connects(urls)  # the cluster itself refuses clients without a credential
        # A bootstrap with other keys: the cluster refuses it, and the bootstrap says what to do.
        stranger = _bootstrap("--host", "127.0.0.1", "--port", "0", "--data-dir", str(tmp_path / "other"),
                              *[a for u in urls for a in ("--nats", u)], timeout=90)
        assert stranger.returncode == 1 and "--nats-auth-out" in stranger.stderr, stranger.stderr[-2000:]

        port = free_port()
        boot = subprocess.Popen([sys.executable, "-m", "engine", "bootstrap", "--host", "127.0.0.1", "--port",
                                 str(port), "--data-dir", str(boot_dir), "--board-replicas", "3",
                                 *[a for u in urls for a in ("--nats", u)]],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_http(f"http://127.0.0.1:{port}/status", timeout=60)
        model = build_tiny_policy(tmp_path / "model")
        nodes = [subprocess.Popen(
            [sys.executable, "-m", "engine", "run", "--headless", "--model", str(model), "--data-dir",
             str(tmp_path / f"n{i}"), "--rounds", "30", "--bootstrap", f"ws://127.0.0.1:{port}", "--no-mdns",
             "--listen", "127.0.0.1:0", "--local", "2", "--external", "2", "--set", "filter_zero_advantage=false",
             "--set", "completions=4", "--set", "eval_every=0", "--seed", str(i)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(2)]
        for node in nodes:
            _, err = node.communicate(timeout=180)
            assert node.returncode == 0, err.decode()[-3000:]
        status = wait_http(f"http://127.0.0.1:{port}/status")
        assert status["board"]["credentials"] and status["board"]["credentials_issued"] >= 2
        assert status["frames"]["rollouts"] == 0  # through the cluster only
    finally:
        for p in (nodes or []) + ([boot] if boot else []):
            if p.poll() is None:
                p.kill()
            p.wait()
        for server in servers:
            server.close()
    for i in range(2):
        db = sqlite3.connect(tmp_path / f"n{i}" / "node.db")
        used = db.execute("SELECT COUNT(*) FROM rollouts WHERE status = 'used'").fetchone()[0]
        db.close()
        assert used > 0, f"node {i} never trained on the other's group"


@pytest.mark.timeout(120)
def test_a_cluster_open_to_anyone_is_refused_unless_asked_for(tmp_path: Path) -> None:
    servers = _cluster("")
    urls = [s.url for s in servers]
    try:
        assert _anonymous_connects(urls)
        proc = _bootstrap("--host", "127.0.0.1", "--port", "0", "--data-dir", str(tmp_path / "boot"),
                          *[a for u in urls for a in ("--nats", u)], timeout=90)
        assert proc.returncode == 1 and "without credentials" in proc.stderr, proc.stderr[-2000:]
    finally:
        for server in servers:
            server.close()
