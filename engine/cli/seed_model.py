"""`sapo seed-model train|eval`: build the shipped seed model and measure it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from engine.paths import SEED_MODEL_DIR


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("seed-model", help="train or evaluate the shipped seed model")
    sub = parser.add_subparsers(dest="seed_command", required=True, metavar="ACTION")
    tr = sub.add_parser("train", help="train the seed model from scratch (reproducible, ~25 min on 2 cores)")
    tr.add_argument("--out", type=Path, default=SEED_MODEL_DIR, help="output directory")
    tr.add_argument("--steps", type=int, default=None, help="override the recipe's optimizer steps")
    tr.add_argument("--seed", type=int, default=None, help="override the recipe seed")
    tr.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: recipe)")
    tr.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    from engine.models.seed.recipe import SeedRecipe
    from engine.models.seed.train import train

    overrides = {k: v for k, v in (("steps", args.steps), ("seed", args.seed), ("threads", args.threads))
                 if v is not None}
    try:
        recipe = dataclasses.replace(SeedRecipe(), **overrides)
    except ValueError as exc:
        print(f"bad recipe: {exc}", file=sys.stderr)
        return 2
    info = train(recipe, args.out, log=lambda line: print(line, flush=True))
    print(json.dumps({k: v for k, v in info.items() if k != "history"}, indent=1))
    return 0
