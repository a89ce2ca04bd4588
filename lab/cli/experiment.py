"""`sapo experiment`: the paper's §5 comparison (I/J splits) at small scale, with three measures.

One arm:   sapo experiment --agents 4 --local 4 --external 4 --rounds 100 --seed 1 --out DIR
A preset:  sapo experiment --preset paper-small --out bench/experiment   (resumable; --jobs 2)
Summary only (from finished arms): sapo experiment --aggregate-only --out DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lab.experiment.config import MODES, PRESET_NAMES, SETTINGS, STRATEGIES, ArmConfig, preset
from lab.experiment.driver import run_arms


def register(sub: Any) -> None:
    p = sub.add_parser("experiment", help="N agents sharing through the real pool: the paper's I/J table, "
                       "measured three ways", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=PRESET_NAMES, help="a named set of arms (overrides the single-arm options)")
    p.add_argument("--agents", type=int, default=4, help="N agents (default 4)")
    p.add_argument("--local", type=int, default=4, help="I: own questions per round (default 4)")
    p.add_argument("--external", type=int, default=4, help="J: peers' groups per round (default 4)")
    p.add_argument("--rounds", type=int, default=100, help="rounds per agent (default 100)")
    p.add_argument("--seed", type=int, default=1, help="experiment seed (paired across I/J; default 1)")
    p.add_argument("--setting", choices=SETTINGS, default="homogeneous")
    p.add_argument("--mode", choices=MODES, default="lockstep",
                   help="lockstep: train on peers' previous-round groups; async: on what the pool holds")
    p.add_argument("--strategy", choices=STRATEGIES, default="positive-only",
                   help="how peers' completions enter the loss (default positive-only)")
    p.add_argument("--kl-anchor", type=float, default=0.0, help="KL-to-seed weight on external tokens")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--eval-every", type=int, default=50, help="M: rounds between held-out evals")
    p.add_argument("--also-8-0", action="store_true", help="single arm: also run its paired 8/0 baseline")
    p.add_argument("--model", default="", help="model directory (default: the shipped seed model)")
    p.add_argument("--jobs", type=int, default=0, help="worker processes at once (default: the preset's, else 1)")
    p.add_argument("--only", default="", help="preset: run only arms whose name contains this text")
    p.add_argument("--aggregate-only", action="store_true", help="only rebuild summary, table and figures")
    p.add_argument("--window", type=int, default=20, help="moving-average window of the figures (rounds)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lab.experiment.report import aggregate  # brings torch: only when the command runs

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if not args.aggregate_only:
        if args.preset:
            chosen = preset(args.preset, model=args.model)
            arms = [a for a in chosen.arms if args.only in a.name]
            jobs = args.jobs or chosen.jobs
        else:
            try:
                arm = ArmConfig(agents=args.agents, local=args.local, external=args.external, rounds=args.rounds,
                                seed=args.seed, setting=args.setting, mode=args.mode, strategy=args.strategy,
                                kl_anchor=args.kl_anchor, lr=args.lr, eval_every=args.eval_every, model=args.model)
            except ValueError as exc:
                print(f"error: {exc}")
                return 2
            arms = [arm] + ([arm.replace(local=arm.local + arm.external, external=0)]
                            if args.also_8_0 and arm.external else [])
            jobs = args.jobs or 1
        codes = run_arms(arms, out, jobs)
        failed = sorted(name for name, code in codes.items() if code != 0)
        if failed:
            print(f"{len(failed)} arm(s) failed (logs in {out / 'arms'}): {', '.join(failed)}")
    summary = aggregate(out, window=args.window)
    print((out / "table.md").read_text())
    for line in summary["problems"]:
        print(f"problem: {line}")
    print(f"{summary['arms']} arm(s) summarised in {out}")
    return 0 if summary["arms"] else 1
