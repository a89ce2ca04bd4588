"""A shaping TCP proxy on 127.0.0.1: home links (latency, jitter, an uplink cap, stalls) in user space.

This machine's kernel has no netem, so a bench puts this proxy between its nodes and the board
(nats-server). Each accepted connection is one link with its own shaping state, per direction:

  delay    every byte arrives `delay_ms` after it left (RTT/2 per direction for a symmetric link),
           plus a uniform jitter in [-jitter_ms, +jitter_ms]; bytes never overtake each other.
  rate     a token bucket caps how fast bytes leave (a home uplink of a few Mbit/s); while it is empty
           the proxy stops reading, so the sender sees TCP backpressure, not a growing queue.
  stalls   a lost segment the way TCP sees one: nothing is dropped, the byte stream is held. Each
           1448-byte segment is "lost" with probability `loss_per_segment`; it and every byte behind
           it arrive `stall_ms` later (a retransmission timeout, never under 200 ms on Linux).

Bounded: at most `max_connections` links (more are closed on accept), at most `queue_chunks` chunks of
at most `chunk_bytes` in flight per direction (a full queue stops reading: backpressure), a connect
timeout to the upstream, a write timeout after which a link whose reader stopped is closed, and
`close()` ends every link. Deterministic with a seed: where the losses fall in each link's byte stream
depends only on (seed, link index, direction); jitter draws are seeded too (applied per chunk read).
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Self

MSS = 1448  # bytes of one TCP segment on a 1500-byte Ethernet MTU with timestamps
MIN_RTO_MS = 200.0  # Linux TCP_RTO_MIN: a retransmission never comes sooner


@dataclass(frozen=True)
class LinkShape:
    """One direction of a link."""

    delay_ms: float = 0.0  # one-way delay every byte sees (RTT/2 on a symmetric link)
    jitter_ms: float = 0.0  # each chunk's delay is delay_ms + U(-jitter_ms, +jitter_ms), floored at 0
    rate_mbit: float | None = None  # cap in Mbit/s (10^6 bit/s) through a token bucket; None: uncapped
    burst_bytes: int = 16384  # the token bucket's depth: bytes that may leave at once after an idle spell
    loss_per_segment: float = 0.0  # probability that a segment is lost, which stalls the stream
    stall_ms: float = MIN_RTO_MS  # how long a lost segment holds the stream (>= 200 ms, TCP's minimum RTO)

    def __post_init__(self) -> None:
        if not (0 <= self.delay_ms <= 10_000):
            raise ValueError(f"delay_ms must be in [0, 10000], got {self.delay_ms}")
        if not (0 <= self.jitter_ms <= self.delay_ms):
            raise ValueError(f"jitter_ms must be in [0, delay_ms={self.delay_ms}], got {self.jitter_ms}")
        if self.rate_mbit is not None and not (0.01 <= self.rate_mbit <= 100_000):
            raise ValueError(f"rate_mbit must be None or in [0.01, 100000], got {self.rate_mbit}")
        if not (MSS <= self.burst_bytes <= 1 << 24):
            raise ValueError(f"burst_bytes must be in [{MSS}, {1 << 24}], got {self.burst_bytes}")
        if not (0 <= self.loss_per_segment < 0.5):
            raise ValueError(f"loss_per_segment must be in [0, 0.5), got {self.loss_per_segment}")
        if not (MIN_RTO_MS <= self.stall_ms <= 60_000):
            raise ValueError(f"stall_ms must be in [{MIN_RTO_MS}, 60000] (a TCP RTO), got {self.stall_ms}")


@dataclass(frozen=True)
class ShapingConfig:
    """A proxy's links: `up` shapes client -> server (a node's uplink), `down` server -> client."""

    up: LinkShape = field(default_factory=LinkShape)  # client -> upstream
    down: LinkShape = field(default_factory=LinkShape)  # upstream -> client
    seed: int = 0  # seeds every link's loss positions and jitter (with the link's index and direction)
    max_connections: int = 2048  # links open at once; one more is closed as soon as it is accepted
    chunk_bytes: int = 16384  # the most bytes one read takes (one queue entry)
    queue_chunks: int = 64  # chunks in flight per direction; a full queue stops reading (backpressure)
    connect_timeout_s: float = 5.0  # to reach the upstream for a new link
    write_timeout_s: float = 30.0  # a write that cannot drain in this time closes the link

    def __post_init__(self) -> None:
        if not (1 <= self.max_connections <= 100_000):
            raise ValueError(f"max_connections must be in [1, 100000], got {self.max_connections}")
        if not (MSS <= self.chunk_bytes <= 1 << 20):
            raise ValueError(f"chunk_bytes must be in [{MSS}, {1 << 20}], got {self.chunk_bytes}")
        if not (1 <= self.queue_chunks <= 4096):
            raise ValueError(f"queue_chunks must be in [1, 4096], got {self.queue_chunks}")
        for name in ("connect_timeout_s", "write_timeout_s"):
            if not (0 < getattr(self, name) <= 3600):
                raise ValueError(f"{name} must be in (0, 3600], got {getattr(self, name)}")

    @classmethod
    def home_link(cls, rtt_ms: float, *, jitter_ms: float = 0.0, uplink_mbit: float | None = None,
                  downlink_mbit: float | None = None, loss_per_segment: float = 0.0,
                  stall_ms: float = MIN_RTO_MS, **kwargs: Any) -> ShapingConfig:
        """A symmetric-delay link: RTT/2 each way, the same jitter and losses, an uplink (and downlink) cap."""
        def shape(rate: float | None) -> LinkShape:
            return LinkShape(delay_ms=rtt_ms / 2, jitter_ms=jitter_ms, rate_mbit=rate,
                             loss_per_segment=loss_per_segment, stall_ms=stall_ms)
        return cls(up=shape(uplink_mbit), down=shape(downlink_mbit), **kwargs)


class LossPlan:
    """Where a link direction's lost segments fall in its byte stream: geometric gaps of whole segments."""

    def __init__(self, p: float, rng: random.Random) -> None:
        self.p, self.rng = p, rng
        self.next_at = self._gap() if p > 0 else math.inf

    def _gap(self) -> int:
        u = 1.0 - self.rng.random()  # in (0, 1]
        return (int(math.log(u) / math.log1p(-self.p)) + 1) * MSS

    def split(self, offset: int, data: bytes) -> list[tuple[bytes, bool]]:
        """`data` (which starts at stream `offset`) cut at each loss: (piece, whether it starts with a loss)."""
        pieces, start, lost = [], 0, False
        while self.next_at < offset + len(data):
            cut = int(self.next_at) - offset
            if cut > start:
                pieces.append((data[start:cut], lost))
            start, lost = cut, True
            self.next_at += self._gap()
        pieces.append((data[start:], lost))
        return pieces


