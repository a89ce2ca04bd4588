"""`sapo bootstrap` restarted (the process stopped and started again with the same flags): nodes that
were connected come back, over TLS with the same CA check, and with the same `--data-dir` the credentials
it issued before stay valid and the board keeps its frames.

Everything is real and on 127.0.0.1: bootstrap processes, their embedded nats-servers, a CA and
certificates made here (test_tls's `pki`), nodes (SwarmService) and board clients."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID
from swarm_helpers import Node, make_group, node_board, real_groups, swarm_config, wait_for
from test_board_attacks import credential_from_bootstrap
from test_tls import FAST, Pki, _builder, _https_json, _key, _plain_nats_client_is_refused, pki  # noqa: F401
from websockets.asyncio.client import connect

from engine.swarm import protocol as p
from engine.swarm.board import BoardReader, fetch
from engine.swarm.board_client import nats_board_factory
from engine.swarm.config import ProtocolLimits
from engine.swarm.errors import ConnectError
from engine.swarm.identity import Identity
from engine.swarm.nats_auth import Credential, connect_options, node_inbox
from engine.swarm.nats_server import free_port, port_in_use
from engine.swarm.tls import client_context
from engine.swarm.transport import dial
from engine.swarm.wire import Hello


class Bootstrap:
    """One `sapo bootstrap` process on 127.0.0.1:port (its board on port + 1), restartable."""

    def __init__(self, port: int, data_dir: Path, *extra: str, ca: Path | None = None) -> None:
        self.port, self.data_dir, self.extra, self.ca = port, data_dir, extra, ca
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def status_url(self) -> str:
        return f"{'https' if self.ca else 'http'}://127.0.0.1:{self.port}/status"

    @property
    def url(self) -> str:
        return f"{'wss' if self.ca else 'ws'}://127.0.0.1:{self.port}"

    @property
    def board_url(self) -> str:
        return f"{'tls' if self.ca else 'nats'}://127.0.0.1:{self.port + 1}"

    def start(self, timeout_s: float = 15.0) -> dict[str, Any]:
        self.starts += 1
        with self._log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen([sys.executable, "-m", "engine", "bootstrap", "--host", "127.0.0.1",
                                          "--port", str(self.port), "--nats-ws-port", "-1", "--data-dir",
                                          str(self.data_dir), *self.extra], stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.status()
            except OSError:
                assert self.proc.poll() is None, f"the bootstrap exited: {self.log()}"
                assert time.monotonic() < deadline, f"no /status within {timeout_s} s: {self.log()}"
                time.sleep(0.1)

    def status(self) -> dict[str, Any]:
        if self.ca is not None:
            return _https_json(self.status_url, self.ca)
        with urllib.request.urlopen(self.status_url, timeout=2) as resp:
            return dict(json.loads(resp.read()))

    def log(self) -> str:
        return self._log_path.read_text(errors="replace")[-3000:]

    @property
    def _log_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}-{self.starts}.log"

    def stop(self) -> None:
        """SIGTERM, as an operator's service manager stops it; its nats-server goes with it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


def _free_pair() -> int:
    """A port P with P + 1 free too (the bootstrap and its board)."""
    for _ in range(100):
        port = free_port()
        if port < 65535 and not port_in_use("127.0.0.1", port + 1):
            return port
    raise RuntimeError("no two adjacent free ports")


@pytest.fixture
def bootstrap_factory(tmp_path: Path) -> Iterator[Any]:
    made: list[Bootstrap] = []

    def make(*extra: str, ca: Path | None = None) -> Bootstrap:
        boot = Bootstrap(_free_pair(), tmp_path / "boot", *extra, ca=ca)
        made.append(boot)
        return boot

    yield make
    for boot in made:
        boot.stop()


@dataclass(frozen=True)
class OtherCa:
    """A CA the swarm does not use, and a certificate it issued for 127.0.0.1 (an impostor's)."""

    ca: Path
    cert: Path
    key: Path


