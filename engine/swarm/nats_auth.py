"""Who may write which board key: NATS decentralized auth (operator → account → user JWTs).

The bootstrap holds an operator key and three account keys (ed25519): the board's account (the stream,
its only user the bootstrap), the nodes' account and the system account (see `Authority`). It runs its
nats-server in operator mode with the accounts preloaded, and issues each node, over the node's signed
websocket link, a short-lived user JWT whose subject is **the node's own ed25519 key** (the same 32
bytes as its swarm peer id, in NATS's NKey encoding) and whose permissions allow publishing only to the
node's own board subject, the two read calls a fetch needs and receipts, and reading only its own
inboxes. The node proves the key by signing the server's nonce with its identity; the server enforces
the rest ("permissions violation"). Nothing here is a secret but the bootstrap's keys.

NKey: base32(prefix byte + 32-byte public key + CRC-16/XMODEM little-endian), no padding.
JWT: base64url(header).base64url(claims).base64url(ed25519 signature), claims in the v2 layout.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from engine.swarm.board import SUBJECT_PREFIX, key_subject
from engine.swarm.identity import b64url_decode
from engine.swarm.receipts import RECEIPT_PREFIX, receipt_subject

_PREFIX = {"O": 14 << 3, "A": 0, "U": 20 << 3}
KEYS_FILE = "nats-authority.json"
STREAM = "SAPO_ROLLOUTS"  # the board's JetStream stream
JWT_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
MAX_JWT_CHARS = 4096


def crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def nkey(kind: str, public: bytes) -> str:
    """The NKey text of a 32-byte ed25519 public key ("O" operator, "A" account, "U" user)."""
    if len(public) != 32:
        raise ValueError("an NKey holds a 32-byte ed25519 public key")
    data = bytes([_PREFIX[kind]]) + public
    return base64.b32encode(data + crc16(data).to_bytes(2, "little")).decode().rstrip("=")


def nkey_public(text: str) -> tuple[str, bytes]:
    """Decode and check an NKey -> (kind, 32-byte public key). ValueError when it is not one."""
    try:
        data = base64.b32decode(text + "=" * (-len(text) % 8))
    except (ValueError, TypeError) as exc:
        raise ValueError("not an NKey") from exc
    if len(data) != 35 or crc16(data[:33]) != int.from_bytes(data[33:], "little"):
        raise ValueError("not an NKey (length or checksum)")
    kinds = {v: k for k, v in _PREFIX.items()}
    if data[0] not in kinds:
        raise ValueError("unknown NKey kind")
    return kinds[data[0]], data[1:33]


def _raw(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _compact(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def encode_jwt(issuer: Ed25519PrivateKey, issuer_kind: str, subject: str, name: str, nats: dict[str, Any],
               expires_at: float | None = None, now: float | None = None) -> str:
    claims: dict[str, Any] = {"jti": "", "iat": int(now or time.time()), "iss": nkey(issuer_kind, _raw(issuer)),
                              "name": name, "sub": subject, "nats": nats}
    if expires_at is not None:
        claims["exp"] = int(expires_at)
    claims["jti"] = base64.b32encode(hashlib.sha512(_compact(claims)).digest()[:32]).decode().rstrip("=")
    signing_input = f"{_b64(_compact(JWT_HEADER))}.{_b64(_compact(claims))}"
    return f"{signing_input}.{_b64(issuer.sign(signing_input.encode()))}"


def decode_jwt(token: str, issuer_nkey: str | None = None) -> dict[str, Any]:
    """Claims of a JWT whose signature verifies under its `iss` (and that is `issuer_nkey`, if given)."""
    if not isinstance(token, str) or len(token) > MAX_JWT_CHARS or token.count(".") != 2:
        raise ValueError("not a JWT")
    head, body, sig = token.split(".")
    try:
        claims = json.loads(_unb64(body))
        signature = _unb64(sig)
    except (ValueError, json.JSONDecodeError) as exc:
        raise ValueError("malformed JWT") from exc
    if not isinstance(claims, dict) or not isinstance(claims.get("iss"), str):
        raise ValueError("JWT without an issuer")  # noqa: TRY004 (ValueError for every bad input)
    if issuer_nkey is not None and claims["iss"] != issuer_nkey:
        raise ValueError("JWT from another issuer")
    _, issuer = nkey_public(claims["iss"])
    try:
        Ed25519PublicKey.from_public_bytes(issuer).verify(signature, f"{head}.{body}".encode())
    except Exception as exc:
        raise ValueError("JWT signature does not verify") from exc
    return claims


def user_nkey_of(peer_id: str) -> str:
    """A swarm peer id (base64url ed25519 key) as a NATS user NKey: the same key."""
    return nkey("U", b64url_decode(peer_id, 32) or b"")


JS_API = "$JS.API"  # JetStream's API, inside the board's own account (the bootstrap's user only)
NODE_API_PREFIX = "sapo.board.api"  # how nodes reach the two read calls the board account exports to them
MAX_NODE_SUBSCRIPTIONS = 8  # a node subscribes to its reply inbox and its receipts inbox


@dataclass(frozen=True)
class BoardQuota:
    """What the board holds, sized to real frames (a SmolLM2 round's frame is ~10-30 KB, a paper-sized
    one with log-prob sums tens of KB), so that a full swarm of honest nodes fits and a flood of free
    identities can only push the oldest frames out, never make a put fail."""

    max_frame_bytes: int = 256 * 1024  # one node's stored frame, and any message a node may publish
    store_bytes: int = 256 << 20  # the stream's bytes; beyond, the oldest frames are dropped
    max_age_s: float = 600.0  # a frame not refreshed for this long leaves the board

    def __post_init__(self) -> None:
        if isinstance(self.max_frame_bytes, bool) or not isinstance(self.max_frame_bytes, int) \
                or not 4096 <= self.max_frame_bytes <= 8 << 20:
            raise ValueError("BoardQuota.max_frame_bytes must be an int in [4 KiB, 8 MiB]")
        if isinstance(self.store_bytes, bool) or not isinstance(self.store_bytes, int) \
                or not 16 * self.max_frame_bytes <= self.store_bytes <= 64 << 30:
            raise ValueError("BoardQuota.store_bytes must hold at least 16 frames and at most 64 GiB")
        if isinstance(self.max_age_s, bool) or not isinstance(self.max_age_s, (int, float)) \
                or not 1 <= self.max_age_s <= 86400:
            raise ValueError("BoardQuota.max_age_s must be in [1, 86400] seconds")

    @property
    def max_payload_bytes(self) -> int:
        """A node's largest message: a frame plus JetStream's headers."""
        return self.max_frame_bytes + 4096


def node_inbox(peer_id: str) -> str:
    """A node's reply-subject prefix: the only replies it may subscribe to (nobody reads another's)."""
    return f"_INBOX.{peer_id}"


def board_permissions(peer_id: str, stream: str, prefix: str = SUBJECT_PREFIX) -> dict[str, Any]:
    """Publish: its own key, the board's two read calls (through the node account's imports), receipts
    to anyone's inbox. Subscribe: its own reply inbox and its own receipts inbox only."""
    return {"pub": {"allow": [key_subject(peer_id, prefix), f"{NODE_API_PREFIX}.STREAM.INFO.{stream}",
                              f"{NODE_API_PREFIX}.DIRECT.GET.{stream}", f"{RECEIPT_PREFIX}.*"]},
            "sub": {"allow": [f"{node_inbox(peer_id)}.>", receipt_subject(peer_id)]}}


