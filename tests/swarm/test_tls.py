"""TLS built into the bootstrap: wss:// for the rendezvous, tls:// and wss:// on the embedded board, and
nodes that verify it against a pinned CA (or the system's CAs, which do not know this test's CA).

Everything is real: a CA and a server certificate for 127.0.0.1/localhost made here, a nats-server in
operator mode with TLS, a BootstrapServer serving wss://, SwarmServices dialling it."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import socket
import urllib.request
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from swarm_helpers import Node, make_group, real_groups, swarm_config, wait_for

from engine.swarm import protocol as p
from engine.swarm.board_client import BoardClient, nats_board_factory
from engine.swarm.bootstrap import BootstrapServer
from engine.swarm.config import BootstrapConfig, LinkConfig, ProtocolLimits
from engine.swarm.errors import ConnectError
from engine.swarm.identity import Identity
from engine.swarm.loops import Backoff
from engine.swarm.nats_auth import STREAM, Authority
from engine.swarm.nats_board import create_board_stream
from engine.swarm.nats_server import NatsServer, NatsServerConfig, free_port
from engine.swarm.tls import TlsError, client_context, own_server_context, server_context
from engine.swarm.transport import dial

FAST = LinkConfig(reconnect_initial_s=0.1, reconnect_max_s=0.5, connect_timeout_s=3.0, ping_interval_s=1.0,
                  ping_timeout_s=2.0)


@dataclass(frozen=True)
class Pki:
    ca: Path  # the swarm's own CA certificate, what nodes pin
    cert: Path  # the server's certificate for 127.0.0.1 and localhost, issued by `ca`
    key: Path
    other_key: Path  # a key that does not belong to `cert`


def _key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return key


def _builder(subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer).public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca_key = _key(d / "ca.key")
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "SAPO test swarm CA")])
    usage = {"digital_signature": True, "content_commitment": False, "key_encipherment": False,
             "data_encipherment": False, "key_agreement": False, "encipher_only": False, "decipher_only": False}
    ca = (_builder("SAPO test swarm CA", ca_name, ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(key_cert_sign=True, crl_sign=True, **usage), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = _key(d / "server.key")
    cert = (_builder("localhost", ca_name, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(key_cert_sign=False, crl_sign=False, **usage), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (d / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (d / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _key(d / "other.key")
    return Pki(d / "ca.pem", d / "server.pem", d / "server.key", d / "other.key")


def test_tls_files_are_checked_with_sentences_a_user_understands(pki: Pki, tmp_path: Path) -> None:
    assert server_context(pki.cert, pki.key) and client_context(pki.ca) and own_server_context(pki.cert)
    with pytest.raises(TlsError, match="does not exist"):
        server_context(tmp_path / "missing.pem", pki.key)
    with pytest.raises(TlsError, match="does not belong to the certificate"):
        server_context(pki.cert, pki.other_key)
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(TlsError, match="not a PEM file"):
        server_context(tmp_path / "junk.pem", pki.key)
    with pytest.raises(TlsError, match="CA file .* does not exist"):
        client_context(tmp_path / "nope.pem")
    with pytest.raises(TlsError, match="holds no usable certificate"):
        client_context(pki.key)  # a key where the CA certificate should be
    with pytest.raises(ValueError, match="both"):
        BootstrapConfig(tls_cert_file=str(pki.cert))
    with pytest.raises(ValueError, match="both"):
        NatsServerConfig(tls_cert_file=pki.cert)


def test_the_command_lines_refuse_unusable_files_before_starting(pki: Pki, tmp_path: Path) -> None:
    import argparse

    from engine.cli import bootstrap as bootstrap_cli
    from engine.cli import run as run_cli
    from engine.settings import ContributorSettings

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    run_cli.register(sub)
    bootstrap_cli.register(sub)
    args = parser.parse_args(["run", "--data-dir", str(tmp_path), "--ca", str(tmp_path / "missing.pem")])
    with pytest.raises(ValueError, match="--ca: the CA file .* does not exist"):
        run_cli.build_config(args)
    args = parser.parse_args(["run", "--data-dir", str(tmp_path), "--bootstrap", "wss://127.0.0.1:7700",
                              "--ca", str(pki.ca)])
    swarm = run_cli.build_config(args).swarm
    assert swarm.ca_file == str(pki.ca.resolve()) and swarm.bootstrap_urls == ("wss://127.0.0.1:7700",)
    ContributorSettings(bootstrap_url="wss://boot.example:7700", ca_file=str(pki.ca)).save(tmp_path)
    args = parser.parse_args(["run", "--data-dir", str(tmp_path)])
    assert run_cli.build_config(args).swarm.ca_file == str(pki.ca)  # the settings' CA file
    with pytest.raises(ValueError, match="ca_file"):
        ContributorSettings(ca_file="ca.pem\n")
    args = parser.parse_args(["bootstrap", "--port", "0", "--tls-cert", str(pki.cert), "--tls-key",
                              str(pki.other_key), "--no-nats"])
    assert args.func(args) == 2  # the key does not match: refused before anything listens


def test_the_board_config_renders_tls_on_both_client_ports(pki: Pki, tmp_path: Path) -> None:
    from engine.swarm.nats_server import _render

    cfg = NatsServerConfig(tls_cert_file=pki.cert, tls_key_file=pki.key)
    text = _render(cfg, {"client": 1, "websocket": 2}, tmp_path)
    assert text.count(f'cert_file: "{pki.cert.resolve().as_posix()}"') == 2 and "no_tls" not in text
    assert "no_tls: true" in _render(NatsServerConfig(), {"client": 1, "websocket": 2}, tmp_path)


@pytest.fixture
def tls_board(pki: Pki):  # type: ignore[no-untyped-def]
    """A nats-server in operator mode serving TLS on its TCP and websocket ports, with the board's stream."""
    auth = Authority.generate()
    cfg = NatsServerConfig(monitor_port=None, websocket_port=0, auth_config=auth.server_config(),
                           tls_cert_file=pki.cert, tls_key_file=pki.key)
    with NatsServer(cfg) as srv:
        assert srv.url.startswith("tls://") and (srv.websocket_url or "").startswith("wss://")
        asyncio.run(create_board_stream(srv.url, auth, tls=own_server_context(pki.cert)))
        yield auth, srv


