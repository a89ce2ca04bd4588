"""`sapo bench busy`'s summary (the issue's JSON keys), its markdown table and its plot (lab/bench/busy.py)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

IDLE_TARGET = 1.10  # quiet machine: within 1.10x of the best fixed thread count
FREE_TARGET = 1.25  # beside the owner (steady or coming and going): within 1.25x of the free capacity's time
OWNER_TARGET = 0.05  # the owner's CPU-bound work slowed by <= 5% beside the engine at idle priority
DOCTOR_RANGE = (0.8, 1.25)  # the doctor's estimate / the measured quiet round
FIXED = "fixed-"


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
        "settings": setting, "competitors": case["competitors"], "bursty": case.get("bursty"),
        "threads": [r["threads"] for r in rounds], "judge_threads": judge["threads"] if judge else None,
        "threads_range": [min((r.get("threads_low", r["threads"]) for r in rounds), default=None),
                          max((r.get("threads_high", r["threads"]) for r in rounds), default=None)],
        "thread_changes": sum(r.get("thread_changes", 0) for r in rounds),
        "others_busy_seen": [r["others_busy"] for r in rounds],  # what the node's pacer measured last
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


def fixed_quiet(rows: list[dict[str, Any]]) -> dict[int, dict[str, float | None]]:
    """Threads -> the quiet round and judge times of each fixed count measured."""
    return {int(r["settings"][len(FIXED):]): {"round": r["round_s"], "judge": r["judge_s"]}
            for r in rows if r["settings"].startswith(FIXED) and r["competitors"] == 0}


def reference_s(fixed: dict[int, dict[str, float | None]], free: float, cores: int, key: str) -> float | None:
    """The quiet time of the best fixed count that fits `free` cores; a fractional `free` (an owner
    that comes and goes) mixes the rates of the counts on both sides. None without a free core or a
    measured count."""
    def best(k: int) -> float | None:
        times = [float(t[key] or 0.0) for n, t in fixed.items() if n <= k and t[key]]
        return min(times) if times else None

    if free < 1 - 1e-9:
        return None
    lo = int(free + 1e-9)
    part = free - lo
    lo_s, hi_s = best(lo), best(min(lo + 1, cores))
    if lo_s is None or (part > 1e-9 and hi_s is None):
        return None
    if part <= 1e-9:
        return lo_s
    assert hi_s is not None
    return 1.0 / ((1 - part) / lo_s + part / hi_s)  # the work rate, time-weighted over the owner's absences


def free_capacity(row: dict[str, Any], cores: int) -> float:
    """The cores the owner leaves: P - c, less on average for an owner that is away part of the time."""
    c = row["competitors"]
    if row["bursty"]:
        on, off = row["bursty"]
        return cores - c * on / (on + off)
    return float(cores - c)


def ratios(row: dict[str, Any], fixed: dict[int, dict[str, float | None]], cores: int) -> None:
    free = free_capacity(row, cores)
    row["free_capacity_cores"] = round(free, 3)
    ratio: dict[str, Any] = {"round": None, "judge": None, "round_at_least": None}
    ref_round, ref_judge = (reference_s(fixed, free, cores, key) for key in ("round", "judge"))
    row["free_capacity_round_s"], row["free_capacity_judge_s"] = ref_round, ref_judge
    if ref_round:
        if row["round_s"] is not None:
            ratio["round"] = row["round_s"] / ref_round
        elif row["round_s_at_least"] is not None:
            ratio["round_at_least"] = row["round_s_at_least"] / ref_round
    if ref_judge and row["judge_s"] is not None:
        ratio["judge"] = row["judge_s"] / ref_judge
    row["ratio_to_free_capacity"] = ratio
    best = reference_s(fixed, float(cores), cores, "round")
    row["ratio_to_best_fixed_idle"] = (row["round_s"] / best if row["competitors"] == 0 and best
                                       and row["round_s"] is not None else None)


def owner(row: dict[str, Any], case: dict[str, Any], alone: dict[str, float]) -> None:
    units = case["owner_units"]
    base = alone.get(str(row["competitors"]))
    row["owner_units"] = len(units)
    row["owner_unit_s"] = _median(units)
    row["owner_slowdown"] = (row["owner_unit_s"] / base - 1.0) if units and base else None


def summarize(raw: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    cases = []
    for setting, data in raw.items():
        for case in data["cases"]:
            row = case_row(setting, case)
            owner(row, case, meta["owner_unit_s_alone"])
            cases.append(row)
    fixed = fixed_quiet(cases)
    for row in cases:
        ratios(row, fixed, meta["cores"])
    doctor = meta["doctor"]
    for setting, est in doctor.items():
        measured = next((r["round_s"] for r in cases if r["settings"] == setting and r["competitors"] == 0), None)
        est["measured_round_s"] = measured
        est["ratio"] = measured / est["round_seconds"] if measured and est["round_seconds"] else None
        est["catalog_ratio"] = (measured / est["catalog_round_seconds"]
                                if measured and est.get("catalog_round_seconds") else None)
    result = {**meta, "engines": {setting: data["ready"] for setting, data in raw.items()}, "cases": cases,
              "best_fixed_idle": {"threads": min(fixed, key=lambda t: fixed[t]["round"] or float("inf")),
                                  "round_s": min(t["round"] or float("inf") for t in fixed.values())}
              if fixed else None,
              "doctor_estimate_ratio": doctor.get("new", {}).get("ratio")}
    result["targets"] = targets(result)
    return result


def _name(r: dict[str, Any]) -> str:
    return f"{r['settings']}/{r['competitors']}" + ("-bursty" if r["bursty"] else "")


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets for the adaptive setting ("new"), each with the cases that miss it."""
    idle_over, free_over, unmeasured = [], [], []
    for r in (r for r in result["cases"] if r["settings"] == "new"):
        ratio = r["ratio_to_free_capacity"]
        if r["competitors"] == 0:
            if r["ratio_to_best_fixed_idle"] is None:
                unmeasured.append(_name(r))
            elif r["ratio_to_best_fixed_idle"] > IDLE_TARGET:
                idle_over.append(_name(r))
        elif r["free_capacity_cores"] >= 1:
            value = ratio["round"] if ratio["round"] is not None else ratio["round_at_least"]
            if value is None:
                unmeasured.append(_name(r))
            elif value > FREE_TARGET or (ratio["judge"] or 0.0) > FREE_TARGET:
                free_over.append(_name(r))
    felt = [_name(r) for r in result["cases"] if r["settings"] != "old"
            and r["owner_slowdown"] is not None and r["owner_slowdown"] > OWNER_TARGET]
    doc = result["doctor_estimate_ratio"]
    return {"idle_within": IDLE_TARGET, "idle_over": idle_over, "free_capacity_within": FREE_TARGET,
            "free_capacity_over": free_over, "not_measured": unmeasured,
            "owner_slowdown_within": OWNER_TARGET, "owner_slowed_more": felt, "doctor_range": list(DOCTOR_RANGE),
            "doctor_within": doc is not None and DOCTOR_RANGE[0] <= doc <= DOCTOR_RANGE[1]}


