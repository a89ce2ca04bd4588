"""The lab's shaping proxy (lab/bench/shaping.py) on real sockets on 127.0.0.1: the RTT it adds, its
uplink cap, stalls that hold bytes in order and drop none, its bounds, and a real nats-server and
nats-py client through it. Timings are compared as ratios to the configured shape, with room for a
busy machine above (a loaded loop only ever adds delay)."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable

import pytest

from engine.swarm.nats_server import NatsServer, NatsServerConfig
from lab.bench.shaping import MSS, LinkShape, LossPlan, ShapingConfig, ShapingProxy

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def _serve(handler: Handler) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_the_config_is_validated_and_a_home_link_halves_the_rtt() -> None:
    link = ShapingConfig.home_link(100, jitter_ms=5, uplink_mbit=5, loss_per_segment=0.01, seed=3)
    assert link.up.delay_ms == link.down.delay_ms == 50 and link.up.rate_mbit == 5 and link.down.rate_mbit is None
    for bad in ({"delay_ms": -1}, {"jitter_ms": 10, "delay_ms": 5}, {"rate_mbit": 0}, {"stall_ms": 50},
                {"loss_per_segment": 0.7}, {"burst_bytes": 100}):
        with pytest.raises(ValueError):
            LinkShape(**bad)  # type: ignore[arg-type]
    for bad_cfg in ({"max_connections": 0}, {"queue_chunks": 0}, {"chunk_bytes": 10}, {"write_timeout_s": 0}):
        with pytest.raises(ValueError):
            ShapingConfig(**bad_cfg)  # type: ignore[arg-type]


def test_losses_fall_on_the_same_bytes_whatever_the_reads() -> None:
    def losses(sizes: list[int], seed: int = 7) -> list[int]:
        plan, offset, found = LossPlan(0.05, random.Random(f"{seed}:0:up:loss")), 0, []
        for n in sizes:
            for piece, lost in plan.split(offset, bytes(n)):
                if lost:
                    found.append(offset)
                offset += len(piece)
        return found

    one_read = losses([400_000])
    assert one_read == losses([1000] * 400) == losses([MSS * 3 + 7] * 91 + [400_000 - (MSS * 3 + 7) * 91])
    assert 0.02 < len(one_read) / (400_000 / MSS) < 0.09 and all(x % MSS == 0 for x in one_read)
    assert losses([400_000], seed=8) != one_read  # seeded, not fixed


async def _rtts(port: int, n: int) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        writer.write(b"x" * 64)
        await reader.readexactly(64)
        out.append((time.perf_counter() - t0) * 1000)
    writer.close()
    return out


@pytest.mark.timeout(30)
def test_the_measured_rtt_is_the_configured_one() -> None:
    async def main() -> dict[int, float]:
        server, port = await _serve(_echo)
        medians = {}
        for rtt in (20, 100):
            async with ShapingProxy(ShapingConfig.home_link(rtt), ("127.0.0.1", port)) as proxy:
                medians[rtt] = statistics.median(await _rtts(proxy.port, 8))
        server.close()
        return medians

    for rtt, measured in asyncio.run(main()).items():
        assert 0.95 <= measured / rtt <= 2.0, (rtt, measured)


@pytest.mark.timeout(30)
def test_an_uplink_cap_holds_on_a_bulk_transfer() -> None:
    seen: list[tuple[float, int]] = []

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            seen.append((time.perf_counter(), len(data)))
        writer.close()

    async def main() -> None:
        server, port = await _serve(sink)
        config = ShapingConfig(up=LinkShape(delay_ms=10, rate_mbit=5.0))
        async with ShapingProxy(config, ("127.0.0.1", port)) as proxy:
            _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(bytes(1_000_000))  # 1.6 s at 5 Mbit/s
            await writer.drain()
            writer.close()
            for _ in range(100):
                if sum(n for _, n in seen) >= 1_000_000:
                    break
                await asyncio.sleep(0.1)
        server.close()

    asyncio.run(main())
    assert sum(n for _, n in seen) == 1_000_000
    # From the first byte to the last: the bucket's first burst (16 KiB) left at once.
    mbit = (1_000_000 - seen[0][1]) * 8 / (seen[-1][0] - seen[0][0]) / 1e6
    assert 0.8 <= mbit / 5.0 <= 1.05, mbit


@pytest.mark.timeout(30)
def test_stalls_hold_the_stream_and_keep_every_byte_in_order() -> None:
    payload = random.Random(1).randbytes(300_000)
    config = ShapingConfig.home_link(10, jitter_ms=3, loss_per_segment=0.01, stall_ms=200, seed=5)

    async def main() -> tuple[bytes, float, dict[str, int]]:
        server, port = await _serve(_echo)
        async with ShapingProxy(config, ("127.0.0.1", port)) as proxy:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            t0 = time.perf_counter()
            writer.write(payload)
            got = await reader.readexactly(len(payload))
            elapsed = time.perf_counter() - t0
            writer.close()
        server.close()
        return got, elapsed, dict(proxy.stats)

    got, elapsed, stats = asyncio.run(main())
    assert got == payload  # nothing lost, nothing reordered
    # Where the losses fall is a function of the seed and the bytes: each direction's count is known.
    expected = len(LossPlan(0.01, random.Random("5:0:up:loss")).split(0, payload)) - 1
    assert stats["stalls_up"] == expected > 0
    assert stats["stalls_down"] == len(LossPlan(0.01, random.Random("5:0:down:loss")).split(0, payload)) - 1
    assert elapsed >= 0.2 + 0.01  # at least one stall held the stream


@pytest.mark.timeout(30)
def test_links_are_capped_a_full_queue_pushes_back_and_close_ends_every_link() -> None:
    async def deaf(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)  # accepts, never reads

    async def main() -> None:
        server, port = await _serve(deaf)
        config = ShapingConfig(max_connections=1, chunk_bytes=16384, queue_chunks=8)
        proxy = await ShapingProxy(config, ("127.0.0.1", port)).start()
        _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(bytes(48 << 20))
        drained = asyncio.ensure_future(writer.drain())
        await asyncio.sleep(1.0)
        assert not drained.done()  # the sender is held back...
        assert proxy.stats["bytes_up"] < 24 << 20  # ...the queue (128 KiB) and socket buffers only
        second_reader, _ = await asyncio.open_connection("127.0.0.1", proxy.port)
        assert await asyncio.wait_for(second_reader.read(), 5) == b""  # over the cap: closed at once
        assert proxy.stats["refused"] == 1 and proxy.active == 1
        await asyncio.wait_for(proxy.close(), 5)
        assert proxy.active == 0
        drained.cancel()
        writer.close()
        server.close()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_real_nats_server_through_the_proxy_at_100_ms() -> None:
    import nats

    async def main(url_port: int) -> tuple[list[bytes], float, float, int]:
        # Seed 3 puts the first loss of each direction after the handshake, inside the 30 messages.
        config = ShapingConfig.home_link(100, jitter_ms=5, uplink_mbit=5, loss_per_segment=0.01, seed=3)
        async with ShapingProxy(config, ("127.0.0.1", url_port)) as proxy:
            nc = await nats.connect(f"nats://127.0.0.1:{proxy.port}", connect_timeout=5, allow_reconnect=False)
            got: list[bytes] = []
            arrived = asyncio.Event()

            async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
                got.append(msg.data)
                arrived.set()

            await nc.subscribe("lab.shaped", cb=on_msg)
            t0 = time.perf_counter()
            await nc.flush()
            flush_ms = (time.perf_counter() - t0) * 1000
            t0 = time.perf_counter()
            await nc.publish("lab.shaped", b"first")
            await asyncio.wait_for(arrived.wait(), 5)
            deliver_ms = (time.perf_counter() - t0) * 1000
            for i in range(30):
                await nc.publish("lab.shaped", f"m{i}".encode() + bytes(2000))
            await nc.flush()
            for _ in range(50):
                if len(got) == 31:
                    break
                await asyncio.sleep(0.1)
            await nc.close()
        return got, flush_ms, deliver_ms, proxy.stats["stalls_up"] + proxy.stats["stalls_down"]

    with NatsServer(NatsServerConfig(websocket_port=None, monitor_port=None)) as server:
        port = int(server.url.rsplit(":", 1)[1])
        got, flush_ms, deliver_ms, stalls = asyncio.run(main(port))
    assert got == [b"first"] + [f"m{i}".encode() + bytes(2000) for i in range(30)]  # all, in order
    assert stalls >= 2  # through stalls
    assert 0.95 <= flush_ms / 100 <= 2.0, flush_ms  # a PING/PONG is one round trip
    assert 0.95 <= deliver_ms / 100 <= 2.0, deliver_ms  # up to the server and back down
