"""Websocket glue: listen, dial, and one `Link` per connection around a sans-I/O PeerConnection.

All protocol decisions live in engine.swarm.protocol; this module moves bytes, enforces websocket
limits (max_size, max_queue, ping/pong, no compression: no deflate bombs), bounds the outgoing queue
and turns network failures into ConnectError messages that say what to try.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidStatus,
    InvalidURI,
    PayloadTooBig,
)

from engine.swarm.config import LinkConfig, ProtocolLimits
from engine.swarm.errors import CapacityError, ConnectError, TransportError
from engine.swarm.protocol import PeerConnection, ProtocolEvent
from engine.swarm.tls import TlsError, client_context
from engine.swarm.wire import Hello

Websocket = ClientConnection | ServerConnection
EventHandler = Callable[["Link", list[ProtocolEvent]], Awaitable[None]]
CLOSE_TIMEOUT_S = 2.0
CLOSE_TOO_BIG = 1009  # websocket close code: message too big


def ws_options(limits: ProtocolLimits, link: LinkConfig) -> dict[str, Any]:
    return {"max_size": limits.max_frame_bytes, "max_queue": link.max_queue,
            "ping_interval": link.ping_interval_s, "ping_timeout": link.ping_timeout_s,
            "close_timeout": CLOSE_TIMEOUT_S, "compression": None}


def explain(url: str, exc: BaseException, timeout_s: float) -> TransportError:
    """A user-facing error: what failed connecting to `url` and what to check."""
    peer_hint = "is this a SAPO bootstrap or peer address (ws://host:port)?"
    if isinstance(exc, InvalidStatus):
        code = exc.response.status_code
        if code == 503:
            return CapacityError(f"could not join {url}: the server is full (HTTP 503) — try again later "
                                 "or use another bootstrap server")
        if code == 429:
            return CapacityError(f"could not join {url}: too many connections from this network address "
                                 "(HTTP 429) — other nodes behind the same router use it; try again later")
        return ConnectError(url, f"the server answered HTTP {code}", peer_hint)
    if isinstance(exc, InvalidURI):
        return ConnectError(url, "not a valid websocket URL", "write it as ws://host:port")
    if isinstance(exc, InvalidHandshake):
        if url.startswith("ws://"):  # a TLS listener answers a plain handshake with garbage, or nothing
            peer_hint += " if the server uses TLS, write wss://"
        return ConnectError(url, f"not a websocket server ({exc})", peer_hint)
    if isinstance(exc, ConnectionRefusedError):
        return ConnectError(url, "connection refused", "is the server running? check the URL/port/firewall")
    if isinstance(exc, socket.gaierror):
        return ConnectError(url, "cannot resolve the host name", "check the spelling and your DNS/network")
    if isinstance(exc, TimeoutError):
        return ConnectError(url, f"no answer within {timeout_s:g} s",
                            "is the host up and the port open? a firewall may be dropping the packets")
    if isinstance(exc, ssl.SSLCertVerificationError):
        return ConnectError(url, f"its TLS certificate is not trusted ({exc.verify_message})",
                            "a swarm with its own CA: give its CA file (sapo run --ca FILE, or the CA file "
                            "setting); otherwise check the host name and the server's certificate chain")
    if isinstance(exc, ssl.SSLError):
        return ConnectError(url, f"TLS failed ({exc.reason})", "is it a TLS server? check the certificate, "
                            "or use ws:// on a LAN")
    if isinstance(exc, OSError) and exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return ConnectError(url, "network unreachable", "check this machine's network connection and routes")
    if isinstance(exc, ConnectionClosed):
        return ConnectError(url, "the server closed the connection during the handshake",
                            "it may be full or shutting down; try again later")
    if isinstance(exc, OSError):
        return ConnectError(url, exc.strerror or str(exc), "check the URL/port/firewall")
    return ConnectError(url, f"{type(exc).__name__}: {exc}", "check the URL/port/firewall")


async def dial(url: str, limits: ProtocolLimits, link: LinkConfig, ca_file: str = "") -> ClientConnection:
    """Open a websocket to `url`; failures raise a ConnectError/CapacityError worded for users. A wss://
    server's certificate is checked against the system's CAs, or only those in `ca_file`."""
    options = ws_options(limits, link)
    if url.startswith("wss://"):
        try:
            options["ssl"] = client_context(ca_file or None)
        except TlsError as exc:
            raise ConnectError(url, str(exc), "fix the CA file setting (sapo run --ca FILE)") from exc
    try:
        return await connect(url, open_timeout=link.connect_timeout_s, **options)
    except (OSError, TimeoutError, InvalidHandshake, InvalidURI, ConnectionClosed) as exc:
        raise explain(url, exc, link.connect_timeout_s) from exc


async def listen(handler: Callable[[ServerConnection], Awaitable[None]], host: str, port: int,
                 limits: ProtocolLimits, link: LinkConfig, process_request: Any = None,
                 tls: ssl.SSLContext | None = None) -> Server:
    """Start a websocket server (wss:// given a `tls` server context); a busy port gives a TransportError
    saying what to do."""
    try:
        return await serve(handler, host, port, process_request=process_request, ssl=tls,
                           open_timeout=link.connect_timeout_s, **ws_options(limits, link))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise TransportError(f"cannot listen on {host}:{port}: the address is already in use — is "
                                 "another node or bootstrap running? pick another port (0 = any free "
                                 "port)") from exc
        raise TransportError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


def server_port(server: Server) -> int:
    for sock in server.sockets:
        return int(sock.getsockname()[1])
    raise TransportError("the listener has no socket")


class Link:
    """One websocket connection: its protocol state, a bounded send queue and counters.

    `send` never blocks: when a slow peer lets `send_queue` frames or `send_queue_bytes` bytes pile
    up, the oldest are dropped (counted in `dropped_out`), so one slow peer cannot grow memory or slow
    the others; a peer that stops reading altogether (one frame unsent for `write_timeout_s`) loses
    the link.
    """

    def __init__(self, ws: Websocket, conn: PeerConnection, *, send_queue: int, initiator: bool,
                 address: str, found_by: str, send_queue_bytes: int = 8 << 20,
                 write_timeout_s: float = 30.0) -> None:
        self.ws = ws
        self.conn = conn
        self.initiator = initiator  # True when this side dialled
        self.address = address  # the URL dialled, or the remote socket address
        self.found_by = found_by  # "mdns" | "bootstrap" | "manual" | "inbound"
        self.opened_at = time.time()
        self.frames_in = 0
        self.frames_out = 0
        self.dropped_out = 0
        self.close_reason = ""
        self._queue: deque[bytes] = deque()
        self._max_queue = send_queue
        self._max_queue_bytes = send_queue_bytes
        self._queued_bytes = 0
        self._write_timeout_s = write_timeout_s
        self._wake = asyncio.Event()
        self._closing = False
        self._writer_task: asyncio.Task[None] | None = None

    @property
    def peer_id(self) -> str | None:
        return self.conn.peer_id

    @property
    def hello(self) -> Hello | None:
        return self.conn.peer_hello

    @property
    def is_open(self) -> bool:
        return self.conn.state == "open" and not self._closing

    def send(self, frame: bytes) -> bool:
        """Queue one frame; False (and the oldest frame dropped) when the queue was full."""
        if self._closing:
            return False
        dropped = False
        while self._queue and (len(self._queue) >= self._max_queue
                               or self._queued_bytes + len(frame) > self._max_queue_bytes):
            self._queued_bytes -= len(self._queue.popleft())
            self.dropped_out += 1
            dropped = True
        self._queue.append(frame)
        self._queued_bytes += len(frame)
        self._wake.set()
        return not dropped

    async def run(self, on_events: EventHandler, handshake_timeout_s: float) -> None:
        """Send hello, then read until the link closes. Returns normally on any close."""
        hello = self.conn.hello_frame()
        self._queue.appendleft(hello)
        self._queued_bytes += len(hello)
        self._wake.set()
        writer = asyncio.get_running_loop().create_task(self._writer(), name=f"writer {self.address}")
        self._writer_task = writer
        try:
            async with asyncio.timeout(handshake_timeout_s) as deadline:
                while self.conn.state == "handshake":
                    await self._read_one(on_events)
                deadline.reschedule(None)
                while self.conn.state == "open" and not self._closing:
                    await self._read_one(on_events)
        except TimeoutError:
            self.close_reason = self.close_reason or "no hello in time"
        except PayloadTooBig:
            self.close_reason = "peer sent a frame over max_size"
        except ConnectionClosed as exc:
            if exc.sent is not None and exc.sent.code == CLOSE_TOO_BIG:
                # websockets enforced max_size before our parser saw the frame: count it all the same.
                self.conn.protocol.refuse("frame_too_large", self.peer_id or "")
                self.close_reason = "peer sent a frame over max_size"
            self.close_reason = self.close_reason or _closed_reason(exc)
        finally:
            await self._shutdown(writer)

    async def _read_one(self, on_events: EventHandler) -> None:
        data = await self.ws.recv(decode=False)
        self.frames_in += 1
        events = self.conn.receive(data)
        if events:
            await on_events(self, events)

    async def _writer(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                while not self._queue:
                    if self._closing:
                        return
                    self._wake.clear()
                    await self._wake.wait()
                frame = self._queue.popleft()
                self._queued_bytes -= len(frame)
                try:
                    await asyncio.wait_for(self.ws.send(frame, text=True), self._write_timeout_s)
                except TimeoutError:
                    # The peer stopped reading: its socket buffer is full. Drop the link, not the node.
                    self.close_reason = f"stalled: a frame was not taken within {self._write_timeout_s:g} s"
                    self._closing = True
                    transport = getattr(self.ws, "transport", None)
                    if transport is not None:
                        transport.abort()
                    return
                self.frames_out += 1

    async def close(self, reason: str, bye: bool = True) -> None:
        """Flush what is queued, say bye, close the socket. Safe to call more than once."""
        if self._closing:
            return
        self.close_reason = self.close_reason or reason
        if bye and self.conn.state != "closed":
            bye_frame = self.conn.bye_frame(reason)
            self._queue.append(bye_frame)
            self._queued_bytes += len(bye_frame)
        self._closing = True
        self._wake.set()
        if self._writer_task is not None:
            await self._drain(self._writer_task)
        await self.ws.close()  # wakes the reader in `run`, which then returns

    async def _drain(self, writer: asyncio.Task[None]) -> None:
        with contextlib.suppress(TimeoutError, ConnectionClosed):
            await asyncio.wait_for(asyncio.shield(writer), CLOSE_TIMEOUT_S)

    async def _shutdown(self, writer: asyncio.Task[None]) -> None:
        self._closing = True
        self._wake.set()
        await self._drain(writer)
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
        await self.ws.close()


async def run_listed(link: Link, links: set[Link], on_events: EventHandler, handshake_timeout_s: float,
                     closed: Callable[[Link], None]) -> None:
    """Run `link` to its end as one of `links` (the live links a server caps and reports), then tell
    `closed` so the server forgets what it knew through it."""
    links.add(link)
    try:
        await link.run(on_events, handshake_timeout_s)
    finally:
        links.discard(link)
        closed(link)


def _closed_reason(exc: ConnectionClosed) -> str:
    if exc.rcvd is None:
        return "connection lost"
    return f"closed by peer ({exc.rcvd.code}{': ' + exc.rcvd.reason if exc.rcvd.reason else ''})"


def source_host(link: Link) -> str:
    """The host a direct peer link comes from (its groups share one pool quota with every identity
    there); "" for a bootstrap's relay, which forwards many hosts' frames."""
    if link.hello is not None and link.hello.role == "bootstrap":
        return ""
    address = link.address
    if "://" in address:
        return urlsplit(address).hostname or ""
    return address.rsplit(":", 1)[0].strip("[]")
