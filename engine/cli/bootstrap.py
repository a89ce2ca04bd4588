"""`sapo bootstrap`: run a rendezvous + relay server for peers behind NAT (and a /status page)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("bootstrap", help="run a rendezvous + relay server for the swarm",
                       description="Peers dial out to this server; it lists who is there and relays their "
                       "signed rollout frames to each other. GET http://HOST:PORT/status shows peers, "
                       "frames relayed and refusals.")
    p.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=7700, help="port to bind (default 7700; 0 = any free)")
    p.add_argument("--link", action="append", default=[], metavar="URL",
                   help="another bootstrap server to link with (ws://host:port); repeatable")
    p.add_argument("--max-connections", type=int, default=1000, help="peers at most (default 1000)")
    p.add_argument("--max-per-ip", type=int, default=32,
                   help="connections from one IP address at most (default 32; 0 = no cap, e.g. behind a proxy)")
    p.add_argument("--peer-rate", type=float, default=None,
                   help="frames per second one peer may send (token bucket refill)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="keep this server's identity key here (default: a new identity each start)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import dataclasses
    import sys

    from engine.swarm.bootstrap import BootstrapServer
    from engine.swarm.config import BootstrapConfig, ProtocolLimits
    from engine.swarm.errors import SwarmError
    from engine.swarm.identity import Identity

    try:
        limits = ProtocolLimits()
        if args.peer_rate is not None:
            limits = dataclasses.replace(limits, peer_rate_per_s=args.peer_rate)
        config = BootstrapConfig(host=args.host, port=args.port, link_urls=tuple(args.link),
                                 max_connections=args.max_connections, max_connections_per_ip=args.max_per_ip,
                                 limits=limits)
        identity = Identity.load_or_create(args.data_dir) if args.data_dir else Identity.generate()
    except (ValueError, SwarmError) as exc:
        print(f"sapo bootstrap: {exc}", file=sys.stderr)
        return 2
    server = BootstrapServer(config, identity)

    async def main() -> None:
        import signal

        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if task is not None:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, task.cancel)  # graceful: peers get a bye
        await server.serve_forever()

    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        return 0
    except SwarmError as exc:
        print(f"sapo bootstrap: {exc}", file=sys.stderr)
        return 1
    return 0
