"""Task mix, question regeneration, prompts, answer extraction and the verifier-as-reward.

`regenerate(ref)` rebuilds the exact ReasoningGym item anywhere; `verify(ref, hash)` is what a node
runs on a peer's group before trusting it; `score` is RG's own scorer on the extracted answer.
"""

from __future__ import annotations

import contextlib
import io
import math
import random
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from engine.tasks.curriculum import is_rung
from engine.tasks.reference import (
    MAX_INDEX,
    MAX_SEED,
    TaskRef,
    TaskRefError,
    _check_json_value,
    question_hash,
)
from engine.tasks.specialties import ANSWER_CLOSE, ANSWER_OPEN, SAFE_SCORERS, SPECIALTIES, compact_pair

# Held-out judge sets live in their own dataset-seed space, disjoint from every training draw.
HELDOUT_SEED_BASE = 1 << 62
# Few-shot demonstrations come from one reserved dataset seed, below held-out space and above training.
DEMO_SEED = HELDOUT_SEED_BASE - 1
MAX_COMPLETION_CHARS = 8192  # the wire limit on a completion; longer text is malformed
MAX_ANSWER_CHARS = 1024  # keeps RG's parsers (propositional logic, Decimal, int) cheap on hostile input
PROMPT_STYLES = ("compact", "chat-text")

# bf prints a dot per generated item and redirect_stdout is process-global: serialise generation.
_GEN_LOCK = threading.Lock()


@dataclass(frozen=True)
class Question:
    """One regenerated ReasoningGym item."""

    ref: TaskRef
    text: str  # ReasoningGym's question text; question_hash(text) travels on the wire
    answer: str | None  # ground truth as RG gives it (None for propositional_logic)
    entry: dict[str, Any] = field(compare=False, hash=False, repr=False)  # RG entry, what its scorer needs

    @property
    def hash(self) -> str:
        return question_hash(self.text)

    @property
    def specialty(self) -> str:
        return self.ref.specialty


@dataclass(frozen=True)
class SpecialtySpec:
    weight: float  # relative sampling weight within the mix (> 0)
    config: dict[str, Any] = field(default_factory=dict)  # RG generator settings (no seed/size)

    def __post_init__(self) -> None:
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)):
            raise ValueError("weight must be a number")  # noqa: TRY004 - config errors are ValueErrors
        if not math.isfinite(self.weight) or self.weight <= 0:
            raise ValueError(f"weight must be finite and > 0, got {self.weight}")
        if not isinstance(self.config, dict):
            raise ValueError("config must be a dict")  # noqa: TRY004 - config errors are ValueErrors
        if "seed" in self.config or "size" in self.config:
            raise ValueError("config must not set seed or size (the task reference carries them)")
        try:
            _check_json_value(self.config)
        except TaskRefError as exc:
            raise ValueError(f"config is not plain JSON: {exc}") from exc


@dataclass(frozen=True)
class TaskMix:
    """Weights and per-specialty generator settings."""

    name: str  # preset name or a user label
    specialties: dict[str, SpecialtySpec]  # specialty -> spec; at least one

    def __post_init__(self) -> None:
        if not self.specialties:
            raise ValueError("a task mix needs at least one specialty")
        for name, spec in self.specialties.items():
            if name not in SPECIALTIES:
                raise ValueError(f"unknown specialty {name!r}; known: {', '.join(SPECIALTIES)}")
            if not isinstance(spec, SpecialtySpec):
                raise ValueError(f"{name}: expected a SpecialtySpec")  # noqa: TRY004

    def ref(self, specialty: str, dataset_seed: int, index: int) -> TaskRef:
        return TaskRef(specialty, dict(self.specialties[specialty].config), dataset_seed, index)

    def sample_refs(self, rng: random.Random, n: int, dataset_seed: int) -> list[TaskRef]:
        """n references, one per sampled specialty: distinct specialties while n <= the number of
        specialties (as in the paper), weighted; deterministic given the rng state."""
        if n < 0:
            raise ValueError("n must be >= 0")
        if not 0 <= dataset_seed < DEMO_SEED:
            raise ValueError("training dataset seeds must lie in [0, 2**62 - 1): 2**62 - 1 holds the prompts' "
                             "demonstrations, above is held-out space")
        names = list(self.specialties)
        chosen: list[str] = []
        while len(chosen) < n:
            pool = list(names)  # one weighted pass without replacement per len(names) questions
            while pool and len(chosen) < n:
                weights = [self.specialties[s].weight for s in pool]
                pick = rng.choices(range(len(pool)), weights=weights)[0]
                chosen.append(pool.pop(pick))
        return [self.ref(s, dataset_seed, rng.randrange(MAX_INDEX + 1)) for s in chosen]


