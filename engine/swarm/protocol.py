"""The swarm protocol, sans-I/O: bytes in -> events out, intents in -> bytes out. No sockets here.

Frame (one JSON object per websocket text frame):
    {"v": 1, "type": "hello"|"peers"|"rollouts"|"bye"|"creds"|"receipt", "from": <peer id>, "seq": int, "ts": float,
     "body": {...}, "sig": <base64url ed25519 signature of canonical(frame without "sig")>}

`SwarmProtocol` is one per node (or bootstrap): it signs outgoing frames and checks incoming ones
against state shared by all links (replay windows, per-signer rate limits, refusal counters), so a
frame reaching a node both directly and through a relay is accepted once. `PeerConnection` is one per
link: a small state machine (handshake -> open -> closed) whose `receive(bytes)` returns events.
Relays forward `Envelope.raw` verbatim, so signatures hold end to end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.sapo.records import RolloutGroup
from engine.swarm.config import ProtocolLimits
from engine.swarm.errors import ProtocolError
from engine.swarm.identity import SIG_LEN, Identity, b64url, b64url_decode, verify
from engine.swarm.limits import KeyedBuckets, RefusalCounter, ReplayGuard, TokenBucket
from engine.swarm.receipts import receipt_from_wire
from engine.swarm.wire import (
    Hello,
    PeerEntry,
    bye_reason,
    canonical,
    credential_from_wire,
    group_from_wire,
    group_to_wire,
    need_dict,
    need_int,
    need_number,
    need_peer_id,
    parse_json,
    peers_from_wire,
    rollouts_from_wire,
)

__all__ = [
    "FRAME_TYPES",
    "PROTOCOL_VERSION",
    "Envelope",
    "Hello",
    "PeerConnection",
    "PeerEntry",
    "SwarmProtocol",
    "group_from_wire",
    "group_to_wire",
]

PROTOCOL_VERSION = 1
# creds: a bootstrap's board credential; receipt: "I trained on these groups of yours" (display only)
FRAME_TYPES = ("hello", "peers", "rollouts", "bye", "creds", "receipt")
MAX_SEQ = 2**63 - 1
BYE_DUPLICATE_IDENTITY = "duplicate_identity"  # bye reason a bootstrap/peer sends to a copied identity
BYE_LEAVING = "leaving"  # bye reason of a node that stops (the app's Leave, a shutdown)


@dataclass(frozen=True)
class Envelope:
    """A verified frame. `raw` is the exact bytes received: relays forward it unchanged."""

    type: str
    sender: str  # "from": the signer's peer id
    seq: int
    ts: float
    body: dict[str, Any] = field(repr=False)
    raw: bytes = field(repr=False)


class SwarmProtocol:
    """Signs outgoing frames; verifies, de-duplicates and rate-limits incoming ones.

    One instance serves every link of a node, so replay windows and per-signer buckets are global.
    Not thread-safe: use it from one asyncio loop (or one thread).
    """

    def __init__(self, identity: Identity, limits: ProtocolLimits, clock: Callable[[], float] = time.time) -> None:
        self.identity = identity
        self.limits = limits
        self.clock = clock
        # Time-based start: a restarted node's seqs stay above those peers remember from its last run.
        self._seq = time.time_ns() // 1000
        self.replay = ReplayGuard(limits.replay_window, limits.max_tracked_senders, 2 * limits.max_clock_skew_s)
        self.signer_buckets = KeyedBuckets(limits.peer_rate_per_s, limits.peer_burst, limits.max_tracked_senders)
        self.refusals = RefusalCounter()
        self.accepted = 0

    # --- outgoing -------------------------------------------------------------------------------
    def encode(self, frame_type: str, body: dict[str, Any]) -> bytes:
        """Sign and serialise one frame (UTF-8 JSON bytes, to send as a text frame)."""
        if frame_type not in FRAME_TYPES:
            raise ValueError(f"unknown frame type {frame_type!r}")
        self._seq = min(self._seq + 1, MAX_SEQ)
        frame: dict[str, Any] = {"v": PROTOCOL_VERSION, "type": frame_type, "from": self.identity.peer_id,
                                 "seq": self._seq, "ts": self.clock(), "body": body}
        frame["sig"] = b64url(self.identity.sign(canonical(frame)))
        # Our own seqs count as seen: a relay echoing our frame back to us is then a plain duplicate.
        self.replay.check_and_mark(self.identity.peer_id, self._seq, self.clock())
        return canonical(frame)

    def encode_rollouts(self, groups: Sequence[RolloutGroup], max_bytes: int | None = None) -> list[bytes]:
        """Pack groups into as few frames as the limits allow (count and bytes per frame; `max_bytes`
        when smaller, e.g. the board's frame size).

        A group too large for a frame on its own is sent without its optional log-probs; one still
        too large (impossible within the completion limits at default settings) raises ValueError.
        """
        frame_bytes = min(self.limits.max_frame_bytes, max_bytes or self.limits.max_frame_bytes)
        budget = frame_bytes - 512  # room for the envelope around the groups
        frames: list[bytes] = []
        batch: list[dict[str, Any]] = []
        size = 0
        for group in groups:
            wire = group_to_wire(group)
            wire_size = len(canonical(wire)) + 1
            if wire_size > budget and "logprob_summary" in wire:
                del wire["logprob_summary"]
                wire_size = len(canonical(wire)) + 1
            if wire_size > budget:
                raise ValueError("a rollout group exceeds the frame size limit even without log-probs")
            if batch and (size + wire_size > budget or len(batch) >= self.limits.max_groups_per_frame):
                frames.append(self.encode("rollouts", {"groups": batch}))
                batch, size = [], 0
            batch.append(wire)
            size += wire_size
        if batch:
            frames.append(self.encode("rollouts", {"groups": batch}))
        return frames

    # --- incoming -------------------------------------------------------------------------------
    def open(self, data: bytes | str) -> Envelope:
        """Check one frame: size, UTF-8, JSON, schema, clock, signature, replay, signer rate.

        Raises ProtocolError(reason) and counts the refusal. Body schemas are checked by the caller
        (`PeerConnection`), which also counts those refusals through `refuse`.
        """
        try:
            env = self._open(data)
        except ProtocolError as exc:
            self.refusals.add(exc.reason)
            raise
        self.accepted += 1
        return env

    def refuse(self, reason: str, sender: str = "") -> None:
        self.refusals.add(reason, sender)

    def _open(self, data: bytes | str) -> Envelope:
        limits = self.limits
        if isinstance(data, str):
            if len(data) > limits.max_frame_bytes:
                raise ProtocolError("frame_too_large", f"{len(data)} characters")
            try:
                raw = data.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ProtocolError("bad_utf8", "lone surrogate") from exc
        else:
            raw = bytes(data)
        if len(raw) > limits.max_frame_bytes:
            raise ProtocolError("frame_too_large", f"{len(raw)} bytes > {limits.max_frame_bytes}")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError("bad_utf8", f"at byte {exc.start}") from exc
        frame = need_dict(parse_json(text), "frame")
        version = frame.get("v")
        if version != PROTOCOL_VERSION or isinstance(version, bool):
            raise ProtocolError("bad_version", f"speaks v{version!r}, this node speaks v{PROTOCOL_VERSION}")
        frame_type = frame.get("type")
        if frame_type not in FRAME_TYPES:
            raise ProtocolError("unknown_type", f"{str(frame_type)[:32]!r}")
        sender = need_peer_id(frame.get("from"), "from")
        seq = need_int(frame.get("seq"), "seq", 0, MAX_SEQ)
        ts = need_number(frame.get("ts"), "ts")
        body = need_dict(frame.get("body"), "body")
        sig_text = frame.pop("sig", None)
        sig = b64url_decode(sig_text, 64) if isinstance(sig_text, str) and len(sig_text) == SIG_LEN else None
        if sig is None:
            raise ProtocolError("bad_schema", "sig must be a base64url ed25519 signature")
        if abs(self.clock() - ts) > limits.max_clock_skew_s:
            raise ProtocolError("stale", f"timestamp {ts:.0f} is {self.clock() - ts:+.0f} s off this clock")
        # `frame` minus "sig", re-encoded canonically: unknown fields are covered by the signature too.
        if not verify(sender, sig, canonical(frame)):
            raise ProtocolError("bad_signature", f"from {sender[:12]}")
        # Replay before rate: the same frame arriving by a second path must not spend the sender's tokens.
        replay = self.replay.check_and_mark(sender, seq, self.clock())
        # Our own hello is "seen" (we signed it): let it through so the link can detect a self-dial.
        if replay is not None and not (frame_type == "hello" and sender == self.identity.peer_id):
            raise ProtocolError(replay, f"seq {seq} from {sender[:12]}")
        if not self.signer_buckets.take(sender, self.clock()):
            raise ProtocolError("rate_limited", f"signer {sender[:12]}")
        return Envelope(type=str(frame_type), sender=sender, seq=seq, ts=ts, body=body, raw=raw)


# --- per-link state machine -----------------------------------------------------------------------

@dataclass(frozen=True)
class HelloReceived:
    peer_id: str
    hello: Hello


@dataclass(frozen=True)
class PeersReceived:
    peers: tuple[PeerEntry, ...]


@dataclass(frozen=True)
class RolloutsReceived:
    envelope: Envelope  # envelope.raw is what a relay forwards
    groups: tuple[RolloutGroup, ...]


@dataclass(frozen=True)
class ByeReceived:
    reason: str


@dataclass(frozen=True)
class CredentialReceived:
    """A bootstrap's short-lived credential for the board (a NATS user JWT) and when it expires."""

    jwt: str
    expires_at: float


@dataclass(frozen=True)
class ReceiptReceived:
    """A peer says it trained on these of our groups (content keys); engine/swarm/receipts.py."""

    sender: str
    to: str
    keys: tuple[str, ...]
    gradient: tuple[str, ...] = ()  # those of `keys` that gave the sender's update a gradient


@dataclass(frozen=True)
class FrameRefused:
    reason: str  # one of errors.REASONS
    detail: str


@dataclass(frozen=True)
class SelfConnection:
    """The link leads back to this very process (e.g. it dialled its own mDNS announcement)."""


@dataclass(frozen=True)
class DuplicateIdentity:
    """The peer presents this node's own key from another process. `we_are_second`: we started later."""

    instance: str
    we_are_second: bool


ProtocolEvent = (HelloReceived | PeersReceived | RolloutsReceived | ByeReceived | FrameRefused
                 | SelfConnection | DuplicateIdentity | CredentialReceived | ReceiptReceived)


class PeerConnection:
    """One link's protocol state. Both ends send `hello_frame()` first; then frames flow both ways.

    `receive` never raises on peer input: a bad frame becomes a FrameRefused event (already counted).
    The caller closes the link on SelfConnection, DuplicateIdentity or ByeReceived.
    """

    def __init__(self, protocol: SwarmProtocol, hello: Hello, started_at: float) -> None:
        self.protocol = protocol
        self.hello = hello
        self.started_at = started_at  # when this process started: decides who is "second" on a copy
        self.state = "handshake"
        self.peer_id: str | None = None
        self.peer_hello: Hello | None = None
        limits = protocol.limits
        self._link_bucket = TokenBucket.full(limits.link_rate_per_s, limits.link_burst, protocol.clock())

    def hello_frame(self) -> bytes:
        body = self.hello.to_wire()
        body["started"] = self.started_at
        return self.protocol.encode("hello", body)

    def creds_frame(self, jwt: str, expires_at: float) -> bytes:
        return self.protocol.encode("creds", {"jwt": jwt, "expires": expires_at})

    def bye_frame(self, reason: str) -> bytes:
        self.state = "closed"
        return self.protocol.encode("bye", {"reason": reason[:128]})

    def receive(self, data: bytes | str) -> list[ProtocolEvent]:
        if self.state == "closed":
            return []
        # The link bucket runs before any parsing: a flood costs us no signature checks.
        if not self._link_bucket.take(self.protocol.clock()):
            self.protocol.refuse("rate_limited", self.peer_id or "")
            return [FrameRefused("rate_limited", "link over its frame rate")]
        try:
            env = self.protocol.open(data)
            return self._handle(env)
        except ProtocolError as exc:
            return [FrameRefused(exc.reason, exc.detail)]

    def _refuse(self, reason: str, detail: str, sender: str) -> ProtocolError:
        self.protocol.refuse(reason, sender)
        return ProtocolError(reason, detail)

    def _handle(self, env: Envelope) -> list[ProtocolEvent]:
        limits = self.protocol.limits
        if self.state == "handshake":
            if env.type != "hello":
                raise self._refuse("unexpected", f"{env.type} before hello", env.sender)
            try:
                hello = Hello.from_wire(env.body, limits)
                started = need_number(env.body.get("started", 0.0), "hello.started")
            except ProtocolError as exc:
                raise self._refuse(exc.reason, exc.detail, env.sender) from exc
            if env.sender == self.protocol.identity.peer_id:
                self.state = "closed"
                if hello.instance == self.hello.instance:
                    return [SelfConnection()]
                second = (self.started_at, self.hello.instance) > (started, hello.instance)
                return [DuplicateIdentity(hello.instance, we_are_second=second)]
            self.peer_id, self.peer_hello, self.state = env.sender, hello, "open"
            return [HelloReceived(env.sender, hello)]
        if env.sender == self.protocol.identity.peer_id:
            # Not one of our seqs (those are marked at encode): another process holds our key.
            raise self._refuse("wrong_signer", "signed with this node's key by another process "
                               "(copied data dir?)", env.sender)
        # Control frames must come from the link's own peer; rollouts may be relayed from anyone.
        if env.type != "rollouts" and env.sender != self.peer_id:
            raise self._refuse("wrong_signer", f"{env.type} signed by a third party", env.sender)
        try:
            if env.type == "rollouts":
                return [self._rollouts(env)]
            if env.type == "peers":
                return [PeersReceived(peers_from_wire(env.body, limits))]
            if env.type == "bye":
                self.state = "closed"
                return [ByeReceived(bye_reason(env.body, limits))]
            if env.type == "creds":
                if self.peer_hello is None or self.peer_hello.role != "bootstrap":
                    raise ProtocolError("unexpected", "credentials from a peer that is not a bootstrap")
                return [CredentialReceived(*credential_from_wire(env.body))]
            if env.type == "receipt":
                return [ReceiptReceived(env.sender, *receipt_from_wire(env.body))]
            raise ProtocolError("unexpected", "second hello on an open link")
        except ProtocolError as exc:
            raise self._refuse(exc.reason, exc.detail, env.sender) from exc

    def _rollouts(self, env: Envelope) -> RolloutsReceived:
        return RolloutsReceived(env, rollouts_from_wire(env.body, self.protocol.limits, env.sender))
