"""The peer table: who this node knows, how it found them, and whether they are reachable now.

A peer is reachable directly (an open link) and/or through relays (listed by a bootstrap's `peers`
frame). `PeerInfo` is the immutable snapshot handed to the node and the GUI.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.swarm.identity import name_for

MAX_PEERS = 4096  # known peers kept at most; the longest-unseen disconnected ones are forgotten first


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

    def __init__(self, max_peers: int = MAX_PEERS) -> None:
        self._peers: dict[str, _Peer] = {}
        self._max = max_peers

    def _get(self, peer_id: str) -> _Peer:
        peer = self._peers.get(peer_id)
        if peer is None:
            if len(self._peers) >= self._max:
                self._forget_one()
            peer = self._peers[peer_id] = _Peer(peer_id)
        peer.last_seen = time.time()
        return peer

    def _forget_one(self) -> None:
        idle = [p for p in self._peers.values() if not p.connected] or list(self._peers.values())
        del self._peers[min(idle, key=lambda p: p.last_seen).peer_id]

    def link_opened(self, peer_id: str, model: str, tasks: str, found_by: str, address: str) -> PeerInfo:
        peer = self._get(peer_id)
        peer.model, peer.tasks, peer.direct = model, tasks, True
        peer.found_by, peer.address = found_by, address
        return peer.snapshot()

    def link_closed(self, peer_id: str) -> PeerInfo | None:
        peer = self._peers.get(peer_id)
        if peer is None or not peer.direct:
            return None
        peer.direct = False
        if peer.relayed_by:
            peer.address = min(peer.relayed_by)
        return peer.snapshot()

    def relay_listing(self, relay_url: str, entries: Iterable[tuple[str, str, str]], own_id: str) -> list[PeerInfo]:
        """A bootstrap at relay_url lists (peer_id, model, tasks); returns the snapshots that changed."""
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
        for peer in self._peers.values():
            if relay_url in peer.relayed_by and peer.peer_id not in listed:
                peer.relayed_by.discard(relay_url)
                changed.append(peer.snapshot())
        return changed

    def relay_lost(self, relay_url: str) -> list[PeerInfo]:
        return self.relay_listing(relay_url, (), own_id="")

    def seen(self, peer_id: str) -> None:
        if peer_id in self._peers:
            self._peers[peer_id].last_seen = time.time()

    def get(self, peer_id: str) -> PeerInfo | None:
        peer = self._peers.get(peer_id)
        return peer.snapshot() if peer else None

    def snapshot(self) -> list[PeerInfo]:
        return sorted((p.snapshot() for p in self._peers.values()), key=lambda p: (not p.connected, p.name))


def _differs(a: PeerInfo, b: PeerInfo) -> bool:
    return (a.connected, a.model, a.tasks, a.address, a.found_by) != (b.connected, b.model, b.tasks,
                                                                      b.address, b.found_by)