_SEED_EASY: dict[str, dict[str, Any]] = {
    "base_conversion": {"min_base": 2, "max_base": 10, "min_value": 1, "max_value": 40},  # RG renders 0 as ""
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    "arc_1d": {"min_size": 8, "max_size": 8},
    "bf": {"difficulty": 1},
    "propositional_logic": {"min_vars": 2, "max_vars": 2, "min_statements": 2, "max_statements": 2,
                            "min_complexity": 1, "max_complexity": 1},
    "fraction_simplification": {"min_value": 1, "max_value": 20, "min_factor": 1, "max_factor": 5},
    "decimal_arithmetic": {"min_num_decimal_places": 1, "max_num_decimal_places": 1,
                           "min_terms": 2, "max_terms": 2},
    "calendar_arithmetic": {"tasks": ["weekday_offset", "is_leap_year"]},
    "binary_matrix": {"min_n": 2, "max_n": 3},
}

# `rl`: seed-easy without what a constant or generic answer satisfies. propositional_logic gives
# 1.0 to any valid non-trivial conclusion (e.g. the conjunction of the premises) and 0.25 to
# tautologies; calendar's is_leap_year is ~76% "No". bf and arc_1d stay out: the seed cannot sample
# them at all (no RL signal). binary_matrix keeps only n=3 (n=2 is solved).
_RL_EXCLUDED = ("propositional_logic", "bf", "arc_1d")
_RL_OVERRIDES: dict[str, dict[str, Any]] = {
    "calendar_arithmetic": {"tasks": ["weekday_offset"]},
    "binary_matrix": {"min_n": 3, "max_n": 3},
}


def preset(name: str) -> TaskMix:
    """"paper" (RG defaults, all nine), "seed-easy" (what the seed model trains on), "rl"."""
    if name == "paper":
        return TaskMix("paper", {s: SpecialtySpec(1.0, {}) for s in SPECIALTIES})
    if name == "seed-easy":
        return TaskMix("seed-easy", {s: SpecialtySpec(1.0, dict(c)) for s, c in _SEED_EASY.items()})
    if name == "rl":
        specs = {s: SpecialtySpec(1.0, dict(_RL_OVERRIDES.get(s, c)))
                 for s, c in _SEED_EASY.items() if s not in _RL_EXCLUDED}
        return TaskMix("rl", specs)
    raise ValueError(f"unknown task-mix preset {name!r}; known: paper, seed-easy, rl")


PRESETS = ("paper", "seed-easy", "rl")


@lru_cache(maxsize=256)
def _dataset(specialty: str, config_json: str, seed: int) -> Any:
    import json

    import reasoning_gym

    config = json.loads(config_json)
    with _GEN_LOCK, contextlib.redirect_stdout(io.StringIO()):
        # Items depend on (seed, index) only, so one dataset object of maximal size serves all indices.
        return reasoning_gym.create_dataset(specialty, seed=seed, size=MAX_INDEX + 1, **config)


def regenerate(ref: TaskRef) -> Question:
    """The exact question and ground truth for a reference; TaskRefError when it can't be built."""
    if ref.specialty not in SPECIALTIES:
        raise TaskRefError(f"unknown specialty {ref.specialty!r}")
    if not 0 <= ref.seed <= MAX_SEED or not 0 <= ref.index <= MAX_INDEX:
        raise TaskRefError("seed or index out of range")
    try:
        ds = _dataset(ref.specialty, ref.config_json, ref.seed)
        with _GEN_LOCK, contextlib.redirect_stdout(io.StringIO()):
            entry = ds[ref.index]
    except (TypeError, ValueError, KeyError, AssertionError, IndexError, ZeroDivisionError) as exc:
        # RG validates its configs with asserts and TypeErrors for unknown keys.
        raise TaskRefError(f"cannot generate {ref.specialty} with config {ref.config_json}: {exc}") from exc
    return Question(ref=ref, text=str(entry["question"]), answer=entry["answer"], entry=entry)


def _known_config(ref: TaskRef, mix: TaskMix | None) -> bool:
    """A peer's generator settings are only run when a preset, a curriculum rung (a finite published
    set) or the node's own mix uses them: arbitrary settings could ask RG for million-digit numbers
    (a cheap denial of service)."""
    if is_rung(ref.specialty, ref.config):
        return True
    mixes = [preset(name) for name in PRESETS] + ([mix] if mix is not None else [])
    return any(ref.specialty in m.specialties and m.specialties[ref.specialty].config == ref.config
               for m in mixes)


def verify(ref: TaskRef, qhash: str, mix: TaskMix | None = None) -> Question | None:
    """Regenerate and check the question hash; None when the hash differs or the ref is bad.
    Only settings of a preset or of `mix` (the node's own) are accepted."""
    if not isinstance(ref, TaskRef) or not _known_config(ref, mix):
        return None
    try:
        question = regenerate(ref)
    except TaskRefError:
        return None
    return question if isinstance(qhash, str) and question.hash == qhash else None


