"""Peers view model: one row per peer id, from PeerUpdated events and the store's peer history."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from app.models.feed import reason_words
from app.models.history import whole_count
from engine.control.status import NodeStatus
from engine.events import PeerUpdated, RolloutSeen
from engine.swarm.peers import FORGET_AFTER_S

MAX_REASONS = 32  # reasons kept per counter dict; the rest (from a confused engine) is dropped
MAX_REASON_LEN = 64


MAX_REPUTATION_ROWS = 64


def _reputation(value: Any) -> dict[str, tuple[float, int]]:
    """[{peer, score, groups}] -> {peer: (score in [0, 1], groups)}; malformed rows are dropped."""
    out: dict[str, tuple[float, int]] = {}
    for row in value[:MAX_REPUTATION_ROWS] if isinstance(value, list) else []:
        if not isinstance(row, dict):
            continue
        peer, score, groups = row.get("peer"), row.get("score"), whole_count(row.get("groups"))
        if isinstance(peer, str) and 0 < len(peer) <= 128 and isinstance(score, (int, float)) \
                and not isinstance(score, bool) and 0.0 <= score <= 1.0 and groups is not None:
            out[peer] = (float(score), groups)
    return out


def _reasons(value: Any) -> dict[str, int]:
    """{reason: count} with str keys and non-negative int values only; anything else is dropped."""
    if not isinstance(value, dict):
        return {}
    out: dict[str, int] = {}
    for key, count in value.items():
        n = whole_count(count)
        if isinstance(key, str) and key and len(key) <= MAX_REASON_LEN and n is not None:
            out[key] = n
            if len(out) >= MAX_REASONS:
                break
    return out


@dataclass(frozen=True)
class BoardStatus:
    """The node's place on the board (store one, fetch J), from the status reply's swarm.board."""

    connected: bool
    url: str  # the first server ("" when unknown)
    nodes: int  # nodes with a frame on the board (this one included)
    credential_expires_at: float | None  # until when this node may write its key; None: an open board
    frames_used: int  # peers' frames fetched into the pool
    put_error: str = ""  # why this node's latest frame could not be stored ("" when it was)


def parse_board(value: Any) -> BoardStatus | None:
    if not isinstance(value, dict) or not value.get("urls"):
        return None
    urls = value.get("urls")
    url = urls[0] if isinstance(urls, list) and urls and isinstance(urls[0], str) else ""
    expires = value.get("credential_expires_at")
    ok_expiry = isinstance(expires, (int, float)) and not isinstance(expires, bool) and 0 < expires < 1e11
    return BoardStatus(connected=value.get("connected") is True, url=url[:200], nodes=whole_count(value.get("nodes_on_board")) or 0,
                       credential_expires_at=float(expires) if ok_expiry else None,
                       frames_used=whole_count(value.get("frames_used")) or 0,
                       put_error=put_error[:300] if isinstance(put_error := value.get("put_error"), str) else "")


def board_text(board: BoardStatus | None, now: float) -> str:
    """One line for the Peers tab about the internet data plane."""
    if board is None:
        return "Board: none (LAN links and relays only)"
    if not board.connected:
        return f"Board: connecting to {board.url}…"
    cred = ""
    if board.credential_expires_at is not None:
        when = time.strftime("%H:%M", time.localtime(board.credential_expires_at))
        cred = (f" · may write until {when} (renewed by the bootstrap)" if board.credential_expires_at > now
                else f" · credential expired at {when}: waiting for the bootstrap to renew it")
    failing = (f" · your rollouts are not reaching the board: {board.put_error}" if board.put_error else "")
    return (f"Board: {board.url} · {board.nodes:,} node{'s' if board.nodes != 1 else ''} on it · "
            f"{board.frames_used:,} peers' frames fetched{cred}{failing}")


MAX_CREDIT_HOURS = 24 * 366


@dataclass(frozen=True)
class Credit:
    """What this node's work earned, from peers' receipts (status swarm.receipts): a display only."""

    shared: int  # own groups published
    used: int  # of those, groups some peer trained on
    uses: int  # (peer, group) pairs: trainings on our groups
    peers: int  # distinct peers that trained on them
    hourly: tuple[tuple[float, int], ...]  # (hour start, uses), oldest first
    gradient_uses: int = 0  # of the uses, those in which our group gave the peer's update a gradient


def parse_credit(value: Any) -> Credit | None:
    if not isinstance(value, dict):
        return None
    counts = [whole_count(value.get(k)) for k in ("shared", "used", "uses", "peers")]
    if any(c is None for c in counts):
        return None
    hourly = []
    for item in value.get("hourly", [])[-MAX_CREDIT_HOURS:] if isinstance(value.get("hourly"), list) else []:
        if isinstance(item, list) and len(item) == 2 and whole_count(item[1]) is not None \
                and isinstance(item[0], (int, float)) and not isinstance(item[0], bool) and 0 <= item[0] < 1e11:
            hourly.append((float(item[0]), int(item[1])))
    shared, used, uses, peers = (int(c or 0) for c in counts)
    gradient = whole_count(value.get("gradient_uses")) or 0  # absent from engines before it
    return Credit(shared, used, uses, peers, tuple(hourly), min(int(gradient), uses))


def credit_text(credit: Credit | None) -> str:
    """One line for the Peers tab: what peers did with this node's rollouts."""
    if credit is None:
        return ""
    if not credit.shared:
        return "Your work: nothing shared yet."
    if not credit.uses:
        return f"Your work: {credit.shared:,} groups shared; no peer has said it trained on one yet."
    return (f"Your work: {credit.shared:,} groups shared; peers trained on {credit.used:,} of them "
            f"({credit.uses:,} times, by {credit.peers:,} peer{'s' if credit.peers != 1 else ''}); "
            f"{credit.gradient_uses:,} of those updates learned from your group (in the others the "
            "peer's answers to it were all right or all wrong).")


