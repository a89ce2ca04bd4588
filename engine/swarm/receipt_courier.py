"""The asyncio side of receipts (engine/swarm/receipts.py): send this node's after a round, take
peers' from direct links and from the board's inbox, and keep the totals across restarts."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine.sapo.records import Candidate, RolloutGroup, content_key
from engine.swarm import protocol as p
from engine.swarm.errors import ProtocolError
from engine.swarm.receipts import (
    MAX_GROUPS_PER_RECEIPT,
    MAX_RECEIPT_FRAME_BYTES,
    ReceiptBook,
    ReceiptConfig,
    receipt_body,
    receipt_from_wire,
)

MAX_STATE_BYTES = 1 << 20


class ReceiptCourier:
    def __init__(self, protocol: p.SwarmProtocol, config: ReceiptConfig, link_to: Callable[[str], Any],
                 board: Any, state_path: Path | None = None, vouched: Callable[[str], bool] | None = None) -> None:
        self.protocol, self.config = protocol, config
        self.book = ReceiptBook(config, protocol.identity.peer_id, vouched=vouched)
        self._link_to = link_to  # peer id -> its open direct link, or None
        self._board = board  # the node's BoardClient
        self._state_path = state_path
        self.sent = 0

    def published(self, groups: Sequence[RolloutGroup]) -> None:
        """This node's own groups, as it shared them (their keys, hashed here: they were never candidates)."""
        self.book.published(content_key(g) for g in groups)

    async def send(self, used: Sequence[Candidate]) -> int:
        """One receipt per origin for the peers' groups this node trained on, by the keys the pool gave them
        (with this node's rewards, which say whether each gave the update a gradient) -> receipts sent."""
        if not self.config.send:
            return 0
        by_origin: dict[str, list[str]] = {}
        moved: set[str] = set()  # groups whose rewards here gave this round's update a gradient
        for c in used:
            by_origin.setdefault(c.origin, []).append(c.key)
            if c.group.has_signal:
                moved.add(c.key)
        sent = 0
        for origin, keys in by_origin.items():
            frame = self.protocol.encode("receipt", receipt_body(origin, keys[:MAX_GROUPS_PER_RECEIPT], moved))
            link = self._link_to(origin)
            try:
                if link is not None:
                    link.send(frame)
                elif self._board.connected:
                    await self._board.send_receipt(origin, frame)
                else:
                    continue
            except Exception:  # noqa: BLE001, S112 -- a receipt is a courtesy: never worth a round
                continue
            sent += 1
        self.sent += sent
        return sent

    def received(self, event: p.ReceiptReceived) -> int:
        return self.book.receive(event.sender, event.to, event.keys, event.gradient)

    def from_board(self, data: bytes) -> None:
        """A frame from this node's board inbox: checked like any frame (size, signature, replay, rate)."""
        if len(data) > MAX_RECEIPT_FRAME_BYTES:
            self.protocol.refuse("frame_too_large")
            return
        try:
            env = self.protocol.open(data)  # counts its own refusals
        except ProtocolError:
            return
        try:
            if env.type != "receipt":
                raise ProtocolError("unexpected", f"{env.type} frame in the receipts inbox")
            to, keys, gradient = receipt_from_wire(env.body)
        except ProtocolError as exc:
            self.protocol.refuse(exc.reason, env.sender)
            return
        self.book.receive(env.sender, to, keys, gradient)

    def stats(self) -> dict[str, Any]:
        return {**self.book.summary(), "sent": self.sent}

    # --- persistence (our own file; still read as untrusted) ------------------------------------------
    def load(self) -> None:
        path = self._state_path
        if path is None or not path.is_file() or path.stat().st_size > MAX_STATE_BYTES:
            return
        try:
            self.book.restore(json.loads(path.read_text()))
        except (OSError, ValueError):
            return  # a damaged file costs the totals shown, nothing else

    def save(self) -> None:
        path = self._state_path
        if path is None:
            return
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(self.book.state()))
            os.replace(tmp, path)
        except OSError:
            return
