"""`sapo bench busy`'s summary (the issue's JSON keys), its markdown table and its plot (lab/bench/busy.py)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

FAIR_SHARE_TARGET = 1.25  # every case within 1.25x of its fair-share time
OWNER_TARGET = 0.05  # the owner's CPU-bound work slowed by <= 5% beside the engine at idle priority
DOCTOR_TARGET = 0.30  # the doctor's estimate within 30% of the measured round for the lent cores


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def case_row(setting: str, case: dict[str, Any]) -> dict[str, Any]:
    """What one case measured. A round still running at the cap was finished after the owner stopped,
    so it only says "at least" (cap - its start); the judge is not started after the cap."""
    cap = case["capped_at"]
    rounds = [e for e in case["events"] if e["event"] == "round"]
    done = [r for r in rounds if cap is None or r["end"] <= cap]
    cut = [r for r in rounds if cap is not None and r["end"] > cap]
    judge = next((e for e in case["events"] if e["event"] == "judge"), None)
    judged = judge is not None and (cap is None or judge["end"] <= cap)
    ran = done + ([judge] if judged and judge is not None else [])
    busy_s = sum(e["end"] - e["start"] for e in ran)
    return {
        "settings": setting, "competitors": case["competitors"],
        "threads": [r["threads"] for r in rounds], "judge_threads": judge["threads"] if judge else None,
        "others_busy_seen": [r["others_busy"] for r in rounds],  # what the node's pacer measured
        "rounds_done": len(done),
        "round_s": _median([r["total"] for r in done]),
        "generate_s": _median([r["generate"] for r in done]), "update_s": _median([r["update"] for r in done]),
        "round_s_at_least": cap - cut[0]["start"] if cut and not done else None,
        "judge_s": judge["seconds"] if judged and judge is not None else None,
        "judge_s_at_least": cap - judge["start"] if judge is not None and not judged else None,
        "censored": cap is not None,
        # cores the engine actually got while it ran: its CPU-seconds over its wall seconds
        "engine_cores": sum(e["cpu_s"] for e in ran) / busy_s if busy_s > 0 else None,
    }


def fair_share(row: dict[str, Any], quiet: dict[str, Any] | None, cores: int) -> None:
    """Fair-share times from the quiet case of the same setting: t threads beside c competitors get
    t * min(1, P / (t + c)) cores if every runnable thread had an equal share."""
    c = row["competitors"]

    def share(threads: float) -> float:
        return threads * min(1.0, cores / (threads + c))

    threads = _median([float(t) for t in row["threads"]]) or 1.0
    row["fair_share_cores"] = round(share(threads), 3)
    ratio: dict[str, Any] = {"round": None, "judge": None, "round_at_least": None}
    row["fair_share_round_s"] = row["fair_share_judge_s"] = None
    if quiet is not None and quiet["round_s"]:
        quiet_cores = min(_median([float(t) for t in quiet["threads"]]) or 1.0, cores)
        predicted = quiet["round_s"] * quiet_cores / share(threads)
        row["fair_share_round_s"] = predicted
        if row["round_s"] is not None:
            ratio["round"] = row["round_s"] / predicted
        elif row["round_s_at_least"] is not None:
            ratio["round_at_least"] = row["round_s_at_least"] / predicted
    if quiet is not None and quiet["judge_s"] and row["judge_threads"]:
        quiet_cores = min(float(quiet["judge_threads"]), cores)
        predicted = quiet["judge_s"] * quiet_cores / share(float(row["judge_threads"]))
        row["fair_share_judge_s"] = predicted
        ratio["judge"] = row["judge_s"] / predicted if row["judge_s"] is not None else None
    row["ratio_to_fair_share"] = ratio


def owner(row: dict[str, Any], case: dict[str, Any], alone: dict[str, float]) -> None:
    units = case["owner_units"]
    base = alone.get(str(row["competitors"]))
    row["owner_units"] = len(units)
    row["owner_unit_s"] = _median(units)
    row["owner_slowdown"] = (row["owner_unit_s"] / base - 1.0) if units and base else None


def summarize(raw: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    cases = []
    for setting, data in raw.items():
        quiet = None
        for case in data["cases"]:
            row = case_row(setting, case)
            quiet = row if case["competitors"] == 0 else quiet
            fair_share(row, quiet, meta["cores"])
            owner(row, case, meta["owner_unit_s_alone"])
            cases.append(row)
    doctor = meta["doctor"]
    for setting, est in doctor.items():
        measured = next((r["round_s"] for r in cases if r["settings"] == setting and r["competitors"] == 0), None)
        est["measured_round_s"] = measured
        est["ratio"] = measured / est["round_seconds"] if measured and est["round_seconds"] else None
    result = {**meta, "engines": {setting: data["ready"] for setting, data in raw.items()}, "cases": cases}
    result["targets"] = targets(result)
    return result


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, each with the cases that miss it (or could not be measured)."""
    over, censored = [], []
    for r in result["cases"]:
        name = f"{r['settings']}/{r['competitors']}"
        ratio = r["ratio_to_fair_share"]
        if ratio["round"] is None and ratio["judge"] is None:  # capped: over if even its lower bound is
            (over if (ratio["round_at_least"] or 0.0) > FAIR_SHARE_TARGET else censored).append(name)
        elif max(v for v in (ratio["round"], ratio["judge"]) if v is not None) > FAIR_SHARE_TARGET:
            over.append(name)
    felt = [f"{r['settings']}/{r['competitors']}" for r in result["cases"] if r["settings"] != "old"
            and r["owner_slowdown"] is not None and r["owner_slowdown"] > OWNER_TARGET]
    doctor_off = [s for s, d in result["doctor"].items() if d["ratio"] is None or abs(d["ratio"] - 1) > DOCTOR_TARGET]
    return {"fair_share_within": FAIR_SHARE_TARGET, "over_fair_share": over, "no_ratio": censored,
            "owner_slowdown_within": OWNER_TARGET, "owner_slowed_more": felt,
            "doctor_within": DOCTOR_TARGET, "doctor_off": doctor_off}


