"""The control client: connect, authenticate, call methods, iterate pushed events.

Server frames are untrusted (`sapo gui --engine URL` may point anywhere): replies and events are
validated by `protocol.parse_server_message`; a malformed frame is counted and dropped.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from collections.abc import AsyncIterator
from typing import Any, Self

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from engine.control.protocol import (
    MAX_REPLY_BYTES,
    ControlProtocolError,
    ErrorCode,
    Reply,
    encode_request,
    parse_server_message,
    status_from_wire,
)
from engine.control.status import NodeStatus
from engine.errors import SapoError
from engine.events import Event, EventError

log = logging.getLogger("sapo.control.client")


class ControlError(SapoError, RuntimeError):
    """The engine answered with an error, or the connection failed."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message


class ControlClient:
    def __init__(self, url: str, token: str, *, timeout_s: float = 30.0, event_queue: int = 8192) -> None:
        self.url = url
        self._token = token
        self._timeout_s = timeout_s  # per call; `leave` may wait for a whole round
        self._ws: ClientConnection | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._events: collections.deque[Event] = collections.deque(maxlen=event_queue)
        self._event_ready = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self.closed_reason = ""
        self.bad_frames = 0  # malformed frames from the server, dropped
        self.dropped_events = 0  # events lost because nobody read them fast enough

    async def connect(self, open_timeout_s: float = 5.0) -> dict[str, Any]:
        """Open and authenticate; raises ControlError (code UNAUTHORIZED for a wrong token)."""
        try:
            self._ws = await connect(self.url, open_timeout=open_timeout_s, max_size=MAX_REPLY_BYTES,
                                     compression=None, max_queue=64)
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise ControlError(int(ErrorCode.INTERNAL), f"cannot reach the engine at {self.url}: "
                               f"{exc or type(exc).__name__}") from None
        self._reader = asyncio.create_task(self._read())
        hello: dict[str, Any] = await self.call("auth", {"token": self._token}, timeout_s=open_timeout_s)
        return hello

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return self._reader is not None and not self._reader.done()

    async def call(self, method: str, params: dict[str, Any] | None = None,
                   timeout_s: float | None = None) -> Any:
        if self._ws is None or not self.connected:
            raise ControlError(int(ErrorCode.INTERNAL), f"not connected ({self.closed_reason or 'closed'})")
        request_id = next(self._ids)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await self._ws.send(encode_request(request_id, method, params))
            reply = await asyncio.wait_for(future, timeout_s or self._timeout_s)
        except TimeoutError:
            raise ControlError(int(ErrorCode.INTERNAL), f"{method}: no reply within "
                               f"{timeout_s or self._timeout_s:g} s") from None
        except ConnectionClosed as exc:
            raise ControlError(int(ErrorCode.INTERNAL), f"{method}: connection closed ({exc})") from None
        finally:
            self._pending.pop(request_id, None)
        if not reply.ok:
            raise ControlError(int(reply.error_code or 0), reply.error_message)
        return reply.result

    async def status(self, timeout_s: float | None = None) -> NodeStatus:
        """The node's status, parsed and checked (ControlError when the engine's reply is malformed)."""
        result = await self.call("status", timeout_s=timeout_s)
        try:
            return status_from_wire(result)
        except ControlProtocolError as exc:
            raise ControlError(int(exc.code), f"status: {exc.message}") from None

    async def subscribe(self, replay: bool = True) -> None:
        await self.call("subscribe", {"replay": replay})

    def drain_events(self) -> list[Event]:
        """Every event received so far, oldest first (non-blocking)."""
        items = list(self._events)
        self._events.clear()
        return items

    async def events(self) -> AsyncIterator[Event]:
        """Events as they arrive; ends when the connection closes."""
        while True:
            while self._events:
                yield self._events.popleft()
            if not self.connected:
                return
            self._event_ready.clear()
            await self._event_ready.wait()

    async def _read(self) -> None:
        assert self._ws is not None
        try:
            async for raw in self._ws:
                try:
                    message = parse_server_message(raw)
                except (ControlProtocolError, EventError) as exc:
                    self.bad_frames += 1
                    log.warning("dropped a malformed control frame: %s", exc)
                    continue
                if isinstance(message, Reply):
                    future = self._pending.get(message.id) if isinstance(message.id, int) else None
                    if future is not None and not future.done():
                        future.set_result(message)
                    continue
                if len(self._events) == self._events.maxlen:
                    self.dropped_events += 1
                self._events.append(message)
                self._event_ready.set()
        except ConnectionClosed as exc:
            self.closed_reason = str(exc)
        finally:
            rcvd = self._ws.close_reason if self._ws is not None else ""
            self.closed_reason = self.closed_reason or rcvd or "closed"
            for future in self._pending.values():
                if not future.done():
                    future.set_result(Reply(None, None, int(ErrorCode.INTERNAL),
                                            f"connection closed: {self.closed_reason}"))
            self._event_ready.set()
