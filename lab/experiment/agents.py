"""The agents of one arm: task mixes per setting, paired question draws, and the trainers.

Pairing: every agent's questions and sampling seed in round r are functions of (experiment seed,
agent, round) only. Each round draws the agent's full 8-question list (I + J of the paper) and an
arm with I own questions takes the first I of them, so 8/0, 6/2, 4/4 and 2/6 face the same
questions in the same order and sample with the same seed; only I/J (and what follows) differ.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.models.generate import SampleConfig
from engine.models.policy import load_policy
from engine.sapo.adaptive_j import AdaptiveJConfig
from engine.sapo.config import SapoConfig
from engine.sapo.trainer import Trainer
from engine.tasks.library import TaskMix
from engine.tasks.reference import TaskRef
from lab.experiment.config import ArmConfig

QUESTIONS_DRAWN = 8  # the paper's I + J: drawn every round whatever I is, so arms stay paired
SPECIALTIES_PER_AGENT = 2  # heterogeneous setting: each agent generates from two specialties only


def _round_seed(seed: int, agent: int, round_no: int, stream: str) -> int:
    # A string seed is hashed by random.Random with sha512: stable across processes and hash seeds.
    return random.Random(f"{stream}/{seed}/{agent}/{round_no}").getrandbits(62)


def agent_mixes(mix: TaskMix, setting: str, agents: int) -> list[TaskMix]:
    """Per agent: the full mix (homogeneous) or two of its specialties in rotation (heterogeneous).

    Heterogeneous agent k takes specialties 2k, 2k+1 (mod the mix's count): with 6 specialties,
    agents 0/3/6 share one pair, 1/4/7 the next, 2/5 the third. Weights stay the mix's.
    """
    names = list(mix.specialties)
    if setting == "homogeneous":
        return [mix] * agents
    if setting != "heterogeneous":
        raise ValueError(f"unknown setting {setting!r}")
    if len(names) < SPECIALTIES_PER_AGENT:
        raise ValueError("the heterogeneous setting needs a mix of at least two specialties")
    out = []
    for k in range(agents):
        chosen = [names[(SPECIALTIES_PER_AGENT * k + i) % len(names)] for i in range(SPECIALTIES_PER_AGENT)]
        out.append(TaskMix(f"{mix.name}[{'+'.join(chosen)}]", {s: mix.specialties[s] for s in chosen}))
    return out


class PairedQuestions:
    """A task mix for one agent whose draws depend on (seed, agent, round), never on the trainer's RNG.

    The trainer calls `sample_refs(rng, I, dataset_seed)` once per round; the runner calls
    `start_round(r)` before it. Exposes `name` and `specialties` like a TaskMix.
    """

    def __init__(self, mix: TaskMix, seed: int, agent: int, dataset_seed: int) -> None:
        self.mix, self.seed, self.agent, self.dataset_seed = mix, seed, agent, dataset_seed
        self.name = mix.name
        self.specialties = mix.specialties
        self._refs: list[TaskRef] = []

    def start_round(self, round_no: int) -> list[TaskRef]:
        rng = random.Random(_round_seed(self.seed, self.agent, round_no, "questions"))
        self._refs = self.mix.sample_refs(rng, QUESTIONS_DRAWN, self.dataset_seed)
        return list(self._refs)

    def sample_refs(self, rng: random.Random, n: int, dataset_seed: int) -> list[TaskRef]:
        if dataset_seed != self.dataset_seed:
            raise ValueError("dataset seed differs from the one the paired draws were made for")
        if n > len(self._refs):
            raise ValueError(f"asked for {n} questions; the round drew {len(self._refs)} (start_round first)")
        return self._refs[:n]

    def ref(self, specialty: str, seed: int, index: int) -> TaskRef:
        """The mix's reference for (specialty, seed, index): how the trainer builds its judge set."""
        return self.mix.ref(specialty, seed, index)


def sampling_rng_seed(seed: int, agent: int, round_no: int) -> int:
    """The seed of the trainer's RNG for a round (generation seed, then the J-group draw)."""
    return _round_seed(seed, agent, round_no, "sampling")


@dataclass
class Agent:
    """One agent of the swarm."""

    index: int  # 0..N-1
    trainer: Any  # engine.sapo.trainer.Trainer (own policy, optimizer, RNG)
    questions: PairedQuestions  # its paired draws
    generates: frozenset[str]  # specialties it generates questions for

    def start_round(self, round_no: int) -> None:
        self.questions.start_round(round_no)
        self.trainer.rng.seed(sampling_rng_seed(self.questions.seed, self.index, round_no))


def build_agents(cfg: ArmConfig, model_dir: str, mix: TaskMix, sapo_overrides: dict[str, Any] | None = None,
                 ) -> list[Agent]:
    """N agents, each loading its own copy of the policy from `model_dir`."""
    sapo = sapo_config(cfg, **(sapo_overrides or {}))
    if not isinstance(sapo, SapoConfig):
        raise TypeError("sapo_config must return a SapoConfig")
    agents = []
    for k, agent_mix in enumerate(agent_mixes(mix, cfg.setting, cfg.agents)):
        model, tokenizer = load_policy(model_dir)
        questions = PairedQuestions(agent_mix, cfg.seed, k, sapo.dataset_seed)
        trainer = Trainer(model, tokenizer, sapo, questions, None, None, seed=cfg.seed * 1000 + k,
                          model_id="seed")
        agents.append(Agent(k, trainer, questions, frozenset(agent_mix.specialties)))
    return agents


def sapo_config(cfg: ArmConfig, **overrides: Any) -> Any:
    """The trainer settings of an arm: the paper's update with the arm's I/J/strategy. The loss
    normalisation is `nonzero_tokens` in every arm (the step size does not grow with J)."""
    values: dict[str, Any] = {
        "num_local": cfg.local, "num_external": cfg.external, "completions": cfg.completions, "lr": cfg.lr,
        "loss_norm": "nonzero_tokens", "external_strategy": cfg.strategy, "external_kl_anchor": cfg.kl_anchor,
        "sampling": SampleConfig(max_new_tokens=cfg.max_new_tokens), "eval_every": 0, "checkpoint_every": 0,
        "eval_seed": cfg.eval_seed, "eval_k": cfg.eval_k, "eval_per_specialty": cfg.eval_per_specialty,
        "adaptive_j": AdaptiveJConfig(enabled=cfg.adaptive_j),
        # in-process agents are the experiment's own, not strangers: the paper trains peers' groups at once
        "quarantine_rounds": 0}
    values.update(overrides)
    return SapoConfig(**values)


def judge_specialties(agents: Sequence[Agent]) -> list[str]:
    """Every specialty any agent generates (what the judge set covers)."""
    return sorted(set().union(*(a.generates for a in agents)))
