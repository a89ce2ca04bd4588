"""The peer table: who this node knows, how it found them, and whether they are reachable now.

A peer is reachable directly (an open link) and/or through relays (listed by a bootstrap's `peers`
frame). `PeerInfo` is the immutable snapshot handed to the node and the GUI.

The asyncio loop writes the table while the trainer thread and the control API read it, so every
method holds one lock (an unlocked read during an insert raised "dictionary changed size during
iteration" and killed the trainer). Peers that are no longer reachable are forgotten after
`forget_after_s`: identities churning through a bootstrap must not pile up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine.swarm.identity import name_for

MAX_PEERS = 4096  # known peers kept at most; the longest-unseen disconnected ones are forgotten first
FORGET_AFTER_S = 600.0  # a peer unreachable for this long is dropped from the table


@dataclass(frozen=True)
class PeerInfo:
    """A snapshot of one peer, as the node and GUI see it."""

    peer_id: str
    name: str  # adjective-animal, derived from the id
    model: str  # the peer's base model id ("" if unknown)
    tasks: str  # the peer's task-library version ("" if unknown)
    found_by: str  # "mdns" | "bootstrap" | "manual" | "inbound"
    address: str  # URL of the direct link, or of the bootstrap relaying it
    connected: bool  # reachable now (direct link or listed by a connected bootstrap)
    direct: bool  # an open link to the peer itself
    last_seen: float  # unix seconds of the last sign of life


@dataclass
class _Peer:
    peer_id: str
    model: str = ""
    tasks: str = ""
    found_by: str = ""
    address: str = ""
    direct: bool = False
    relayed_by: set[str] = field(default_factory=set)  # bootstrap URLs currently listing this peer
    last_seen: float = 0.0

    @property
    def connected(self) -> bool:
        return self.direct or bool(self.relayed_by)

    def snapshot(self) -> PeerInfo:
        return PeerInfo(self.peer_id, name_for(self.peer_id), self.model, self.tasks, self.found_by,
                        self.address, self.connected, self.direct, self.last_seen)


class PeerTable:
    """Mutable peer records. Each mutator returns the new snapshot when something visible changed."""

    def __init__(self, max_peers: int = MAX_PEERS, forget_after_s: float = FORGET_AFTER_S,
                 clock: Callable[[], float] = time.time) -> None:
        if max_peers < 1 or not forget_after_s > 0:
            raise ValueError("max_peers must be >= 1 and forget_after_s > 0")
        self._peers: dict[str, _Peer] = {}
        self._max = max_peers
        self._forget_after_s = forget_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._next_expiry = 0.0

    def _get(self, peer_id: str) -> _Peer:
        peer = self._peers.get(peer_id)
        if peer is None:
            if len(self._peers) >= self._max:
                self._forget_one()
            peer = self._peers[peer_id] = _Peer(peer_id)
        peer.last_seen = self._clock()
        return peer

    def _expire(self) -> None:
        """Forget peers unreachable for forget_after_s (at most one sweep a second: O(n) each)."""
        now = self._clock()
        if now < self._next_expiry:
            return
        self._next_expiry = now + 1.0
        cutoff = now - self._forget_after_s
        for peer_id in [p.peer_id for p in self._peers.values() if not p.connected and p.last_seen < cutoff]:
            del self._peers[peer_id]

    def _forget_one(self) -> None:
        idle = [p for p in self._peers.values() if not p.connected] or list(self._peers.values())
        del self._peers[min(idle, key=lambda p: p.last_seen).peer_id]

    def link_opened(self, peer_id: str, model: str, tasks: str, found_by: str, address: str) -> PeerInfo:
        with self._lock:
            self._expire()
            peer = self._get(peer_id)
            peer.model, peer.tasks, peer.direct = model, tasks, True
            peer.found_by, peer.address = found_by, address
            return peer.snapshot()

    def link_closed(self, peer_id: str) -> PeerInfo | None:
        with self._lock:
            peer = self._peers.get(peer_id)
            if peer is None or not peer.direct:
                return None
            peer.direct = False
            peer.last_seen = self._clock()  # the forgetting clock starts when it became unreachable
            if peer.relayed_by:
                peer.address = min(peer.relayed_by)
            return peer.snapshot()

    def relay_listing(self, relay_url: str, entries: Iterable[tuple[str, str, str]], own_id: str) -> list[PeerInfo]:
        """A bootstrap at relay_url lists (peer_id, model, tasks); returns the snapshots that changed."""
        with self._lock:
            self._expire()
            changed = []
            listed = set()
            for peer_id, model, tasks in entries:
                if peer_id == own_id:
                    continue
                listed.add(peer_id)
                peer = self._get(peer_id)
                was = peer.snapshot()
                peer.relayed_by.add(relay_url)
                peer.model, peer.tasks = model or peer.model, tasks or peer.tasks
                if not peer.direct:
                    peer.found_by, peer.address = peer.found_by or "bootstrap", relay_url
                if _differs(was, peer.snapshot()):
                    changed.append(peer.snapshot())
            now = self._clock()
            for peer in self._peers.values():
                if relay_url in peer.relayed_by and peer.peer_id not in listed:
                    peer.relayed_by.discard(relay_url)
                    peer.last_seen = now
                    changed.append(peer.snapshot())
            return changed

    def relay_lost(self, relay_url: str) -> list[PeerInfo]:
        return self.relay_listing(relay_url, (), own_id="")

    def seen(self, peer_id: str) -> None:
        with self._lock:
            peer = self._peers.get(peer_id)
            if peer is not None:
                peer.last_seen = self._clock()

    def get(self, peer_id: str) -> PeerInfo | None:
        with self._lock:
            peer = self._peers.get(peer_id)
            return peer.snapshot() if peer else None

    def snapshot(self) -> list[PeerInfo]:
        with self._lock:
            self._expire()
            peers = [p.snapshot() for p in self._peers.values()]
        return sorted(peers, key=lambda p: (not p.connected, p.name))

    def connected_count(self) -> int:
        """Peers reachable now, without building snapshots (the trainer asks every round)."""
        with self._lock:
            return sum(1 for p in self._peers.values() if p.connected)

    def __len__(self) -> int:
        with self._lock:
            return len(self._peers)


def _differs(a: PeerInfo, b: PeerInfo) -> bool:
    return (a.connected, a.model, a.tasks, a.address, a.found_by) != (b.connected, b.model, b.tasks,
                                                                      b.address, b.found_by)
