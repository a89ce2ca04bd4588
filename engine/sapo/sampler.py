"""Building a round's training set: I own groups + J external groups (SAPO §3).

Order of operations (the paper's, made explicit): external groups arrive already re-scored by the
local verifier; the zero-advantage filter drops every group (own or external) whose rewards are all
equal; then the J external groups are drawn from what is left by a pluggable sampling strategy
(uniform, or weighted by each origin's reputation here: engine/sapo/reputation.py). Each peer's group
left out carries a reason, for the store and the GUI's feed.

A peer's group is a `Drawable` here: its view as this round would train on it, under its candidate's
key, so what is drawn and what is left out are named by key, never by object. Own groups never left
this node and have no candidate key: the round names them by their index among its own groups.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engine.sapo.records import CandidateKey, RolloutGroup
from engine.sapo.reputation import Reputation

DROP_ZERO_ADVANTAGE = "zero_advantage"
DROP_NOT_SCORED = "not_rescored"
DROP_NOT_SAMPLED = "not_sampled"
DROP_OTHER_MODEL = "other_model"  # made by another base model: not trained on (SapoConfig.external_same_model)
DROP_SAME_QUESTION = "same_question"  # another peer's group on the same question was drawn this round


@dataclass(frozen=True)
class Drawable:
    """A peer's group the J draw may take: `group` is its view as this round would train on it (screened,
    cut, shaped: engine/sapo/first_look.py), `key` its candidate's."""

    key: CandidateKey
    group: RolloutGroup

    @property
    def origin(self) -> str:
        return self.group.provenance.origin_peer


class ExternalSampler(Protocol):
    """Chooses up to j groups among eligible external candidates."""

    name: str

    def draw(self, candidates: Sequence[Drawable], j: int, rng: random.Random) -> list[Drawable]: ...


class UniformSampler:
    """j groups uniformly at random without replacement (all of them if fewer are eligible)."""

    name = "uniform"

    def draw(self, candidates: Sequence[Drawable], j: int, rng: random.Random) -> list[Drawable]:
        if j <= 0 or not candidates:
            return []
        return rng.sample(list(candidates), min(j, len(candidates)))


class ReputationSampler:
    """j groups without replacement, each drawn with probability proportional to its origin's weight
    (Efraimidis–Spirakis keys u^(1/w): one pass, deterministic given the rng)."""

    name = "reputation"

    def __init__(self, reputation: Reputation) -> None:
        self.reputation = reputation  # the trainer's own record, read at each draw

    def draw(self, candidates: Sequence[Drawable], j: int, rng: random.Random) -> list[Drawable]:
        if j <= 0 or not candidates:
            return []
        keyed = [(rng.random() ** (1.0 / self.reputation.weight(d.origin)), i) for i, d in enumerate(candidates)]
        keyed.sort(reverse=True)
        return [candidates[i] for _, i in keyed[:j]]


# Each sampler is made with the origins' record it may draw by (the uniform one ignores it).
SAMPLERS: dict[str, Callable[[Reputation], ExternalSampler]] = {
    "uniform": lambda reputation: UniformSampler(), "reputation": ReputationSampler}


def make_sampler(name: str, reputation: Reputation) -> ExternalSampler:
    if name not in SAMPLERS:
        raise ValueError(f"unknown external sampler {name!r}; known: {sorted(SAMPLERS)}")
    return SAMPLERS[name](reputation)


@dataclass(frozen=True)
class Selection:
    """What a round trains on: own groups by their index among the round's own groups, peers' groups as
    drawn; the peers' groups left out, by key, with why (an own group left out has no signal)."""

    own: list[int]
    external: list[Drawable]
    dropped: list[tuple[CandidateKey, str]] = field(default_factory=list)


def has_signal(groups: Sequence[RolloutGroup]) -> list[bool]:
    """Per group: True when its (local) rewards are not all equal. Groups must be scored."""
    return [g.has_signal for g in groups]


def per_origin_cap(num_external: int, max_origin_share: float) -> int:
    """External groups one origin peer may place in a round: ceil(J x share), at least 1."""
    return max(1, math.ceil(num_external * max_origin_share - 1e-9))


def select_groups(own: Sequence[RolloutGroup], external: Sequence[Drawable], num_external: int,
                  sampler: ExternalSampler, rng: random.Random,
                  filter_zero_advantage: bool = True, max_origin_share: float = 1.0) -> Selection:
    """Apply the zero-advantage filter to all groups, then draw `num_external` (J) external groups,
    at most `per_origin_cap` of them from one origin (one peer must not fill a round's peer rows) and at
    most one per question (identities sending the same question cannot stack its weight)."""
    if any(g.rewards is None for g in own):
        raise ValueError("own groups must be scored before selection")
    dropped: list[tuple[CandidateKey, str]] = []
    scored_ext = []
    for d in external:
        g = d.group
        if g.rewards is None or len(g.rewards) != len(g.completions) or len(g.completions) < 2:
            dropped.append((d.key, DROP_NOT_SCORED))
        else:
            scored_ext.append(d)
    kept_own, kept_ext = list(range(len(own))), scored_ext
    if filter_zero_advantage:
        kept_own = [k for k, signal in enumerate(has_signal(own)) if signal]
        kept_ext = [d for d in scored_ext if d.group.has_signal]
        dropped += [(d.key, DROP_ZERO_ADVANTAGE) for d in scored_ext if not d.group.has_signal]
    chosen, same_question = _draw(kept_ext, num_external, per_origin_cap(num_external, max_origin_share),
                                  sampler, rng)
    dropped += [(d.key, DROP_SAME_QUESTION) for d in same_question]
    left = {d.key for d in same_question} | {d.key for d in chosen}
    dropped += [(d.key, DROP_NOT_SAMPLED) for d in kept_ext if d.key not in left]
    return Selection(own=kept_own, external=chosen, dropped=dropped)


def _draw(eligible: list[Drawable], j: int, cap: int, sampler: ExternalSampler, rng: random.Random
          ) -> tuple[list[Drawable], list[Drawable]]:
    """The sampler's order over all eligible groups, then the caps -> (drawn, passed over for a question
    already drawn)."""
    chosen: list[Drawable] = []
    taken: dict[str, int] = {}
    questions: set[str] = set()
    same_question: list[Drawable] = []
    for d in sampler.draw(eligible, len(eligible), rng):
        if len(chosen) < j and taken.get(d.origin, 0) < cap:
            if d.group.question_hash in questions:
                same_question.append(d)
                continue
            chosen.append(d)
            taken[d.origin] = taken.get(d.origin, 0) + 1
            questions.add(d.group.question_hash)
    return chosen, same_question
