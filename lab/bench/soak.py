"""`sapo bench soak`: a node and two peers run for hours; does anything grow that should not?

Three real `sapo run` processes (one measured node with its control API, two peers) and a real
bootstrap on 127.0.0.1 train and share rollouts for `minutes`. Every `sample_every_s` the bench reads
the node's RSS, open descriptors and threads (psutil), its store's size on disk (node.db + WAL), and
its pool size and round from the control API; the peers' and the bootstrap's RSS ride along. After a
warm-up (caches fill, the pool reaches capacity, the allocator settles) the slope per hour is fitted
to the floor of each window (RSS breathes within a round; a leak lifts the floor). The judged slope
is Theil-Sen's (the median of the slopes between every two floors), with Sen's 95% interval: one
window that dips or spikes, as after a heap trim, moves a least-squares line by about a MiB/h over
two hours but barely moves the median, while growth that persists moves both alike (the
least-squares slope is reported beside it). Target: RSS slope < 1 MiB/h; no growth in descriptors
or threads. The processes run niced so that the machine stays usable while the soak runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from engine.control.client import ControlClient
from engine.control.token import read_control_info, read_token
from engine.paths import REPO_ROOT
from engine.swarm.nats_server import free_port
from lab import BENCH_DIR
from lab.bench import soak_trace
from lab.bench.soak_stats import fit_slope, floors, slope_se, theil_sen

DESCRIPTION = "a node and two peers for hours: RSS, descriptors, threads, store and pool over time"
LONG = True
RSS_SLOPE_TARGET_MIB_PER_H = 1.0
BOARD_CONNECTED_TARGET = 0.95  # share of samples after the warm-up with the node on its board


def _wait_http(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


async def _node_status(data_dir: Path) -> dict[str, Any]:
    info = read_control_info(data_dir)
    if info is None:
        return {}
    async with ControlClient(info.url, read_token(data_dir), timeout_s=10.0) as client:
        status: dict[str, Any] = await client.call("status")
        return status


def _store_mib(data_dir: Path) -> float:
    return sum(p.stat().st_size for p in data_dir.glob("node.db*") if p.is_file()) / 2**20


def rss_parts(pid: int) -> dict[str, float] | None:
    """Resident MiB by kind of mapping (Linux): the main malloc arena (`[heap]`), other anonymous memory
    (thread arenas, mmapped blocks, Python's object arenas, torch buffers) and file-backed pages; None
    where /proc has no smaps. Tells a fragmenting heap from growing Python objects or mapped files."""
    parts = {"heap": 0.0, "anon": 0.0, "file": 0.0}
    kind = "anon"
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split(maxsplit=6)
                if not head:
                    continue
                if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):  # a mapping's first line
                    name = head[5].strip() if len(head) > 5 else ""
                    kind = "heap" if name == "[heap]" else "file" if name.startswith("/") else "anon"
                elif head[0] == "Rss:":
                    parts[kind] += int(head[1]) / 1024
    except OSError:
        return None
    return {k: round(v, 2) for k, v in parts.items()}


def _sample(t0: float, node: Any, data_dir: Path, others: dict[str, Any]) -> dict[str, Any]:
    proc = psutil.Process(node.pid)
    try:
        status = asyncio.run(_node_status(data_dir))
    except Exception as exc:  # noqa: BLE001 -- a slow reply is a missing sample field, not a failed soak
        status = {"error": str(exc)}
    swarm = status.get("swarm") or {}
    sample = {"t_s": round(time.monotonic() - t0, 1), "rss_mib": proc.memory_info().rss / 2**20,
              "fds": proc.num_fds(), "threads": proc.num_threads(), "store_mib": _store_mib(data_dir),
              "round": status.get("round"), "pool_size": swarm.get("pool_size"), "state": status.get("state")}
    for kind, mib in (rss_parts(node.pid) or {}).items():
        sample[f"rss_{kind}_part_mib"] = mib
    board = swarm.get("board") or {}
    sample["board_connected"], sample["board_put_errors"] = board.get("connected"), board.get("put_errors")
    heap = (status.get("memory") or {}).get("heap") or {}
    sample["heap_in_use_mib"], sample["heap_free_held_mib"] = heap.get("in_use_mib"), heap.get("free_held_mib")
    for name, other in others.items():
        try:
            sample[f"{name}_rss_mib"] = psutil.Process(other.pid).memory_info().rss / 2**20
        except psutil.Error:
            sample[f"{name}_rss_mib"] = None
    return sample


def run(out_dir: Path = BENCH_DIR, minutes: float = 120.0, warmup_minutes: float = 10.0,
        sample_every_s: float = 5.0, model: str = "seed", nice: int = 10, trace_every_s: float = 0.0) -> dict[str, Any]:
    """Soak for `minutes` (the committed result: >= 120), fit slopes after `warmup_minutes`.
    `trace_every_s` > 0: the node runs under tracemalloc (lab/bench/soak_trace.py), snapshots once
    after the warm-up and then every that many seconds, and the result names the lines whose Python objects grew (`python_growth`);
    its RSS is then not the untraced node's, and the result is written as soak_trace.{json,md}."""
    if minutes <= warmup_minutes or sample_every_s <= 0:
        raise ValueError("minutes must exceed warmup_minutes, and sample_every_s must be > 0")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    port = free_port()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    samples: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sapo-soak-") as tmp:
        trace_dir = Path(tmp) / "trace"
        try:
            procs["bootstrap"] = _started(subprocess.Popen(
                [sys.executable, "-m", "engine", "bootstrap", "--host", "127.0.0.1", "--port", str(port),
                 "--nats-port", "0", "--nats-ws-port", "0"],
                cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), nice)
            _wait_http(f"http://127.0.0.1:{port}/status")
            # tracing starts after the warm-up (and a minute for start-up, slower when traced)
            trace = (trace_dir, warmup_minutes * 60 + 60, trace_every_s) if trace_every_s > 0 else None
            dirs = _start_nodes(Path(tmp), port, model, env, nice, trace, procs)
            crashed = _sample_until(procs, dirs[0], Path(tmp) / "n0.log", minutes, sample_every_s, samples)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.terminate()
            for p in procs.values():
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
        python_growth = None
        if trace_every_s > 0 and (trace_dir / "latest.snap").exists():
            python_growth = soak_trace.growth(trace_dir / "first.snap", trace_dir / "latest.snap")
    result = summarize(samples, minutes, warmup_minutes, model, crashed)
    if trace_every_s > 0:
        result["python_growth"] = python_growth  # None: the run ended before two snapshots
        return write(result, out_dir, name="soak_trace")
    return write(result, out_dir)


def _started(proc: subprocess.Popen[bytes], nice: int) -> subprocess.Popen[bytes]:
    psutil.Process(proc.pid).nice(nice)  # its children (none today) would inherit it
    return proc


def _start_nodes(tmp: Path, port: int, model: str, env: dict[str, str], nice: int,
                 trace: tuple[Path, float, float] | None, procs: dict[str, subprocess.Popen[bytes]]) -> list[Path]:
    """The measured node (with its control API; under tracemalloc where `trace` = (dir, first_s,
    every_s)) and two peers, all on the bootstrap at `port`, into `procs`; returns their data dirs."""
    dirs = [tmp / f"n{i}" for i in range(3)]
    for i, data_dir in enumerate(dirs):
        launcher = ["-m", "engine"]
        if i == 0 and trace is not None:
            launcher = ["-m", "lab.bench.soak_trace", *(str(x) for x in trace), "--"]
        cmd = [sys.executable, *launcher, "run", "--headless", "--model", model, "--data-dir",
               str(data_dir), "--bootstrap", f"ws://127.0.0.1:{port}", "--no-mdns", "--listen",
               "127.0.0.1:0", "--seed", str(i)] + (["--control"] if i == 0 else [])
        log = open(tmp / f"n{i}.log", "wb")  # noqa: SIM115 -- closed with the process
        procs["node" if i == 0 else f"peer{i}"] = _started(subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), nice)
    return dirs


