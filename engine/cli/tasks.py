"""`sapo tasks ...` (filled in below)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("tasks", help="inspect the ReasoningGym task mix")
    parser.set_defaults(func=lambda args: 0)
