"""Fabricating identities among the honest nodes of `sapo bench swarm-learning` (its attack arms).

An attacker holds a legitimately issued credential and no model. Each round each of its identities
publishes `GROUPS_PER_ROUND` signed groups for questions of the victims' own training mix, written by
hand at the victims' group size, one tactic per group in turn:

  fabricated   half right answers, half wrong, every text distinct: a mixed group no check can tell
               from an honest one (bounded by its weight, not refused)
  max_length   the same, each right answer followed by filler up to the victims' token cap
  duplicates   one right answer copied half a group: the copy screen's case
  eos_padding  right answers followed by literal end-of-text markers: the special-token screen's case
  heldout      fabricated groups for the victims' own judge questions: the held-out range's case

What the arm measures is what the victims lose against the same swarm without attackers (the text arm
of the same seed at the same round) and the largest share of a victim's step the attackers held.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from engine.sapo.records import Provenance, RolloutGroup
from engine.tasks import library
from lab.bench.attacks import right_answers, wrong_answers

ATTACKERS = {"text-attacked-1": 1, "text-attacked-2": 2}  # attack arm -> fabricating identities
GROUPS_PER_ROUND = 4  # per identity
TACTICS = ("fabricated", "max_length", "duplicates", "eos_padding", "heldout")
EOS_TEXTS = ("<|endoftext|>", "<|im_end|>")  # SmolLM2's end markers written as text
FILLER = ("Checked twice.", "That is final.", "Verified step by step.", "No doubt here.", "Sure of it.",
          "Confirmed again.", "Simple enough.", "All good.")


def completions_for(tactic: str, question: Any, size: int, rng: random.Random) -> tuple[str, ...]:
    """One group's texts for `tactic`: `size` completions, half of them right."""
    half = size // 2
    rights = right_answers(question, half)
    if tactic == "max_length":
        rights = [r + " " + " ".join(FILLER[(i + k) % len(FILLER)] for k in range(12)) for i, r in enumerate(rights)]
    elif tactic == "duplicates":
        rights = [library.demonstration(question)] * half
    elif tactic == "eos_padding":
        rights = [r + EOS_TEXTS[i % len(EOS_TEXTS)] * 3 for i, r in enumerate(rights)]
    texts = rights + list(wrong_answers(question, size - half))
    rng.shuffle(texts)
    return tuple(texts)


def attacker_round(origins: Sequence[str], round_no: int, mix: Any, judge: Sequence[Any], size: int,
                   rng: random.Random) -> dict[str, list[RolloutGroup]]:
    """Each identity's groups for this round (tactics rotate with the round and the group)."""
    out: dict[str, list[RolloutGroup]] = {}
    for a, origin in enumerate(origins):
        groups = []
        for i in range(GROUPS_PER_ROUND):
            tactic = TACTICS[(round_no + a + i) % len(TACTICS)]
            if tactic == "heldout" and judge:
                question = judge[rng.randrange(len(judge))]
            else:
                question = library.regenerate(mix.sample_refs(rng, 1, 1000 + round_no)[0])
            groups.append(RolloutGroup(question.ref, question.hash, completions_for(tactic, question, size, rng),
                                       Provenance(origin, "smollm2-135m", round_no, round_no, float(round_no))))
        out[origin] = groups
    return out


def attacker_share(result: Any, attackers: set[str]) -> float:
    """The attackers' identities' share of this round's step budget together (engine/sapo/peer_weight.py)."""
    shares = result.peer_loss_share
    return float(sum(v for origin, v in shares.items() if origin in attackers))


def attacker_groups_trained(result: Any, attackers: set[str]) -> int:
    return sum(v.group.provenance.origin_peer in attackers for v in result.used_external)


def _pass_at(runs: Sequence[dict[str, Any]], setting: str, arm: str, seed: int, round_no: int) -> float | None:
    """Mean held-out pass@1 of `arm`'s nodes at `round_no` (its end or a judge along the way), or None."""
    for run in runs:
        if (run["setting"], run["arm"], run["seed"]) != (setting, arm, seed):
            continue
        for mark in [*run.get("midway", []), run]:
            if mark.get("round", run["rounds"]) == round_no:
                return float(sum(j["pass_at_1"] for j in mark["after"])) / len(mark["after"])
    return None


def attack_keys(runs: Sequence[dict[str, Any]], setting: str, arm: str) -> dict[str, Any]:
    """The attack arm's keys: the attackers' largest share of a victim's step, their groups trained, and
    the victims' held-out pass@1 against the honest swarm (text-long's judge at the same round, same
    seed) and against solo (solo-long's), per seed and mean; None where the pair was not run."""
    mine = [r for r in runs if (r["setting"], r["arm"]) == (setting, arm)]
    if arm not in ATTACKERS or not mine:
        return {}
    out: dict[str, Any] = {"attackers": ATTACKERS[arm],
                           "attacker_loss_share_max": max(r.get("attacker_loss_share_max", 0.0) for r in mine),
                           "attacker_groups_trained": sum(r.get("attacker_groups_trained", 0) for r in mine)}
    for key, against in (("victim_delta_vs_honest", "text-long"), ("victim_delta_vs_solo", "solo-long")):
        deltas = {}
        for r in mine:
            ours = _pass_at(runs, setting, arm, r["seed"], r["rounds"])  # found: `mine` holds the run
            theirs = _pass_at(runs, setting, against, r["seed"], r["rounds"])
            if ours is not None and theirs is not None:
                deltas[str(r["seed"])] = ours - theirs
        out[f"{key}_per_seed"] = deltas
        out[key] = sum(deltas.values()) / len(deltas) if deltas else None
    return out


def attack_lines(result: dict[str, Any]) -> list[str]:
    """The attack arms' table (none run: no lines)."""
    rows = [a for a in result["arms"] if a["name"] in ATTACKERS]
    if not rows:
        return []
    lines = ["", ("Attack arms: the text arm with fabricating identities among its nodes (lab/bench/swarm_attack.py); "
                  "the victims' pass@1 against the honest text arm and against solo at the same round, paired by seed. "
                  "Bound: one identity at most 1/(I+J) of a round's step, two at most J/(I+J)."), "",
             ("| setting | arm | seeds | largest share of a victim's step | attacker groups trained "
              "| victim Δ vs honest swarm | victim Δ vs solo |"), "|---|---|---|---|---|---|---|"]
    for a in rows:
        lines.append(f"| {a['setting']} | {a['name']} | {len(a['seeds'])} | {a['attacker_loss_share_max']:.3f} | "
                     f"{a['attacker_groups_trained']:.0f} | {_signed(a['victim_delta_vs_honest'])} | "
                     f"{_signed(a['victim_delta_vs_solo'])} |")
    return lines


def _signed(value: float | None) -> str:
    return "not run beside it" if value is None else f"{value:+.4f}"
