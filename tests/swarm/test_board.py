"""The board ("store one, fetch J"): the sans-I/O reader on hand-built frames, the in-memory board,
and the same on a real nats-server with JetStream on 127.0.0.1."""

from __future__ import annotations

import asyncio
import random

import pytest
from swarm_helpers import make_group, signed_frame

from engine.swarm import protocol as p
from engine.swarm.board import BoardFrame, BoardReader, MemoryBoard, fetch, key_subject
from engine.swarm.config import ProtocolLimits
from engine.swarm.identity import Identity


def _node() -> tuple[Identity, p.SwarmProtocol]:
    ident = Identity.generate()
    return ident, p.SwarmProtocol(ident, ProtocolLimits())


def _frame(proto: p.SwarmProtocol, n: int = 1) -> bytes:
    me = proto.identity.peer_id
    (frame,) = proto.encode_rollouts([make_group(me, index=i) for i in range(n)])
    return frame


def test_draws_cover_the_extent_and_an_empty_board_draws_nothing() -> None:
    _, proto = _node()
    reader = BoardReader(proto, rng=random.Random(1))
    assert sorted(reader.draws(5, 9, 3)) == [5, 6, 7, 8, 9]  # a small board: every slot, shuffled
    slots = reader.draws(1, 1000, 3)
    assert len(slots) == 12 == len(set(slots)) and all(1 <= s <= 1000 for s in slots)
    assert reader.draws(0, 0, 3) == [] and reader.draws(1, 5, 0) == []


def test_reader_takes_verified_groups_once_and_refuses_what_lies() -> None:
    me, mine = _node()
    alice, alice_proto = _node()
    mallory, _ = _node()
    reader = BoardReader(mine)
    frame = _frame(alice_proto, 2)
    got = reader.take(BoardFrame(key_subject(alice.peer_id), 7, frame))
    assert got is not None and got.origin == alice.peer_id and len(got.groups) == 2
    assert reader.take(BoardFrame(key_subject(alice.peer_id), 7, frame)) is None  # the same slot again
    assert reader.counters["repeats"] == 1
    # Alice's frame stored under Mallory's key (a board without permissions): refused, counted.
    assert reader.take(BoardFrame(key_subject(mallory.peer_id), 8, _frame(alice_proto))) is None
    assert mine.refusals.by_reason["wrong_signer"] == 1
    # A tampered frame fails its signature; garbage fails to parse; our own frame is skipped.
    tampered = frame.replace(b'"round":11', b'"round":12')
    assert reader.take(BoardFrame(key_subject(alice.peer_id), 9, tampered)) is None
    assert reader.take(BoardFrame(key_subject(alice.peer_id), 10, b"\xff{not json")) is None
    assert reader.take(BoardFrame(key_subject(me.peer_id), 11, _frame(mine))) is None
    assert mine.refusals.by_reason["bad_signature"] == 1 and reader.counters["own"] == 1
    hello = signed_frame(alice, {"v": p.PROTOCOL_VERSION, "type": "bye", "from": alice.peer_id, "seq": 10**15,
                                 "ts": __import__("time").time(), "body": {"reason": "x"}})
    assert reader.take(BoardFrame(key_subject(alice.peer_id), 12, hello)) is None
    assert reader.counters["refused"] == 4 and reader.counters["accepted"] == 1


async def _exchange(board, nodes: list[tuple[Identity, p.SwarmProtocol]], j: int) -> dict[str, set[str]]:  # type: ignore[no-untyped-def]
    for ident, proto in nodes:
        await board.put(ident.peer_id, _frame(proto))
    seen: dict[str, set[str]] = {}
    for ident, proto in nodes:
        results = await fetch(board, BoardReader(proto, rng=random.Random(3)), j)
        seen[ident.peer_id] = {r.origin for r in results}
    return seen


