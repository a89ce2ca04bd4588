"""JSON on the wire: strict parsing, the canonical encoding that gets signed, and body schemas.

Everything here is pure: it turns untrusted JSON values into typed records or raises
ProtocolError(reason). Unknown fields are ignored (forward compatibility); rewards are never read.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.sapo.records import Provenance, RolloutGroup
from engine.swarm.config import ProtocolLimits
from engine.swarm.errors import ProtocolError
from engine.swarm.identity import is_peer_id
from engine.tasks.reference import TaskRef, TaskRefError

HEX64 = re.compile(r"[0-9a-f]{64}")
INSTANCE = re.compile(r"[0-9a-f]{16}")
ROLES = ("node", "bootstrap")
MAX_COUNTER = 2**53  # round / policy_version: exact in every JSON implementation


def _reject_constant(name: str) -> Any:
    raise ProtocolError("non_finite", f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf without ever calling parse_constant
        raise ProtocolError("non_finite", f"{text[:20]} overflows a float")
    return value


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ProtocolError("bad_json", "duplicate key in object")
    return obj


def parse_json(text: str) -> Any:
    """Strict JSON: no NaN/Infinity, no overflowing floats, no duplicate keys, bounded nesting."""
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float,
                          object_pairs_hook=_no_duplicate_keys)
    except RecursionError as exc:
        raise ProtocolError("bad_json", "nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError, or an int literal longer than Python allows
        raise ProtocolError("bad_json", str(exc)[:120]) from exc


def canonical(obj: Any) -> bytes:
    """The signed encoding: sorted keys, no spaces, UTF-8, no NaN. Raises ProtocolError on bad text."""
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate smuggled in as a \ud800 escape
        raise ProtocolError("bad_utf8", "string holds a lone surrogate") from exc
    except RecursionError as exc:  # parsed near the limit, re-encoded from a deeper stack
        raise ProtocolError("bad_json", "nested too deeply") from exc
    except ValueError as exc:
        raise ProtocolError("non_finite", str(exc)) from exc


# --- field checkers --------------------------------------------------------------------------------

def need_dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError("bad_schema", f"{what} must be an object")
    return value


def need_int(value: Any, what: str, low: int = 0, high: int = MAX_COUNTER) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ProtocolError("bad_schema", f"{what} must be an integer in [{low}, {high}]")
    return value


def need_number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError("bad_schema", f"{what} must be a number")
    if not math.isfinite(value):
        raise ProtocolError("non_finite", f"{what} must be finite")
    return float(value)


def need_text(value: Any, what: str, max_bytes: int, allow_empty: bool = True) -> str:
    if not isinstance(value, str):
        raise ProtocolError("bad_schema", f"{what} must be a string")
    if not allow_empty and not value:
        raise ProtocolError("bad_schema", f"{what} must not be empty")
    # Cheap bound first: a str of n code points is at least n bytes of UTF-8.
    if len(value) > max_bytes or len(value.encode("utf-8", "surrogatepass")) > max_bytes:
        raise ProtocolError("over_limit", f"{what} longer than {max_bytes} bytes")
    return value


def need_list(value: Any, what: str, max_items: int) -> list[Any]:
    if not isinstance(value, list):
        raise ProtocolError("bad_schema", f"{what} must be a list")
    if len(value) > max_items:
        raise ProtocolError("over_limit", f"{what} has {len(value)} items, at most {max_items} allowed")
    return value


def need_peer_id(value: Any, what: str) -> str:
    if not is_peer_id(value):
        raise ProtocolError("bad_schema", f"{what} must be a peer id (base64url ed25519 key)")
    return str(value)


def optional_url(value: Any, what: str, limits: ProtocolLimits) -> str | None:
    if value is None:
        return None
    url = need_text(value, what, limits.max_text_bytes)
    if not url.startswith(("ws://", "wss://")):
        raise ProtocolError("bad_schema", f"{what} must be a ws:// or wss:// URL")
    return url


# --- rollout groups --------------------------------------------------------------------------------

def group_to_wire(group: RolloutGroup) -> dict[str, Any]:
    """A group as a JSON object. Rewards are deliberately absent: receivers score locally."""
    prov = group.provenance
    obj: dict[str, Any] = {
        "ref": group.ref.to_dict(),
        "question_hash": group.question_hash,
        "completions": list(group.completions),
        "provenance": {"origin_peer": prov.origin_peer, "model_id": prov.model_id,
                       "policy_version": prov.policy_version, "round": prov.round,
                       "created_at": prov.created_at},
    }
    summary = group.summarized_logprobs()
    if summary is not None:  # receivers use only the sums: (sum, tokens, lowest) per completion, not every token
        obj["logprob_summary"] = [[total, tokens, lowest] for total, tokens, lowest in summary]
    return obj


def rollouts_from_wire(body: Mapping[str, Any], limits: ProtocolLimits, signer: str) -> tuple[RolloutGroup, ...]:
    """The groups of a `rollouts` frame's body, however it arrived (link, board, in-memory transport): a
    bounded, non-empty list, every group valid and originated by the frame's `signer` (a relay forwards,
    it never re-signs others' work)."""
    items = need_list(body.get("groups"), "groups", limits.max_groups_per_frame)
    if not items:
        raise ProtocolError("bad_schema", "rollouts frame without groups")
    return tuple(group_from_wire(item, limits, signer=signer) for item in items)


