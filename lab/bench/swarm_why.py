"""Why an arm of `sapo bench swarm-learning` learned what it did: per judge question, per specialty, and
where each node's own generation went without a gradient (mixed / all right / all wrong, by third of
the run, by specialty and rung)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from engine.tasks.curriculum import entry_rung

OUTCOMES = ("mixed", "all right", "all wrong")


def own_outcomes_by_third(history: list[list[dict[str, float]]]) -> list[list[float]] | None:
    """Per third of the rounds (first, middle, last): the shares of the nodes' own groups that were mixed,
    all right and all wrong (None for runs made before the bench kept the last two)."""
    if not history or not history[0] or "own_all_right" not in history[0][0]:
        return None
    n = len(history[0])
    thirds = []
    for lo, hi in ((0, n // 3), (n // 3, 2 * n // 3), (2 * n // 3, n)):
        rows = [x for h in history for x in h[lo:hi]]
        groups = sum(x["own_pick_groups"] + x["suggested_groups"] for x in rows)
        mixed = sum(x["own_pick_mixed"] + x["suggested_mixed"] for x in rows)
        right, wrong = (sum(x[key] for x in rows) for key in ("own_all_right", "own_all_wrong"))
        thirds.append([v / groups for v in (mixed, right, wrong)] if groups else [0.0, 0.0, 0.0])
    return thirds


def solved_by_question(nodes: list[dict[str, Any]]) -> list[float] | None:
    """Per judge question, the pass rate averaged over the nodes and the judge's repeats (None for runs
    judged before the judge kept per-question counts)."""
    lists = [r["solved"] for j in nodes for r in j["repeats"] if r.get("solved")]
    if not lists or len({len(x) for x in lists}) != 1:
        return None
    k = nodes[0]["k"]
    return [statistics.fmean(x[i] for x in lists) / k for i in range(len(lists[0]))]


def judge_se(rates: list[float]) -> float:
    """The judge's standard error on a pass@1 from per-question pass rates: questions differ far more
    than samples of one question, so the spread across questions is what bounds the estimate."""
    return statistics.stdev(rates) / len(rates) ** 0.5 if len(rates) > 1 else 0.0


HISTOGRAM_BINS = ("never", "under 1/3", "1/3 to 2/3", "over 2/3", "always")


def pass_rate_histogram(rates: list[float]) -> list[float]:
    """Share of judge questions by pass rate (averaged over nodes and repeats), in HISTOGRAM_BINS."""
    counts = [0] * len(HISTOGRAM_BINS)
    for r in rates:
        counts[0 if r <= 0 else 4 if r >= 1 else 1 + min(2, int(r * 3))] += 1
    return [c / len(rates) for c in counts] if rates else []


def mean_outcomes(per_seed: list[list[list[float]] | None]) -> list[list[float]] | None:
    """The seeds' mean of own_outcomes_by_third, over the seeds that recorded it."""
    known = [t for t in per_seed if t]
    if not known:
        return None
    return [[statistics.fmean(t[third][k] for t in known) for k in range(len(OUTCOMES))] for third in range(3)]


COUNTS = ("groups", "mixed", "right", "wrong", "rungs")


def _count_own_groups(history: list[list[dict[str, Any]]], by: str, last_third: bool) -> dict[str, dict[str, float]] | None:
    """Counts of the nodes' own groups per specialty or per source (`by`), over the whole run or its last
    third: groups, mixed, right (all right), wrong (all wrong), and the sum of their rungs above the entry
    rung (None for runs made before the bench logged each own group)."""
    if not history or not history[0] or "own_groups" not in history[0][0]:
        return None
    first = 2 * len(history[0]) // 3 if last_third else 0
    counts: dict[str, dict[str, float]] = {}
    for node in history:
        for row in node[first:]:
            for specialty, rung, outcome, source in row["own_groups"]:
                c = counts.setdefault(specialty if by == "specialty" else source, dict.fromkeys(COUNTS, 0.0))
                c["groups"] += 1
                c[outcome] += 1
                c["rungs"] += rung - entry_rung(specialty) if rung >= 0 else 0
    return counts


def last_third_by_specialty(history: list[list[dict[str, Any]]]) -> dict[str, dict[str, float]] | None:
    """Where the late groups without a gradient come from: the last third's own groups per specialty."""
    return _count_own_groups(history, "specialty", last_third=True)


def mixed_by_source(history: list[list[dict[str, Any]]]) -> dict[str, dict[str, float]] | None:
    """Over the whole run, own groups per source (own_pick, replay, suggested). Does a question asked
    again, or a peer's, come back with a gradient more often than a fresh draw?"""
    return _count_own_groups(history, "source", last_third=False)


def merge_counts(per_seed: list[dict[str, dict[str, float]] | None]) -> dict[str, dict[str, float]] | None:
    """The seeds' own-group counts (either of the two above) added up, over the seeds that logged them."""
    known = [c for c in per_seed if c]
    if not known:
        return None
    total: dict[str, dict[str, float]] = {}
    for counts in known:
        for name, c in counts.items():
            into = total.setdefault(name, dict.fromkeys(c, 0.0))
            for key, value in c.items():
                into[key] += value
    return dict(sorted(total.items()))


