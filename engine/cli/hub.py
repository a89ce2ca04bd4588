"""`sapo hub`: a community hub (a LAN party's, a lab's): one WAN connection to the board for many nodes.

    sapo hub key --data-dir D                       the hub's key (its name on the board)
    sapo hub consent --data-dir NODE --hub KEY      a node's signed consent to be served by that hub
    sapo hub issue --data-dir BOOT --hub KEY --member FILE... --out CRED   (the bootstrap's operator)
    sapo hub run --board nats-leaf://HOST:PORT --credential CRED --data-dir D [--host H --port P]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from engine.swarm.errors import SwarmError


def register(sub: Any) -> None:
    p = sub.add_parser("hub", help="run a community hub: one connection to the board for a LAN's nodes",
                       description="A hub is a nats-server that is a leaf node of the swarm's board. Its nodes "
                       "connect to it (sapo run --nats nats://HUB:PORT) with their own credentials; the board "
                       "lets the hub write only its consenting members' keys.")
    hub = p.add_subparsers(dest="hub_command", required=True, metavar="STEP")
    key = hub.add_parser("key", help="print this hub's key (made on first use)")
    key.add_argument("--data-dir", type=Path, required=True)
    consent = hub.add_parser("consent", help="a node's signed consent to be served by a hub (JSON on stdout)")
    consent.add_argument("--data-dir", type=Path, required=True, help="the node's data dir (its identity)")
    consent.add_argument("--hub", required=True, metavar="KEY", help="the hub's key (sapo hub key)")
    consent.add_argument("--days", type=float, default=30.0, help="how long the consent holds (default 30)")
    issue = hub.add_parser("issue", help="the bootstrap's operator: a hub's leaf credential for its members")
    issue.add_argument("--data-dir", type=Path, required=True, help="the bootstrap's --data-dir (its keys)")
    issue.add_argument("--hub", required=True, metavar="KEY")
    issue.add_argument("--member", type=Path, action="append", required=True, metavar="FILE",
                       help="a member's consent (repeatable)")
    issue.add_argument("--ttl", type=float, default=7 * 86400.0, help="seconds the credential lasts (default 7 days)")
    issue.add_argument("--out", type=Path, required=True)
    run = hub.add_parser("run", help="run the hub")
    run.add_argument("--board", action="append", required=True, metavar="URL",
                     help="the board's leaf node listener (nats-leaf:// or tls://host:port; repeatable)")
    run.add_argument("--credential", type=Path, required=True, metavar="FILE", help="from sapo hub issue")
    run.add_argument("--data-dir", type=Path, required=True, help="the hub's key lives here")
    run.add_argument("--host", default="0.0.0.0", help="address its nodes reach it at (default 0.0.0.0)")
    run.add_argument("--port", type=int, default=4222, help="port for its nodes (default 4222)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        return {"key": _key, "consent": _consent, "issue": _issue, "run": _run}[args.hub_command](args)
    except (ValueError, OSError, SwarmError) as exc:
        print(f"sapo hub {args.hub_command}: {exc}", file=sys.stderr)
        return 2


def _key(args: argparse.Namespace) -> int:
    from engine.swarm.hub import load_or_create_hub_key, public_nkey

    print(public_nkey(load_or_create_hub_key(args.data_dir)))
    return 0


def _consent(args: argparse.Namespace) -> int:
    from engine.swarm.hub import member_proof
    from engine.swarm.identity import Identity

    if not 0 < args.days <= 365:
        raise ValueError("--days must be in (0, 365]")
    print(json.dumps(member_proof(Identity.load_or_create(args.data_dir), args.hub, time.time() + args.days * 86400)))
    return 0


def _issue(args: argparse.Namespace) -> int:
    from engine.swarm.hub import make_hub_credential
    from engine.swarm.nats_auth import KEYS_FILE, Authority

    keys = args.data_dir / KEYS_FILE
    if not keys.is_file():  # never make new keys here: the running bootstrap would not know them
        raise ValueError(f"{keys} does not exist: give the bootstrap's --data-dir")
    authority = Authority.from_private_keys(json.loads(keys.read_text()))
    proofs = [json.loads(path.read_text()) for path in args.member]
    cred = make_hub_credential(authority, args.hub, proofs, args.ttl)
    args.out.write_text(cred.to_json())
    print(f"hub credential for {len(cred.members)} member(s), until "
          f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(cred.expires_at))}: {args.out}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from engine.swarm.hub import HubCredential, load_or_create_hub_key, public_nkey
    from engine.swarm.hub_server import hub_server, leaf_status

    key = load_or_create_hub_key(args.data_dir)
    cred = HubCredential.from_json(args.credential.read_text(), public_nkey(key))
    with hub_server(args.data_dir, key, cred, args.board, host=args.host, port=args.port) as server:
        print(f"sapo hub: serving {len(cred.members)} member(s) at nats://{args.host}:{server.ports['client']} "
              f"(sapo run --nats nats://THIS_HOST:{server.ports['client']}); board {', '.join(args.board)}")
        try:
            while time.time() < cred.expires_at:
                if server.proc is None or server.proc.poll() is not None:
                    raise SwarmError(f"the hub's nats-server stopped: {server.log_tail()}")
                status = leaf_status(server)
                print(f"sapo hub: leaf {'up' if status['connected'] else 'DOWN'}, {status['nodes']} node(s)",
                      flush=True)
                time.sleep(30)
        except KeyboardInterrupt:
            return 0
    print("sapo hub: the credential expired: ask the bootstrap's operator for a new one", file=sys.stderr)
    return 1
