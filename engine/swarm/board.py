"""The board: "store one, fetch J". Each node keeps its latest signed rollouts frame on the board under
its own key; each round it fetches J frames of others. Egress per node is one frame per round and
ingress J frames, whatever the swarm's size: the internet path never broadcasts.

    BoardReader   sans-I/O: which slots to fetch (uniform over the board today; the sampling policy
                  lives here), which fetched frames are new, and the checks every fetched frame passes
                  (size, signature, replay, schema, origin = signer) before its groups reach the pool
    Board         the I/O, one small async interface: put my frame; the board's extent; get the
                  first frame at or after a slot
    MemoryBoard   in-process (tests, the experiment)
    NatsBoard     NATS JetStream (engine/swarm/nats_board.py)

A slot is a position in the board's append order (JetStream's stream sequence). Every key holds one
frame (a newer put replaces the older), so slots of replaced frames are gaps, and "the first frame at
or after slot s" of a uniformly drawn s is a random node's latest frame in O(1) per fetch, with no
listing of all N keys (a listing is O(N) bytes per node per round, which is what must not grow).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from engine.sapo.records import RolloutGroup
from engine.swarm import protocol as p
from engine.swarm.errors import ProtocolError
from engine.swarm.wire import group_from_wire, need_list

SUBJECT_PREFIX = "sapo.rollouts"  # a node's key: SUBJECT_PREFIX + "." + its peer id


def key_subject(peer_id: str, prefix: str = SUBJECT_PREFIX) -> str:
    return f"{prefix}.{peer_id}"


def subject_peer(subject: str, prefix: str = SUBJECT_PREFIX) -> str | None:
    head, dot, tail = subject.rpartition(".")
    return tail if dot and head == prefix and tail else None


@dataclass(frozen=True)
class BoardFrame:
    subject: str  # the key it was stored under (the board enforces who may write which key)
    slot: int  # its position in the board's append order
    data: bytes  # the signed frame, as stored


class Board(Protocol):
    async def put(self, peer_id: str, frame: bytes) -> int:
        """Store `frame` as `peer_id`'s latest (replacing the previous) -> its slot."""
        ...

    async def extent(self) -> tuple[int, int]:
        """(first slot, last slot) now on the board; (0, 0) when empty."""
        ...

    async def get_from(self, slot: int) -> BoardFrame | None:
        """The first frame at or after `slot`, or None past the end."""
        ...

    async def send_receipt(self, origin: str, frame: bytes) -> None:
        """Deliver a receipt frame to `origin`'s inbox (fire and forget: a display, not a record)."""
        ...

    async def on_receipts(self, me: str, handler: Callable[[bytes], None]) -> None:
        """Call `handler` with each frame sent to this node's inbox."""
        ...

    async def close(self) -> None:
        ...


@dataclass(frozen=True)
class FetchResult:
    origin: str
    groups: tuple[RolloutGroup, ...]


class BoardReader:
    """The sans-I/O half of fetching: plans draws, remembers what was already taken, and opens frames
    with the node's protocol (the same checks as a frame from a direct link). Not thread-safe."""

    def __init__(self, protocol: p.SwarmProtocol, *, rng: random.Random | None = None,
                 remember: int = 4096, prefix: str = SUBJECT_PREFIX) -> None:
        self.protocol = protocol
        self.rng = rng or random.Random()
        self.prefix = prefix
        self._taken: OrderedDict[int, None] = OrderedDict()  # slots already fetched (bounded)
        self._remember = remember
        self.counters = {"fetched": 0, "repeats": 0, "own": 0, "refused": 0, "accepted": 0}

    def draws(self, first: int, last: int, j: int) -> list[int]:
        """Slots to try, in order: 4j distinct uniform ones in [first, last] (some land on gaps, our own
        frame or repeats), or all of them shuffled when the board is that small."""
        if j <= 0 or last < first or last <= 0:
            return []
        span = range(first, last + 1)
        if len(span) <= 4 * j:
            slots = list(span)
            self.rng.shuffle(slots)
            return slots
        return self.rng.sample(span, 4 * j)

    def take(self, frame: BoardFrame) -> FetchResult | None:
        """Check one fetched frame -> its groups, or None (a repeat, our own, or refused and counted)."""
        self.counters["fetched"] += 1
        if frame.slot in self._taken:
            self.counters["repeats"] += 1
            return None
        self._taken[frame.slot] = None
        if len(self._taken) > self._remember:
            self._taken.popitem(last=False)
        key_owner = subject_peer(frame.subject, self.prefix)
        if key_owner == self.protocol.identity.peer_id:
            self.counters["own"] += 1
            return None
        try:
            env = self.protocol.open(frame.data)  # size, UTF-8, schema, clock, signature, replay, rate
        except ProtocolError:  # counted by open()
            self.counters["refused"] += 1
            return None
        try:
            if env.type != "rollouts":
                raise ProtocolError("bad_schema", f"a {env.type} frame on the board")
            if env.sender != key_owner:  # the board's permissions already refuse this; check anyway
                raise ProtocolError("wrong_signer", "frame signed by another key than its slot's owner")
            items = need_list(env.body.get("groups"), "groups", self.protocol.limits.max_groups_per_frame)
            if not items:
                raise ProtocolError("bad_schema", "rollouts frame without groups")
            groups = tuple(group_from_wire(item, self.protocol.limits, signer=env.sender) for item in items)
        except ProtocolError as exc:
            self.protocol.refuse(exc.reason, env.sender)
            self.counters["refused"] += 1
            return None
        self.counters["accepted"] += 1
        return FetchResult(env.sender, groups)


