"""Swarm configuration: one frozen dataclass per concern, each field documented and validated.

ProtocolLimits bounds what a peer may send; PoolConfig bounds what a node keeps; SwarmConfig says how
a node links to the swarm; BootstrapConfig configures a rendezvous + relay server.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from engine.swarm.receipts import ReceiptConfig

MiB = 1024 * 1024
BYTES_PER_TOKEN = 16  # a generous UTF-8 size of one token (byte-level BPE merges runs of spaces)
DEFAULT_SWARM = "public"  # the swarm every node joins unless told otherwise
# A swarm name: lower case only, so "Lab" and "lab" cannot silently split one swarm in two
SWARM_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def _positive(owner: str, **values: float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{owner}.{name} must be a finite number, got {value!r}")
        if value <= 0:
            raise ValueError(f"{owner}.{name} must be > 0, got {value!r}")


def _ws_url(owner: str, url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"{owner}: {url!r} is not a ws:// or wss:// URL (e.g. ws://bootstrap.example:7700)")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"{owner}: bad port in {url!r}") from exc


@dataclass(frozen=True)
class ProtocolLimits:
    """What a single frame from a peer may contain; anything beyond is refused and counted."""

    max_frame_bytes: int = 1 * MiB  # one websocket frame, also websockets' max_size
    max_groups_per_frame: int = 64  # rollout groups in one `rollouts` frame
    max_completions_per_group: int = 16  # L, completions per question
    max_completion_bytes: int = 8 * 1024  # one completion's UTF-8 size
    max_logprobs_per_completion: int = 4096  # generator log-probs per completion (tokens)
    max_text_bytes: int = 256  # names, model ids, reasons, URLs in hello/peers/bye
    max_peers_per_frame: int = 256  # entries in a `peers` frame
    max_clock_skew_s: float = 3600.0  # frames whose ts is further from now are refused as stale
    replay_window: int = 1024  # seqs tracked per sender; older ones are refused (replay_old)
    # senders remembered at once: each until 2 x max_clock_skew_s after its last frame (a frame is
    # replayable only while its ts is acceptable); when all are that recent, new senders are refused
    max_tracked_senders: int = 100_000
    peer_rate_per_s: float = 20.0  # frames per second one signer may send (token refill)
    peer_burst: float = 80.0  # token bucket size per signer
    link_rate_per_s: float = 5000.0  # frames per second over one link (a relay link carries many peers)
    link_burst: float = 10000.0  # token bucket size per link

    def __post_init__(self) -> None:
        _positive("ProtocolLimits", **{k: getattr(self, k) for k in self.__dataclass_fields__})
        for name in ("max_frame_bytes", "max_groups_per_frame", "max_completions_per_group",
                     "max_completion_bytes", "max_logprobs_per_completion", "max_text_bytes",
                     "max_peers_per_frame", "replay_window", "max_tracked_senders"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"ProtocolLimits.{name} must be an int")  # noqa: TRY004 - config convention
        if self.max_frame_bytes > 64 * MiB:
            raise ValueError("ProtocolLimits.max_frame_bytes must be <= 64 MiB")
        if self.max_text_bytes < 64:
            raise ValueError("ProtocolLimits.max_text_bytes must be >= 64 (ids are 43 characters)")
        if self.peer_burst < 1 or self.link_burst < 1:
            raise ValueError("ProtocolLimits bursts must be >= 1 (else nothing could ever be sent)")


@dataclass(frozen=True)
class PoolConfig:
    """The bounded pool of peers' rollout groups a node may train on."""

    capacity: int = 512  # groups kept at most; the oldest is evicted first
    max_peer_share: float = 0.25  # fraction of capacity one origin peer may fill
    max_address_share: float = 0.5  # ... and all origins behind one direct link's network address together
    max_age_s: float = 600.0  # groups received longer ago than this are stale
    max_policy_lag: int = 64  # groups this many policy versions behind their origin's newest are stale
    max_uses: int = 1  # times a group may be trained on before it leaves the pool
    # Times one question (its text's hash) may be trained on from peers' groups, whoever sent them: a
    # crowd of identities re-sending one question, with other answers each, does not train it again and again.
    max_question_uses: int = 2
    history: int = 512  # recent decisions (pooled/used/dropped + reason) kept for display
    # A completion longer than this (UTF-8 bytes) is not one this node could have generated: refused before
    # any scoring. The node sets it from its own token cap (BYTES_PER_TOKEN x max_new_tokens).
    max_completion_bytes: int = 8192
    # CPU seconds per minute re-scoring may spend on one origin's groups, and on all origins together
    # (regenerating a question and verifying its completions: an honest group costs ~1 ms). A group is
    # admitted while its origin and the whole pool have credit; its measured cost is then charged, so a
    # crafted expensive group stops its sender (and a crowd of fresh identities) within one group.
    rescore_cpu_s_per_peer: float = 3.0
    rescore_cpu_s_total: float = 12.0

    def __post_init__(self) -> None:
        _positive("PoolConfig", capacity=self.capacity, max_peer_share=self.max_peer_share,
                  max_age_s=self.max_age_s, max_uses=self.max_uses, max_question_uses=self.max_question_uses,
                  history=self.history,
                  max_completion_bytes=self.max_completion_bytes, rescore_cpu_s_per_peer=self.rescore_cpu_s_per_peer,
                  rescore_cpu_s_total=self.rescore_cpu_s_total)
        for name in ("capacity", "max_policy_lag", "max_uses", "max_question_uses", "history", "max_completion_bytes"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int):
                raise ValueError(f"PoolConfig.{name} must be an int")  # noqa: TRY004 - config convention
        if self.max_policy_lag < 0:
            raise ValueError("PoolConfig.max_policy_lag must be >= 0")
        if self.max_peer_share > 1 or not 0 < self.max_address_share <= 1 or isinstance(self.max_address_share, bool):
            raise ValueError("PoolConfig.max_peer_share and max_address_share are fractions of capacity: (0, 1]")

    @property
    def per_peer_cap(self) -> int:
        """Groups one origin peer may hold in the pool (at least 1)."""
        return max(1, int(self.capacity * self.max_peer_share))

    @property
    def per_source_cap(self) -> int:
        """Groups the origins behind one network address may hold together (at least 1)."""
        return max(1, int(self.capacity * self.max_address_share))