@dataclass
class SwarmRefusals:
    """What the swarm layer refused or dropped, from the status reply's "swarm" key."""

    frames_accepted: int = 0
    frames_refused: dict[str, int] = field(default_factory=dict)
    groups_received: int = 0
    groups_pooled: int = 0
    groups_used: int = 0
    groups_dropped: dict[str, int] = field(default_factory=dict)
    links: int = 0
    known_peers: int = 0
    board: BoardStatus | None = None  # the internet data plane; None when this node has none
    reputation: dict[str, tuple[float, int]] = field(default_factory=dict)  # peer -> (score, groups seen)
    credit: Credit | None = None  # peers' receipts for this node's groups (display only)

    @property
    def nothing_refused(self) -> bool:
        return not any(self.frames_refused.values()) and not any(self.groups_dropped.values())


def parse_swarm(value: Any) -> SwarmRefusals | None:
    """The status "swarm" value -> SwarmRefusals, or None when solo ({}, missing or not a dict).
    Values come from another process: bad fields are dropped (left at zero), never raised on."""
    if not isinstance(value, dict) or not value:
        return None
    ints = {key: n for key in ("frames_accepted", "groups_received", "groups_pooled", "groups_used",
                               "links", "known_peers") if (n := whole_count(value.get(key))) is not None}
    return SwarmRefusals(frames_refused=_reasons(value.get("frames_refused")),
                         groups_dropped=_reasons(value.get("groups_dropped")), board=parse_board(value.get("board")),
                         reputation=_reputation(value.get("reputation")), credit=parse_credit(value.get("receipts")),
                         **ints)


def swarm_where(swarm: SwarmRefusals | None, state: str) -> str:
    """Which swarm this node is in, for the header: alone, a LAN swarm, or a bootstrap's board."""
    if state == "stopped":
        return ""
    if swarm is None:
        return "training alone"
    board = swarm.board
    if board is not None and board.connected:
        host = urlsplit(board.url).hostname or board.url
        return f"swarm of {host} · {board.nodes:,} node{'s' if board.nodes != 1 else ''} on its board"
    return f"LAN swarm · {swarm.links} link{'s' if swarm.links != 1 else ''}"


# Why the swarm layer refused a peer's message (engine.swarm.errors.REASONS), in plain words.
FRAME_REASON_WORDS = {
    "frame_too_large": "too large",
    "bad_utf8": "not readable text",
    "bad_json": "not readable",
    "non_finite": "impossible numbers",
    "bad_schema": "malformed",
    "bad_version": "from an incompatible version",
    "unknown_type": "of an unknown kind",
    "over_limit": "over a size or count limit",
    "stale": "clock too far off",
    "bad_signature": "bad signature",
    "duplicate": "a copy of a message already taken",
    "replay_old": "too old to tell from a replay",
    "too_many_senders": "too many senders at once",
    "rate_limited": "sent too fast",
    "unexpected": "out of order",
    "wrong_signer": "signed by the wrong key",
}


