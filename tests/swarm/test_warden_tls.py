"""The board's warden on a TLS board: its board-account connection is the one `nats_board.admin_board`
makes (with the bootstrap's own TLS context), and through it a flooder is revoked and its frame taken
off, while an honest node's frame stays. Real: a nats-server in operator mode serving TLS on 127.0.0.1,
its loopback monitoring port, test_tls's CA and certificate."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from swarm_helpers import make_group, node_board
from test_tls import Pki, pki  # noqa: F401

from engine.swarm import protocol as p
from engine.swarm.board import key_subject
from engine.swarm.board_warden import MiB, Warden, WardenConfig, run_warden
from engine.swarm.config import ProtocolLimits
from engine.swarm.identity import Identity
from engine.swarm.nats_auth import STREAM, Authority
from engine.swarm.nats_board import admin_board, create_board_stream
from engine.swarm.nats_server import NatsServer, NatsServerConfig
from engine.swarm.tls import client_context, own_server_context


async def _frames_of(url: str, auth: Authority, tls: Any, peer_id: str) -> int:
    """Frames the board holds under a node's key, as the bootstrap's own user sees them."""
    board = await asyncio.wait_for(admin_board(url, auth, tls=tls).connect(), 10)
    try:
        info = await board.js.stream_info(STREAM, subjects_filter=key_subject(peer_id))
        return sum((info.state.subjects or {}).values())
    finally:
        await board.close()


@pytest.mark.timeout(60)
def test_the_warden_revokes_a_flooder_and_takes_its_frame_off_a_tls_board(pki: Pki) -> None:  # noqa: F811
    auth = Authority.generate()
    cfg = NatsServerConfig(websocket_port=None, monitor_port=0, auth_config=auth.server_config(),
                           tls_cert_file=pki.cert, tls_key_file=pki.key)
    own_tls = own_server_context(pki.cert)  # what `sapo bootstrap` reaches its own TLS board with
    logs: list[str] = []
    warden = Warden(WardenConfig(user_bytes_per_s=1 * MiB, user_burst_bytes=2 * MiB, every_s=0.3,
                                 address_bytes_per_s=1024 * MiB, address_burst_bytes=4096 * MiB))

    async def main(srv: NatsServer) -> None:
        await create_board_stream(srv.url, auth, tls=own_tls)
        watch = asyncio.create_task(run_warden(warden, srv.monitor_url or "", [srv.url], auth,
                                               lambda level, msg: logs.append(msg), own_tls))
        honest, flooder = Identity.generate(), Identity.generate()
        boards = [await asyncio.wait_for((await node_board([srv.url], ident, auth.issue(ident.peer_id, STREAM, 60),
                                                           connect_options={"tls": client_context(pki.ca)})).connect(),
                                         10) for ident in (honest, flooder)]
        try:
            for board, ident in zip(boards, (honest, flooder), strict=True):
                (frame,) = p.SwarmProtocol(ident, ProtocolLimits()).encode_rollouts([make_group(ident.peer_id)])
                await asyncio.wait_for(board.put(ident.peer_id, frame), 10)
            assert await _frames_of(srv.url, auth, own_tls, flooder.peer_id) == 1
            nc, deadline = boards[1].nc, time.monotonic() + 15
            while not nc.is_closed:  # ~3 MiB/s against a 1 MiB/s budget: revoked within seconds
                assert time.monotonic() < deadline, f"the flooder was never revoked: {logs[-3:]}"
                for _ in range(16):
                    await nc.publish(key_subject(flooder.peer_id), b"y" * (60 * 1024))
                await asyncio.sleep(0.02)
            for _ in range(50):  # the warden purges right after it pushes the revocation
                if not await _frames_of(srv.url, auth, own_tls, flooder.peer_id):
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail(f"the flooder's frame stayed on the board: {logs[-3:]}")
            assert await _frames_of(srv.url, auth, own_tls, honest.peer_id) == 1
            assert any("revoked node" in m for m in logs) and not any("could not" in m for m in logs)
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
            for board in boards:
                await board.close()

    with NatsServer(cfg) as srv:
        assert srv.url.startswith("tls://127.0.0.1:")
        asyncio.run(main(srv))
