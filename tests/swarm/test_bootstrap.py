"""SwarmService instances and BootstrapServers on 127.0.0.1: relay (none with a board), peer lists, /status,
copies, and how many new identities get credentials."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import pytest
from swarm_helpers import Node, async_test, free_port, real_groups, swarm_config, wait_for
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from engine.swarm.bootstrap import BootstrapServer
from engine.swarm.config import BootstrapConfig, LinkConfig, ProtocolLimits
from engine.swarm.identity import Identity
from engine.swarm.protocol import SwarmProtocol
from engine.swarm.wire import Hello

pytestmark = pytest.mark.timeout(60)
FAST = LinkConfig(reconnect_initial_s=0.1, reconnect_max_s=0.5, connect_timeout_s=3.0, ping_interval_s=1.0,
                  ping_timeout_s=2.0)


def fetch_status(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.headers["Content-Type"] == "application/json"
        return json.loads(resp.read())


async def status(server: BootstrapServer) -> dict:
    """GET /status over real HTTP (in a thread: the server runs on this test's loop)."""
    return await asyncio.to_thread(fetch_status, server.url.replace("ws://", "http://") + "/status")


def registered(server: BootstrapServer) -> int:
    return len(server.status()["peers"])


async def start_bootstrap(issue_credential: object = None, **overrides: object) -> BootstrapServer:
    cfg = BootstrapConfig(**{"host": "127.0.0.1", "port": 0, "link": FAST, **overrides})
    server = BootstrapServer(cfg, log=lambda level, msg: None, issue_credential=issue_credential)  # type: ignore[arg-type]
    await server.start()
    return server


@contextlib.asynccontextmanager
async def bootstrapped(issue_credential: object = None,
                       **overrides: object) -> AsyncIterator[tuple[BootstrapServer, Callable[..., Node]]]:
    """A started bootstrap and `new_node(identity=None)`, which makes a node (not started) that dials it;
    the nodes and then the bootstrap are stopped on the way out."""
    server = await start_bootstrap(issue_credential, **overrides)
    nodes: list[Node] = []

    def new_node(identity: Identity | None = None) -> Node:
        nodes.append(Node(swarm_config(listen=False, bootstrap_urls=(server.url,)), identity=identity))
        return nodes[-1]
    try:
        yield server, new_node
    finally:
        for node in nodes:
            await node.service.stop()
        await server.stop()


async def first_node(server: BootstrapServer, new_node: Callable[..., Node]) -> Node:
    """The bootstrap's first node, started and listed there."""
    node = new_node()
    await node.service.start()
    await wait_for(lambda: registered(server) == 1, what="the first node registered")
    return node


@async_test
async def test_three_nodes_exchange_through_one_bootstrap() -> None:
    async with bootstrapped() as (server, new_node):
        nodes = [new_node() for _ in range(3)]
        for node in nodes:
            await node.service.start()
        ids = {n.identity.peer_id for n in nodes}
        for node in nodes:
            await wait_for(lambda node=node: node.peer_ids() == ids - {node.identity.peer_id},
                           what="peer lists from the bootstrap")
        sent = {}
        for i, node in enumerate(nodes):
            sent[node.identity.peer_id] = real_groups(node.identity.peer_id, 2, seed=10 + i)
            assert await node.service.publish(sent[node.identity.peer_id]) == 1  # one link: the bootstrap
        for node in nodes:
            await wait_for(lambda node=node: len(node.pool) == 4, what="4 groups from 2 peers")
            got = {(v.group.provenance.origin_peer, v.group.ref) for v in node.pool.candidates()}
            expected = {(pid, g.ref) for pid, groups in sent.items() if pid != node.identity.peer_id
                        for g in groups}
            assert got == expected
            assert all(v.group.rewards is not None and v.group.rewards[0] == 1.0 for v in node.pool.candidates())
            assert {e.status for e in node.of_type("RolloutSeen")} == {"pooled"}
        st = await status(server)
        assert len(st["peers"]) == 3 and st["frames"]["rollouts"] == 3 and st["frames"]["relayed"] == 6
        assert st["refusals"] == {}


@async_test
async def test_bootstrap_refuses_forged_and_malformed_frames() -> None:
    async with bootstrapped() as (server, new_node):
        node = await first_node(server, new_node)
        mallory = SwarmProtocol(Identity.generate(), node.service.config.limits)
        async with connect(server.url, compression=None) as ws:
            await ws.send(mallory.encode("hello", {**Hello(mallory.identity.instance, "node", "m", "t",
                                                           None).to_wire()}), text=True)
            [frame] = mallory.encode_rollouts(real_groups(mallory.identity.peer_id, 1))
            await ws.send(frame.replace(b'"seed"', b'"evil"'), text=True)  # breaks the signature
            await ws.send(b'{"v":1,"type":"rollouts","ts":NaN}', text=True)
            await ws.send(b"\xff\xfe", text=False)
            await ws.send(frame, text=True)
            await ws.send(frame, text=True)  # replay
            await wait_for(lambda: len(node.pool) == 1, what="the one valid group relayed")
        st = await status(server)
        assert st["refusals"] == {"bad_signature": 1, "non_finite": 1, "bad_utf8": 1, "duplicate": 1}
        assert st["frames"]["relayed"] == 1
        assert node.service.stats()["refusals"] == {}  # nothing bad got through to the node


@async_test
async def test_forged_task_reference_is_dropped_by_the_receiver() -> None:
    async with bootstrapped() as (_, new_node):
        a, b = (new_node() for _ in range(2))
        await a.service.start()
        await b.service.start()
        await wait_for(lambda: a.peer_ids() and b.peer_ids(), what="peers")
        [good, bad] = real_groups(a.identity.peer_id, 2)
        bad = replace(bad, question_hash="0" * 64)  # a ground truth a bad peer wants others to learn
        await a.service.publish([good, bad])
        await wait_for(lambda: len(b.of_type("RolloutSeen")) == 2, what="two decisions")
        seen = {(e.status, e.reason) for e in b.of_type("RolloutSeen")}
        assert seen == {("pooled", ""), ("dropped", "forged_ref")}
        assert [v.group.ref for v in b.pool.candidates()] == [good.ref]


@async_test
async def test_copied_identity_is_refused_and_told() -> None:
    async with bootstrapped() as (server, new_node):
        first = await first_node(server, new_node)
        copy = new_node(Identity(first.identity._key))
        await copy.service.start()
        await wait_for(lambda: copy.service.duplicate_identity is not None, what="copy told")
        assert "copied" in str(copy.service.duplicate_identity)
        errors = [e.message for e in copy.of_type("LogRecord") if e.level == "error"]
        assert errors and "identity.key" in errors[0]
        await asyncio.sleep(0.3)
        st = await status(server)
        assert [p["address"] for p in st["peers"]] and first.service.duplicate_identity is None
        assert copy.service.stats()["links"] == 0  # the copy left and does not keep redialling


@async_test
async def test_restarted_node_replaces_its_frozen_link() -> None:
    # Same key, new process (new instance) while the old link is open but silent is a restart, not a
    # copy: the bootstrap pings the old link and replaces it when no pong comes back.
    async with bootstrapped() as (server, new_node):
        first = await first_node(server, new_node)
        [frozen] = list(first.service._links)
        frozen.ws.transport.pause_reading()  # the old process stops reading: no pongs
        restarted = new_node(Identity(first.identity._key))
        await restarted.service.start()
        peer_id = first.identity.peer_id

        def replaced() -> bool:
            link = server._nodes.get(peer_id)
            return link is not None and link.hello is not None and \
                link.hello.instance == restarted.identity.instance
        await wait_for(replaced, what="the restart replacing the frozen link")
        assert restarted.service.duplicate_identity is None


@async_test
async def test_bootstraps_do_not_link() -> None:
    """Federations of bootstraps are gone (a NATS cluster is how a swarm grows): a bootstrap that
    dials another as if it were a node gets its link closed, and nothing is relayed through it."""
    async with bootstrapped() as (b1, _):
        liar = SwarmProtocol(Identity.generate(), b1.protocol.limits)
        async with connect(b1.url, compression=None) as ws:
            hello = Hello(liar.identity.instance, "bootstrap", "", "", None).to_wire()
            await ws.send(liar.encode("hello", {**hello, "started": 0.0}), text=True)
            with pytest.raises(Exception):  # noqa: B017 -- closed by the server
                for _ in range(5):
                    await asyncio.wait_for(ws.recv(), 5)
        assert registered(b1) == 0


@async_test
async def test_connection_cap_gives_a_clear_error() -> None:
    async with bootstrapped(max_connections=1) as (server, new_node):
        await first_node(server, new_node)  # it takes the one slot
        b = new_node()
        await b.service.start()
        await wait_for(lambda: b.of_type("LogRecord"), what="b's warning")
        message = b.of_type("LogRecord")[0].message
        assert "server is full (HTTP 503)" in message and "try again later" in message


@async_test
async def test_per_address_cap_refuses_one_host_taking_every_slot() -> None:
    async with bootstrapped(max_connections_per_ip=2) as (server, new_node):
        nodes = [new_node() for _ in range(3)]
        for node in nodes[:2]:
            await node.service.start()
        await wait_for(lambda: registered(server) == 2, what="two nodes registered")
        await nodes[2].service.start()
        await wait_for(lambda: nodes[2].of_type("LogRecord"), what="the third node's warning")
        message = nodes[2].of_type("LogRecord")[0].message
        assert "HTTP 429" in message and "same router" in message
        st = await status(server)
        assert st["refused_per_ip"] >= 1 and st["max_connections_per_ip"] == 2 and len(st["peers"]) == 2
        await nodes[0].service.stop()  # a slot frees up: the third node gets in on its next try
        await wait_for(lambda: registered(server) == 2 and nodes[2].peer_ids() == {nodes[1].identity.peer_id},
                       what="the third node joining once a slot is free", timeout=20.0)


def test_per_address_cap_is_validated() -> None:
    with pytest.raises(ValueError, match="max_connections_per_ip"):
        BootstrapConfig(max_connections_per_ip=-1)
    assert BootstrapConfig(max_connections_per_ip=0).max_connections_per_ip == 0


@async_test
async def test_with_a_board_membership_lists_are_a_bounded_sample() -> None:
    """A node's membership traffic must not grow with the swarm: lists hold the newest few nodes."""
    async with bootstrapped(peers_sample=2, peers_min_interval_s=0.2) as (server, new_node):
        nodes = [new_node() for _ in range(5)]
        for node in nodes:
            await node.service.start()
        await wait_for(lambda: registered(server) == 5, what="5 nodes at the bootstrap")
        newest = {n.identity.peer_id for n in nodes[-2:]}
        await wait_for(lambda: nodes[0].peer_ids() == newest, what="the newest two listed to the first")
        await asyncio.sleep(0.5)
        assert all(len(n.peer_ids()) <= 2 for n in nodes)


def test_board_size_counts_the_swarm() -> None:
    from engine.swarm.board import BoardReader, MemoryBoard, fetch
    from engine.swarm.config import ProtocolLimits

    async def main() -> int:
        board = MemoryBoard()
        for _ in range(7):
            ident = Identity.generate()
            proto = SwarmProtocol(ident, ProtocolLimits())
            (frame,) = proto.encode_rollouts(real_groups(ident.peer_id, 1, seed=1))
            await board.put(ident.peer_id, frame)
        await fetch(board, BoardReader(SwarmProtocol(Identity.generate(), ProtocolLimits())), 2)
        return board.size

    assert asyncio.run(main()) == 7


# --- with a board, nothing is relayed ------------------------------------------------------------------
async def _raw_client(url: str, identity: Identity | None = None):  # type: ignore[no-untyped-def]
    """A websocket client that says a node's hello -> (connection, its protocol)."""
    proto = SwarmProtocol(identity or Identity.generate(), ProtocolLimits())
    ws = await connect(url, compression=None)
    await ws.send(proto.encode("hello", Hello(proto.identity.instance, "node", "m", "t", None).to_wire()), text=True)
    return ws, proto


async def _frames_until(ws, stop: tuple[str, ...], timeout: float) -> list[dict]:  # type: ignore[no-untyped-def]
    """Frames received until one of type in `stop`, the link closes, or `timeout` passes."""
    got: list[dict] = []
    try:
        async with asyncio.timeout(timeout):
            while not got or got[-1]["type"] not in stop:
                got.append(json.loads(await ws.recv()))
    except (TimeoutError, ConnectionClosed):
        pass
    return got


async def _relayed_to_b(server: BootstrapServer) -> list[str]:
    a, a_proto = await _raw_client(server.url)
    b, _ = await _raw_client(server.url)
    try:
        await wait_for(lambda: registered(server) == 2, what="two nodes at the bootstrap")
        [frame] = a_proto.encode_rollouts(real_groups(a_proto.identity.peer_id, 1))
        await a.send(frame, text=True)
        return [f["type"] for f in await _frames_until(b, ("rollouts",), 1.5)]
    finally:
        await a.close()
        await b.close()


@async_test
async def test_with_a_board_the_bootstrap_relays_no_rollouts() -> None:
    """A bootstrap that names a board never broadcasts: a node's rollouts frame sent to it reaches no
    one (counted), while a bootstrap without one (--no-nats) still relays it."""
    async with bootstrapped(board_urls=("nats://127.0.0.1:4222",)) as (server, _):
        assert "rollouts" not in await _relayed_to_b(server)
        st = await status(server)
        assert st["frames"]["not_relayed_board"] == 1 and st["frames"]["relayed"] == 0
        assert st["frames"]["rollouts"] == 0 and st["refusals"] == {}
    async with bootstrapped() as (relay, _):
        assert "rollouts" in await _relayed_to_b(relay)
        st = await status(relay)
        assert st["frames"]["relayed"] == 1 and st["frames"]["not_relayed_board"] == 0


@async_test
async def test_a_node_with_a_board_sends_no_rollouts_to_its_bootstrap() -> None:
    """Even while its board is unreachable: a fallback to the relay made a broken board O(N^2)."""
    nowhere = f"nats://127.0.0.1:{free_port()}"  # nobody listens there
    async with bootstrapped(board_urls=(nowhere,)) as (server, new_node):
        node = new_node()
        await node.service.start()
        await wait_for(lambda: registered(server) == 1 and node.service.board.urls, what="the node at the bootstrap")
        assert not node.service.board.connected
        assert await node.service.publish(real_groups(node.identity.peer_id, 1)) == 0  # to no link at all
        await asyncio.sleep(0.3)
        st = await status(server)
        assert st["frames"]["rollouts"] == 0 and st["frames"]["not_relayed_board"] == 0


# --- new identities are credentialed at a bounded rate -------------------------------------------------
def _issuer(issued: list[str]):  # type: ignore[no-untyped-def]
    import time
    from types import SimpleNamespace

    def issue(peer_id: str) -> SimpleNamespace:
        issued.append(peer_id)
        return SimpleNamespace(jwt=f"jwt-for-{peer_id}", expires_at=time.time() + 3600)
    return issue


async def _hello_answer(url: str, identity: Identity) -> dict:
    """Say hello as `identity` -> the bootstrap's answer to it: its creds frame, or its bye."""
    ws, _ = await _raw_client(url, identity)
    try:
        frames = await _frames_until(ws, ("creds", "bye"), 5.0)
    finally:
        await ws.close()
    assert frames and frames[-1]["type"] in ("creds", "bye"), frames
    return frames[-1]


@async_test
async def test_new_identities_from_one_address_get_credentials_up_to_a_burst() -> None:
    """Identities are free: one address saying hello with fresh keys gets a burst of credentials, then
    is told to wait; a node already credentialed still gets its credential when it reconnects."""
    issued: list[str] = []
    async with bootstrapped(_issuer(issued), board_urls=("nats://127.0.0.1:4222",),
                            new_identity_burst_per_ip=3, new_identity_interval_per_ip_s=600.0) as (server, _):
        keys = [Identity.generate() for _ in range(6)]
        answers = [await _hello_answer(server.url, key) for key in keys]
        assert [a["type"] for a in answers] == ["creds"] * 3 + ["bye"] * 3
        assert answers[0]["body"]["jwt"] == f"jwt-for-{keys[0].peer_id}"
        reason = answers[3]["body"]["reason"]
        assert reason.startswith("too many new identities from your address; try again in ") and reason.endswith(" s")
        assert 1 <= int(reason.split()[-2]) <= 600
        again = await _hello_answer(server.url, Identity(keys[0]._key))  # a known node reconnecting
        assert again["type"] == "creds"
        assert issued == [k.peer_id for k in keys[:3]] + [keys[0].peer_id]
        st = await status(server)
        board = st["board"]
        assert board["credentials_refused_rate"] == 3 and board["credentials_issued"] == 4
        assert board["new_identities"]["known_identities"] == 3 and board["new_identities"]["refused_address"] == 3
        assert registered(server) == 0  # the refused were never listed as peers


@async_test
async def test_the_bootstrap_bounds_new_identities_from_all_addresses_together() -> None:
    issued: list[str] = []
    async with bootstrapped(_issuer(issued), new_identity_burst=2, new_identity_rate_per_s=0.01) as (server, _):
        answers = [await _hello_answer(server.url, Identity.generate()) for _ in range(3)]
        assert [a["type"] for a in answers] == ["creds", "creds", "bye"]
        assert "joining this swarm right now; try again in" in answers[2]["body"]["reason"]
        assert (await status(server))["board"]["new_identities"]["refused_global"] == 1


def test_new_identity_bounds_are_validated() -> None:
    for field in ("new_identity_burst_per_ip", "new_identity_burst", "known_identities", "new_identity_addresses"):
        with pytest.raises(ValueError, match=field):
            BootstrapConfig(**{field: 0})
    for field in ("new_identity_interval_per_ip_s", "new_identity_rate_per_s"):
        with pytest.raises(ValueError, match=field):
            BootstrapConfig(**{field: 0.0})
    with pytest.raises(ValueError, match="new_identity_burst"):
        BootstrapConfig(new_identity_burst=True)  # type: ignore[arg-type]
