"""`sapo bench swarm-learning`: does a SmolLM2 node that shares learn faster than one alone?

Per setting (homogeneous, heterogeneous) and training seed, the same N SmolLM2-135M nodes run each
arm (lab/bench/swarm_arm.py: solo, text, question, both) through the node's own round step and
pool, exchanging real signed frames. All start from the same weights, judged once before; each node
is judged after on the same held-out set (the curriculum's entry rungs of the 4 specialties, k samples
at T = 1). An arm's score for a seed is its nodes' mean; its effect is paired with the solo arm of the
same seed. Each (setting, arm, seed) is saved when it ends (`work_dir`), a rerun skips what is there,
and the committed result is rewritten after each: a stopped run loses only the arm in flight.
Writes bench/swarm_learning.{json,md,png}.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.paths import REPO_ROOT
from lab import BENCH_DIR
from lab.bench import save_results, swarm_why
from lab.bench.real_learning import _prepare
from lab.bench.swarm_arm import ARMS, ROUNDS_FACTOR, SETTINGS
from lab.bench.swarm_attack import attack_keys, attack_lines
from lab.bench.swarm_curves import CURVE_ARMS, curves_json, equal_cpu, learning_curves

SPECIALTIES = ("base_conversion", "basic_arithmetic", "fraction_simplification", "decimal_arithmetic",
               "calendar_arithmetic", "binary_matrix")  # the app's own mix (tasks preset "rl")
DESCRIPTION = ("SmolLM2 nodes sharing text, questions or both vs alone, paired by seed: held-out gain "
               "per CPU-hour (long: hours)")
LONG = True


def run(out_dir: Path = BENCH_DIR, model: str = "smollm2-135m", nodes: int = 3, rounds: int = 100,
        seeds: list[int] | None = None, arms: list[str] | None = None, settings: list[str] | None = None,
        judge_questions: int = 256, eval_k: int = 4, eval_repeats: int = 1, parallel: int = 2,
        work_dir: str | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    seeds = list(seeds if seeds is not None else [0, 1, 2])
    arms, settings = list(arms or ARMS), list(settings or SETTINGS)
    for name in arms:
        if name not in ARMS:
            raise ValueError(f"arm {name!r}: the arms are {', '.join(ARMS)}")
    for name in settings:
        if name not in SETTINGS:
            raise ValueError(f"setting {name!r}: the settings are {', '.join(SETTINGS)}")
    # finished runs (small JSON, committed with the result so that a later session resumes them); the
    # converted model and the nodes' data dirs stay in the machine's temp dir
    work = Path(work_dir) if work_dir else Path(out_dir) / "swarm_learning_runs"
    work.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.gettempdir()) / f"sapo-swarm-learning-{model}"
    shared = scratch / "shared"
    _prepare(model, shared)
    common = {"model": model, "threads": 1, "specialties": list(SPECIALTIES),
              "judge_questions": judge_questions, "eval_k": eval_k,
              "eval_seeds": [9001 + 17 * i for i in range(eval_repeats)], "overrides": overrides or {}}
    if not (work / "before.json").exists():
        before = {**common, "arm": "solo", "setting": "homogeneous", "seed": 0, "rounds": 0}
        _wait(work, _launch(work, "before", before, 1, shared, scratch, max(1, min(os.cpu_count() or 1, 4))))
    todo = [(s, a, seed) for seed in seeds for s in settings for a in arms
            if not (work / f"{s}-{a}-{seed}.json").exists()]
    running: list[tuple[str, subprocess.Popen[bytes]]] = []
    while todo or running:
        while todo and len(running) < max(1, parallel):
            setting, arm, seed = todo.pop(0)
            name = f"{setting}-{arm}-{seed}"
            total = round(rounds * ROUNDS_FACTOR.get(arm, 1))
            args = {**common, "arm": arm, "setting": setting, "seed": seed, "rounds": total,
                    "judge_at": list(range(rounds, total, rounds))}
            running.append(_launch(work, name, args, nodes, shared, scratch, 1))
        time.sleep(2)
        for item in [r for r in running if r[1].poll() is not None]:
            running.remove(item)
            _wait(work, item)
            write(summarize(work), out_dir)  # after each arm: a stopped run keeps what it finished
    return write(summarize(work), out_dir)


def _launch(work: Path, name: str, args: dict[str, Any], n: int, shared: Path, scratch: Path,
            threads: int) -> tuple[str, subprocess.Popen[bytes]]:
    dirs = []
    for k in range(n):  # every node reads the one converted model
        data_dir = scratch / "nodes" / f"{name}-{k}"
        (data_dir / "models" / "llamacpp").mkdir(parents=True, exist_ok=True)
        link = data_dir / "models" / "llamacpp" / "converted"
        if not link.exists():
            os.symlink(shared / "models" / "llamacpp" / "converted", link)
        dirs.append(str(data_dir))
    args = {**args, "data_dirs": dirs, "threads": threads}
    (work / f"{name}.args").write_text(json.dumps(args))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "lab.bench.swarm_arm", str(work / f"{name}.args"),
                             str(work / f"{name}.json.tmp")], cwd=REPO_ROOT, env=env)
    return name, proc


def _wait(work: Path, item: tuple[str, subprocess.Popen[bytes]]) -> None:
    name, proc = item
    if proc.wait() != 0:
        raise RuntimeError(f"swarm-learning arm {name} failed (exit {proc.returncode}); its output is above")
    (work / f"{name}.json.tmp").replace(work / f"{name}.json")


def _tail(history: list[dict[str, float]], key: str, n: int = 20) -> float:
    tail = history[-n:]
    return statistics.fmean(h[key] for h in tail) if tail else 0.0


def summarize(work: Path) -> dict[str, Any]:
    """The issue's keys from every finished (setting, arm, seed) under `work`."""
    before = json.loads((work / "before.json").read_text())
    runs = [json.loads(p.read_text()) for p in sorted(work.glob("*-*-*.json"))]
    base = before["before"]["pass_at_1"]
    by: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for run_ in runs:
        nodes = run_["after"]
        by.setdefault((run_["setting"], run_["arm"]), {})[run_["seed"]] = {
            "pass_at_1": statistics.fmean(j["pass_at_1"] for j in nodes),
            "accuracy_formatted": statistics.fmean(j["accuracy_formatted"] for j in nodes),
            "mixed_fraction": statistics.fmean(_tail(h, "mixed_fraction") for h in run_["history"]),
            "cpu_seconds": statistics.fmean(run_["cpu_seconds"]),
            "sources": {key: statistics.fmean(sum(x[key] for x in h) for h in run_["history"])
                        for key in ("own_pick_groups", "own_pick_mixed", "suggested_groups", "suggested_mixed",
                                    "peer_text_groups", "seconds_own_pick", "seconds_suggested",
                                    "seconds_peer_text")},
            "rounds": run_["rounds"], "nodes": run_["nodes"],
            "judge_excluded_seen": statistics.fmean(j.get("judge_excluded_seen", 0) for j in nodes),
            "peer_loss_share_max": run_.get("peer_loss_share_max", 0.0),
            "per_specialty": {name: statistics.fmean(j["per_specialty_pass_at_1"][name] for j in nodes)
                              for name in nodes[0]["per_specialty_pass_at_1"]},
            "solved": swarm_why.solved_by_question(nodes),
            "outcomes": swarm_why.own_outcomes_by_third(run_["history"]),
            "by_specialty": swarm_why.last_third_by_specialty(run_["history"]),
            "by_source": swarm_why.mixed_by_source(run_["history"]),
            # read at equal CPU only beside the curves' own batch: runs made since the bench kept judges along
            # the way ("midway") ran beside the long arms; older ones beside other work (inflated CPU time)
            "judged": [(statistics.fmean(m["cpu_seconds"]), statistics.fmean(j["pass_at_1"] for j in m["after"]))
                       for m in [*run_["midway"], run_]] if "midway" in run_ else []}
    curves = learning_curves(runs, base)
    arms = []
    for (setting, arm), per_seed in sorted(by.items()):
        paired = by.get((setting, "solo-long" if arm.endswith("-long") else "solo"), {})  # the same length
        row = _arm(setting, arm, per_seed, paired, base)
        for against in CURVE_ARMS:
            row |= equal_cpu(per_seed, curves, setting, against)
        arms.append(row | attack_keys(runs, setting, arm))
    return {"model": before.get("model"), "backend": before.get("backend"), "before": before["before"],
            "judge_questions": before["before"]["questions"], "judge": before.get("judge"),
            "eval_k": before["before"]["k"],
            "arms": arms, "curves": curves_json(curves), "signals": signals(runs),
            "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}


SHORT = {"heterogeneous": "het.", "homogeneous": "hom."}  # setting names short enough for tick labels and legends


def _arm(setting: str, arm: str, per_seed: dict[int, dict[str, Any]], solo: dict[int, dict[str, Any]],
         base: float) -> dict[str, Any]:
    seeds = sorted(per_seed)
    paired = [per_seed[s]["pass_at_1"] - solo[s]["pass_at_1"] for s in seeds if s in solo]
    cpu = statistics.fmean(per_seed[s]["cpu_seconds"] for s in seeds)
    gain = statistics.fmean(per_seed[s]["pass_at_1"] - base for s in seeds)
    per_specialty = {name: statistics.fmean(per_seed[s]["per_specialty"][name] - solo[s]["per_specialty"][name]
                                            for s in seeds if s in solo)
                     for name in per_seed[seeds[0]]["per_specialty"]} if any(s in solo for s in seeds) else {}
    rates = [per_seed[s]["solved"] for s in seeds if per_seed[s]["solved"]]
    per_round = [per_seed[s]["cpu_seconds"] / per_seed[s]["rounds"] / (solo[s]["cpu_seconds"] / solo[s]["rounds"])
                 for s in seeds if s in solo and solo[s]["rounds"] and per_seed[s]["rounds"]]
    return {"name": arm, "setting": setting, "seeds": seeds,
            "curve": {str(s): [list(p) for p in per_seed[s].get("judged", [])] for s in seeds},
            "cpu_per_round_vs_solo": statistics.fmean(per_round) if per_round else None,
            "judge_excluded_seen": statistics.fmean(per_seed[s]["judge_excluded_seen"] for s in seeds),
            "peer_loss_share_max": max(per_seed[s]["peer_loss_share_max"] for s in seeds),
            "pass_at_1_after": [per_seed[s]["pass_at_1"] for s in seeds],
            "accuracy_formatted_after": [per_seed[s]["accuracy_formatted"] for s in seeds],
            "delta_vs_solo_mean": statistics.fmean(paired) if paired else None,
            "delta_vs_solo_sd": statistics.stdev(paired) if len(paired) > 1 else None,
            "delta_vs_solo_per_seed": paired, "delta_vs_solo_per_specialty": per_specialty,
            "mixed_fraction": statistics.fmean(per_seed[s]["mixed_fraction"] for s in seeds),
            "cpu_seconds": cpu, "gain_per_cpu_hour": gain / (cpu / 3600) if cpu > 0 else None,
            "sources": {k: statistics.fmean(per_seed[s]["sources"][k] for s in seeds)
                        for k in per_seed[seeds[0]]["sources"]},
            "judge_se": statistics.fmean(swarm_why.judge_se(r) for r in rates) if rates else None,
            "pass_rate_histogram": [statistics.fmean(h)
                                    for h in zip(*(swarm_why.pass_rate_histogram(r) for r in rates))],
            "own_outcomes_by_third": swarm_why.mean_outcomes([per_seed[s]["outcomes"] for s in seeds]),
            "own_groups_by_specialty_last_third": swarm_why.merge_counts([per_seed[s]["by_specialty"] for s in seeds]),
            "mixed_by_source": swarm_why.merge_counts([per_seed[s]["by_source"] for s in seeds]),
            "rounds": per_seed[seeds[0]]["rounds"], "nodes": per_seed[seeds[0]]["nodes"]}


def signals(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """How well each candidate signal for choosing a source tells sources apart, from every run: one
    round's own-reward gain (the adaptive-J bandit's) against mixed / not mixed per group by source."""
    gains = [b["reward_mean"] - a["reward_mean"] for r in runs for h in r["history"] for a, b in itertools.pairwise(h)]
    out: dict[str, Any] = {"reward_gain_per_round_mean": statistics.fmean(gains) if gains else None,
                           "reward_gain_per_round_sd": statistics.stdev(gains) if len(gains) > 1 else None}
    for source in ("own_pick", "suggested"):
        groups = sum(x[f"{source}_groups"] for r in runs if r["arm"] in ("question", "both")
                     for h in r["history"] for x in h)
        mixed = sum(x[f"{source}_mixed"] for r in runs if r["arm"] in ("question", "both")
                    for h in r["history"] for x in h)
        rate = mixed / groups if groups else None
        out[f"{source}_mixed_rate"] = rate
        out[f"{source}_mixed_rate_se"] = (rate * (1 - rate) / groups) ** 0.5 if rate is not None else None
        out[f"{source}_groups"] = groups
    return out


def write(result: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    return save_results(out_dir, "swarm_learning", result, table, plot)


def table(result: dict[str, Any]) -> str:
    b = result["before"]
    lines = [f"# Sharing on a real model: {result['model']} ({result['backend']})",
             (f"Judge: {result['judge_questions']} held-out questions, k = {result['eval_k']} at T = 1; "
              f"before: pass@1 {b['pass_at_1']:.4f}. Each arm's nodes run the node's own round step and pool; "
              f"Δ is paired with the solo arm of the same training seed. {result['measured_at']}."), "",
             ("| setting | arm | seeds | nodes x rounds | pass@1 after (per seed) | Δ vs solo (mean ± sd) | "
              "Δ vs solo at equal CPU | own groups mixed | CPU-s per node | gain per CPU-hour |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for a in result["arms"]:
        delta = ("—" if a["delta_vs_solo_mean"] is None else f"{a['delta_vs_solo_mean']:+.4f}"
                 + (f" ± {a['delta_vs_solo_sd']:.4f}" if a["delta_vs_solo_sd"] is not None else " (one seed)"))
        gain = "—" if a["gain_per_cpu_hour"] is None else f"{a['gain_per_cpu_hour']:+.4f}"
        lines.append(f"| {a['setting']} | {a['name']} | {len(a['seeds'])} | {a['nodes']} x {a['rounds']} | "
                     f"{', '.join(f'{v:.4f}' for v in a['pass_at_1_after'])} | {delta} | {_equal_cpu_cell(a)} | "
                     f"{a['mixed_fraction']:.2f} | "
                     f"{a['cpu_seconds']:.0f} | {gain} |")
    lines += ["", "Per node and run, by source (groups, with signal, seconds):", "",
              "| setting | arm | own pick | suggested | peer text | seconds own / suggested / peer text |",
              "|---|---|---|---|---|---|"]
    for a in result["arms"]:
        s = a["sources"]
        lines.append(f"| {a['setting']} | {a['name']} | {s['own_pick_groups']:.0f} ({s['own_pick_mixed']:.0f}) | "
                     f"{s['suggested_groups']:.0f} ({s['suggested_mixed']:.0f}) | {s['peer_text_groups']:.0f} | "
                     f"{s['seconds_own_pick']:.0f} / {s['seconds_suggested']:.0f} / {s['seconds_peer_text']:.0f} |")
    return "\n".join(lines + _curve_lines(result) + attack_lines(result) + swarm_why.why_lines(result))


def _equal_cpu_cell(arm: dict[str, Any], against: str = "solo") -> str:
    key = f"delta_vs_{against}_equal_cpu"
    per = arm.get(f"{key}_per_seed") or []
    if arm["name"].removesuffix("-long") == against or not per:
        return "—"
    if arm.get(f"{key}_mean") is None:
        return f"not measured beside {against}'s curve" if all(d is None for d in per) else \
            f"some seeds not measured beside {against}'s curve"
    sd = arm.get(f"{key}_sd")
    at = arm.get(f"{key}_at_cpu") or [None] * len(per)
    seeds = ", ".join(f"{d:+.3f} @ {c:.0f} s" for d, c in zip(per, at) if d is not None and c is not None)
    return f"{arm[f'{key}_mean']:+.4f}" + (f" ± {sd:.4f} ({seeds})" if sd is not None else " (one seed)")


def _curve_lines(result: dict[str, Any]) -> list[str]:
    """Each learning curve's points, and every arm read against the curves at its own CPU-seconds."""
    curves = result.get("curves") or []
    if not any(len(c["cpu_seconds"]) > 2 for c in curves):
        return []
    lines = ["", "Learning curves (mean per node: CPU-seconds -> held-out pass@1; the first point is the start):", "",
             "| setting | arm | seed | points |", "|---|---|---|---|"]
    for c in curves:
        points = ", ".join(f"{cpu:.0f} s -> {v:.3f}" for cpu, v in zip(c["cpu_seconds"], c["pass_at_1"]))
        lines.append(f"| {c['setting']} | {c['arm']} | {c['seed']} | {points} |")
    lines += ["", ("Each arm against those curves at its own CPU-seconds per node (paired by seed; linear between "
                   "measured points, never beyond the longest run; only runs made beside the curves' runs, whose "
                   "CPU time was measured under the same neighbours):"), "",
              "| setting | arm | CPU-s per node | Δ vs solo at equal CPU | Δ vs question at equal CPU |", "|---|---|---|---|---|"]
    for a in result["arms"]:
        lines.append(f"| {a['setting']} | {a['name']} | {a['cpu_seconds']:.0f} | {_equal_cpu_cell(a)} | "
                     f"{_equal_cpu_cell(a, 'question')} |")
    return lines


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, curve_ax) = plt.subplots(1, 2, figsize=(15, 4.8), gridspec_kw={"width_ratios": [1.1, 1]})
    _plot_deltas(ax, result)
    ax.set_title(f"Sharing vs alone: {result['model']}")
    _plot_curves(curve_ax, result)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _plot_deltas(ax: Any, result: dict[str, Any]) -> None:
    """Per arm, Δ vs solo (mean ± sd over seeds) after the same rounds (light) and at equal CPU-seconds
    (solid, where the arm ran beside solo's learning curve): the second is the claim, the first its upper bound."""
    arms = [a for a in result["arms"] if not a["name"].startswith("solo") and a["delta_vs_solo_mean"] is not None]
    x = range(len(arms))
    ax.bar([k - 0.2 for k in x], [a["delta_vs_solo_mean"] for a in arms], width=0.4, capsize=3, color="#93c5fd",
           yerr=[a["delta_vs_solo_sd"] or 0.0 for a in arms], label="same rounds")
    equal = [(k, a) for k, a in zip(x, arms) if a.get("delta_vs_solo_equal_cpu_mean") is not None]
    ax.bar([k + 0.2 for k, _ in equal], [a["delta_vs_solo_equal_cpu_mean"] for _, a in equal], width=0.4, capsize=3,
           color="#1d4ed8", yerr=[a.get("delta_vs_solo_equal_cpu_sd") or 0.0 for _, a in equal],
           label="equal CPU-seconds")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(list(x), ["\n".join([SHORT[a["setting"]], *a["name"].split("-"), f"{len(a['seeds'])} seeds"])
                            for a in arms], fontsize=7)
    ax.set_ylabel("held-out pass@1, arm − solo (paired by seed)")
    ax.legend(fontsize=8)


def _plot_curves(ax: Any, result: dict[str, Any]) -> None:
    """Held-out pass@1 against CPU-seconds per node: each curve arm's seeds (thin) and their mean (thick)
    per setting; every other arm as its seeds' mean with their spread."""
    colors = {"solo": "#6b7280", "question": "#2563eb", "text": "#dc2626", "adaptive": "#059669", "both": "#7c3aed",
              "replay": "#d97706", "question-replay": "#0891b2"}
    for setting, marker in (("heterogeneous", "o"), ("homogeneous", "s")):
        for arm in CURVE_ARMS:
            seeds = [c for c in result.get("curves", []) if c["arm"] == arm and c["setting"] == setting]
            if not seeds:
                continue
            for c in seeds:
                ax.plot(c["cpu_seconds"], c["pass_at_1"], color=colors[arm], linewidth=0.6, alpha=0.4)
            if len({len(c["cpu_seconds"]) for c in seeds}) == 1:
                mean = [statistics.fmean(v) for v in zip(*(c["pass_at_1"] for c in seeds))]
                cpu = [statistics.fmean(v) for v in zip(*(c["cpu_seconds"] for c in seeds))]
                ax.plot(cpu, mean, color=colors[arm], linewidth=2, marker=marker, label=f"{arm} ({SHORT[setting]})")
        for a in result["arms"]:
            if a["setting"] != setting or a["name"].removesuffix("-long") in CURVE_ARMS:
                continue
            sd = statistics.stdev(a["pass_at_1_after"]) if len(a["pass_at_1_after"]) > 1 else 0.0
            beside = a.get("delta_vs_solo_equal_cpu_mean") is not None  # CPU time measured beside the curves
            color = colors.get(a["name"], "black")
            ax.errorbar([a["cpu_seconds"]], [statistics.fmean(a["pass_at_1_after"])], yerr=[sd], marker=marker,
                        color=color, markerfacecolor=color if beside else "none", capsize=4, linestyle="none",
                        label=f"{a['name']} ({SHORT[setting]}), {a['rounds']} rounds"
                              + ("" if beside else ", CPU measured beside other work"))
    ax.set_xlabel("CPU-seconds per node")
    ax.set_ylabel("held-out pass@1")
    ax.set_title("At equal CPU: learning curves and the other arms")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: the points stay visible
