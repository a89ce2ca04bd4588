"""LanDiscovery: the swarm service's mDNS glue. It picks the interfaces to announce on, keeps the latest
record of each peer of its swarm found on the LAN (bounded by max_connections, so a LAN flooding us with
announcements cannot spawn unbounded dialers) and asks the service to dial each new one. Nodes of other
swarms (`SwarmConfig.swarm_name`) are not peers: `MdnsService` never reports them.

A copy of this node's identity announced on the LAN is detected by `MdnsService`; here it only becomes
a warning (the peer seen later) or the error `start` raises (the copy was there first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.swarm.config import DEFAULT_SWARM
from engine.swarm.errors import DuplicateIdentityError
from engine.swarm.identity import Identity
from engine.swarm.mdns import MdnsPeer, MdnsService, pick_interfaces, system_interfaces


@dataclass(eq=False)
class LanDiscovery:
    """Runs on the service's asyncio loop. `dial(peer)` is called once per newly found peer id (the
    service ignores it once it is stopping)."""

    identity: Identity
    model: str
    tasks: str
    max_peers: int
    dial: Callable[[MdnsPeer], None]
    log: Callable[[str, str], None]
    swarm: str = DEFAULT_SWARM
    peers: dict[str, MdnsPeer] = field(default_factory=dict, init=False)  # peer id -> latest mDNS record
    _mdns: MdnsService | None = field(default=None, init=False)

    def interfaces(self, wanted: Sequence[str] | None) -> list[str]:
        """The interfaces to announce on (`wanted`, or every usable one); a warning when none is."""
        addrs, up = system_interfaces()
        chosen = pick_interfaces(addrs, up, wanted)
        if not chosen:
            self.log("warning", "swarm: mDNS found no usable network interface (virtual bridges and VPNs "
                      "are skipped); set mdns_interfaces to choose one, or use a bootstrap server")
        return chosen

    async def start(self, port: int, interfaces: list[str]) -> None:
        """Announce and browse. Raises DuplicateIdentityError when a copy of us is already announced."""
        if not interfaces:
            return
        self._mdns = MdnsService(self.identity, port, self.model, self.tasks, interfaces,
                                 self._found, self.lost, self._duplicate, swarm=self.swarm)
        try:
            await self._mdns.start()
        except DuplicateIdentityError:
            self._mdns = None
            raise

    async def stop(self) -> None:
        """Say goodbye on the LAN."""
        if self._mdns is not None:
            await self._mdns.stop()
            self._mdns = None

    @property
    def foreign_count(self) -> int:
        """Other swarms' announcements under our mDNS type, ignored (0 when mDNS is off)."""
        return self._mdns.foreign_count if self._mdns is not None else 0

    def record(self, peer_id: str) -> MdnsPeer | None:
        """The latest record of a peer on the LAN; None once it has left."""
        return self.peers.get(peer_id)

    def lost(self, peer_id: str) -> None:
        self.peers.pop(peer_id, None)

    def _found(self, peer: MdnsPeer) -> None:
        known = peer.peer_id in self.peers
        if not known and len(self.peers) >= self.max_peers:
            return
        self.peers[peer.peer_id] = peer
        if not known:
            self.dial(peer)

    def _duplicate(self, url: str) -> None:
        self.log("warning", f"swarm: mDNS shows another node with this node's identity at {url} "
                  "(copied data dir?); the one started later will leave the swarm when they meet")


def advertised_host(listen_host: str) -> str:
    """A host peers can dial when no interface was chosen for mDNS."""
    if listen_host not in ("0.0.0.0", "::", ""):
        return listen_host
    addrs, up = system_interfaces()
    usable = pick_interfaces(addrs, up, None)
    return usable[0] if usable else "127.0.0.1"
