"""The round step: one for the node, the experiment and every bench.

    candidates in  ->  trainer.run_round  ->  the round's own groups and the peers' groups it used out

An `Exchange` is where peers' groups come from and where the round's results go: the node's swarm
(`engine/node/swarm.NodeSwarm`: its pool, the websocket links and the board), or a `PoolExchange`
over a pool made by the node's own factory (`engine.node.peer_groups.make_pool`), which the experiment's
in-memory swarm and the benches feed. A bench that measures `step` measures the node the app runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from engine.sapo.records import Candidate, RolloutGroup

if TYPE_CHECKING:  # the trainer brings torch: importing the step must not
    from engine.sapo.trainer import RoundResult, Trainer


class Exchange(Protocol):
    def candidates(self) -> list[Candidate]:
        """Peers' groups this round may draw from (verified by the local gate)."""
        ...

    def after_round(self, own: Sequence[RolloutGroup], used: Sequence[Candidate], fetch: int) -> None:
        """The round ended: `used` entered the loss, `own` is this node's to share; fetch `fetch` more."""
        ...

    def copiers(self) -> list[str]:
        """Origins caught re-signing a group another origin signed first, since the last call."""
        ...


class PoolExchange:
    """A pool as an exchange: draws from it, marks what was used, and hands own groups to `publish`
    (None: nobody reads them, e.g. a solo arm)."""

    def __init__(self, pool: object, publish: Callable[[Sequence[RolloutGroup]], object] | None = None) -> None:
        self.pool = pool
        self.publish = publish
        self.offered = 0  # candidates the last round was offered

    def candidates(self) -> list[Candidate]:
        candidates: list[Candidate] = self.pool.candidates()  # type: ignore[attr-defined]
        self.offered = len(candidates)
        return candidates

    def copiers(self) -> list[str]:
        return list(self.pool.take_copiers())  # type: ignore[attr-defined]

    def after_round(self, own: Sequence[RolloutGroup], used: Sequence[Candidate], fetch: int) -> None:
        if used:
            self.pool.mark_used([c.key for c in used])  # type: ignore[attr-defined]
        if self.publish is not None and own:
            self.publish(own)


def step(trainer: Trainer, exchange: Exchange) -> RoundResult:
    """One round: the candidates (only when the trainer takes peers' groups), the trainer's round, then
    the exchange gets the round's own groups and the peers' groups that entered the loss."""
    for origin in exchange.copiers():  # a copy earns its signer a flag, the first signer the credit
        trainer.reputation.record(origin, flagged=True)
    external = exchange.candidates() if trainer.cfg.num_external or trainer.cfg.num_suggested else []
    result = trainer.run_round(external)
    # a group whose question was answered here was used too: the pool retires it, its origin is told
    wanted = trainer.cfg.num_external + trainer.cfg.num_suggested  # peers' groups to fetch for next time
    exchange.after_round(result.local_groups, result.used_external + result.suggested, wanted)
    return result
