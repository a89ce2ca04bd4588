"""`sapo gui`: the desktop app. Finds (or starts) the engine and talks to it over the control API."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("gui", help="the desktop app: join / leave, live dashboard, shared rollouts, settings")
    p.add_argument("--data-dir", type=Path, default=None, help="the engine's data dir (default: the user's)")
    p.add_argument("--engine", metavar="URL", default=None,
                   help="monitor a running engine at ws://HOST:PORT (e.g. through an SSH tunnel); "
                        "needs its token")
    p.add_argument("--token-file", type=Path, default=None,
                   help="file holding the engine's control token (or set SAPO_CONTROL_TOKEN)")
    p.add_argument("--no-start", action="store_true", help="don't start an engine if none is running")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.paths import default_data_dir

    try:
        from app.main import run_gui, token_from
    except ImportError as exc:  # e.g. Qt's system libraries are missing
        raise SystemExit(f"sapo gui: the desktop app cannot load ({exc}); `sapo run` works headless") from None
    data_dir = (args.data_dir or default_data_dir()).expanduser()
    token = token_from(args.token_file) if args.engine else None
    return run_gui(data_dir, engine_url=args.engine, token=token, start=not args.no_start,
                   engine_args=("--paused",))
