"""swarm-scale's board arm: worker processes simulate a slice of the nodes each, every node on its own
board connection under its own credential; optionally each connection through the shaping proxy
(lab/bench/shaping.py), one shaped link per node, as if each sat behind its own home line.

Per node and round (from the second on): put its frame, then fetch J of others'. A fetch's latency is
one direct get (as on loopback); the exchange is the put and the whole fetch; a peer's frame is "in
time" when its get came back before the node's next round was due (its scheduled start).
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.paths import REPO_ROOT
from engine.sapo.records import Provenance, RolloutGroup
from engine.swarm.board import BoardReader, fetch, key_subject
from engine.swarm.config import ProtocolLimits
from engine.swarm.identity import Identity
from engine.swarm.nats_auth import NODE_API_PREFIX, Authority, connect_options, node_inbox
from engine.swarm.nats_board import NatsBoard, create_board_stream
from engine.swarm.nats_server import NatsServer, NatsServerConfig
from engine.swarm.protocol import SwarmProtocol
from engine.tasks.reference import TaskRef, question_hash
from lab.bench.shaping import ProxyThread, ShapingConfig

J = 4
CONNECTS_AT_ONCE = 32  # a worker opens its nodes' connections this many at a time


def paper_groups(origin: str, round_no: int, rng: random.Random) -> list[Any]:
    groups = []
    for g in range(8):
        completions = tuple(f"Let me add the numbers step by step: {rng.randint(0, 999)} + {rng.randint(0, 999)} "
                            + "then carry " * 20 + f"<answer>{rng.randint(0, 9999)}</answer>" for _ in range(8))
        ref = TaskRef("basic_arithmetic", {"min_terms": 2, "max_terms": 2}, seed=1, index=round_no * 8 + g)
        groups.append(RolloutGroup(ref, question_hash(f"q{round_no}-{g}"), completions,
                                   Provenance(origin, "seed", round_no, round_no, time.time())))
    return groups


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _TimedBoard:
    """A board whose single reads are timed (what a node waits for one peer's frame), and which
    remembers when each key's frame came back (wall clock), to judge it in time or late."""

    def __init__(self, board: Any, latencies: list[float]) -> None:
        self.board, self.latencies = board, latencies
        self.arrived: dict[str, float] = {}

    async def extent(self) -> tuple[int, int]:
        return await self.board.extent()

    async def get_from(self, slot: int) -> Any:
        t0 = time.perf_counter()
        try:
            frame = await self.board.get_from(slot)
            if frame is not None:
                self.arrived[frame.subject] = time.time()
            return frame
        finally:
            self.latencies.append((time.perf_counter() - t0) * 1000)


async def _connect_nodes(args: dict[str, Any]) -> list[tuple[Any, Any, Any]]:
    auth = Authority.from_private_keys(args["keys"], stream=args["stream"])
    gate = asyncio.Semaphore(CONNECTS_AT_ONCE)

    async def one() -> tuple[Any, Any, Any]:
        ident = Identity.generate()
        cred = auth.issue(ident.peer_id, args["stream"], 3600)
        board = NatsBoard([args["url"]], stream=args["stream"], create=False, api_prefix=NODE_API_PREFIX,
                          connect_options=connect_options(ident.sign, lambda c=cred: c, node_inbox(ident.peer_id)))
        async with gate:
            await board.connect(timeout_s=10)
        return ident, SwarmProtocol(ident, ProtocolLimits()), board

    return list(await asyncio.gather(*(one() for _ in range(args["nodes"]))))


async def board_worker(args: dict[str, Any]) -> dict[str, Any]:
    offset, total = args["offset"], args["total"]
    period, rounds, start_at = args["period_s"], args["rounds"], args["start_at"]
    latencies: list[float] = []
    exchanges: list[float] = []
    nodes = await _connect_nodes(args)
    stats = {"puts": 0, "put_failures": 0, "frames_fetched": 0, "short_fetches": 0, "refused": 0, "in_bytes": 0,
             "node_rounds": 0, "frame_bytes": 0, "groups_in_time": 0, "groups_expected": 0}

    async def run_node(k: int, ident: Any, proto: Any, board: Any) -> None:
        rng = random.Random(k)
        reader = BoardReader(proto, rng=rng)
        timed = _TimedBoard(board, latencies)
        phase = (offset + k) / total * period
        for r in range(rounds):
            await asyncio.sleep(max(0.0, start_at + r * period + phase - time.time()))
            groups = paper_groups(ident.peer_id, r, rng)
            (frame,) = proto.encode_rollouts(groups)
            stats["frame_bytes"] = len(frame)
            before, t0 = board.nc.stats["in_bytes"], time.perf_counter()
            try:
                await board.put(ident.peer_id, frame)
                stats["puts"] += 1
            except Exception:  # noqa: BLE001 -- counted as a lost rollout
                stats["put_failures"] += 1
            if r == 0:
                continue  # the first round fills the board; measure from the second on
            got = await fetch(timed, reader, J)
            exchanges.append((time.perf_counter() - t0) * 1000)
            due = start_at + (r + 1) * period + phase  # when this node's next round starts
            stats["groups_in_time"] += sum(len(g.groups) for g in got
                                           if timed.arrived.get(key_subject(g.origin), float("inf")) <= due)
            stats["groups_expected"] += min(J, total - 1) * len(groups)
            stats["frames_fetched"] += len(got)
            stats["short_fetches"] += int(len(got) < min(J, total - 1))
            stats["in_bytes"] += board.nc.stats["in_bytes"] - before
            stats["node_rounds"] += 1
        stats["refused"] += reader.counters["refused"]

    await asyncio.gather(*(run_node(k, *node) for k, node in enumerate(nodes)))
    for _, _, board in nodes:
        await board.close()
    return {**stats, "latencies_ms": latencies, "exchanges_ms": exchanges}


def _run_workers(url: str, keys: Any, n: int, period_s: float, rounds: int, workers: int,
                 start_at: float, server_proc: Any) -> tuple[list[dict[str, Any]], int]:
    """Start the workers, wait for them; their results and the server's peak RSS meanwhile."""
    per = [n // workers + (1 if i < n % workers else 0) for i in range(workers)]
    outs, procs, offset = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, count in enumerate(per):
            args = {"url": url, "stream": "SCALE", "keys": keys, "nodes": count, "offset": offset,
                    "total": n, "period_s": period_s, "rounds": rounds, "start_at": start_at}
            offset += count
            args_path, out_path = Path(tmp) / f"w{i}.json", Path(tmp) / f"w{i}-out.json"
            args_path.write_text(json.dumps(args))
            outs.append(out_path)
            procs.append(subprocess.Popen([sys.executable, "-m", "lab.bench.swarm_board", "board-worker",
                                           str(args_path), str(out_path)], cwd=REPO_ROOT))
        rss = 0
        while any(pr.poll() is None for pr in procs):
            rss = max(rss, server_proc.memory_info().rss)
            time.sleep(0.5)
        if any(pr.returncode for pr in procs):
            raise RuntimeError(f"a board worker failed at N={n}")
        return [json.loads(o.read_text()) for o in outs], rss


def board_point(n: int, period_s: float, rounds: int, workers: int,
                link: dict[str, Any] | None = None) -> dict[str, Any]:
    """One case. `link` None: straight to the server on loopback; else {"rtt_ms", "stalls" (loss per
    segment), "uplink_mbit"}: each node's connection through its own shaped link."""
    import psutil

    auth = Authority.generate(stream="SCALE")
    keys = auth.private_keys()
    with NatsServer(NatsServerConfig(websocket_port=None, monitor_port=None, auth_config=auth.server_config(),
                                     max_connections=n + 16)) as server:
        asyncio.run(create_board_stream(server.url, auth))
        proc = psutil.Process(server.proc.pid)  # type: ignore[union-attr]
        cpu0 = proc.cpu_times()
        # every worker connects its nodes first (a shaped connect takes a few round trips)
        rtt_s = (link or {}).get("rtt_ms", 0) / 1000
        start_at = time.time() + 3 + n / 150 + (n / workers / CONNECTS_AT_ONCE + 1) * 6 * rtt_s
        proxy_stats: dict[str, int] = {}
        if link is None:
            results, rss = _run_workers(server.url, keys, n, period_s, rounds, workers, start_at, proc)
        else:
            config = ShapingConfig.home_link(link["rtt_ms"], uplink_mbit=link["uplink_mbit"],
                                             loss_per_segment=link["stalls"], seed=n, max_connections=n + 16)
            with ProxyThread(config, ("127.0.0.1", int(server.url.rsplit(":", 1)[1]))) as proxy:
                results, rss = _run_workers(f"nats://127.0.0.1:{proxy.port}", keys, n, period_s, rounds,
                                            workers, start_at, proc)
                proxy_stats = dict(proxy.stats)
        cpu1 = proc.cpu_times()
    wall = time.time() - start_at
    return _summary(n, period_s, rounds, results, link, proxy_stats) | {
        "server_cpu": round((cpu1.user + cpu1.system - cpu0.user - cpu0.system) / max(wall, 1e-9), 3),
        "server_rss_mib": round(rss / 2**20, 1)}


def _summary(n: int, period_s: float, rounds: int, results: list[dict[str, Any]], link: dict[str, Any] | None,
             proxy_stats: dict[str, int]) -> dict[str, Any]:
    def total(key: str) -> int:
        return sum(r[key] for r in results)

    node_rounds = max(total("node_rounds"), 1)
    lat = [x for r in results for x in r["latencies_ms"]]
    exchange = [x for r in results for x in r["exchanges_ms"]]
    point = {"n": n, "backend": "board", "rounds": rounds, "period_s": period_s,
             "rtt_ms": None if link is None else link["rtt_ms"],
             "ingress_bytes_per_node_round": total("in_bytes") / node_rounds,
             "frames_per_node_round": total("frames_fetched") / node_rounds,
             "frame_bytes": max(r["frame_bytes"] for r in results),
             "fetch_p50_ms": pct(lat, 0.5), "fetch_p99_ms": pct(lat, 0.99),
             "exchange_p50_ms": pct(exchange, 0.5), "exchange_p99_ms": pct(exchange, 0.99),
             "groups_in_time_fraction": total("groups_in_time") / max(total("groups_expected"), 1),
             "lost": total("put_failures") + total("refused"), "short_fetches": total("short_fetches")}
    if link is not None:
        point |= {"stalls": link["stalls"], "uplink_mbit": link["uplink_mbit"],
                  "link_stalls": proxy_stats["stalls_up"] + proxy_stats["stalls_down"],
                  "link_refused": proxy_stats["refused"] + proxy_stats["connect_failures"]}
    return point


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "board-worker":
    out = asyncio.run(board_worker(json.loads(Path(sys.argv[2]).read_text())))
    Path(sys.argv[3]).write_text(json.dumps(out))
