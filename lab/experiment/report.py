"""Aggregating finished arms: summary.json, a markdown table, Fig. 2-style PNGs, one combined CSV.

Reads only what workers wrote (arms/<name>/arm.json, rounds.csv, evals.csv), validating as it goes:
a missing or malformed arm is reported and skipped, never guessed.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lab.experiment import measures
from lab.experiment.config import ArmConfig
from lab.experiment.driver import ARMS_DIR
from lab.experiment.plots import plot_heldout, plot_reward
from lab.experiment.runner import json_safe

PAPER = {"8/0": 561.79, "6/2": 854.43, "4/4": 1093.31, "2/6": 945.87}  # §5, 8 agents x 2000 rounds
PAPER_ROUNDS = 2000
MEASURE_KEYS = ("cum_trained", "cum_trained_sum", "cum_generated", "pass1_all", "pass1_gen", "pass1_peer", "passk_all",
                "malformed_rate_all", "updates_per_agent", "groups_per_update", "external_per_update")


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def load_arms(out_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Finished arms as {cfg, summary, rounds, evals}, and the problems met (one line each)."""
    arms, problems = [], []
    for path in sorted((out_dir / ARMS_DIR).glob("*/arm.json")):
        try:
            summary = json.loads(path.read_text())
            cfg = ArmConfig.from_dict(summary["config"])
            rounds = _read_csv(path.parent / "rounds.csv")
            evals = _read_csv(path.parent / "evals.csv")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problems.append(f"{path.parent.name}: {type(exc).__name__}: {exc}")
            continue
        arms.append({"cfg": cfg, "summary": summary, "rounds": rounds, "evals": evals})
    return arms, problems


def _final_eval(summary: dict[str, Any]) -> dict[str, float]:
    evals = summary.get("evals", {})
    last = max(evals, key=int) if evals else None
    return dict(evals[last]) if last is not None else {}


def arm_values(arm: dict[str, Any]) -> dict[str, float]:
    s = arm["summary"]
    values = {k: float(s[k]) for k in ("cum_trained", "cum_generated", "updates_per_agent", "groups_per_update",
                                       "external_per_update")}
    values.update({k: math.nan if v is None else float(v) for k, v in _final_eval(s).items()})
    # (a') the sum variant: per agent and round, Σ over trained-on groups of the group's mean reward
    # (= (a) x groups trained); it grows with the number of groups that pass the filter.
    rows = [{**r, "group_reward_sum": float(r["reward_trained"]) * float(r["groups_trained"])} for r in arm["rounds"]]
    values["cum_trained_sum"] = measures.cumulative(measures.agent_average(rows, "group_reward_sum",
                                                                           arm["cfg"].rounds))
    seed_pass1 = s["evals"].get("0", {}).get("pass1_all")
    values["pass1_seed"] = math.nan if seed_pass1 is None else float(seed_pass1)
    return values


