"""The board on NATS JetStream: one stream, one subject per node, the latest frame per subject. The stream
is in memory, or on disk (`storage="file"`: a bootstrap with a data dir, whose frames outlive its restart).

Stream settings do the board's bookkeeping on the server: `max_msgs_per_subject=1` (a put replaces the
node's previous frame), `max_age` (frames older than the pool's staleness vanish), `max_msg_size` (the
protocol's frame limit), `allow_direct` (reads served by any replica, without the JetStream API
round trip). A fetch is one direct get "first message at or after sequence s on sapo.rollouts.*":
O(1) per fetch however many nodes there are. nats-py reconnects across the cluster's servers by itself,
but a server's `-ERR` (a user JWT that expired on a live connection, say) closes its client for good:
`closed` is then set, every call fails fast without touching the client (nats-py leaves a response
future in its request map for each request made on a closed client, forever), and the owner makes a
new board (board_client.py). `reauthenticate` moves a live connection to a renewed credential before
the server would close it for the old one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from collections.abc import Callable, Sequence
from typing import Any

from engine.swarm.board import SUBJECT_PREFIX, BoardFrame, key_subject
from engine.swarm.errors import ConnectError
from engine.swarm.nats_auth import JS_API, STREAM, Authority, BoardQuota, connect_options
from engine.swarm.receipts import MAX_RECEIPT_FRAME_BYTES, receipt_subject

__all__ = ["STREAM", "NatsBoard", "create_board_stream", "quiet_errors"]


async def quiet_errors(exc: Exception) -> None:
    """nats-py's default error callback logs a traceback per failed attempt; callers report once."""


class NatsBoard:
    def __init__(self, servers: Sequence[str], *, stream: str = STREAM, prefix: str = SUBJECT_PREFIX,
                 max_age_s: float = 600.0, max_frame_bytes: int = 1 << 20, replicas: int = 1,
                 create: bool = True, connect_options: dict[str, Any] | None = None, api_prefix: str = JS_API,
                 store_bytes: int = -1, storage: str = "memory") -> None:
        if not servers:
            raise ValueError("NatsBoard needs at least one server URL")
        self.servers = list(servers)
        self.stream, self.prefix = stream, prefix
        self.max_age_s, self.max_frame_bytes, self.replicas = max_age_s, max_frame_bytes, replicas
        self.create = create
        self.connect_options = connect_options or {}
        self.api_prefix = api_prefix  # JetStream's API here: a node reaches it through its account's imports
        self.store_bytes = store_bytes  # the stream's bytes at most (-1: unbounded, an open board)
        if storage not in ("memory", "file"):
            raise ValueError(f"storage must be 'memory' or 'file', not {storage!r}")
        self.storage = storage  # where a stream this board makes keeps its frames
        self.nc: Any = None
        self.js: Any = None
        self.size = 0  # frames (= nodes: one per key) on the board at the last extent()
        self.closed = asyncio.Event()  # the client is closed for good (by us, or by a server's -ERR)
        self.close_reason = ""  # the server's error, when it closed us

    async def _on_closed(self) -> None:
        err = getattr(self.nc, "last_error", None) if self.nc is not None else None
        self.close_reason = str(err) if err else ""
        self.closed.set()

    def _live(self) -> Any:
        """The client, or ConnectionClosedError without calling it once it is closed."""
        nc = self.nc
        if nc is None or nc.is_closed:
            from nats.errors import ConnectionClosedError

            raise ConnectionClosedError
        return nc

    async def connect(self, timeout_s: float = 5.0) -> NatsBoard:
        import nats

        try:  # the first connect fails fast (a refused credential must be reported, not retried forever)
            self.nc = await nats.connect(servers=self.servers, connect_timeout=timeout_s, allow_reconnect=False,
                                         max_reconnect_attempts=1, reconnect_time_wait=0.2, error_cb=quiet_errors,
                                         closed_cb=self._on_closed, **self.connect_options)
        except Exception as exc:  # nats-py raises several unrelated types here
            why = str(exc) or type(exc).__name__
            hint = ("the board refused this node's credential (expired, or from another swarm): the bootstrap "
                    "renews it while this node is linked to it" if "Authorization" in why else
                    "is the swarm's NATS server up and reachable from here?")
            raise ConnectError(", ".join(self.servers), why, hint) from exc
        # ... and once in, it rides out server restarts and fails over across the cluster for good
        # (nats-py reads these options at each reconnect).
        self.nc.options["allow_reconnect"] = True
        self.nc.options["max_reconnect_attempts"] = -1
        self.nc.options["reconnect_time_wait"] = 0.5
        self.js = self.nc.jetstream(timeout=timeout_s, prefix=self.api_prefix)
        if self.create:
            await self.ensure_stream()
        return self

    async def ensure_stream(self) -> bool:
        """Make the stream, or put its settings back -> whether it had been missing."""
        from nats.js.api import DiscardPolicy, StorageType, StreamConfig
        from nats.js.errors import NotFoundError

        # discard OLD with a byte cap: a full board drops its oldest frames, a put never fails for room
        config = StreamConfig(name=self.stream, subjects=[f"{self.prefix}.*"], max_msgs_per_subject=1,
                              max_age=self.max_age_s, max_msg_size=self.max_frame_bytes,
                              max_bytes=self.store_bytes, storage=StorageType(self.storage), discard=DiscardPolicy.OLD,
                              allow_direct=True, num_replicas=self.replicas)
        try:
            self._live()
            info = await self.js.stream_info(self.stream)
        except NotFoundError:
            await self.js.add_stream(config)
            return True
        ours = (config.max_bytes, config.max_msg_size, config.max_age, config.max_msgs_per_subject)
        if (info.config.max_bytes, info.config.max_msg_size, info.config.max_age,
                info.config.max_msgs_per_subject) != ours:
            # JetStream cannot move a stream between memory and disk: the settings, where it is
            await self.js.update_stream(dataclasses.replace(config, storage=info.config.storage))
        return False

    async def reauthenticate(self) -> None:
        """Reconnect now, with the credential callback's current (renewed) JWT: the server closes a
        connection whose JWT expires, and a renewal alone does not reach a live connection."""
        await self._live().force_reconnect()

    async def put(self, peer_id: str, frame: bytes) -> int:
        self._live()
        ack = await self.js.publish(key_subject(peer_id, self.prefix), frame, stream=self.stream)
        return int(ack.seq)

    async def extent(self) -> tuple[int, int]:
        self._live()
        info = await self.js.stream_info(self.stream)
        self.size = int(info.state.messages)
        if not info.state.messages:
            return (0, 0)
        return (int(info.state.first_seq), int(info.state.last_seq))

    async def get_from(self, slot: int) -> BoardFrame | None:
        from nats.js.errors import NotFoundError

        self._live()
        try:
            msg = await self.js.get_msg(self.stream, seq=max(1, slot), subject=f"{self.prefix}.*", next=True,
                                        direct=True)
        except NotFoundError:
            return None
        return BoardFrame(subject=str(msg.subject), slot=int(msg.seq), data=bytes(msg.data or b""))

    async def remove(self, peer_id: str) -> None:
        """Take a node's frame off the board (the board's own user only: nodes have no purge)."""
        self._live()
        await self.js.purge_stream(self.stream, subject=key_subject(peer_id, self.prefix))

    async def send_receipt(self, origin: str, frame: bytes) -> None:
        await self._live().publish(receipt_subject(origin), frame)  # core NATS: nobody listening, nothing kept

    async def on_receipts(self, me: str, handler: Callable[[bytes], None]) -> None:
        async def deliver(msg: Any) -> None:
            handler(bytes(msg.data or b""))

        # Bounded: a flood past 256 pending receipts (or their bytes) is dropped by the client, not queued.
        await self._live().subscribe(receipt_subject(me), cb=deliver, pending_msgs_limit=256,
                                     pending_bytes_limit=256 * MAX_RECEIPT_FRAME_BYTES)

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()
            self.nc = None
        self.closed.set()


