"""`sapo bench poisoning`'s summary (per class against its paired control), its markdown table and its
plot (lab/bench/poisoning.py runs the victims)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any


def summarize(runs: list[dict[str, Any]], wall_s: float, seed: int = 0) -> dict[str, Any]:
    plain = [r for r in runs if r["attack"] == "control" and not r.get("perturb")]
    controls = {r["sampler"]: r for r in plain}  # the newest batch's (runs are in batch order)
    same_batch = {(r["sampler"], r.get("batch")): r for r in plain}  # what a run's rounds/s compare with
    replicas = [r for r in runs if r["attack"] == "control" and r.get("perturb")]
    # The noise of one paired run's held-out delta: the control and its perturbed replicas, none attacked.
    pass1 = [controls["uniform"]["heldout_pass_at_1"]] + [r["heldout_pass_at_1"] for r in replicas]
    noise_sd = statistics.stdev(pass1) if len(pass1) > 1 else None
    classes = []
    for r in runs:
        if r["attack"] == "control":
            continue
        # Paired with its own batch's control: machines drift over an hour, and a later batch may run
        # other code (a defence added between batches changes the control's weights too).
        t = same_batch.get((r["sampler"], r.get("batch")), controls[r["sampler"]])
        classes.append({
            "name": r["attack"], "sampler": r["sampler"], "offered": r["offered"], "pooled": r["pooled"],
            "trained_on": r["trained_on"],
            # runs from before the forged-content classes did not record these (None: not measured)
            "trained_share": r.get("trained_share"), "credited": r.get("credited"),
            "honest_credited": r.get("honest_credited"), "heldout_trained": r.get("heldout_trained"),
            "rounds_per_s_ratio": r["rounds_per_s"] / t["rounds_per_s"],
            # the victim's own CPU per round: what contention from other processes cannot move
            "rounds_per_cpu_s_ratio": (r["rounds_per_cpu_s"] / t["rounds_per_cpu_s"]
                                       if "rounds_per_cpu_s" in r and "rounds_per_cpu_s" in t else None),
            "control_batch": t.get("batch"),
            "heldout_delta": r["heldout_pass_at_1"] - t["heldout_pass_at_1"],
            "heldout_delta_relative": (r["heldout_pass_at_1"] - t["heldout_pass_at_1"]) / max(t["heldout_pass_at_1"], 1e-9),
            "trigger_share": r["trigger_share"], "logp_trigger_delta": r["logp_trigger"] - t["logp_trigger"],
            # the victim ended with exactly the control's weights: the attacker's traffic changed nothing
            "same_weights_as_control": (None if not (r.get("weights_sha256") and t.get("weights_sha256"))
                                        else r["weights_sha256"] == t["weights_sha256"]),
            "dropped": r["dropped"]})
    for k in classes:  # beyond two noise sds of the paired delta, in either direction
        k["heldout_beyond_noise"] = (None if noise_sd is None
                                     else abs(k["heldout_delta"]) > 2 * noise_sd * 2 ** 0.5)
    return {"rounds": runs[0]["rounds"], "seed": seed, "controls": controls, "classes": classes, "runs": runs,
            "control_replicas_pass_at_1": pass1[1:], "heldout_noise_sd": noise_sd,
            "wall_minutes": wall_s / 60, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
            "targets": {"trigger_share": 0.0, "heldout_within": 0.05, "rounds_per_s_ratio_min": 0.8,
                        "trained_share_one_identity_max": 1 / 4, "trained_share_two_identities_max": 2 / 4,
                        "heldout_trained": 0, "credited_receipt_sybil_and_copycat": 0}}



def table(result: dict[str, Any]) -> str:
    c = result["controls"]["uniform"]
    lines = [(f"# Peers that lie: a seed victim among 2 honest peers, {result['rounds']} rounds per run "
              f"({result['measured_at']}, {result['wall_minutes']:.0f} min)"), "",
             (f"Control (no attacker): {c['rounds_per_s']:.2f} rounds/s, held-out pass@1 {c['heldout_pass_at_1']:.4f} "
              f"(pass@{c['eval_k']} {c['heldout_pass_at_k']:.4f}), log p(trigger) {c['logp_trigger']:.1f}. "
              "Targets: trigger share 0, held-out pass@1 within 5% of control, rounds/s >= 0.8x under CPU bombs "
              "and Sybils; one identity at most 1/(I+J) of a round's step and two at most J/(I+J); 0 held-out "
              "questions trained; credit 0 for receipts from unverified senders and for copies. Credited: "
              "receipts the victim sent the attacker (one per group it trained), or for receipt_sybil the "
              "attacker's receipts the victim counted."), "", _noise_line(result), "",
             ("| class | sampler | offered | pooled | trained on | rounds/s vs control (per CPU-s) "
              "| largest share of a round's step | credited | held-out questions trained "
              "| held-out Δ pass@1 (rel.) | beyond noise | same weights as control | trigger share | Δ log p(trigger) "
              "| dropped |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in result["classes"]:
        dropped = ", ".join(f"{reason} {n}" for reason, n in sorted(k["dropped"].items(), key=lambda kv: -kv[1])[:3])
        lines.append(f"| {k['name']} | {k['sampler']} | {k['offered']:,} | {k['pooled']:,} | {k['trained_on']:,} | "
                     f"{k['rounds_per_s_ratio']:.2f}x ({_ratio(k.get('rounds_per_cpu_s_ratio'))}) | "
                     f"{_share(k.get('trained_share'))} | {_count(k.get('credited'))} | {_count(k.get('heldout_trained'))} | "
                     f"{k['heldout_delta']:+.4f} ({k['heldout_delta_relative']:+.0%}) | "
                     f"{_beyond(k.get('heldout_beyond_noise'))} | {_same(k.get('same_weights_as_control'))} | "
                     f"{k['trigger_share']:.3f} | {k['logp_trigger_delta']:+.1f} | {dropped} |")
    return "\n".join(lines)


def _noise_line(result: dict[str, Any]) -> str:
    sd, replicas = result.get("heldout_noise_sd"), result.get("control_replicas_pass_at_1") or []
    if sd is None:
        return "Held-out noise: not measured (no perturbed control replicas)."
    values = ", ".join(f"{v:.4f}" for v in replicas)
    return (f"Held-out noise: the control's pass@1 and {len(replicas)} perturbed replicas' ({values}; the same "
            f"victim and traffic, another path) have sd {sd:.4f}; a paired delta beyond 2·√2·sd = "
            f"{2 * 2 ** 0.5 * sd:.4f} is marked beyond noise.")


def _beyond(value: bool | None) -> str:
    return "–" if value is None else ("**yes**" if value else "no")


def _same(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "no")


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _count(value: int | None) -> str:
    return "–" if value is None else f"{value:,}"


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [k for k in result["classes"] if k["sampler"] == "uniform"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    names = [k["name"] for k in rows]
    for ax, key, title in ((axes[0], "trained_on", "attacker groups trained on"),
                           (axes[1], "rounds_per_s_ratio", "victim rounds/s vs control"),
                           (axes[2], "heldout_delta", "held-out pass@1 vs control")):
        ax.barh(names, [k[key] for k in rows], color="#2563eb")
        ax.set_title(title)
        if key == "rounds_per_s_ratio":
            ax.axvline(0.8, color="#dc2626", ls="--", lw=1)
    fig.suptitle(f"Poisoning bench: {result['rounds']} rounds per run (seed victim, uniform sampler)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

