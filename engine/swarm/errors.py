"""The swarm's exception tree. Everything the swarm raises on purpose derives from `SwarmError`.

    SwarmError
    ├── ProtocolError          a frame or body refused; `.reason` is the counter key (see REASONS)
    ├── IdentityError          the identity key file is unreadable, malformed or too open
    │   └── DuplicateIdentityError   another live node uses this node's key (copied data dir/VM)
    └── TransportError         a network failure, worded for users: what failed and what to try
        ├── ConnectError       could not open a link (refused, DNS, timeout, TLS, HTTP status)
        └── CapacityError      the other side (or this one) is at its connection cap

Config validation raises plain `ValueError` (the project-wide convention for config dataclasses).
"""

from __future__ import annotations

from engine.errors import SapoError

# Every refusal reason the protocol counts. Stable strings: they appear in stats, /status and logs.
REASONS: tuple[str, ...] = (
    "frame_too_large",  # frame bytes over limits.max_frame_bytes
    "bad_utf8",  # not valid UTF-8 (or a lone surrogate escaped in JSON)
    "bad_json",  # not parseable JSON, too deeply nested, duplicate keys
    "non_finite",  # NaN / Infinity anywhere
    "bad_schema",  # wrong types, missing fields, malformed ids or hashes
    "bad_version",  # protocol version this node does not speak
    "unknown_type",  # a frame type this node does not know
    "over_limit",  # too many groups / completions / peers, or texts too long
    "stale",  # timestamp too far in the past or future
    "bad_signature",  # ed25519 signature does not verify
    "duplicate",  # (from, seq) already seen: replay, or the same frame by another path
    "replay_old",  # seq older than the replay window: cannot prove it is new
    "too_many_senders",  # every replay slot holds a sender active within the horizon: new ones wait
    "rate_limited",  # the sender's (or the link's) token bucket is empty
    "unexpected",  # valid frame in the wrong state (e.g. rollouts before hello)
    "wrong_signer",  # hello/peers/bye not signed by the link's peer; group origin != signer
)


class SwarmError(SapoError):
    """Base of every error the swarm raises on purpose."""


class ProtocolError(SwarmError):
    """A frame, body or group refused. `reason` is one of REASONS; `detail` is for logs."""

    def __init__(self, reason: str, detail: str = "") -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown refusal reason {reason!r}")
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class IdentityError(SwarmError):
    """The identity key file cannot be used (unreadable, malformed, readable by others)."""


class DuplicateIdentityError(IdentityError):
    """Another running node presents this node's own key: a copied data dir or a cloned VM."""

    def __init__(self, peer_id: str, where: str = "") -> None:
        self.peer_id = peer_id
        self.where = where
        at = f" (seen via {where})" if where else ""
        super().__init__(
            f"another node is already running with this identity {peer_id[:12]}…{at}. This happens "
            "when a data dir or VM is copied. Stop the other node, or give this one its own identity: "
            "delete identity.key in this node's data dir (a new key is created on the next start)."
        )


class TransportError(SwarmError):
    """A network failure, worded for users: what failed and what to try."""


class ConnectError(TransportError):
    """Could not open a link to `url`. The message says why and what to check."""

    def __init__(self, url: str, why: str, hint: str) -> None:
        self.url = url
        self.why = why
        self.hint = hint
        super().__init__(f"could not reach {url}: {why} — {hint}")


class CapacityError(TransportError):
    """A connection cap was hit (here or at the remote end)."""