def _other_ca(directory: Path) -> OtherCa:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key(directory / "ca.key")
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Somebody else's CA")])
    ca = (_builder("Somebody else's CA", name, ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = _key(directory / "server.key")
    cert = (_builder("localhost", name, key.public_key())
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return OtherCa(directory / "ca.pem", directory / "server.pem", directory / "server.key")


def _frame(ident: Identity, index: int) -> bytes:
    (frame,) = p.SwarmProtocol(ident, ProtocolLimits()).encode_rollouts([make_group(ident.peer_id, index=index)])
    return frame


async def _board(urls: list[str], ident: Identity, cred: Credential, **options: Any) -> Any:
    """A node's board connection on `cred` (as a credentialed node makes it), within 10 s."""
    return await asyncio.wait_for((await node_board(urls, ident, cred, **options)).connect(), 10)


async def _fetch_origins(urls: list[str], ident: Identity, cred: Credential, **options: Any) -> set[str]:
    """The origins of the frames a node fetches from the board with `cred` (connecting afresh)."""
    board = await _board(urls, ident, cred, **options)
    try:
        reader = BoardReader(p.SwarmProtocol(ident, ProtocolLimits()))
        return {r.origin for r in await asyncio.wait_for(fetch(board, reader, 8), 10)}
    finally:
        await board.close()


@pytest.mark.timeout(60)
def test_credentials_and_frames_outlive_a_restart_with_the_same_data_dir(bootstrap_factory: Any) -> None:
    boot = bootstrap_factory()
    boot.start()
    writer, reader = Identity.generate(), Identity.generate()

    async def before() -> tuple[Credential, Credential]:
        creds = [Credential(*await credential_from_bootstrap(boot.url, ident)) for ident in (writer, reader)]
        board = await _board([boot.board_url], writer, creds[0])
        try:
            await asyncio.wait_for(board.put(writer.peer_id, _frame(writer, 1)), 10)
        finally:
            await board.close()
        assert await _fetch_origins([boot.board_url], reader, creds[1]) == {writer.peer_id}
        return creds[0], creds[1]

    writer_cred, reader_cred = asyncio.run(before())
    boot.stop()
    status = boot.start()
    assert status["uptime_s"] < 10 and status["board"]["credentials_issued"] == 0  # a new process

    async def after() -> None:
        # the credentials issued by the first process, without a word to the second one
        assert await _fetch_origins([boot.board_url], reader, reader_cred) == {writer.peer_id}, (
            "the board lost its frames in the restart")
        board = await _board([boot.board_url], writer, writer_cred)
        try:
            await asyncio.wait_for(board.put(writer.peer_id, _frame(writer, 2)), 10)
        finally:
            await board.close()

    asyncio.run(after())


async def _credential(url: str, ident: Identity, ca: Path) -> Credential:
    """What any node does, over wss:// pinning `ca`: hello to the bootstrap, take the `creds` frame."""
    conn = p.PeerConnection(p.SwarmProtocol(ident, ProtocolLimits()), Hello("a" * 16, "node", "m", "t", None), 0.0)
    async with asyncio.timeout(10), connect(url, ssl=client_context(ca)) as ws:
        await ws.send(conn.hello_frame())
        while True:
            for event in conn.receive(await ws.recv()):
                if isinstance(event, p.CredentialReceived):
                    return Credential(event.jwt, event.expires_at)


async def _refused_everywhere(boot: Bootstrap, wrong_ca: Path, ident: Identity, cred: Credential) -> None:
    """A client pinning another CA gets neither the rendezvous nor the board, valid credential or not."""
    with pytest.raises(ConnectError, match="certificate is not trusted"):
        await asyncio.wait_for(dial(boot.url, ProtocolLimits(), FAST, str(wrong_ca)), 10)
    options = connect_options(ident.sign, lambda: cred, node_inbox(ident.peer_id))
    with pytest.raises(ConnectError, match="certificate verify failed"):
        await asyncio.wait_for(nats_board_factory(60, 1 << 20, str(wrong_ca))([boot.board_url], options, False), 10)


def _on_board(node: Node) -> bool:
    """Whether a node's board client is connected to a server now (not reconnecting)."""
    board: Any = node.service.board.board
    return board is not None and board.nc is not None and bool(board.nc.is_connected)


def _links(nodes: list[Node]) -> list[int]:
    """Each node's open links (no listener here: its link to the bootstrap, or none)."""
    return [int(n.service.stats()["links"]) for n in nodes]


@pytest.mark.timeout(90)
def test_a_tls_bootstrap_restarted_under_its_nodes_takes_them_back_over_tls_with_the_same_ca_check(
        pki: Pki, bootstrap_factory: Any, tmp_path: Path) -> None:  # noqa: F811 -- pki is test_tls's fixture
    boot = bootstrap_factory("--tls-cert", str(pki.cert), "--tls-key", str(pki.key), ca=pki.ca)
    wrong_ca = _other_ca(tmp_path / "wrong").ca
    status = boot.start()
    assert status["tls"] and status["url"].startswith("wss://") and status["board"]["urls"][0].startswith("tls://")
    nodes = [Node(swarm_config(listen=False, bootstrap_urls=(boot.url,), ca_file=str(pki.ca))) for _ in range(2)]
    stranger = Node(swarm_config(listen=False, bootstrap_urls=(boot.url,), ca_file=str(wrong_ca)))

    def on_tls_board() -> bool:
        return all(_on_board(n) and n.service.board.credential is not None and
                   n.service.board.urls[0].startswith("tls://") for n in nodes)

    async def exchange(seed: int) -> None:
        alice, bob = nodes
        received = bob.pool.stats()["received"]
        assert await alice.service.publish(real_groups(alice.identity.peer_id, 2, seed=seed)) >= 1
        for _ in range(50):  # bob fetches until alice's new groups are in his pool
            await bob.service.fetch(2)
            if bob.pool.stats()["received"] >= received + 2:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"alice's groups never reached bob through the TLS board: {bob.service.board.stats()}")

    async def main() -> None:
        spy = Identity.generate()
        spy_cred = await _credential(boot.url, spy, pki.ca)  # valid, but it will pin the wrong CA
        for node in [*nodes, stranger]:
            await node.service.start()
        try:
            await wait_for(on_tls_board, 20, "both nodes on the TLS board with a credential")
            await exchange(seed=1)
            await _refused_everywhere(boot, wrong_ca, spy, spy_cred)
            old = [n.service.board.credential for n in nodes]
            await asyncio.to_thread(boot.stop)
            await wait_for(lambda: _links(nodes) == [0, 0], 10, "the nodes saw the bootstrap go")
            after = await asyncio.to_thread(boot.start)
            assert after["tls"] and after["uptime_s"] < 10
            # back at the rendezvous (each with a credential from the new process) and on the board,
            # over TLS, by themselves
            await wait_for(lambda: _links(nodes) == [1, 1] and all(
                n.service.board.credential not in (None, old[i]) for i, n in enumerate(nodes)), 20,
                "both nodes back at the restarted bootstrap")
            await wait_for(on_tls_board, 20, "both nodes back on the TLS board")
            await exchange(seed=2)
            assert (await asyncio.to_thread(boot.status))["connections"] == 2  # the stranger never got in
            assert stranger.service.board.credential is None and _links([stranger]) == [0]
            await _refused_everywhere(boot, wrong_ca, spy, spy_cred)
        finally:
            for node in [*nodes, stranger]:
                await node.service.stop()

    asyncio.run(main())
    _plain_nats_client_is_refused(boot.port + 1)  # the restarted board still asks for TLS of everyone


@pytest.mark.timeout(90)
def test_nodes_reconnecting_to_a_restarted_address_refuse_a_certificate_from_another_ca(
        pki: Pki, bootstrap_factory: Any, tmp_path: Path) -> None:  # noqa: F811 -- pki is test_tls's fixture
    """Between the bootstrap's stop and its start, something else answers on its ports with a certificate
    another CA issued: the nodes' reconnections (rendezvous and board) check it as their first connection
    did, take nothing from it, and come back to the real bootstrap when it is up again."""
    boot = bootstrap_factory("--tls-cert", str(pki.cert), "--tls-key", str(pki.key), ca=pki.ca)
    other = _other_ca(tmp_path / "other")
    impostor = Bootstrap(boot.port, tmp_path / "impostor", "--tls-cert", str(other.cert), "--tls-key",
                         str(other.key), ca=other.ca)
    boot.start()
    nodes = [Node(swarm_config(listen=False, bootstrap_urls=(boot.url,), ca_file=str(pki.ca))) for _ in range(2)]

    async def main() -> None:
        for node in nodes:
            await node.service.start()
        try:
            await wait_for(lambda: all(n.service.board.credential is not None for n in nodes) and
                           _links(nodes) == [1, 1], 20, "both nodes at the bootstrap with a credential")
            old = [n.service.board.credential for n in nodes]
            await asyncio.to_thread(boot.stop)
            try:
                await asyncio.to_thread(impostor.start)
                # the nodes redial every 0.5 s at most (FAST) and nats-py every 0.5 s: a few tries each
                await asyncio.sleep(3.0)
                assert _links(nodes) == [0, 0], "a node linked to a bootstrap its CA did not issue"
                assert [n.service.board.credential for n in nodes] == old, "a node took the impostor's credential"
                assert (await asyncio.to_thread(impostor.status))["connections"] == 0
                assert not any(_on_board(n) for n in nodes), "a node's board reconnected to a server its CA did not issue"
            finally:
                await asyncio.to_thread(impostor.stop)
            await asyncio.to_thread(boot.start)
            await wait_for(lambda: _links(nodes) == [1, 1] and all(map(_on_board, nodes)), 20,
                           "both nodes back at the real bootstrap and its board")
        finally:
            for node in nodes:
                await node.service.stop()

    asyncio.run(main())


@pytest.mark.timeout(90)
def test_a_node_revoked_before_a_restart_stays_revoked_after_it(bootstrap_factory: Any) -> None:
    """The warden revokes a flooder (over `sapo bootstrap`'s 1 MiB/s, 16 MiB burst); a restart with the
    same --data-dir must not lift the ban: its credential from before is refused, it gets no new one."""
    boot = bootstrap_factory()
    boot.start()
    flooder = Identity.generate()

    async def flood() -> Credential:
        cred = Credential(*await credential_from_bootstrap(boot.url, flooder))
        board = await _board([boot.board_url], flooder, cred)
        deadline = time.monotonic() + 30
        try:
            while not board.closed.is_set():  # ~10 MiB/s: over the burst in ~2 s, read every 2 s
                assert time.monotonic() < deadline, f"the flooder was never revoked: {boot.log()}"
                for _ in range(16):
                    await board.nc.publish(f"sapo.rollouts.{flooder.peer_id}", b"y" * (60 * 1024))
                await asyncio.sleep(0.1)
        finally:
            await board.close()
        return cred

    cred = asyncio.run(flood())
    assert "revoked node" in boot.log()
    boot.stop()
    boot.start()

    async def after() -> None:
        with pytest.raises(ConnectError, match="Authorization|authorization"):
            for _ in range(20):  # the first second after the start: the warden pushes its bans at once
                board = await _board([boot.board_url], flooder, cred)
                await board.close()
                await asyncio.sleep(0.2)
        with pytest.raises(TimeoutError):  # and the restarted bootstrap issues it nothing
            await asyncio.wait_for(credential_from_bootstrap(boot.url, flooder), 3)

    asyncio.run(after())
