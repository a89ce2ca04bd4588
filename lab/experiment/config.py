"""Experiment settings: one arm (a swarm of N agents at one I/J split), and presets of many arms.

An *arm* is what one worker process runs: N agents, one setting (homogeneous or heterogeneous), one
I/J split, one external-group strategy, one seed. Arms that differ only in I/J (or strategy) share
the seed and therefore the question draws and sampling seeds (`paired`): see agents.PairedQuestions.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from engine.sapo.checks import check_keys

SETTINGS = ("homogeneous", "heterogeneous")
MODES = ("lockstep", "async")
STRATEGIES = ("plain", "positive-only", "importance-weighted")


def _int(name: str, value: Any, low: int, high: int = 2**31 - 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}")


def _float(name: str, value: Any, low: float, high: float, low_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < low or value > high or (low_open and value == low):
        raise ValueError(f"{name} must be a finite number in {'(' if low_open else '['}{low}, {high}], "
                         f"got {value!r}")


@dataclass(frozen=True)
class ArmConfig:
    """One swarm run: N agents in lock-step (or async) sharing through the real pool and wire records."""

    agents: int = 4  # N: agents, each with its own policy, optimizer, RNG and pool
    local: int = 4  # I: own questions per agent per round
    external: int = 4  # J: peers' groups drawn per round from the agent's pool (non-zero advantage only)
    rounds: int = 100  # rounds every agent runs
    seed: int = 1  # experiment seed: question draws, sampling seeds, agent identities (paired across I/J)
    setting: str = "homogeneous"  # homogeneous: all agents on the full mix; heterogeneous: 2 specialties each
    mode: str = "lockstep"  # lockstep: round r trains on peers' round r-1 groups; async: whatever is there
    strategy: str = "positive-only"  # how external completions enter the loss (engine.sapo.external)
    kl_anchor: float = 0.0  # weight of the KL anchor to the seed on external completions' tokens
    adaptive_j: bool = False  # J chosen each round in {0, J/2, J} by a bandit on own-reward gains
    completions: int = 8  # L: completions per question
    lr: float = 1e-4  # Adam learning rate (pilots: 1e-4 learns, 3e-4 collapses the seed)
    max_new_tokens: int = 32  # completion cap in training and evaluation
    mix: str = "rl"  # task-mix preset all agents draw from (heterogeneous agents: 2 of its specialties)
    eval_every: int = 50  # M: rounds between held-out evaluations (0 and the last round always run)
    eval_per_specialty: int = 24  # judge questions per specialty (fixed set, disjoint from training)
    eval_k: int = 8  # samples per judge question (pass@k)
    eval_seed: int = 424242  # the judge set and its sampling seed: identical for every arm
    pool_max_age: int = 2  # async mode: rounds a group stays eligible in a receiver's pool
    model: str = ""  # model directory ("" = the shipped seed model)

    def __post_init__(self) -> None:
        _int("agents", self.agents, 1, 64)
        _int("local", self.local, 0, 64)
        _int("external", self.external, 0, 64)
        if self.local < 1:
            raise ValueError("local (I) must be >= 1: every agent generates (and publishes) something")
        if self.external and self.agents < 2:
            raise ValueError("external (J) > 0 needs at least 2 agents")
        _int("rounds", self.rounds, 1, 1_000_000)
        _int("seed", self.seed, 0, 2**31 - 1)
        if self.setting not in SETTINGS:
            raise ValueError(f"setting must be one of {SETTINGS}, got {self.setting!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        _float("kl_anchor", self.kl_anchor, 0.0, 100.0)
        if not isinstance(self.adaptive_j, bool) or (self.adaptive_j and not self.external):
            raise ValueError("adaptive_j must be a bool, and needs external (J) > 0")
        _int("completions", self.completions, 2, 16)  # 16: the wire's per-group limit
        _float("lr", self.lr, 0.0, 1.0, low_open=True)
        _int("max_new_tokens", self.max_new_tokens, 1, 4096)
        if not isinstance(self.mix, str) or not self.mix:
            raise ValueError("mix must be a task-mix preset name")
        _int("eval_every", self.eval_every, 0)
        _int("eval_per_specialty", self.eval_per_specialty, 1, 10_000)
        _int("eval_k", self.eval_k, 1, 64)
        _int("eval_seed", self.eval_seed, 0, 2**61)
        _int("pool_max_age", self.pool_max_age, 1, 10_000)
        if not isinstance(self.model, str):
            raise ValueError("model must be a directory path string")  # noqa: TRY004 (ValueError for every bad input)

    @property
    def label(self) -> str:
        """The paper's I/J name plus the strategy, e.g. "4/4 positive-only+kl0.04"."""
        strategy = "" if self.external == 0 else f" {self.strategy}" + (f"+kl{self.kl_anchor:g}" if self.kl_anchor else "")
        return f"{self.local}/{self.external}{strategy}" + ("+adaptive-J" if self.adaptive_j else "")

    @property
    def name(self) -> str:
        """A file-system-safe unique name for the arm's output directory."""
        text = f"{self.setting}_{self.label}_s{self.seed}"
        if self.lr != ArmConfig.lr:
            text += f"_lr{self.lr:g}"
        if self.mode != ArmConfig.mode:
            text += f"_{self.mode}"
        return text.replace("/", "-").replace(" ", "_").replace("+", "_")

    def eval_rounds(self) -> list[int]:
        """Rounds after which the judge set is evaluated: 0 (the seed), every M, and the last."""
        rounds = {0, self.rounds}
        if self.eval_every:
            rounds.update(range(self.eval_every, self.rounds, self.eval_every))
        return sorted(rounds)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> ArmConfig:
        """Validate a stored or command-line config; unknown keys are an error."""
        check_keys(cls, data, "arm config")
        return cls(**data)

    def replace(self, **changes: Any) -> ArmConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Preset:
    """A named list of arms plus how to run them."""

    name: str  # preset name
    description: str  # one line: what it answers and how long it takes here
    arms: tuple[ArmConfig, ...] = field(default_factory=tuple)  # every arm, in run order
    jobs: int = 2  # worker processes at once (single-threaded each)

    def __post_init__(self) -> None:
        if not self.arms:
            raise ValueError("a preset needs at least one arm")
        _int("jobs", self.jobs, 1, 64)
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError("arms of a preset must have distinct names")


