"""A node's side of the board (asyncio glue around board.py's sans-I/O reader).

Connects to the board's servers (retrying with backoff while they are unreachable) and stays connected:
a board the servers closed (a credential that expired while the bootstrap was away, a server's error)
is replaced by a new connection, and a renewed credential moves the live connection onto it before the
old one expires. Puts the node's latest signed rollouts frame under its own key, and fetches J frames
of others per round; the reader checks every fetched frame before its groups go to the pool like those
from a direct link.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from engine.swarm import protocol as p
from engine.swarm.board import Board, BoardReader, FetchResult, fetch
from engine.swarm.errors import ConnectError
from engine.swarm.loops import Backoff
from engine.swarm.nats_auth import (
    JS_API,
    NODE_API_PREFIX,
    Credential,
    connect_options,
    decode_jwt,
    node_inbox,
    user_nkey_of,
)
from engine.swarm.tls import client_context, is_tls_url

ANY_HOST = ("0.0.0.0", "::", "[::]", "")


def resolve_board_urls(urls: Sequence[str], bootstrap_url: str) -> tuple[str, ...]:
    """A bootstrap names its data plane with host 0.0.0.0 when it means "my own host": use the host
    this node reached the bootstrap at."""
    host = urlsplit(bootstrap_url).hostname or "127.0.0.1"
    out = []
    for url in urls:
        parts = urlsplit(url)
        if (parts.hostname or "") in ANY_HOST:
            netloc = f"{host}:{parts.port}" if parts.port else host
            url = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
        out.append(url)
    return tuple(out)


def nats_board_factory(max_age_s: float, max_frame_bytes: int, ca_file: str = "") -> Callable[..., Any]:
    """Boards on NATS; tls:// and wss:// servers (and nats:// ones that require TLS) are verified against
    the system's CAs, or only those in `ca_file`."""
    async def make(urls: Sequence[str], connect_options: dict[str, Any], create: bool) -> Board:
        from engine.swarm.nats_board import NatsBoard

        tls = client_context(ca_file or None) if ca_file or any(map(is_tls_url, urls)) else None
        options = connect_options | ({"tls": tls} if tls is not None else {})
        # A credentialed node reaches the board's stream through its account's imports; on an open
        # board (no credentials, a trusted network) whoever comes makes the stream.
        board = await NatsBoard(urls, max_age_s=max_age_s, max_frame_bytes=max_frame_bytes, create=create,
                                connect_options=options,
                                api_prefix=JS_API if create else NODE_API_PREFIX).connect()
        if tls is not None and any(u.startswith("tls://") for u in urls) and not tls.session_stats()["connect"]:
            # nats-py goes plain when a server does not ask for TLS, whatever the URL said: refuse it
            await board.close()
            raise ConnectError(", ".join(urls), "the server did not use TLS, but the URL says tls://",
                               "is something between this node and the board? otherwise write nats://")
        return board
    return make


