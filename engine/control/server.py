"""The control server: asyncio websockets on 127.0.0.1 serving a `NodeControl` to token holders.

Thin glue around `protocol`: every frame is parsed and validated there. Per connection, requests run
as separate tasks (bounded), so a `leave` that waits for the round in flight never blocks `status`;
pushed events come from a bounded bus subscription that drops the oldest when the client is slow.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable
from typing import Any, Self

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from engine.bus import Subscription
from engine.control.api import NodeControl
from engine.control.protocol import (
    MAX_REQUEST_BYTES,
    PROTOCOL_VERSION,
    ControlProtocolError,
    ErrorCode,
    Request,
    encode_error,
    encode_event,
    encode_result,
    parse_request,
    status_to_wire,
    token_matches,
)

log = logging.getLogger("sapo.control")

CLOSE_POLICY = 1008  # websocket close code for "policy violation": failed or missing auth
CLOSE_TRY_AGAIN = 1013


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Session:
    """One authenticated connection: its request tasks and its optional event pump."""

    def __init__(self, ws: ServerConnection) -> None:
        self.ws = ws
        self.tasks: set[asyncio.Task[None]] = set()
        self.subscription: Subscription | None = None
        self.pump: asyncio.Task[None] | None = None
        self.unencodable_events = 0
        self.asking = False  # one question in flight per connection: the node's queue is shared by all

    def stop_pump(self) -> None:
        if self.subscription is not None:
            self.subscription.close()
            self.subscription = None
        if self.pump is not None:
            self.pump.cancel()
            self.pump = None


class ControlServer:
    def __init__(self, node: NodeControl, token: str, *, host: str = "127.0.0.1", port: int = 0,
                 max_connections: int = 8, max_in_flight: int = 16, auth_timeout_s: float = 5.0,
                 on_shutdown: Callable[[], None] | None = None) -> None:
        if not _is_loopback(host):
            raise ValueError(f"the control API only listens on loopback, not {host!r} (use an SSH tunnel)")
        if len(token) < 16:
            raise ValueError("control token is too short")
        self.node = node
        self._token = token
        self._host = host
        self._port = port
        self._max_connections = max_connections
        self._max_in_flight = max_in_flight
        self._auth_timeout_s = auth_timeout_s
        self._on_shutdown = on_shutdown  # optional: lets a client stop the engine process
        self._server: Server | None = None
        self._sessions: set[_Session] = set()
        self.connections = 0  # open websocket connections, authenticated or not
        self.refused = 0  # connections closed for a missing or wrong token

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("server not started")
        sock = next(iter(self._server.sockets))
        host, port = sock.getsockname()[:2]
        return f"ws://{host}:{port}"

    async def start(self) -> str:
        # origins=[None]: browsers always send an Origin header, so a web page can never connect.
        # compression=None: no deflate bombs.
        self._server = await serve(self._handle, self._host, self._port, origins=[None],
                                   compression=None, max_size=MAX_REQUEST_BYTES, max_queue=32,
                                   server_header=None)
        return self.url

    async def close(self) -> None:
        if self._server is None:
            return
        for session in list(self._sessions):
            session.stop_pump()
        self._server.close()
        await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _handle(self, ws: ServerConnection) -> None:
        if self.connections >= self._max_connections:
            await ws.close(CLOSE_TRY_AGAIN, "too many control connections")
            return
        self.connections += 1
        try:
            if await self._authenticate(ws):
                await self._serve_session(ws)
        except ConnectionClosed:
            pass  # the client went away; its tasks are cancelled in _serve_session
        finally:
            self.connections -= 1

    async def _authenticate(self, ws: ServerConnection) -> bool:
        try:
            raw = await asyncio.wait_for(ws.recv(), self._auth_timeout_s)
        except TimeoutError:
            self.refused += 1
            await ws.close(CLOSE_POLICY, "authenticate first")
            return False
        request_id = None
        try:
            request = parse_request(raw)
            request_id = request.id
            if request.method != "auth":
                raise ControlProtocolError(ErrorCode.UNAUTHORIZED, "the first request must be auth", request_id)
            if not token_matches(request.params["token"], self._token):
                raise ControlProtocolError(ErrorCode.UNAUTHORIZED, "wrong control token", request_id)
        except ControlProtocolError as exc:
            self.refused += 1
            log.warning("control connection refused: %s", exc.message)
            await ws.send(encode_error(exc.request_id, ErrorCode.UNAUTHORIZED, f"not authenticated: {exc.message}"))
            await ws.close(CLOSE_POLICY, "not authenticated")
            return False
        await ws.send(encode_result(request_id, {"protocol": PROTOCOL_VERSION, "server": "sapo-control"}))
        return True

    async def _serve_session(self, ws: ServerConnection) -> None:
        session = _Session(ws)
        self._sessions.add(session)
        try:
            async for raw in ws:
                try:
                    request = parse_request(raw)
                except ControlProtocolError as exc:
                    await ws.send(encode_error(exc.request_id, exc.code, exc.message))
                    continue
                if len(session.tasks) >= self._max_in_flight:
                    await ws.send(encode_error(request.id, ErrorCode.REJECTED, "too many requests in flight"))
                    continue
                task = asyncio.create_task(self._reply(session, request))
                session.tasks.add(task)
                task.add_done_callback(session.tasks.discard)
        finally:
            self._sessions.discard(session)
            session.stop_pump()
            for task in list(session.tasks):
                task.cancel()

    async def _reply(self, session: _Session, request: Request) -> None:
        try:
            result = await self._dispatch(session, request)
            text = encode_result(request.id, result)
        except ControlProtocolError as exc:
            text = encode_error(request.id, exc.code, exc.message)
        except ValueError as exc:  # the node refused (e.g. an invalid setting) or a non-JSON result
            text = encode_error(request.id, ErrorCode.REJECTED, str(exc))
        except Exception as exc:  # a bug in the node must not take the control server down
            log.exception("control method %s failed", request.method)
            text = encode_error(request.id, ErrorCode.INTERNAL, f"{request.method} failed: {exc!r}")
        try:
            await session.ws.send(text)
        except ConnectionClosed:
            return
        if request.method == "shutdown" and self._on_shutdown is not None:
            self._on_shutdown()

    async def _dispatch(self, session: _Session, request: Request) -> Any:
        node, params, method = self.node, request.params, request.method
        if method == "auth":
            return {"protocol": PROTOCOL_VERSION, "server": "sapo-control"}  # already authenticated
        if method == "ping":
            return {"pong": True, "ts": time.time()}
        if method == "status":
            return status_to_wire(node.status())
        if method in ("join", "leave", "resume"):
            await getattr(node, method)()
            return {"ok": True}
        if method == "pause":
            await node.pause(after_round=params["after_round"])
            return {"ok": True}
        if method == "snooze":
            await node.snooze(params["seconds"])
            return {"ok": True}
        if method == "get_settings":
            return node.get_settings()
        if method == "update_settings":
            return await node.update_settings(params["changes"])
        if method == "history":
            return node.history(limit=params["limit"])
        if method == "machine":
            return node.machine()
        if method == "ask":
            return await self._ask(session, params)
        if method == "subscribe":
            self._subscribe(session, params["replay"])
            return {"ok": True}
        if method == "unsubscribe":
            session.stop_pump()
            return {"ok": True}
        if method == "select_model":
            select = getattr(node, "select_model", None)
            if select is None:
                raise ControlProtocolError(ErrorCode.NOT_SUPPORTED, "this engine cannot switch models yet")
            await select(params["model_id"])
            return {"ok": True}
        if method == "recent_groups":
            recent = getattr(node, "recent_groups", None)
            if recent is None:
                raise ControlProtocolError(ErrorCode.NOT_SUPPORTED, "this engine keeps no recent groups")
            return recent()
        if method == "finish":
            finish = getattr(node, "finish", None)
            if finish is None:
                raise ControlProtocolError(ErrorCode.NOT_SUPPORTED, "this engine cannot finish and stop training")
            await finish()
            return {"ok": True}
        if method == "shutdown":
            if self._on_shutdown is None:
                raise ControlProtocolError(ErrorCode.NOT_SUPPORTED, "this engine was not started with shutdown support")
            return {"ok": True}
        raise ControlProtocolError(ErrorCode.METHOD_NOT_FOUND, f"unknown method {method!r}")

    async def _ask(self, session: _Session, params: dict[str, Any]) -> Any:
        ask = getattr(self.node, "ask", None)
        if ask is None:
            raise ControlProtocolError(ErrorCode.NOT_SUPPORTED, "this engine cannot answer questions")
        if session.asking:
            raise ControlProtocolError(ErrorCode.REJECTED, "a question from this window is still waiting for "
                                       "its answer: ask again after it")
        session.asking = True
        try:
            return await ask(specialty=params["specialty"], text=params["text"])
        finally:
            session.asking = False

    def _subscribe(self, session: _Session, replay: bool) -> None:
        session.stop_pump()
        subscription = self.node.bus.subscribe(replay=replay)
        session.subscription = subscription
        session.pump = asyncio.create_task(self._pump(session, subscription))

    async def _pump(self, session: _Session, subscription: Subscription) -> None:
        async for event in subscription:
            try:
                text = encode_event(event)
            except ValueError:  # a non-finite metric: drop this event, keep the stream
                session.unencodable_events += 1
                continue
            try:
                await session.ws.send(text)
            except ConnectionClosed:
                return
