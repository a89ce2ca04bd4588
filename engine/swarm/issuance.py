"""How many new identities a bootstrap credentials for the board (sans-I/O, clock passed in).

Identities are free: a client can say hello with a fresh key, take its credential and reconnect, each
key a new board writer with its own per-key quota. So a key this bootstrap has not credentialed before
is charged against a token bucket of its source address (a household behind one NAT runs a few nodes)
and one for the whole bootstrap. Keys already credentialed (a renewal, a node reconnecting) are not
charged: they are remembered in a bounded LRU. The per-address table is bounded too, and an address
forgotten under churn gets a full bucket again, which the global bucket stands behind.
"""

from __future__ import annotations

import ipaddress
import math
from collections import OrderedDict
from dataclasses import dataclass

from engine.swarm.limits import KeyedBuckets, TokenBucket


def address_key(ip: str) -> str:
    """The unit charged for new identities: an IPv4 address, or an IPv6 /64 (one subscriber's
    network: a host on it can take any of 2^64 addresses)."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


@dataclass(frozen=True)
class Refusal:
    """A new identity refused: whose bucket was empty ("address" or "global") and when to try again."""

    scope: str
    retry_after_s: int

    @property
    def reason(self) -> str:
        """What the refused node is told (a bye's reason: 128 characters at most)."""
        who = "from your address" if self.scope == "address" else "joining this swarm right now"
        return f"too many new identities {who}; try again in {self.retry_after_s} s"


class IdentityGate:
    """Admits or refuses a credential for a key, by what it costs: nothing for a known key, one token
    of its address and one of the global bucket for a new one (taken together or not at all)."""

    def __init__(self, *, per_ip_burst: int, per_ip_interval_s: float, burst: int, rate_per_s: float,
                 known: int, addresses: int, now: float) -> None:
        self._per_ip = KeyedBuckets(1.0 / per_ip_interval_s, per_ip_burst, addresses)
        self._global = TokenBucket.full(rate_per_s, burst, now)
        self._known: OrderedDict[str, None] = OrderedDict()  # keys credentialed, least recent first
        self._max_known = known
        self.refused = {"address": 0, "global": 0}

    def admit(self, peer_id: str, ip: str, now: float) -> Refusal | None:
        """None: credential it (and it is known from now on); else why not, counted."""
        if peer_id in self._known:
            self.remember(peer_id)
            return None
        local = self._per_ip.bucket(address_key(ip), now)
        for bucket in (local, self._global):
            bucket.take(now, 0.0)  # refill only: a refusal by one bucket must not spend the other's token
        for scope, bucket in (("address", local), ("global", self._global)):
            if bucket.tokens < 1.0:
                self.refused[scope] += 1
                return Refusal(scope, max(1, math.ceil((1.0 - bucket.tokens) / bucket.rate)))
        local.take(now)
        self._global.take(now)
        self.remember(peer_id)
        return None

    def remember(self, peer_id: str) -> None:
        """Mark a key credentialed (most recently used): its renewals and reconnections cost nothing."""
        self._known[peer_id] = None
        self._known.move_to_end(peer_id)
        while len(self._known) > self._max_known:
            self._known.popitem(last=False)

    def __contains__(self, peer_id: str) -> bool:
        return peer_id in self._known

    def stats(self) -> dict[str, int]:
        return {"known_identities": len(self._known), "addresses_tracked": len(self._per_ip),
                "refused_address": self.refused["address"], "refused_global": self.refused["global"]}
