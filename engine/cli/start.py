"""`sapo start`: the desktop app where a display exists, else the headless node (`make run`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any


def has_display(platform: str = sys.platform, environ: dict[str, str] | None = None) -> bool:
    """macOS and Windows always have one; elsewhere X11 or Wayland must be reachable."""
    env = os.environ if environ is None else environ
    if platform == "darwin" or platform.startswith("win"):
        return True
    return bool(env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"))


def register(sub: Any) -> None:
    p = sub.add_parser("start", help="start contributing: the app if there is a display, else a headless node")
    p.add_argument("--data-dir", type=Path, default=None, help="identity, settings, store, checkpoints")
    p.add_argument("--headless", action="store_true", help="no app even if there is a display")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.cli import main

    data_dir = ["--data-dir", str(args.data_dir)] if args.data_dir else []
    if has_display() and not args.headless:
        return main(["gui", *data_dir])
    print("no display: running the headless node (Ctrl+C leaves the swarm; `sapo gui` attaches later)",
          file=sys.stderr)
    return main(["run", "--headless", "--control", *data_dir])
