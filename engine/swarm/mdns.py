"""LAN discovery: announce `_sapo._tcp.local.` and browse for peers of the same swarm (zeroconf, asyncio).

Interfaces are chosen on purpose (an exo lesson): docker/VM bridges, VPN tunnels and link-local
addresses are skipped unless named in the config, because announcing there makes peers dial
addresses nobody can reach. TXT record: v (protocol), id (peer id), inst (process instance), port,
model, tasks (task-library version), swarm (swarm name; absent = the default swarm). Goodbye packets go
out on stop.

Swarms: the default swarm announces `_sapo._tcp.local.`; any other swarm its own type
`_sapo-<hash of the name>._tcp.local.`, so it neither browses nor resolves the default swarm's nodes, and
builds that predate swarm names (they browse `_sapo._tcp` only and would dial whatever they find there)
never see it. The TXT `swarm` key is checked too: an announcement under our type from another swarm (a
hash collision, a crafted record) is ignored and counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.swarm.config import DEFAULT_SWARM, SWARM_NAME
from engine.swarm.identity import Identity, is_peer_id
from engine.swarm.protocol import PROTOCOL_VERSION
from engine.swarm.wire import INSTANCE

SERVICE_TYPE = "_sapo._tcp.local."  # the default swarm's
RESOLVE_TIMEOUT_MS = 3000
# Before announcing, ask the LAN for our own service name with multicast answers for this long. zeroconf's
# own probe asks for *unicast* answers (QU): on one host, with several mDNS sockets sharing port 5353, the
# kernel hands a unicast answer to one of them only, often not to the copy that asked, so a copy started on
# the same machine (a copied data dir) went unnoticed. A multicast answer reaches every socket.
DUPLICATE_PROBE_MS = 1500
MAX_TXT_VALUE = 200
MAX_FOREIGN = 4096  # foreign-swarm service names remembered (for the count); bounded against a churning LAN
# Interface name prefixes that are virtual bridges, container veths, VPN tunnels or Apple P2P links.
VIRTUAL_PREFIXES = ("docker", "br-", "veth", "virbr", "vmnet", "vboxnet", "cni", "flannel", "cali",
                    "kube", "podman", "lxc", "lxd", "tun", "tap", "utun", "wg", "zt", "tailscale",
                    "ham", "awdl", "llw", "anpi", "bridge", "vnic", "vEthernet")


def pick_interfaces(addresses: Mapping[str, Sequence[str]], up: Mapping[str, bool],
                    configured: Sequence[str] | None) -> list[str]:
    """IPv4 addresses to announce on. `addresses`: interface name -> its IPv4 addresses.

    configured: names or addresses to use as given (loopback and virtual included); None = auto:
    every interface that is up, not loopback, not virtual, with a routable (non link-local) address.
    """
    chosen: list[str] = []
    if configured is not None:
        for item in configured:
            if item in addresses:
                chosen.extend(addresses[item])
            elif _is_ipv4(item):
                chosen.append(item)
        return list(dict.fromkeys(chosen))
    for name, addrs in sorted(addresses.items()):
        if not up.get(name, False) or name.startswith(VIRTUAL_PREFIXES):
            continue
        for addr in addrs:
            ip = ipaddress.ip_address(addr)
            if not (ip.is_loopback or ip.is_link_local or ip.is_unspecified):
                chosen.append(addr)
    return chosen


def _is_ipv4(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv4Address)
    except ValueError:
        return False


def system_interfaces() -> tuple[dict[str, list[str]], dict[str, bool]]:
    """This machine's interfaces: name -> IPv4 addresses, name -> is up."""
    import socket

    import psutil

    addrs = {name: [a.address for a in entries if a.family == socket.AF_INET]
             for name, entries in psutil.net_if_addrs().items()}
    up = {name: stats.isup for name, stats in psutil.net_if_stats().items()}
    return addrs, up


