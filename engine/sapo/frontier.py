"""Peers' questions at their frontier: the on-policy channel of sharing.

A peer's group whose completions, re-scored by this node's verifier, hold both a right and a wrong
answer was at that peer's frontier, and questions at a policy's frontier stay there (on SmolLM2's
starting weights a question mixed once was mixed again with probability 0.65, one that was not, 0.23).
So a node may take part of its own I questions from such groups: the question was already
regenerated from its reference and its hash checked by the pool's gate (a forged one never gets
here), and the node answers it with its own policy and scores it with its own verifier. Nothing of
the peer's text enters the loss: this channel cannot carry a text backdoor, and a peer suggesting
useless questions only spends the receiver's generation, which the per-origin cap bounds and the
reputation (the yield of each origin's suggestions) follows.

Pure: `pick_suggestions` chooses; the trainer generates.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from engine.sapo.records import Candidate
from engine.sapo.reputation import Reputation, ReputationConfig
from engine.sapo.sampler import has_signal

SOURCES = ("own_pick", "suggested", "peer_text")  # where a trained-on group came from


class RecentQuestions:
    """Question hashes this node generated for lately (bounded): a suggestion of one of them adds
    nothing the node is not already learning from."""

    def __init__(self, remember: int = 1024) -> None:
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._remember = remember

    def add(self, question_hash: str) -> None:
        self._seen.pop(question_hash, None)
        self._seen[question_hash] = None
        while len(self._seen) > self._remember:
            self._seen.popitem(last=False)

    def __contains__(self, question_hash: object) -> bool:
        return question_hash in self._seen


def pick_suggestions(candidates: Sequence[Candidate], n: int, per_origin: int, rng: random.Random,
                     recent: RecentQuestions, weight: Callable[[str], float] | None = None) -> list[Candidate]:
    """Up to `n` candidates whose locally re-scored rewards are mixed, at most `per_origin` from one
    origin and as many from one network address (identities are free, addresses are not), one per
    question, none of a question asked here lately. Drawn without replacement with probability
    proportional to `weight(origin)` (None: uniformly), by Efraimidis-Spirakis keys u^(1/w). n = 0 draws
    nothing from `rng` (a node that takes no suggestions keeps its exact random path)."""
    if n <= 0 or not candidates:
        return []
    mixed = [v for v, signal in zip(candidates, has_signal([v.group for v in candidates])) if signal]
    eligible = [v for v in mixed if v.group.question_hash not in recent]
    if weight is None:
        rng.shuffle(eligible)
    else:
        keys = [rng.random() ** (1.0 / max(weight(v.origin), 1e-9)) for v in eligible]
        eligible = [v for _, v in sorted(zip(keys, eligible), key=lambda kv: -kv[0])]
    picked: list[Candidate] = []
    per: dict[str, int] = {}
    questions: set[str] = set()
    for v in eligible:
        links = (v.origin, f"address:{v.source}") if v.source else (v.origin,)
        if any(per.get(link, 0) >= per_origin for link in links) or v.group.question_hash in questions:
            continue
        picked.append(v)
        for link in links:
            per[link] = per.get(link, 0) + 1
        questions.add(v.group.question_hash)
        if len(picked) >= n:
            break
    return picked


class Suggestions:
    """Peers' frontier questions for this node's own rounds: which to take (weighted by what each
    origin's suggestions yielded here: a question that came back mixed trained, one that came back flat
    cost a generation for nothing), and what each origin's did yield. Kept in checkpoints."""

    def __init__(self, cfg: ReputationConfig) -> None:
        self.recent = RecentQuestions()  # asked here lately: not worth a peer's suggestion
        self.yields = Reputation(cfg)  # per origin: its suggestions that came back mixed here

    def pick(self, candidates: Sequence[Candidate], n: int, per_origin: int, rng: random.Random) -> list[Candidate]:
        return pick_suggestions(candidates, n, per_origin, rng, self.recent, self.yields.weight)

    def asked(self, question_hash: str) -> None:
        self.recent.add(question_hash)

    def observe(self, origin: str, mixed: bool) -> None:
        self.yields.record(origin, flagged=not mixed)

    def state_dict(self) -> dict[str, Any]:
        return self.yields.state_dict()

    def load_state(self, state: Any) -> None:
        self.yields.load_state(state)


def source_metrics(suggested: int, mixed: Sequence[bool], kept: Sequence[int], peer_text: int, *,
                   gen_seconds: float, train_seconds: float, peer_text_mixed: int | None = None) -> dict[str, float]:
    """Per source, what a round's groups gave and cost: the first `suggested` of the own groups came
    from peers' questions, the rest were this node's own pick; `mixed[k]`: own group k had signal;
    `kept`: own groups that entered the loss; `peer_text`: peers' text groups in the loss, of which
    `peer_text_mixed` had signal (None: all, as the zero-advantage filter leaves them). Generation and
    scoring are split by own groups, preparing and the update by groups trained on. Each key is an
    entry of engine/metrics.py."""
    own = len(mixed)
    trained = len(kept) + peer_text
    kept_suggested = sum(k < suggested for k in kept)
    gen = {"own_pick": own - suggested, "suggested": suggested, "peer_text": 0}
    train = {"own_pick": len(kept) - kept_suggested, "suggested": kept_suggested, "peer_text": peer_text}
    out = {"own_pick_groups": float(own - suggested), "own_pick_mixed": float(sum(mixed[suggested:])),
           "suggested_groups": float(suggested), "suggested_mixed": float(sum(mixed[:suggested])),
           "peer_text_groups": float(peer_text),
           "peer_text_mixed": float(peer_text if peer_text_mixed is None else peer_text_mixed)}
    for source in SOURCES:
        out[f"seconds_{source}"] = (gen_seconds * gen[source] / max(own, 1)
                                    + train_seconds * train[source] / max(trained, 1))
    return out
