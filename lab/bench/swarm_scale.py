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
and RSS. A least-squares fit of log(ingress) on log(N) per backend gives the growth law (loopback
cases only).

Shaped cases (`rtt_ms=[20, 100, 300]`, `stalls`, `uplink_mbit`): the board arm again, each node's
connection through its own link of the shaping proxy (lab/bench/shaping.py, in this process, one
link per node). Beside the keys above: `rtt_ms` (None on loopback), the exchange (put + fetch of J)
p50/p99, and `groups_in_time_fraction`, the share of the J peers' groups a node asked for that came
back before its next round was due. The bench's node exchanges, then waits for its next round: a late
exchange delays only that node (a real node overlaps its fetch with generation).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
from pathlib import Path
from typing import Any

from engine.swarm.nats_server import free_port
from lab import BENCH_DIR
from lab.bench.relay import connect_peer, start_bootstrap
from lab.bench.swarm_board import J, board_point, paper_groups, pct

DESCRIPTION = "per-node ingress, fetch latency and loss vs swarm size: the NATS board against the broadcast relay"
LONG = True


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
    return {"n": n, "backend": "relay", "rounds": rounds, "period_s": period_s, "rtt_ms": None,
            "ingress_bytes_per_node_round": out["bytes"] / node_rounds,
            "frames_per_node_round": out["frames"] / node_rounds,
            "fetch_p50_ms": pct(out["lat"], 0.5), "fetch_p99_ms": pct(out["lat"], 0.99),
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


def _loopback(points: list[dict[str, Any]], backend: str) -> list[dict[str, Any]]:
    return sorted((p for p in points if p["backend"] == backend and p.get("rtt_ms") is None), key=lambda p: p["n"])


def _targets(points: list[dict[str, Any]]) -> dict[str, Any]:
    board, targets = _loopback(points, "board"), {}
    if board and board[-1]["n"] >= 1000:
        big = board[-1]
        targets = {"ingress_ratio_1000_vs_10": big["ingress_bytes_per_node_round"] / board[0]["ingress_bytes_per_node_round"],
                   "fetch_p99_ms_at_1000": big["fetch_p99_ms"], "lost": sum(p["lost"] for p in board)}
        targets["met"] = (targets["ingress_ratio_1000_vs_10"] <= 1.5 and (big["fetch_p99_ms"] or 1e9) < 100
                          and targets["lost"] == 0)
    shaped = [p for p in points if p.get("rtt_ms") is not None and p["rtt_ms"] >= 100 and p.get("stalls")]
    if shaped:  # issue 47: at 100 ms RTT with stalls, fetch p99 < 3 x RTT and >= 90% of groups in time
        targets["shaped"] = [{"n": p["n"], "rtt_ms": p["rtt_ms"], "fetch_p99_ms": p["fetch_p99_ms"],
                              "groups_in_time_fraction": p["groups_in_time_fraction"],
                              "met": (p["fetch_p99_ms"] or 1e9) < 3 * p["rtt_ms"] and p["groups_in_time_fraction"] >= 0.9
                              and p["lost"] == 0} for p in shaped]
    return targets


def run(out_dir: Path = BENCH_DIR, board_ns: list[int] | None = None, relay_ns: list[int] | None = None,
        rounds: int = 4, period_s: float = 10.0, workers: int = 2, rtt_ms: list[float] | None = None,
        stalls: float = 0.0, uplink_mbit: float | None = None, shaped_ns: list[int] | None = None) -> dict[str, Any]:
    """`board_ns`/`relay_ns`: the loopback sweeps (as before). `rtt_ms`: for each RTT and each N of
    `shaped_ns` (default: `board_ns`) a board case whose nodes each reach the server through their own
    shaped link (lab/bench/shaping.py): RTT/2 each way, `stalls` the loss per 1448-byte segment (each
    loss holds the stream 200 ms), `uplink_mbit` the cap on each node's uplink (None: uncapped)."""
    board_ns = board_ns if board_ns is not None else [10, 100, 1000]
    relay_ns = relay_ns if relay_ns is not None else [10, 50, 100, 200]
    shaped_ns = shaped_ns if shaped_ns is not None else board_ns
    points = []
    for n in board_ns:
        print(f"swarm-scale: board N={n} ...", flush=True)
        points.append(board_point(n, max(period_s, n / 50), rounds, workers))
        print(json.dumps(points[-1]), flush=True)
    for rtt in rtt_ms or []:
        for n in shaped_ns:
            print(f"swarm-scale: board N={n} at {rtt} ms RTT, stalls {stalls}, uplink {uplink_mbit} Mbit/s ...", flush=True)
            link = {"rtt_ms": rtt, "stalls": stalls, "uplink_mbit": uplink_mbit}
            points.append(board_point(n, max(period_s, n / 50), rounds, workers, link))
            print(json.dumps(points[-1]), flush=True)
    for n in relay_ns:
        print(f"swarm-scale: relay N={n} ...", flush=True)
        points.append(_relay_point(n, period_s, rounds))
        print(json.dumps(points[-1]), flush=True)
    laws = {b: growth_law(_loopback(points, b)) for b in ("board", "relay") if _loopback(points, b)}
    result = {"points": points, "growth_law": laws, "targets": _targets(points), "j": J, "cores": os.cpu_count(),
              "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "swarm_scale.json").write_text(json.dumps(result, indent=1))
    (out_dir / "swarm_scale.md").write_text(table(result) + "\n")
    plot(result, out_dir / "swarm_scale.png")
    return result


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def table(result: dict[str, Any]) -> str:
    lines = [(f"# Swarm scale: store one, fetch J = {result['j']} (board) vs broadcast (relay) "
              f"({result['measured_at']}, {result['cores']} cores, all on one machine)")]
    loopback = sorted((p for p in result["points"] if p.get("rtt_ms") is None), key=lambda p: (p["backend"], p["n"]))
    if loopback:
        lines += ["", ("| backend | N | ingress / node / round | frames / node / round | fetch p50 / p99 ms | lost | "
                       "server CPU | server RSS |"), "|---|---|---|---|---|---|---|---|"]
    for p in loopback:
        lines.append(f"| {p['backend']} | {p['n']:,} | {p['ingress_bytes_per_node_round'] / 1024:,.1f} KiB | "
                     f"{p['frames_per_node_round']:.1f} | {_ms(p['fetch_p50_ms'])} / {_ms(p['fetch_p99_ms'])} | "
                     f"{p['lost']} | {p['server_cpu']:.2f} | {p['server_rss_mib']:.0f} MiB |")
    lines.append("")
    for backend, law in result["growth_law"].items():
        lines.append(f"Growth law, {backend}: ingress per node per round ≈ {law['a'] / 1024:.1f} KiB × N^{law['b']:.2f}")
    t = result["targets"]
    if "met" in t:
        lines.append(f"\nTargets: ingress at N=1,000 / N=10 = {t['ingress_ratio_1000_vs_10']:.2f} (≤ 1.5), fetch p99 at "
                     f"1,000 = {t['fetch_p99_ms_at_1000']:.1f} ms (< 100), lost = {t['lost']} (0): "
                     f"**{'met' if t['met'] else 'not met'}**")
    return "\n".join(lines + _shaped_table(result))


def _shaped_table(result: dict[str, Any]) -> list[str]:
    shaped = sorted((p for p in result["points"] if p.get("rtt_ms") is not None), key=lambda p: (p["rtt_ms"], p["n"]))
    if not shaped:
        return []
    lines = ["", "## Shaped links (each node through its own link: RTT/2 each way, stalls, uplink cap)", "",
             ("| N | RTT ms | loss / segment | uplink | fetch p50 / p99 ms | exchange p50 / p99 ms | "
              "groups in time | stalls seen | lost |"), "|---|---|---|---|---|---|---|---|---|"]
    for p in shaped:
        up = "–" if p["uplink_mbit"] is None else f"{p['uplink_mbit']:g} Mbit/s"
        lines.append(f"| {p['n']:,} | {p['rtt_ms']:g} | {p['stalls']:g} | {up} | {_ms(p['fetch_p50_ms'])} / "
                     f"{_ms(p['fetch_p99_ms'])} | {_ms(p['exchange_p50_ms'])} / {_ms(p['exchange_p99_ms'])} | "
                     f"{p['groups_in_time_fraction']:.1%} | {p['link_stalls']} | {p['lost']} |")
    for t in result["targets"].get("shaped", []):
        lines.append(f"\nTarget at N={t['n']:,}, {t['rtt_ms']:g} ms with stalls: fetch p99 {_ms(t['fetch_p99_ms'])} ms "
                     f"(< 3 × RTT), groups in time {t['groups_in_time_fraction']:.1%} (≥ 90%): "
                     f"**{'met' if t['met'] else 'not met'}**")
    return lines


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for backend, style in (("board", "o-"), ("relay", "s--")):
        pts = _loopback(result["points"], backend)
        if not pts:
            continue
        axes[0].loglog([p["n"] for p in pts], [p["ingress_bytes_per_node_round"] / 1024 for p in pts], style, label=backend)
        axes[1].semilogx([p["n"] for p in pts], [p["fetch_p99_ms"] or float("nan") for p in pts], style, label=backend)
    axes[0].set_title("what one node downloads per round (KiB)")
    axes[1].set_title("p99 ms (board: one fetch; relay: delivery)")
    for ax in axes:
        ax.set_xlabel("nodes (N)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