def admin_board(urls: str | Sequence[str], authority: Authority, *, replicas: int = 1,
                tls: ssl.SSLContext | None = None, create: bool = False, storage: str = "memory") -> NatsBoard:
    """A board connection (not yet made) as the bootstrap's own user, in the board's account. `tls`:
    the context for servers that serve TLS (engine/swarm/tls.py); `storage`: of a stream it makes."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    cred = authority.admin(key)
    quota: BoardQuota = authority.quota
    options = connect_options(key.sign, lambda: cred) | ({"tls": tls} if tls is not None else {})
    return NatsBoard([urls] if isinstance(urls, str) else list(urls), stream=authority.stream,
                     prefix=authority.prefix, max_age_s=quota.max_age_s, max_frame_bytes=quota.max_frame_bytes,
                     store_bytes=quota.store_bytes, replicas=replicas, create=create, connect_options=options,
                     storage=storage)


async def create_board_stream(urls: str | Sequence[str], authority: Authority, *, replicas: int = 1,
                              tls: ssl.SSLContext | None = None, storage: str = "memory") -> None:
    """Make the board's stream, or put its settings back (nodes cannot: it is in the board's account)."""
    board = await admin_board(urls, authority, replicas=replicas, tls=tls, create=True, storage=storage).connect()
    await board.close()


async def keep_board_stream(urls: Sequence[str], authority: Authority, log: Callable[[str, str], None], *,
                            replicas: int = 1, every_s: float = 2.0, tls: ssl.SSLContext | None = None,
                            storage: str = "memory") -> None:
    """The bootstrap's watch, forever: the board's stream exists with its settings. A restarted memory
    server has lost it, and without it every node's put fails."""
    board: NatsBoard | None = None
    try:
        while True:
            try:
                if board is None or board.closed.is_set():
                    board = None
                    board = await admin_board(urls, authority, replicas=replicas, tls=tls, storage=storage).connect()
                if await board.ensure_stream():
                    log("warning", "board: its stream was gone (a restarted server?); made it again")
            except Exception as exc:  # noqa: BLE001 -- nats-py raises unrelated types; try again next time
                log("warning", f"board: could not check its stream ({str(exc) or type(exc).__name__})")
            await asyncio.sleep(every_s)
    finally:
        if board is not None:
            await board.close()
