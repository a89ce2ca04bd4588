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
    add_eval_parser(sub)
    cd = sub.add_parser("card", help="run the seed-easy and rl evals, write eval.json and MODEL_CARD.md")
    cd.add_argument("--model", type=Path, default=SEED_MODEL_DIR, help="model directory")
    cd.add_argument("--n", type=int, default=128, help="held-out questions per specialty")
    cd.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    cd.add_argument("--reuse-eval", action="store_true", help="rewrite the card from the existing eval.json")
    cd.add_argument("--note", action="append", default=[], help="a line for the card's notes (repeatable)")
    cd.set_defaults(func=_card)


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


# Specialties whose seed-easy scorer a constant or generic answer can satisfy (the `rl` preset
# excludes or fixes them): headroom there is not evidence of room to learn.
GAMEABLE: dict[str, str] = {
    "propositional_logic": "any valid conclusion scores 1 (e.g. the conjunction of the premises)",
    "calendar_arithmetic": "is_leap_year is ~76% 'No'; a weekday guess is right 1 time in 7",
}
HEADROOM_GAP = 0.15  # pass@8 - pass@1 the issue asks for
HEADROOM_MIXED = 0.30  # fraction of 8-completion groups with mixed rewards


def add_eval_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ev = sub.add_parser("eval", help="per-specialty greedy solve rate, pass@1, pass@k and mixed groups "
                                     "on a fixed held-out set")
    ev.add_argument("--model", type=Path, default=SEED_MODEL_DIR, help="model directory")
    ev.add_argument("--mix", default="seed-easy", help="task-mix preset (paper, seed-easy, rl)")
    ev.add_argument("--n", type=int, default=128, help="held-out questions per specialty")
    ev.add_argument("--k", type=int, default=8, help="samples per question at T=1")
    ev.add_argument("--heldout-seed", type=int, default=0, help="which held-out set")
    ev.add_argument("--seed", type=int, default=0, help="sampling seed")
    ev.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ev.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ev.set_defaults(func=_eval)


def run_eval(model_dir: Path, mix_name: str, n: int, k: int, heldout_seed: int, seed: int,
             threads: int = 2) -> dict[str, object]:
    """Greedy (k=1, T=0) and sampled (k, T=1, no top-k/top-p) evals on heldout(mix, n, heldout_seed)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.evaluation import evaluate
    from engine.models.generate import SampleConfig
    from engine.tasks import heldout, preset

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    questions = heldout(preset(mix_name), n, heldout_seed)
    greedy = evaluate(model, tokenizer, questions, k=1, prompt_style="compact", seed=seed,
                      sample_cfg=SampleConfig(temperature=0.0, max_new_tokens=48))
    sampled = evaluate(model, tokenizer, questions, k=k, prompt_style="compact", seed=seed,
                       sample_cfg=SampleConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=48))
    rows: dict[str, dict[str, object]] = {}
    for name, s in sampled.per_specialty.items():
        g = greedy.per_specialty[name]
        gap = s.passk - s.pass1
        rows[name] = {"n": s.n_questions, "greedy": g.pass1, "pass1": s.pass1, "passk": s.passk, "gap": gap,
                      "mixed": s.mixed_fraction, "malformed": s.malformed_rate,
                      "gameable": name in GAMEABLE,
                      "headroom": bool(gap >= HEADROOM_GAP and s.mixed_fraction >= HEADROOM_MIXED
                                       and name not in GAMEABLE)}
    overall = {"greedy": greedy.overall.pass1, "pass1": sampled.overall.pass1, "passk": sampled.overall.passk,
               "mixed": sampled.overall.mixed_fraction, "malformed": sampled.overall.malformed_rate}
    return {"model": str(model_dir), "mix": mix_name, "n_per_specialty": n, "k": k,
            "heldout_seed": heldout_seed, "seed": seed, "per_specialty": rows, "overall": overall,
            "headroom_specialties": sorted(n for n, r in rows.items() if r["headroom"]),
            "seconds": round(greedy.seconds + sampled.seconds, 1)}


def format_table(result: dict[str, object]) -> str:
    k = result["k"]
    head = (f"{'specialty':<25}{'n':>5}{'greedy':>8}{'pass@1':>8}{'pass@' + str(k):>8}{'gap':>7}{'mixed':>7}"
            f"{'malf':>6}  note")
    lines = [head, "-" * len(head)]
    rows = result["per_specialty"]
    assert isinstance(rows, dict)
    for name in sorted(rows):
        r = rows[name]
        note = "headroom" if r["headroom"] else ("gameable" if r["gameable"] else "")
        lines.append(f"{name:<25}{r['n']:>5}{r['greedy']:>8.3f}{r['pass1']:>8.3f}{r['passk']:>8.3f}"
                     f"{r['gap']:>7.3f}{r['mixed']:>7.3f}{r['malformed']:>6.2f}  {note}")
    o = result["overall"]
    assert isinstance(o, dict)
    lines.append("-" * len(head))
    lines.append(f"{'overall':<25}{'':>5}{o['greedy']:>8.3f}{o['pass1']:>8.3f}{o['passk']:>8.3f}"
                 f"{o['passk'] - o['pass1']:>7.3f}{o['mixed']:>7.3f}{o['malformed']:>6.2f}")
    lines.append(f"headroom (gap >= {HEADROOM_GAP}, mixed >= {HEADROOM_MIXED}, not gameable): "
                 f"{', '.join(result['headroom_specialties']) or 'none'}")  # type: ignore[arg-type]
    return "\n".join(lines)


def _eval(args: argparse.Namespace) -> int:
    from engine.tasks import PRESETS

    if args.mix not in PRESETS:
        print(f"unknown mix {args.mix!r}; known: {', '.join(PRESETS)}", file=sys.stderr)
        return 2
    if not (args.model / "config.json").is_file():
        print(f"no model at {args.model} (build it with `sapo seed-model train --out {args.model}`)",
              file=sys.stderr)
        return 2
    if not 1 <= args.n <= 4096 or not 1 <= args.k <= 64:
        print("--n must be in [1, 4096] and --k in [1, 64]", file=sys.stderr)
        return 2
    result = run_eval(args.model, args.mix, args.n, args.k, args.heldout_seed, args.seed, args.threads)
    print(json.dumps(result, indent=1) if args.json else format_table(result))
    return 0


def _card(args: argparse.Namespace) -> int:
    from engine.models.seed.card import write_card

    if not (args.model / "recipe.json").is_file():
        print(f"no trained seed model at {args.model}", file=sys.stderr)
        return 2
    if args.reuse_eval:
        evals = json.loads((args.model / "eval.json").read_text())
    else:
        evals = {mix: run_eval(args.model, mix, args.n, 8, 0, 0, args.threads) for mix in ("seed-easy", "rl")}
    write_card(args.model, evals, [f"- {line}" for line in args.note])
    print(format_table(evals["seed-easy"]))
    print(f"wrote {args.model / 'MODEL_CARD.md'} and eval.json")
    return 0
