"""What a node does with a peer's group before trusting it, and how it names its task library.

`make_pool` is the node's pool of peers' groups (every bench and the experiment use it too);
`make_rescorer` is the pool's gate (regenerate, hash check, local verifier: a `VerifiedGroup`);
`rollout_event` describes a group for the feed and the store; `task_library_version` is what peers compare before they can
verify each other's questions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from engine import tasks
from engine.events import RolloutSeen
from engine.sapo.records import RolloutGroup, VerifiedGroup
from engine.swarm.config import BYTES_PER_TOKEN, PoolConfig
from engine.swarm.identity import name_for
from engine.swarm.pool import PoolDecision, RolloutPool


def make_rescorer(partial_credit: bool, mix: Any = None) -> Callable[[RolloutGroup], VerifiedGroup | None]:
    """The pool's gate: regenerate the question from the reference, check its hash, score every
    completion with the *local* verifier, once: the result is the group's `VerifiedGroup`, which the
    pool keeps (as a `Candidate`) and the trainer uses as it is. A forged or unknown reference gives None (dropped).
    Only generator settings of a preset, a curriculum rung or `mix` (the node's own) are run: a peer
    can't make us generate huge questions."""
    def rescore(group: RolloutGroup) -> VerifiedGroup | None:
        question = tasks.verify(group.ref, group.question_hash, mix)
        if question is None:
            return None
        rewards = tuple(tasks.score(question, c, partial_credit=partial_credit) for c in group.completions)
        return VerifiedGroup(group.with_rewards(rewards), question)

    return rescore


def peer_screen(group: RolloutGroup) -> str | None:
    """Checks on a peer's group before anything is regenerated or scored -> a drop reason, or None.
    A reference in the held-out seed range names a question of some node's judge: refused, whoever
    sent it, so no peer can make a node train on (and so inflate) its own held-out score."""
    if tasks.is_heldout(group.ref):
        return "heldout_question"
    return None


def make_pool(cfg: PoolConfig, max_new_tokens: int, partial_credit: bool, mix: Any = None, *,
              clock: Callable[[], float] | None = None,
              on_decision: Callable[[PoolDecision], None] | None = None) -> RolloutPool:
    """The node's pool of peers' groups: its screen (`peer_screen`) and gate (`make_rescorer`), and no scoring of a completion
    longer than this node's policy could write (BYTES_PER_TOKEN x its token cap). Node, experiment and
    benches all make theirs here, so each measures the gate the app runs."""
    cfg = replace(cfg, max_completion_bytes=min(cfg.max_completion_bytes, BYTES_PER_TOKEN * max_new_tokens))
    kwargs: dict[str, Any] = {"on_decision": on_decision} if on_decision is not None else {}
    if clock is not None:
        kwargs["clock"] = clock
    return RolloutPool(cfg, make_rescorer(partial_credit, mix), screen=peer_screen, **kwargs)


def task_library_version() -> str:
    """Peers regenerate each other's questions: they must run the same task generators."""
    from importlib.metadata import version

    return f"reasoning-gym=={version('reasoning-gym')}"


def rollout_event(group: RolloutGroup, status: str, reason: str = "", question: Any = None,
                  evicted: bool = False) -> RolloutSeen:
    """`question`: the group's regenerated question where the caller holds it (a verified group);
    otherwise it is regenerated (cached) for its text."""
    text = question.text if question is not None else tasks.regenerate(group.ref).text
    return RolloutSeen.of(group, status, reason, text, name_for(group.provenance.origin_peer), evicted)
