"""`sapo bench relay`: N simulated peers through one bootstrap process on loopback.

The bootstrap runs as its own process (`sapo bootstrap`, default limits, full checks on every frame);
the peers run in this process, each on its own websocket, each signing realistic rollout frames (one
group of 8 completions, ~2.5 KB) at a fixed rate with jitter. Every frame is relayed to the other
N-1 peers. Measured per offered load: frames delivered per second, latency from signing to delivery
(p50/p99/max), frames lost, and the bootstrap's CPU use.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from engine.paths import REPO_ROOT
from engine.sapo.records import Provenance, RolloutGroup
from engine.swarm.config import ProtocolLimits
from engine.swarm.identity import Identity
from engine.swarm.protocol import SwarmProtocol
from engine.swarm.wire import Hello
from engine.tasks.reference import TaskRef, question_hash
from lab import BENCH_DIR

DESCRIPTION = "rollout frames/s and latency through one bootstrap relay, 50 peers on loopback"
GOAL = {"frames_per_s": 5000.0, "p99_ms": 50.0}


def _group(origin: str, index: int, rng: random.Random) -> Any:
    completions = tuple(f"step {rng.randint(0, 99)}: " + "x" * 180 + f" <answer>{rng.randint(0, 99)}</answer>"
                        for _ in range(8))
    ref = TaskRef("basic_arithmetic", {"min_terms": 2, "max_terms": 2}, seed=1, index=index)
    return RolloutGroup(ref, question_hash(f"q{index}"), completions,
                        Provenance(origin, "seed", 1, index, time.time()))


class _Peer:
    def __init__(self, ws: Any, protocol: Any) -> None:
        self.ws, self.protocol = ws, protocol
        self.sent = 0
        self.received = 0
        self.latencies: list[float] = []
        self.measuring = False

    async def read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            while True:
                data = await self.ws.recv(decode=False)
                now = time.time()
                if b'"type":"rollouts"' not in data:
                    continue
                self.received += 1
                if self.measuring:
                    # Canonical frames end with ...,"ts":<float>,"type":...: read ts without parsing it all.
                    start = data.rindex(b'"ts":') + 5
                    self.latencies.append(now - float(data[start:data.index(b",", start)]))
        except ConnectionClosed:
            return

    async def send_loop(self, rate: float, seconds: float, rng: random.Random) -> None:
        deadline = time.monotonic() + seconds
        await asyncio.sleep(rng.random() / rate)  # spread the peers' phases
        while time.monotonic() < deadline:
            [frame] = self.protocol.encode_rollouts([_group(self.protocol.identity.peer_id, self.sent, rng)])
            await self.ws.send(frame, text=True)
            self.sent += 1
            await asyncio.sleep(rng.expovariate(rate))  # Poisson arrivals: bursts, as real rounds end


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def connect_peer(url: str) -> tuple[Any, Any]:
    """A simulated peer on a bootstrap: a fresh identity, its websocket, its hello sent -> (protocol, ws)."""
    from websockets.asyncio.client import connect

    limits = ProtocolLimits()
    protocol = SwarmProtocol(Identity.generate(), limits)
    ws = await connect(url, compression=None, max_size=limits.max_frame_bytes, max_queue=None)
    hello = Hello(protocol.identity.instance, "node", "seed", "bench", None).to_wire()
    await ws.send(protocol.encode("hello", {**hello, "started": time.time()}), text=True)
    return protocol, ws


async def _measure(url: str, peers_n: int, rate: float, seconds: float, warmup: float, pid: int) -> dict[str, Any]:
    import psutil

    peers = []
    for _ in range(peers_n):
        protocol, ws = await connect_peer(url)
        peers.append(_Peer(ws, protocol))
    readers = [asyncio.create_task(p.read()) for p in peers]
    await asyncio.sleep(0.5)  # peer lists settle
    rng = random.Random(0)
    senders = [asyncio.create_task(p.send_loop(rate, warmup + seconds + 0.5, random.Random(rng.random())))
               for p in peers]
    await asyncio.sleep(warmup)
    proc, me = psutil.Process(pid), psutil.Process()
    cpu0, mine0 = proc.cpu_times(), me.cpu_times()
    received0, sent0 = sum(p.received for p in peers), sum(p.sent for p in peers)
    for p in peers:
        p.measuring = True
    started = time.monotonic()
    await asyncio.sleep(seconds)  # the measurement window: a fixed span while every peer is sending
    elapsed = time.monotonic() - started
    delivered = sum(p.received for p in peers) - received0
    sent_in_window = sum(p.sent for p in peers) - sent0
    cpu1, mine1 = proc.cpu_times(), me.cpu_times()
    for p in peers:
        p.measuring = False
    await asyncio.gather(*senders)
    await asyncio.sleep(1.0)  # let the tail drain before counting losses
    sent = sum(p.sent for p in peers)
    expected = sent * (peers_n - 1)
    received = sum(p.received for p in peers)
    latencies = [lat for p in peers for lat in p.latencies]
    for p in peers:
        await p.ws.close()
    for task in readers:
        task.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / elapsed
    peers_cpu = (mine1.user + mine1.system - mine0.user - mine0.system) / elapsed
    return {"rate_per_peer": rate, "frames_in_per_s": round(sent_in_window / elapsed, 1),
            "delivered_per_s": round(delivered / elapsed, 1),
            "p50_ms": round(1000 * _percentile(latencies, 0.50), 2),
            "p99_ms": round(1000 * _percentile(latencies, 0.99), 2),
            "max_ms": round(1000 * max(latencies, default=float("nan")), 2),
            "lost": expected - received, "expected": expected, "bootstrap_cpu": round(cpu, 2),
            "peers_cpu": round(peers_cpu, 2), "load_avg_1m": round(os.getloadavg()[0], 2)}


def start_bootstrap(port: int) -> subprocess.Popen[bytes]:
    import urllib.request

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "engine", "bootstrap", "--host", "127.0.0.1",
                             "--port", str(port), "--max-per-ip", "0", "--no-nats"], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=1):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the bootstrap process did not come up")


def run(out_dir: Path = BENCH_DIR, peers: int = 50, rates: list[float] | None = None, seconds: float = 8.0,
        warmup: float = 1.0) -> dict[str, Any]:
    """Offered load per peer (frames/s) in `rates`; each load runs `seconds` after `warmup`."""
    import socket
    import urllib.request

    rates = rates or [3.0, 4.0, 6.0, 8.0]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    bootstrap = start_bootstrap(port)
    try:
        rows = [asyncio.run(_measure(f"ws://127.0.0.1:{port}", peers, rate, seconds, warmup, bootstrap.pid))
                for rate in rates]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as resp:
            status = json.loads(resp.read())
    finally:
        bootstrap.terminate()
        bootstrap.wait(timeout=10)
    best = max((r for r in rows if r["p99_ms"] < GOAL["p99_ms"]), key=lambda r: r["delivered_per_s"],
               default=None)
    result = {"peers": peers, "seconds": seconds, "frame_bytes": _frame_size(), "cores": os.cpu_count(),
              "rows": rows, "goal": GOAL, "best_within_p99_goal": best,
              "goal_met": bool(best and best["delivered_per_s"] >= GOAL["frames_per_s"]),
              "bootstrap_refusals": status["refusals"], "bootstrap_relayed": status["frames"]["relayed"]}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "relay.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / "relay.md").write_text(table(result) + "\n")
    return result


def _frame_size() -> int:
    proto = SwarmProtocol(Identity.generate(), ProtocolLimits())
    return len(proto.encode_rollouts([_group(proto.identity.peer_id, 0, random.Random(0))])[0])


def table(result: dict[str, Any]) -> str:
    lines = [f"# Relay: {result['peers']} peers through one bootstrap (loopback, {result['cores']} cores)", "",
             (f"Rollout frame: {result['frame_bytes']} bytes (1 group x 8 completions). Goal: >= "
              f"{GOAL['frames_per_s']:.0f} delivered frames/s with p99 < {GOAL['p99_ms']:.0f} ms."), "",
             ("| offered/peer (frames/s) | in (frames/s) | delivered (frames/s) | p50 ms | p99 ms | max ms "
              "| lost | bootstrap CPU | peers' CPU | load avg |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['rate_per_peer']:g} | {r['frames_in_per_s']:.0f} | {r['delivered_per_s']:.0f} | "
                     f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} | {r['lost']} of "
                     f"{r['expected']} | {100 * r['bootstrap_cpu']:.0f}% | {100 * r['peers_cpu']:.0f}% | "
                     f"{r['load_avg_1m']:.1f} |")
    lines += ["", (f"Goal met: {'yes' if result['goal_met'] else 'no'}. Bootstrap refusals: "
                   f"{result['bootstrap_refusals'] or 'none'}.")]
    return "\n".join(lines)
