"""One arm of `sapo bench swarm-learning` for one training seed, in its own process (one core).

N real-model nodes (SmolLM2-135M through llama.cpp) each run the node's own round step
(`engine.sapo.step`) over the node's own pool (`peer_groups.make_pool`); their groups travel as signed
`rollouts` frames of the real protocol between them (`experiment.transport.InMemorySwarm`, lock-step:
a round's groups arrive before the next round). What differs between arms is only what a node takes
from the swarm:

  solo       nothing (the same N nodes, alone: the pairing for every other arm)
  text       J peers' text groups (`--external J`; the app's default is question sharing)
  question   part of its own I questions from peers' frontier questions, answered by itself
  both       both
  adaptive   question sharing where each round's share of suggestions follows what they yielded
  replay     alone, but one of the I questions re-asks one of its own recent frontier questions
  question-replay
             question sharing and replay: what a peer's question adds beyond a node's own frontier
  solo-long, question-long, text-long
             solo / question / text for 4.5 / 2.5 / 2 times the rounds, judged after each whole multiple
             of them too: their learning curves, so that an arm that costs more CPU per round (text: ~1.5x
             solo's) meets them at the same CPU-seconds, measured, not extrapolated
  text-attacked-1, text-attacked-2
             text, with 1 or 2 fabricating identities publishing beside the honest nodes
             (lab/bench/swarm_attack.py): what the victims lose, and the attackers' largest share of a step

The judge is disjoint from training by content (lab/bench/judge_set.py), and each node's score leaves
out the judge texts it trained on all the same (counted: `judge_excluded_seen`).

Settings: homogeneous (every node the same specialties) and heterogeneous (node k trains on 2 of the
4, and is judged on all 4). `python -m lab.bench.swarm_arm ARGS_JSON OUT_JSON`.
"""

from __future__ import annotations

import functools
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from engine.models.backends import load_for_node
from engine.sapo.config import SapoConfig, preset
from engine.sapo.step import PoolExchange, step
from engine.sapo.trainer import Trainer
from engine.tasks.curriculum import rung_of
from lab.bench.judge_set import disjoint_judge
from lab.bench.real_arm import SOLVED, judge, judge_mix, train_mix
from lab.bench.swarm_attack import ATTACKERS, attacker_groups_trained, attacker_round, attacker_share
from lab.experiment.transport import InMemorySwarm, agent_identity

ARMS: dict[str, dict[str, Any]] = {  # config overrides per arm (on the cpu-real recipe: I = 2)
    "solo": {"num_external": 0, "num_suggested": 0},
    "text": {"num_external": 2, "num_suggested": 0},
    "question": {"num_external": 0, "num_suggested": 1},
    "both": {"num_external": 2, "num_suggested": 1},
    # how many of the I = 2 own questions are peers' suggestions, 0-2, follows each source's yield here
    "adaptive": {"num_external": 0, "num_suggested": 2, "adaptive_sources": True},
    "replay": {"num_external": 0, "num_suggested": 0, "num_replay": 1},
    "question-replay": {"num_external": 0, "num_suggested": 1, "num_replay": 1},
    "solo-long": {"num_external": 0, "num_suggested": 0},
    "question-long": {"num_external": 0, "num_suggested": 1},
    "text-long": {"num_external": 2, "num_suggested": 0},
    # off-policy corrected: each peer completion's advantage weighted by min(π_receiver(y) / μ_sender(y), 1)
    # from the sequence log-probs its frame carries (negatives kept, weighted); judged beside text-long
    "text-is-long": {"num_external": 2, "num_suggested": 0, "external_strategy": "importance-weighted",
                     "importance_max_weight": 1.0},
    # text among 1 or 2 fabricating identities (lab/bench/swarm_attack.py): judged against text-long's
    # judge at the same round and seed
    "text-attacked-1": {"num_external": 2, "num_suggested": 0},
    "text-attacked-2": {"num_external": 2, "num_suggested": 0},
}
# Arms that run a multiple of the bench's rounds, judged after each whole one too: solo's curve runs long
# enough (4.5x) to meet text's (2x, at ~1.9x solo's CPU per round: bench/swarm_learning.md) at equal
# CPU-seconds; at 3.5x solo ended at ~520 CPU-s per node where text's 48 rounds took ~590.
ROUNDS_FACTOR = {"solo-long": 4.5, "question-long": 2.5, "text-long": 2.0, "text-is-long": 2.0}
SETTINGS = ("homogeneous", "heterogeneous")
# A round's metrics each node's history keeps (0.0 where a round did not report one)
HISTORY_KEYS = ("reward_mean", "own_pick_groups", "own_pick_mixed", "suggested_groups", "suggested_mixed",
                "peer_text_groups", "seconds_own_pick", "seconds_suggested", "seconds_peer_text",
                "peer_loss_share_max", "external_implausible", "external_pending")


