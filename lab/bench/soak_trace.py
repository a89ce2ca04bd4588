"""The soak's measured node under tracemalloc: which lines' Python objects grow over hours.

`python -m lab.bench.soak_trace DIR FIRST_S EVERY_S -- <sapo arguments>` runs `sapo <arguments>`
and after FIRST_S seconds (start-up and warm-up, whose imports and caches are not growth) turns
tracemalloc on: a minute later it writes a snapshot of the live Python allocations made since
(`first.snap`), then one every EVERY_S seconds (`latest.snap`, overwritten). `growth(first, latest)` sums each snapshot's
live bytes by the innermost frame in this project's code (where the engine asked for the memory,
not where json or torch did) and returns the lines that grew most. tracemalloc sees Python's own
allocations (objects, strings, numpy buffers), not torch's or other C libraries' buffers: a leak it
does not show is native. It slows the node and costs memory itself, so a traced soak's RSS slope
says nothing; it is a separate run (`sapo bench soak --option trace_every_s=...`).
"""

from __future__ import annotations

import gc
import sys
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

from engine.cli import main as sapo
from engine.paths import REPO_ROOT

FRAMES = 16  # frames per trace: enough to climb from json or torch back into the engine
SETTLE_S = 60.0  # after tracing starts, the first snapshot waits out the round in flight
_OWN = str(REPO_ROOT / "engine")


def _snapshot_to(path: Path) -> None:
    gc.collect()
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    tmp = path.with_suffix(".tmp")
    snap.dump(str(tmp))
    tmp.replace(path)  # a reader never sees half a snapshot


def _dumper(out: Path, first_s: float, every_s: float) -> None:
    # Tracing starts only now: traced from the start, a loaded node's start-up imports took over ten
    # minutes (every allocation walks its frames), and what start-up allocates is not growth anyway.
    time.sleep(first_s)
    tracemalloc.start(FRAMES)
    time.sleep(SETTLE_S)
    _snapshot_to(out / "first.snap")
    while True:
        time.sleep(every_s)
        _snapshot_to(out / "latest.snap")


def by_own_line(snapshot: tracemalloc.Snapshot) -> Counter[str]:
    """Live bytes by the innermost frame in the engine's own code ("other" when none is)."""
    sizes: Counter[str] = Counter()
    for trace in snapshot.traces:
        where = "other"
        for frame in reversed(trace.traceback):  # tracemalloc lists the oldest frame first
            if frame.filename.startswith(_OWN):
                where = f"{frame.filename[len(str(REPO_ROOT)) + 1:]}:{frame.lineno}"
                break
        sizes[where] += trace.size
    return sizes


def growth(first: Path, latest: Path, top: int = 20) -> list[dict[str, Any]]:
    """The lines whose live bytes grew most between the two snapshots, in KiB."""
    a = by_own_line(tracemalloc.Snapshot.load(str(first)))
    b = by_own_line(tracemalloc.Snapshot.load(str(latest)))
    diff = {k: b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b)}
    ranked = sorted(diff.items(), key=lambda kv: -kv[1])[:top]
    return [{"where": k, "grew_kib": round(v / 1024, 1), "now_kib": round(b.get(k, 0) / 1024, 1)} for k, v in ranked]


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[3] != "--":
        raise SystemExit("usage: python -m lab.bench.soak_trace DIR FIRST_S EVERY_S -- <sapo arguments>")
    out, first_s, every_s = Path(argv[0]), float(argv[1]), float(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    threading.Thread(target=_dumper, args=(out, first_s, every_s), name="soak-trace", daemon=True).start()

    return sapo(argv[4:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
