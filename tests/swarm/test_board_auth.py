"""Who may write which board key: NKeys and JWTs on hand-built values, then a real nats-server in
operator mode where a node's own ed25519 key is its NATS identity and it may write only its own key."""

from __future__ import annotations

import asyncio
import time

import pytest
from swarm_helpers import make_group, node_board

from engine.swarm import protocol as p
from engine.swarm.board import BoardReader, fetch, key_subject
from engine.swarm.config import ProtocolLimits
from engine.swarm.errors import ProtocolError
from engine.swarm.identity import Identity
from engine.swarm.nats_auth import Authority, decode_jwt, nkey, nkey_public, user_nkey_of
from engine.swarm.nats_board import create_board_stream
from engine.swarm.wire import credential_from_wire


def test_nkeys_round_trip_and_catch_typos() -> None:
    raw = bytes(range(32))
    text = nkey("U", raw)
    assert text.startswith("U") and nkey_public(text) == ("U", raw)
    assert nkey("O", raw).startswith("O") and nkey("A", raw).startswith("A")
    broken = text[:10] + ("A" if text[10] != "A" else "B") + text[11:]
    with pytest.raises(ValueError, match="NKey"):
        nkey_public(broken)
    ident = Identity.generate()
    from engine.swarm.identity import b64url_decode

    assert nkey_public(user_nkey_of(ident.peer_id))[1] == b64url_decode(ident.peer_id, 32)


def test_issued_credentials_verify_and_tampering_does_not() -> None:
    auth, ident = Authority.generate(), Identity.generate()
    cred = auth.issue(ident.peer_id, "S", ttl_s=60, now=1000.0)
    claims = decode_jwt(cred.jwt, auth.account_nkey)
    assert claims["sub"] == user_nkey_of(ident.peer_id) and claims["exp"] == 1060 and cred.expires_at == 1060
    assert claims["nats"]["pub"]["allow"][0] == key_subject(ident.peer_id)
    import base64
    import json

    head, _body, sig = cred.jwt.split(".")
    claims["nats"]["pub"]["allow"] = [">"]  # a node granting itself every key, keeping the signature
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    with pytest.raises(ValueError, match="verify"):
        decode_jwt(f"{head}.{forged}.{sig}")
    with pytest.raises(ValueError, match="another issuer"):
        decode_jwt(cred.jwt, auth.operator_nkey)
    assert credential_from_wire({"jwt": cred.jwt, "expires": 1060})[0] == cred.jwt
    for bad in ({"jwt": "x", "expires": 1}, {"jwt": cred.jwt + " ", "expires": 1}, {"jwt": cred.jwt, "expires": "soon"}):
        with pytest.raises(ProtocolError):
            credential_from_wire(bad)


@pytest.fixture(scope="module")
def authority_server():  # type: ignore[no-untyped-def]
    from engine.swarm.nats_server import NatsServer, NatsServerConfig

    auth = Authority.generate(stream="AUTH")
    with NatsServer(NatsServerConfig(websocket_port=None, monitor_port=None, auth_config=auth.server_config())) as srv:
        yield auth, srv.url


async def _board(url: str, ident: Identity, cred):  # type: ignore[no-untyped-def]
    return await (await node_board([url], ident, cred, stream="AUTH", max_age_s=60)).connect(timeout_s=3)


