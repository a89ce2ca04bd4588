"""The board on a 3-server NATS cluster (routes on 127.0.0.1, JetStream replicas 3, operator-mode
credentials on every server): stop the server a node is connected to mid-run; it fails over and keeps
storing and fetching, and nothing it stored is lost."""

from __future__ import annotations

import asyncio

import pytest
from swarm_helpers import make_group, node_board

from engine.swarm import protocol as p
from engine.swarm.board import BoardReader, fetch
from engine.swarm.config import ProtocolLimits
from engine.swarm.identity import Identity
from engine.swarm.nats_auth import Authority
from engine.swarm.nats_server import NatsServer, NatsServerConfig, free_port


@pytest.fixture
def cluster():  # type: ignore[no-untyped-def]
    auth = Authority.generate(stream="HA")
    routes_ports = [free_port() for _ in range(3)]
    servers = []
    for i, port in enumerate(routes_ports):
        routes = tuple(f"nats-route://127.0.0.1:{q}" for j, q in enumerate(routes_ports) if j != i)
        servers.append(NatsServer(NatsServerConfig(websocket_port=None, monitor_port=None, cluster_port=port,
                                                   routes=routes, server_name=f"s{i}",
                                                   auth_config=auth.server_config())))
    try:
        for server in servers:
            server.start()
        yield auth, servers
    finally:
        for server in servers:
            server.close()


@pytest.mark.timeout(120)
def test_a_node_fails_over_when_its_server_stops(cluster) -> None:  # type: ignore[no-untyped-def]
    from engine.swarm.nats_board import admin_board

    auth, servers = cluster
    urls = [s.url for s in servers]

    async def connected(board):  # type: ignore[no-untyped-def]
        for _ in range(60):  # the cluster elects its JetStream leader within a few seconds
            try:
                return await board.connect(timeout_s=3)
            except Exception:  # noqa: BLE001 -- not ready yet
                await asyncio.sleep(0.5)
        raise AssertionError("the cluster never accepted the board")

    async def main() -> None:
        admin = await connected(admin_board(urls, auth, replicas=3, create=True))
        await admin.close()
        nodes = [Identity.generate() for _ in range(4)]
        protos = {n.peer_id: p.SwarmProtocol(n, ProtocolLimits()) for n in nodes}
        boards = {n.peer_id: await connected(await node_board(
            urls, n, auth.issue(n.peer_id, "HA", 120), stream="HA", max_age_s=120, replicas=3,
            connect_options={"dont_randomize": True})) for n in nodes}
        try:
            async def one_round() -> dict[str, int]:
                for n in nodes:
                    (frame,) = protos[n.peer_id].encode_rollouts([make_group(n.peer_id)])
                    for _ in range(40):  # a put during the failover is retried, as a node's next round would
                        try:
                            await boards[n.peer_id].put(n.peer_id, frame)
                            break
                        except Exception:  # noqa: BLE001 -- reconnecting / new leader
                            await asyncio.sleep(0.25)
                    else:
                        raise AssertionError("a put never succeeded after the failover")
                got = {}
                for n in nodes:
                    results = await fetch(boards[n.peer_id], BoardReader(protos[n.peer_id]), 3)
                    got[n.peer_id] = len(results)
                return got

            assert set((await one_round()).values()) == {3}
            servers[0].stop()  # every node was connected to s0
            assert set((await one_round()).values()) == {3}  # failed over, stored and fetched again
            first, last = await boards[nodes[0].peer_id].extent()
            assert last - first + 1 >= 4 and last >= 8  # both rounds' puts are in the stream
        finally:
            for board in boards.values():
                await board.close()

    asyncio.run(main())
