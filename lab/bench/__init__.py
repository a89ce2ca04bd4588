"""Benchmarks: each writes JSON + a short markdown table under bench/.

A bench module exposes `run(out_dir: Path = BENCH_DIR, **options) -> dict` and `table(result) -> str`,
and optionally `DESCRIPTION: str` and `LONG = True` (left out of `sapo bench all` unless asked for).
Add one line to BENCHES to join `sapo bench <name>` / `sapo bench all`.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

BENCHES: dict[str, str] = {
    "round": "lab.bench.round",
    "fit": "lab.bench.fit",
    "learning": "lab.bench.learning",
    "relay": "lab.bench.relay",
    "gui": "lab.bench.gui",
    "generate": "lab.bench.generate",
    "cpu-round": "lab.bench.cpu_round",
    "real-learning": "lab.bench.real_learning",
    "soak": "lab.bench.soak",
    "checkpoint": "lab.bench.checkpoint",
    "swarm-scale": "lab.bench.swarm_scale",
    "poisoning": "lab.bench.poisoning",
    "swarm-learning": "lab.bench.swarm_learning",
    "busy": "lab.bench.busy",
    "install": "lab.bench.install",
    "walkthrough": "lab.bench.walkthrough",
}


def load(name: str) -> ModuleType:
    if name not in BENCHES:
        raise ValueError(f"unknown bench {name!r}; known: {', '.join(sorted(BENCHES))}")
    return importlib.import_module(BENCHES[name])


def save_results(out_dir: Path, stem: str, result: dict[str, Any], table: Callable[[dict[str, Any]], str],
                 plot: Callable[[dict[str, Any], Path], None]) -> dict[str, Any]:
    """bench/<stem>.json, its markdown table and its plot; returns `result`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (out_dir / f"{stem}.md").write_text(table(result) + "\n")
    plot(result, out_dir / f"{stem}.png")
    return result