def _fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _ratio(r: dict[str, Any], key: str) -> str:
    ratio = r["ratio_to_free_capacity"]
    if ratio[key] is not None:
        return f"{ratio[key]:.2f}x"
    return f">= {ratio['round_at_least']:.1f}x" if key == "round" and ratio["round_at_least"] else "-"


def _owner(r: dict[str, Any]) -> str:
    if not r["competitors"]:
        return "quiet"
    return f"{r['competitors']}" + (f", {r['bursty'][0]:g} s on / {r['bursty'][1]:g} s off" if r["bursty"] else "")


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
    lines += ["", ("Free capacity: the cores the owner leaves; its time is the best fixed thread count's quiet "
                   "time on that many cores (fixed-N rows). Threads: per round, the count it ended on "
                   "(low-high inside the rounds, changes)."), "",
              ("| setting | owner | threads | round s (generate + update) | judge s | free cores "
               "| round / free capacity | judge / free capacity | round / best fixed idle | engine cores "
               "| owner slowdown |"),
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["cases"]:
        rnd = (f"{r['round_s']:.1f} ({r['generate_s']:.1f} + {r['update_s']:.1f})" if r["round_s"] is not None
               else f">= {r['round_s_at_least']:.0f} (capped)" if r["round_s_at_least"] else "-")
        judge = (_fmt(r["judge_s"]) if r["judge_s"] is not None
                 else f">= {r['judge_s_at_least']:.0f} (capped)" if r["judge_s_at_least"] else "-")
        slow = None if r["owner_slowdown"] is None else 100 * r["owner_slowdown"]
        low, high = r["threads_range"]
        threads = ",".join(map(str, r["threads"])) or "-"
        if low is not None and (low != high or r["thread_changes"]):
            threads += f" ({low}-{high}, {r['thread_changes']} changes)"
        lines.append(f"| {r['settings']} | {_owner(r)} | {threads} | {rnd} | {judge} | "
                     f"{r['free_capacity_cores']:.1f} | {_ratio(r, 'round')} | {_ratio(r, 'judge')} | "
                     f"{_fmt(r['ratio_to_best_fixed_idle'], 2, 'x')} | {_fmt(r['engine_cores'], 2)} | "
                     f"{_fmt(slow, 1, '%')} |")
    lines.append("")
    for setting, d in result["doctor"].items():
        lines.append(f"`sapo doctor` for {setting} on a fresh machine ({d.get('source', 'estimated')}): "
                     f"~{d['round_seconds']:.1f} s ({d['assumes']}); measured quiet {_fmt(d['measured_round_s'])} s"
                     + (f" ({d['ratio']:.2f}x)" if d["ratio"] else "")
                     + (f"; the catalog's rates alone ~{d['catalog_round_seconds']:.1f} s ({d['catalog_ratio']:.2f}x)."
                        if d.get("catalog_ratio") else "."))
    if any(r["censored"] and r["settings"] != "old" for r in result["cases"]):
        lines += ["", ("A capped case of an idle-priority setting is the engine waiting while the owner's work "
                       "wants every core, as it should: idle priority gives the owner the machine; the owner's "
                       "slowdown column is what that buys.")]
    t = result["targets"]
    lines += ["", (f"Targets for new: quiet within {t['idle_within']}x of the best fixed count: over "
                   f"{t['idle_over'] or 'none'}; beside the owner within {t['free_capacity_within']}x of the free "
                   f"capacity: over {t['free_capacity_over'] or 'none'}; not measured: {t['not_measured'] or 'none'}. "
                   f"Owner slowed <= {100 * t['owner_slowdown_within']:.0f}% (idle-priority settings): more "
                   f"{t['owner_slowed_more'] or 'none'}. Doctor within {t['doctor_range'][0]}-{t['doctor_range'][1]}x: "
                   f"{'yes' if t['doctor_within'] else 'no'}.")]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = result["cases"]
    labels = [f"{r['settings']}\n{_owner(r)}".replace(", ", "\n") for r in cases]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    for i, r in enumerate(cases):
        ratio = r["ratio_to_free_capacity"]
        value, capped = (ratio["round"], False) if ratio["round"] is not None else (ratio["round_at_least"], True)
        ax1.bar(i, value or 0.0, color="tab:gray" if capped else "tab:blue", hatch="//" if capped else None)
        if ratio["judge"] is not None:
            ax1.plot(i, ratio["judge"], "o", color="tab:orange")
    ax1.axhline(FREE_TARGET, color="tab:red", ls="--", lw=1, label=f"target beside the owner {FREE_TARGET}x")
    ax1.axhline(IDLE_TARGET, color="tab:red", ls=":", lw=1, label=f"target quiet {IDLE_TARGET}x")
    ax1.set_xticks(range(len(cases)), labels, fontsize=7)
    ax1.set_ylabel("measured / free capacity's time")
    ax1.set_title("Rounds (bars; hatched: capped, at least) and judge (dots)")
    ax1.legend(fontsize=8)
    slow = [100 * (r["owner_slowdown"] or 0.0) for r in cases]
    ax2.bar(range(len(cases)), slow, color=["tab:purple" if r["settings"] == "old" else "tab:green" for r in cases])
    ax2.axhline(100 * OWNER_TARGET, color="tab:red", ls="--", lw=1, label=f"target {100 * OWNER_TARGET:.0f}%")
    ax2.set_xticks(range(len(cases)), labels, fontsize=7)
    ax2.set_ylabel("owner's unit time beside the engine, % slower")
    ax2.set_title("What the engine costs the owner")
    ax2.legend(fontsize=8)
    fig.suptitle(f"{result['model']} on {result['cores']} cores beside the owner's CPU-bound work")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
