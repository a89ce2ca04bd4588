"""The round step: one for the node, the experiment and every bench.

    candidates in  ->  trainer.run_round  ->  the round's own groups and the peers' groups it used out
                                          ->  fetch: ask for the next round's peers' groups

An `Exchange` is where peers' groups come from and where the round's results go: the node's swarm
(`engine/node/swarm.NodeSwarm`: its pool, the websocket links and the board), or a `PoolExchange`
over a pool made by the node's own factory (`engine.node.peer_groups.make_pool`), which the experiment's
in-memory swarm and the benches feed. A bench that measures `step` measures the node the app runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from engine.sapo.records import Candidate, CandidateKey, RolloutGroup

if TYPE_CHECKING:  # the trainer brings torch: importing the step must not
    from engine.sapo.trainer import RoundResult, Trainer


class Exchange(Protocol):
    def candidates(self) -> list[Candidate]:
        """Peers' groups this round may draw from (verified by the local gate)."""
        ...

    def after_round(self, own: Sequence[RolloutGroup], used: Sequence[Candidate]) -> None:
        """The round ended: `used` entered the loss, `own` is this node's to share."""
        ...

    def fetch(self, j: int) -> None:
        """Ask for up to `j` more peers' groups for the next round (whether or not this round had own
        groups to share: a node that only learns still learns)."""
        ...

    def copiers(self) -> list[str]:
        """Origins caught re-signing a group another origin signed first, since the last call."""
        ...


class Pool(Protocol):
    """What an exchange needs of a pool (`engine.swarm.pool.RolloutPool`; the step cannot import the swarm)."""

    def candidates(self) -> list[Candidate]: ...

    def mark_used(self, keys: Iterable[CandidateKey]) -> None: ...

    def take_copiers(self) -> list[str]: ...


class PoolExchange:
    """A pool as an exchange: draws from it, marks what was used, and hands own groups to `publish`
    (None: nobody reads them, e.g. a solo arm). Its pool is fed from outside (the experiment's in-memory
    swarm, a bench), so `fetch` has nothing to ask."""

    def __init__(self, pool: Pool, publish: Callable[[Sequence[RolloutGroup]], object] | None = None) -> None:
        self.pool = pool
        self.publish = publish
        self.offered = 0  # candidates the last round was offered

    def candidates(self) -> list[Candidate]:
        candidates = self.pool.candidates()
        self.offered = len(candidates)
        return candidates

    def copiers(self) -> list[str]:
        return list(self.pool.take_copiers())

    def after_round(self, own: Sequence[RolloutGroup], used: Sequence[Candidate]) -> None:
        if used:
            self.pool.mark_used([c.key for c in used])
        if self.publish is not None and own:
            self.publish(own)

    def fetch(self, j: int) -> None:
        pass


def step(trainer: Trainer, exchange: Exchange) -> RoundResult:
    """One round: the candidates (only when the trainer takes peers' groups), the trainer's round, then
    the exchange gets the round's own groups and the peers' groups that entered the loss, and fetches
    the next round's peers' groups (only when the trainer takes them)."""
    for origin in exchange.copiers():  # a copy earns its signer a flag, the first signer the credit
        trainer.reputation.record(origin, flagged=True)
    external = exchange.candidates() if trainer.cfg.num_external or trainer.cfg.num_suggested else []
    result = trainer.run_round(external)
    # a group whose question was answered here was used too: the pool retires it, its origin is told
    exchange.after_round(result.local_groups, result.used_external + result.suggested)
    wanted = trainer.cfg.num_external + trainer.cfg.num_suggested
    if wanted:
        exchange.fetch(wanted)
    return result
