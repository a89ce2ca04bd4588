"""`sapo bench learning`: does a solo run on this CPU raise the seed's held-out pass@1?

1. The eval's own noise: the seed (and later the final policy) evaluated `noise_repeats` times with
   different sampling seeds on the same fixed held-out set; noise = standard deviation of pass@1.
2. A seeded solo run (J = 0), evaluated on the fixed held-out set every `eval_every` rounds.
3. Guard rails: pass@k on the RL mix, and pass@1 on specialties/settings it never trains on
   (propositional_logic, binary_matrix n=2, calendar is_leap_year), before and after.
Writes bench/learning.json, bench/learning.md and bench/learning.png (the curve).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from engine.evaluation import evaluate
from engine.models.policy import load_policy
from engine.paths import REPO_ROOT, SEED_MODEL_DIR
from engine.sapo.config import SapoConfig, preset
from engine.sapo.trainer import Trainer
from engine.store import Store
from engine.tasks.library import SpecialtySpec, TaskMix, heldout
from engine.tasks.library import preset as mix_preset
from lab import BENCH_DIR

DESCRIPTION = "solo RL on the seed: held-out pass@1 curve vs the eval's own noise (long: ~30 min)"
LONG = True  # skipped by `sapo bench all` unless asked for


def _shown(path: Path) -> str:
    """A model path as the report shows it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def untrained_mix() -> Any:
    """Settings the `rl` mix never generates, to check that training does not collapse them."""
    easy = mix_preset("seed-easy").specialties
    return TaskMix("untrained", {
        "propositional_logic": SpecialtySpec(1.0, dict(easy["propositional_logic"].config)),
        "binary_matrix": SpecialtySpec(1.0, {"min_n": 2, "max_n": 2}),
        "calendar_arithmetic": SpecialtySpec(1.0, {"tasks": ["is_leap_year"]}),
    })


def _sha256(path: Path) -> str | None:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _repeated(trainer: Any, questions: list[Any], repeats: int) -> dict[str, Any]:
    reports = [evaluate(trainer.model, trainer.tokenizer, questions, k=trainer.cfg.eval_k,
                        sample_cfg=trainer.eval_sample_config(), prompt_style=trainer.cfg.prompt_style,
                        seed=trainer.cfg.eval_seed + 7919 * (r + 1)) for r in range(repeats)]
    p1 = [r.pass1 for r in reports]
    pk = [r.passk for r in reports]
    per = {name: statistics.fmean(r.per_specialty[name].pass1 for r in reports) for name in reports[0].per_specialty}
    return {"pass1_mean": statistics.fmean(p1), "pass1_sd": statistics.stdev(p1) if repeats > 1 else 0.0,
            "passk_mean": statistics.fmean(pk), "passk_sd": statistics.stdev(pk) if repeats > 1 else 0.0,
            "pass1_all": p1, "per_specialty_pass1": per}


