"""Peers view model: one row per peer id, from PeerUpdated events and the store's peer history."""

from __future__ import annotations

from dataclasses import dataclass

from engine.events import PeerUpdated


@dataclass
class PeerRow:
    peer_id: str
    name: str
    model: str
    found_by: str
    address: str
    connected: bool
    last_seen: float
    received: int
    used: int


class PeersModel:
    def __init__(self, capacity: int = 512) -> None:
        self.capacity = capacity  # peers remembered; the longest-unseen disconnected ones go first
        self.rows: dict[str, PeerRow] = {}
        self.version = 0

    def apply(self, event: PeerUpdated) -> None:
        row = self.rows.get(event.peer_id)
        if row is not None and event.ts < row.last_seen:
            return  # older news (history loaded after live events)
        self.rows[event.peer_id] = PeerRow(event.peer_id, event.name, event.model, event.found_by,
                                           event.address, event.connected, event.ts,
                                           max(event.received, row.received if row else 0),
                                           max(event.used, row.used if row else 0))
        if len(self.rows) > self.capacity:
            gone = [r for r in self.rows.values() if not r.connected] or list(self.rows.values())
            del self.rows[min(gone, key=lambda r: r.last_seen).peer_id]
        self.version += 1

    def touch(self, peer_id: str, ts: float) -> None:
        """Something arrived from this peer (e.g. a rollout): it was alive at `ts`."""
        row = self.rows.get(peer_id)
        if row is not None and ts > row.last_seen:
            row.last_seen = ts
            self.version += 1

    @property
    def connected(self) -> int:
        return sum(r.connected for r in self.rows.values())

    def sorted_rows(self) -> list[PeerRow]:
        """Connected first, then most recently seen."""
        return sorted(self.rows.values(), key=lambda r: (not r.connected, -r.last_seen))