def group_from_wire(obj: Any, limits: ProtocolLimits, signer: str | None = None) -> RolloutGroup:
    """Validate one wire group. `signer`: the frame's signer, which must be the group's origin."""
    data = need_dict(obj, "group")
    try:
        ref = TaskRef.from_dict(data.get("ref"))
    except TaskRefError as exc:
        raise ProtocolError("bad_schema", f"task reference: {exc}") from exc
    qhash = data.get("question_hash")
    if not isinstance(qhash, str) or not HEX64.fullmatch(qhash):
        raise ProtocolError("bad_schema", "question_hash must be 64 lowercase hex digits")
    raw_completions = need_list(data.get("completions"), "completions", limits.max_completions_per_group)
    if not raw_completions:
        raise ProtocolError("bad_schema", "a group needs at least one completion")
    completions = tuple(need_text(c, "completion", limits.max_completion_bytes) for c in raw_completions)
    prov = need_dict(data.get("provenance"), "provenance")
    origin = need_peer_id(prov.get("origin_peer"), "provenance.origin_peer")
    if signer is not None and origin != signer:
        raise ProtocolError("wrong_signer", "group origin differs from the frame's signer")
    created_at = need_number(prov.get("created_at"), "provenance.created_at")
    if created_at < 0:
        raise ProtocolError("bad_schema", "provenance.created_at must be >= 0")
    provenance = Provenance(
        origin_peer=origin,
        model_id=need_text(prov.get("model_id"), "provenance.model_id", limits.max_text_bytes, False),
        policy_version=need_int(prov.get("policy_version"), "provenance.policy_version"),
        round=need_int(prov.get("round"), "provenance.round"),
        created_at=created_at,
    )
    logprobs = _logprobs_from_wire(data.get("generator_logprobs"), len(completions), limits)
    summary = _summary_from_wire(data.get("logprob_summary"), len(completions), limits)
    return RolloutGroup(ref=ref, question_hash=qhash, completions=completions, provenance=provenance,
                        generator_logprobs=logprobs, logprob_summary=summary)


def _per_completion(value: Any, name: str, count: int, what: str) -> list[Any] | None:
    """An optional list with one `what` per completion (None when absent)."""
    if value is None:
        return None
    rows = need_list(value, name, count)
    if len(rows) != count:
        raise ProtocolError("bad_schema", f"{name} needs one {what} per completion")
    return rows


def _summary_from_wire(value: Any, count: int, limits: ProtocolLimits) -> tuple[tuple[float, int, float], ...] | None:
    rows = _per_completion(value, "logprob_summary", count, "entry")
    if rows is None:
        return None
    out = []
    for row in rows:
        items = need_list(row, "logprob_summary[i]", 3)
        if len(items) != 3:
            raise ProtocolError("bad_schema", "logprob_summary entries are [sum, tokens, lowest]")
        total, lowest = need_number(items[0], "log-prob sum"), need_number(items[2], "lowest log-prob")
        tokens = need_int(items[1], "tokens", 0, limits.max_logprobs_per_completion)
        if total > 1e-3 or lowest > 1e-3:  # log-probabilities are <= 0 (allow float rounding)
            raise ProtocolError("bad_schema", "a log-prob is positive")
        out.append((min(total, 0.0), tokens, min(lowest, 0.0)))
    return tuple(out)


def _logprobs_from_wire(value: Any, count: int, limits: ProtocolLimits) -> tuple[tuple[float, ...], ...] | None:
    rows = _per_completion(value, "generator_logprobs", count, "list")
    if rows is None:
        return None
    out = []
    for row in rows:
        items = need_list(row, "generator_logprobs[i]", limits.max_logprobs_per_completion)
        values = tuple(need_number(v, "log-prob") for v in items)
        if any(v > 1e-3 for v in values):  # log-probabilities are <= 0 (allow float rounding)
            raise ProtocolError("bad_schema", "a log-prob is positive")
        out.append(tuple(min(v, 0.0) for v in values))
    return tuple(out)


