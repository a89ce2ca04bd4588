"""Community hubs: a LAN party's or a lab's nats-server, a NATS leaf node of the board, so that one
WAN connection carries the board traffic of every node behind it.

What NATS gives (docs.nats.io, "Leaf Nodes"): a leaf node authenticates to the board with ONE user
credential, and everything crossing that connection is bounded by that user's permissions on the
board's side ("subjects the user is allowed to publish are exported to the cluster, subjects it may
subscribe to are imported into the leaf"). The board's server cannot tell which node behind the
leaf sent a message: per-node isolation *through* a leaf is not something NATS can enforce at the
board. So the bound is layered, each layer on the board's side or on a signature:

1. The hub's credential (`issue_hub`, signed by the bootstrap's nodes account) allows exactly the
   union of its members' own node permissions: each member's key subject, the board's two read
   calls, receipts, and only the members' inboxes to read. Nobody else's key can be written through
   the hub, whatever its server does: the board refuses it ("permissions violation").
2. A member is in that union only with its own consent: a signature by the member's key over the
   hub's key and an expiry (`member_proof`), checked by the issuer. A hub cannot claim a stranger.
3. Every frame is still signed by its node: readers keep checking origin = signer
   (board.BoardReader), so a hub, or a member behind it, writing another member's key can at worst
   displace that member's frame (which a relaying hub could also do by dropping it), never forge it.
4. An honest hub runs its own server in operator mode with the swarm's public account claims, so
   each node behind it logs in with its own bootstrap-issued credential, and the hub's server
   enforces per node what the board would (its own key only): `hub_server_config`.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engine.swarm.board import SUBJECT_PREFIX
from engine.swarm.identity import Identity, is_peer_id, verify
from engine.swarm.nats_auth import (
    _ACCOUNT_LIMITS,
    MAX_NODE_SUBSCRIPTIONS,
    Authority,
    Credential,
    board_permissions,
    crc16,
    decode_jwt,
    encode_jwt,
    nkey,
    nkey_public,
)

HUB_KEY_FILE = "hub-leaf.key"  # the hub's leaf-connection key (raw ed25519 seed, base64url), mode 0600
PROOF_CONTEXT = b"sapo-hub-member\0"
MAX_MEMBERS = 256  # one hub's nodes at most (its JWT lists each one's subjects)
MAX_CREDENTIAL_FILE_BYTES = 1 << 20
_SEED_PREFIX = 18 << 3  # NKey seeds: 'S' + the key's kind


def nkey_seed(kind: str, key: Ed25519PrivateKey) -> str:
    """The NKey seed text ("SU…" for a user) of an ed25519 private key, as .creds files hold it."""
    kinds = {"O": 14 << 3, "A": 0, "U": 20 << 3}
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    data = bytes([_SEED_PREFIX | kinds[kind] >> 5, (kinds[kind] & 31) << 3]) + raw
    return base64.b32encode(data + crc16(data).to_bytes(2, "little")).decode().rstrip("=")


def creds_text(jwt: str, seed: str) -> str:
    """A NATS .creds file: the user JWT and the seed that signs the server's nonce."""
    return (f"-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n"
            f"-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n")