class BoardClient:
    def __init__(self, protocol: p.SwarmProtocol, log: Callable[[str, str], None],
                 make_board: Callable[..., Any], on_receipt: Callable[[bytes], None] | None = None) -> None:
        self.protocol = protocol
        self._on_receipt = on_receipt  # frames arriving in this node's receipts inbox
        self.reader = BoardReader(protocol)
        self._log = log
        self._make = make_board
        self.board: Board | None = None
        self.urls: tuple[str, ...] = ()
        self.counters = {"puts": 0, "put_errors": 0, "fetch_rounds": 0, "fetch_errors": 0, "frames_used": 0}
        self.fetch_ms: list[float] = []  # recent fetch-round latencies (bounded)
        self.credential: Credential | None = None  # the bootstrap's latest; None = an open board
        self.got_credential = asyncio.Event()
        self.nodes_on_board = 0  # nodes with a frame on the board at the last fetch (ourselves included)
        self.put_error = ""  # why the latest put failed ("" once one succeeds): the app shows it

    def set_credential(self, jwt: str, expires_at: float) -> bool:
        """Keep a credential from our bootstrap if it is for our key and still valid; the board's
        servers check the rest. Every (re)connect uses the newest one; `reauthenticate` moves a live
        connection onto it."""
        try:
            claims = decode_jwt(jwt)
        except ValueError as exc:
            self._log("warning", f"swarm: the bootstrap sent an unusable board credential ({exc})")
            return False
        if claims.get("sub") != user_nkey_of(self.protocol.identity.peer_id) or expires_at <= time.time():
            self._log("warning", "swarm: the bootstrap sent a board credential for another key, or expired")
            return False
        self.credential = Credential(jwt, expires_at)
        self.got_credential.set()
        return True
    @property
    def connected(self) -> bool:
        return self.board is not None

    async def reauthenticate(self) -> None:
        """A renewed credential arrived: reconnect the live board with it (the servers close a
        connection when the JWT it authenticated with expires)."""
        board = self.board
        renew = getattr(board, "reauthenticate", None)
        if renew is None:
            return
        try:
            await renew()
        except Exception as exc:  # noqa: BLE001 -- the connection is gone anyway: keep_connected replaces it
            self._log("warning", f"swarm: could not renew the board connection's credential ({self._why(exc)})")

    async def keep_connected(self, urls: Sequence[str], backoff: Backoff) -> None:
        """Connect, and connect again whenever the servers close the board for good (a task for the
        node's whole stay in the swarm: cancelled when it leaves)."""
        while True:
            await self.connect_loop(urls, backoff)
            board = self.board
            closed = getattr(board, "closed", None)
            if closed is None:  # a board that cannot close under us (the in-process one)
                return
            await closed.wait()
            if self.board is not board:  # closed by close(): the node is leaving
                return
            self.board = None
            why = getattr(board, "close_reason", "") or "closed by the server"
            self._log("warning", f"swarm: the board connection ended ({why}); reconnecting")
            backoff.reset()
            await asyncio.sleep(backoff.next())

    async def connect_loop(self, urls: Sequence[str], backoff: Backoff) -> None:
        """Until connected."""
        self.urls = tuple(urls)
        # TCP first; websockets (through NAT and HTTP proxies) when TCP cannot get through.
        groups = [g for g in (tuple(u for u in self.urls if not u.startswith(("ws://", "wss://"))),
                              tuple(u for u in self.urls if u.startswith(("ws://", "wss://")))) if g]
        while self.board is None:
            options = (connect_options(self.protocol.identity.sign, lambda: self.credential,
                                       node_inbox(self.protocol.identity.peer_id))
                       if self.credential is not None else {})
            errors = []
            for group in groups:
                try:  # with a credential the bootstrap made the stream; an open board is made by whoever comes
                    self.board = await self._make(group, options, self.credential is None)
                except Exception as exc:  # noqa: BLE001 -- unreachable, refused, or a stream we may not create
                    errors.append(str(exc))
                    continue
                self._log("info", f"swarm: sharing rollouts through the board at {', '.join(group)}")
                if self._on_receipt is not None:
                    try:
                        await self.board.on_receipts(self.protocol.identity.peer_id, self._on_receipt)
                    except Exception as exc:  # noqa: BLE001 -- receipts are a display: the board still works
                        self._log("warning", f"swarm: no receipts through the board ({exc})")
                return
            self._log("warning", f"swarm: the board at {', '.join(self.urls)} is unreachable "
                      f"({'; '.join(errors)}); retrying")
            await asyncio.sleep(backoff.next())

    async def put(self, frame: bytes) -> bool:
        board = self.board
        if board is None:
            return False
        try:
            await board.put(self.protocol.identity.peer_id, frame)
        except Exception as exc:  # noqa: BLE001 -- a failed put costs one round's sharing, never the node
            self.counters["put_errors"] += 1
            self.put_error = self._why(exc)[:300]
            self._log("warning", f"swarm: could not store this round's rollouts on the board: {self.put_error}")
            return False
        self.counters["puts"] += 1
        self.put_error = ""
        return True

    async def send_receipt(self, origin: str, frame: bytes) -> None:
        board = self.board
        if board is not None:
            await board.send_receipt(origin, frame)

    async def fetch(self, j: int) -> list[FetchResult]:
        board = self.board
        if board is None or j <= 0:
            return []
        started = time.perf_counter()
        try:
            results = await fetch(board, self.reader, j)
        except Exception as exc:  # noqa: BLE001 -- the next round fetches again
            self.counters["fetch_errors"] += 1
            self._log("warning", f"swarm: fetching peers' rollouts from the board failed: {self._why(exc)}")
            return []
        self.fetch_ms = [*self.fetch_ms[-99:], (time.perf_counter() - started) * 1000]
        self.nodes_on_board = int(getattr(board, "size", 0))  # the swarm's size, for free with the fetch
        self.counters["fetch_rounds"] += 1
        self.counters["frames_used"] += len(results)
        return results

    def _why(self, exc: BaseException) -> str:
        cred = self.credential
        if cred is not None and cred.expires_at < time.time():
            return (f"the board credential expired at {time.strftime('%H:%M', time.localtime(cred.expires_at))} "
                    "and the bootstrap has not renewed it (unreachable?): sharing resumes when it is back")
        return str(exc) or type(exc).__name__

    def stats(self) -> dict[str, Any]:
        cred = self.credential
        return {"connected": self.connected, "urls": list(self.urls), **self.counters,
                "credential_expires_at": cred.expires_at if cred is not None else None,
                "nodes_on_board": self.nodes_on_board, "put_error": self.put_error,
                "reader": dict(self.reader.counters),
                "fetch_ms_p50": sorted(self.fetch_ms)[len(self.fetch_ms) // 2] if self.fetch_ms else None}

    async def close(self) -> None:
        board, self.board = self.board, None
        if board is not None:
            await board.close()