def _fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _ratio(r: dict[str, Any], key: str) -> str:
    ratio = r["ratio_to_fair_share"]
    if ratio[key] is not None:
        return f"{ratio[key]:.2f}x"
    return f">= {ratio['round_at_least']:.1f}x" if key == "round" and ratio["round_at_least"] else "-"


def table(result: dict[str, Any]) -> str:
    lines = [f"# The engine on a machine that is also in use: {result['model']}, {result['cores']} cores",
             (f"{result['rounds']} cpu-real rounds (all completions trained) and a judge of "
              f"{result['judge_questions']} questions x {result['eval_k']} per case; cases capped at "
              f"{result['cap_s']:g} s; competitors: CPU-bound loops at normal priority; load average "
              f"{result['load_average_at_start']:.1f} -> {result['load_average_at_end']:.1f}; "
              f"{result['wall_minutes']:.1f} min; {result['measured_at']}."), ""]
    for setting, spec in result["settings"].items():
        ready = result["engines"][setting]
        lines.append(f"- **{setting}**: {spec}; applied: {ready['priority']}, OpenMP waits: {ready['wait_policy']}")
    lines += ["", ("| setting | competitors | threads | round s (generate + update) | judge s | fair-share cores "
                   "| round / fair share | judge / fair share | engine cores | owner slowdown |"),
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["cases"]:
        rnd = (f"{r['round_s']:.1f} ({r['generate_s']:.1f} + {r['update_s']:.1f})" if r["round_s"] is not None
               else f">= {r['round_s_at_least']:.0f} (capped)" if r["round_s_at_least"] else "-")
        judge = (_fmt(r["judge_s"]) if r["judge_s"] is not None
                 else f">= {r['judge_s_at_least']:.0f} (capped)" if r["judge_s_at_least"] else "-")
        slow = None if r["owner_slowdown"] is None else 100 * r["owner_slowdown"]
        lines.append(f"| {r['settings']} | {r['competitors']} | {','.join(map(str, r['threads'])) or '-'} | "
                     f"{rnd} | {judge} | {r['fair_share_cores']:.2f} | {_ratio(r, 'round')} | "
                     f"{_ratio(r, 'judge')} | {_fmt(r['engine_cores'], 2)} | {_fmt(slow, 1, '%')} |")
    lines.append("")
    for setting, d in result["doctor"].items():
        lines.append(f"`sapo doctor` for {setting}: ~{d['round_seconds']:.1f} s ({d['assumes']}); measured quiet "
                     f"{_fmt(d['measured_round_s'])} s" + (f" ({d['ratio']:.2f}x)." if d["ratio"] else "."))
    if any(r["censored"] and r["settings"] != "old" for r in result["cases"]):
        lines += ["", ("A capped case of an idle-priority setting is the engine waiting while the owner's work "
                       "wants every core, as it should: idle priority gives the owner the machine; the owner's "
                       "slowdown column is what that buys.")]
    t = result["targets"]
    lines += ["", (f"Targets: within {t['fair_share_within']}x of fair share: over it {t['over_fair_share'] or 'none'}; "
                   f"capped too early to tell: {t['no_ratio'] or 'none'}. Owner slowed <= "
                   f"{100 * t['owner_slowdown_within']:.0f}% by the new settings: more {t['owner_slowed_more'] or 'none'}. "
                   f"Doctor within {100 * t['doctor_within']:.0f}%: off {t['doctor_off'] or 'none'}.")]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = result["cases"]
    labels = [f"{r['settings']}\n{r['competitors']} comp." for r in cases]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, r in enumerate(cases):
        ratio = r["ratio_to_fair_share"]
        value, capped = (ratio["round"], False) if ratio["round"] is not None else (ratio["round_at_least"], True)
        ax1.bar(i, value or 0.0, color="tab:gray" if capped else "tab:blue", hatch="//" if capped else None)
        if ratio["judge"] is not None:
            ax1.plot(i, ratio["judge"], "o", color="tab:orange")
    ax1.axhline(FAIR_SHARE_TARGET, color="tab:red", ls="--", lw=1, label=f"target {FAIR_SHARE_TARGET}x")
    ax1.set_xticks(range(len(cases)), labels, fontsize=8)
    ax1.set_ylabel("measured / fair-share time")
    ax1.set_title("Rounds (bars; hatched: capped, at least) and judge (dots)")
    ax1.legend(fontsize=8)
    slow = [100 * (r["owner_slowdown"] or 0.0) for r in cases]
    ax2.bar(range(len(cases)), slow, color=["tab:purple" if r["settings"] == "old" else "tab:green" for r in cases])
    ax2.axhline(100 * OWNER_TARGET, color="tab:red", ls="--", lw=1, label=f"target {100 * OWNER_TARGET:.0f}%")
    ax2.set_xticks(range(len(cases)), labels, fontsize=8)
    ax2.set_ylabel("owner's unit time beside the engine, % slower")
    ax2.set_title("What the engine costs the owner")
    ax2.legend(fontsize=8)
    fig.suptitle(f"{result['model']} on {result['cores']} cores beside CPU-bound work")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
