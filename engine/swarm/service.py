"""SwarmService: a node's presence in the swarm (asyncio). Listener, dialers, mDNS, bootstrap links.

It signs and sends the node's rollout groups to every open link, hands received groups to the pool
(re-scored locally, in a worker thread so the loop stays responsive) and reports what happens as
events: PeerUpdated, RolloutSeen (for each received group: pooled or dropped, and why), LogRecord.
Direct links to the same peer are de-duplicated; the same frame arriving by two paths is accepted
once (replay guard); a copied identity is detected and the later-started copy leaves the swarm.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.server import Server, ServerConnection
from websockets.http11 import Request, Response

from engine.events import Event, LogRecord, PeerUpdated
from engine.sapo.records import LOCAL_PEER, Candidate, RolloutGroup
from engine.swarm import protocol as p
from engine.swarm import replay_state
from engine.swarm.admission import InboundGate
from engine.swarm.board_client import BoardClient, nats_board_factory, resolve_board_urls
from engine.swarm.config import SwarmConfig
from engine.swarm.dialer import Dialer
from engine.swarm.errors import DuplicateIdentityError
from engine.swarm.identity import Identity, name_for
from engine.swarm.intake import Intake
from engine.swarm.lan import LanDiscovery, advertised_host
from engine.swarm.loops import Backoff, TaskSet
from engine.swarm.mdns import MdnsPeer
from engine.swarm.nats_auth import BoardQuota
from engine.swarm.peers import PeerInfo, PeerTable
from engine.swarm.pool import RolloutPool
from engine.swarm.receipt_courier import ReceiptCourier
from engine.swarm.transport import Link, listen, run_listed, server_port, source_host
from engine.swarm.wire import Hello

BOARD_FRAME_BYTES = BoardQuota().max_frame_bytes  # what the swarm's board stores of one node


class SwarmService:
    """See the module docstring. All methods run on one asyncio loop, except `peers`, `peer_count` and
    `stats`, which other threads call: they read only the locked peer table, the pool (locked) and
    copies taken in one C-level step."""

    def __init__(self, identity: Identity, config: SwarmConfig, pool: RolloutPool, node_info: dict[str, Any],
                 emit: Callable[[Event], None], *,
                 make_board: Callable[..., Any] | None = None, replay_state: Path | None = None,
                 receipts_state: Path | None = None) -> None:
        self.identity = identity
        self.config = config
        self.pool = pool
        self.model = str(node_info.get("model_id", ""))
        self.tasks = str(node_info.get("task_lib_version", ""))
        self._emit = emit
        self.protocol = p.SwarmProtocol(identity, config.limits)
        self.table = PeerTable(forget_after_s=config.forget_peers_after_s)
        self._links: set[Link] = set()  # every live link, in handshake or open
        self._peer_links: dict[str, Link] = {}  # peer id -> its open direct link
        self._relays: dict[str, Link] = {}  # bootstrap URL -> open link
        self._gate = InboundGate(config.max_connections, config.max_inbound_per_ip, "node at its connection cap\n")
        self._tasks = TaskSet(self._crashed)
        self._intake = Intake(pool, emit)  # received groups: re-scored off the loop, then reported
        self._server: Server | None = None
        self.lan = LanDiscovery(identity, self.model, self.tasks, config.max_connections, self._mdns_dial_later,
                                self._log, swarm=config.swarm_name)
        self._dialer = Dialer(config, self.lan, identity.peer_id, self._run_dialled,
                              lambda peer_id: peer_id in self._peer_links, lambda: self._stopping, self._log)
        self._listen_url = ""
        self._started_at = time.time()
        self._stopping = False
        self.duplicate_identity: DuplicateIdentityError | None = None  # set when a copy was detected
        self.counters = {"frames_published": 0, "groups_published": 0, "groups_received": 0}
        self._replay_state = replay_state  # where the replay guard outlives this process
        self.board = BoardClient(self.protocol, self._log, make_board or nats_board_factory(
            config.pool.max_age_s, config.limits.max_frame_bytes, config.ca_file),
            on_receipt=self._board_receipt)
        self.receipts = ReceiptCourier(self.protocol, config.receipts, self._open_link_to, self.board,
                                       receipts_state, vouched=pool.has_verified)

    # --- lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Listen, announce, dial. Raises TransportError (port busy) or DuplicateIdentityError."""
        cfg = self.config
        if self._replay_state is not None:
            restored = replay_state.load(self._replay_state, self.protocol.replay)
            if restored:
                self._log("info", f"swarm: replay protection restored for {restored} senders")
            self._tasks.spawn("replay state", self._save_replay_state_every(replay_state.REPLAY_SAVE_S))
        self.receipts.load()
        if cfg.listen:
            self._server = await listen(self._accept, cfg.listen_host, cfg.listen_port, cfg.limits, cfg.link,
                                        process_request=self._admit)
            port = server_port(self._server)
            interfaces = self.lan.interfaces(cfg.mdns_interfaces) if cfg.mdns else []
            host = cfg.advertise_host or (interfaces[0] if interfaces else advertised_host(cfg.listen_host))
            self._listen_url = f"ws://{host}:{port}"
            if cfg.mdns:
                await self._start_mdns(port, interfaces)
        if cfg.board_urls:
            self._start_board(cfg.board_urls)
        for url in cfg.bootstrap_urls:
            self._tasks.spawn(f"dial {url}", self._dialer.keep_up(url, "bootstrap"))
        for url in cfg.peer_urls:
            self._tasks.spawn(f"dial {url}", self._dialer.keep_up(url, "manual"))

    async def stop(self) -> None:
        """Bye on every link, mDNS goodbye, close the listener."""
        self._stopping = True
        await self.lan.stop()
        await asyncio.gather(*(link.close(p.BYE_LEAVING) for link in list(self._links)))
        await self._tasks.cancel_all()
        self._save_replay_state()
        self.receipts.save()
        await self.board.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self._intake.close()

    @property
    def listen_url(self) -> str:
        """ws://host:port where peers can reach this node ("" when not listening)."""
        return self._listen_url

    # --- API for the node ---------------------------------------------------------------------------
    async def publish(self, groups: Sequence[RolloutGroup]) -> int:
        """Sign groups and share them -> the number of links they went to (the board counts as one).

        With a board: the frame is stored there under our key and goes to direct (LAN) links only.
        Without one: every open link, bootstraps (relays) included. Groups must be this node's own: origin LOCAL_PEER (filled
        in with our peer id) or our id; receivers refuse any group whose origin is not the signer.
        """
        if not groups:
            return 0
        own = self.identity.peer_id
        if any(g.provenance.origin_peer not in (LOCAL_PEER, own) for g in groups):
            raise ValueError("publish() sends this node's own groups only; peers' groups travel signed "
                             "by their origin")
        groups = [g if g.provenance.origin_peer == own else
                  replace(g, provenance=replace(g.provenance, origin_peer=own)) for g in groups]
        on_board = self.board.connected
        # On a board, frames fit its size (a larger message would cost the connection)
        frames = self.protocol.encode_rollouts(groups, BOARD_FRAME_BYTES if on_board else None)
        if on_board:  # the latest frame per node: one frame holds a round's groups at default limits
            on_board = await self.board.put(frames[0])
        # A node with a board never sends rollouts to a bootstrap, even while the board is down: that
        # fallback made the swarm a broadcast, O(N^2) (and a bootstrap with a board relays nothing).
        skip_relays = on_board or bool(self.board.urls)
        relays = set(self._relays.values())
        links = [link for link in self._links if link.is_open and not (skip_relays and link in relays)]
        for frame in frames:
            for link in links:
                link.send(frame)
        self.counters["frames_published"] += len(frames)
        self.counters["groups_published"] += len(groups)
        self.receipts.published(groups)
        return len(links) + int(on_board)

    async def fetch(self, j: int) -> int:
        """Pull up to `j` of others' frames from the board into the pool -> the groups they held (0 without
        a board: links push their frames as they come)."""
        if j <= 0 or not self.board.connected:
            return 0
        groups = 0
        for result in await self.board.fetch(j):
            groups += len(result.groups)
            await self._received(result.groups)
        return groups

    def peers(self, include_disconnected: bool = False) -> list[PeerInfo]:
        """Peers reachable now (directly or through a bootstrap); all known ones if asked."""
        return [peer for peer in self.table.snapshot() if include_disconnected or peer.connected]

    def peer_count(self) -> int:
        """Peers reachable now (any thread): linked, listed by a bootstrap, or on the board."""
        on_board = self.board.nodes_on_board - 1 if self.board.connected else 0
        return max(self.table.connected_count(), on_board)

    def stats(self) -> dict[str, Any]:
        links = tuple(self._links)  # one C-level copy: the loop may add or drop links meanwhile
        return {**dict(self.counters), "refused_per_ip": self._gate.refused_per_ip, "links": len(links),
                "direct_peers": len(self._peer_links),
                "bootstraps": sorted(self._relays), "frames_accepted": self.protocol.accepted,
                "refusals": self.protocol.refusals.snapshot(), "known_peers": len(self.table),
                "dropped_out": sum(link.dropped_out for link in links), "board": self.board.stats(),
                "receipts": self.receipts.stats()}

    async def send_receipts(self, used: Sequence[Candidate]) -> int:
        """Tell each origin which of its groups this node trained on this round (display only)."""
        return await self.receipts.send(used)

    def _open_link_to(self, peer_id: str) -> Link | None:
        link = self._peer_links.get(peer_id)
        return link if link is not None and link.is_open else None

    def _board_receipt(self, data: bytes) -> None:
        self.receipts.from_board(data)

    # --- links ----------------------------------------------------------------------------------------
    def _save_replay_state(self) -> None:
        if self._replay_state is None:
            return
        try:
            replay_state.save(self._replay_state, self.protocol.replay)
        except OSError as exc:
            self._log("warning", f"swarm: could not save the replay guard ({exc}); a restart may accept replays")

    async def _save_replay_state_every(self, seconds: float) -> None:
        while True:  # a kill -9 forgets at most this long of what was seen
            await asyncio.sleep(seconds)
            self._save_replay_state()
            self.receipts.save()

    def _start_board(self, urls: Sequence[str], wait_credential_s: float = 0.0) -> None:
        """Connect to the board; a bootstrap's board waits a moment for the credential that follows
        its hello (an open board, e.g. a LAN party's, is used without one)."""
        self.board.urls = tuple(urls)  # claimed now: a second bootstrap's hello must not start another
        backoff = Backoff(self.config.link.reconnect_initial_s, self.config.link.reconnect_max_s)

        async def run() -> None:
            if wait_credential_s:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.board.got_credential.wait(), wait_credential_s)
            await self.board.keep_connected(urls, backoff)
        self._tasks.spawn("board", run())

    def _new_link(self, ws: Any, initiator: bool, address: str, found_by: str) -> Link:
        hello = Hello(self.identity.instance, "node", self.model, self.tasks, self._listen_url or None)
        conn = p.PeerConnection(self.protocol, hello, self._started_at)
        return Link(ws, conn, send_queue=self.config.link.send_queue, send_queue_bytes=self.config.link.send_queue_bytes,
                    write_timeout_s=self.config.link.write_timeout_s, initiator=initiator, address=address,
                    found_by=found_by)

    def _admit(self, connection: ServerConnection, request: Request) -> Response | None:
        return self._gate.refuse(connection, len(self._links), self._stopping)

    async def _accept(self, ws: ServerConnection) -> None:
        host, port = ws.remote_address[:2]
        with self._gate.holding(ws):
            await self._run_link(self._new_link(ws, False, f"{host}:{port}", "inbound"))

    async def _run_link(self, link: Link) -> None:
        await run_listed(link, self._links, self._on_events, self.config.link.connect_timeout_s, self._closed)

    def _closed(self, link: Link) -> None:
        peer_id = link.peer_id
        if link.hello is not None and link.hello.role == "bootstrap":
            if self._relays.get(link.address) is link:
                del self._relays[link.address]
                for info in self.table.relay_lost(link.address):
                    self._peer_event(info)
        elif peer_id is not None and self._peer_links.get(peer_id) is link:
            del self._peer_links[peer_id]
            closed = self.table.link_closed(peer_id)
            if closed is not None:
                self._peer_event(closed)

    async def _on_events(self, link: Link, events: list[p.ProtocolEvent]) -> None:
        for event in events:
            if isinstance(event, p.RolloutsReceived):
                await self._received(event.groups, source_host(link))
            elif isinstance(event, p.HelloReceived):
                await self._hello(link, event)
            elif isinstance(event, p.PeersReceived):
                if self._relays.get(link.address) is link:
                    entries = [(e.peer_id, e.model, e.tasks) for e in event.peers]
                    for info in self.table.relay_listing(link.address, entries, self.identity.peer_id):
                        self._peer_event(info)
            elif isinstance(event, p.ByeReceived):
                # Only a configured bootstrap may tell us we are a copy: from any peer, this bye
                # would let a stranger push us out of the swarm. Direct copies are caught by hello.
                if event.reason == p.BYE_DUPLICATE_IDENTITY and self._relays.get(link.address) is link:
                    await self._duplicate(link.address, we_are_second=True)
                elif event.reason == p.BYE_LEAVING and link.peer_id is not None \
                        and self._peer_links.get(link.peer_id) is link:
                    # The peer itself said (signed) that it is leaving: stop dialling it now. Its mDNS goodbye
                    # can be undone on this host by a late announcement zeroconf had queued before it.
                    self.lan.lost(link.peer_id)
                elif self._relays.get(link.address) is link:  # our bootstrap says why (a refused identity)
                    link.close_reason = link.close_reason or f"the bootstrap said: {event.reason}"
            elif isinstance(event, p.ReceiptReceived):
                self.receipts.received(event)
            elif isinstance(event, p.CredentialReceived):
                # only from a bootstrap we chose to dial; a live board moves onto the renewed credential
                ours = self._relays.get(link.address) is link
                if ours and self.board.set_credential(event.jwt, event.expires_at) and self.board.connected:
                    self._tasks.spawn("board-renew", self.board.reauthenticate())
            elif isinstance(event, p.SelfConnection):
                link.close_reason = "self"
                await link.close("self connection", bye=False)
            elif isinstance(event, p.DuplicateIdentity):
                await link.close(p.BYE_DUPLICATE_IDENTITY)
                await self._duplicate(link.address, event.we_are_second)

    async def _hello(self, link: Link, event: p.HelloReceived) -> None:
        hello = event.hello
        if hello.role == "bootstrap":
            if link.found_by != "bootstrap":  # relay privileges only for servers we chose to dial
                await link.close("not a configured bootstrap")
                return
            old = self._relays.get(link.address)
            self._relays[link.address] = link
            if old is not None and old is not link:
                await old.close("replaced")
            self._log("info", f"swarm: joined bootstrap {link.address} ({name_for(event.peer_id)})")
            if hello.board and not self.config.board_urls and not self.board.urls:
                self._start_board(resolve_board_urls(hello.board, link.address), wait_credential_s=3.0)
            return
        old = self._peer_links.get(event.peer_id)
        if old is not None and old is not link:
            # Both ends dialled: keep the link the smaller peer id initiated, on both sides alike.
            we_are_smaller = self.identity.peer_id < event.peer_id
            keep_new = link.initiator == we_are_smaller
            if not keep_new:
                await link.close("duplicate link")
                return
            self._peer_links[event.peer_id] = link  # before closing old: its close must not unlist us
            await old.close("duplicate link")
        self._peer_links[event.peer_id] = link
        if hello.tasks != self.tasks:
            self._log("warning", f"swarm: peer {name_for(event.peer_id)} uses task library {hello.tasks!r}, "
                      f"this node {self.tasks!r}: its groups will not verify here")
        self._peer_event(self.table.link_opened(event.peer_id, hello.model, hello.tasks, link.found_by,
                                                link.address))

    async def _received(self, groups: tuple[RolloutGroup, ...], source: str = "") -> None:
        self.counters["groups_received"] += len(groups)
        await self._intake.take(groups, source)

    async def _duplicate(self, where: str, we_are_second: bool) -> None:
        error = DuplicateIdentityError(self.identity.peer_id, where)
        if not we_are_second:
            self._log("warning", f"swarm: a copy of this node's identity tried to join via {where}; it was "
                      "told to get its own (this node keeps running)")
            return
        if self.duplicate_identity is None:
            self.duplicate_identity = error
            self._log("error", f"swarm: {error}")
        # The later copy leaves: two nodes under one id would corrupt everyone's dedupe and stats.
        self._stopping = True
        await asyncio.gather(*(link.close(p.BYE_DUPLICATE_IDENTITY, bye=False) for link in list(self._links)))

    # --- dialling (engine.swarm.dialer keeps each outbound link up) -----------------------------------
    async def _run_dialled(self, ws: ClientConnection, url: str, found_by: str) -> Link:
        link = self._new_link(ws, True, url, found_by)
        await self._run_link(link)
        return link

    # --- mDNS ----------------------------------------------------------------------------------------
    async def _start_mdns(self, port: int, interfaces: list[str]) -> None:
        try:
            await self.lan.start(port, interfaces)
        except DuplicateIdentityError as exc:
            self.duplicate_identity = exc
            self._log("error", f"swarm: {exc}")
            await self.stop()
            raise

    def _mdns_dial_later(self, peer: MdnsPeer) -> None:
        if not self._stopping:  # also after a copy of us was met: mDNS still runs, the swarm is left
            self._tasks.spawn(f"mdns {peer.url}", self._dialer.mdns(peer))

    # --- events ---------------------------------------------------------------------------------------
    def _peer_event(self, info: PeerInfo) -> None:
        stats = self.pool.stats()["per_peer"].get(info.peer_id, {})
        self._emit(PeerUpdated(peer_id=info.peer_id, name=info.name, model=info.model, found_by=info.found_by,
                               address=info.address, connected=info.connected,
                               received=int(stats.get("received", 0)), used=int(stats.get("used", 0))))

    def _log(self, level: str, message: str) -> None:
        self._emit(LogRecord(level=level, message=message))

    def _crashed(self, name: str, exc: BaseException) -> None:
        self._log("error", f"swarm: background task {name!r} failed: {type(exc).__name__}: {exc}")
