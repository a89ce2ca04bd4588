"""Running one arm: N agents, interleaved in one single-threaded process, through the in-memory swarm.

Outputs, in the arm's directory: rounds.csv (one row per agent and round: measures (a), (b) and the
update controls), evals.csv (one row per agent, eval round and specialty), arm.json (config,
totals, swarm counters, timing; written last, so its presence means the arm finished).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine.evaluation import evaluate
from engine.sapo.step import PoolExchange, step
from engine.tasks.library import heldout
from engine.tasks.library import preset as mix_preset
from lab.experiment import measures
from lab.experiment.agents import Agent, build_agents
from lab.experiment.config import ArmConfig
from lab.experiment.transport import InMemorySwarm, agent_identity

ROUND_FIELDS = ("setting", "label", "local", "external", "strategy", "kl_anchor", "seed", "agent", "round",
                "policy_version", "updated", "own_groups", "own_mixed", "ext_candidates", "ext_used",
                "groups_trained", "reward_trained", "reward_generated", "rows_trained", "loss", "kl", "seconds")
EVAL_FIELDS = ("setting", "label", "seed", "agent", "round", "specialty", "generated", "n_questions", "pass1",
               "passk", "malformed_rate")
LOCKSTEP_MAX_AGE = 0.5  # rounds: in lock-step a receiver sees exactly the groups delivered at this barrier


def _write_csv(path: Path, fields: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields))
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def json_safe(value: Any) -> Any:
    """NaN/inf -> None, recursively: the files stay strict JSON (a split with no specialty is null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(json_safe(data), indent=1, sort_keys=True, allow_nan=False))
    os.replace(tmp, path)


def _eval_report(agent: Agent, questions: list[Any], cfg: ArmConfig) -> dict[str, dict[str, float]]:
    t = agent.trainer
    report = evaluate(t.model, t.tokenizer, questions, k=cfg.eval_k, sample_cfg=t.eval_sample_config(),
                      prompt_style=t.cfg.prompt_style, seed=cfg.eval_seed)
    return {name: asdict(s) for name, s in report.per_specialty.items()}


def _seed_eval(agent: Agent, questions: list[Any], cfg: ArmConfig, model_dir: str, cache_dir: Path,
               ) -> dict[str, dict[str, float]]:
    """Round 0: every agent starts from the same weights, so the seed is evaluated once and cached
    (per model file and judge settings) for every arm and agent."""
    weights = Path(model_dir) / "model.safetensors"
    digest = hashlib.sha256(weights.read_bytes() if weights.is_file() else model_dir.encode()).hexdigest()[:16]
    key = f"seed_eval_{digest}_{cfg.mix}_{cfg.eval_per_specialty}_{cfg.eval_k}_{cfg.eval_seed}_{cfg.max_new_tokens}.json"
    path = cache_dir / key
    if path.is_file():
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            return data
    report = _eval_report(agent, questions, cfg)
    cache_dir.mkdir(parents=True, exist_ok=True)
    _write_json(path, report)
    return report