def public_nkey(key: Ed25519PrivateKey) -> str:
    return nkey("U", key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def load_or_create_hub_key(data_dir: Path) -> Ed25519PrivateKey:
    """The hub's own key (its identity on the board), kept in data_dir like a node's."""
    path = Path(data_dir) / HUB_KEY_FILE
    if path.is_file():
        raw = base64.urlsafe_b64decode(path.read_text().strip() + "==")
        if len(raw) != 32:
            raise ValueError(f"{path}: not a hub key")
        return Ed25519PrivateKey.from_private_bytes(raw)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(base64.urlsafe_b64encode(raw).decode())
    return key


def _proof_bytes(peer_id: str, hub: str, expires_at: int) -> bytes:
    return PROOF_CONTEXT + f"{peer_id}\0{hub}\0{expires_at}".encode()


def member_proof(identity: Identity, hub: str, expires_at: float) -> dict[str, Any]:
    """A node's consent to be served by the hub with user NKey `hub` until `expires_at`."""
    nkey_public(hub)
    expires = int(expires_at)
    sig = base64.urlsafe_b64encode(identity.sign(_proof_bytes(identity.peer_id, hub, expires))).decode().rstrip("=")
    return {"peer": identity.peer_id, "hub": hub, "expires": expires, "sig": sig}


def check_member_proof(proof: object, hub: str, now: float | None = None) -> tuple[str, int]:
    """A member proof's (peer id, expiry), or ValueError: malformed, for another hub, expired, forged."""
    if not isinstance(proof, dict) or set(proof) != {"peer", "hub", "expires", "sig"}:
        raise ValueError("a member proof is {peer, hub, expires, sig}")
    peer, expires, sig = proof["peer"], proof["expires"], proof["sig"]
    if not is_peer_id(peer) or isinstance(expires, bool) or not isinstance(expires, int) \
            or not isinstance(sig, str) or len(sig) > 100:
        raise ValueError("a member proof with a malformed field")
    if proof["hub"] != hub:
        raise ValueError(f"member {peer[:12]}… consented to another hub")
    if expires <= (now or time.time()):
        raise ValueError(f"member {peer[:12]}…'s consent has expired")
    try:
        signature = base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4))
    except ValueError as exc:
        raise ValueError("a member proof's signature is not base64url") from exc
    if not verify(peer, signature, _proof_bytes(peer, hub, expires)):
        raise ValueError(f"member {peer[:12]}…'s proof is not signed by its key")
    return peer, expires


def hub_permissions(members: Sequence[str], stream: str, prefix: str = SUBJECT_PREFIX) -> dict[str, Any]:
    """The union of the members' own node permissions, and nothing else."""
    pub: list[str] = []
    sub: list[str] = []
    for peer in members:
        perms = board_permissions(peer, stream, prefix)
        pub += [s for s in perms["pub"]["allow"] if s not in pub]
        sub += [s for s in perms["sub"]["allow"] if s not in sub]
    return {"pub": {"allow": pub}, "sub": {"allow": sub}}


def issue_hub(authority: Authority, hub: str, proofs: Sequence[object], ttl_s: float,
              now: float | None = None) -> Credential:
    """The hub's leaf credential: a user in the nodes' account, leaf connections only, bounded to its
    consenting members' permissions, expiring no later than the first member's consent."""
    now = now or time.time()
    nkey_public(hub)
    if not 1 <= len(proofs) <= MAX_MEMBERS:
        raise ValueError(f"a hub serves 1 to {MAX_MEMBERS} members")
    checked = [check_member_proof(proof, hub, now) for proof in proofs]
    members = sorted({peer for peer, _ in checked})
    expires = min([now + ttl_s, *(exp for _, exp in checked)])
    nats = {"type": "user", "version": 2, **hub_permissions(members, authority.stream, authority.prefix),
            "subs": MAX_NODE_SUBSCRIPTIONS * len(members) + 8, "data": -1,
            "payload": authority.quota.max_payload_bytes, "allowed_connection_types": ["LEAFNODE"]}
    jwt = encode_jwt(authority.account, "A", hub, "hub", nats, expires, now)
    return Credential(jwt, expires)


def hub_account_jwt(authority: Authority) -> str:
    """The nodes' account as a hub's server holds it: no imports (the stream is behind the leaf), the
    same message bound. Public: it lets the hub check its nodes' credentials, not issue them."""
    claims = {"limits": {**_ACCOUNT_LIMITS, "payload": authority.quota.max_payload_bytes}}
    return encode_jwt(authority.operator, "O", authority.account_nkey, "nodes",
                      {"type": "account", "version": 2, **claims})