def service_type(swarm: str) -> str:
    """The DNS-SD type a swarm announces: `_sapo._tcp.local.` for the default one, else one of its own.
    10 hex digits of the name's hash keep the service label within DNS-SD's 15 characters."""
    if swarm == DEFAULT_SWARM:
        return SERVICE_TYPE
    return f"_sapo-{hashlib.sha256(swarm.encode()).hexdigest()[:10]}._tcp.local."


@dataclass(frozen=True)
class MdnsPeer:
    """A peer found on the LAN."""

    peer_id: str
    instance: str
    url: str  # ws://address:port to dial
    model: str
    tasks: str
    service_name: str
    swarm: str = DEFAULT_SWARM


def txt_properties(identity: Identity, port: int, model: str, tasks: str,
                   swarm: str = DEFAULT_SWARM) -> dict[str, str]:
    return {"v": str(PROTOCOL_VERSION), "id": identity.peer_id, "inst": identity.instance,
            "port": str(port), "model": model[:MAX_TXT_VALUE], "tasks": tasks[:MAX_TXT_VALUE], "swarm": swarm}


def parse_service(name: str, properties: Mapping[bytes, bytes | None], addresses: Sequence[str],
                  port: int | None) -> MdnsPeer | None:
    """Validate a resolved service (untrusted LAN input); None when unusable."""
    def text(key: bytes) -> str:
        value = properties.get(key)
        if value is None or len(value) > MAX_TXT_VALUE:
            return ""
        return value.decode("utf-8", "replace")

    if text(b"v") != str(PROTOCOL_VERSION) or not is_peer_id(text(b"id")):
        return None
    instance = text(b"inst")
    swarm = text(b"swarm") if b"swarm" in properties else DEFAULT_SWARM  # builds before swarm names
    ipv4 = [a for a in addresses if _is_ipv4(a)]
    if not INSTANCE.fullmatch(instance) or not SWARM_NAME.fullmatch(swarm) or not ipv4 or port is None \
            or not 0 < port < 65536:
        return None
    return MdnsPeer(text(b"id"), instance, f"ws://{ipv4[0]}:{port}", text(b"model"), text(b"tasks"), name,
                    swarm)