def node_specialties(setting: str, k: int, specialties: list[str]) -> list[str]:
    """Heterogeneous: node k trains on two neighbouring specialties of the four (each covered twice)."""
    if setting == "homogeneous":
        return list(specialties)
    return [specialties[k % len(specialties)], specialties[(k + 1) % len(specialties)]]


def own_outcomes(groups: Any) -> dict[str, float]:
    """A round's own groups (suggested questions included) that gave no gradient, by why: every answer
    right (the question is below the policy) or every answer wrong (above it)."""
    flat = [g.rewards[0] for g in groups if g.rewards and not g.has_signal]
    return {"own_all_right": float(sum(1 for r in flat if r >= SOLVED)),
            "own_all_wrong": float(sum(1 for r in flat if r < SOLVED))}


def own_group_log(groups: Any, suggested: int, replayed: int = 0) -> list[list[Any]]:
    """Each own group of a round as [specialty, rung (-1: off the ladders), outcome, source]: outcome
    "mixed", "right" or "wrong"; source "suggested" for the first `suggested` (peers' questions),
    "replay" for the next `replayed` (own questions asked again), else "own_pick". Where a node's
    generation goes without a gradient, by specialty and difficulty."""
    log = []
    for k, g in enumerate(groups):
        outcome = "mixed" if g.has_signal else "right" if g.rewards and g.rewards[0] >= SOLVED else "wrong"
        rung = rung_of(g.ref.specialty, g.ref.config)
        source = "suggested" if k < suggested else "replay" if k < suggested + replayed else "own_pick"
        log.append([g.ref.specialty, -1 if rung is None else rung, outcome, source])
    return log


def _node(model: str, data_dir: Path, arm: str, setting: str, k: int, seed: int, specialties: list[str],
          overrides: dict[str, Any]) -> Any:
    loaded = load_for_node(model, "llamacpp", "cpu", data_dir)
    cfg = SapoConfig.from_dict(preset("cpu-real").to_dict() | {
        "prompt_style": loaded.prompt_style or "chat-fewshot", "prompt_shots": loaded.prompt_shots or 1,
        "eval_every": 0, "eval_every_s": 0.0, "checkpoint_every": 0} | ARMS[arm] | overrides)
    mix = train_mix(node_specialties(setting, k, specialties))
    return Trainer(loaded.model, loaded.tokenizer, cfg, mix, None, None, seed=seed * 100 + k,
                   model_id=loaded.model_id, generator=loaded.generator), loaded


def _round_record(result: Any, attackers: set[str]) -> dict[str, Any]:
    """One node's round in its history: the metrics kept, the share of its groups with a gradient, its
    own groups' outcomes, what the attackers got, and the own-group log."""
    m = result.metrics
    return ({key: float(m.get(key, 0.0)) for key in HISTORY_KEYS}
            | {"mixed_fraction": 1.0 - m.get("frac_reward_zero_std", 1.0)} | own_outcomes(result.local_groups)
            | {"attacker_loss_share": attacker_share(result, attackers),
               "attacker_groups_trained": float(attacker_groups_trained(result, attackers))}
            | {"own_groups": own_group_log(result.local_groups, int(m.get("suggested_groups", 0)),
                                           int(m.get("replayed_groups", 0)))})


def _wire(nodes: list[Any], arm: str, seed: int) -> tuple[InMemorySwarm, list[PoolExchange], list[str]]:
    """The in-memory swarm between the nodes (and the arm's attacker identities after them): each node's
    exchange over its own pool, publishing only where the arm shares. Returns the attackers' peer ids too."""
    sharing = ARMS[arm]["num_external"] > 0 or ARMS[arm]["num_suggested"] > 0  # replay alone is not sharing
    identities = [agent_identity(seed, k) for k in range(len(nodes) + ATTACKERS.get(arm, 0))]
    swarm = InMemorySwarm(identities, max(n.cfg.sampling.max_new_tokens for n in nodes), 1.5, lockstep=True)
    exchanges = [PoolExchange(swarm.pools[k], functools.partial(swarm.publish, k) if sharing else None)
                 for k in range(len(nodes))]
    return swarm, exchanges, [ident.peer_id for ident in identities[len(nodes):]]