async def _tls_bootstrap(pki: Pki, auth: Authority, board_urls: tuple[str, ...]) -> BootstrapServer:
    cfg = BootstrapConfig(host="127.0.0.1", port=0, link=FAST, board_urls=board_urls, peers_sample=64,
                          tls_cert_file=str(pki.cert), tls_key_file=str(pki.key))
    server = BootstrapServer(cfg, log=lambda level, msg: None,
                             issue_credential=lambda peer_id: auth.issue(peer_id, STREAM, 60))
    await server.start()
    return server


def _https_json(url: str, ca: Path) -> dict:
    with urllib.request.urlopen(url, timeout=5, context=client_context(ca)) as resp:
        return json.loads(resp.read())


@pytest.mark.timeout(60)
def test_nodes_join_over_wss_and_share_through_the_tls_board(pki: Pki, tls_board) -> None:  # type: ignore[no-untyped-def]
    """Two nodes pin the swarm's CA: the wss:// rendezvous hands each its credential, and the board over
    tls:// carries one node's rollouts to the other."""
    auth, srv = tls_board

    async def main() -> None:
        server = await _tls_bootstrap(pki, auth, (srv.url, srv.websocket_url))
        assert server.url.startswith("wss://127.0.0.1:")
        status = await asyncio.to_thread(_https_json, server.status_url, pki.ca)
        assert status["url"] == server.url and status["tls"] and server.status_url.startswith("https://")
        nodes = [Node(swarm_config(listen=False, bootstrap_urls=(server.url,), ca_file=str(pki.ca)))
                 for _ in range(2)]
        try:
            for node in nodes:
                await node.service.start()
            await wait_for(lambda: all(n.service.board.connected and n.service.board.credential is not None
                                       for n in nodes), 20, "both nodes on the TLS board with a credential")
            assert all(n.service.board.urls[0].startswith("tls://") for n in nodes)
            alice, bob = nodes
            assert await alice.service.publish(real_groups(alice.identity.peer_id, 2)) >= 1
            await bob.service.publish(real_groups(bob.identity.peer_id, 1, seed=9))
            await bob.service.fetch(2)
            await wait_for(lambda: bob.pool.stats()["received"] >= 2, 10, "alice's groups at bob")
            assert bob.service.board.counters["puts"] == 1 and alice.service.board.counters["put_errors"] == 0
        finally:
            for node in nodes:
                await node.service.stop()
            await server.stop()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_the_board_over_wss_when_tcp_cannot_get_through(pki: Pki, tls_board) -> None:  # type: ignore[no-untyped-def]
    auth, srv = tls_board

    async def main() -> None:
        me, reader = Identity.generate(), Identity.generate()
        clients = []
        for ident in (me, reader):
            client = BoardClient(p.SwarmProtocol(ident, ProtocolLimits()), lambda lvl, msg: None,
                                 nats_board_factory(60, 1 << 20, str(pki.ca)))
            cred = auth.issue(ident.peer_id, STREAM, 60)
            assert client.set_credential(cred.jwt, cred.expires_at)
            dead_tcp = f"tls://127.0.0.1:{free_port()}"
            await asyncio.wait_for(client.connect_loop([dead_tcp, srv.websocket_url], Backoff(0.1, 0.5)), 30)
            clients.append(client)
        try:
            (frame,) = p.SwarmProtocol(me, ProtocolLimits()).encode_rollouts([make_group(me.peer_id)])
            assert await clients[0].put(frame)
            got = await clients[1].fetch(2)
            assert [r.origin for r in got] == [me.peer_id]
        finally:
            for client in clients:
                await client.close()

    asyncio.run(main())