async def fetch(board: Board, reader: BoardReader, j: int) -> list[FetchResult]:
    """Fetch up to j fresh frames of other nodes, one direct read per draw (at most 4j reads)."""
    first, last = await board.extent()
    results: list[FetchResult] = []
    seen_origins: set[str] = set()
    for slot in reader.draws(first, last, j):
        if len(results) >= j:
            break
        frame = await board.get_from(slot)
        if frame is None:
            continue
        got = reader.take(frame)
        if got is not None and got.origin not in seen_origins:
            seen_origins.add(got.origin)
            results.append(got)
    return results


class MemoryBoard:
    """A board in one process: the same semantics as the JetStream one (one frame per key, newest wins,
    slots in append order, frames older than max_age_s gone)."""

    def __init__(self, max_age_s: float = 600.0, max_frame_bytes: int = 1 << 20, clock=None) -> None:  # type: ignore[no-untyped-def]
        import time

        self.max_age_s, self.max_frame_bytes = max_age_s, max_frame_bytes
        self.clock = clock or time.monotonic
        self._next = 1
        self._by_slot: OrderedDict[int, tuple[str, bytes, float]] = OrderedDict()
        self._slot_of: dict[str, int] = {}
        self.size = 0  # frames (= nodes) at the last extent()
        self._inboxes: dict[str, list[Callable[[bytes], None]]] = {}  # receipts: peer id -> its handlers

    def _expire(self) -> None:
        now = self.clock()
        while self._by_slot:
            slot, (subject, _, at) = next(iter(self._by_slot.items()))
            if now - at <= self.max_age_s:
                break
            del self._by_slot[slot]
            self._slot_of.pop(subject, None)

    async def put(self, peer_id: str, frame: bytes) -> int:
        if len(frame) > self.max_frame_bytes:
            raise ValueError(f"frame of {len(frame)} bytes > {self.max_frame_bytes}")
        subject = key_subject(peer_id)
        old = self._slot_of.pop(subject, None)
        if old is not None:
            del self._by_slot[old]
        slot, self._next = self._next, self._next + 1
        self._by_slot[slot] = (subject, bytes(frame), self.clock())
        self._slot_of[subject] = slot
        return slot

    async def extent(self) -> tuple[int, int]:
        self._expire()
        self.size = len(self._by_slot)
        if not self._by_slot:
            return (0, 0)
        return (next(iter(self._by_slot)), next(reversed(self._by_slot)))

    async def get_from(self, slot: int) -> BoardFrame | None:
        self._expire()
        for s, (subject, data, _) in self._by_slot.items():  # slots are increasing: a scan is fine here
            if s >= slot:
                return BoardFrame(subject, s, data)
        return None

    async def send_receipt(self, origin: str, frame: bytes) -> None:
        if len(frame) <= self.max_frame_bytes:
            for handler in self._inboxes.get(origin, ()):
                handler(bytes(frame))

    async def on_receipts(self, me: str, handler: Callable[[bytes], None]) -> None:
        self._inboxes.setdefault(me, []).append(handler)

    async def close(self) -> None:
        return None
