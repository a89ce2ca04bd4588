"""The round's training set: judge the peers' groups, draw J of them beside the I own, bound the peers' rows.

Each candidate is first seen as it would be trained on (screened, cut, re-scored: engine/sapo/first_look.py),
so a group the screens leave without signal never takes one of the J slots; another model's groups are
left out (SapoConfig.external_same_model); then the zero-advantage filter and the J draw
(engine/sapo/sampler.py), by candidate key; then each peer group's mass is capped at one own group's
and the peers' rows floored (engine/sapo/peer_weight.py). Owned by the trainer thread.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from engine.sapo.config import SapoConfig
from engine.sapo.first_look import FirstLook
from engine.sapo.peer_weight import cap_peer_mass, floor_peer_rows, loss_shares, step_floor, unit_mass
from engine.sapo.records import Candidate, CandidateKey
from engine.sapo.round_parts import Asked, Scored, UpdatePlan
from engine.sapo.rows import external_rows, local_rows
from engine.sapo.sampler import DROP_OTHER_MODEL, Drawable, ExternalSampler, select_groups
from engine.sapo.update import TrainRow, round_denominator, strategy_keep

DROP_JUDGE_QUESTION = "judge_question"


def off_the_judge(external: Sequence[Candidate], judge: frozenset[str]
                  ) -> tuple[list[Candidate], list[tuple[CandidateKey, str]]]:
    """-> (the candidates whose question is none of this node's judge texts, the others as drops).

    Peers cannot name the judge (its seed is private), but a small task space can be enumerated: a peer
    who trains this node on every text of one would make each eval skip them (a judge text trained on
    is left out of the score), so the score would be read off fewer, chosen questions. Refused, whoever
    sends it; own draws that repeat a judge text by chance are still counted and skipped at the eval."""
    kept = [c for c in external if c.question.hash not in judge]
    return kept, [(c.key, DROP_JUDGE_QUESTION) for c in external if c.question.hash in judge]


def judge_texts_trained(asked: Asked, plan: UpdatePlan, judge: frozenset[str]) -> set[str]:
    """The judge texts a round trained on: own draws (a training draw may repeat a judge text: seeds
    differ, small task spaces do not); peers' groups on one were refused before the plan."""
    trained = [asked.questions[k].hash for k in plan.kept] + [c.question.hash for c in plan.used_external]
    return {h for h in trained if h in judge}


class RoundPlanner:
    """The trainer's selection step; its first look and sampler are the trainer's own."""

    def __init__(self, cfg: SapoConfig, model_id: str, first_look: FirstLook, sampler: ExternalSampler,
                 prompt: Callable[[Any], str], tokenizer: Any) -> None:
        self.cfg, self.model_id = cfg, model_id
        self.first_look, self.sampler = first_look, sampler
        self._prompt, self._tokenizer = prompt, tokenizer

    def plan(self, external: Sequence[Candidate], scored: Scored, j: int, rng: random.Random,
             round_no: int) -> UpdatePlan:
        """Pick the own groups with signal and draw `j` peers' groups -> the rows the update trains on."""
        cfg = self.cfg
        ours = [not cfg.external_same_model or c.group.provenance.model_id == self.model_id for c in external]
        looks, dropped, pending, repeated = self.first_look.judge(
            [c for c, ok in zip(external, ours) if ok], scored.weight, cfg.filter_zero_advantage, round_no)
        dropped += [(c.key, DROP_OTHER_MODEL) for c, ok in zip(external, ours) if not ok]
        look_of = {look.candidate.key: look for look, _ in looks}
        selection = select_groups([lg.group for lg in scored.shaped],
                                  [Drawable(look.candidate.key, shaped) for look, shaped in looks], j,
                                  self.sampler, rng, cfg.filter_zero_advantage, cfg.max_origin_share)
        chosen = [look_of[d.key] for d in selection.external]
        peer_text = [d.group for d in selection.external]
        rows = local_rows([scored.shaped[k] for k in selection.own], self._tokenizer, cfg.advantage_eps)
        rows += external_rows(peer_text, [self._prompt(look.candidate.question) for look in chosen],
                              [look.ids for look in chosen], self._tokenizer, cfg.advantage_eps)
        used = [look.candidate for look in chosen]
        rows, floor, shares = self._bound_peers(rows, scored, j, used)
        return UpdatePlan(rows, selection.own, peer_text, used, dropped + selection.dropped, j, pending, repeated,
                          step_floor=floor, peer_shares=shares)

    def _bound_peers(self, rows: list[TrainRow], scored: Scored, j: int, used: Sequence[Candidate]
                     ) -> tuple[list[TrainRow], float, dict[str, float]]:
        """Each peer group's mass capped at one own group's and the peers' rows floored (the round's step
        floor), with each origin's share of the step budget."""
        unit = unit_mass(self.cfg.completions, [len(c.token_ids) for lg in scored.local for c in lg.completions])
        floor = step_floor(len(scored.local) + j, unit)
        keep = strategy_keep(rows, self.cfg)
        rows = cap_peer_mass(rows, unit, keep)
        shares: dict[str, float] = {}  # of the budget as if every row were divided by max(D, F): an upper bound
        for source, share in loss_shares(rows, floor, keep).items():
            origin = used[source].origin
            shares[origin] = shares.get(origin, 0.0) + share
        return floor_peer_rows(rows, round_denominator(rows, self.cfg), floor), floor, shares
