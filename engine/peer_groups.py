"""What a node does with a peer's group before trusting it, and how it names its task library.

`make_rescorer` is the pool's gate (regenerate, hash check, local verifier: a `VerifiedGroup`);
`rollout_event` describes a group for the feed and the store; `task_library_version` is what peers compare before they can
verify each other's questions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.events import RolloutSeen
from engine.sapo.records import RolloutGroup, VerifiedGroup


def make_rescorer(partial_credit: bool, mix: Any = None) -> Callable[[RolloutGroup], VerifiedGroup | None]:
    """The pool's gate: regenerate the question from the reference, check its hash, score every
    completion with the *local* verifier, once: the result is the group's `VerifiedGroup`, which the
    pool keeps and the trainer uses as it is. A forged or unknown reference gives None (dropped).
    Only generator settings of a preset, a curriculum rung or `mix` (the node's own) are run: a peer
    can't make us generate huge questions."""
    from engine import tasks

    def rescore(group: RolloutGroup) -> VerifiedGroup | None:
        question = tasks.verify(group.ref, group.question_hash, mix)
        if question is None:
            return None
        rewards = tuple(tasks.score(question, c, partial_credit=partial_credit) for c in group.completions)
        return VerifiedGroup(group.with_rewards(rewards), question)

    return rescore


def task_library_version() -> str:
    """Peers regenerate each other's questions: they must run the same task generators."""
    from importlib.metadata import version

    return f"reasoning-gym=={version('reasoning-gym')}"


def rollout_event(group: RolloutGroup, status: str, reason: str = "", question: Any = None) -> RolloutSeen:
    """`question`: the group's regenerated question where the caller holds it (a verified group);
    otherwise it is regenerated (cached) for its text."""
    from engine import tasks
    from engine.swarm.identity import name_for

    text = question.text if question is not None else tasks.regenerate(group.ref).text
    return RolloutSeen.of(group, status, reason, text, name_for(group.provenance.origin_peer))
