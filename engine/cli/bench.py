"""`sapo bench <name>|all`: run benchmarks from the registry in engine/bench."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engine.bench import BENCHES
from engine.paths import BENCH_DIR


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="run a benchmark (writes bench/<name>.json and .md)")
    p.add_argument("name", choices=sorted(BENCHES) + ["all"], help="which benchmark, or all")
    p.add_argument("--out", type=Path, default=BENCH_DIR, help="output directory (default bench/)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the bench's own)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.bench import load

    names = sorted(BENCHES) if args.name == "all" else [args.name]
    for name in names:
        module = load(name)
        options: dict[str, Any] = {"out_dir": args.out}
        if args.threads is not None:
            options["threads"] = args.threads
        print(f"== bench {name} ==", flush=True)
        print(module.table(module.run(**options)))
    return 0