def refusals_text(swarm: SwarmRefusals | None) -> str:
    """One line for the Peers tab (counts since the engine started): "solo" when there is no swarm,
    "nothing refused" when all zero; reasons in words, unknown ones as they came."""
    if swarm is None:
        return "solo: no swarm traffic"

    def listing(counts: dict[str, int], words: Callable[[str], str]) -> str:
        shown = [f"{words(reason)} {n:,}" for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if n]
        return " · ".join(shown) or "none"

    totals = (f"(since the engine started: received {swarm.groups_received:,}, pooled {swarm.groups_pooled:,}, "
              f"used {swarm.groups_used:,})")
    if swarm.nothing_refused:
        return f"nothing refused {totals}"
    return (f"messages refused: {listing(swarm.frames_refused, lambda r: FRAME_REASON_WORDS.get(r, r))} — "
            f"groups dropped: {listing(swarm.groups_dropped, reason_words)} {totals}")


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
    """Every peer heard of (from events and the store's history, which keeps peers for ever); listed are
    the connected ones and those seen within `forget_after_s`, the engine's own horizon for forgetting
    an unreachable peer. The rest are "gone": counted, not listed."""

    def __init__(self, capacity: int = 512, forget_after_s: float = FORGET_AFTER_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.capacity = capacity  # peers remembered; the longest-unseen disconnected ones go first
        self.forget_after_s = forget_after_s
        self._clock = clock
        self.rows: dict[str, PeerRow] = {}
        self.swarm: SwarmRefusals | None = None  # None when solo or not yet known
        self.version = 0

    def apply_status(self, status: NodeStatus) -> None:
        """The swarm counters from a `status` reply (cumulative, so the newest reply wins)."""
        swarm = parse_swarm(status.swarm)
        if swarm != self.swarm:
            self.swarm = swarm
            self.version += 1

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

    def count(self, event: RolloutSeen) -> None:
        """A live verdict on a peer's group, counted as the store counts it (received once, on arrival;
        used per use), so this table's totals stay the store's, for all time, between history loads."""
        row = self.rows.get(event.origin_peer)
        if row is None or not (event.arrival or event.status == "used"):
            return
        if event.status == "used":
            row.used += 1
        else:
            row.received += 1
        self.version += 1

    def totals(self) -> tuple[int, int]:
        """Groups received from and used of every peer remembered here (all time)."""
        return sum(r.received for r in self.rows.values()), sum(r.used for r in self.rows.values())

    def touch(self, peer_id: str, ts: float) -> None:
        """Something arrived from this peer (e.g. a rollout): it was alive at `ts`."""
        row = self.rows.get(peer_id)
        if row is not None and ts > row.last_seen:
            row.last_seen = ts
            self.version += 1

    def engine_connected(self, peers_now: Any, ts: float | None = None) -> None:
        """An engine (re)connected and reports `peers_now` peers reachable. With none, no row is connected
        any more: links the app saw open belonged to an engine that died or left, and nothing else would
        ever say they closed (they stayed "connected", and listed, for ever)."""
        if whole_count(peers_now) != 0:
            return  # some are: the rows that are stay as they were; new links come as events
        ts = self._clock() if ts is None else ts
        for row in self.rows.values():
            if row.connected:
                row.connected, row.last_seen = False, max(row.last_seen, ts)
                self.version += 1

    @property
    def connected(self) -> int:
        return sum(r.connected for r in self.rows.values())

    def recent(self, row: PeerRow, now: float) -> bool:
        return row.connected or row.last_seen >= now - self.forget_after_s

    def sorted_rows(self, now: float | None = None) -> list[PeerRow]:
        """The peers to list (connected, or seen within `forget_after_s`): connected first, then most
        recently seen."""
        now = self._clock() if now is None else now
        return sorted((r for r in self.rows.values() if self.recent(r, now)),
                      key=lambda r: (not r.connected, -r.last_seen))

    def gone(self, now: float | None = None) -> int:
        """Peers not seen for `forget_after_s` or more (not listed)."""
        now = self._clock() if now is None else now
        return sum(not self.recent(r, now) for r in self.rows.values())