def _sample_until(procs: dict[str, subprocess.Popen[bytes]], data_dir: Path, node_log: Path, minutes: float,
                  sample_every_s: float, samples: list[dict[str, Any]]) -> str:
    """Sample the node every `sample_every_s` for `minutes` into `samples` -> "" or, where a process
    exited, which one and the node log's tail."""
    node, others = procs["node"], {k: v for k, v in procs.items() if k != "node"}
    deadline = time.monotonic() + 60
    while not (data_dir / "control.json").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    t0 = time.monotonic()
    while time.monotonic() - t0 < minutes * 60:
        dead = [name for name, p in procs.items() if p.poll() is not None]
        if dead:
            return f"{', '.join(dead)} exited (node log tail: " \
                   f"{node_log.read_bytes()[-1500:].decode(errors='replace')})"
        samples.append(_sample(t0, node, data_dir, others))
        s = samples[-1]
        print(f"soak {s['t_s'] / 60:6.1f} min  round {s['round']}  rss {s['rss_mib']:.1f} MiB  "
              f"fds {s['fds']}  threads {s['threads']}  store {s['store_mib']:.2f} MiB  "
              f"pool {s['pool_size']}", flush=True)
        time.sleep(max(0.0, sample_every_s - (time.monotonic() - t0 - s["t_s"])))
    return ""


