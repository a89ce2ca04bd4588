"""Two `sapo bootstrap` processes on one host: the embedded nats-server's ports follow --port (port+1,
port+2), so both come up; a taken NATS port fails at once with the port and the flag to change, not with
an error about cluster keys from whoever holds that port."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from test_swarm_nodes import wait_http

from engine.control.launcher import stop_process
from engine.swarm.board_host import nats_ports


def _free_block(width: int = 3) -> int:
    """A port P with P..P+width-1 all free on 127.0.0.1 (a bootstrap takes P, its board P+1 and P+2)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + width > 65535:
            continue
        try:
            probes = []
            for offset in range(width):
                probe = socket.socket()
                probes.append(probe)
                probe.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise RuntimeError("no block of free ports")


def _start(port: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "engine", "bootstrap", "--host", "127.0.0.1", "--port",
                             str(port), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_default_nats_ports_follow_the_bootstraps_port() -> None:
    assert nats_ports(7700, None, None) == (7701, 7702)
    assert nats_ports(9000, None, None) == (9001, 9002)
    assert nats_ports(0, None, None) == (0, 0)  # any free, like --port 0
    assert nats_ports(9000, 4222, -1) == (4222, None)  # given ports win; -1 = no websocket
    with pytest.raises(ValueError, match="--nats-port"):
        nats_ports(65535, None, None)


@pytest.mark.timeout(120)
def test_two_bootstraps_on_one_host_both_serve_status(tmp_path: Path) -> None:
    first_port = _free_block()
    first = _start(first_port)
    try:
        first_status = wait_http(f"http://127.0.0.1:{first_port}/status", timeout=60)
        second_port = _free_block()
        second = _start(second_port)
        try:
            second_status = wait_http(f"http://127.0.0.1:{second_port}/status", timeout=60)
            assert second.poll() is None and first.poll() is None
        finally:
            stop_process(second, 15)
    finally:
        stop_process(first, 15)
    for port, status in ((first_port, first_status), (second_port, second_status)):
        board_ports = sorted(urlsplit(url).port for url in status["board"]["urls"])
        assert board_ports == [port + 1, port + 2], status["board"]["urls"]


@pytest.mark.timeout(60)
def test_a_busy_nats_port_is_named_with_the_flag_to_change(tmp_path: Path) -> None:
    port = _free_block()
    holder = socket.socket()
    try:  # whoever holds port+1: a listener like another bootstrap's board
        holder.bind(("127.0.0.1", port + 1))
        holder.listen()
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "engine", "bootstrap", "--host", "127.0.0.1", "--port",
                               str(port)], capture_output=True, text=True, timeout=45, check=False)
    finally:
        holder.close()
    assert proc.returncode == 2, proc.stderr
    assert f"port {port + 1}" in proc.stderr and "--nats-port" in proc.stderr, proc.stderr
    assert "keys" not in proc.stderr and "board: embedded" not in proc.stderr, proc.stderr
    assert time.monotonic() - started < 30  # early: nothing waited on a server that never was ours

    holder = socket.socket()
    try:  # the websocket port taken instead: the other flag
        holder.bind(("127.0.0.1", port + 2))
        holder.listen()
        proc = subprocess.run([sys.executable, "-m", "engine", "bootstrap", "--host", "127.0.0.1", "--port",
                               str(port)], capture_output=True, text=True, timeout=45, check=False)
    finally:
        holder.close()
    assert proc.returncode == 2 and "--nats-ws-port" in proc.stderr, proc.stderr
