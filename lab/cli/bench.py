"""`sapo bench <name>|all`: run benchmarks from the registry in lab/bench."""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path
from typing import Any

from lab import BENCH_DIR
from lab.bench import BENCHES, load


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="run a benchmark (writes bench/<name>.json and .md)")
    p.add_argument("name", choices=sorted(BENCHES) + ["all"], help="which benchmark, or all")
    p.add_argument("--out", type=Path, default=BENCH_DIR, help="output directory (default bench/)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the bench's own)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a keyword argument of the bench's run() (JSON value), e.g. --option rounds=200")
    p.add_argument("--include-long", action="store_true", help="with 'all': also the long benches")
    p.set_defaults(func=run)


def parse_options(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.isidentifier():
            raise SystemExit(f"--option expects KEY=VALUE, got {item!r}")
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options


def run(args: argparse.Namespace) -> int:
    names = sorted(BENCHES) if args.name == "all" else [args.name]
    for name in names:
        module = load(name)
        if args.name == "all" and getattr(module, "LONG", False) and not args.include_long:
            print(f"== bench {name}: skipped (long; --include-long runs it) ==")
            continue
        options: dict[str, Any] = {"out_dir": args.out, **parse_options(args.option)}
        if args.threads is not None:
            options["threads"] = args.threads
        accepted = inspect.signature(module.run).parameters
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise SystemExit(f"bench {name} does not take {unknown}; it takes {sorted(accepted)}")
        print(f"== bench {name} ==", flush=True)
        print(module.table(module.run(**options)))
    return 0
