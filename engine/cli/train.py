"""`sapo train`, `sapo eval`, `sapo history`: the solo trainer, the held-out eval, the metrics log."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from engine.models.catalog import short_name
from engine.paths import SEED_MODEL_DIR, default_data_dir

MODEL_COLUMN = 24  # characters of a model's name in `sapo history` (SmolLM2-135M-Instruct is 21)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, default=None, help="node data dir (store, checkpoints)")
    p.add_argument("--model", type=Path, default=SEED_MODEL_DIR, help="base model directory (default: the seed)")
    p.add_argument("--mix", default="rl", help="task-mix preset: rl, seed-easy, paper")
    p.add_argument("--preset", default="cpu-small", help="SAPO config preset: cpu-small, paper")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a SapoConfig field (JSON value), e.g. --set lr=5e-5 --set sampling.top_p=0.95")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 leaves cores for others)")


def register(sub: Any) -> None:
    t = sub.add_parser("train", help="train the local policy solo (J = 0) for N rounds")
    _common(t)
    t.add_argument("--rounds", type=int, required=True, help="rounds to run in this invocation")
    t.add_argument("--seed", type=int, default=0, help="trainer RNG seed (questions, sampling)")
    t.add_argument("--fresh", action="store_true", help="start from the base model, not the last checkpoint")
    t.add_argument("--quiet", action="store_true", help="no per-round lines")
    t.set_defaults(func=run_train)
    e = sub.add_parser("eval", help="held-out pass@1 / pass@k of the current (or a given) policy")
    _common(e)
    e.add_argument("--checkpoint", type=Path, default=None,
                   help="checkpoint dir to evaluate (default: the data dir's newest; 'base' for the base model)")
    e.add_argument("--base", action="store_true", help="evaluate the base model, ignoring checkpoints")
    e.add_argument("--repeat", type=int, default=1, help="evaluate R times with different sampling seeds (noise)")
    e.add_argument("--json", type=Path, default=None, help="also write the report(s) as JSON here")
    e.set_defaults(func=run_eval)
    h = sub.add_parser("history", help="per-round metrics and held-out evals from the store")
    h.add_argument("--data-dir", type=Path, default=None, help="node data dir")
    h.add_argument("--csv", type=Path, default=None, help="export all rounds as CSV to this file ('-' = stdout)")
    h.add_argument("--last", type=int, default=20, help="rounds to print (default 20)")
    h.set_defaults(func=run_history)


def build_config(preset_name: str, overrides: list[str]) -> Any:
    """A SapoConfig from a preset plus KEY=VALUE overrides (values parsed as JSON, else strings)."""
    from engine.sapo.config import SapoConfig, preset

    data = preset(preset_name).to_dict()
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        target, parts = data, key.split(".")
        for part in parts[:-1]:
            if not isinstance(target.get(part), dict):
                raise SystemExit(f"unknown config section {part!r}")
            target = target[part]
        if parts[-1] not in target:
            raise SystemExit(f"unknown config field {key!r}")
        target[parts[-1]] = value
    try:
        return SapoConfig.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"bad config: {exc}") from exc


def _setup(args: argparse.Namespace) -> tuple[Path, Any, Any]:
    import torch

    from engine.tasks.library import preset as mix_preset

    torch.set_num_threads(max(1, args.threads))  # after imports: a module setting it at import is overridden
    data_dir = args.data_dir or default_data_dir()
    cfg = build_config(args.preset, args.set)
    try:
        mix = mix_preset(args.mix)
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    return data_dir, cfg, mix


def _load(model_dir: Path) -> tuple[Any, Any]:
    from engine.models.policy import load_policy

    try:
        return load_policy(model_dir)
    except FileNotFoundError as exc:
        raise SystemExit(f"{exc}; build the seed with `sapo seed-model build` or pass --model") from exc


def round_line(result: Any) -> str:
    m = result.metrics
    return (f"round {result.round:>5}  v{result.policy_version:<5} reward {m.get('reward_mean', 0):.3f}"
            f"±{m.get('reward_std', 0):.3f}  zero-std {m.get('frac_reward_zero_std', 0):.2f}  "
            f"trained {int(m.get('groups_trained', 0))}  loss {m.get('loss', 0):+.4f}  "
            f"clip {m.get('clip_fraction', 0):.3f}  ent {m.get('entropy', 0):.2f}  "
            f"len {m.get('completion_len_mean', 0):.1f}  {m.get('tokens_per_s', 0):.0f} tok/s  "
            f"{result.phase_seconds['total']:.2f}s")


def run_train(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from engine.checkpoint import list_checkpoints
    from engine.sapo.trainer import Trainer
    from engine.store import Store

    data_dir, cfg, mix = _setup(args)
    if args.rounds < 1:
        raise SystemExit("--rounds must be >= 1")
    if cfg.num_external:
        print("note: `sapo train` runs solo; J is set to 0", file=sys.stderr)
        cfg = cfg.replace(num_external=0)
    ckpt_dir = data_dir / "checkpoints"
    if args.fresh and list_checkpoints(ckpt_dir):
        raise SystemExit(f"checkpoints exist in {ckpt_dir}: remove them or use another --data-dir")
    model, tok = _load(args.model)
    store = Store(data_dir / "node.db")
    trainer = Trainer.resume(model, tok, cfg, mix, store, ckpt_dir, args.seed, model_id=args.model.name)
    if trainer.round:
        print(f"resumed at round {trainer.round} (policy v{trainer.policy_version}) from {ckpt_dir}")
        if trainer.config_changes:
            print(f"note: config differs from the checkpoint's in {', '.join(trainer.config_changes)}",
                  file=sys.stderr)
    try:
        with Progress(transient=True) as progress:
            task = progress.add_task("training", total=args.rounds)
            for _ in range(args.rounds):
                result = trainer.run_round()
                if not args.quiet:
                    progress.console.print(round_line(result), soft_wrap=True)
                if result.eval is not None:
                    progress.console.print(f"held-out @ round {result.round}: pass@1 {result.eval.pass1:.3f} "
                                           f"pass@{result.eval.k} {result.eval.passk:.3f}")
                progress.advance(task)
    finally:  # a clean stop (end or Ctrl-C) checkpoints what was completed
        try:
            print(f"checkpoint: {trainer.save_checkpoint()}")
        except RuntimeError as exc:
            print(f"no checkpoint: {exc}", file=sys.stderr)
        store.close()
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from engine.checkpoint import latest_checkpoint, load_weights, read_state
    from engine.evaluation import evaluate
    from engine.store import Store
    from engine.tasks.library import heldout

    data_dir, cfg, mix = _setup(args)
    if args.repeat < 1:
        raise SystemExit("--repeat must be >= 1")
    model, tok = _load(args.model)
    ckpt = None if args.base else (args.checkpoint or latest_checkpoint(data_dir / "checkpoints"))
    round_no = version = 0
    if ckpt is not None:
        load_weights(ckpt, model)
        state = read_state(ckpt)
        round_no, version = state["round"], state["policy_version"]
    label = f"checkpoint {ckpt}" if ckpt else f"base model {args.model}"
    questions = heldout(mix, cfg.eval_per_specialty, cfg.eval_seed)
    from engine.models.generate import SampleConfig

    sample_cfg = SampleConfig(max_new_tokens=cfg.sampling.max_new_tokens)
    reports = []
    for r in range(args.repeat):
        report = evaluate(model, tok, questions, k=cfg.eval_k, sample_cfg=sample_cfg,
                          prompt_style=cfg.prompt_style, seed=cfg.eval_seed + r)
        reports.append(report)
        print(f"{label} (round {round_no}), {len(questions)} questions x {cfg.eval_k}, seed {cfg.eval_seed + r}:")
        print(report.table())
    if args.repeat > 1:
        import statistics

        p1 = [rep.pass1 for rep in reports]
        pk = [rep.passk for rep in reports]
        print(f"over {args.repeat} sampling seeds: pass@1 {statistics.fmean(p1):.4f} ± {statistics.stdev(p1):.4f}"
              f" (sd), pass@{cfg.eval_k} {statistics.fmean(pk):.4f} ± {statistics.stdev(pk):.4f}")
    if (data_dir / "node.db").exists() and not args.base and ckpt is not None:
        with Store(data_dir / "node.db") as store:
            store.record_eval(round_no, version, reports[0].to_dict(), kind="cli")
    if args.json:
        args.json.write_text(json.dumps([rep.to_dict() for rep in reports], indent=1))
    return 0


def run_history(args: argparse.Namespace) -> int:
    from engine.store import Store

    path = (args.data_dir or default_data_dir()) / "node.db"
    if not path.exists():
        raise SystemExit(f"no store at {path}: nothing trained here yet")
    with Store(path) as store:
        if args.csv is not None:
            if str(args.csv) == "-":
                store.export_rounds_csv(sys.stdout)
            else:
                with open(args.csv, "w", newline="") as fh:
                    n = store.export_rounds_csv(fh)
                print(f"{n} rounds -> {args.csv}")
            return 0
        rows = store.rounds(limit=args.last)
        width = max([len("model")] + [len(model_cell(r["model"])) for r in rows])
        print(f"{'model':<{width}} {'round':>6} {'ver':>5} {'reward':>7} {'zero-std':>8} {'loss':>8} {'clip':>6} "
              f"{'entropy':>7} {'len':>5} {'tok/s':>6} {'sec':>6} {'J':>6} {'own':>5} {'sugg':>5} {'peer':>5} {'cpu% o/s/p':>11}")
        for r in rows:  # rounds are numbered per model: the model column says whose round it is
            print(f"{model_cell(r['model']):<{width}} {r['round']:>6} {r['policy_version']:>5} {r['reward_mean'] or 0:>7.3f} "
                  f"{r['frac_reward_zero_std'] or 0:>8.2f} {r['loss'] or 0:>+8.4f} {r['clip_fraction'] or 0:>6.3f} "
                  f"{r['entropy'] or 0:>7.2f} {r['completion_len_mean'] or 0:>5.1f} {r['tokens_per_s'] or 0:>6.0f} "
                  f"{r['seconds_total'] or 0:>6.2f} {energy_cell(r):>6} {source_cells(r)}")
        if rows:
            print("\n" + energy_summary(rows))
            print(sources_summary(store.source_totals(len(rows)), len(rows)))
        evals = store.evals()
        if evals:
            print("\nheld-out evals:")
            for ev in evals:
                print(f"  {model_cell(ev['model'])} round {ev['round']:>6} ({ev['kind']}): pass@1 {ev['pass1']:.4f}  "
                      f"pass@{ev['k']} {ev['passk']:.4f}")
    return 0


def energy_cell(row: dict[str, Any]) -> str:
    """A round's energy in joules: "~" marks an estimate from CPU time, "-" a round stored before."""
    joules = row.get("energy_j")
    if joules is None:
        return "-"
    return f"{joules:.0f}" if row.get("energy_measured") else f"~{joules:.0f}"


