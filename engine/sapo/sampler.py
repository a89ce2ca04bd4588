"""Building a round's training set: I own groups + J external groups (SAPO §3).

Order of operations (the paper's, made explicit): external groups arrive already re-scored by the
local verifier; the zero-advantage filter drops every group (own or external) whose rewards are all
equal; then the J external groups are drawn from what is left by a pluggable sampling strategy
(uniform, or weighted by each origin's reputation here: engine/sapo/reputation.py). Each dropped group carries a reason, for the store and the GUI's feed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engine.sapo.records import RolloutGroup
from engine.sapo.reputation import ReputationSampler

DROP_ZERO_ADVANTAGE = "zero_advantage"
DROP_NOT_SCORED = "not_rescored"
DROP_NOT_SAMPLED = "not_sampled"
DROP_OTHER_MODEL = "other_model"  # made by another base model: not trained on (SapoConfig.external_same_model)
DROP_SAME_QUESTION = "same_question"  # another peer's group on the same question was drawn this round


class ExternalSampler(Protocol):
    """Chooses up to j groups among eligible external candidates."""

    name: str

    def draw(self, candidates: Sequence[RolloutGroup], j: int, rng: random.Random) -> list[RolloutGroup]: ...


class UniformSampler:
    """j groups uniformly at random without replacement (all of them if fewer are eligible)."""

    name = "uniform"

    def draw(self, candidates: Sequence[RolloutGroup], j: int, rng: random.Random) -> list[RolloutGroup]:
        if j <= 0 or not candidates:
            return []
        return rng.sample(list(candidates), min(j, len(candidates)))


SAMPLERS: dict[str, Callable[[], ExternalSampler]] = {"uniform": UniformSampler, "reputation": ReputationSampler}


def make_sampler(name: str) -> ExternalSampler:
    if name not in SAMPLERS:
        raise ValueError(f"unknown external sampler {name!r}; known: {sorted(SAMPLERS)}")
    return SAMPLERS[name]()


@dataclass(frozen=True)
class Selection:
    """The groups a round trains on, and the ones left out with why."""

    own: list[RolloutGroup]
    external: list[RolloutGroup]
    dropped: list[tuple[RolloutGroup, str]] = field(default_factory=list)


def has_signal(groups: Sequence[RolloutGroup]) -> list[bool]:
    """Per group: True when its (local) rewards are not all equal. Groups must be scored."""
    return [g.has_signal for g in groups]


def per_origin_cap(num_external: int, max_origin_share: float) -> int:
    """External groups one origin peer may place in a round: ceil(J x share), at least 1."""
    return max(1, math.ceil(num_external * max_origin_share - 1e-9))


def select_groups(own: Sequence[RolloutGroup], external: Sequence[RolloutGroup], num_external: int,
                  sampler: ExternalSampler, rng: random.Random,
                  filter_zero_advantage: bool = True, max_origin_share: float = 1.0) -> Selection:
    """Apply the zero-advantage filter to all groups, then draw `num_external` (J) external groups,
    at most `per_origin_cap` of them from one origin (one peer must not fill a round's peer rows) and at
    most one per question (identities sending the same question cannot stack its weight)."""
    dropped: list[tuple[RolloutGroup, str]] = []
    scored_ext = []
    for g in external:
        if g.rewards is None or len(g.rewards) != len(g.completions) or len(g.completions) < 2:
            dropped.append((g, DROP_NOT_SCORED))
        else:
            scored_ext.append(g)
    if any(g.rewards is None for g in own):
        raise ValueError("own groups must be scored before selection")
    kept_own, kept_ext = list(own), scored_ext
    if filter_zero_advantage:
        kept_own, kept_ext = [], []
        for groups, kept in ((own, kept_own), (scored_ext, kept_ext)):
            for g, signal in zip(groups, has_signal(groups)):
                (kept.append(g) if signal else dropped.append((g, DROP_ZERO_ADVANTAGE)))
    cap = per_origin_cap(num_external, max_origin_share)
    chosen: list[RolloutGroup] = []
    taken: dict[str, int] = {}
    questions: set[str] = set()
    same_question: list[RolloutGroup] = []
    for g in sampler.draw(kept_ext, len(kept_ext), rng):  # the sampler's order, then the caps
        origin = g.provenance.origin_peer
        if len(chosen) < num_external and taken.get(origin, 0) < cap:
            if g.question_hash in questions:
                same_question.append(g)
                continue
            chosen.append(g)
            taken[origin] = taken.get(origin, 0) + 1
            questions.add(g.question_hash)
    chosen_ids = {id(g) for g in chosen}
    dropped.extend((g, DROP_SAME_QUESTION) for g in same_question)
    left = {id(g) for g in same_question} | chosen_ids
    dropped.extend((g, DROP_NOT_SAMPLED) for g in kept_ext if id(g) not in left)
    return Selection(own=kept_own, external=chosen, dropped=dropped)
