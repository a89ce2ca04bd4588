"""Transport glue on real loopback sockets: clear connect errors, caps, limits, backoff, direct links."""

from __future__ import annotations

import asyncio

import pytest
from swarm_helpers import Node, async_test, free_port, real_groups, swarm_config, wait_for
from websockets.asyncio.client import connect

from engine.swarm.config import LinkConfig, ProtocolLimits
from engine.swarm.errors import CapacityError, ConnectError, TransportError
from engine.swarm.loops import Backoff
from engine.swarm.transport import dial, listen

pytestmark = pytest.mark.timeout(60)
LIMITS, LINK = ProtocolLimits(), LinkConfig(connect_timeout_s=2.0)


@async_test
async def test_refused_says_what_to_try() -> None:
    url = f"ws://127.0.0.1:{free_port()}"
    with pytest.raises(ConnectError) as info:
        await dial(url, LIMITS, LINK)
    assert str(info.value) == (f"could not reach {url}: connection refused — is the server running? "
                               "check the URL/port/firewall")


@async_test
async def test_not_a_websocket_server() -> None:
    async def http_only(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(http_only, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ConnectError, match="HTTP 200 — is this a SAPO bootstrap or peer address"):
            await dial(f"ws://127.0.0.1:{port}", LIMITS, LINK)
    finally:
        server.close()


@async_test
async def test_silent_server_times_out_with_a_hint() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # never answers the handshake; ends when the client gives up

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ConnectError, match="no answer within 0.5 s — is the host up and the port open"):
            await dial(f"ws://127.0.0.1:{port}", LIMITS, LinkConfig(connect_timeout_s=0.5))
    finally:
        server.close()


@async_test
async def test_bad_url() -> None:
    with pytest.raises(ConnectError, match="not a valid websocket URL"):
        await dial("http://127.0.0.1:1", LIMITS, LINK)


@async_test
async def test_busy_port() -> None:
    async def handler(ws: object) -> None:
        return None

    first = await listen(handler, "127.0.0.1", 0, LIMITS, LINK)
    port = first.sockets[0].getsockname()[1]
    try:
        with pytest.raises(TransportError, match="already in use — is another node or bootstrap running"):
            await listen(handler, "127.0.0.1", port, LIMITS, LINK)
    finally:
        first.close()


@async_test
async def test_direct_peers_and_oversize_messages() -> None:
    a = Node(swarm_config(limits=ProtocolLimits(max_frame_bytes=64 * 1024)))
    await a.service.start()
    b = Node(swarm_config(peer_urls=(a.service.listen_url,)))
    try:
        await b.service.start()
        await wait_for(lambda: a.peer_ids() == {b.identity.peer_id} and b.peer_ids() == {a.identity.peer_id},
                       what="direct link")
        assert [p.found_by for p in b.service.peers()] == ["manual"]
        assert [p.found_by for p in a.service.peers()] == ["inbound"]
        from dataclasses import replace

        from engine.sapo.records import LOCAL_PEER, Provenance

        local = [replace(g, provenance=Provenance.local("seed", 1, 1)) for g in real_groups("x", 2)]
        assert local[0].provenance.origin_peer == LOCAL_PEER
        await b.service.publish(local)  # origin "local" goes out as b's signed peer id
        await wait_for(lambda: len(a.pool) == 2, what="groups over the direct link")
        assert {v.group.provenance.origin_peer for v in a.pool.candidates()} == {b.identity.peer_id}
        with pytest.raises(ValueError, match="own groups only"):
            await b.service.publish(real_groups(a.identity.peer_id, 1))
        # A raw client sending a message over max_size gets disconnected (1009), the node lives on.
        async with connect(a.service.listen_url, compression=None, max_size=None) as ws:
            await ws.send("x" * (70 * 1024))
            with pytest.raises(Exception, match="1009|message too big"):
                await asyncio.wait_for(ws.recv(), 5)  # hello arrives first, then the close
                await asyncio.wait_for(ws.recv(), 5)
        assert a.peer_ids() == {b.identity.peer_id}
        await wait_for(lambda: a.service.stats()["refusals"] == {"frame_too_large": 1}, what="counted")
    finally:
        await b.service.stop()
        await a.service.stop()


@async_test
async def test_both_dialling_leaves_one_link() -> None:
    pa, pb = free_port(), free_port()
    a = Node(swarm_config(listen_port=pa, peer_urls=(f"ws://127.0.0.1:{pb}",)))
    b = Node(swarm_config(listen_port=pb, peer_urls=(f"ws://127.0.0.1:{pa}",)))
    try:
        await asyncio.gather(a.service.start(), b.service.start())
        await wait_for(lambda: a.peer_ids() and b.peer_ids(), what="linked")
        await asyncio.sleep(1.0)  # let both dialers settle
        assert a.service.stats()["direct_peers"] == 1 and b.service.stats()["direct_peers"] == 1
        await a.service.publish(real_groups(a.identity.peer_id, 1))
        await wait_for(lambda: len(b.pool) == 1, what="group")
    finally:
        await a.service.stop()
        await b.service.stop()