def run(out_dir: Path = BENCH_DIR, model_dir: Path = SEED_MODEL_DIR, threads: int = 1, rounds: int = 800,
        eval_every: int = 100, seed: int = 0, noise_repeats: int = 5, overrides: dict[str, Any] | None = None,
        name: str = "learning") -> dict[str, Any]:
    torch.set_num_threads(threads)
    base = preset("paper").to_dict() | {"eval_every": eval_every, "checkpoint_every": 0,
                                           "checkpoint_seconds": 0.0, "checkpoint_overhead": 0.0} | (overrides or {})
    cfg = SapoConfig.from_dict(base)
    model, tok = load_policy(model_dir)
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "node.db")
        trainer = Trainer(model, tok, cfg, mix_preset("rl"), store, Path(tmp) / "ckpt", seed)
        untrained_q = heldout(untrained_mix(), cfg.eval_per_specialty, cfg.eval_seed)
        before = {"rl": _repeated(trainer, trainer.heldout_questions(), noise_repeats),
                  "untrained": _repeated(trainer, untrained_q, noise_repeats)}
        print(f"seed: pass@1 {before['rl']['pass1_mean']:.4f} ± {before['rl']['pass1_sd']:.4f}", flush=True)
        trainer.evaluate_heldout()  # round 0 on the curve (fixed eval seed)
        for _ in range(rounds):
            result = trainer.run_round()
            if result.eval is not None:
                print(f"round {result.round}: pass@1 {result.eval.pass1:.4f} pass@{result.eval.k} "
                      f"{result.eval.passk:.4f} ({time.time() - start:.0f} s)", flush=True)
        if rounds % eval_every:
            trainer.evaluate_heldout()
        after = {"rl": _repeated(trainer, trainer.heldout_questions(), noise_repeats),
                 "untrained": _repeated(trainer, untrained_q, noise_repeats)}
        curve = [{"round": e["round"], "pass1": e["pass1"], "passk": e["passk"],
                  "per_specialty": {n: s["pass1"] for n, s in e["report"]["per_specialty"].items()}}
                 for e in store.evals()]
        train_reward = [(r["round"], r["reward_mean"]) for r in store.rounds()]
        seconds_per_round = statistics.fmean(r["seconds_total"] for r in store.rounds())
        store.close()
    noise = before["rl"]["pass1_sd"]
    delta = after["rl"]["pass1_mean"] - before["rl"]["pass1_mean"]
    result = {
        "name": name, "model": _shown(model_dir), "model_sha256": _sha256(model_dir / "model.safetensors"),
        "rounds": rounds, "seed": seed, "threads": threads,
        "config": cfg.to_dict(), "eval": {"questions_per_specialty": cfg.eval_per_specialty, "k": cfg.eval_k,
                                          "noise_repeats": noise_repeats},
        "before": before, "after": after, "curve": curve, "train_reward": train_reward,
        "pass1_delta": delta, "pass1_noise_sd": noise,
        "delta_over_noise": delta / noise if noise > 0 else None,
        "seconds_per_round": seconds_per_round, "wall_seconds": time.time() - start,
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1))
    (out_dir / f"{name}.md").write_text(table(result) + "\n")
    plot(result, out_dir / f"{name}.png")
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, height_ratios=(2, 1))
    rounds = [p["round"] for p in result["curve"]]
    ax.plot(rounds, [p["pass1"] for p in result["curve"]], "o-", label="held-out pass@1 (fixed eval seed)")
    k = result["eval"]["k"]
    ax.plot(rounds, [p["passk"] for p in result["curve"]], "s--", label=f"held-out pass@{k}")
    b = result["before"]["rl"]
    ax.axhspan(b["pass1_mean"] - 2 * b["pass1_sd"], b["pass1_mean"] + 2 * b["pass1_sd"], color="grey",
               alpha=0.3, label="seed pass@1 ± 2 sd (eval noise)")
    names = sorted(result["curve"][0]["per_specialty"]) if result["curve"] else []
    for n in names:
        ax.plot(rounds, [p["per_specialty"][n] for p in result["curve"]], lw=0.8, alpha=0.6, label=f"pass@1 {n}")
    ax.set_ylabel("solve rate")
    ax.set_title(f"Solo SAPO on the seed model ({result['rounds']} rounds, lr {result['config']['lr']}, "
                 f"beta {result['config']['beta']})")
    ax.legend(fontsize=7, ncol=2)
    tr = result["train_reward"]
    window = 50
    smooth = [statistics.fmean(v for _, v in tr[max(0, i - window + 1):i + 1]) for i in range(len(tr))]
    ax2.plot([r for r, _ in tr], smooth, color="tab:green")
    ax2.set_ylabel(f"train reward ({window}-round mean)")
    ax2.set_xlabel("round")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(result: dict[str, Any]) -> str:
    b, a = result["before"], result["after"]
    k = result["eval"]["k"]
    lines = [
        f"# Solo learning run: {result['rounds']} rounds on {result['model']} (seed {result['seed']})",
        (f"lr {result['config']['lr']}, {result['config']['num_local']}x{result['config']['completions']} per "
         f"round, num_iterations {result['config']['num_iterations']}, beta {result['config']['beta']}, "
         f"loss_norm {result['config']['loss_norm']}; {result['seconds_per_round']:.2f} s/round, "
         f"{result['wall_seconds'] / 60:.1f} min in all; {result['measured_at']}"), "",
        (f"Held-out: {result['eval']['questions_per_specialty']} questions per specialty, k = {k}, T = 1; "
         f"mean ± sd over {result['eval']['noise_repeats']} sampling seeds."), "",
        "| set | metric | seed | after | delta |", "|---|---|---|---|---|",
    ]
    for label, key in (("rl mix", "rl"), ("untrained settings", "untrained")):
        for metric in ("pass1", "passk"):
            lines.append(f"| {label} | {'pass@1' if metric == 'pass1' else f'pass@{k}'} | "
                         f"{b[key][metric + '_mean']:.4f} ± {b[key][metric + '_sd']:.4f} | "
                         f"{a[key][metric + '_mean']:.4f} ± {a[key][metric + '_sd']:.4f} | "
                         f"{a[key][metric + '_mean'] - b[key][metric + '_mean']:+.4f} |")
    lines += ["", "| specialty (pass@1) | seed | after |", "|---|---|---|"]
    for key in ("rl", "untrained"):
        for n, v in sorted(b[key]["per_specialty_pass1"].items()):
            lines.append(f"| {n}{' (untrained)' if key == 'untrained' else ''} | {v:.4f} | "
                         f"{a[key]['per_specialty_pass1'][n]:.4f} |")
    ratio = result["delta_over_noise"]
    lines += ["", (f"pass@1 delta {result['pass1_delta']:+.4f} = {'n/a' if ratio is None else f'{ratio:.1f}'}"
                   f" x the eval's noise sd ({result['pass1_noise_sd']:.4f}).")]
    return "\n".join(lines)