def render_prompt(question: Question, style: str) -> str:
    """"compact": the seed model's own short prompt (ends with a newline; completion follows).
    "chat-text": RG's question text + answer-format instruction, to put in a chat template."""
    if style == "compact":
        return compact_pair(question.specialty, question.entry)[0] + "\n"
    if style == "chat-text":
        return (f"{question.text.strip()}\n\nThink briefly, then give your final answer inside "
                f"{ANSWER_OPEN}{ANSWER_CLOSE} tags, e.g. {ANSWER_OPEN}42{ANSWER_CLOSE}.")
    raise ValueError(f"unknown prompt style {style!r}; known: {', '.join(PROMPT_STYLES)}")


def demonstration(question: Question) -> str:
    """The compact-style target completion the seed model is trained on."""
    return compact_pair(question.specialty, question.entry)[1]


def extract_answer(completion: str) -> str | None:
    """Text inside the one <answer>...</answer> block, stripped; None when malformed.

    Exactly one opening and one closing tag, in that order: a completion with two answers (a wrong
    one, then a right one) cannot be told apart from guessing, so it earns nothing. Linear time in
    the completion (str.count / str.find): a regex with a lazy group was quadratic on repeated open
    tags, ~1 CPU-second per hostile group."""
    if not isinstance(completion, str) or len(completion) > MAX_COMPLETION_CHARS:
        return None
    if completion.count(ANSWER_OPEN) != 1 or completion.count(ANSWER_CLOSE) != 1:
        return None
    start = completion.find(ANSWER_OPEN) + len(ANSWER_OPEN)
    end = completion.find(ANSWER_CLOSE, start)
    if end < 0:
        return None
    answer = completion[start:end].strip()
    return answer if len(answer) <= MAX_ANSWER_CHARS else None


def rg_score(question: Question, answer: str) -> float:
    """RG's scorer (or our safe replacement) on an extracted answer, clamped to [0, 1]."""
    safe = SAFE_SCORERS.get(question.specialty)
    entry = question.entry
    if safe is not None:
        value = safe(answer, entry)
    else:
        ds = _dataset(question.specialty, question.ref.config_json, question.ref.seed)
        if question.specialty == "propositional_logic":
            entry = {**entry, "answer": entry["metadata"].get("example_answer")}
        try:
            value = float(ds.score_answer(answer, entry))
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, ArithmeticError,
                RecursionError):
            return 0.0  # RG parsers raise on garbage; garbage earns nothing
    return min(1.0, max(0.0, value)) if math.isfinite(value) else 0.0


def score(question: Question, completion: str, *, partial_credit: bool = False) -> float:
    """Verifier reward: 0.0 when malformed; RG score if partial_credit, else 1.0 iff RG score >= 1."""
    answer = extract_answer(completion)
    if answer is None:
        return 0.0
    value = rg_score(question, answer)
    return value if partial_credit else (1.0 if value >= 1.0 else 0.0)


def format_reward(completion: str) -> float:
    """1.0 when the completion has a well-formed answer block, else 0.0 (off by default: the paper
    removed it; see RewardConfig)."""
    return 1.0 if extract_answer(completion) is not None else 0.0


@dataclass(frozen=True)
class RewardConfig:
    partial_credit: bool = False  # use RG's partial credit instead of the 1/0 solve reward
    format_weight: float = 0.0  # weight of format_reward added to the verifier reward (paper: 0)

    def __post_init__(self) -> None:
        if not math.isfinite(self.format_weight) or not 0.0 <= self.format_weight <= 1.0:
            raise ValueError("format_weight must be in [0, 1]")


def format_weight_at(round_no: int, initial: float, decay_rounds: int) -> float:
    """The format reward's weight in round `round_no` (1-based): `initial` in round 1, falling linearly
    over `decay_rounds` rounds to 0 from round decay_rounds + 1 on (the paper dropped its format reward
    once the format had spread)."""
    if initial <= 0 or decay_rounds <= 0:
        return 0.0
    return initial * max(0.0, 1.0 - max(round_no - 1, 0) / decay_rounds)


def reward(question: Question, completion: str, cfg: RewardConfig = RewardConfig()) -> float:
    """The RL reward: verifier score (+ optional format bonus)."""
    value = score(question, completion, partial_credit=cfg.partial_credit)
    if cfg.format_weight:
        value += cfg.format_weight * format_reward(completion)
    return value


def is_heldout(ref: TaskRef) -> bool:
    """The reference names a question of the held-out seed space (some node's judge, Try it, demos)."""
    return isinstance(ref, TaskRef) and ref.seed >= HELDOUT_SEED_BASE


def heldout(mix: TaskMix, n_per_specialty: int, seed: int) -> list[Question]:
    """A fixed judge set: n questions per specialty from the held-out seed space (disjoint from
    training draws), ordered by specialty then index."""
    if n_per_specialty < 0 or not 0 <= seed < HELDOUT_SEED_BASE:
        raise ValueError("bad held-out size or seed")
    out: list[Question] = []
    for specialty in mix.specialties:
        for index in range(n_per_specialty):
            out.append(regenerate(mix.ref(specialty, HELDOUT_SEED_BASE + seed, index)))
    return out