@async_test
async def test_node_connection_cap() -> None:
    a = Node(swarm_config(max_connections=1))
    await a.service.start()
    b = Node(swarm_config(listen=False, peer_urls=(a.service.listen_url,)))
    c = Node(swarm_config(listen=False, peer_urls=(a.service.listen_url,)))
    try:
        await b.service.start()
        await wait_for(lambda: a.peer_ids(), what="b linked")
        with pytest.raises(CapacityError, match="HTTP 503"):
            await dial(a.service.listen_url, LIMITS, LINK)
        await c.service.start()
        await wait_for(lambda: c.of_type("LogRecord"), what="c warned")
        assert "server is full" in c.of_type("LogRecord")[0].message
    finally:
        for node in (c, b, a):
            await node.service.stop()


def test_backoff_doubles_with_jitter_and_resets() -> None:
    backoff = Backoff(0.5, 4.0, rng=lambda: 0.5)  # jitter factor 1.0
    assert [backoff.next() for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    backoff.reset()
    assert backoff.next() == 0.5
    low, high = Backoff(1.0, 1.0, rng=lambda: 0.0), Backoff(1.0, 1.0, rng=lambda: 1.0)
    assert (low.next(), high.next()) == (0.8, pytest.approx(1.2))


@async_test
async def test_copied_identity_on_a_direct_link() -> None:
    from engine.swarm.identity import Identity

    first = Node(swarm_config())
    await first.service.start()
    await asyncio.sleep(0.05)  # the copy starts strictly later
    copy = Node(swarm_config(peer_urls=(first.service.listen_url,)), identity=Identity(first.identity._key))
    try:
        await copy.service.start()
        await wait_for(lambda: copy.service.duplicate_identity is not None, what="the copy told")
        await asyncio.sleep(0.3)
        assert first.service.duplicate_identity is None  # the first keeps running
        warnings = [e.message for e in first.of_type("LogRecord") if e.level == "warning"]
        assert any("a copy of this node's identity" in w for w in warnings)
        assert copy.service.stats()["links"] == 0 and not first.peer_ids()
    finally:
        await copy.service.stop()
        await first.service.stop()


@async_test
async def test_a_peer_cannot_claim_relay_powers() -> None:
    from engine.swarm.identity import Identity
    from engine.swarm.protocol import BYE_DUPLICATE_IDENTITY, SwarmProtocol
    from engine.swarm.wire import Hello

    node = Node(swarm_config())
    await node.service.start()
    try:
        liar = SwarmProtocol(Identity.generate(), LIMITS)
        async with connect(node.service.listen_url, compression=None) as ws:
            hello = Hello(liar.identity.instance, "bootstrap", "", "", None).to_wire()
            await ws.send(liar.encode("hello", hello), text=True)
            await ws.send(liar.encode("bye", {"reason": BYE_DUPLICATE_IDENTITY}), text=True)
            await asyncio.sleep(0.3)
        assert node.service.duplicate_identity is None and node.service.stats()["bootstraps"] == []
    finally:
        await node.service.stop()


@async_test
async def test_a_peer_that_stops_reading_loses_its_link_and_memory_stays_bounded() -> None:
    """A raw client says hello and then never reads: the node's queue for it stays within its byte
    bound, and the first frame that cannot be sent in time drops the link."""
    import time as _time

    from engine.swarm.config import LinkConfig
    from engine.swarm.identity import Identity
    from engine.swarm.protocol import PeerConnection, SwarmProtocol
    from engine.swarm.transport import Link, listen
    from engine.swarm.wire import Hello

    limits = ProtocolLimits()
    me = SwarmProtocol(Identity.generate(), limits)
    links: list[Link] = []
    done = asyncio.Event()

    async def handler(ws) -> None:  # type: ignore[no-untyped-def]
        conn = PeerConnection(me, Hello("0" * 16, "node", "m", "t", None), 0.0)
        link = Link(ws, conn, send_queue=1000, send_queue_bytes=4 << 20, write_timeout_s=1.0, initiator=False,
                    address="x", found_by="inbound")
        links.append(link)
        await link.run(lambda link, events: asyncio.sleep(0), 5.0)
        done.set()

    server = await listen(handler, "127.0.0.1", 0, limits, LinkConfig())
    port = server.sockets[0].getsockname()[1]
    peer = SwarmProtocol(Identity.generate(), limits)
    try:
        async with connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None, max_queue=1) as ws:
            hello = Hello("1" * 16, "node", "m", "t", None).to_wire()
            await ws.send(peer.encode("hello", {**hello, "started": _time.time()}), text=True)
            await wait_for(lambda: links and links[0].is_open, what="the link open")
            big = b"x" * (512 << 10)
            for _ in range(200):  # 100 MiB offered to a peer that reads nothing
                links[0].send(big)
                assert links[0]._queued_bytes <= 4 << 20
                await asyncio.sleep(0)
            await asyncio.wait_for(done.wait(), 30)
            assert links[0].close_reason.startswith("stalled") and links[0].dropped_out > 0
    finally:
        server.close()
        await server.wait_closed()


@async_test
async def test_one_address_cannot_take_every_inbound_slot() -> None:
    a = Node(swarm_config(max_inbound_per_ip=2))
    await a.service.start()
    dialers = [Node(swarm_config(listen=False, peer_urls=(a.service.listen_url,))) for _ in range(3)]
    try:
        for d in dialers:
            await d.service.start()
        await wait_for(lambda: len(a.peer_ids()) == 2, what="two links from 127.0.0.1")
        await wait_for(lambda: a.service.stats().get("refused_per_ip", 0) >= 1, what="the third refused (429)")
        assert len(a.peer_ids()) == 2
    finally:
        for d in dialers:
            await d.service.stop()
        await a.service.stop()
