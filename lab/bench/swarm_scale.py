"""`sapo bench swarm-scale`: what one node downloads per round as the swarm grows, board vs relay.

Simulated lightweight nodes (the real protocol encoders, signatures and client code; no trainers), one
paper-sized rollout frame (8 groups x 8 completions, ~23 KB) per node per round, in worker processes:

  board  an embedded nats-server (operator mode, a credential per node, the JetStream board): each
         node puts its frame and fetches J = 4 of others' with the node's own BoardReader (every frame
         verified). N = 10, 100, 1000.
  relay  `sapo bootstrap --no-nats`, the broadcast relay this replaces: each node sends its frame on
         its websocket and receives everyone's. N <= 200.

Per point: bytes received per node per round (the client's own byte counters), frames per node per
round, fetch (board: one direct get; relay: signing-to-delivery) p50/p99, lost rollouts, server CPU
and RSS. A least-squares fit of log(ingress) on log(N) per backend gives the growth law.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.paths import REPO_ROOT
from engine.sapo.records import Provenance, RolloutGroup
from engine.swarm.board import BoardReader, fetch
from engine.swarm.config import ProtocolLimits
from engine.swarm.identity import Identity
from engine.swarm.nats_auth import NODE_API_PREFIX, Authority, connect_options, node_inbox
from engine.swarm.nats_board import NatsBoard, create_board_stream
from engine.swarm.nats_server import NatsServer, NatsServerConfig, free_port
from engine.swarm.protocol import SwarmProtocol
from engine.tasks.reference import TaskRef, question_hash
from lab import BENCH_DIR
from lab.bench.relay import connect_peer, start_bootstrap

DESCRIPTION = "per-node ingress, fetch latency and loss vs swarm size: the NATS board against the broadcast relay"
LONG = True
J = 4


def paper_groups(origin: str, round_no: int, rng: random.Random) -> list[Any]:
    groups = []
    for g in range(8):
        completions = tuple(f"Let me add the numbers step by step: {rng.randint(0, 999)} + {rng.randint(0, 999)} "
                            + "then carry " * 20 + f"<answer>{rng.randint(0, 9999)}</answer>" for _ in range(8))
        ref = TaskRef("basic_arithmetic", {"min_terms": 2, "max_terms": 2}, seed=1, index=round_no * 8 + g)
        groups.append(RolloutGroup(ref, question_hash(f"q{round_no}-{g}"), completions,
                                   Provenance(origin, "seed", round_no, round_no, time.time())))
    return groups


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- the board arm: a worker process simulates a slice of the nodes -------------------------------

class _TimedBoard:
    """A board whose single reads are timed (what a node waits for one peer's frame)."""

    def __init__(self, board: Any, latencies: list[float]) -> None:
        self.board, self.latencies = board, latencies

    async def extent(self) -> tuple[int, int]:
        return await self.board.extent()

    async def get_from(self, slot: int) -> Any:
        t0 = time.perf_counter()
        try:
            return await self.board.get_from(slot)
        finally:
            self.latencies.append((time.perf_counter() - t0) * 1000)


async def _board_worker(args: dict[str, Any]) -> dict[str, Any]:
    auth = Authority.from_private_keys(args["keys"], stream=args["stream"])
    n, offset, total = args["nodes"], args["offset"], args["total"]
    period, rounds = args["period_s"], args["rounds"]
    latencies: list[float] = []
    nodes = []
    for _ in range(n):
        ident = Identity.generate()
        cred = auth.issue(ident.peer_id, args["stream"], 3600)
        board = NatsBoard([args["url"]], stream=args["stream"], create=False, api_prefix=NODE_API_PREFIX,
                          connect_options=connect_options(ident.sign, lambda c=cred: c, node_inbox(ident.peer_id)))
        await board.connect(timeout_s=10)
        nodes.append((ident, SwarmProtocol(ident, ProtocolLimits()), board))
    stats = {"puts": 0, "put_failures": 0, "frames_fetched": 0, "short_fetches": 0, "refused": 0,
             "in_bytes": 0, "node_rounds": 0, "frame_bytes": 0}
    start_at = args["start_at"]

    async def run_node(k: int, ident: Any, proto: Any, board: Any) -> None:
        rng = random.Random(k)
        reader = BoardReader(proto, rng=rng)
        timed = _TimedBoard(board, latencies)
        phase = (offset + k) / total * period
        for r in range(rounds):
            await asyncio.sleep(max(0.0, start_at + r * period + phase - time.time()))
            (frame,) = proto.encode_rollouts(paper_groups(ident.peer_id, r, rng))
            stats["frame_bytes"] = len(frame)
            before = board.nc.stats["in_bytes"]
            try:
                await board.put(ident.peer_id, frame)
                stats["puts"] += 1
            except Exception:  # noqa: BLE001 -- counted as a lost rollout
                stats["put_failures"] += 1
            if r == 0:
                continue  # the first round fills the board; measure from the second on
            got = await fetch(timed, reader, J)
            stats["frames_fetched"] += len(got)
            stats["short_fetches"] += int(len(got) < min(J, total - 1))
            stats["in_bytes"] += board.nc.stats["in_bytes"] - before
            stats["node_rounds"] += 1
        stats["refused"] += reader.counters["refused"]

    await asyncio.gather(*(run_node(k, *node) for k, node in enumerate(nodes)))
    for _, _, board in nodes:
        await board.close()
    return {**stats, "latencies_ms": latencies}


def _board_point(n: int, period_s: float, rounds: int, workers: int) -> dict[str, Any]:
    import psutil

    auth = Authority.generate(stream="SCALE")
    keys = auth.private_keys()
    with NatsServer(NatsServerConfig(websocket_port=None, monitor_port=None, auth_config=auth.server_config(),
                                     max_connections=n + 16)) as server:
        asyncio.run(create_board_stream(server.url, auth))
        proc = psutil.Process(server.proc.pid)  # type: ignore[union-attr]
        cpu0 = proc.cpu_times()
        start_at = time.time() + 3 + n / 150  # every worker connects its nodes first
        per = [n // workers + (1 if i < n % workers else 0) for i in range(workers)]
        outs, procs, offset = [], [], 0
        with tempfile.TemporaryDirectory() as tmp:
            for i, count in enumerate(per):
                args = {"url": server.url, "stream": "SCALE", "keys": keys, "nodes": count, "offset": offset,
                        "total": n, "period_s": period_s, "rounds": rounds, "start_at": start_at}
                offset += count
                args_path, out_path = Path(tmp) / f"w{i}.json", Path(tmp) / f"w{i}-out.json"
                args_path.write_text(json.dumps(args))
                outs.append(out_path)
                procs.append(subprocess.Popen([sys.executable, "-m", "lab.bench.swarm_scale", "board-worker",
                                               str(args_path), str(out_path)], cwd=REPO_ROOT))
            rss = 0
            while any(pr.poll() is None for pr in procs):
                rss = max(rss, proc.memory_info().rss)
                time.sleep(0.5)
            if any(pr.returncode for pr in procs):
                raise RuntimeError(f"a board worker failed at N={n}")
            results = [json.loads(o.read_text()) for o in outs]
        cpu1 = proc.cpu_times()
    wall = time.time() - start_at
    node_rounds = sum(r["node_rounds"] for r in results)
    lat = [x for r in results for x in r["latencies_ms"]]
    return {"n": n, "backend": "board", "rounds": rounds, "period_s": period_s,
            "ingress_bytes_per_node_round": sum(r["in_bytes"] for r in results) / max(node_rounds, 1),
            "frames_per_node_round": sum(r["frames_fetched"] for r in results) / max(node_rounds, 1),
            "frame_bytes": max(r["frame_bytes"] for r in results),
            "fetch_p50_ms": _pct(lat, 0.5), "fetch_p99_ms": _pct(lat, 0.99),
            "lost": sum(r["put_failures"] + r["refused"] for r in results),
            "short_fetches": sum(r["short_fetches"] for r in results),
            "server_cpu": round((cpu1.user + cpu1.system - cpu0.user - cpu0.system) / max(wall, 1e-9), 3),
            "server_rss_mib": round(rss / 2**20, 1)}


# --- the relay arm --------------------------------------------------------------------------------

async def _relay_nodes(url: str, n: int, period_s: float, rounds: int) -> dict[str, Any]:
    from websockets.exceptions import ConnectionClosed

    nodes = []
    for _ in range(n):
        proto, ws = await connect_peer(url)
        nodes.append({"proto": proto, "ws": ws, "bytes": 0, "frames": 0, "lat": []})
    measuring = {"on": False}

    async def read(node: dict[str, Any]) -> None:
        try:
            while True:
                data = await node["ws"].recv(decode=False)
                if measuring["on"]:
                    node["bytes"] += len(data)
                if b'"type":"rollouts"' in data and measuring["on"]:
                    node["frames"] += 1
                    start = data.rindex(b'"ts":') + 5
                    node["lat"].append((time.time() - float(data[start:data.index(b",", start)])) * 1000)
        except ConnectionClosed:
            return

    readers = [asyncio.create_task(read(node)) for node in nodes]
    await asyncio.sleep(1.0)
    start_at = time.time() + 0.5

    async def send(k: int, node: dict[str, Any]) -> None:
        rng = random.Random(k)
        for r in range(rounds):
            await asyncio.sleep(max(0.0, start_at + (r + k / n) * period_s - time.time()))
            (frame,) = node["proto"].encode_rollouts(paper_groups(node["proto"].identity.peer_id, r, rng))
            await node["ws"].send(frame, text=True)

    measuring["on"] = True
    await asyncio.gather(*(send(k, node) for k, node in enumerate(nodes)))
    await asyncio.sleep(min(10.0, 2.0 + n / 50))  # deliveries drain
    measuring["on"] = False
    for node in nodes:
        await node["ws"].close()
    for task in readers:
        task.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    received = sum(node["frames"] for node in nodes)
    return {"bytes": sum(node["bytes"] for node in nodes), "frames": received,
            "expected": n * (n - 1) * rounds, "lat": [x for node in nodes for x in node["lat"]]}


def _relay_point(n: int, period_s: float, rounds: int) -> dict[str, Any]:
    import psutil

    port = free_port()
    boot = start_bootstrap(port)
    try:
        proc = psutil.Process(boot.pid)
        cpu0, t0 = proc.cpu_times(), time.time()
        out = asyncio.run(_relay_nodes(f"ws://127.0.0.1:{port}", n, period_s, rounds))
        cpu1, wall, rss = proc.cpu_times(), time.time() - t0, proc.memory_info().rss
    finally:
        boot.terminate()
        boot.wait(10)
    node_rounds = n * rounds
    return {"n": n, "backend": "relay", "rounds": rounds, "period_s": period_s,
            "ingress_bytes_per_node_round": out["bytes"] / node_rounds,
            "frames_per_node_round": out["frames"] / node_rounds,
            "fetch_p50_ms": _pct(out["lat"], 0.5), "fetch_p99_ms": _pct(out["lat"], 0.99),
            "lost": out["expected"] - out["frames"], "short_fetches": 0,
            "server_cpu": round((cpu1.user + cpu1.system - cpu0.user - cpu0.system) / wall, 3),
            "server_rss_mib": round(rss / 2**20, 1)}


def growth_law(points: list[dict[str, Any]], key: str = "ingress_bytes_per_node_round") -> dict[str, float]:
    """value ~ a * N^b by least squares on logs -> {"a", "b"}."""
    xs = [math.log(p["n"]) for p in points if p[key] > 0]
    ys = [math.log(p[key]) for p in points if p[key] > 0]
    if len(xs) < 2:
        return {"a": math.exp(ys[0]) if ys else 0.0, "b": 0.0}
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return {"a": math.exp(my - b * mx), "b": b}


def run(out_dir: Path = BENCH_DIR, board_ns: list[int] | None = None, relay_ns: list[int] | None = None,
        rounds: int = 4, period_s: float = 10.0, workers: int = 2) -> dict[str, Any]:
    board_ns = board_ns or [10, 100, 1000]
    relay_ns = relay_ns if relay_ns is not None else [10, 50, 100, 200]
    points = []
    for n in board_ns:
        print(f"swarm-scale: board N={n} ...", flush=True)
        points.append(_board_point(n, max(period_s, n / 50), rounds, workers))
        print(json.dumps(points[-1]), flush=True)
    for n in relay_ns:
        print(f"swarm-scale: relay N={n} ...", flush=True)
        points.append(_relay_point(n, period_s, rounds))
        print(json.dumps(points[-1]), flush=True)
    laws = {b: growth_law([p for p in points if p["backend"] == b]) for b in ("board", "relay")
            if any(p["backend"] == b for p in points)}
    board = sorted((p for p in points if p["backend"] == "board"), key=lambda p: p["n"])
    targets = {}
    if board and board[-1]["n"] >= 1000:
        big = board[-1]
        targets = {"ingress_ratio_1000_vs_10": big["ingress_bytes_per_node_round"] / board[0]["ingress_bytes_per_node_round"],
                   "fetch_p99_ms_at_1000": big["fetch_p99_ms"], "lost": sum(p["lost"] for p in board)}
        targets["met"] = (targets["ingress_ratio_1000_vs_10"] <= 1.5 and (big["fetch_p99_ms"] or 1e9) < 100
                          and targets["lost"] == 0)
    result = {"points": points, "growth_law": laws, "targets": targets, "j": J, "cores": os.cpu_count(),
              "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "swarm_scale.json").write_text(json.dumps(result, indent=1))
    (out_dir / "swarm_scale.md").write_text(table(result) + "\n")
    plot(result, out_dir / "swarm_scale.png")
    return result


def table(result: dict[str, Any]) -> str:
    lines = [(f"# Swarm scale: store one, fetch J = {result['j']} (board) vs broadcast (relay) "
              f"({result['measured_at']}, {result['cores']} cores, all on one machine)"), "",
             ("| backend | N | ingress / node / round | frames / node / round | fetch p50 / p99 ms | lost | "
              "server CPU | server RSS |"), "|---|---|---|---|---|---|---|---|"]
    for p in sorted(result["points"], key=lambda p: (p["backend"], p["n"])):
        def ms(v: float | None) -> str:
            return "–" if v is None else f"{v:.1f}"
        lines.append(f"| {p['backend']} | {p['n']:,} | {p['ingress_bytes_per_node_round'] / 1024:,.1f} KiB | "
                     f"{p['frames_per_node_round']:.1f} | {ms(p['fetch_p50_ms'])} / {ms(p['fetch_p99_ms'])} | "
                     f"{p['lost']} | {p['server_cpu']:.2f} | {p['server_rss_mib']:.0f} MiB |")
    lines.append("")
    for backend, law in result["growth_law"].items():
        lines.append(f"Growth law, {backend}: ingress per node per round ≈ {law['a'] / 1024:.1f} KiB × N^{law['b']:.2f}")
    t = result["targets"]
    if t:
        lines.append(f"\nTargets: ingress at N=1,000 / N=10 = {t['ingress_ratio_1000_vs_10']:.2f} (≤ 1.5), fetch p99 at "
                     f"1,000 = {t['fetch_p99_ms_at_1000']:.1f} ms (< 100), lost = {t['lost']} (0): "
                     f"**{'met' if t['met'] else 'not met'}**")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for backend, style in (("board", "o-"), ("relay", "s--")):
        pts = sorted((p for p in result["points"] if p["backend"] == backend), key=lambda p: p["n"])
        if not pts:
            continue
        axes[0].loglog([p["n"] for p in pts], [p["ingress_bytes_per_node_round"] / 1024 for p in pts], style, label=backend)
        axes[1].semilogx([p["n"] for p in pts], [p["fetch_p99_ms"] or float("nan") for p in pts], style, label=backend)
    axes[0].set_title("what one node downloads per round (KiB)")
    axes[1].set_title("p99 ms (board: one fetch; relay: delivery)")
    for ax in axes:
        ax.set_xlabel("nodes (N)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "board-worker":
    out = asyncio.run(_board_worker(json.loads(Path(sys.argv[2]).read_text())))
    Path(sys.argv[3]).write_text(json.dumps(out))