@dataclass(frozen=True)
class HubCredential:
    """What the bootstrap's operator hands a hub's operator (a JSON file; nothing in it is secret)."""

    jwt: str  # the leaf user JWT (issue_hub)
    operator_jwt: str  # the swarm's operator, for the hub's server to check its nodes' JWTs
    account_jwt: str  # the nodes' account (hub_account_jwt)
    members: tuple[str, ...]
    expires_at: float

    def to_json(self) -> str:
        return json.dumps({"v": 1, "jwt": self.jwt, "operator_jwt": self.operator_jwt,
                           "account_jwt": self.account_jwt, "members": list(self.members),
                           "expires": self.expires_at})

    @classmethod
    def from_json(cls, text: str, hub: str) -> HubCredential:
        """Parse and check a credential file for the hub with user NKey `hub`; ValueError otherwise."""
        if len(text) > MAX_CREDENTIAL_FILE_BYTES:
            raise ValueError("a hub credential file is at most 1 MiB")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a hub credential (JSON: {exc.msg})") from exc
        if not isinstance(data, dict) or data.get("v") != 1 or not all(
                isinstance(data.get(k), str) for k in ("jwt", "operator_jwt", "account_jwt")):
            raise ValueError("not a hub credential (v 1 with jwt, operator_jwt, account_jwt)")
        operator = decode_jwt(data["operator_jwt"])
        account = decode_jwt(data["account_jwt"], operator["iss"])
        claims = decode_jwt(data["jwt"], account.get("sub"))
        if claims.get("sub") != hub:
            raise ValueError("this hub credential was issued to another hub key")
        members = data.get("members")
        if not isinstance(members, list) or not all(is_peer_id(m) for m in members):
            raise ValueError("a hub credential's members are peer ids")
        expires = claims.get("exp")
        if not isinstance(expires, int) or expires <= time.time():
            raise ValueError("this hub credential has expired: ask the bootstrap's operator for a new one")
        return cls(data["jwt"], data["operator_jwt"], data["account_jwt"], tuple(members), float(expires))


def make_hub_credential(authority: Authority, hub: str, proofs: Sequence[object], ttl_s: float) -> HubCredential:
    cred = issue_hub(authority, hub, proofs, ttl_s)
    op = encode_jwt(authority.operator, "O", authority.operator_nkey, "sapo-swarm", {"type": "operator", "version": 2})
    members = tuple(sorted(check_member_proof(p, hub)[0] for p in proofs))
    return HubCredential(cred.jwt, op, hub_account_jwt(authority), members, cred.expires_at)


def _quoted(url: str) -> str:
    if any(ch in url for ch in '"\\\n '):
        raise ValueError(f"{url!r}: a board URL may not hold quotes, backslashes, spaces or line breaks")
    return f'"{url}"'


def hub_server_config(cred: HubCredential, creds_file: Path, board_urls: Sequence[str]) -> str:
    """nats-server lines of a hub: operator mode with the swarm's public claims (each local node logs
    in with its own credential), and one leaf connection to the board as the hub's user."""
    if not board_urls:
        raise ValueError("a hub needs the board's leaf node URL (nats-leaf://host:port)")
    for url in board_urls:
        if not url.startswith(("nats-leaf://", "nats://", "tls://", "ws://", "wss://")):
            raise ValueError(f"{url}: the board's leaf URL is nats-leaf://, tls://, ws:// or wss://")
    account = decode_jwt(cred.account_jwt)["sub"]
    urls = ", ".join(_quoted(u) for u in board_urls)
    path = _quoted(Path(creds_file).resolve().as_posix())
    return "\n".join([f'operator: "{cred.operator_jwt}"', "resolver: MEMORY", "resolver_preload: {",
                      f'  {account}: "{cred.account_jwt}"', "}", "leafnodes {", "  remotes: [",
                      f"    {{ urls: [{urls}], credentials: {path}, account: {account} }}", "  ]", "}"]) + "\n"
