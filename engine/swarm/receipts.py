"""Receipts: "I trained on your group", so a contributor sees what the work of their machine earned.

A node that trains on peers' groups sends each origin, once per round, one signed `receipt` frame
naming the groups it used (their content keys) and which of them gave its update a gradient (rewards
not all equal under its verifier: a group it trained on that taught nothing is said so), over a direct link or through the board (NATS
subject `sapo.receipts.<origin>`, which only that origin may read). Sending is optional
(`ReceiptConfig.send`), and so is believing: the origin counts a receipt only for groups it really
published (it remembers its own recent content keys), once per (peer, group), within a per-peer
rate, and only from a sender this node has itself verified a group of (so a fresh identity cannot
mint credit). Receipts are a display. Nothing else reads them: not the sampler, not reputation, not the
pool. A lying peer can at most inflate a number on someone's screen, by groups that did exist.

`ReceiptBook` is sans-I/O and locked (the asyncio loop writes it; the control API reads it).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.swarm.errors import ProtocolError
from engine.swarm.limits import KeyedBuckets

RECEIPT_PREFIX = "sapo.receipts"  # an origin's inbox: RECEIPT_PREFIX + "." + its peer id
MAX_GROUPS_PER_RECEIPT = 16  # one round's J groups from one origin, with room to spare
# A receipt frame at most: 16 hex keys of 64 characters and the signed envelope are ~1.5 KB. Anything
# larger in an inbox is a flood, dropped before it is parsed.
MAX_RECEIPT_FRAME_BYTES = 4096
_KEY = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ReceiptConfig:
    """Receipts: what this node says about peers' groups it trained on, and what it believes of theirs."""

    send: bool = True  # tell an origin when this node trained on its group
    remember_published: int = 4096  # own groups' content keys kept to check receipts against
    rate_per_s: float = 0.2  # receipt frames per second one peer may have counted here (refill)
    burst: float = 8.0  # and in one burst
    hours: int = 168  # hourly history kept (a week)

    def __post_init__(self) -> None:
        if not isinstance(self.send, bool):
            raise ValueError("ReceiptConfig.send must be a bool")  # noqa: TRY004 -- config errors are ValueErrors
        for name, low, high in (("remember_published", 16, 1 << 20), ("hours", 1, 24 * 366)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"ReceiptConfig.{name} must be an int in [{low}, {high}]")
        for name in ("rate_per_s", "burst"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1000:
                raise ValueError(f"ReceiptConfig.{name} must be a number in (0, 1000]")


def receipt_subject(peer_id: str) -> str:
    return f"{RECEIPT_PREFIX}.{peer_id}"


def receipt_body(origin: str, keys: Sequence[str], gradient: Iterable[str] = ()) -> dict[str, Any]:
    """The body of one receipt frame: to whom, which of its groups (content keys), and which of those
    gave the update a gradient (their rewards here were not all equal; the others taught nothing)."""
    groups = list(keys[:MAX_GROUPS_PER_RECEIPT])
    moved = set(gradient)
    return {"to": origin, "groups": groups, "gradient": [k for k in groups if k in moved]}


def receipt_from_wire(body: dict[str, Any]) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(to, content keys, those that gave a gradient) of a receipt body; ProtocolError("bad_schema") when
    it is not one. `gradient` is optional (receipts from before it say nothing of it)."""
    to, groups = body.get("to"), body.get("groups")
    if not isinstance(to, str) or not 0 < len(to) <= 64:
        raise ProtocolError("bad_schema", "receipt.to must be a peer id")
    if not isinstance(groups, list) or not 0 < len(groups) <= MAX_GROUPS_PER_RECEIPT:
        raise ProtocolError("bad_schema", f"receipt.groups must be a list of 1..{MAX_GROUPS_PER_RECEIPT} keys")
    if not all(isinstance(k, str) and _KEY.fullmatch(k) for k in groups):
        raise ProtocolError("bad_schema", "receipt.groups must be content keys (64 hex digits)")
    gradient = body.get("gradient", [])
    if not isinstance(gradient, list) or len(gradient) > len(groups) or not all(
            isinstance(k, str) and k in groups for k in gradient):
        raise ProtocolError("bad_schema", "receipt.gradient must list some of receipt.groups")
    return to, tuple(dict.fromkeys(groups)), tuple(dict.fromkeys(gradient))


class ReceiptBook:
    """This node's own published groups and the receipts peers sent for them. See the module docstring."""

    def __init__(self, config: ReceiptConfig, me: str, clock: Any = time.time,
                 vouched: Callable[[str], bool] | None = None) -> None:
        self.config, self.me, self._clock = config, me, clock
        # A receipt counts only from a sender this node itself verified a group of (the pool's word): a
        # fresh key costs nothing, a group that passes this node's own checks does.
        self._vouched = vouched
        self._lock = threading.Lock()
        # Own content keys, newest last -> the peers whose receipt for it counted (each once). A key
        # that leaves can no longer be counted, so its senders leave with it: memory is bounded by
        # `remember_published` keys, however long the node runs.
        self._published: OrderedDict[str, set[str]] = OrderedDict()
        self._used = 0  # own groups some peer trained on (this run)
        self._gradient_uses = 0  # (peer, group) trainings in which our group gave a gradient (this run)
        self._peers: OrderedDict[str, int] = OrderedDict()  # peer -> uses counted (bounded)
        self._hourly: OrderedDict[int, int] = OrderedDict()  # hour (unix s // 3600) -> uses
        self._buckets = KeyedBuckets(config.rate_per_s, config.burst, 4096)
        self.shared = 0  # own groups published
        self._used_before = 0  # own groups peers trained on, as of the last run (restored totals)
        self._gradient_before = 0  # gradient uses, as of the last run
        self.ignored: Counter[str] = Counter()  # receipts not counted, by reason

    def published(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                if key in self._published:
                    self._published.move_to_end(key)
                else:
                    self.shared += 1
                    self._published[key] = set()
            while len(self._published) > self.config.remember_published:
                self._published.popitem(last=False)

    def receive(self, sender: str, to: str, keys: Sequence[str], gradient: Iterable[str] = ()) -> int:
        """A receipt from `sender` (its signature already checked) -> the uses it adds; `gradient`: the
        keys whose training gave the sender's update a gradient."""
        moved = set(gradient)
        now = self._clock()
        known = self._vouched is None or self._vouched(sender)  # before our lock: the pool takes its own
        with self._lock:
            if to != self.me:
                self.ignored["not_for_us"] += 1
                return 0
            if not known:
                self.ignored["unverified_sender"] += 1
                return 0
            if not self._buckets.take(sender, now):
                self.ignored["rate_limited"] += 1
                return 0
            added = 0
            for key in keys:
                senders = self._published.get(key)
                if senders is None:
                    self.ignored["unknown_group"] += 1
                    continue
                if sender in senders:
                    self.ignored["repeated"] += 1
                    continue
                self._used += not senders
                senders.add(sys.intern(sender))  # one copy of each peer id, not one per receipt
                added += 1
                self._gradient_uses += key in moved
            if added:
                self._peers[sender] = self._peers.pop(sender, 0) + added
                self._trim(self._peers, 4096)
                hour = int(now // 3600)
                self._hourly[hour] = self._hourly.get(hour, 0) + added
                while self._hourly and next(iter(self._hourly)) <= hour - self.config.hours:
                    self._hourly.popitem(last=False)
            return added

    @staticmethod
    def _trim(table: OrderedDict[Any, Any], size: int) -> None:
        while len(table) > size:
            table.popitem(last=False)

    def summary(self) -> dict[str, Any]:
        """What the app shows: groups shared, how many of them peers trained on, how often, by how many
        distinct peers, and uses per hour (oldest first)."""
        with self._lock:
            return {"shared": self.shared, "used": self._used_before + self._used,
                    "uses": sum(self._peers.values()),
                    "gradient_uses": self._gradient_before + self._gradient_uses,
                    "peers": len(self._peers), "hourly": [[hour * 3600, n] for hour, n in self._hourly.items()],
                    "ignored": dict(self.ignored)}

    def state(self) -> dict[str, Any]:
        """Totals and the hourly history, to be kept across restarts (own keys are not: new groups)."""
        with self._lock:
            return {"shared": self.shared, "peers": dict(self._peers), "used": self._used_before + self._used,
                    "gradient_uses": self._gradient_before + self._gradient_uses,
                    "hourly": {str(h): n for h, n in self._hourly.items()}}

    def restore(self, state: Any) -> None:
        """Totals from `state()`; anything malformed is skipped (it is our own file, but files rot)."""
        if not isinstance(state, dict):
            return

        def count(value: Any) -> int | None:
            return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53 else None

        with self._lock:
            self.shared = count(state.get("shared")) or 0
            peers = state.get("peers")
            for peer, n in list(peers.items() if isinstance(peers, dict) else ())[-4096:]:
                if isinstance(peer, str) and len(peer) <= 64 and count(n):
                    self._peers[peer] = n
            self._used_before = count(state.get("used")) or 0
            self._gradient_before = count(state.get("gradient_uses")) or 0
            hourly = state.get("hourly")
            pairs = hourly.items() if isinstance(hourly, dict) else ()
            for hour, n in sorted((int(h), n) for h, n in pairs if isinstance(h, str) and h.isdigit() and count(n)):
                self._hourly[hour] = n
            self._trim(self._hourly, self.config.hours)