class MdnsService:
    """Announces this node in `swarm` and reports its peers found (`on_found`) and gone (`on_lost`, by
    peer id); other swarms' announcements are ignored (`foreign_count`).

    A service carrying our own id from another process is a copied identity: `on_duplicate` fires.
    """

    def __init__(self, identity: Identity, port: int, model: str, tasks: str, interfaces: list[str],
                 on_found: Callable[[MdnsPeer], None], on_lost: Callable[[str], None],
                 on_duplicate: Callable[[str], None], swarm: str = DEFAULT_SWARM) -> None:
        self.identity, self.port, self.model, self.tasks = identity, port, model, tasks
        self.interfaces = interfaces
        self.swarm = swarm
        self.service_type = service_type(swarm)
        self._on_found, self._on_lost, self._on_duplicate = on_found, on_lost, on_duplicate
        self._zc: Any = None
        self._browser: Any = None
        self._info: Any = None
        self._names: dict[str, str] = {}  # service name -> peer id
        self._removals: dict[str, int] = {}  # service name -> goodbyes seen (a resolve begun earlier is stale)
        self._resolving: set[asyncio.Task[None]] = set()
        self._foreign: set[str] = set()  # service names under our type announcing another swarm

    @property
    def service_name(self) -> str:
        return f"{self.identity.name}-{self.identity.peer_id[:8]}.{self.service_type}"

    @property
    def foreign_count(self) -> int:
        """Announcements of other swarms live under our service type (ignored, not dialled)."""
        return len(self._foreign)

    async def start(self) -> None:
        """Register and browse. A live service with our name raises DuplicateIdentityError."""
        from zeroconf import IPVersion, NonUniqueNameException
        from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

        from engine.swarm.errors import DuplicateIdentityError

        self._zc = AsyncZeroconf(interfaces=self.interfaces, ip_version=IPVersion.V4Only)
        if await self._name_is_live():
            await self._zc.async_close()
            self._zc = None
            raise DuplicateIdentityError(self.identity.peer_id, "mDNS")
        self._info = AsyncServiceInfo(
            self.service_type, self.service_name, port=self.port,
            parsed_addresses=self.interfaces,
            properties=txt_properties(self.identity, self.port, self.model, self.tasks, self.swarm),
            server=f"{self.identity.name}-{self.identity.peer_id[:8]}.local.",
        )
        try:
            await (await self._zc.async_register_service(self._info))
        except NonUniqueNameException as exc:
            await self._zc.async_close()
            self._zc = None
            # Our name is derived from our key: someone live on the LAN announces it already.
            raise DuplicateIdentityError(self.identity.peer_id, "mDNS") from exc
        self._browser = AsyncServiceBrowser(self._zc.zeroconf, self.service_type, handlers=[self._on_change])

    async def _name_is_live(self) -> bool:
        """Does a live responder on the LAN answer for our service name (multicast answers, see
        DUPLICATE_PROBE_MS)? Our zeroconf is new, so its cache holds nothing stale: an answer is live."""
        from zeroconf import DNSQuestionType
        from zeroconf.asyncio import AsyncServiceInfo

        probe = AsyncServiceInfo(self.service_type, self.service_name)
        if not await probe.async_request(self._zc.zeroconf, DUPLICATE_PROBE_MS, question_type=DNSQuestionType.QM):
            return False
        peer = parse_service(self.service_name, probe.properties or {}, probe.parsed_addresses(), probe.port)
        return peer is not None and peer.peer_id == self.identity.peer_id

    async def stop(self) -> None:
        """Send goodbye packets and close."""
        if self._zc is None:
            return
        for task in list(self._resolving):
            task.cancel()
        if self._browser is not None:
            await self._browser.async_cancel()
        if self._info is not None:
            await (await self._zc.async_unregister_service(self._info))
        await self._zc.async_close()
        self._zc = None

    def _on_change(self, zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
        from zeroconf import ServiceStateChange

        if name == self.service_name:
            return
        if state_change is ServiceStateChange.Removed:
            if len(self._removals) >= 4096:  # bounded: a LAN churning names must not grow it forever
                self._removals.clear()
            self._removals[name] = self._removals.get(name, 0) + 1
            self._foreign.discard(name)
            self._lose(name)
            return
        task = asyncio.get_running_loop().create_task(self._resolve(name))
        self._resolving.add(task)
        task.add_done_callback(self._resolving.discard)

    async def _resolve(self, name: str) -> None:
        from zeroconf.asyncio import AsyncServiceInfo

        info = AsyncServiceInfo(self.service_type, name)
        removals = self._removals.get(name, 0)
        if self._zc is None or not await info.async_request(self._zc.zeroconf, RESOLVE_TIMEOUT_MS):
            return
        if self._removals.get(name, 0) != removals:  # it said goodbye while we resolved: don't bring it back
            return
        peer = parse_service(name, info.properties or {}, info.parsed_addresses(), info.port)
        if peer is None:
            return
        if peer.peer_id == self.identity.peer_id:  # a copied data dir is one whatever swarm it names
            if peer.instance != self.identity.instance:
                self._on_duplicate(peer.url)
            return
        if peer.swarm != self.swarm:
            if len(self._foreign) >= MAX_FOREIGN:
                self._foreign.clear()
            self._foreign.add(name)
            self._lose(name)  # it may have announced our swarm before: no longer a peer
            return
        self._foreign.discard(name)
        self._names[name] = peer.peer_id
        self._on_found(peer)

    def _lose(self, name: str) -> None:
        peer_id = self._names.pop(name, None)
        if peer_id is not None:
            self._on_lost(peer_id)
