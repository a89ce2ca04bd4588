"""The board: "store one, fetch J". Each node keeps its latest signed rollouts frame on the board under
its own key; each round it fetches J frames of others. Egress per node is one frame per round and
ingress J frames, whatever the swarm's size: the internet path never broadcasts.

    BoardReader   sans-I/O: which slots to fetch (uniform over the board today; the sampling policy
                  lives here), which fetched frames are new (a restarted board numbers its slots
                  afresh: the reader notices and forgets), and the checks every fetched frame passes
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

import asyncio
import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from engine.sapo.records import RolloutGroup
from engine.swarm import protocol as p
from engine.swarm.errors import ProtocolError
from engine.swarm.wire import rollouts_from_wire

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


class Draws:
    """Slots to read this round, each uniform over the slots not yet known to be empty or read.

    "The first frame at or after a uniform slot" weighs each frame by the gap before it, and a node
    that puts very often (a flood) always sits behind the largest gap: with fixed draws it would win
    nearly every read. A read from slot s that returns the frame at slot t shows s..t is known, so the
    next draw skips it; a big gap is cut down in a few reads and the frames behind small gaps are
    reached. Sans-I/O: `fetch` reads and reports back with `known`."""

    def __init__(self, first: int, last: int, reads: int, rng: random.Random) -> None:
        self.first, self.last, self.left, self.rng = first, last, reads, rng
        self._known: list[tuple[int, int]] = []  # disjoint, sorted [lo, hi] ranges

    def next(self) -> int | None:
        """The next slot to read, or None when the reads are spent or every slot is known."""
        if self.left <= 0 or self.last < self.first or self.last <= 0:
            return None
        unknown = (self.last - self.first + 1) - sum(hi - lo + 1 for lo, hi in self._known)
        if unknown <= 0:
            return None
        self.left -= 1
        k = self.rng.randrange(unknown)
        slot = self.first + k
        for lo, hi in self._known:  # walk past the known ranges below the k-th unknown slot
            if lo > slot:
                break
            slot += hi - lo + 1
        return slot

    def wave(self, n: int) -> list[int]:
        """Up to `n` distinct slots to read at once (each marked known as it is drawn, so a wave never
        reads one slot twice; two draws in one gap may still return the same frame, a repeat)."""
        slots: list[int] = []
        while len(slots) < n and (slot := self.next()) is not None:
            slots.append(slot)
            self.known(slot, slot)
        return slots

    def known(self, start: int, end: int) -> None:
        """Slots start..end (inclusive) need no more reads: empty, or holding a frame already read."""
        lo, hi = max(start, self.first), min(end, self.last)
        if hi < lo:
            return
        merged: list[tuple[int, int]] = []
        for a, b in self._known:
            if b < lo - 1 or a > hi + 1:
                merged.append((a, b))
            else:
                lo, hi = min(lo, a), max(hi, b)
        merged.append((lo, hi))
        self._known = sorted(merged)


class BoardReader:
    """The sans-I/O half of fetching: plans draws, remembers what was already taken, and opens frames
    with the node's protocol (the same checks as a frame from a direct link). Not thread-safe."""

    def __init__(self, protocol: p.SwarmProtocol, *, rng: random.Random | None = None,
                 remember: int = 4096, prefix: str = SUBJECT_PREFIX) -> None:
        self.protocol = protocol
        self.rng = rng or random.Random()
        self.prefix = prefix
        # slots already fetched (bounded) -> a digest of the frame taken there
        self._taken: OrderedDict[int, int] = OrderedDict()
        self._remember = remember
        self._high = 0  # the highest slot seen on this board (its extent's end, or a frame taken)
        self.counters = {"fetched": 0, "repeats": 0, "own": 0, "refused": 0, "accepted": 0,
                         "board_restarts": 0}

    def observe(self, first: int, last: int) -> None:
        """The board's extent, once per round: a restarted or recreated board (a memory stream) numbers
        its slots from 1 again, so slots remembered from the old one would drop new frames as repeats.
        An empty board says nothing (its extent is (0, 0) whether new or merely idle)."""
        if last <= 0 or last < first:
            return
        if last < self._high:
            self._forget()
        self._high = max(self._high, last)

    def _forget(self) -> None:
        self._taken.clear()
        self._high = 0
        self.counters["board_restarts"] += 1

    def draws(self, first: int, last: int, j: int) -> Draws:
        """This round's draws over [first, last]: at most 4j reads (some land on gaps, our own frame or
        repeats); see `Draws` for why each read narrows the next."""
        return Draws(first, last, 4 * j if j > 0 else 0, self.rng)

    def take(self, frame: BoardFrame) -> FetchResult | None:
        """Check one fetched frame -> its groups, or None (a repeat, our own, or refused and counted)."""
        self.counters["fetched"] += 1
        digest = hash(frame.data)
        taken = self._taken.get(frame.slot)
        if taken == digest:
            self.counters["repeats"] += 1
            return None
        if taken is not None:
            # A slot holds one frame for its board's life: another one there means a new board (one
            # that already grew past our highest slot before we looked, so observe() could not tell).
            self._forget()
        self._taken[frame.slot] = digest
        self._high = max(self._high, frame.slot)
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
            groups = rollouts_from_wire(env.body, self.protocol.limits, env.sender)
        except ProtocolError as exc:
            self.protocol.refuse(exc.reason, env.sender)
            self.counters["refused"] += 1
            return None
        self.counters["accepted"] += 1
        return FetchResult(env.sender, groups)


async def fetch(board: Board, reader: BoardReader, j: int) -> list[FetchResult]:
    """Fetch up to j fresh frames of other nodes (at most 4j reads). Reads go out in waves: as many at
    once as frames are still wanted, so an exchange costs a few round trips instead of one per read
    (7 at 100 ms each were measured one at a time); each wave's results narrow the next wave's draws."""
    first, last = await board.extent()
    reader.observe(first, last)
    results: list[FetchResult] = []
    seen_origins: set[str] = set()
    draws = reader.draws(first, last, j)
    while len(results) < j:
        wave = draws.wave(j - len(results))
        if not wave:
            break
        frames = await asyncio.gather(*(board.get_from(slot) for slot in wave))
        for slot, frame in zip(wave, frames):  # in draw order: the same frames win whatever the timing
            draws.known(slot, frame.slot if frame is not None else last)
            if frame is None:
                continue
            got = reader.take(frame)
            if got is not None and got.origin not in seen_origins and len(results) < j:
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