@dataclass(frozen=True)
class LinkConfig:
    """Websocket settings shared by nodes and bootstrap servers."""

    ping_interval_s: float = 20.0  # websocket ping every this many seconds
    ping_timeout_s: float = 20.0  # a link without a pong for this long is dead
    connect_timeout_s: float = 10.0  # opening handshake limit when dialling
    max_queue: int = 32  # received frames buffered per link before reading pauses (backpressure)
    send_queue: int = 256  # outgoing frames queued per link; beyond, the oldest rollouts are dropped
    send_queue_bytes: int = 8 << 20  # ... and at most this many bytes of them (frames are up to 1 MiB)
    write_timeout_s: float = 30.0  # a frame that takes longer to send: the peer stalled, the link is dropped
    reconnect_initial_s: float = 0.5  # first reconnect delay; doubles after each failure
    reconnect_max_s: float = 30.0  # reconnect delay cap

    def __post_init__(self) -> None:
        _positive("LinkConfig", **{k: getattr(self, k) for k in self.__dataclass_fields__})
        if self.reconnect_max_s < self.reconnect_initial_s:
            raise ValueError("LinkConfig.reconnect_max_s must be >= reconnect_initial_s")


def _board_urls(owner: str, urls: object) -> None:
    if not isinstance(urls, tuple) or len(urls) > 8 or not all(
            isinstance(u, str) and u.startswith(("nats://", "tls://", "ws://", "wss://")) and len(u) <= 256
            and not any(ch.isspace() or ch == "," for ch in u) for u in urls):
        raise ValueError(f"{owner}.board_urls must be a tuple of at most 8 nats://, tls://, ws:// or wss:// URLs")


