"""One arm of `sapo bench real-learning`, run in its own process (one core each, arms side by side).

  solo    the real model alone: I own questions per round, J = 0.
  mixed   the real model beside seed-model peers in one process, sharing text through real
          RolloutPools (regenerate, hash check, local re-score) with the default external strategy;
          every agent publishes its groups to every other agent's pool each round.

Both arms start from the same weights, train the same number of rounds with the same seeds, and are
judged before and after on the same fixed held-out set with the same sampling seeds.
`python -m lab.bench.real_arm ARGS_JSON OUT_JSON` runs one; `run_arm` is the function.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from engine.evaluation import evaluate
from engine.models.backends import load_for_node
from engine.models.policy import load_policy
from engine.node.peer_groups import make_pool
from engine.paths import SEED_MODEL_DIR
from engine.sapo.config import SapoConfig, preset
from engine.sapo.step import PoolExchange, step
from engine.sapo.trainer import Trainer
from engine.swarm.config import PoolConfig
from engine.tasks.curriculum import entry_settings
from engine.tasks.library import SpecialtySpec, TaskMix, heldout
from engine.tasks.library import preset as mix_preset

SOLVED = 1.0 - 1e-6


def judge_mix(specialties: list[str]) -> Any:
    """The curriculum's entry rung of each specialty: the judge set's settings."""
    return TaskMix("rung0", {s: SpecialtySpec(1.0, entry_settings(s)) for s in specialties})


def train_mix(specialties: list[str]) -> Any:
    rl = mix_preset("rl")
    return TaskMix("real", {s: rl.specialties.get(s, SpecialtySpec(1.0, {})) for s in specialties})


def judge(trainer: Any, questions: list[Any], k: int, seeds: list[int]) -> dict[str, Any]:
    """pass@1, pass@k, format rate and accuracy among well-formatted answers, per sampling seed, then
    mean and sd over the seeds (the judge's own noise)."""
    runs: list[dict[str, Any]] = []
    for s in seeds:
        report = evaluate(trainer.model, trainer.tokenizer, questions, k=k, sample_cfg=trainer.eval_sample_config(),
                          prompt_style=trainer.cfg.prompt_style, seed=s, prompt=trainer.prompt,
                          generator=trainer.generator, policy_version=trainer.policy_version)
        formatted = 1.0 - report.overall.malformed_rate
        per = {n: st.pass1 for n, st in report.per_specialty.items()}
        runs.append({"pass_at_1": report.pass1, "pass_at_k": report.passk, "format_rate": formatted,
                     "accuracy_formatted": report.pass1 / formatted if formatted > 0 else 0.0,
                     "mixed_fraction": report.overall.mixed_fraction, "seconds": report.seconds,
                     "per_specialty_pass_at_1": per, "solved": list(report.solved)})
    out: dict[str, Any] = {"k": k, "questions": len(questions), "repeats": runs}
    for key in ("pass_at_1", "pass_at_k", "format_rate", "accuracy_formatted", "mixed_fraction"):
        values = [r[key] for r in runs]
        out[key] = statistics.fmean(values)
        out[key + "_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
    out["per_specialty_pass_at_1"] = {n: statistics.fmean(r["per_specialty_pass_at_1"][n] for r in runs)
                                      for n in runs[0]["per_specialty_pass_at_1"]}
    return out


def _seed_peers(n: int, specialties: list[str], seed: int, cfg: Any) -> list[Any]:
    peers = []
    seed_cfg = preset("cpu-small").replace(num_local=cfg.num_local, num_external=cfg.num_external, beta=0.0,
                                           eval_every=0, checkpoint_every=0, external_same_model=False)
    for k in range(n):
        model, tok = load_policy(SEED_MODEL_DIR)
        peers.append(Trainer(model, tok, seed_cfg, train_mix(specialties), None, None, seed=seed * 100 + k + 1,
                             model_id="seed"))
    return peers


def _real_node(arm: str, model: str, data_dir: str, specialties: list[str], seed: int,
               overrides: dict[str, Any], external: int) -> tuple[Any, Any]:
    """The real model as a node (llama.cpp on the CPU, the cpu-real recipe) -> (loaded model, trainer)."""
    loaded = load_for_node(model, "llamacpp", "cpu", Path(data_dir))
    cfg = SapoConfig.from_dict(preset("cpu-real").to_dict() | {
        "prompt_style": loaded.prompt_style or "chat-fewshot", "prompt_shots": loaded.prompt_shots or 1,
        "num_external": external if arm == "mixed" else 0, "eval_every": 0, "eval_every_s": 0.0,
        "external_same_model": False}  # the mixed arm measures another model's answers in the loss
        | overrides)  # the judge is ours
    trainer = Trainer(loaded.model, loaded.tokenizer, cfg, train_mix(specialties), None, None, seed=seed,
                      model_id=loaded.model_id, generator=loaded.generator)
    return loaded, trainer


def run_arm(arm: str, model: str, data_dir: str, threads: int, rounds: int, specialties: list[str],
            judge_per_specialty: int, rl_per_specialty: int, eval_k: int, eval_seeds: list[int],
            seed: int, overrides: dict[str, Any], seed_peers: int, external: int,
            before: dict[str, Any] | None = None) -> dict[str, Any]:
    """`before`: the judgement of the starting weights when another process made it (every arm starts
    from the same weights and is judged with the same questions and sampling seeds); rounds = 0
    judges only."""
    torch.set_num_threads(threads)  # after the imports: a module setting threads at import doubles them
    t_start = time.time()
    loaded, trainer = _real_node(arm, model, data_dir, specialties, seed, overrides, external)
    cfg = trainer.cfg
    judge_q = heldout(judge_mix(specialties), judge_per_specialty, cfg.eval_seed)
    rl_q = heldout(mix_preset("rl"), rl_per_specialty, cfg.eval_seed)
    print(f"[{arm}] loaded {loaded.label} in {time.time() - t_start:.0f} s; judging {len(judge_q)} questions",
          flush=True)
    if before is None:
        before = {"judge": judge(trainer, judge_q, eval_k, eval_seeds),
                  "rl": judge(trainer, rl_q, eval_k, eval_seeds[:1])}
    if rounds == 0:
        loaded.generator.close()
        return {"arm": arm, "before": before}
    print(f"[{arm}] before: pass@1 {before['judge']['pass_at_1']:.3f} format {before['judge']['format_rate']:.3f}",
          flush=True)

    peers = _seed_peers(seed_peers, specialties, seed, cfg) if arm == "mixed" else []
    t_train = time.time()
    history = _train(arm, [trainer, *peers], rounds)
    train_minutes = (time.time() - t_train) / 60
    after = {"judge": judge(trainer, judge_q, eval_k, eval_seeds), "rl": judge(trainer, rl_q, eval_k, eval_seeds[:1])}
    print(f"[{arm}] after: pass@1 {after['judge']['pass_at_1']:.3f} format {after['judge']['format_rate']:.3f}",
          flush=True)
    loaded.generator.close()
    return {"arm": arm, "model": loaded.model_id, "backend": loaded.label, "config": cfg.to_dict(),
            "before": before, "after": after, "history": history, "rounds": rounds,
            "train_minutes": train_minutes, "minutes": (time.time() - t_start) / 60,
            "seed_peers": len(peers), "threads": threads}


def _train(arm: str, agents: list[Any], rounds: int) -> list[dict[str, Any]]:
    """`rounds` round steps of every agent, each agent's groups offered to every other's pool after the
    round (a barrier) -> the first agent's (the real model's) history."""
    trainer = agents[0]
    pools = [make_pool(PoolConfig(), a.cfg.sampling.max_new_tokens, a.cfg.partial_credit, trainer.mix)
             for a in agents]
    outbox: list[tuple[int, Any]] = []  # published this round, offered to the others after it (a barrier)

    def publisher(i: int) -> Any:
        return lambda groups: outbox.extend((i, g) for g in groups)

    exchanges = [PoolExchange(pools[i], publisher(i)) for i in range(len(agents))]
    history: list[dict[str, Any]] = []
    t_train = time.time()
    for r in range(rounds):
        results = [step(agent, exchanges[i]) for i, agent in enumerate(agents)]
        for i, group in outbox:  # every other agent's pool receives this one's groups
            origin = f"agent{i}"
            for j, pool in enumerate(pools):
                if j != i:
                    pool.offer(_from(group, origin), origin)
        outbox.clear()
        m = results[0].metrics
        history.append({"round": r + 1, "reward": m.get("reward_mean", 0.0), "format_rate": m.get("format_rate", 0.0),
                        "format_weight": m.get("format_weight", 0.0),
                        "mixed_fraction": 1.0 - m.get("frac_reward_zero_std", 1.0),
                        "groups_trained": m.get("groups_trained", 0.0), "external_used": len(results[0].used_external),
                        "seconds": results[0].phase_seconds["total"], "rungs": dict(trainer.curriculum.rungs)})
        if (r + 1) % 10 == 0 or r == 0:
            recent = history[-10:]
            print(f"[{arm}] round {r + 1}: reward {statistics.fmean(h['reward'] for h in recent):.3f} format "
                  f"{statistics.fmean(h['format_rate'] for h in recent):.2f} mixed "
                  f"{statistics.fmean(h['mixed_fraction'] for h in recent):.2f} rungs {trainer.curriculum.rungs} "
                  f"({time.time() - t_train:.0f} s)", flush=True)
    return history


def _from(group: Any, origin: str) -> Any:
    return replace(group, provenance=replace(group.provenance, origin_peer=origin), rewards=None)


def main(argv: list[str]) -> int:
    args = json.loads(Path(argv[0]).read_text())
    result = run_arm(**args)
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