def energy_summary(rows: list[dict[str, Any]]) -> str:
    """The shown rounds' energy: in all, per hour of training, and where it comes from."""
    known = [r for r in rows if r.get("energy_j") is not None]
    if not known:
        return "energy: not recorded for these rounds (stored by engines from schema 8 on)"
    joules = sum(float(r["energy_j"]) for r in known)
    seconds = sum(float(r.get("seconds_total") or 0.0) for r in known)
    measured = all(r.get("energy_measured") for r in known)
    per_hour = f", {joules / seconds:.1f} W while training" if seconds > 0 else ""
    return (f"energy: {joules / 3600:.2f} Wh over {len(known)} rounds{per_hour} ("
            + ("measured by the CPU's power meter)" if measured else "estimated from CPU time where no meter was readable)"))


def model_cell(model: str) -> str:
    """A model as `sapo history` names it: what a contributor calls it, cut to the column ("-" for rows
    written before the store kept the model)."""
    return short_name(model)[:MODEL_COLUMN] if model else "-"


# Where a round's groups came from (store columns `<source>_groups`, `<source>_mixed`, `seconds_<source>`).
SOURCE_WORDS = (("own_pick", "your own questions"), ("suggested", "questions peers suggested"),
                ("peer_text", "peers' answers"))


def source_cells(row: dict[str, Any]) -> str:
    """Groups/with signal per source, and each source's share of the round's seconds ("-" before schema v5)."""
    if row.get("own_pick_groups") is None:
        return f"{'-':>5} {'-':>5} {'-':>5} {'-':>11}"
    counts = [f"{row[f'{s}_groups'] or 0:.0f}/{row.get(f'{s}_mixed') or 0:.0f}" for s, _ in SOURCE_WORDS]
    if row.get("peer_text_mixed") is None:  # schema v5 rows: every peer text group trained on had signal
        counts[2] = f"{row['peer_text_groups'] or 0:.0f}/{row['peer_text_groups'] or 0:.0f}"
    seconds = [row[f"seconds_{s}"] or 0.0 for s, _ in SOURCE_WORDS]
    shares = "/".join(f"{100 * x / sum(seconds):.0f}" if sum(seconds) > 0 else "0" for x in seconds)
    return " ".join(f"{c:>5}" for c in counts) + f" {shares:>11}"


def sources_summary(totals: dict[str, float], rounds: int) -> str:
    """Where the last `rounds` rounds' training came from, in words."""
    spent = sum(totals[f"seconds_{s}"] for s, _ in SOURCE_WORDS)
    head = f"where training came from (last {rounds} rounds): groups, with signal (a right and a wrong answer)"
    lines = [head + ", share of CPU"]
    for source, words in SOURCE_WORDS:
        groups, mixed = totals[f"{source}_groups"], totals[f"{source}_mixed"]
        share = totals[f"seconds_{source}"] / spent if spent > 0 else 0.0
        lines.append(f"  {words:<27} {groups:>6.0f} {mixed:>6.0f} {share:>5.0%}")
    return "\n".join(lines)
