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


def _all(draws) -> list[int]:  # type: ignore[no-untyped-def]
    slots = []
    while (slot := draws.next()) is not None:
        slots.append(slot)
        draws.known(slot, slot)  # as if each read found a frame right there
    return slots


def test_draws_cover_the_extent_and_an_empty_board_draws_nothing() -> None:
    _, proto = _node()
    reader = BoardReader(proto, rng=random.Random(1))
    assert sorted(_all(reader.draws(5, 9, 3))) == [5, 6, 7, 8, 9]  # a small board: every slot once
    slots = _all(reader.draws(1, 1000, 3))
    assert len(slots) == 12 == len(set(slots)) and all(1 <= s <= 1000 for s in slots)
    assert _all(reader.draws(0, 0, 3)) == [] and _all(reader.draws(1, 5, 0)) == []


def test_a_flood_behind_the_largest_gap_does_not_win_every_read() -> None:
    """Frames at slots 1..8 (honest nodes), then a flooder whose latest frame is at 100,000: with
    fixed uniform draws nearly every read lands on the flooder; each read narrows the next here."""
    _, proto = _node()
    honest_found = []
    for seed in range(200):
        draws = BoardReader(proto, rng=random.Random(seed)).draws(1, 100_000, 4)
        found = set()
        while (slot := draws.next()) is not None:
            frame_at = slot if slot <= 8 else 100_000  # "the first frame at or after slot"
            draws.known(slot, frame_at)
            found.add(frame_at)
        honest_found.append(len(found - {100_000}))
    assert sum(honest_found) / len(honest_found) >= 4  # J = 4 honest frames reached on average
    assert sum(n >= 1 for n in honest_found) / len(honest_found) >= 0.9  # fixed draws: ~0.1% of reads


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


async def _put_all(board, nodes: list[tuple[Identity, p.SwarmProtocol]]) -> None:  # type: ignore[no-untyped-def]
    for ident, proto in nodes:
        await board.put(ident.peer_id, _frame(proto))  # a fresh frame (new seq): what a node puts each round


def test_a_reader_takes_every_frame_of_a_restarted_board() -> None:
    """A restarted board (a memory stream) numbers its slots from 1 again: a reader that remembered the
    old board's slots must not drop the new board's frames as repeats."""
    nodes = [_node() for _ in range(80)]
    _, mine = _node()
    reader = BoardReader(mine, rng=random.Random(5))

    async def main() -> tuple[int, int, int, int]:
        old = MemoryBoard()
        await _put_all(old, nodes)
        before = len(await fetch(old, reader, 80))
        restarted = MemoryBoard()  # the same nodes put their next rounds' frames on a new board
        await _put_all(restarted, nodes)
        after = len(await fetch(restarted, reader, 80))
        again = len(await fetch(restarted, reader, 80))  # nothing new since: every slot is a repeat
        fresh = len(await fetch(restarted, BoardReader(_node()[1]), 80))
        return before, after, again, fresh

    assert asyncio.run(main()) == (80, 80, 0, 80)
    assert reader.counters["board_restarts"] == 1 and reader.counters["repeats"] == 80


def test_a_reader_notices_a_new_board_that_already_outgrew_the_old_one() -> None:
    """The extent cannot tell when the new board passed the old one's last slot before this reader
    looked; a different frame in a slot already taken can (a slot holds one frame for a board's life)."""
    nodes = [_node() for _ in range(12)]
    _, mine = _node()
    reader = BoardReader(mine, rng=random.Random(6))

    async def main() -> tuple[int, int]:
        old = MemoryBoard()
        await _put_all(old, nodes[:4])
        before = len(await fetch(old, reader, 12))
        new = MemoryBoard()
        await _put_all(new, nodes)
        return before, len(await fetch(new, reader, 12))

    assert asyncio.run(main()) == (4, 12)
    assert reader.counters["board_restarts"] == 1


