"""The `sapo` command. Each subcommand lives in its own module with `register(subparsers)`.

Modules import heavy libraries (torch, transformers) inside their handlers, so `sapo --help` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points
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
    "engine.cli.hub",
)
# Commands other distributions add: the lab (lab/pyproject.toml, a source checkout's `make install`)
# registers `sapo bench` and `sapo experiment` here; the product's wheel holds no lab code.
COMMAND_GROUP = "sapo.commands"
LAB_ONLY = {"bench": "benchmarks", "experiment": "experiments"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sapo", description="SAPO Swarm: lend your computer to a "
                                     "swarm that post-trains small language models with RL.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for entry in entry_points(group=COMMAND_GROUP):
        entry.load()(sub)  # a plugin that is installed but broken raises: better than hiding its commands
    for command, what in LAB_ONLY.items():
        if command not in sub.choices:
            _lab_missing(sub, command, what)
    return parser


def _lab_missing(sub: Any, command: str, what: str) -> None:
    """`sapo bench` without the lab installed: say where it comes from instead of 'invalid choice'."""
    def explain(_args: argparse.Namespace) -> int:
        print(f"sapo {command}: the {what} come with a source checkout of SAPO Swarm, not with the app: "
              "clone the repository and run `make install` (or `pip install -e ./lab` beside an editable "
              "install)", file=sys.stderr)
        return 2
    parser = sub.add_parser(command, help=f"{what} (source checkout only)", add_help=False)
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    parser.set_defaults(func=explain)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
