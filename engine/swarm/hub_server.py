"""Running a community hub (engine/swarm/hub.py): a nats-server without JetStream, in operator mode
with the swarm's public claims, whose one leaf connection to the board carries its nodes' traffic."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engine.swarm.hub import HubCredential, creds_text, hub_server_config, nkey_seed, public_nkey
from engine.swarm.nats_auth import decode_jwt
from engine.swarm.nats_server import NatsServer, NatsServerConfig

CREDS_FILE = "hub-leaf.creds"  # the leaf remote's JWT + seed, written 0600 into the hub's data dir


def write_creds(data_dir: Path, key: Ed25519PrivateKey, cred: HubCredential) -> Path:
    path = Path(data_dir) / CREDS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(creds_text(cred.jwt, nkey_seed("U", key)))
    tmp.replace(path)
    return path


def hub_server(data_dir: Path, key: Ed25519PrivateKey, cred: HubCredential, board_urls: Sequence[str], *,
               host: str = "127.0.0.1", port: int = 0, websocket_port: int | None = None,
               monitor_port: int | None = 0) -> NatsServer:
    """The hub's server (not started). Its nodes connect to it with their own board credentials."""
    if decode_jwt(cred.jwt).get("sub") != public_nkey(key):
        raise ValueError("this hub credential was issued to another hub key")
    creds = write_creds(data_dir, key, cred)
    config = NatsServerConfig(host=host, port=port, websocket_port=websocket_port, monitor_port=monitor_port,
                              jetstream=False, server_name=f"sapo-hub-{public_nkey(key)[:8]}",
                              auth_config=hub_server_config(cred, creds, board_urls))
    return NatsServer(config)


def leaf_status(server: NatsServer, timeout_s: float = 2.0) -> dict[str, Any]:
    """The hub's leaf connection as its own monitoring port reports it: {"connected", "nodes"}."""
    if server.monitor_url is None:
        return {"connected": None, "nodes": None}
    with urllib.request.urlopen(server.monitor_url + "/leafz", timeout=timeout_s) as resp:
        leafz = json.loads(resp.read(1 << 20))
    with urllib.request.urlopen(server.monitor_url + "/connz", timeout=timeout_s) as resp:
        connz = json.loads(resp.read(4 << 20))
    leafs = leafz.get("leafnodes") if isinstance(leafz, dict) else None
    conns = connz.get("connections") if isinstance(connz, dict) else None
    nodes = sum(isinstance(c, dict) and c.get("kind") == "Client" for c in conns) if isinstance(conns, list) else None
    return {"connected": bool(isinstance(leafs, int) and leafs > 0), "nodes": nodes}