def test_an_idle_or_expiring_board_is_not_a_restart() -> None:
    now = [0.0]
    board = MemoryBoard(max_age_s=60, clock=lambda: now[0])
    nodes = [_node() for _ in range(5)]
    reader = BoardReader(_node()[1], rng=random.Random(7))

    async def main() -> list[int]:
        await _put_all(board, nodes)
        got = [len(await fetch(board, reader, 5))]
        now[0] = 61.0  # every frame expired: the board is empty, (0, 0), and that says nothing
        got.append(len(await fetch(board, reader, 5)))
        await _put_all(board, nodes[:2])  # slots 6 and 7: the extent moved forward
        got.append(len(await fetch(board, reader, 5)))
        return got

    assert asyncio.run(main()) == [5, 0, 2]
    assert reader.counters["board_restarts"] == 0
    frame = asyncio.run(board.get_from(6))
    assert frame is not None and reader.take(frame) is None and reader.counters["repeats"] == 1
    reader.observe(3, 7)
    reader.observe(7, 7)
    assert reader.counters["board_restarts"] == 0
    reader.observe(1, 3)  # the last slot went back: a new board, and what was taken is forgotten
    assert reader.counters["board_restarts"] == 1
    assert reader.take(frame) is None and reader.counters["repeats"] == 1  # not a repeat of a slot now...
    assert reader.protocol.refusals.by_reason["duplicate"] == 1  # ... and the signed frame's replay guard holds


@pytest.mark.timeout(90)
def test_a_reader_gets_new_frames_after_the_nats_server_restarts() -> None:
    """A real nats-server stopped and started on the same ports: its memory stream is made anew (by the
    bootstrap, here by a second board client), numbered from 1, and the reader that fetched from the
    old one takes the new frames."""
    from engine.swarm.nats_board import NatsBoard
    from engine.swarm.nats_server import NatsServer, NatsServerConfig

    nodes = [_node() for _ in range(6)]
    reader = BoardReader(_node()[1], rng=random.Random(8))
    server = NatsServer(NatsServerConfig(websocket_port=None, monitor_port=None)).start()

    async def retry(call):  # type: ignore[no-untyped-def]
        """nats-py reconnects on its own after the restart: retry until it has."""
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            try:
                return await call()
            except Exception:  # any client error while it reconnects
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def main() -> tuple[int, int, tuple[int, int]]:
        board = await NatsBoard([server.url], stream="T_RESTART", max_age_s=60).connect()
        try:
            await _put_all(board, nodes)
            before = len(await fetch(board, reader, 6))
            await asyncio.to_thread(server.stop)
            await asyncio.to_thread(server.start)
            maker = await retry(lambda: NatsBoard([server.url], stream="T_RESTART", max_age_s=60).connect())
            await maker.close()
            # The next round, on the same connections (nats-py reconnected them); one node has left, so
            # the new board ends below the old one's last slot.
            (first, proto), rest = nodes[0], nodes[1:5]
            await retry(lambda: board.put(first.peer_id, _frame(proto)))
            await _put_all(board, rest)
            extent = await board.extent()
            return before, len(await fetch(board, reader, 6)), extent
        finally:
            await board.close()

    try:
        before, after, extent = asyncio.run(main())
    finally:
        server.close()
    assert extent[0] <= 2 and extent[1] <= 6  # the new stream numbers from 1 again (a retried put may cost one)
    assert (before, after) == (6, 5) and reader.counters["board_restarts"] == 1


class _SlowBoard:
    """A memory board whose reads each take `delay_s` (a link's round trip), counting reads in flight."""

    def __init__(self, board: MemoryBoard, delay_s: float) -> None:
        self.board, self.delay_s = board, delay_s
        self.in_flight = self.most_in_flight = self.reads = self.waits = 0  # waits: reads begun with none in flight

    async def extent(self) -> tuple[int, int]:
        return await self.board.extent()

    async def get_from(self, slot: int) -> BoardFrame | None:
        self.reads += 1
        self.waits += self.in_flight == 0
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            return await self.board.get_from(slot)
        finally:
            self.in_flight -= 1


def test_a_fetch_reads_in_waves_not_one_frame_per_round_trip() -> None:
    nodes = [_node() for _ in range(12)]
    _, mine = _node()

    async def main() -> tuple[int, _SlowBoard]:
        memory = MemoryBoard()
        await _put_all(memory, nodes)
        slow = _SlowBoard(memory, delay_s=0.05)
        results = await fetch(slow, BoardReader(mine, rng=random.Random(2)), 4)
        return len({r.origin for r in results}), slow

    got, slow = asyncio.run(main())
    assert got == 4  # the frames wanted, from four different nodes
    assert slow.most_in_flight == 4 and slow.reads <= 16  # one wave asks for all four; the read budget holds
    assert slow.waits == 1  # one round trip for the four frames, where one read at a time waited four times
