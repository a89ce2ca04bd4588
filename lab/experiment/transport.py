"""An in-memory swarm: every agent's groups travel as signed `rollouts` frames into peers' pools.

The bytes are the real protocol's (SwarmProtocol.encode_rollouts: wire records, canonical JSON,
ed25519 signatures) and each receiver opens them with its own SwarmProtocol and rollouts_from_wire,
then offers every group to its own RolloutPool, whose rescorer regenerates the question from the
task reference, checks the hash and scores with the local verifier, exactly as a node does. Only
the socket is missing. Time in the pools is counted in rounds (the runner sets the clock), so
"lock-step" (groups of the previous round only) and "async" (a window of rounds) are pool settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from collections.abc import Sequence

from engine.node.peer_groups import make_pool
from engine.sapo.records import Candidate, CandidateKey, RolloutGroup
from engine.swarm.config import PoolConfig, ProtocolLimits
from engine.swarm.errors import ProtocolError
from engine.swarm.identity import Identity
from engine.swarm.protocol import SwarmProtocol
from engine.swarm.wire import rollouts_from_wire


def agent_identity(seed: int, agent: int) -> Identity:
    """A deterministic ed25519 identity per (experiment seed, agent): stable peer ids across arms."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    raw = hashlib.sha256(f"sapo-experiment/{seed}/{agent}".encode()).digest()
    return Identity(Ed25519PrivateKey.from_private_bytes(raw))


class RoundClock:
    """The pools' clock, in rounds: set by the runner, so pool ages are exact and reproducible."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class InMemorySwarm:
    """N agents fully connected through signed frames; one RolloutPool per agent."""

    def __init__(self, identities: Sequence[Identity], max_new_tokens: int, pool_max_age_rounds: float, *,
                 lockstep: bool, limits: ProtocolLimits | None = None) -> None:
        if len(identities) < 1:
            raise ValueError("a swarm needs at least one agent")
        self.limits = limits or ProtocolLimits()
        self.identities = list(identities)
        self.clock = RoundClock()
        # Capacity is generous: the experiment bounds staleness by age (rounds), not by eviction.
        pool_cfg = PoolConfig(capacity=4096, max_peer_share=1.0, max_age_s=float(pool_max_age_rounds),
                              max_policy_lag=1_000_000, max_uses=1)
        # the node's own pool and gate (make_pool), with this swarm's settings: what a node would keep
        self.pools = [make_pool(pool_cfg, max_new_tokens, False, clock=self.clock) for _ in identities]
        self.protocols = [SwarmProtocol(ident, self.limits) for ident in identities]
        self.counters: Counter[str] = Counter()
        self.lockstep = lockstep  # hold frames until `flush()` (the round barrier) instead of delivering now
        self._outbox: list[tuple[int, bytes]] = []

    def publish(self, sender: int, groups: Sequence[RolloutGroup]) -> None:
        """Sign `sender`'s groups (origin = its peer id) and deliver the frames to every other agent."""
        if not groups:
            return
        me = self.identities[sender].peer_id
        signed = [dataclasses.replace(g, provenance=dataclasses.replace(g.provenance, origin_peer=me),
                                      rewards=None) for g in groups]
        frames = self.protocols[sender].encode_rollouts(signed)
        self.counters["frames_sent"] += len(frames)
        self.counters["groups_published"] += len(groups)
        for receiver in range(len(self.identities)):
            if receiver != sender:
                for frame in frames:
                    if self.lockstep:
                        self._outbox.append((receiver, frame))
                    else:
                        self.deliver(receiver, frame)

    def flush(self) -> int:
        """Lock-step barrier: deliver every held frame -> frames delivered."""
        outbox, self._outbox = self._outbox, []
        for receiver, frame in outbox:
            self.deliver(receiver, frame)
        return len(outbox)

    def deliver(self, receiver: int, frame: bytes) -> int:
        """Open one frame at `receiver` and offer its groups to its pool -> groups pooled.

        A refused frame or group is counted and dropped, as a node does; it never raises.
        """
        protocol = self.protocols[receiver]
        try:
            env = protocol.open(frame)
            if env.type != "rollouts":
                raise ProtocolError("bad_schema", f"unexpected {env.type} frame")
            groups = rollouts_from_wire(env.body, self.limits, env.sender)
        except ProtocolError as exc:
            self.counters[f"refused:{exc.reason}"] += 1
            return 0
        pooled = 0
        for group in groups:
            decision = self.pools[receiver].offer(group)
            self.counters[f"pool:{decision.status}" + (f":{decision.reason}" if decision.reason else "")] += 1
            pooled += decision.status == "pooled"
        return pooled

    def candidates(self, receiver: int) -> list[Candidate]:
        """Verified, non-expired peers' groups in `receiver`'s pool."""
        return self.pools[receiver].candidates()

    def mark_used(self, receiver: int, keys: Sequence[CandidateKey]) -> None:
        self.pools[receiver].mark_used(keys)