@pytest.mark.timeout(60)
def test_a_node_writes_only_its_own_key_and_reads_everyone(authority_server) -> None:  # type: ignore[no-untyped-def]
    auth, url = authority_server
    alice, bob = Identity.generate(), Identity.generate()

    async def main() -> None:
        await create_board_stream(url, auth)
        a = await _board(url, alice, auth.issue(alice.peer_id, "AUTH", 60))
        b = await _board(url, bob, auth.issue(bob.peer_id, "AUTH", 60))
        try:
            a_proto = p.SwarmProtocol(alice, ProtocolLimits())
            (frame,) = a_proto.encode_rollouts([make_group(alice.peer_id)])
            await a.put(alice.peer_id, frame)
            with pytest.raises(Exception):  # noqa: B017 -- the server: permissions violation (nats-py: timeout)
                await a.put(bob.peer_id, frame)  # alice writing bob's key
            with pytest.raises(Exception):  # noqa: B017 -- nor may a node create or change the stream
                from nats.js.api import StreamConfig

                await a.js.add_stream(StreamConfig(name="MINE", subjects=["x.>"]))
            got = await fetch(b, BoardReader(p.SwarmProtocol(bob, ProtocolLimits())), 2)
            assert [r.origin for r in got] == [alice.peer_id]  # bob reads alice's frame, verified
        finally:
            await a.close()
            await b.close()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_expired_or_foreign_credentials_are_refused(authority_server) -> None:  # type: ignore[no-untyped-def]
    from engine.swarm.errors import ConnectError

    auth, url = authority_server
    alice, mallory = Identity.generate(), Identity.generate()
    expired = auth.issue(alice.peer_id, "AUTH", ttl_s=60, now=time.time() - 3600)
    stolen = auth.issue(alice.peer_id, "AUTH", 60)
    other = Authority.generate().issue(alice.peer_id, "AUTH", 60)

    async def refused(ident: Identity, cred) -> None:  # type: ignore[no-untyped-def]
        with pytest.raises(ConnectError):
            board = await _board(url, ident, cred)
            await board.close()

    async def main() -> None:
        await refused(alice, expired)
        await refused(mallory, stolen)  # a copied JWT is useless without alice's key to sign the nonce
        await refused(alice, other)  # signed by an account this server does not know

    asyncio.run(main())


def test_only_a_bootstrap_may_hand_out_credentials() -> None:
    from engine.swarm.wire import Hello

    auth = Authority.generate()
    me, stranger, boot = Identity.generate(), Identity.generate(), Identity.generate()
    cred = auth.issue(me.peer_id, "S", 60)

    def link_to(other: Identity, role: str) -> tuple[p.PeerConnection, p.PeerConnection]:
        mine = p.PeerConnection(p.SwarmProtocol(me, ProtocolLimits()), Hello("0" * 16, "node", "m", "t", None), 0.0)
        theirs = p.PeerConnection(p.SwarmProtocol(other, ProtocolLimits()), Hello("1" * 16, role, "", "", None), 0.0)
        assert isinstance(mine.receive(theirs.hello_frame())[0], p.HelloReceived)
        return mine, theirs

    mine, theirs = link_to(boot, "bootstrap")
    (event,) = mine.receive(theirs.creds_frame(cred.jwt, cred.expires_at))
    assert isinstance(event, p.CredentialReceived) and event.jwt == cred.jwt
    mine, theirs = link_to(stranger, "node")
    (event,) = mine.receive(theirs.creds_frame(cred.jwt, cred.expires_at))
    assert isinstance(event, p.FrameRefused) and event.reason == "unexpected"