def run_arm(cfg: ArmConfig, out_dir: Path, model_dir: str, *, cache_dir: Path | None = None,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run one arm to completion and write its files under out_dir/<arm name>/ -> arm.json's content."""
    arm_dir = out_dir / cfg.name
    arm_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    mix = mix_preset(cfg.mix)
    agents = build_agents(cfg, model_dir, mix)
    tokens = max(a.trainer.cfg.sampling.max_new_tokens for a in agents)
    swarm = InMemorySwarm([agent_identity(cfg.seed, a.index) for a in agents], tokens,
                          LOCKSTEP_MAX_AGE if cfg.mode == "lockstep" else float(cfg.pool_max_age),
                          lockstep=cfg.mode == "lockstep")
    judge = heldout(mix, cfg.eval_per_specialty, cfg.eval_seed)
    eval_rounds = set(cfg.eval_rounds())
    rounds: list[dict[str, Any]] = []
    seed_report = _seed_eval(agents[0], judge, cfg, model_dir, cache_dir or out_dir)
    evals = _eval_rows(cfg, agents, 0, [seed_report] * len(agents))
    order_rng = random.Random(f"order/{cfg.seed}")
    for round_no in range(1, cfg.rounds + 1):
        swarm.clock.now = float(round_no)
        if cfg.mode == "lockstep":
            swarm.flush()  # the barrier: peers' round r-1 groups arrive now
        order = list(agents)
        if cfg.mode == "async":
            order_rng.shuffle(order)  # nobody is always first to see (or last to publish) a round
        rounds += [_agent_round(cfg, agent, round_no, swarm) for agent in order]
        if round_no in eval_rounds:
            evals += _eval_rows(cfg, agents, round_no, [_eval_report(a, judge, cfg) for a in agents])
        if progress is not None and (round_no % 10 == 0 or round_no == cfg.rounds):
            progress(f"{cfg.name}: round {round_no}/{cfg.rounds} ({time.time() - start:.0f}s)")
        if round_no % 20 == 0 or round_no in eval_rounds:  # partial results survive a killed worker
            _write_csv(arm_dir / "rounds.csv", ROUND_FIELDS, rounds)
            _write_csv(arm_dir / "evals.csv", EVAL_FIELDS, evals)
    _write_csv(arm_dir / "rounds.csv", ROUND_FIELDS, rounds)
    _write_csv(arm_dir / "evals.csv", EVAL_FIELDS, evals)
    summary = arm_summary(cfg, rounds, evals)
    summary.update(config=cfg.to_dict(), model_dir=str(model_dir), seconds=round(time.time() - start, 1),
                   swarm=dict(sorted(swarm.counters.items())),
                   generates={str(a.index): sorted(a.generates) for a in agents})
    _write_json(arm_dir / "arm.json", summary)
    return summary


def _agent_round(cfg: ArmConfig, agent: Agent, round_no: int, swarm: InMemorySwarm) -> dict[str, Any]:
    """One agent's round step through its own pool in the swarm -> its rounds.csv row."""
    t0 = time.perf_counter()
    agent.start_round(round_no)
    # nobody reads a solo swarm's groups: it publishes nothing (skips the re-scoring work)
    publish = functools.partial(swarm.publish, agent.index) if cfg.external else None
    exchange = PoolExchange(swarm.pools[agent.index], publish)
    result = step(agent.trainer, exchange)
    own = [list(g.rewards or ()) for g in result.local_groups]
    used = [list(v.group.rewards or ()) for v in result.used_external]
    reward_a, groups_trained = measures.trained_on_reward(own, used)
    m = result.metrics
    return {"setting": cfg.setting, "label": cfg.label, "local": cfg.local, "external": cfg.external,
            "strategy": cfg.strategy, "kl_anchor": cfg.kl_anchor, "seed": cfg.seed, "agent": agent.index,
            "round": round_no, "policy_version": result.policy_version,
            "updated": int(m.get("rows_trained", 0.0) > 0),
            "own_groups": len(own), "own_mixed": sum(measures.has_signal(g) for g in own),
            "ext_candidates": exchange.offered, "ext_used": len(used),
            "groups_trained": groups_trained, "reward_trained": round(reward_a, 6),
            "reward_generated": round(measures.generated_reward(own), 6),
            "rows_trained": int(m.get("rows_trained", 0.0)), "loss": round(m.get("loss", 0.0), 6),
            "kl": round(m.get("kl", 0.0), 6), "seconds": round(time.perf_counter() - t0, 3)}


def _eval_rows(cfg: ArmConfig, agents: list[Agent], round_no: int,
               reports: list[dict[str, dict[str, float]]]) -> list[dict[str, Any]]:
    """evals.csv's rows of one eval round: each agent's result per specialty."""
    covered = set().union(*(a.generates for a in agents))
    rows = []
    for agent, per in zip(agents, reports):
        for name, s in sorted(per.items()):
            # 1: the agent generates it; 0: only peers do; -1: nobody in this swarm does.
            flag = 1 if name in agent.generates else (0 if name in covered else -1)
            rows.append({"setting": cfg.setting, "label": cfg.label, "seed": cfg.seed, "agent": agent.index,
                         "round": round_no, "specialty": name, "generated": flag, "n_questions": s["n_questions"],
                         "pass1": s["pass1"], "passk": s["passk"], "malformed_rate": s["malformed_rate"]})
    return rows


def arm_summary(cfg: ArmConfig, rounds: Sequence[dict[str, Any]], evals: Sequence[dict[str, Any]],
                ) -> dict[str, Any]:
    """Totals of one arm: cumulative (a) and (b), update controls, judge-set results per eval round."""
    per_round_a = measures.agent_average(rounds, "reward_trained", cfg.rounds)
    per_round_b = measures.agent_average(rounds, "reward_generated", cfg.rounds)
    updates = [r for r in rounds if int(r["updated"])]
    out: dict[str, Any] = {
        "cum_trained": measures.cumulative(per_round_a),  # (a): sum over rounds of the agent-average
        "cum_generated": measures.cumulative(per_round_b),  # (b)
        "cum_trained_all_agents": measures.cumulative(float(r["reward_trained"]) for r in rounds),
        "cum_generated_all_agents": measures.cumulative(float(r["reward_generated"]) for r in rounds),
        "updates_per_agent": len(updates) / max(cfg.agents, 1),
        "groups_per_update": measures.mean_or([float(r["groups_trained"]) for r in updates]),
        "external_per_update": measures.mean_or([float(r["ext_used"]) for r in updates]),
        "s_per_agent_round": measures.mean_or([float(r["seconds"]) for r in rounds]),
    }
    by_round: dict[int, dict[int, dict[str, dict[str, float]]]] = {}
    for e in evals:
        by_round.setdefault(int(e["round"]), {}).setdefault(int(e["agent"]), {})[str(e["specialty"])] = {
            k: float(e[k]) for k in ("n_questions", "pass1", "passk", "malformed_rate")} | {
            "generated": float(e["generated"])}
    out["evals"] = {}
    for round_no, per_agent in sorted(by_round.items()):
        splits = [measures.split_pass(per, [s for s, v in per.items() if v["generated"] == 1],
                                      [s for s, v in per.items() if v["generated"] == 0])
                  for per in per_agent.values()]
        out["evals"][str(round_no)] = {key: measures.mean_or([s[key] for s in splits if not math.isnan(s[key])],
                                                             float("nan"))
                                       for key in splits[0]}
    return out
