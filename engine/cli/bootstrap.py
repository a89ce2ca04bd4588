"""`sapo bootstrap`: the swarm's rendezvous, its board (an embedded, supervised nats-server) and a
/status page."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engine.swarm.nats_server import PortInUseError, port_in_use

# what to change when one of the embedded server's ports is taken
_NATS_PORT_FLAGS = {"client": "--nats-port", "websocket": "--nats-ws-port"}


def register(sub: Any) -> None:
    p = sub.add_parser("bootstrap", help="run the swarm's rendezvous and its board (an embedded nats-server)",
                       description="Peers dial out to this server; it lists who is there, names the board "
                       "(store one, fetch J) and issues each node a credential for its own board key. "
                       "GET http://HOST:PORT/status (https:// with --tls-cert) shows peers, the board's "
                       "figures and refusals.")
    p.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=7700, help="port to bind (default 7700; 0 = any free)")
    p.add_argument("--max-connections", type=int, default=1000, help="peers at most (default 1000)")
    p.add_argument("--max-per-ip", type=int, default=32,
                   help="connections from one IP address at most (default 32; 0 = no cap, e.g. behind a proxy)")
    p.add_argument("--new-ids-per-ip", type=int, default=8,
                   help="new identities one IP address may get credentials for at once, then one per 30 s "
                        "(default 8; raise it behind a reverse proxy, where every node shares its address)")
    p.add_argument("--peer-rate", type=float, default=None,
                   help="frames per second one peer may send (token bucket refill)")
    p.add_argument("--nats", action="append", default=[], metavar="URL",
                   help="the swarm's board is this existing NATS cluster (nats:// or tls://host:port, repeatable), in "
                        "operator mode with this bootstrap's keys (see --nats-auth-out; needs --data-dir); "
                        "default: start an embedded nats-server with JetStream")
    p.add_argument("--nats-auth-out", type=Path, default=None, metavar="FILE",
                   help="write the operator-mode lines for an operator's own nats-servers (include FILE in "
                        "each server's config) from the keys in --data-dir, then exit")
    p.add_argument("--nats-open", action="store_true",
                   help="with --nats: the cluster takes anonymous clients and nodes get no credential (a "
                        "network you trust only: any client can overwrite any node's slot)")
    p.add_argument("--board-replicas", type=int, default=1,
                   help="copies of the board's stream in a --nats cluster (1-5; 3 survives a server's loss)")
    p.add_argument("--nats-port", type=int, default=None, metavar="N",
                   help="the embedded nats-server's port (default: --port + 1, any free with --port 0; "
                        "0 = any free)")
    p.add_argument("--nats-ws-port", type=int, default=None, metavar="N",
                   help="its websocket port, for nodes that reach only HTTP(S) (default: --port + 2, any free "
                        "with --port 0; 0 = any free, -1 = none)")
    p.add_argument("--nats-leaf-port", type=int, default=None, metavar="N",
                   help="open a leaf-node listener on the embedded board for community hubs (sapo hub; none "
                        "by default, 0 = any free): a hub logs in with the credential `sapo hub issue` made, "
                        "bounded to its members' own permissions")
    p.add_argument("--tls-cert", type=Path, default=None, metavar="FILE",
                   help="serve TLS with this certificate (PEM, the chain after it): wss:// for the rendezvous, "
                        "tls:// and wss:// for the embedded board; nodes check it against their system CAs, or "
                        "a CA file you hand out (sapo run --ca FILE). Needs --tls-key")
    p.add_argument("--tls-key", type=Path, default=None, metavar="FILE",
                   help="the certificate's private key (PEM, unencrypted, readable only by this user)")
    p.add_argument("--credential-ttl", type=float, default=3600.0,
                   help="lifetime of a node's board credential in seconds (renewed at a third of it)")
    p.add_argument("--no-nats", action="store_true",
                   help="no board: relay rollouts to every peer as before (LAN parties; O(N^2) traffic)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="keep this server's identity and board keys here, and the embedded board's frames: a "
                        "restart keeps nodes' credentials and the board (default: new keys each start)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import dataclasses
    import sys

    from engine.swarm.config import BootstrapConfig, ProtocolLimits
    from engine.swarm.errors import SwarmError
    from engine.swarm.identity import Identity

    if args.nats_auth_out is not None:
        return _write_nats_auth(args)
    try:
        limits = ProtocolLimits()
        if args.peer_rate is not None:
            limits = dataclasses.replace(limits, peer_rate_per_s=args.peer_rate)
        own_tls = _check_tls(args.tls_cert, args.tls_key)
        if 0 < args.port <= 65535 and port_in_use(args.host, args.port):  # say so before the board starts
            raise ValueError(f"port {args.port} on {args.host} is already in use (another bootstrap on this "
                             "host?): choose another with --port (0 = any free)")
        config = BootstrapConfig(host=args.host, port=args.port,
                                 max_connections=args.max_connections, max_connections_per_ip=args.max_per_ip,
                                 new_identity_burst_per_ip=args.new_ids_per_ip,
                                 limits=limits, tls_cert_file=str(args.tls_cert or ""),
                                 tls_key_file=str(args.tls_key or ""))
        identity = Identity.load_or_create(args.data_dir) if args.data_dir else Identity.generate()
    except (ValueError, SwarmError) as exc:
        print(f"sapo bootstrap: {exc}", file=sys.stderr)
        return 2
    try:
        config, nats, authority = _with_board(args, config, own_tls is not None)
    except (ValueError, SwarmError) as exc:
        print(f"sapo bootstrap: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(args, config, identity, authority, nats, own_tls if nats is not None else None))
    except asyncio.CancelledError:
        return 0
    except SwarmError as exc:
        print(f"sapo bootstrap: {exc}", file=sys.stderr)
        return 1
    finally:
        if nats is not None:
            nats.close()
    return 0


def _with_board(args: argparse.Namespace, config: Any, own_tls: bool) -> tuple[Any, Any, Any]:
    """The board the flags ask for -> (the config naming it, the embedded nats-server or None, the
    authority that issues credentials for it or None)."""
    import dataclasses
    import sys

    nats = authority = None
    board_lists: dict[str, Any] = {"peers_sample": 64, "peers_min_interval_s": 2.0}  # membership O(1) per node
    if not 1 <= args.board_replicas <= 5:
        raise ValueError("--board-replicas must be between 1 and 5")
    if args.nats:
        config = dataclasses.replace(config, board_urls=tuple(args.nats), **board_lists)
        if not args.nats_open:
            if args.data_dir is None:
                raise ValueError("--nats needs --data-dir (the keys the cluster was configured with, "
                                 "see --nats-auth-out), or --nats-open for a cluster without credentials")
            from engine.swarm.nats_auth import Authority

            authority = Authority.load_or_create(args.data_dir)
            print(f"[info] board: NATS cluster {', '.join(args.nats)} (each node may write only its own key)",
                  file=sys.stderr, flush=True)
    elif not args.no_nats:
        nats, authority, advertised = _embedded_board(args, own_tls)
        config = dataclasses.replace(config, board_urls=tuple(advertised), **board_lists)
    return config, nats, authority


def _log(level: str, message: str) -> None:
    import sys

    print(f"[{level}] {message}", file=sys.stderr, flush=True)


async def _serve(args: argparse.Namespace, config: Any, identity: Any, authority: Any, nats: Any,
                 board_tls: Any) -> None:
    """The rendezvous, and with a board its watches: the embedded server alive, the stream there, and
    (on the embedded server, whose loopback monitoring port it reads) every node within its budget.
    `board_tls`: the bootstrap's own connections to its embedded server trust exactly its certificate."""
    import asyncio
    import signal

    from engine.swarm import board_host
    from engine.swarm.board_warden import BANS_FILE, Warden, WardenConfig, run_warden
    from engine.swarm.bootstrap import BootstrapServer
    from engine.swarm.nats_auth import user_nkey_of
    from engine.swarm.nats_board import keep_board_stream

    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)  # graceful: peers get a bye
    # a revoked key stays out at least until every credential issued to it before has expired
    bans = Path(args.data_dir) / BANS_FILE if args.data_dir else None  # a restart lifts no ban
    warden = Warden(WardenConfig(ban_s=max(3600.0, args.credential_ttl)), store=bans) if nats is not None else None

    def issue(peer_id: str) -> Any:
        if warden is not None and warden.banned(user_nkey_of(peer_id)):
            return None
        return authority.issue(peer_id, authority.stream, args.credential_ttl)

    server = BootstrapServer(config, identity, issue_credential=issue if authority is not None else None,
                             credential_ttl_s=args.credential_ttl,
                             data_plane_monitor=nats.monitor_url if nats is not None else None)
    watchdogs = []
    if authority is not None:
        urls = [nats.url] if nats is not None else list(args.nats)
        storage = board_host.board_storage(nats)
        await board_host.create_board(urls, authority, args.board_replicas, board_tls, storage=storage)
        if nats is None:
            await board_host.refuse_open_cluster(urls)
        # a restarted server (ours or the operator's) lost the memory stream
        watchdogs.append(keep_board_stream(urls, authority, _log, replicas=args.board_replicas, tls=board_tls,
                                           storage=storage))
    if nats is not None:
        watchdogs.append(board_host.supervise_server(nats))
        if authority is not None and warden is not None:
            watchdogs.append(run_warden(warden, nats.monitor_url, [nats.url], authority, _log, board_tls))
    tasks = [asyncio.ensure_future(w) for w in watchdogs]
    try:
        await server.serve_forever()
    finally:
        for watchdog in tasks:
            watchdog.cancel()