def test_memory_board_keeps_one_frame_per_node_and_expires_old_ones() -> None:
    now = [0.0]
    board = MemoryBoard(max_age_s=60, clock=lambda: now[0])
    nodes = [_node() for _ in range(5)]
    seen = asyncio.run(_exchange(board, nodes, 3))
    for ident, _ in nodes:
        assert len(seen[ident.peer_id]) == 3 and ident.peer_id not in seen[ident.peer_id]
    ident, proto = nodes[0]
    slot = asyncio.run(board.put(ident.peer_id, _frame(proto)))  # a newer round replaces the older frame
    assert slot == 6 and asyncio.run(board.extent()) == (2, 6)
    now[0] = 61.0
    assert asyncio.run(board.extent()) == (0, 0) and asyncio.run(board.get_from(1)) is None
    with pytest.raises(ValueError, match="bytes"):
        asyncio.run(MemoryBoard(max_frame_bytes=10).put(ident.peer_id, _frame(proto)))


@pytest.fixture(scope="module")
def nats_url():  # type: ignore[no-untyped-def]
    from engine.swarm.nats_server import NatsServer, NatsServerConfig

    with NatsServer(NatsServerConfig(websocket_port=None, monitor_port=None)) as server:
        yield server.url


@pytest.mark.timeout(60)
def test_nats_board_stores_one_and_fetches_j(nats_url: str) -> None:
    from engine.swarm.nats_board import NatsBoard

    async def main() -> None:
        board = await NatsBoard([nats_url], stream="T_ONE", max_age_s=60).connect()
        try:
            nodes = [_node() for _ in range(6)]
            seen = await _exchange(board, nodes, 4)
            for ident, _ in nodes:
                assert len(seen[ident.peer_id]) == 4 and ident.peer_id not in seen[ident.peer_id]
            first, last = await board.extent()
            assert (first, last) == (1, 6)
            ident, proto = nodes[2]
            assert await board.put(ident.peer_id, _frame(proto)) == 7  # replaces slot 3
            frame = await board.get_from(3)
            assert frame is not None and frame.slot == 4  # slot 3 is a gap now
            assert await board.get_from(8) is None
            too_big = b"x" * ((1 << 20) + 1)
            with pytest.raises(Exception):  # noqa: B017 -- the server refuses it (max_msg_size)
                await board.put(ident.peer_id, too_big)
        finally:
            await board.close()

    asyncio.run(main())


def test_the_embedded_server_is_the_pinned_binary(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import hashlib
    import platform

    from engine.swarm import nats_server

    path = nats_server.server_binary()
    pinned = nats_server.PINNED_SHA256.get((platform.system(), platform.machine()))
    if pinned is None:
        pytest.skip("no pinned checksum for this platform")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == pinned
    fake = tmp_path / "nats-server"
    fake.write_bytes(b"#!/bin/sh\necho not nats\n")
    # A binary that is not the pinned one is refused, with what to do about it.
    monkeypatch.setattr(nats_server.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(nats_server.shutil, "which", lambda _name: str(fake))
    with pytest.raises(nats_server.NatsServerError, match="not the pinned"):
        nats_server.server_binary()


@pytest.mark.timeout(60)
def test_a_bootstrap_killed_with_9_takes_its_nats_server_along(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request
    from urllib.parse import urlsplit

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    boot = subprocess.Popen([sys.executable, "-m", "engine", "bootstrap", "--host", "127.0.0.1", "--port", str(port),
                             "--nats-port", "0", "--nats-ws-port", "0"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as resp:
                    status = json.loads(resp.read())
                break
            except OSError:
                assert time.monotonic() < deadline and boot.poll() is None
                time.sleep(0.2)
        nats_port = urlsplit(status["board"]["urls"][0]).port
        socket.create_connection(("127.0.0.1", nats_port), timeout=2).close()  # the board is up
        boot.send_signal(signal.SIGKILL)
        boot.wait(10)
        deadline = time.monotonic() + 10
        while True:  # no orphan keeps the port: a restarted bootstrap can take it again
            try:
                socket.create_connection(("127.0.0.1", nats_port), timeout=1).close()
            except OSError:
                break
            assert time.monotonic() < deadline, "the nats-server outlived its bootstrap"
            time.sleep(0.2)
    finally:
        if boot.poll() is None:
            boot.kill()
