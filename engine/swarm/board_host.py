"""The board a bootstrap hosts or names: its embedded nats-server (ports, start, restarts), the stream
made on it or on an operator's cluster, and the refusal of a cluster anyone may enter. `sapo bootstrap`
(engine/cli/bootstrap.py) reads its flags and calls these; the server's own process control is
engine/swarm/nats_server.py, the stream and its credentials engine/swarm/nats_board.py and nats_auth.py."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from engine.swarm.errors import ConnectError
from engine.swarm.nats_board import create_board_stream, quiet_errors
from engine.swarm.nats_server import NatsServer, NatsServerConfig

BOARD_STORE = "board"  # the embedded board's JetStream directory in --data-dir
BOARD_FILE_STORE_BYTES = 1 << 30  # its disk at most (the stream itself is capped lower, by the quota)


def nats_ports(port: int, nats_port: int | None, ws_port: int | None) -> tuple[int, int | None]:
    """The embedded server's client and websocket ports: given, or next to --port so that bootstraps on
    different --port values on one host do not collide (with --port 0: free ones). None: no websocket."""
    if nats_port is None:
        nats_port = port + 1 if port else 0
    if ws_port is None:
        ws_port = port + 2 if port else 0
    for flag, value in (("--nats-port", nats_port), ("--nats-ws-port", ws_port)):
        if value > 65535 or value < (-1 if flag == "--nats-ws-port" else 0):
            raise ValueError(f"{flag} {value} is not a port number: choose one with {flag} (0 = any free)")
    return nats_port, None if ws_port < 0 else ws_port


def start_embedded_server(host: str, port: int, auth_config: str, ws_port: int | None, tls_cert: Path | None = None,
                tls_key: Path | None = None, store_dir: Path | None = None, leaf_port: int | None = None) -> Any:
    """`store_dir`: where the board's stream is kept on disk (None: in memory, gone with the server);
    `leaf_port`: a leaf-node listener for community hubs (None: none)."""
    return NatsServer(NatsServerConfig(host=host, port=port, websocket_port=ws_port, monitor_port=0,
                                       auth_config=auth_config, tls_cert_file=tls_cert, tls_key_file=tls_key,
                                       store_dir=store_dir, max_file_store_bytes=BOARD_FILE_STORE_BYTES
                                       if store_dir is not None else 0, leafnode_port=leaf_port)).start()


def board_storage(nats: Any) -> str:
    """Where the board's stream lives: on disk when the embedded server has a store in the data dir."""
    return "file" if nats is not None and nats.cfg.max_file_store_bytes > 0 else "memory"


async def create_board(urls: list[str], authority: Any, replicas: int, tls: Any = None,
                        patience_s: float = 30.0, storage: str = "memory") -> None:
    """Make the board's stream; a cluster still electing its JetStream leader gets `patience_s`."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            await create_board_stream(urls, authority, replicas=replicas, tls=tls, storage=storage)
            return
        except Exception as exc:  # nats-py raises unrelated types; the last one is reported
            why = getattr(exc, "why", "") or str(exc) or type(exc).__name__
            if "Authorization" in why:  # another operator's cluster, or an open one: waiting cannot help
                raise ConnectError(", ".join(urls), why, "the cluster does not know this bootstrap's keys: "
                                   "write them with `sapo bootstrap --data-dir DIR --nats-auth-out FILE` and "
                                   "include FILE in every server's config (or pass --nats-open)") from exc
            if time.monotonic() >= deadline:
                raise ConnectError(", ".join(urls), why, "is the cluster up, with JetStream, and are there "
                                   f"at least {replicas} servers for --board-replicas?") from exc
            await asyncio.sleep(1.0)


async def refuse_open_cluster(urls: list[str]) -> None:
    """Credentials mean nothing on a cluster that also lets anyone in: say so instead of pretending."""
    import nats

    try:
        anonymous = await nats.connect(servers=urls, connect_timeout=3.0, allow_reconnect=False,
                                       max_reconnect_attempts=1, error_cb=quiet_errors)
    except Exception:  # noqa: BLE001 -- refused, as it should be
        return
    await anonymous.close()
    raise ConnectError(", ".join(urls), "the cluster accepts clients without credentials",
                       "any client could overwrite any node's slot: include the file from `sapo bootstrap "
                       "--data-dir DIR --nats-auth-out FILE` in every server's config, or pass --nats-open")


def advertised_url(host: str, port: int, scheme: str = "nats") -> str:
    """What nodes are told: 0.0.0.0 means "the host you reached this bootstrap at"."""
    return f"{scheme}://{host if host not in ('', '::') else '0.0.0.0'}:{port}"


async def supervise_server(nats: Any, every_s: float = 2.0) -> None:
    """Restart the embedded nats-server on the same ports if it dies (nodes reconnect by themselves)."""
    while True:
        await asyncio.sleep(every_s)
        if nats.proc is None or nats.proc.poll() is not None:
            print(f"[warning] board: nats-server exited ({nats.log_tail(300)!r}); restarting it", file=sys.stderr,
                  flush=True)
            try:
                nats.start()  # on the loop's (main) thread: the server's death signal follows this thread
            except Exception as exc:  # noqa: BLE001 -- keep trying: the rendezvous itself stays up
                print(f"[error] board: nats-server did not restart: {exc}", file=sys.stderr, flush=True)
