"""The peer table under churn: read from other threads while the loop writes it; departed peers expire.

Regression for a remote crash: identities connecting and leaving at a bootstrap made the trainer
thread's peer count raise "dictionary changed size during iteration", which killed every node.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from swarm_helpers import Node, async_test, swarm_config, wait_for

from engine.swarm.bootstrap import BootstrapServer
from engine.swarm.config import BootstrapConfig, LinkConfig
from engine.swarm.identity import Identity
from engine.swarm.peers import PeerTable

pytestmark = pytest.mark.timeout(90)
FAST = LinkConfig(reconnect_initial_s=0.1, reconnect_max_s=0.5, connect_timeout_s=3.0, ping_interval_s=1.0,
                  ping_timeout_s=2.0)


class Reader(threading.Thread):
    """Calls `read` in a loop from another thread, as the trainer and the control API do; keeps errors."""

    def __init__(self, read) -> None:  # type: ignore[no-untyped-def]
        super().__init__(daemon=True)
        self.read, self.errors, self.reads = read, [], 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.read()
                self.reads += 1
            except Exception as exc:  # noqa: BLE001 -- the test reports whatever escaped
                self.errors.append(exc)
                return


def test_table_read_from_another_thread_while_written() -> None:
    table = PeerTable()
    ids = [Identity.generate().peer_id for _ in range(400)]
    reader = Reader(lambda: (table.snapshot(), table.connected_count(), len(table)))
    reader.start()
    deadline = time.monotonic() + 1.5
    try:
        i = 0
        while time.monotonic() < deadline and not reader.errors:
            # A bootstrap's listing grows by fresh identities and sheds them again; direct links come and go.
            table.relay_listing("ws://b:1", [(pid, "seed", "t") for pid in ids[: i % len(ids)]], own_id="me")
            table.link_opened(ids[i % len(ids)], "seed", "t", "inbound", "127.0.0.1:1")
            table.link_closed(ids[(i * 7) % len(ids)])
            i += 1
    finally:
        reader.stop.set()
        reader.join(5)
    assert reader.errors == [] and reader.reads > 10


def test_unreachable_peers_are_forgotten_after_the_timeout() -> None:
    now = [1000.0]
    table = PeerTable(forget_after_s=60.0, clock=lambda: now[0])
    table.relay_listing("ws://b:1", [("a", "seed", "t"), ("b", "seed", "t")], own_id="me")
    table.link_opened("c", "seed", "t", "inbound", "127.0.0.1:1")
    assert table.connected_count() == 3
    table.relay_listing("ws://b:1", [("a", "seed", "t")], own_id="me")  # b left the bootstrap
    table.link_closed("c")  # c's link closed
    now[0] += 59.0
    assert {p.peer_id for p in table.snapshot()} == {"a", "b", "c"}  # remembered a while (reconnects)
    now[0] += 2.0
    assert [p.peer_id for p in table.snapshot()] == ["a"]  # still listed: kept, however old
    table.link_opened("c", "seed", "t", "inbound", "127.0.0.1:1")  # a returning peer is simply new again
    assert table.connected_count() == 2
    with pytest.raises(ValueError):
        PeerTable(forget_after_s=0)


@async_test
async def test_node_survives_identities_churning_through_the_bootstrap() -> None:
    server = BootstrapServer(BootstrapConfig(host="127.0.0.1", port=0, link=FAST, max_connections_per_ip=0),
                             log=lambda level, msg: None)
    await server.start()
    node = Node(swarm_config(listen=False, bootstrap_urls=(server.url,), forget_peers_after_s=0.5))
    await node.service.start()
    reader = Reader(lambda: (node.service.peers(include_disconnected=True), node.service.peer_count(),
                             node.service.stats()))
    reader.start()
    try:
        await wait_for(lambda: bool(node.service.stats()["bootstraps"]), what="the node to join")

        async def churn(k: int) -> None:
            for _ in range(k):
                visitor = Node(swarm_config(listen=False, bootstrap_urls=(server.url,)))
                await visitor.service.start()
                await wait_for(lambda v=visitor: v.identity.peer_id in node.peer_ids(), what="a visitor listed")
                await visitor.service.stop()

        await asyncio.gather(*(churn(15) for _ in range(4)))  # 60 fresh identities, 4 at a time
        assert reader.errors == [], reader.errors
        await wait_for(lambda: node.service.stats()["known_peers"] == 0, timeout=15,
                       what="departed visitors to be forgotten")
        assert node.service.peer_count() == 0
    finally:
        reader.stop.set()
        reader.join(5)
        await node.service.stop()
        await server.stop()
    assert reader.errors == [] and reader.reads > 10