def _progress(label: str, r: int, rounds: int, history: list[list[dict[str, Any]]], t_start: float) -> None:
    recent = [h for hist in history for h in hist[-10:]]
    print(f"[{label}] round {r}/{rounds}: reward "
          f"{statistics.fmean(h['reward_mean'] for h in recent):.3f} mixed "
          f"{statistics.fmean(h['mixed_fraction'] for h in recent):.2f} ({time.time() - t_start:.0f} s)",
          flush=True)


def run_swarm_arm(arm: str, setting: str, model: str, data_dirs: list[str], threads: int, rounds: int,
                  specialties: list[str], judge_questions: int, eval_k: int, eval_seeds: list[int],
                  seed: int, overrides: dict[str, Any], judge_at: list[int] | None = None) -> dict[str, Any]:
    """One arm for one seed; `judge_at`: rounds before the last at which every node is judged too
    (the judge samples with its own seeds: the training path is the same as without it)."""
    torch.set_num_threads(threads)  # after the imports: a module setting threads at import doubles them
    t_start = time.time()
    built = [_node(model, Path(d), arm, setting, k, seed, specialties, overrides) for k, d in enumerate(data_dirs)]
    nodes = [trainer for trainer, _ in built]
    judge_q, judge_facts = disjoint_judge([judge_mix(specialties), train_mix(specialties)], [train_mix(specialties)],
                                          judge_questions, nodes[0].cfg.eval_seed)
    for node in nodes:
        node.use_judge(judge_q)
    if rounds == 0:  # every node starts from these weights: judged once, for every arm
        before = judge(nodes[0], judge_q, eval_k, eval_seeds)
        for _, loaded in built:
            loaded.generator.close()
        return {"before": before, "model": built[0][1].model_id, "backend": built[0][1].label,
                "judge": judge_facts}

    def judged(node: Any) -> dict[str, Any]:  # less what this node trained on, said how many
        unseen = [q for q in judge_q if q.hash not in node.judge_seen]
        return judge(node, unseen, eval_k, eval_seeds) | {"judge_excluded_seen": len(judge_q) - len(unseen)}

    swarm, exchanges, attackers = _wire(nodes, arm, seed)
    attack_rng = random.Random(seed * 7919 + 1)
    history: list[list[dict[str, Any]]] = [[] for _ in nodes]
    cpu = [0.0 for _ in nodes]
    midway: list[dict[str, Any]] = []
    for r in range(1, rounds + 1):
        swarm.clock.now = float(r)
        swarm.flush()  # the barrier: the previous round's groups arrive now
        for k, node in enumerate(nodes):
            c0 = time.process_time()
            result = step(node, exchanges[k])
            cpu[k] += time.process_time() - c0
            history[k].append(_round_record(result, set(attackers)))
        for a, groups in enumerate(attacker_round(attackers, r, train_mix(specialties), judge_q,
                                                  nodes[0].cfg.completions, attack_rng).values()):
            swarm.publish(len(nodes) + a, groups)  # arrive with the honest groups, at the next barrier
        if r % 10 == 0 or r == 1:
            _progress(f"{setting}/{arm}@{seed}", r, rounds, history, t_start)
        if r in (judge_at or ()) and r < rounds:
            midway.append({"round": r, "cpu_seconds": list(cpu),
                           "after": [judged(node) for node in nodes]})
    after = [judged(node) for node in nodes]
    for _, loaded in built:
        loaded.generator.close()
    return {"arm": arm, "setting": setting, "seed": seed, "rounds": rounds, "nodes": len(nodes),
            "config": nodes[0].cfg.to_dict(), "after": after, "cpu_seconds": cpu, "history": history,
            "midway": midway,
            "specialties": [node_specialties(setting, k, specialties) for k in range(len(nodes))],
            "minutes": (time.time() - t_start) / 60, "counters": dict(swarm.counters),
            "peer_loss_share_max": max((h.get("peer_loss_share_max", 0.0) for hist in history for h in hist),
                                       default=0.0),
            "attackers": len(attackers),
            "attacker_loss_share_max": max((h["attacker_loss_share"] for hist in history for h in hist), default=0.0),
            "attacker_groups_trained": sum(h["attacker_groups_trained"] for hist in history for h in hist)}


def main(argv: list[str]) -> int:
    args = json.loads(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(run_swarm_arm(**args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