def _plain_nats_client_is_refused(port: int) -> None:
    """A client that never starts TLS: the server said so in its INFO, and it gets no session."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        info = sock.makefile("rb").readline()
        assert info.startswith(b"INFO ") and json.loads(info[5:])["tls_required"] is True
        sock.sendall(b'CONNECT {"verbose":false}\r\nPING\r\n')
        received = b""
        try:
            while chunk := sock.recv(4096):
                received += chunk
        except (ConnectionResetError, TimeoutError):
            pass
        assert b"PONG" not in received


@pytest.mark.timeout(90)
def test_clients_that_do_not_trust_the_ca_or_skip_tls_are_refused(pki: Pki, tls_board) -> None:  # type: ignore[no-untyped-def]
    auth, srv = tls_board

    async def board(urls: list[str], ca_file: str = "") -> None:
        ident = Identity.generate()
        from engine.swarm.nats_auth import connect_options

        cred = auth.issue(ident.peer_id, STREAM, 60)
        made = await nats_board_factory(60, 1 << 20, ca_file)(urls, connect_options(ident.sign, lambda: cred),
                                                               False)
        await made.close()

    async def main() -> None:
        server = await _tls_bootstrap(pki, auth, (srv.url,))
        limits = ProtocolLimits()
        try:
            ws = await dial(server.url, limits, FAST, str(pki.ca))  # the pinned CA: accepted
            await ws.close()
            with pytest.raises(ConnectError, match="certificate is not trusted"):
                await dial(server.url, limits, FAST)  # the system's CAs do not know this swarm's CA
            with pytest.raises(ConnectError, match="not a websocket server|closed the connection"):
                await dial(server.url.replace("wss://", "ws://"), limits, FAST)  # plain to the TLS port
            await board([srv.url], str(pki.ca))  # the pinned CA: accepted
            with pytest.raises(ConnectError, match="certificate verify failed"):
                await board([srv.url])  # the system's CAs
            with pytest.raises(ConnectError):  # nats-py words it "no servers available" over websockets
                await board([srv.websocket_url])
            with pytest.raises(ConnectError):
                await board([srv.websocket_url.replace("wss://", "ws://")], str(pki.ca))
        finally:
            await server.stop()

    asyncio.run(main())
    _plain_nats_client_is_refused(srv.ports["client"])


@pytest.mark.timeout(60)
def test_a_tls_url_never_falls_back_to_plain(pki: Pki) -> None:
    """nats-py talks plain to a server that does not ask for TLS, whatever the URL says: the node refuses
    such a board (something between it and the board could be answering in the board's place)."""
    with NatsServer(NatsServerConfig(websocket_port=None, monitor_port=None)) as plain:
        async def main() -> None:
            make = nats_board_factory(60, 1 << 20, str(pki.ca))
            with pytest.raises(ConnectError, match="did not use TLS"):
                await make([plain.url.replace("nats://", "tls://")], {}, True)
            board = await make([plain.url], {}, True)  # nats:// to a plain server: plain, as asked
            await board.close()

        asyncio.run(main())


@pytest.mark.timeout(300)
def test_node_processes_train_through_a_tls_bootstrap(pki: Pki, tmp_path: Path) -> None:
    """`sapo bootstrap --tls-cert --tls-key` and two `sapo run --bootstrap wss://... --ca` processes on the
    tiny model: each trains on the other's groups, fetched from the board over TLS."""
    import subprocess
    import sys
    import time

    from engine.models.policy import build_tiny_policy

    model = build_tiny_policy(tmp_path / "model")
    port = free_port()
    boot = subprocess.Popen([sys.executable, "-m", "engine", "bootstrap", "--host", "127.0.0.1", "--port", str(port),
                             "--nats-port", "0", "--nats-ws-port", "0", "--tls-cert", str(pki.cert), "--tls-key",
                             str(pki.key)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    nodes: list[subprocess.Popen[bytes]] = []
    status_url = f"https://127.0.0.1:{port}/status"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status = _https_json(status_url, pki.ca)
                break
            except OSError:
                assert boot.poll() is None and time.monotonic() < deadline, boot.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
                time.sleep(0.2)
        assert status["url"].startswith("wss://") and status["board"]["urls"][0].startswith("tls://")
        for i in range(2):
            # A random tiny model solves nothing: without the zero-advantage filter peers' groups are eligible
            cmd = [sys.executable, "-m", "engine", "run", "--headless", "--model", str(model), "--data-dir",
                   str(tmp_path / f"n{i}"), "--rounds", "500", "--bootstrap", f"wss://127.0.0.1:{port}", "--ca",
                   str(pki.ca), "--no-mdns", "--listen", "127.0.0.1:0", "--local", "2", "--external", "2",
                   "--set", "filter_zero_advantage=false", "--set", "completions=4", "--set", "eval_every=0",
                   "--seed", str(i)]
            nodes.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        # until each trained on the other's groups (a node that starts first must not run out of rounds
        # while the other is still loading: under load the start-up lag is many tiny rounds), then SIGTERM
        deadline = time.monotonic() + 240
        while not all(_used_groups(tmp_path / f"n{i}" / "node.db") for i in range(2)):
            assert time.monotonic() < deadline, "the nodes never both trained on each other's groups"
            assert all(proc.poll() is None for proc in nodes), [proc.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
                                                                for proc in nodes if proc.poll() is not None]
            time.sleep(0.5)
        for proc in nodes:
            proc.terminate()  # as the app stops its engine: it leaves the swarm and exits cleanly
        for proc in nodes:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()[-3000:]
        status = _https_json(status_url, pki.ca)
        assert status["board"]["credentials_issued"] >= 2 and status["frames"]["rollouts"] == 0
        assert status["board"]["data_plane"]["reachable"]  # its monitoring port stays plain HTTP on loopback
    finally:
        for proc in [*nodes, boot]:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    for i in range(2):
        assert _used_groups(tmp_path / f"n{i}" / "node.db") > 0, f"node {i} never trained on its peer's groups"


def _used_groups(db_path: Path) -> int:
    """Peers' groups a node's store says it trained on (0 before its store exists)."""
    import sqlite3

    if not db_path.exists():
        return 0
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
    try:
        return int(db.execute("SELECT COUNT(*) FROM rollouts WHERE status = 'used'").fetchone()[0])
    except sqlite3.OperationalError:  # the node has not made its tables yet
        return 0
    finally:
        db.close()