def why_lines(result: dict[str, Any]) -> list[str]:
    """Where a difference comes from: per specialty, per question, and which signal could steer it."""
    lines = ["", "Δ vs solo per specialty (held-out pass@1, paired by seed):", ""]
    names = sorted({n for a in result["arms"] for n in a.get("delta_vs_solo_per_specialty", {})})
    lines += ["| setting | arm | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for a in result["arms"]:
        per = a.get("delta_vs_solo_per_specialty") or {}
        if a["name"] != "solo" and per:
            lines.append(f"| {a['setting']} | {a['name']} | " + " | ".join(f"{per.get(n, 0.0):+.3f}" for n in names)
                         + " |")
    judged, section = _arm_section(result, "pass_rate_histogram", (
        "Judge questions by pass rate after training (share of questions; the judge's standard "
        "error on pass@1 from the spread across questions):"), [*HISTOGRAM_BINS, "judge SE"])
    lines += section
    for a in judged:
        lines.append(f"| {a['setting']} | {a['name']} | " + " | ".join(f"{v:.2f}" for v in a["pass_rate_histogram"])
                     + f" | {a['judge_se']:.3f} |")
    lines += outcome_lines(result) + specialty_outcome_lines(result) + source_mixed_lines(result)
    s = result.get("signals") or {}
    if s.get("reward_gain_per_round_sd") is not None:
        lines += ["", (f"Signals for choosing a source: one round's own-reward gain moves by sd "
                       f"{s['reward_gain_per_round_sd']:.3f} around {s['reward_gain_per_round_mean']:+.3f}")]
        if s.get("suggested_mixed_rate") is not None and s.get("own_pick_mixed_rate") is not None:
            lines[-1] += (f"; mixed per group: suggested {s['suggested_mixed_rate']:.2f} ± "
                          f"{s['suggested_mixed_rate_se']:.2f} ({s['suggested_groups']:.0f} groups) vs own picks "
                          f"{s['own_pick_mixed_rate']:.2f} ± {s['own_pick_mixed_rate_se']:.2f} "
                          f"({s['own_pick_groups']:.0f} groups), in the arms that take suggestions.")
    return lines


def _arm_section(result: dict[str, Any], key: str, intro: str,
                 columns: Sequence[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The arms that recorded `key`, and their section's opening: `intro`, then the header of a table with
    a row per arm (setting, arm, `columns`). No arm recorded it: no section."""
    kept = [a for a in result["arms"] if a.get(key)]
    if not kept:
        return [], []
    return kept, ["", intro, "", "| setting | arm | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]


def outcome_lines(result: dict[str, Any]) -> list[str]:
    """Why own groups stop giving a gradient: by thirds of the run, mixed / all right / all wrong."""
    kept, lines = _arm_section(result, "own_outcomes_by_third", (
        "Own groups by outcome (suggested questions included), first / middle / last third of the rounds: "
        "mixed groups train; all right is a question below the policy, all wrong one above it "
        "(arms run since the bench recorded it):"), OUTCOMES)
    for a in kept:
        thirds = a["own_outcomes_by_third"]
        lines.append(f"| {a['setting']} | {a['name']} | "
                     + " | ".join(" / ".join(f"{t[k]:.2f}" for t in thirds) for k in range(len(OUTCOMES))) + " |")
    return lines


def specialty_outcome_lines(result: dict[str, Any]) -> list[str]:
    """Where the last third's own groups without a gradient come from: per specialty, mixed / all
    right / all wrong, and how many rungs above the entry rung the node was asking on average."""
    kept, lines = _arm_section(result, "own_groups_by_specialty_last_third", (
        "Own groups in the last third of the rounds by specialty: mixed / all right / all wrong (share of "
        "that specialty's groups, all seeds and nodes), groups, and the mean rung above the entry rung "
        "the curriculum asked at (negative: easier than the judge):"),
        ["specialty", "mixed / right / wrong", "groups", "rung vs entry"])
    for a in kept:
        for specialty, c in a["own_groups_by_specialty_last_third"].items():
            g = max(c["groups"], 1.0)
            lines.append(f"| {a['setting']} | {a['name']} | {specialty} | {c['mixed'] / g:.2f} / {c['right'] / g:.2f} / "
                         f"{c['wrong'] / g:.2f} | {c['groups']:.0f} | {c['rungs'] / g:+.2f} |")
    return lines


def source_mixed_lines(result: dict[str, Any]) -> list[str]:
    """Per arm, how often each source's own groups held a right and a wrong answer (all seeds and nodes)."""
    names = ("own_pick", "replay", "suggested")
    kept, lines = _arm_section(result, "mixed_by_source", (
        "Own groups that were mixed, by where the question came from (mixed / groups, whole run):"), names)
    for a in kept:
        cells = [f"{c['mixed'] / c['groups']:.2f} ({c['groups']:.0f})" if (c := a["mixed_by_source"].get(n)) and c["groups"]
                 else "—" for n in names]
        lines.append(f"| {a['setting']} | {a['name']} | " + " | ".join(cells) + " |")
    return lines