def summarize(samples: list[dict[str, Any]], minutes: float, warmup_minutes: float, model: str,
              crashed: str = "") -> dict[str, Any]:
    after = [s for s in samples if s["t_s"] >= warmup_minutes * 60]
    ts_h = [s["t_s"] / 3600 for s in after]

    def slope(key: str) -> float:
        return _slope(ts_h, after, key)

    def growth(key: str) -> float:
        return _growth(after, key)

    rss = [s["rss_mib"] for s in after]
    window_h = max(5.0 / 60, (minutes - warmup_minutes) / 60 / 24)  # >= 24 windows, each >= 5 min
    floor_t, floor_v = floors(ts_h, rss, window_h)
    robust, least_squares = theil_sen(floor_t, floor_v), fit_slope(floor_t, floor_v)

    # The board stays up for the whole soak (credentials are renewed, a closed connection replaced): a
    # soak whose node lost its board measured the wrong node (that one leaked in the failing calls).
    on_board = [s["board_connected"] for s in after if isinstance(s.get("board_connected"), bool)]
    board_share = sum(on_board) / len(on_board) if on_board else None
    put_errors = [s["board_put_errors"] for s in after if isinstance(s.get("board_put_errors"), int)]
    rounds = [s["round"] for s in samples if isinstance(s.get("round"), int)]
    pools = [s["pool_size"] for s in samples if isinstance(s.get("pool_size"), int)]
    result: dict[str, Any] = {
        "model": model, "minutes": minutes, "warmup_minutes": warmup_minutes, "samples": samples,
        "rounds": (rounds[-1] - rounds[0]) if len(rounds) > 1 else 0,
        # judged: Theil-Sen on the floors (see the module docstring), least squares with under 3 floors
        "rss_slope_method": "theil-sen over window floors" if robust else "least squares over window floors",
        "rss_slope_mib_per_hour": robust[0] if robust else least_squares,
        "rss_slope_ci95": [robust[1], robust[2]] if robust else None,
        "rss_slope_least_squares_mib_per_hour": least_squares,
        "rss_slope_se": slope_se(floor_t, floor_v),
        "rss_slope_all_samples_mib_per_hour": slope("rss_mib"), "rss_slope_all_samples_se": slope_se(ts_h, rss),
        "rss_floor_window_minutes": window_h * 60,
        "rss_floors": [[round(t * 60, 2), v] for t, v in zip(floor_t, floor_v)],
        "rss_mib_after_warmup": [after[0]["rss_mib"], after[-1]["rss_mib"]] if after else None,
        "fd_growth": growth("fds"), "thread_growth": growth("threads"),
        "store_slope_mib_per_hour": slope("store_mib"),
        # malloc's own view (glibc): in use rising = a leak; only free-but-held rising = fragmentation
        "heap_in_use_slope_mib_per_hour": slope("heap_in_use_mib"),
        "heap_free_held_slope_mib_per_hour": slope("heap_free_held_mib"), "pool_max": max(pools) if pools else None,
        # where resident memory grows: the main arena, other anonymous memory, or file-backed pages
        "rss_part_slopes_mib_per_hour": {kind: slope(f"rss_{kind}_part_mib") for kind in ("heap", "anon", "file")
                                         if any(s.get(f"rss_{kind}_part_mib") is not None for s in after)},
        "rounds_per_hour_by_half": _rounds_by_half(after),
        "board_connected_share": board_share, "board_put_errors": put_errors[-1] - put_errors[0] if put_errors else None,
        "peer_rss_slopes_mib_per_hour": {k[:-8]: slope(k) for k in (samples[0] if samples else {})
                                         if k.endswith("_rss_mib")},
        "crashed": crashed, "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    result["target_met"] = (not crashed and len(after) >= 2 and result["rss_slope_mib_per_hour"] < RSS_SLOPE_TARGET_MIB_PER_H
                            and result["fd_growth"] <= 0 and result["thread_growth"] <= 0
                            and (board_share is None or board_share >= BOARD_CONNECTED_TARGET))
    return result


