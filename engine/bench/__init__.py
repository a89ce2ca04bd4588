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
    "round": "engine.bench.round",
    "fit": "engine.bench.fit",
    "learning": "engine.bench.learning",
    "relay": "engine.bench.relay",
    "gui": "engine.bench.gui",
    "generate": "engine.bench.generate",
    "cpu-round": "engine.bench.cpu_round",
    "real-learning": "engine.bench.real_learning",
    "soak": "engine.bench.soak",
    "checkpoint": "engine.bench.checkpoint",
    "swarm-scale": "engine.bench.swarm_scale",
    "poisoning": "engine.bench.poisoning",
    "swarm-learning": "engine.bench.swarm_learning",
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