@dataclass(frozen=True)
class SwarmConfig:
    """How one node joins the swarm: its listener, mDNS, bootstrap servers and caps."""

    listen: bool = True  # accept direct links from peers (LAN); off = only dial out
    listen_host: str = "0.0.0.0"  # address the listener binds
    listen_port: int = 0  # 0 = any free port (mDNS announces the one chosen)
    advertise_host: str | None = None  # host peers should dial; None = the mDNS interface address
    bootstrap_urls: tuple[str, ...] = ()  # ws:// rendezvous + relay servers to dial out to
    peer_urls: tuple[str, ...] = ()  # ws:// peers to dial directly (manual, no mDNS)
    # The board (store one, fetch J) on a NATS cluster: nats:// or tls:// URLs. Empty: the one a
    # bootstrap names in its hello, if any. With a board, rollouts go there, not to relays.
    board_urls: tuple[str, ...] = ()
    mdns: bool = True  # announce and browse _sapo._tcp.local.
    mdns_interfaces: tuple[str, ...] | None = None  # None = auto (skips docker/virtual); else names or IPs
    max_connections: int = 64  # links at most (in + out); more are refused with a clear reason
    # inbound links from one IP address at most (HTTP 429 beyond): identities are free, addresses less so
    max_inbound_per_ip: int = 8
    forget_peers_after_s: float = 600.0  # a peer unreachable this long leaves the peer table
    limits: ProtocolLimits = field(default_factory=ProtocolLimits)  # per-frame limits
    pool: PoolConfig = field(default_factory=PoolConfig)  # external rollout pool
    link: LinkConfig = field(default_factory=LinkConfig)  # websocket timings and queues
    receipts: ReceiptConfig = field(default_factory=ReceiptConfig)  # "I trained on your group" (display only)
    # wss:// bootstraps and the board's TLS servers must chain to a CA in this PEM file (a swarm with its
    # own CA); "" = the system's CAs
    ca_file: str = ""
    # Which swarm's mDNS announcements are peers: a node announces this name and links only to LAN nodes
    # announcing the same one (a lab's private swarm; each test run its own, beside a contributor's node).
    # Lower-case letters, digits and "-", at most 63 characters.
    swarm_name: str = DEFAULT_SWARM

    def __post_init__(self) -> None:
        if not isinstance(self.listen_port, int) or not 0 <= self.listen_port <= 65535:
            raise ValueError(f"SwarmConfig.listen_port must be 0..65535, got {self.listen_port!r}")
        if not isinstance(self.listen_host, str) or not self.listen_host:
            raise ValueError("SwarmConfig.listen_host must be a host name or address")
        if not isinstance(self.bootstrap_urls, tuple) or not isinstance(self.peer_urls, tuple):
            raise ValueError("SwarmConfig.bootstrap_urls and peer_urls must be tuples of URLs")  # noqa: TRY004
        for url in self.bootstrap_urls + self.peer_urls:
            _ws_url("SwarmConfig", url)
        _board_urls("SwarmConfig", self.board_urls)
        if self.mdns_interfaces is not None and (
            not isinstance(self.mdns_interfaces, tuple) or not self.mdns_interfaces
            or not all(isinstance(i, str) and i for i in self.mdns_interfaces)
        ):
            raise ValueError("SwarmConfig.mdns_interfaces must be None (auto) or a non-empty tuple of names")
        _positive("SwarmConfig", max_connections=self.max_connections, max_inbound_per_ip=self.max_inbound_per_ip,
                  forget_peers_after_s=self.forget_peers_after_s)
        if not isinstance(self.ca_file, str) or len(self.ca_file) > 4096 or "\0" in self.ca_file:
            raise ValueError("SwarmConfig.ca_file must be a file path (or \"\" for the system's CAs)")
        if not isinstance(self.swarm_name, str) or not SWARM_NAME.fullmatch(self.swarm_name):
            raise ValueError(f"SwarmConfig.swarm_name must be 1-63 lower-case letters, digits or '-' "
                             f"(e.g. {DEFAULT_SWARM!r}), got {self.swarm_name!r}")