def _slope(ts_h: list[float], after: list[dict[str, Any]], key: str) -> float:
    """Least-squares slope per hour of `key` over the samples that have it."""
    pairs = [(t, s[key]) for t, s in zip(ts_h, after) if s.get(key) is not None]
    return fit_slope([p[0] for p in pairs], [p[1] for p in pairs])


def _growth(after: list[dict[str, Any]], key: str) -> float:
    """Median of the last tenth minus median of the first tenth (a link opening for a moment is not
    growth)."""
    if len(after) < 2:
        return 0.0
    tenth = max(1, len(after) // 10)
    first, last = sorted(s[key] for s in after[:tenth]), sorted(s[key] for s in after[-tenth:])
    return float(last[len(last) // 2] - first[len(first) // 2])


def _rounds_by_half(after: list[dict[str, Any]]) -> list[float]:
    """Rounds per hour in each half after the warm-up: a slope means more next to the work it saw."""
    timed = [(s["t_s"], s["round"]) for s in after if isinstance(s.get("round"), int)]
    if len(timed) < 3:
        return []
    mid = timed[len(timed) // 2]
    return [round((b[1] - a[1]) / max(b[0] - a[0], 1e-9) * 3600, 1) for a, b in ((timed[0], mid), (mid, timed[-1]))]


def write(result: dict[str, Any], out_dir: Path, name: str = "soak") -> dict[str, Any]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1))
    (out_dir / f"{name}.md").write_text(table(result) + "\n")
    if result["samples"]:
        plot(result, out_dir / f"{name}.png")
    return result


def _ci(interval: list[float] | None) -> str:
    return "" if not interval else f"(95%: {interval[0]:+.3f} to {interval[1]:+.3f})"


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _se(value: float | None) -> str:
    return "(too few samples)" if value is None else f"± {value:.3f}"


def table(result: dict[str, Any]) -> str:
    rss = result["rss_mib_after_warmup"] or [float("nan")] * 2
    peers = ", ".join(f"{k} {v:+.2f}" for k, v in result["peer_rss_slopes_mib_per_hour"].items())
    lines = [
        (f"# Soak: {result['model']} node + 2 peers + bootstrap, {result['minutes']:.0f} min "
         f"({result['measured_at']})"), "",
        "| measure (after a {:.0f}-min warm-up) | value | target |".format(result["warmup_minutes"]),
        "|---|---|---|",
        (f"| RSS slope, Theil-Sen over the floor of each {result['rss_floor_window_minutes']:.0f}-min window | "
         f"{result['rss_slope_mib_per_hour']:+.3f} MiB/h {_ci(result.get('rss_slope_ci95'))} "
         f"({rss[0]:.1f} → {rss[1]:.1f} MiB) | < {RSS_SLOPE_TARGET_MIB_PER_H} MiB/h |"),
        (f"| RSS slope, least squares over the same floors | "
         f"{result.get('rss_slope_least_squares_mib_per_hour', result['rss_slope_mib_per_hour']):+.3f} "
         f"{_se(result['rss_slope_se'])} MiB/h | |"),
        (f"| RSS slope (all samples) | {result['rss_slope_all_samples_mib_per_hour']:+.3f} "
         f"{_se(result['rss_slope_all_samples_se'])} MiB/h | |"),
        f"| open descriptors growth (median, last vs first tenth) | {result['fd_growth']:+.0f} | 0 |",
        f"| threads growth (same) | {result['thread_growth']:+.0f} | 0 |",
        (f"| malloc heap in use / free but held, slopes | {result.get('heap_in_use_slope_mib_per_hour', 0.0):+.3f}"
         f" / {result.get('heap_free_held_slope_mib_per_hour', 0.0):+.3f} MiB/h | |"),
        f"| store size slope | {result['store_slope_mib_per_hour']:+.3f} MiB/h | bounded |",
        f"| pool size (max) | {result['pool_max']} | ≤ capacity |",
        ("| resident memory by kind, slopes | " + ", ".join(
            f"{k} {v:+.3f}" for k, v in (result.get("rss_part_slopes_mib_per_hour") or {}).items())
         + " MiB/h | |"),
        (f"| rounds trained (per hour, each half) | {result['rounds']} ("
         + " / ".join(f"{v:,.0f}" for v in result.get("rounds_per_hour_by_half") or []) + ") | |"),
        f"| peers' / bootstrap's RSS slopes | {peers} MiB/h | |",
        (f"| node on its board (share of samples) / failed puts | {_share(result.get('board_connected_share'))} / "
         f"{result.get('board_put_errors')} | ≥ {BOARD_CONNECTED_TARGET:.0%} |"),
        "", f"Target met: **{'yes' if result['target_met'] else 'no'}**"
        + (f"; a process exited: {result['crashed'][:300]}" if result["crashed"] else ""),
    ]
    if "python_growth" in result:
        lines += ["", ("Traced under tracemalloc (its RSS is not an untraced node's). Python objects that grew most "
                  "between the first and the latest snapshot, by the engine line that allocated them:"), ""]
        lines += ["| where | grew (KiB) | live now (KiB) |", "|---|---|---|"]
        lines += [f"| {g['where']} | {g['grew_kib']:+,.1f} | {g['now_kib']:,.1f} |"
                  for g in result["python_growth"] or []] or ["| (fewer than two snapshots) | | |"]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["samples"]
    t = [x["t_s"] / 60 for x in s]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    axes[0].plot(t, [x["rss_mib"] for x in s], label="node")
    for key in s[0]:
        if key.endswith("_rss_mib"):
            axes[0].plot(t, [x[key] for x in s], ":", label=key[:-8])
    if result["rss_floors"]:
        axes[0].plot([f[0] for f in result["rss_floors"]], [f[1] for f in result["rss_floors"]], "k.",
                     label="node floor / window")
    axes[0].axvline(result["warmup_minutes"], color="grey", lw=0.8)
    axes[0].set_title(f"RSS (MiB); node slope {result['rss_slope_mib_per_hour']:+.2f} MiB/h")
    axes[0].legend(fontsize=7)
    axes[1].plot(t, [x["fds"] for x in s], label="open descriptors")
    axes[1].plot(t, [x["threads"] for x in s], label="threads")
    axes[1].set_title("node descriptors / threads")
    axes[1].legend(fontsize=7)
    axes[2].plot(t, [x["store_mib"] for x in s])
    axes[2].set_title("store on disk (MiB)")
    axes[3].plot(t, [x["pool_size"] if x["pool_size"] is not None else float("nan") for x in s], label="pool size")
    axes[3].set_title("rollout pool (groups)")
    for ax in axes:
        ax.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
