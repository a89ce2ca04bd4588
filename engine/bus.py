"""A small event bus: the node publishes from any thread, asyncio subscribers read bounded queues.

Slow subscribers lose their oldest events rather than growing memory without bound (the reference
implementation's users saw host RAM grow for hours). A short replay buffer lets a late subscriber
(the GUI connecting after the engine started) see recent history at once.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import AsyncIterator

from engine.events import Event


class Subscription:
    """An async iterator over events; `dropped` counts events lost to a full queue."""

    def __init__(self, bus: EventBus, loop: asyncio.AbstractEventLoop, maxsize: int) -> None:
        self._bus = bus
        self._loop = loop
        self._queue: collections.deque[Event] = collections.deque(maxlen=maxsize)
        self._ready = asyncio.Event()
        self.dropped = 0
        self.closed = False

    def _push(self, event: Event) -> None:  # runs on the subscriber's loop
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        self._queue.append(event)
        self._ready.set()

    async def get(self) -> Event:
        while not self._queue:
            if self.closed:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        return self._queue.popleft()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        return await self.get()

    def close(self) -> None:
        self.closed = True
        self._bus._unsubscribe(self)
        self._ready.set()


class EventBus:
    def __init__(self, replay: int = 512, queue_size: int = 4096) -> None:
        self._lock = threading.Lock()
        self._subs: list[Subscription] = []
        self._recent: collections.deque[Event] = collections.deque(maxlen=replay)
        self._queue_size = queue_size
        self._listeners: list[collections.abc.Callable[[Event], None]] = []

    def publish(self, event: Event) -> None:
        """Thread-safe. Delivers to every subscriber on its own loop."""
        with self._lock:
            self._recent.append(event)
            subs = list(self._subs)
            listeners = list(self._listeners)
        for sub in subs:
            try:
                sub._loop.call_soon_threadsafe(sub._push, event)
            except RuntimeError:  # the subscriber's loop is closed: forget it
                self._unsubscribe(sub)
        for listener in listeners:
            listener(event)

    def add_listener(self, listener: collections.abc.Callable[[Event], None]) -> None:
        """A synchronous callback run on the publishing thread (keep it quick: e.g. a store write)."""
        with self._lock:
            self._listeners.append(listener)

    def subscribe(self, replay: bool = True) -> Subscription:
        """Call from a running asyncio loop."""
        sub = Subscription(self, asyncio.get_running_loop(), self._queue_size)
        with self._lock:
            if replay:
                for event in self._recent:
                    sub._push(event)
            self._subs.append(sub)
        return sub

    def recent(self) -> list[Event]:
        with self._lock:
            return list(self._recent)

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)
