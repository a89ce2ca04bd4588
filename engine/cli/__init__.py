"""The `sapo` command. Each subcommand lives in its own module with `register(subparsers)`.

Modules import heavy libraries (torch, transformers) inside their handlers, so `sapo --help` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

# One line per command module; each owner adds its own.
COMMAND_MODULES: tuple[str, ...] = (
    "engine.cli.bootstrap",
    "engine.cli.doctor",
    "engine.cli.run",
    "engine.cli.gui",
    "engine.cli.start",
    "engine.cli.seed_model",
    "engine.cli.tasks",
    "engine.cli.train",
    "engine.cli.desktop",
    "engine.cli.export",
    "engine.cli.control",
)
LAB_COMMANDS = "lab.cli"  # optional: present in a source checkout only


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sapo", description="SAPO Swarm: lend your computer to a "
                                     "swarm that post-trains small language models with RL.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    _register_lab(sub)
    return parser


def _register_lab(sub: Any) -> None:
    """`sapo bench` and `sapo experiment` come from the lab, which sits beside the engine in a source
    checkout and is left out of the bundle; without it the commands are simply absent."""
    try:
        lab_cli = importlib.import_module(LAB_COMMANDS)
    except ModuleNotFoundError as exc:
        if exc.name not in ("lab", LAB_COMMANDS):
            raise  # the lab is there but broken: say so rather than hide its commands
        return
    lab_cli.register(sub)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