@dataclass(frozen=True)
class BootstrapConfig:
    """A rendezvous + relay server (`sapo bootstrap`)."""

    host: str = "0.0.0.0"  # address to bind
    port: int = 7700  # port to bind (0 = any free)
    board_urls: tuple[str, ...] = ()  # the data plane it names to nodes (nats://; host 0.0.0.0 = ours)
    # Membership lists: with a board, nodes need no full list (they fetch from the board and learn the
    # swarm's size there), so a list is a sample of the newest nodes, pushed at most this often: a
    # node's membership traffic stays O(1) as the swarm grows. 0 = every node (up to the frame cap).
    peers_sample: int = 0
    peers_min_interval_s: float = 0.1
    max_connections: int = 1000  # peers at most; beyond, the handshake gets HTTP 503
    # connections from one IP address at most (HTTP 429 beyond): one host cannot take every slot.
    # A household or lab behind one NAT shares an address; 0 = no per-address cap (behind a proxy)
    max_connections_per_ip: int = 32
    limits: ProtocolLimits = field(default_factory=ProtocolLimits)  # per-frame limits
    link: LinkConfig = field(default_factory=LinkConfig)  # websocket timings and queues
    # Board credentials for keys this bootstrap has not credentialed before (identities are free, and each
    # key is a board writer with its own quota): per source address (an IPv6 /64) a burst, then one per
    # interval; for the whole bootstrap a burst, then a rate. Beyond, the hello is refused ("try again in
    # N s"). Keys already credentialed (renewals, a node reconnecting) cost nothing.
    new_identity_burst_per_ip: int = 8
    new_identity_interval_per_ip_s: float = 30.0
    new_identity_burst: int = 100
    new_identity_rate_per_s: float = 20.0
    known_identities: int = 65_536  # credentialed keys remembered (LRU); a forgotten one is charged again
    new_identity_addresses: int = 16_384  # addresses with a bucket (LRU); the global one backs the rest
    # Serve wss:// (and /status over https) with this certificate (chain) and its key, PEM files; "" = ws://
    tls_cert_file: str = ""
    tls_key_file: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"BootstrapConfig.port must be 0..65535, got {self.port!r}")
        self._check_new_identities()
        _board_urls("BootstrapConfig", self.board_urls)
        if isinstance(self.peers_sample, bool) or not isinstance(self.peers_sample, int) or self.peers_sample < 0:
            raise ValueError("BootstrapConfig.peers_sample must be an int >= 0")
        _positive("BootstrapConfig", peers_min_interval_s=self.peers_min_interval_s)
        _positive("BootstrapConfig", max_connections=self.max_connections)
        if isinstance(self.max_connections_per_ip, bool) or not isinstance(self.max_connections_per_ip, int) \
                or self.max_connections_per_ip < 0:
            raise ValueError(f"BootstrapConfig.max_connections_per_ip must be an int >= 0, "
                             f"got {self.max_connections_per_ip!r}")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("BootstrapConfig: TLS needs both tls_cert_file and tls_key_file")

    def _check_new_identities(self) -> None:
        _positive("BootstrapConfig", new_identity_interval_per_ip_s=self.new_identity_interval_per_ip_s,
                  new_identity_rate_per_s=self.new_identity_rate_per_s)
        for name in ("new_identity_burst_per_ip", "new_identity_burst", "known_identities",
                     "new_identity_addresses"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"BootstrapConfig.{name} must be an int >= 1, got {value!r}")