def summarise(arms: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per (setting, label): per-seed values, their spread, and paired differences against 8/0
    (same setting, same seed)."""
    groups: dict[tuple[str, str], dict[int, dict[str, float]]] = {}
    rounds_of: dict[tuple[str, str], int] = {}
    for arm in arms:
        cfg: ArmConfig = arm["cfg"]
        groups.setdefault((cfg.setting, cfg.label), {})[cfg.seed] = arm_values(arm)
        rounds_of[(cfg.setting, cfg.label)] = cfg.rounds
    out: dict[str, Any] = {}
    for (setting, label), by_seed in sorted(groups.items()):
        baseline = groups.get((setting, "8/0"), {})
        keys = sorted(set().union(*(v.keys() for v in by_seed.values())))
        entry: dict[str, Any] = {"rounds": rounds_of[(setting, label)], "seeds": sorted(by_seed),
                                 "per_seed": {str(s): v for s, v in sorted(by_seed.items())}}
        entry["spread"] = {k: measures.spread([v.get(k, math.nan) for v in by_seed.values()]) for k in keys}
        if label != "8/0" and baseline:
            entry["vs_8_0"] = {k: measures.paired_differences(
                {s: v[k] for s, v in by_seed.items() if k in v}, {s: v[k] for s, v in baseline.items() if k in v})
                for k in keys}
        out.setdefault(setting, {})[label] = entry
    return out


def per_specialty_final(arms: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Held-out pass@1 after the last round per (setting, arm, specialty), averaged over agents and
    seeds, separately where the agent generates the specialty ("gen") and where only peers do
    ("peer"); "seed" is the same at round 0. Where collapse on peer-only specialties would show."""
    acc: dict[str, dict[str, dict[str, dict[str, list[float]]]]] = {}
    for arm in arms:
        cfg: ArmConfig = arm["cfg"]
        for e in arm["evals"]:
            final = int(e["round"]) == cfg.rounds
            if not final and int(e["round"]) != 0:
                continue
            flag = {"1": "gen", "0": "peer"}.get(e["generated"])
            key = flag if final else "seed"
            if key is None:
                continue
            (acc.setdefault(cfg.setting, {}).setdefault(cfg.label, {}).setdefault(e["specialty"], {})
             .setdefault(key, []).append(float(e["pass1"])))
    return {setting: {label: {spec: {k: round(measures.mean_or(v), 4) for k, v in sorted(d.items())}
                              for spec, d in sorted(specs.items())}
                      for label, specs in sorted(labels.items())}
            for setting, labels in sorted(acc.items())}


def _fmt(spread: dict[str, float], digits: int = 3) -> str:
    if not spread or spread.get("n", 0) == 0 or math.isnan(spread["mean"]):
        return "–"
    if spread["n"] == 1:
        return f"{spread['mean']:.{digits}f}"
    return f"{spread['mean']:.{digits}f} ± {spread['sd']:.{digits}f}"


def _pct(diff: dict[str, float], base: dict[str, float]) -> str:
    if not diff or not base or diff.get("n", 0) == 0 or not base.get("mean"):
        return "–"
    return f"{100 * diff['mean'] / base['mean']:+.0f}%"


def _scaled(spread: dict[str, float], rounds: int) -> dict[str, float]:
    if not spread or not spread.get("n"):
        return {}
    return {**spread, **{k: spread[k] / rounds for k in ("mean", "sd", "min", "max")}}


def markdown_table(summary: dict[str, Any]) -> str:
    """One row per setting and arm: the paper's number next to ours, (a), (b), (c), the controls.
    Cumulative values are sums over rounds of agent averages; Δ columns are paired (same seeds)."""
    head = ("| setting | I/J | seeds | paper (a) cum. | paper ÷ 2000 rounds | paper Δ(a) | (a) cum. trained-on | "
            "(a) ÷ rounds | Δ(a) | (a′) cum. Σ trained groups | Δ(a′) | "
            "(b) cum. generated | Δ(b) | (c) pass@1 final | Δ pass@1 | pass@1 gen / peer-only | "
            "pass@8 | malformed | updates/agent | groups/update |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for setting, arms in summary.items():
        base = arms.get("8/0", {}).get("spread", {})
        for label, e in sorted(arms.items(), key=lambda kv: (-int(kv[0].split("/")[0]), kv[0])):
            sp, vs = e["spread"], e.get("vs_8_0", {})
            split = label.split(" ")[0]
            paper = PAPER.get(split) if setting == "homogeneous" else None
            paper_delta = f"{100 * (paper / PAPER['8/0'] - 1):+.0f}%" if paper and split != "8/0" else "–"
            da, db = vs.get("cum_trained", {}), vs.get("cum_generated", {})
            lines.append(
                f"| {setting} | {label} | {len(e['seeds'])} | {paper if paper else '–'} | "
                f"{f'{paper / PAPER_ROUNDS:.3f}' if paper else '–'} | {paper_delta} | "
                f"{_fmt(sp.get('cum_trained', {}), 1)} | {_fmt(_scaled(sp.get('cum_trained', {}), e['rounds']))} | "
                f"{_pct(da, base.get('cum_trained', {}))} | {_fmt(sp.get('cum_trained_sum', {}), 1)} | "
                f"{_pct(vs.get('cum_trained_sum', {}), base.get('cum_trained_sum', {}))} | "
                f"{_fmt(sp.get('cum_generated', {}), 1)} | {_fmt(db, 1)} ({_pct(db, base.get('cum_generated', {}))}) | "
                f"{_fmt(sp.get('pass1_all', {}))} | {_fmt(vs.get('pass1_all', {}))} | "
                f"{_fmt(sp.get('pass1_gen', {}))} / {_fmt(sp.get('pass1_peer', {}))} | "
                f"{_fmt(sp.get('passk_all', {}))} | {_fmt(sp.get('malformed_rate_all', {}))} | "
                f"{_fmt(sp.get('updates_per_agent', {}), 1)} | {_fmt(sp.get('groups_per_update', {}), 2)} |")
    return "\n".join(lines) + "\n"


def write_combined_csv(arms: Sequence[dict[str, Any]], path: Path, key: str) -> None:
    rows = [r for arm in arms for r in arm[key]]
    if not rows:
        return
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def aggregate(out_dir: Path, window: int = 20) -> dict[str, Any]:
    """Build summary.json, table.md, rounds.csv, evals.csv and the figures from finished arms."""
    arms, problems = load_arms(out_dir)
    summary = {"measures": {
        "cum_trained": "(a) the paper's: sum over rounds of the agent-averaged mean reward of the groups "
                       "trained on (own non-zero-advantage groups + external groups drawn); 0 for a round "
                       "with no such group",
        "cum_trained_sum": "(a') sum over rounds of the agent-averaged SUM over trained-on groups of each "
                           "group's mean reward ((a) x groups trained): grows with how many groups pass the "
                           "zero-advantage filter",
        "cum_generated": "(b) sum over rounds of the agent-averaged mean reward of every completion the "
                         "agent generated itself (all I own groups, before the filter)",
        "pass1_*": "(c) held-out pass@1 on the fixed judge set after the last round, mean over agents; "
                   "gen = specialties the agent generates, peer = seen only from peers",
        "vs_8_0": "per-seed paired difference arm - 8/0 (same setting, seed, question draws), then "
                  "mean/sd/min/max over seeds"},
        "arms": len(arms), "problems": problems, "settings": summarise(arms),
        "per_specialty_pass1_final": per_specialty_final(arms)}
    (out_dir / "summary.json").write_text(json.dumps(json_safe(summary), indent=1, sort_keys=True, allow_nan=False))
    (out_dir / "table.md").write_text(markdown_table(summary["settings"]))
    write_combined_csv(arms, out_dir / "rounds.csv", "rounds")
    write_combined_csv(arms, out_dir / "evals.csv", "evals")
    if arms:
        plot_reward(arms, "reward_trained", "(a) reward of the groups trained on (paper's measure)",
                    out_dir / "fig_a_trained_on.png", window)
        with_sum = [{**arm, "rounds": [{**r, "group_reward_sum": float(r["reward_trained"]) * float(r["groups_trained"])}
                                       for r in arm["rounds"]]} for arm in arms]
        plot_reward(with_sum, "group_reward_sum", "(a') sum over trained-on groups of the group's mean reward",
                    out_dir / "fig_a2_trained_on_sum.png", window)
        plot_reward(arms, "reward_generated", "(b) reward of the agent's own generations",
                    out_dir / "fig_b_generated.png", window)
        plot_heldout(arms, out_dir / "fig_c_heldout.png")
    return summary
