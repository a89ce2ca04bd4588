"""Fig. 2-style figures (matplotlib, Agg): agent-averaged reward with a moving average and a min-max
band over agents, one panel per setting; held-out pass@1 per eval round."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lab.experiment import measures


def _labels(arms: Sequence[dict[str, Any]], setting: str) -> list[str]:
    labels = {a["cfg"].label for a in arms if a["cfg"].setting == setting}
    return sorted(labels, key=lambda s: (-int(s.split("/")[0]), s))


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_reward(arms: Sequence[dict[str, Any]], key: str, title: str, path: Path, window: int) -> None:
    """Per setting: for each I/J arm, the moving average of the per-round agent average (rows pooled
    over seeds: the mean over seeds of agent-averages), with the min-max band of the agents' own
    moving averages (over all agents of all seeds)."""
    plt = _pyplot()
    settings = sorted({a["cfg"].setting for a in arms}, reverse=True)  # homogeneous first
    fig, axes = plt.subplots(1, len(settings), figsize=(6.5 * len(settings), 4.2), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        for label in _labels(arms, setting):
            chosen = [a for a in arms if a["cfg"].setting == setting and a["cfg"].label == label]
            rounds = min(a["cfg"].rounds for a in chosen)
            # Agents of different seeds are distinct agents for the band: renumber them.
            rows = [{**r, "agent": i * 1000 + int(r["agent"])} for i, a in enumerate(chosen) for r in a["rounds"]
                    if int(r["round"]) <= rounds]
            mean, low, high = measures.agent_band(rows, key, rounds, window)
            xs = list(range(1, rounds + 1))
            line = ax.plot(xs, mean, label=f"{label} (n={len(chosen)} seeds)")[0]
            ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
        ax.set_title(f"{setting}")
        ax.set_xlabel("round")
        ax.set_ylabel(f"{window}-round moving average")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_heldout(arms: Sequence[dict[str, Any]], path: Path) -> None:
    """Held-out pass@1 by eval round: homogeneous (all specialties), heterogeneous split into the
    specialties an agent generates and those it sees only from peers. Band: min-max over agents."""
    plt = _pyplot()
    panels = [("homogeneous", "all"), ("heterogeneous", "gen"), ("heterogeneous", "peer")]
    panels = [p for p in panels if any(a["cfg"].setting == p[0] for a in arms)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (setting, split) in zip(axes[0], panels):
        for label in _labels(arms, setting):
            chosen = [a for a in arms if a["cfg"].setting == setting and a["cfg"].label == label]
            by_round: dict[int, list[float]] = {}
            for i, arm in enumerate(chosen):
                per_agent: dict[tuple[int, int], list[dict[str, str]]] = {}
                for e in arm["evals"]:
                    per_agent.setdefault((int(e["round"]), int(e["agent"])), []).append(e)
                for (round_no, _), items in per_agent.items():
                    per = {e["specialty"]: {"n_questions": float(e["n_questions"]), "pass1": float(e["pass1"]),
                                            "passk": float(e["passk"]), "malformed_rate": float(e["malformed_rate"])}
                           for e in items}
                    gen = [e["specialty"] for e in items if e["generated"] == "1"]
                    peer = [e["specialty"] for e in items if e["generated"] == "0"]
                    value = measures.split_pass(per, gen, peer)[f"pass1_{split}"]
                    if not math.isnan(value):  # NaN: no specialty in this split
                        by_round.setdefault(round_no, []).append(value)
            xs = sorted(by_round)
            if not xs:
                continue
            line = ax.plot(xs, [measures.mean_or(by_round[x]) for x in xs], marker="o",
                           label=f"{label} (n={len(chosen)} seeds)")[0]
            ax.fill_between(xs, [min(by_round[x]) for x in xs], [max(by_round[x]) for x in xs],
                            color=line.get_color(), alpha=0.15, linewidth=0)
        names = {"all": "all specialties", "gen": "specialties it generates", "peer": "seen only from peers"}
        ax.set_title(f"{setting}: {names[split]}")
        ax.set_xlabel("round")
        ax.set_ylabel("held-out pass@1 (mean over agents)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("(c) held-out pass@1 on the fixed judge set")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
