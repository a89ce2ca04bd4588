"""What `sapo bootstrap` says its embedded board's ports default to, in README's command table and in its
--help, is what it does (`board_host.nats_ports`, and the port a started bootstrap names: tests/test_bootstrap_ports.py)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from engine.cli import bootstrap as bootstrap_cli
from engine.swarm import board_host

README = Path(__file__).resolve().parents[1] / "README.md"


def _help() -> str:
    parser = argparse.ArgumentParser(prog="sapo")
    bootstrap_cli.register(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return " ".join(sub.choices["bootstrap"].format_help().split())  # argparse wraps lines: one line here


def test_the_board_ports_defaults_are_said_where_the_commands_are_listed() -> None:
    assert board_host.nats_ports(7700, None, None) == (7701, 7702)
    text = _help()
    assert re.search(r"--nats-port N the embedded nats-server's port \(default: --port \+ 1\b", text), text
    assert re.search(r"--nats-ws-port N .*?\(default: --port \+ 2\b", text), text
    (row,) = [line for line in README.read_text().splitlines() if line.startswith("| `sapo bootstrap ")]
    assert "--nats-port N" in row and "`--nats-port`, default `--port` + 1" in row, row
