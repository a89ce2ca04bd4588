"""`sapo tasks sample|mixes`: see the questions, ground truths and what the seed model writes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.paths import SEED_MODEL_DIR


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("tasks", help="inspect the ReasoningGym task mix and the verifiers")
    sub = parser.add_subparsers(dest="tasks_command", required=True, metavar="ACTION")
    sa = sub.add_parser("sample", help="show questions, answers and the model's scored completions")
    sa.add_argument("--specialty", required=True, help="one of the nine specialties")
    sa.add_argument("--n", type=int, default=5, help="questions to show (1-50)")
    sa.add_argument("--mix", default="seed-easy", help="preset giving the generator settings")
    sa.add_argument("--seed", type=int, default=0, help="held-out set seed (questions are held-out items)")
    sa.add_argument("--model", type=Path, default=SEED_MODEL_DIR, help="model directory")
    sa.add_argument("--no-model", action="store_true", help="only questions and answers")
    sa.add_argument("--partial-credit", action="store_true", help="show RG's partial credit too")
    sa.add_argument("--json", action="store_true", help="print JSON lines")
    sa.set_defaults(func=_sample)
    mx = sub.add_parser("mixes", help="list the task-mix presets and their settings")
    mx.set_defaults(func=_mixes)


def _mixes(args: argparse.Namespace) -> int:
    from engine.tasks import PRESETS, preset

    for name in PRESETS:
        print(name)
        for specialty, spec in preset(name).specialties.items():
            print(f"  {specialty:<25} weight {spec.weight:<4g} {json.dumps(spec.config, sort_keys=True)}")
    return 0


def _sample(args: argparse.Namespace) -> int:
    from engine.tasks import PRESETS, TaskMix, heldout, preset, render_prompt, score

    if args.mix not in PRESETS:
        print(f"unknown mix {args.mix!r}; known: {', '.join(PRESETS)}", file=sys.stderr)
        return 2
    mix = preset(args.mix)
    if args.specialty not in mix.specialties:
        print(f"{args.specialty!r} is not in the {args.mix} mix: {', '.join(mix.specialties)}", file=sys.stderr)
        return 2
    if not 1 <= args.n <= 50:
        print("--n must be in [1, 50]", file=sys.stderr)
        return 2
    one = TaskMix(mix.name, {args.specialty: mix.specialties[args.specialty]})
    questions = heldout(one, args.n, args.seed)
    completions: list[tuple[str, str]] = [("", "")] * len(questions)
    if not args.no_model:
        if not (args.model / "config.json").is_file():
            print(f"no model at {args.model}; use --no-model or build it with `sapo seed-model train`",
                  file=sys.stderr)
            return 2
        completions = _complete(args.model, [render_prompt(q, "compact") for q in questions], args.seed)
    for q, (greedy, sampled) in zip(questions, completions):
        row: dict[str, object] = {"ref": q.ref.to_dict(), "hash": q.hash, "question": q.text,
                                  "answer": q.answer if q.answer is not None
                                  else q.entry["metadata"].get("example_answer"),
                                  "prompt": render_prompt(q, "compact")}
        if not args.no_model:
            for label, text in (("greedy", greedy), ("sampled", sampled)):
                row[label] = {"completion": text, "score": score(q, text),
                              **({"partial": score(q, text, partial_credit=True)} if args.partial_credit else {})}
        print(json.dumps(row, ensure_ascii=False) if args.json else _format(row))
    return 0


def _format(row: dict[str, object]) -> str:
    lines = [f"── {row['ref']['index']}  hash {str(row['hash'])[:12]}",  # type: ignore[index]
             "question: " + str(row["question"]).strip().replace("\n", "\n          "),
             f"answer:   {row['answer']!r}", f"prompt:   {str(row['prompt']).rstrip()!r}"]
    for label in ("greedy", "sampled"):
        if label in row:
            r = row[label]
            assert isinstance(r, dict)
            extra = f" (partial {r['partial']:.2f})" if "partial" in r else ""
            lines.append(f"{label + ':':<9} {r['completion']!r} -> score {r['score']:.0f}{extra}")
    return "\n".join(lines)


def _complete(model_dir: Path, prompts: list[str], seed: int) -> list[tuple[str, str]]:
    """One greedy and one T=1 completion per prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.models.generate import SampleConfig, generate

    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    greedy = generate(model, tokenizer, prompts, 1, SampleConfig(temperature=0.0), seed=seed)
    sampled = generate(model, tokenizer, prompts, 1, SampleConfig(temperature=1.0, top_k=0, top_p=1.0), seed=seed)
    return [(g[0].text, s[0].text) for g, s in zip(greedy, sampled)]
