"""Dialer: the swarm service's outbound links kept up. A bootstrap or a manual peer is redialled for as
long as the node runs, an mDNS peer while it is still announced; failed dials back off (with a warning
now and then, not on every try), and a link that lived a while resets the backoff."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from websockets.asyncio.client import ClientConnection

from engine.swarm.config import SwarmConfig
from engine.swarm.errors import TransportError
from engine.swarm.lan import LanDiscovery
from engine.swarm.loops import Backoff
from engine.swarm.mdns import MdnsPeer
from engine.swarm.transport import Link, dial

STABLE_LINK_S = 10.0  # a link that lived this long resets the reconnect backoff
MDNS_YIELD_S = 1.0  # on mDNS discovery the larger peer id waits this long so the smaller dials first


@dataclass(eq=False)
class Dialer:
    """Runs on the service's asyncio loop. `run_link(ws, url, found_by)` runs one dialled link until it
    closes and returns it; `linked(peer_id)` says whether a direct link to that peer is open (perhaps
    one it dialled); `stopping()` whether the service is leaving."""

    config: SwarmConfig
    lan: LanDiscovery
    own_peer_id: str
    run_link: Callable[[ClientConnection, str, str], Awaitable[Link]]
    linked: Callable[[str], bool]
    stopping: Callable[[], bool]
    log: Callable[[str, str], None]

    async def mdns(self, peer: MdnsPeer) -> None:
        """Keep a link to a peer found on the LAN; of two such peers the smaller id dials first."""
        if self.own_peer_id > peer.peer_id:
            await asyncio.sleep(MDNS_YIELD_S)
        await self.keep_up(peer.url, "mdns", peer_id=peer.peer_id)

    async def keep_up(self, url: str, found_by: str, peer_id: str | None = None) -> None:
        """Keep a link to `url` up (with backoff). For mDNS peers, until the peer is gone."""
        link_cfg = self.config.link
        backoff = Backoff(link_cfg.reconnect_initial_s, link_cfg.reconnect_max_s)
        failures = 0
        while not self.stopping():
            if peer_id is not None:
                record = self.lan.record(peer_id)
                if record is None:
                    return
                url = record.url
                if self.linked(peer_id):  # linked (perhaps they dialled us): watch, don't dial
                    await asyncio.sleep(1.0)
                    continue
            try:
                ws = await dial(url, self.config.limits, link_cfg, self.config.ca_file)
            except TransportError as exc:
                failures += 1
                delay = backoff.next()
                if failures in (1, 10) or failures % 100 == 0:
                    self.log("warning", f"swarm: {exc} (retrying every {link_cfg.reconnect_max_s:.0f}"
                              f" s at most; attempt {failures})")
                await asyncio.sleep(delay)
                continue
            link = await self.run_link(ws, url, found_by)
            if link.close_reason == "self":
                return
            if time.time() - link.opened_at > STABLE_LINK_S:
                backoff.reset()
                failures = 0
            if not self.stopping():
                self.log("info", f"swarm: link to {url} ended ({link.close_reason or 'closed'}); "
                          "reconnecting")
                await asyncio.sleep(backoff.next())