class _Bucket:
    def __init__(self, rate_mbit: float, burst: int, now: float) -> None:
        self.rate, self.burst = rate_mbit * 1e6 / 8, burst  # bytes per second, bytes
        self.tokens, self.at = float(burst), now

    def wait_for(self, n: int, now: float) -> float:
        """Take n bytes' tokens; seconds until they may leave (the bucket goes into debt, then waits)."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


class _Direction:
    """One direction of one link: read, stamp each piece with when it may arrive, queue; write on time."""

    def __init__(self, shape: LinkShape, config: ShapingConfig, key: str, stats: dict[str, int]) -> None:
        self.shape, self.config, self.stats, self.key = shape, config, stats, key
        self.jitter = random.Random(f"{config.seed}:{key}:jitter")
        self.loss = LossPlan(shape.loss_per_segment, random.Random(f"{config.seed}:{key}:loss"))
        self.queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=config.queue_chunks)
        self.read_size = min(config.chunk_bytes, shape.burst_bytes) if shape.rate_mbit else config.chunk_bytes

    async def pump_in(self, reader: asyncio.StreamReader, direction: str) -> None:
        loop = asyncio.get_running_loop()
        bucket = _Bucket(self.shape.rate_mbit, self.shape.burst_bytes, loop.time()) if self.shape.rate_mbit else None
        offset, last = 0, 0.0
        while data := await reader.read(self.read_size):
            if bucket is not None and (wait := bucket.wait_for(len(data), loop.time())) > 0:
                await asyncio.sleep(wait)  # not reading meanwhile: the sender's TCP window fills
            left = loop.time()
            for piece, lost in self.loss.split(offset, data):
                jitter = self.jitter.uniform(-self.shape.jitter_ms, self.shape.jitter_ms) if self.shape.jitter_ms else 0.0
                at = left + max(0.0, self.shape.delay_ms + jitter) / 1000
                if lost:
                    at += self.shape.stall_ms / 1000
                    self.stats[f"stalls_{direction}"] += 1
                last = max(last, at)  # in order: a held piece holds every piece behind it
                await self.queue.put((last, piece))  # blocks when full: backpressure
            offset += len(data)
            self.stats[f"bytes_{direction}"] += len(data)
        await self.queue.put((last, b""))  # end of stream, after every byte

    async def pump_out(self, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while True:
            at, piece = await self.queue.get()
            if (wait := at - loop.time()) > 0:
                await asyncio.sleep(wait)
            if not piece:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(piece)
            try:
                await asyncio.wait_for(writer.drain(), self.config.write_timeout_s)
            except TimeoutError:
                self.stats["write_timeouts"] += 1
                raise


class ShapingProxy:
    """Listen on 127.0.0.1:`port` (0: any free one); every link goes to `upstream` shaped by `config`."""

    def __init__(self, config: ShapingConfig, upstream: tuple[str, int], port: int = 0) -> None:
        self.config, self.upstream, self.port = config, upstream, port
        self.stats = {k: 0 for k in ("accepted", "refused", "connect_failures", "write_timeouts", "bytes_up",
                                     "bytes_down", "stalls_up", "stalls_down")}
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task[None]] = set()
        self._index = 0

    @property
    def active(self) -> int:
        return len(self._links)

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._links):
            task.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._links) >= self.config.max_connections or task is None:
            self.stats["refused"] += 1
            cwriter.close()
            return
        self._links.add(task)
        index, self._index = self._index, self._index + 1
        swriter = None
        try:
            try:
                sreader, swriter = await asyncio.wait_for(asyncio.open_connection(*self.upstream),
                                                          self.config.connect_timeout_s)
            except (OSError, TimeoutError):
                self.stats["connect_failures"] += 1
                return
            self.stats["accepted"] += 1
            await self._shape(index, creader, cwriter, sreader, swriter)
        finally:
            self._links.discard(task)
            for w in (cwriter, swriter):
                if w is not None:
                    w.close()

    async def _shape(self, index: int, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter,
                     sreader: asyncio.StreamReader, swriter: asyncio.StreamWriter) -> None:
        up = _Direction(self.config.up, self.config, f"{index}:up", self.stats)
        down = _Direction(self.config.down, self.config, f"{index}:down", self.stats)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(up.pump_in(creader, "up"))
                group.create_task(up.pump_out(swriter))
                group.create_task(down.pump_in(sreader, "down"))
                group.create_task(down.pump_out(cwriter))
        except* (OSError, TimeoutError):
            pass  # a reset, a closed peer or a write timeout ends this link, never the proxy


class ProxyThread:
    """A ShapingProxy on its own event loop in a daemon thread, for a bench whose nodes live elsewhere."""

    def __init__(self, config: ShapingConfig, upstream: tuple[str, int]) -> None:
        self.proxy = ShapingProxy(config, upstream)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="shaping-proxy", daemon=True)

    def __enter__(self) -> ShapingProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self._loop).result(10)
        return self.proxy

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