def _check_tls(cert: Path | None, key: Path | None) -> Any:
    """--tls-cert/--tls-key checked before anything starts -> the context the bootstrap reaches its own
    board with (None: no TLS). Raises TlsError (a SwarmError) with what is wrong with which file."""
    from engine.swarm.tls import TlsError, own_server_context, server_context

    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise TlsError("--tls-cert and --tls-key go together: the certificate and its private key")
    server_context(cert, key)
    return own_server_context(cert)


def _embedded_board(args: argparse.Namespace, own_tls: bool) -> tuple[Any, Any, list[str]]:
    """Start the embedded nats-server with this bootstrap's keys -> (server, authority, the URLs nodes are
    told). A taken port is a ValueError naming the port and the flag that moves it."""
    import sys

    from engine.swarm import board_host
    from engine.swarm.nats_auth import Authority

    authority = Authority.load_or_create(args.data_dir) if args.data_dir else Authority.generate()
    nats_port, ws_port = board_host.nats_ports(args.port, args.nats_port, args.nats_ws_port)
    # with a data dir the board's frames are kept there: a restart loses neither credentials nor frames
    store = Path(args.data_dir) / board_host.BOARD_STORE if args.data_dir else None
    try:
        nats = board_host.start_embedded_server(args.host, nats_port, authority.server_config(), ws_port, args.tls_cert, args.tls_key,
                           store, args.nats_leaf_port)
    except PortInUseError as exc:
        raise ValueError(f"the embedded nats-server's port {exc.port} on {exc.host} is already in use (another "
                         f"bootstrap or nats-server on this host?): choose another with "
                         f"{_NATS_PORT_FLAGS.get(exc.name, '--nats-port')} (0 = any free), or another --port"
                         ) from exc
    advertised = [board_host.advertised_url(args.host, nats.ports["client"], "tls" if own_tls else "nats")]
    if "websocket" in nats.ports:
        advertised.append(board_host.advertised_url(args.host, nats.ports["websocket"], "wss" if own_tls else "ws"))
    print(f"[info] board: embedded nats-server {nats.url} (JetStream; each node may write only its own key)",
          file=sys.stderr, flush=True)
    if "leafnode" in nats.ports:
        print(f"[info] board: community hubs connect to leaf port {nats.ports['leafnode']}", file=sys.stderr, flush=True)
    return nats, authority, advertised


def _write_nats_auth(args: argparse.Namespace) -> int:
    """The operator-mode lines an operator includes in each of their own nats-servers' configs."""
    import sys

    from engine.swarm.nats_auth import Authority

    if args.data_dir is None:
        print("sapo bootstrap: --nats-auth-out needs --data-dir (where this bootstrap keeps its keys)", file=sys.stderr)
        return 2
    authority = Authority.load_or_create(args.data_dir)
    out = Path(args.nats_auth_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("# SAPO Swarm board: operator mode with this bootstrap's keys (JWTs only, no secret).\n"
                   "# Include it in every server of the cluster: include \"" + out.name + "\"\n"
                   + authority.server_config())
    tmp.replace(out)
    print(f"wrote {out}: include it in each nats-server's config (with jetstream and cluster routes), then run "
          f"sapo bootstrap --data-dir {args.data_dir} --nats nats://SERVER:4222 ... --board-replicas 3",
          file=sys.stderr)
    return 0
