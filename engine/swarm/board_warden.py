"""The board's warden: a publishing budget per node and per address, which NATS does not enforce itself.

Identities are free, and a credential lets a node publish as fast as its link allows (7,008 puts/s,
137 MiB/s were accepted from one node; a flood into a node's receipts inbox cut its rounds by 2/3).
The bootstrap reads its nats-server's connection table (`/connz` on the loopback monitoring port)
every few seconds, charges each connection's new messages and bytes to its user (the node's key) and
to its address, and revokes a user that goes over budget: the nodes' account JWT is signed again with
that key in its revocation list and pushed to the server through the system account, which closes the
user's connections and refuses every credential of that key issued before then. The bootstrap issues
that key nothing more for `ban_s`. An address over its budget has all its users revoked: identities
are free, addresses are not. Bans are kept in a file (the bootstrap's data dir) and pushed again to a
server that starts afresh: a restart (of the bootstrap, or of its nats-server) lifts none of them.

`Warden` judges (sans-I/O, on hand-built connection tables in tests); `run_warden` is the glue.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.swarm.identity import b64url
from engine.swarm.limits import KeyedBuckets
from engine.swarm.nats_auth import Authority, connect_options, nkey_public
from engine.swarm.nats_board import admin_board, quiet_errors

MiB = 1 << 20
BANS_FILE = "board-bans.json"  # in the bootstrap's data dir: user NKey -> banned until (unix time)


@dataclass(frozen=True)
class WardenConfig:
    """Publishing budgets on the board. An honest node publishes one frame, a few reads and a receipt
    per round: ~40 KB/s and ~80 messages/s for the seed model's fast rounds, far less for SmolLM2."""

    user_bytes_per_s: float = 1 * MiB  # a node's sustained publishing
    user_burst_bytes: float = 16 * MiB  # and what it may publish in a burst
    user_msgs_per_s: float = 400.0  # messages per second (reads are small but many)
    user_burst_msgs: float = 4000.0
    address_bytes_per_s: float = 8 * MiB  # all nodes behind one address together
    address_burst_bytes: float = 64 * MiB
    ban_s: float = 3600.0  # a revoked node gets no credential for this long
    every_s: float = 2.0  # how often the connection table is read
    max_tracked: int = 65536  # users, addresses and connections remembered (LRU)

    def __post_init__(self) -> None:
        for name in ("user_bytes_per_s", "user_burst_bytes", "user_msgs_per_s", "user_burst_msgs",
                     "address_bytes_per_s", "address_burst_bytes", "ban_s", "every_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"WardenConfig.{name} must be a positive number")
        if isinstance(self.max_tracked, bool) or not isinstance(self.max_tracked, int) or self.max_tracked < 16:
            raise ValueError("WardenConfig.max_tracked must be an int >= 16")


@dataclass(frozen=True)
class Offence:
    user: str  # the user's NKey (a node's key)
    address: str
    why: str  # in words, for the operator's log


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class Warden:
    """Charges connection-table deltas to users and addresses; says who went over. Not thread-safe."""

    def __init__(self, cfg: WardenConfig | None = None, clock: Callable[[], float] = time.monotonic,
                 store: Path | None = None, wall: Callable[[], float] = time.time) -> None:
        self.cfg = cfg = cfg or WardenConfig()
        self.clock, self.wall = clock, wall
        self.store = store  # where bans outlive a restart (None: in memory only)
        self.store_error = ""  # why the last save failed ("" when it worked): bans still hold in memory
        self._seen: OrderedDict[int, tuple[int, int]] = OrderedDict()  # cid -> (in_msgs, in_bytes) last read
        self._user_bytes = KeyedBuckets(cfg.user_bytes_per_s, cfg.user_burst_bytes, cfg.max_tracked)
        self._user_msgs = KeyedBuckets(cfg.user_msgs_per_s, cfg.user_burst_msgs, cfg.max_tracked)
        self._address_bytes = KeyedBuckets(cfg.address_bytes_per_s, cfg.address_burst_bytes, cfg.max_tracked)
        self._banned: OrderedDict[str, float] = OrderedDict()  # user NKey -> banned until (clock)
        self.revoked = 0
        if store is not None:
            self._load(store)

    def observe(self, connections: Sequence[object]) -> list[Offence]:
        """One read of the connection table (connz's `connections`) -> users to revoke now."""
        now = self.clock()
        offences: dict[str, Offence] = {}
        users_at: dict[str, set[str]] = {}
        for conn in connections:
            if not isinstance(conn, dict):
                continue
            user, address, cid = conn.get("authorized_user"), conn.get("ip"), conn.get("cid")
            if not isinstance(user, str) or not isinstance(address, str) or not isinstance(cid, int):
                continue
            msgs, size = _count(conn.get("in_msgs")), _count(conn.get("in_bytes"))
            last_msgs, last_size = self._seen.pop(cid, (0, 0))
            self._seen[cid] = (msgs, size)
            new_msgs, new_bytes = max(0, msgs - last_msgs), max(0, size - last_size)
            users_at.setdefault(address, set()).add(user)
            if self.banned(user):
                continue
            if not self._user_bytes.take(user, now, new_bytes):
                offences[user] = Offence(user, address, f"published over {self.cfg.user_bytes_per_s / MiB:g} MiB/s")
            elif not self._user_msgs.take(user, now, new_msgs):
                offences[user] = Offence(user, address, f"sent over {self.cfg.user_msgs_per_s:g} messages/s")
            if not self._address_bytes.take(address, now, new_bytes):
                for other in users_at[address]:
                    offences.setdefault(other, Offence(other, address, "its address published over "
                                                       f"{self.cfg.address_bytes_per_s / MiB:g} MiB/s"))
        while len(self._seen) > self.cfg.max_tracked:
            self._seen.popitem(last=False)
        for offence in offences.values():
            self._ban(offence.user, now)
        if offences:
            self._save()
        return list(offences.values())

    def ban(self, user: str, now: float) -> None:
        self._ban(user, now)
        self._save()

    def _ban(self, user: str, now: float) -> None:
        self._banned.pop(user, None)
        self._banned[user] = now + self.cfg.ban_s
        self.revoked += 1
        while len(self._banned) > self.cfg.max_tracked:
            self._banned.popitem(last=False)

    def _load(self, path: Path) -> None:
        """Bans a previous run saved; anything unreadable is skipped (a missing file: none)."""
        try:
            data = json.loads(path.read_bytes()[:64 * MiB])
        except (OSError, ValueError):
            return
        if not isinstance(data, dict):
            return
        now, wall = self.clock(), self.wall()
        for user, until in list(data.items())[-self.cfg.max_tracked:]:
            if isinstance(user, str) and isinstance(until, (int, float)) and not isinstance(until, bool) \
                    and until > wall:
                self._banned[user] = now + min(until - wall, self.cfg.ban_s)

    def _save(self) -> None:
        if self.store is None:
            return
        now, wall = self.clock(), self.wall()
        data = {user: round(wall + until - now, 1) for user, until in self._banned.items() if until > now}
        tmp = self.store.with_name(self.store.name + ".tmp")
        try:
            tmp.write_text(json.dumps(data))
            tmp.replace(self.store)
            self.store_error = ""
        except OSError as exc:  # a full disk must not stop the revocation itself
            self.store_error = str(exc) or type(exc).__name__

    def banned(self, user: str) -> bool:
        until = self._banned.get(user)
        return until is not None and until > self.clock()

    def revocations(self, wall_now: float) -> dict[str, int]:
        """The account's revocation list: banned users, each refused for JWTs issued before now."""
        now = self.clock()
        return {user: int(wall_now) + 1 for user, until in self._banned.items() if until > now}


class PurgeQueue:
    """Revoked users whose frames must come off the board. A flooder's frame that was in flight when
    the server closed its connection is stored after a purge made at once, so a user is purged on every
    read of the table while a connection of its is still listed, and once more after (sans-I/O)."""

    AFTER = 2  # purges due after a read that lists the user: that read's and the next one's

    def __init__(self) -> None:
        self._left: dict[str, int] = {}  # user NKey -> purges still due

    def add(self, users: Sequence[str]) -> None:
        for user in users:
            self._left[user] = self.AFTER

    def due(self, connections: Sequence[object]) -> list[str]:
        """Users to purge on this read of the connection table `connections`."""
        listed = {c.get("authorized_user") for c in connections if isinstance(c, dict)}
        for user in self._left:
            if user in listed:
                self._left[user] = self.AFTER
        return sorted(self._left)

    def purged(self, user: str) -> None:
        left = self._left.get(user, 0) - 1
        if left > 0:
            self._left[user] = left
        else:
            self._left.pop(user, None)

    def __len__(self) -> int:
        return len(self._left)


def read_connections(monitor_url: str, account: str, timeout_s: float = 2.0, page: int = 1024,
                     max_pages: int = 256) -> list[object]:
    """Every connection of `account` in the server's table (paged, each page bounded)."""
    out: list[object] = []
    for index in range(max_pages):
        url = f"{monitor_url}/connz?auth=true&acc={account}&limit={page}&offset={index * page}"
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            data = json.loads(resp.read(64 * MiB))
        batch = data.get("connections") if isinstance(data, dict) else None
        if not isinstance(batch, list):
            break
        out.extend(batch)
        if len(batch) < page:
            break
    return out


async def push_revocations(nc: Any, authority: Authority, revocations: dict[str, int]) -> None:
    """Sign the nodes' account again with its revocation list and hand it to the server."""
    jwt = authority.nodes_account_jwt(revocations)
    reply = await nc.request(f"$SYS.REQ.ACCOUNT.{authority.account_nkey}.CLAIMS.UPDATE", jwt.encode(), timeout=5)
    answer = json.loads(reply.data or b"{}")
    if not isinstance(answer, dict) or "error" in answer:
        raise RuntimeError(f"the server refused the revocation list: {answer}")


async def run_warden(warden: Warden, monitor_url: str, server_urls: Sequence[str], authority: Authority,
                     log: Callable[[str, str], None], tls: ssl.SSLContext | None = None) -> None:
    """Forever: read the table, revoke whoever went over budget and take its frame off the board (a
    flood's frame follows the largest gap on the board, so it would keep winning readers' draws). The
    revocation list goes to the server again whenever it may have forgotten it: at the warden's start
    (bans kept from before a restart), and when the server restarted. A failed push or purge is retried."""
    import nats
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    system_key = Ed25519PrivateKey.generate()
    system_cred = authority.system_user(system_key)
    state = {"push": bool(warden.revocations(time.time()))}

    async def server_restarted() -> None:  # a restarted server starts from its config: no revocations
        state["push"] = True

    options = (connect_options(system_key.sign, lambda: system_cred) | ({"tls": tls} if tls is not None else {})
               | {"reconnected_cb": server_restarted})
    system: Any = None
    board = admin_board(server_urls, authority, tls=tls)
    unpurged = PurgeQueue()  # revoked users whose frames are still to come off
    try:
        while True:
            offences: list[Offence] = []
            table: list[object] = []
            try:
                table = await asyncio.to_thread(read_connections, monitor_url, authority.account_nkey)
                offences = warden.observe(table)
            except Exception as exc:  # noqa: BLE001 -- the monitor is away: bans kept still go out below
                log("warning", f"board: the warden could not read the connection table ({str(exc) or type(exc).__name__})")
            for offence in offences:
                log("warning", f"board: revoked node {offence.user[:12]}… at {offence.address}: {offence.why}")
            unpurged.add([offence.user for offence in offences])
            state["push"] = state["push"] or bool(offences)
            try:
                if state["push"] and warden.revocations(time.time()):  # until a push goes through
                    if system is None or system.is_closed:
                        system = await nats.connect(servers=list(server_urls), error_cb=quiet_errors, **options)
                    await push_revocations(system, authority, warden.revocations(time.time()))
                    state["push"] = False
                due = unpurged.due(table)
                if due:
                    if board.nc is None or board.nc.is_closed:  # first offence, or the server came back
                        await board.connect()
                    for user in due:
                        await board.remove(b64url(nkey_public(user)[1]))
                        unpurged.purged(user)
            except Exception as exc:  # noqa: BLE001 -- the server is away: try again next time
                log("warning", f"board: the warden could not act ({str(exc) or type(exc).__name__})")
            await asyncio.sleep(warden.cfg.every_s)
    finally:
        await board.close()
        if system is not None and not system.is_closed:
            await system.close()
