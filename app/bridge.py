"""The GUI's link to the engine: the asyncio control client on a worker thread.

The Qt thread never waits on the network. Everything that arrives (a snapshot after each connect,
events, link changes) goes into one thread-safe inbox, in order, which the window drains a few times a
second; replies to calls come back through a queued signal. The worker reconnects by itself when the
engine restarts (re-reading the token, which changes at every engine start).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, Signal

from engine.control.client import ControlClient, ControlError
from engine.control.protocol import ErrorCode
from engine.events import Event

log = logging.getLogger("sapo.gui.bridge")

ReplyCallback = Callable[[Any, str | None], None]  # (result, error message or None)


@dataclass(frozen=True)
class LinkChange:
    """Inbox item: the control link went up (with a snapshot) or down (with a reason)."""

    up: bool
    reason: str = ""
    snapshot: dict[str, Any] | None = None  # {"status" (a NodeStatus), "settings", "history", "machine"} when up
    fatal: bool = False  # no point retrying (e.g. a wrong token)


class EngineBridge(QObject):
    reply = Signal(int, object, object)  # call id, result, error message (None on success)

    def __init__(self, url: str, token_provider: Callable[[], str], *, reconnect_s: float = 1.0,
                 history_limit: int = 2000, url_provider: Callable[[], str | None] | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.url = url
        self._token_provider = token_provider  # called at each (re)connect
        self._url_provider = url_provider  # a local engine may come back on another port
        self._reconnect_s = reconnect_s
        self._history_limit = history_limit
        self._inbox: collections.deque[Event | LinkChange] = collections.deque(maxlen=50_000)
        self._callbacks: dict[int, ReplyCallback] = {}
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: ControlClient | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._started = threading.Event()
        self.reply.connect(self._on_reply)

    # --- Qt thread -----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="engine-bridge", daemon=True)
        self._thread.start()
        self._started.wait(5.0)

    def stop(self, timeout_s: float = 3.0) -> None:
        self._stopping = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks(loop)])
            except RuntimeError:
                pass  # the loop closed between the check and the call: nothing left to cancel
        if self._thread is not None:
            self._thread.join(timeout_s)

    def token(self) -> str:
        """The engine's control token as of now (it renews with each engine start)."""
        return self._token_provider()

    def take(self, max_items: int = 1_000_000) -> list[Event | LinkChange]:
        """What arrived since the last call, oldest first, at most `max_items` (the rest stays queued)."""
        items: list[Event | LinkChange] = []
        while self._inbox and len(items) < max_items:
            items.append(self._inbox.popleft())
        return items

    def call_at_exit(self, method: str, timeout_s: float = 2.0) -> str | None:
        """Blocking call, for the last moment of the app only (the window is already gone).

        Returns None on success, else the error message.
        """
        loop, client = self._loop, self._client
        if loop is None or loop.is_closed() or client is None:
            return "not connected to the engine"
        try:
            asyncio.run_coroutine_threadsafe(client.call(method, timeout_s=timeout_s), loop).result(timeout_s + 1)
        except ControlError as exc:
            return exc.message
        except TimeoutError:
            return f"{method}: no reply"
        return None

    def call(self, method: str, params: dict[str, Any] | None = None,
             callback: ReplyCallback | None = None, timeout_s: float = 600.0) -> int:
        """Send a request without waiting; `callback(result, error)` runs later on the Qt thread. A
        `status` result comes as the control client parses it: an engine.control.status.NodeStatus."""
        call_id = next(self._ids)
        if callback is not None:
            self._callbacks[call_id] = callback
        loop = self._loop
        if loop is None or loop.is_closed():
            self.reply.emit(call_id, None, "not connected to the engine")
            return call_id
        asyncio.run_coroutine_threadsafe(self._call(call_id, method, params, timeout_s), loop)
        return call_id

    def _on_reply(self, call_id: int, result: Any, error: str | None) -> None:
        callback = self._callbacks.pop(call_id, None)
        if callback is not None:
            callback(result, error)

    # --- worker thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._started.set()
        try:
            loop.run_until_complete(self._connect_forever())
        except asyncio.CancelledError:
            pass  # stop() cancelled the tasks
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _call(self, call_id: int, method: str, params: dict[str, Any] | None, timeout_s: float) -> None:
        client = self._client
        if client is None or not client.connected:
            self.reply.emit(call_id, None, "not connected to the engine")
            return
        try:
            result = await (client.status(timeout_s) if method == "status"
                            else client.call(method, params, timeout_s=timeout_s))
        except ControlError as exc:
            self.reply.emit(call_id, None, exc.message)
            return
        self.reply.emit(call_id, result, None)

    async def _connect_forever(self) -> None:
        delay = self._reconnect_s
        while not self._stopping:
            reason, fatal, was_up = await self._session()
            self._inbox.append(LinkChange(False, reason, fatal=fatal))
            if fatal or self._stopping:
                return
            delay = self._reconnect_s if was_up else min(delay * 2, 10.0)  # back off while it is away
            await asyncio.sleep(delay)

    async def _session(self) -> tuple[str, bool, bool]:
        """One connection's life: why it ended, whether retrying is pointless, whether it was up."""
        if self._url_provider is not None:
            self.url = self._url_provider() or self.url
        try:
            token = self._token_provider()
        except (OSError, RuntimeError, ValueError) as exc:
            return f"no control token: {exc}", False, False
        client = ControlClient(self.url, token)
        try:
            await client.connect()
            snapshot = {"status": await client.status(), "settings": await client.call("get_settings"),
                        "history": await client.call("history", {"limit": self._history_limit})}
        except ControlError as exc:
            await client.close()
            return exc.message, exc.code == int(ErrorCode.UNAUTHORIZED), False
        self._client = client
        self._inbox.append(LinkChange(True, snapshot=snapshot))
        try:
            await client.subscribe(replay=True)
            machine_task = asyncio.create_task(self._fetch_machine(client))
            async for event in client.events():
                self._inbox.append(event)
            machine_task.cancel()
        except ControlError as exc:
            return exc.message, False, True
        finally:
            self._client = None
            await client.close()
        return f"engine connection closed ({client.closed_reason})", False, True

    async def _fetch_machine(self, client: ControlClient) -> None:
        """The doctor report can take a moment on the engine side: fetch it after the live feed starts."""
        try:
            machine = await client.call("machine", timeout_s=120.0)
        except ControlError as exc:
            log.warning("machine report unavailable: %s", exc.message)
            return
        self._inbox.append(LinkChange(True, snapshot={"machine": machine}))


@dataclass(eq=False)
class EngineSession:
    """An engine the window keeps a link to: the bridge, the Qt-free models it feeds, and the calls in
    flight for it. The window's own engine (`home`) is kept for the window's life (its tray, its exit);
    another fleet engine only while it is shown."""

    name: str
    bridge: EngineBridge
    model: Any  # app.models.AppModel (imported by the window: the bridge stays free of the models)
    home: bool = False
    busy: bool = False  # a join/leave call is in flight
    status_calls: int = 0  # status refreshes in flight (header identity)
    status_stale: bool = False  # asked again while one was in flight
