"""A node's identity: an ed25519 key in the data dir, the peer id derived from it, a human name.

The key file (`identity.key`, PKCS#8 PEM, mode 0600) is created on first run. The peer id is the raw
public key in base64url without padding (43 characters); the name (adjective-animal) is derived from
the id so every peer computes the same name. `instance` is random per process: two processes that
present the same peer id with different instances are a copied data dir (see DuplicateIdentityError).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import os
import secrets
import stat
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from engine.swarm.errors import IdentityError

KEY_FILE = "identity.key"
PEER_ID_LEN = 43  # base64url of 32 bytes, unpadded
SIG_LEN = 86  # base64url of 64 bytes, unpadded

_ADJECTIVES = (
    "amber", "brave", "calm", "clever", "coral", "cosmic", "crisp", "daring", "dusty", "eager",
    "fancy", "fierce", "fuzzy", "gentle", "gilded", "glad", "golden", "grand", "happy", "hazel",
    "honest", "humble", "icy", "jolly", "keen", "kind", "lively", "lucky", "lunar", "mellow",
    "merry", "misty", "modest", "nimble", "noble", "olive", "plucky", "polar", "proud", "quick",
    "quiet", "rapid", "rosy", "rustic", "sandy", "shiny", "silent", "silver", "sleek", "sly",
    "snowy", "solar", "spry", "stout", "sunny", "swift", "tidy", "tiny", "vivid", "wise",
    "witty", "woolly", "zany", "zesty",
)
_ANIMALS = (
    "alpaca", "badger", "beaver", "bison", "bobcat", "camel", "caribou", "cheetah", "cobra", "condor",
    "coyote", "crane", "dingo", "dolphin", "eagle", "egret", "falcon", "ferret", "finch", "gazelle",
    "gecko", "gibbon", "heron", "hyena", "ibis", "iguana", "jackal", "jaguar", "kestrel", "koala",
    "lemur", "leopard", "lynx", "macaw", "marmot", "marten", "mole", "moose", "narwhal", "newt",
    "ocelot", "orca", "osprey", "otter", "owl", "panda", "parrot", "pelican", "puffin", "python",
    "quail", "raven", "salmon", "seal", "shrew", "stork", "tapir", "tiger", "toucan", "turtle",
    "viper", "walrus", "wombat", "yak",
)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str, size: int) -> bytes | None:
    """Strict base64url (unpadded) of exactly `size` bytes, or None. Never raises on bad input."""
    if not isinstance(text, str) or len(text) != (size * 4 + 2) // 3:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    # Re-encode to reject non-canonical spellings (stray bits in the last character).
    return raw if len(raw) == size and b64url(raw) == text else None


def is_peer_id(text: object) -> bool:
    return isinstance(text, str) and b64url_decode(text, 32) is not None


def name_for(peer_id: str) -> str:
    """Human name derived from a peer id: every node computes the same one."""
    digest = hashlib.sha256(peer_id.encode("utf-8")).digest()
    return f"{_ADJECTIVES[digest[0] % len(_ADJECTIVES)]}-{_ANIMALS[digest[1] % len(_ANIMALS)]}"


@functools.lru_cache(maxsize=4096)
def _public_key(peer_id: str) -> Ed25519PublicKey | None:
    raw = b64url_decode(peer_id, 32)
    if raw is None:
        return None
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return None


def verify(peer_id: str, signature: bytes, data: bytes) -> bool:
    """True iff `signature` is peer_id's ed25519 signature of `data`."""
    key = _public_key(peer_id)
    if key is None or len(signature) != 64:
        return False
    try:
        key.verify(signature, data)
    except InvalidSignature:
        return False
    return True


class Identity:
    """An ed25519 key pair plus the peer id and name derived from it."""

    def __init__(self, private_key: Ed25519PrivateKey, path: Path | None = None) -> None:
        self._key = private_key
        self.path = path  # where the key lives (None: in memory only, e.g. a bootstrap or a bench)
        raw = private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.peer_id: str = b64url(raw)
        self.name: str = name_for(self.peer_id)
        self.instance: str = secrets.token_hex(8)  # random per process: tells copies of one key apart

    def __repr__(self) -> str:
        return f"Identity({self.name}, {self.peer_id[:12]}…)"

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)

    def private_seed(self, label: str, bits: int = 62) -> int:
        """A number only this key's holder can compute (ed25519 signs deterministically): e.g. the seed
        of this node's held-out judge, which no peer can name a question of."""
        if not 1 <= bits <= 256:
            raise ValueError("bits must be in [1, 256]")
        digest = hashlib.sha256(b"sapo-private-seed\0" + self._key.sign(label.encode("utf-8"))).digest()
        return int.from_bytes(digest, "big") >> (256 - bits)

    @classmethod
    def generate(cls) -> Identity:
        """A fresh key that is never written to disk."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, data_dir: Path | str) -> Identity:
        """Load `identity.key` from data_dir, creating it (mode 0600) on first run."""
        path = Path(data_dir) / KEY_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        try:
            # O_EXCL: two processes starting at once cannot both create (and one overwrite) the key.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return cls(_read_key(path), path)
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
            handle.flush()
            os.fsync(handle.fileno())
        return cls(key, path)


def _read_key(path: Path) -> Ed25519PrivateKey:
    try:
        mode = path.stat().st_mode
        if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
            # A copy made with a loose umask: the key is private, so tighten it rather than refuse.
            os.chmod(path, 0o600)
        data = path.read_bytes()
    except OSError as exc:
        raise IdentityError(f"cannot read identity key {path}: {exc.strerror or exc}") from exc
    if len(data) > 4096:
        raise IdentityError(f"identity key {path} is not an ed25519 key (file too large)")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise IdentityError(
            f"identity key {path} is unreadable ({exc}); move it away to create a new identity"
        ) from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(f"identity key {path} is not an ed25519 key; move it away to create a new one")
    return key