# --- other bodies ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Hello:
    """First frame on a link: who the sender is and how to reach it."""

    instance: str  # random per process: same peer id + other instance = a copied identity
    role: str  # "node" or "bootstrap"
    model: str  # base model id of the sender's policy ("" for a bootstrap)
    tasks: str  # task-library version (questions regenerate identically only on equal versions)
    listen: str | None  # ws:// URL where the sender accepts links, if any
    # A bootstrap's data plane: the board's servers (nats://, tls://, or ws:// / wss:// for nodes behind
    # proxies; host 0.0.0.0 = the bootstrap's)
    board: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"instance": self.instance, "role": self.role, "model": self.model,
                                "tasks": self.tasks, "listen": self.listen}
        if self.board:  # absent otherwise, so frames of nodes without a board stay as they were
            wire["board"] = list(self.board)
        return wire

    @classmethod
    def from_wire(cls, body: dict[str, Any], limits: ProtocolLimits) -> Hello:
        instance = body.get("instance")
        if not isinstance(instance, str) or not INSTANCE.fullmatch(instance):
            raise ProtocolError("bad_schema", "hello.instance must be 16 hex digits")
        role = body.get("role")
        if role not in ROLES:
            raise ProtocolError("bad_schema", f"hello.role must be one of {ROLES}")
        return cls(instance=instance, role=str(role),
                   model=need_text(body.get("model", ""), "hello.model", limits.max_text_bytes),
                   tasks=need_text(body.get("tasks", ""), "hello.tasks", limits.max_text_bytes),
                   listen=optional_url(body.get("listen"), "hello.listen", limits),
                   board=board_urls(body.get("board", []), "hello.board", limits))


MAX_BOARD_URLS = 8
BOARD_SCHEMES = ("nats://", "tls://", "ws://", "wss://")


def board_urls(value: Any, what: str, limits: ProtocolLimits) -> tuple[str, ...]:
    items = need_list(value, what, MAX_BOARD_URLS)
    urls = tuple(need_text(item, what, limits.max_text_bytes) for item in items)
    for url in urls:
        if not url.startswith(BOARD_SCHEMES) or any(ch.isspace() or ch == "," for ch in url):
            raise ProtocolError("bad_schema", f"{what} must hold nats://, tls://, ws:// or wss:// URLs")
    return urls


@dataclass(frozen=True)
class PeerEntry:
    """One peer in a `peers` frame (a bootstrap's view of who is in the swarm)."""

    peer_id: str
    model: str
    tasks: str
    listen: str | None

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.peer_id, "model": self.model, "tasks": self.tasks, "listen": self.listen}

    @classmethod
    def from_wire(cls, obj: Any, limits: ProtocolLimits) -> PeerEntry:
        data = need_dict(obj, "peer entry")
        return cls(peer_id=need_peer_id(data.get("id"), "peer.id"),
                   model=need_text(data.get("model", ""), "peer.model", limits.max_text_bytes),
                   tasks=need_text(data.get("tasks", ""), "peer.tasks", limits.max_text_bytes),
                   listen=optional_url(data.get("listen"), "peer.listen", limits))


def peers_from_wire(body: dict[str, Any], limits: ProtocolLimits) -> tuple[PeerEntry, ...]:
    items = need_list(body.get("peers"), "peers", limits.max_peers_per_frame)
    return tuple(PeerEntry.from_wire(item, limits) for item in items)


MAX_JWT_CHARS = 4096


def credential_from_wire(body: dict[str, Any]) -> tuple[str, float]:
    """A `creds` body -> (jwt, expires_at). The JWT is only passed on to the board's servers, which
    verify it; here it is bounded and shaped like one."""
    jwt = body.get("jwt")
    if not isinstance(jwt, str) or not 0 < len(jwt) <= MAX_JWT_CHARS or jwt.count(".") != 2 \
            or not all(ch.isalnum() or ch in "-_." for ch in jwt):
        raise ProtocolError("bad_schema", "creds.jwt must be a JWT")
    return jwt, need_number(body.get("expires"), "creds.expires")


def bye_reason(body: dict[str, Any], limits: ProtocolLimits) -> str:
    return need_text(body.get("reason", ""), "bye.reason", limits.max_text_bytes)