PAPER_SPLITS = ((8, 0), (6, 2), (4, 4), (2, 6))  # the paper's I/J configurations (I + J = 8)


def _grid(base: ArmConfig, settings: tuple[str, ...], splits: tuple[tuple[int, int], ...],
          seeds: tuple[int, ...]) -> list[ArmConfig]:
    return [base.replace(setting=s, local=i, external=j, seed=seed)
            for seed in seeds for s in settings for i, j in splits]


def preset(name: str, model: str = "") -> Preset:
    """smoke: a minute, in the test suite. paper-small: the §5 table at small scale (see EXPERIMENT.md).
    strategies: the external-group strategies on one heterogeneous 4/4 swarm."""
    if name == "smoke":
        base = ArmConfig(agents=2, rounds=3, eval_every=0, eval_per_specialty=2, eval_k=2,
                         max_new_tokens=16, completions=4, model=model)
        return Preset("smoke", "2 agents x 3 rounds, 8/0 vs 4/4 in both settings (about a minute)",
                      tuple(_grid(base, SETTINGS, ((8, 0), (4, 4)), (1,))), jobs=1)
    if name == "paper-small":
        base = ArmConfig(agents=4, rounds=100, eval_every=50, model=model)
        seeds = (1, 2, 3)
        # The headline pair (8/0 vs 4/4) first for every seed and setting, then 2/6 and 6/2: a run cut
        # short by its budget still holds complete paired comparisons.
        arms = _grid(base, SETTINGS, ((8, 0), (4, 4)), seeds) + _grid(base, SETTINGS, ((2, 6), (6, 2)), seeds)
        return Preset("paper-small", "4 agents x 100 rounds, 8/0 6/2 4/4 2/6, both settings, seeds 1-3 "
                      "(24 arms; ~60 core-minutes, two workers)", tuple(arms))
    if name == "strategies":
        base = ArmConfig(agents=4, rounds=100, eval_every=50, setting="heterogeneous", model=model)
        arms = []
        for seed in (1, 2, 3):  # 8/0 and 4/4 positive-only are shared with paper-small (same names)
            arms += [base.replace(local=8, external=0, seed=seed)]
            arms += [base.replace(strategy=s, seed=seed) for s in STRATEGIES]
            arms += [base.replace(strategy="positive-only", kl_anchor=0.04, seed=seed)]
        return Preset("strategies", "heterogeneous 4/4: plain vs positive-only vs importance-weighted "
                      "vs positive-only + KL anchor, against 8/0 (seeds 1-3)", tuple(arms))
    if name == "adaptive-j":
        base = ArmConfig(agents=4, rounds=100, eval_every=50, model=model)
        seeds = (1, 2, 3, 4, 5)  # 8/0 and 4/4 of seeds 1-3 are shared with paper-small (same names)
        arms = _grid(base, SETTINGS, ((8, 0), (4, 4)), seeds)
        arms += [base.replace(setting=s, adaptive_j=True, seed=seed) for seed in seeds for s in SETTINGS]
        return Preset("adaptive-j", "4/4 with J chosen by the bandit vs fixed 4/4 and 8/0, both settings, "
                      "seeds 1-5 (30 arms, 18 new after paper-small)", tuple(arms))
    if name == "tuning":
        base = ArmConfig(agents=4, rounds=150, eval_every=50, seed=0, local=8, external=0, model=model)
        arms = [base.replace(lr=lr) for lr in (1e-4, 3e-4, 1e-3)]
        return Preset("tuning", "the tuning seed (0, never reported as a result): solo 8/0 at lr 1e-4, "
                      "3e-4, 1e-3", tuple(arms), jobs=3)
    raise ValueError(f"unknown experiment preset {name!r}; known: {', '.join(PRESET_NAMES)}")


PRESET_NAMES = ("smoke", "paper-small", "strategies", "adaptive-j", "tuning")