def _board_services(stream: str, prefix: str) -> list[tuple[str, str, str]]:
    """(name, the board account's subject, the node account's subject) of each service nodes use."""
    return [("put", f"{prefix}.*", f"{prefix}.*"),
            ("info", f"{JS_API}.STREAM.INFO.{stream}", f"{NODE_API_PREFIX}.STREAM.INFO.{stream}"),
            ("get", f"{JS_API}.DIRECT.GET.{stream}", f"{NODE_API_PREFIX}.DIRECT.GET.{stream}")]


_ACCOUNT_LIMITS = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True,
                   "conn": -1, "leaf": -1}


@dataclass(frozen=True)
class Credential:
    jwt: str
    expires_at: float


class Authority:
    """The bootstrap's operator key and three accounts' keys, and the JWTs it signs.

    Isolation by construction: the board's stream lives in the *board* account, whose only user is the
    bootstrap. Nodes live in the *nodes* account, which has no JetStream at all and sees the board only
    through three service imports (put a frame, stream info, direct get). A service import maps each
    request's reply subject to a fresh one in the exporting account, so JetStream's answer goes back
    through that mapping: whatever reply subject a node chooses, the answer lands in the nodes account,
    where no JetStream API exists to run it. The system account is a third one, with no users issued.
    """

    KEYS = ("operator", "account", "system", "board")  # "account" is the nodes' account (older key files)

    def __init__(self, operator: Ed25519PrivateKey, account: Ed25519PrivateKey, system: Ed25519PrivateKey,
                 board: Ed25519PrivateKey | None = None, quota: BoardQuota | None = None,
                 stream: str = STREAM, prefix: str = SUBJECT_PREFIX) -> None:
        self.operator, self.account, self.system = operator, account, system
        self.board = board or Ed25519PrivateKey.generate()
        self.quota = quota or BoardQuota()
        self.stream, self.prefix = stream, prefix  # the board's stream and its subjects
        self.operator_nkey = nkey("O", _raw(operator))
        self.account_nkey = nkey("A", _raw(account))
        self.system_nkey = nkey("A", _raw(system))
        self.board_nkey = nkey("A", _raw(self.board))

    @classmethod
    def generate(cls, quota: BoardQuota | None = None, stream: str = STREAM) -> Authority:
        operator, account, system, board = (Ed25519PrivateKey.generate() for _ in cls.KEYS)
        return cls(operator, account, system, board, quota=quota, stream=stream)

    def private_keys(self) -> dict[str, str]:
        """The keys as text (the key file's content; a bench hands them to its worker processes)."""
        return {k: _b64(getattr(self, k).private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                                       serialization.NoEncryption())) for k in self.KEYS}

    @classmethod
    def from_private_keys(cls, data: object, quota: BoardQuota | None = None, stream: str = STREAM) -> Authority:
        """Keys as `private_keys` wrote them; a missing one (a key file from before the board had its own
        account) is made new."""
        if not isinstance(data, dict):
            raise ValueError("not a key file")  # noqa: TRY004 -- config errors are ValueErrors
        keys = [Ed25519PrivateKey.from_private_bytes(_unb64(data[k])) if k in data else Ed25519PrivateKey.generate()
                for k in cls.KEYS]
        operator, account, system, board = keys
        return cls(operator, account, system, board, quota=quota, stream=stream)

    @classmethod
    def load_or_create(cls, data_dir: Path, quota: BoardQuota | None = None) -> Authority:
        """Kept beside the bootstrap's identity: nodes' credentials survive a bootstrap restart."""
        path = Path(data_dir) / KEYS_FILE
        data = json.loads(path.read_text()) if path.is_file() else {}
        auth = cls.from_private_keys(data, quota)
        if not isinstance(data, dict) or any(k not in data for k in cls.KEYS):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.touch(mode=0o600)
            tmp.write_text(json.dumps(auth.private_keys()))
            tmp.replace(path)
        return auth

    def _account_jwt(self, key: str, name: str, claims: dict[str, Any]) -> str:
        return encode_jwt(self.operator, "O", key, name, {"type": "account", "version": 2, **claims})

    def board_account_jwt(self) -> str:
        """The stream's account: JetStream sized to the quota, the three services exported."""
        quota = self.quota
        exports = [{"name": name, "subject": subject, "type": "service", "response_type": "Singleton"}
                   for name, subject, _ in _board_services(self.stream, self.prefix)]
        # One stream, in memory or (a bootstrap with a data dir: frames outlive its restart) on disk,
        # bounded in bytes (every replica of it, in a cluster); only the bootstrap's user can make
        # streams here, so the stream's own cap is the bound that matters.
        limits = {**_ACCOUNT_LIMITS, "mem_storage": -1, "disk_storage": -1, "streams": 1, "consumer": 1,
                  "max_ack_pending": -1, "mem_max_stream_bytes": quota.store_bytes,
                  "disk_max_stream_bytes": quota.store_bytes, "max_bytes_required": True}
        return self._account_jwt(self.board_nkey, "board", {"exports": exports, "limits": limits})

    def nodes_account_jwt(self, revocations: dict[str, int] | None = None) -> str:
        """The nodes' account: no JetStream, the board's services imported, messages no larger than a
        frame; `revocations` (user NKey -> unix time) refuses those users' JWTs issued before then."""
        imports = [{"name": name, "subject": subject, "account": self.board_nkey, "local_subject": local,
                    "type": "service"} for name, subject, local in _board_services(self.stream, self.prefix)]
        claims: dict[str, Any] = {"imports": imports,
                                  "limits": {**_ACCOUNT_LIMITS, "payload": self.quota.max_payload_bytes}}
        if revocations:
            claims["revocations"] = dict(revocations)
        return self._account_jwt(self.account_nkey, "nodes", claims)

    def server_config(self) -> str:
        """nats-server config lines: operator mode, the three accounts preloaded."""
        op = encode_jwt(self.operator, "O", self.operator_nkey, "sapo-swarm", {"type": "operator", "version": 2})
        accounts = {self.board_nkey: self.board_account_jwt(), self.account_nkey: self.nodes_account_jwt(),
                    self.system_nkey: self._account_jwt(self.system_nkey, "SYS", {"limits": _ACCOUNT_LIMITS})}
        lines = [f'operator: "{op}"', f"system_account: {self.system_nkey}", "resolver: MEMORY", "resolver_preload: {"]
        lines += [f'  {account}: "{jwt}"' for account, jwt in accounts.items()]
        return "\n".join([*lines, "}"]) + "\n"

    def issue(self, peer_id: str, stream: str, ttl_s: float, prefix: str = SUBJECT_PREFIX,
              now: float | None = None) -> Credential:
        """A node's board credential, in the nodes' account: write its own key only, for ttl_s."""
        now = now or time.time()
        nats = {"type": "user", "version": 2, **board_permissions(peer_id, stream, prefix),
                "subs": MAX_NODE_SUBSCRIPTIONS, "data": -1, "payload": self.quota.max_payload_bytes}
        expires = now + ttl_s
        return Credential(encode_jwt(self.account, "A", user_nkey_of(peer_id), "node", nats, expires, now), expires)

    def admin(self, key: Ed25519PrivateKey, ttl_s: float = 10 * 365 * 86400.0) -> Credential:
        """The bootstrap's own user, in the board's account (creates and repairs the board's stream)."""
        expires = time.time() + ttl_s
        nats = {"type": "user", "version": 2, "pub": {"allow": [">"]}, "sub": {"allow": [">"]},
                "subs": -1, "data": -1, "payload": -1}
        return Credential(encode_jwt(self.board, "A", nkey("U", _raw(key)), "bootstrap", nats, expires), expires)

    def system_user(self, key: Ed25519PrivateKey, ttl_s: float = 10 * 365 * 86400.0) -> Credential:
        """The bootstrap's user in the system account: it pushes the nodes' account's revocations."""
        expires = time.time() + ttl_s
        nats = {"type": "user", "version": 2, "pub": {"allow": ["$SYS.REQ.ACCOUNT.*.CLAIMS.UPDATE"]},
                "sub": {"allow": ["_INBOX.>"]}, "subs": -1, "data": -1, "payload": -1}
        return Credential(encode_jwt(self.system, "A", nkey("U", _raw(key)), "warden", nats, expires), expires)


def connect_options(sign: Any, credential: Any, inbox: str = "_INBOX") -> dict[str, Any]:
    """nats-py options that authenticate with an ed25519 signer and the *current* credential
    (`credential()` is asked again at every reconnect, so a renewed JWT is used without a restart).
    nats-py only sends a signature when some auth option is set: the empty token does that. `inbox` is
    the reply-subject prefix: a node's own (`node_inbox`), the only one its credential may read."""
    return {"signature_cb": lambda nonce: base64.b64encode(sign(nonce.encode())),
            "user_jwt_cb": lambda: credential().jwt.encode(), "token": lambda: "", "inbox_prefix": inbox}
