"""The bootstrap server: the swarm's rendezvous and the board's credential issuer.

Peers dial out to it over a websocket; it answers with who is there (`peers` frames, coalesced; a
bounded sample when there is a board), names the board (its data plane, in its hello) and hands each
node a short-lived credential for its own board key (`creds` frames, renewed). Without a board
(`sapo bootstrap --no-nats`, a LAN party) it relays each rollout frame verbatim to every other peer,
fully checked first (signature, schema, limits, per-signer rate): O(N^2), which is why the board exists;
with a board it relays nothing. Keys it has not credentialed before are bounded per address and in all
(engine/swarm/issuance.py): identities are free.
Bootstraps do not link to each other: a swarm grows past one machine as a NATS cluster.
`GET /status` answers JSON (peers, frames, refusals, the board's figures) for a browser or curl.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from websockets.asyncio.server import Server, ServerConnection
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from engine.swarm import protocol as p
from engine.swarm.admission import InboundGate, remote_ip
from engine.swarm.config import BootstrapConfig
from engine.swarm.identity import Identity, name_for
from engine.swarm.issuance import IdentityGate
from engine.swarm.loops import TaskSet
from engine.swarm.tls import server_context
from engine.swarm.transport import Link, listen, run_listed, server_port
from engine.swarm.wire import Hello, PeerEntry

PEERS_COALESCE_S = 0.1  # joins/leaves within this window produce one `peers` frame
LIVENESS_PROBE_S = 2.0  # a new instance of a connected id: ping the old link this long before replacing it
Log = Callable[[str, str], None]


def _stderr_log(level: str, message: str) -> None:
    import sys

    print(f"[{level}] {message}", file=sys.stderr, flush=True)


class BootstrapServer:
    """See the module docstring. Runs on one asyncio loop."""

    def __init__(self, config: BootstrapConfig, identity: Identity | None = None, log: Log = _stderr_log, *,
                 issue_credential: Callable[[str], Any] | None = None, credential_ttl_s: float = 3600.0,
                 data_plane_monitor: str | None = None) -> None:
        self.config = config
        self.identity = identity or Identity.generate()
        self.protocol = p.SwarmProtocol(self.identity, config.limits)
        self._log = log
        self._links: set[Link] = set()
        self._gate = InboundGate(config.max_connections, config.max_connections_per_ip,
                                 "bootstrap at its connection cap; try again later\n")
        self._nodes: dict[str, Link] = {}  # peer id -> open link of a node
        self._tasks = TaskSet(lambda name, exc: log("error", f"task {name} failed: {exc!r}"))
        self._server: Server | None = None
        self._peers_dirty = asyncio.Event()
        self._started_at = time.time()
        self.rollout_frames = 0  # rollout frames accepted for relay
        self.frames_relayed = 0  # deliveries (one frame to one link)
        self._stopping = False
        # peer id -> a board credential (.jwt, .expires_at): nodes write only their own board key
        self._issue = issue_credential
        self.credential_ttl_s = credential_ttl_s
        self.credentials_issued = 0
        self.credentials_withheld = 0  # renewals and new credentials refused to revoked keys
        self._monitor = data_plane_monitor  # the board's nats-server monitoring URL (/varz, /jsz)
        self.data_plane: dict[str, Any] = {}  # its latest figures, polled (status() never blocks on it)
        self.frames_not_relayed = 0  # rollout frames sent to us while a board runs: never broadcast
        self._new_ids = IdentityGate(  # new keys credentialed, per address and in all (identities are free)
            per_ip_burst=config.new_identity_burst_per_ip, per_ip_interval_s=config.new_identity_interval_per_ip_s,
            burst=config.new_identity_burst, rate_per_s=config.new_identity_rate_per_s,
            known=config.known_identities, addresses=config.new_identity_addresses, now=time.monotonic())

    # --- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        tls = server_context(cfg.tls_cert_file, cfg.tls_key_file) if cfg.tls_cert_file else None
        self._server = await listen(self._accept, cfg.host, cfg.port, cfg.limits, cfg.link,
                                    process_request=self._http, tls=tls)
        self._tasks.spawn("peers broadcaster", self._broadcast_peers())
        if self._issue is not None:
            self._tasks.spawn("credential renewal", self._renew_credentials())
        if self._monitor is not None:
            self._tasks.spawn("data plane figures", self._poll_data_plane())
        self._log("info", f"bootstrap {self.identity.name} listening on {self.url} (status: {self.status_url})")

    async def stop(self) -> None:
        self._stopping = True
        await asyncio.gather(*(link.close("bootstrap shutting down") for link in list(self._links)))
        await self._tasks.cancel_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def serve_forever(self) -> None:
        await self.start()
        try:
            await asyncio.Future()  # until cancelled (Ctrl-C / SIGTERM)
        finally:
            await self.stop()

    @property
    def port(self) -> int:
        return server_port(self._server) if self._server is not None else self.config.port

    @property
    def url(self) -> str:
        host = self.config.host if self.config.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        return f"{'wss' if self.config.tls_cert_file else 'ws'}://{host}:{self.port}"

    @property
    def status_url(self) -> str:
        return self.url.replace("ws", "http", 1) + "/status"  # wss:// -> https://

    # --- HTTP: /status and the connection cap --------------------------------------------------------
    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path in ("/status", "/status.json"):
            body = json.dumps(self.status(), indent=2).encode("utf-8")
            return Response(200, "OK", Headers({"Content-Type": "application/json",
                                                "Cache-Control": "no-store"}), body)
        if "upgrade" not in request.headers.get("Connection", "").lower():
            text = b"SAPO Swarm bootstrap server. Peers connect here with websockets; see /status\n"
            return Response(200, "OK", Headers({"Content-Type": "text/plain"}), text)
        return self._gate.refuse(connection, len(self._links), self._stopping)

    def status(self) -> dict[str, Any]:
        now = time.time()
        peers = [{"id": pid, "name": name_for(pid), "model": link.hello.model if link.hello else "",
                  "tasks": link.hello.tasks if link.hello else "", "address": link.address,
                  "connected_s": round(now - link.opened_at, 1), "frames_in": link.frames_in,
                  "frames_out": link.frames_out, "dropped_out": link.dropped_out}
                 for pid, link in sorted(self._nodes.items(), key=lambda kv: kv[1].opened_at)]
        return {
            "service": "sapo-bootstrap", "protocol": p.PROTOCOL_VERSION, "id": self.identity.peer_id,
            "name": self.identity.name, "url": self.url, "tls": bool(self.config.tls_cert_file),
            "uptime_s": round(now - self._started_at, 1),
            "connections": len(self._links), "max_connections": self.config.max_connections,
            "max_connections_per_ip": self.config.max_connections_per_ip, "refused_per_ip": self._gate.refused_per_ip,
            "peers": peers,
            "frames": {"accepted": self.protocol.accepted, "rollouts": self.rollout_frames,
                       "relayed": self.frames_relayed, "not_relayed_board": self.frames_not_relayed,
                       "dropped_slow_peer": sum(link.dropped_out for link in self._links)},
            "refusals": self.protocol.refusals.snapshot(),
            "board": {"urls": list(self.config.board_urls), "credentials": self._issue is not None,
                      "data_plane": dict(self.data_plane),
                      "credentials_issued": self.credentials_issued, "credential_ttl_s": self.credential_ttl_s,
                      "credentials_refused_rate": self.credentials_refused_rate,
                      "credentials_withheld_revoked": self.credentials_withheld,
                      "new_identities": self._new_ids.stats()},
        }

    # --- links --------------------------------------------------------------------------------------
    def _new_link(self, ws: Any, initiator: bool, address: str) -> Link:
        hello = Hello(self.identity.instance, "bootstrap", "", "", None, board=self.config.board_urls)
        conn = p.PeerConnection(self.protocol, hello, self._started_at)
        return Link(ws, conn, send_queue=self.config.link.send_queue, send_queue_bytes=self.config.link.send_queue_bytes,
                    write_timeout_s=self.config.link.write_timeout_s, initiator=initiator, address=address,
                    found_by="bootstrap" if initiator else "inbound")

    async def _accept(self, ws: ServerConnection) -> None:
        host, port = ws.remote_address[:2]
        with self._gate.holding(ws):
            await run_listed(self._new_link(ws, False, f"{host}:{port}"), self._links, self._on_events,
                             self.config.link.connect_timeout_s, self._closed)

    def _closed(self, link: Link) -> None:
        if link.peer_id is not None and self._nodes.get(link.peer_id) is link:
            del self._nodes[link.peer_id]
            self._peers_dirty.set()

    async def _on_events(self, link: Link, events: list[p.ProtocolEvent]) -> None:
        for event in events:
            if isinstance(event, p.RolloutsReceived):
                self._relay(link, event.envelope)
            elif isinstance(event, p.HelloReceived):
                await self._hello(link, event)
            elif isinstance(event, p.SelfConnection):
                link.close_reason = "self"
                await link.close("self connection", bye=False)
            elif isinstance(event, p.DuplicateIdentity):
                await link.close(p.BYE_DUPLICATE_IDENTITY)

    def _relay(self, source: Link, env: p.Envelope) -> None:
        if self.config.board_urls:
            # Nodes share through the board (O(J) per node); a broadcast beside it would make a broken
            # board, or a flood of signed frames, O(N^2) for everyone. Counted, never forwarded.
            self.frames_not_relayed += 1
            return
        self.rollout_frames += 1
        for link in list(self._links):
            # Not back to where it came from, nor to its signer (who has it), nor to half-open links.
            if link is source or not link.is_open or link.peer_id == env.sender:
                continue
            link.send(env.raw)
            self.frames_relayed += 1

    async def _hello(self, link: Link, event: p.HelloReceived) -> None:
        if event.hello.role == "bootstrap":  # federations of bootstraps are gone: NATS clusters scale
            await link.close("bootstraps do not link; run a NATS cluster to grow past one machine")
            return
        if self._issue is not None and not await self._admit_identity(link, event.peer_id):
            return
        old = self._nodes.get(event.peer_id)
        if old is not None and old is not link and old.hello is not None:
            if old.hello.instance != event.hello.instance and await _alive(old):
                # Two live processes with one key: the one already here stays, the newcomer is told.
                self._log("warning", f"refused {name_for(event.peer_id)} from {link.address}: its identity "
                          f"is already connected from {old.address} (copied data dir?)")
                await link.close(p.BYE_DUPLICATE_IDENTITY)
                return
            self._nodes[event.peer_id] = link
            await old.close("replaced by a newer connection")
        self._nodes[event.peer_id] = link
        self._peers_dirty.set()
        self._send_credential(event.peer_id, link)

    async def _admit_identity(self, link: Link, peer_id: str) -> bool:
        """A key new to us gets a credential only while its address and the bootstrap have new-identity
        tokens left; a refused node is told why and when to try again, then the link closes."""
        refusal = self._new_ids.admit(peer_id, remote_ip(link.ws), time.monotonic())
        if refusal is None:
            return True
        refused = self.credentials_refused_rate
        if refused in (1, 10) or refused % 1000 == 0:  # a flood must not flood the log too
            self._log("warning", f"refused a new identity from {link.address}: {refusal.reason} "
                      f"({refused} refused so far)")
        await link.close(refusal.reason)
        return False

    @property
    def credentials_refused_rate(self) -> int:
        """Hellos of new keys refused a credential by the per-address or global bucket."""
        return sum(self._new_ids.refused.values())

    def _send_credential(self, peer_id: str, link: Link) -> None:
        if self._issue is None:
            return
        cred = self._issue(peer_id)  # the link's signed hello proved the key: it gets its own key's rights
        if cred is None:  # a key the board's warden revoked (over its publishing budget): nothing for now
            self.credentials_withheld += 1
            return
        link.send(link.conn.creds_frame(cred.jwt, cred.expires_at))
        self.credentials_issued += 1
        self._new_ids.remember(peer_id)  # a live node stays known: its reconnections are not charged

    async def _poll_data_plane(self, every_s: float = 5.0) -> None:
        last: tuple[float, dict[str, Any]] | None = None
        while True:
            try:
                varz, jsz = await asyncio.to_thread(_monitor_figures, self._monitor or "")
            except (OSError, ValueError) as exc:
                self.data_plane = {"reachable": False, "error": str(exc)[:200]}
            else:
                now = time.monotonic()
                figures = {"reachable": True, "connections": varz.get("connections"),
                           "server_rss_bytes": varz.get("mem"), "server_cpu_percent": varz.get("cpu"),
                           "stream_messages": jsz.get("messages"), "stream_bytes": jsz.get("bytes")}
                if last is not None and now > last[0]:
                    dt, prev = now - last[0], last[1]
                    for key in ("in_msgs", "out_msgs", "in_bytes", "out_bytes"):
                        if isinstance(varz.get(key), int) and isinstance(prev.get(key), int):
                            figures[f"{key}_per_s"] = round((varz[key] - prev[key]) / dt, 1)
                last = (now, varz)
                self.data_plane = figures
            await asyncio.sleep(every_s)

    async def _renew_credentials(self) -> None:
        """Fresh credentials to every node at a third of their lifetime: one missed renewal is harmless."""
        while True:
            await asyncio.sleep(self.credential_ttl_s / 3)
            for peer_id, link in list(self._nodes.items()):
                if link.is_open:
                    self._send_credential(peer_id, link)

    # --- peer lists -----------------------------------------------------------------------------------
    def _peers_frame(self) -> bytes:
        entries: dict[str, PeerEntry] = {}
        for pid, link in self._nodes.items():
            hello = link.hello
            if hello is not None:
                entries[pid] = PeerEntry(pid, hello.model, hello.tasks, hello.listen)
        cap = self.config.limits.max_peers_per_frame
        if self.config.peers_sample:
            cap = min(cap, self.config.peers_sample)
        items = list(entries.values())[-cap:]  # the newest (dict order is join order)
        return self.protocol.encode("peers", {"peers": [e.to_wire() for e in items]})

    async def _broadcast_peers(self) -> None:
        while True:
            await self._peers_dirty.wait()
            await asyncio.sleep(max(PEERS_COALESCE_S, self.config.peers_min_interval_s))
            self._peers_dirty.clear()
            full = self._peers_frame()
            for link in list(self._nodes.values()):
                link.send(full)


def _monitor_figures(base: str, timeout_s: float = 2.0) -> tuple[dict[str, Any], dict[str, Any]]:
    """nats-server's /varz and /jsz (its local monitoring port), bounded and parsed."""
    import urllib.request

    out = []
    for path in ("/varz", "/jsz"):
        with urllib.request.urlopen(base + path, timeout=timeout_s) as resp:
            data = json.loads(resp.read(1 << 20))
        out.append(data if isinstance(data, dict) else {})
    return out[0], out[1]


async def _alive(link: Link) -> bool:
    """Does the peer behind `link` still answer a ping? (A restarted node's old link may be dead.)"""
    try:
        waiter = await link.ws.ping()
        await asyncio.wait_for(waiter, LIVENESS_PROBE_S)
    except (TimeoutError, ConnectionClosed):
        return False
    return True
