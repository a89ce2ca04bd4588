"""Who may write which board key: NATS decentralized auth (operator → account → user JWTs).

The bootstrap holds an operator and an account key (ed25519). It runs its nats-server in operator
mode with the account preloaded, and issues each node, over the node's signed websocket link, a
short-lived user JWT whose subject is **the node's own ed25519 key** (the same 32 bytes as its swarm
peer id, in NATS's NKey encoding) and whose permissions allow publishing only to the node's own
board subject plus the two read-only JetStream calls a fetch needs. The node proves the key by
signing the server's nonce with its identity; the server enforces the rest ("permissions
violation"). Nothing here is a secret but the bootstrap's keys.

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

_PREFIX = {"O": 14 << 3, "A": 0, "U": 20 << 3}
KEYS_FILE = "nats-authority.json"
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


def board_permissions(peer_id: str, stream: str, prefix: str = SUBJECT_PREFIX) -> dict[str, Any]:
    """Publish: its own key, stream info and direct gets (reads), receipts to anyone's inbox.
    Subscribe: replies, and its own receipts inbox only."""
    from engine.swarm.receipts import RECEIPT_PREFIX, receipt_subject

    return {"pub": {"allow": [key_subject(peer_id, prefix), f"$JS.API.STREAM.INFO.{stream}",
                              f"$JS.API.DIRECT.GET.{stream}", f"{RECEIPT_PREFIX}.*"]},
            "sub": {"allow": ["_INBOX.>", receipt_subject(peer_id)]}}


_ACCOUNT_LIMITS = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True,
                   "conn": -1, "leaf": -1}
_JETSTREAM_LIMITS = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
                     "max_ack_pending": -1, "mem_max_stream_bytes": -1, "disk_max_stream_bytes": -1,
                     "max_bytes_required": False}


@dataclass(frozen=True)
class Credential:
    jwt: str
    expires_at: float


class Authority:
    """The bootstrap's operator + account (+ system account) keys, and the user JWTs it signs."""

    def __init__(self, operator: Ed25519PrivateKey, account: Ed25519PrivateKey, system: Ed25519PrivateKey) -> None:
        self.operator, self.account, self.system = operator, account, system
        self.operator_nkey = nkey("O", _raw(operator))
        self.account_nkey = nkey("A", _raw(account))
        self.system_nkey = nkey("A", _raw(system))

    @classmethod
    def generate(cls) -> Authority:
        return cls(Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, data_dir: Path) -> Authority:
        """Kept beside the bootstrap's identity: nodes' credentials survive a bootstrap restart."""
        path = Path(data_dir) / KEYS_FILE
        if path.is_file():
            data = json.loads(path.read_text())
            keys = [Ed25519PrivateKey.from_private_bytes(_unb64(data[k])) for k in ("operator", "account", "system")]
            return cls(*keys)
        auth = cls.generate()
        raw = {k: _b64(getattr(auth, k).private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                                      serialization.NoEncryption()))
               for k in ("operator", "account", "system")}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.touch(mode=0o600)
        tmp.write_text(json.dumps(raw))
        tmp.replace(path)
        return auth

    def server_config(self) -> str:
        """nats-server config lines: operator mode, the account preloaded, JetStream enabled for it."""
        op = encode_jwt(self.operator, "O", self.operator_nkey, "sapo-swarm", {"type": "operator", "version": 2})
        account = encode_jwt(self.operator, "O", self.account_nkey, "swarm",
                             {"type": "account", "version": 2, "limits": {**_ACCOUNT_LIMITS, **_JETSTREAM_LIMITS}})
        system = encode_jwt(self.operator, "O", self.system_nkey, "SYS",
                            {"type": "account", "version": 2, "limits": _ACCOUNT_LIMITS})
        return (f'operator: "{op}"\nsystem_account: {self.system_nkey}\nresolver: MEMORY\n'
                f'resolver_preload: {{\n  {self.account_nkey}: "{account}"\n  {self.system_nkey}: "{system}"\n}}\n')

    def issue(self, peer_id: str, stream: str, ttl_s: float, prefix: str = SUBJECT_PREFIX,
              now: float | None = None) -> Credential:
        """A node's board credential: write its own key only, for ttl_s."""
        now = now or time.time()
        nats = {"type": "user", "version": 2, **board_permissions(peer_id, stream, prefix),
                "subs": -1, "data": -1, "payload": -1}
        expires = now + ttl_s
        return Credential(encode_jwt(self.account, "A", user_nkey_of(peer_id), "node", nats, expires, now), expires)

    def admin(self, key: Ed25519PrivateKey, ttl_s: float = 10 * 365 * 86400.0) -> Credential:
        """The bootstrap's own user (creates and updates the board's stream)."""
        expires = time.time() + ttl_s
        nats = {"type": "user", "version": 2, "pub": {"allow": [">"]}, "sub": {"allow": [">"]},
                "subs": -1, "data": -1, "payload": -1}
        return Credential(encode_jwt(self.account, "A", nkey("U", _raw(key)), "bootstrap", nats, expires), expires)


def connect_options(sign: Any, credential: Any) -> dict[str, Any]:
    """nats-py options that authenticate with an ed25519 signer and the *current* credential
    (`credential()` is asked again at every reconnect, so a renewed JWT is used without a restart).
    nats-py only sends a signature when some auth option is set: the empty token does that."""
    return {"signature_cb": lambda nonce: base64.b64encode(sign(nonce.encode())),
            "user_jwt_cb": lambda: credential().jwt.encode(), "token": lambda: ""}