@pytest.mark.timeout(60)
def test_a_node_that_cannot_reach_tcp_uses_the_websocket(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Behind a proxy that passes only HTTP: the TCP URL fails, the ws:// one carries the board."""
    from engine.swarm.board_client import BoardClient, nats_board_factory
    from engine.swarm.loops import Backoff
    from engine.swarm.nats_server import NatsServer, NatsServerConfig, free_port

    auth = Authority.generate()
    with NatsServer(NatsServerConfig(monitor_port=None, websocket_port=0, auth_config=auth.server_config())) as srv:
        async def main() -> None:
            await create_board_stream(srv.url, auth)
            me = Identity.generate()
            logs: list[str] = []
            client = BoardClient(p.SwarmProtocol(me, ProtocolLimits()), lambda lvl, msg: logs.append(msg),
                                 nats_board_factory(60, 1 << 20))
            cred = auth.issue(me.peer_id, "SAPO_ROLLOUTS", 60)
            assert client.set_credential(cred.jwt, cred.expires_at)
            dead_tcp = f"nats://127.0.0.1:{free_port()}"
            await asyncio.wait_for(client.connect_loop([dead_tcp, srv.websocket_url], Backoff(0.1, 0.5)), 30)
            (frame,) = p.SwarmProtocol(me, ProtocolLimits()).encode_rollouts([make_group(me.peer_id)])
            assert await client.put(frame) and client.counters["puts"] == 1
            assert any(srv.websocket_url in msg for msg in logs)
            await client.close()

        asyncio.run(main())


@pytest.mark.timeout(90)
def test_the_board_connection_outlives_its_credentials() -> None:
    """The servers close a connection whose JWT expires (nats-py then gives up for good): a renewal moves
    the live connection onto the new JWT first, and a connection that expired anyway (no renewal in
    time) is replaced once a renewal comes, with nothing asked of the dead client meanwhile."""
    from engine.swarm.board_client import BoardClient, nats_board_factory
    from engine.swarm.loops import Backoff
    from engine.swarm.nats_server import NatsServer, NatsServerConfig

    auth = Authority.generate()
    with NatsServer(NatsServerConfig(websocket_port=None, monitor_port=None, auth_config=auth.server_config())) as srv:
        async def main() -> None:
            await create_board_stream(srv.url, auth)
            me = Identity.generate()
            proto = p.SwarmProtocol(me, ProtocolLimits())
            logs: list[str] = []
            client = BoardClient(proto, lambda lvl, msg: logs.append(msg), nats_board_factory(60, 1 << 20))

            async def put_works() -> bool:
                (frame,) = proto.encode_rollouts([make_group(me.peer_id)])
                return await client.put(frame)

            async def until(check, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
                deadline = time.monotonic() + timeout_s
                while not check():
                    assert time.monotonic() < deadline, logs
                    await asyncio.sleep(0.05)

            short = auth.issue(me.peer_id, "SAPO_ROLLOUTS", 3)
            assert client.set_credential(short.jwt, short.expires_at)
            task = asyncio.create_task(client.keep_connected([srv.url], Backoff(0.1, 0.5)))
            await until(lambda: client.connected, 10)
            first = client.board
            # renewed before it expires: the live connection moves onto the new JWT and stays up
            renewed = auth.issue(me.peer_id, "SAPO_ROLLOUTS", 7)  # JWTs expire on whole seconds
            assert client.set_credential(renewed.jwt, renewed.expires_at)
            await client.reauthenticate()
            await asyncio.sleep(max(0.0, short.expires_at - time.time()) + 1.5)
            assert client.board is first and not first.closed.is_set(), logs
            assert await put_works()
            # no renewal in time: the servers close it; puts fail fast, and a late renewal heals it
            await until(lambda: not client.connected, renewed.expires_at - time.time() + 5)
            assert first.closed.is_set() and any("board connection ended" in m for m in logs)
            assert not await put_works()
            late = auth.issue(me.peer_id, "SAPO_ROLLOUTS", 60)
            assert client.set_credential(late.jwt, late.expires_at)
            await until(lambda: client.connected, 15)
            assert client.board is not first and await put_works()
            await client.close()
            await asyncio.wait_for(task, 5)  # a deliberate close ends the loop instead of reconnecting

        asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_node_whose_puts_fail_says_why_in_its_status_and_the_app() -> None:
    from app.models.peers import board_text, parse_board
    from engine.node.swarm import board_summary
    from engine.swarm.board_client import BoardClient, nats_board_factory
    from engine.swarm.loops import Backoff
    from engine.swarm.nats_board import STREAM, admin_board
    from engine.swarm.nats_server import NatsServer, NatsServerConfig

    auth = Authority.generate()
    server = NatsServer(NatsServerConfig(websocket_port=None, monitor_port=None, auth_config=auth.server_config()))
    url = server.start().url
    me = Identity.generate()
    proto = p.SwarmProtocol(me, ProtocolLimits())

    async def main() -> None:
        await create_board_stream(url, auth)
        client = BoardClient(proto, lambda lvl, msg: None, nats_board_factory(60, 1 << 20))
        cred = auth.issue(me.peer_id, STREAM, 60)
        assert client.set_credential(cred.jwt, cred.expires_at)
        await asyncio.wait_for(client.connect_loop([url], Backoff(0.1, 0.5)), 20)
        admin = await admin_board(url, auth).connect()
        await admin.js.delete_stream(STREAM)  # what a restarted server without its stream looks like
        (frame,) = proto.encode_rollouts([make_group(me.peer_id)])
        assert not await client.put(frame)
        status = board_summary(client.stats())
        assert status["put_error"] and status["put_errors"] == 1
        line = board_text(parse_board(status), time.time())
        assert "not reaching the board" in line and status["put_error"][:40] in line
        await create_board_stream(url, auth)
        assert await client.put(frame), client.put_error
        assert board_summary(client.stats())["put_error"] == ""
        assert "not reaching" not in board_text(parse_board(board_summary(client.stats())), time.time())
        await admin.close()
        await client.close()

    try:
        asyncio.run(main())
    finally:
        server.close()
