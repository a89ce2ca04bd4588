"""The bounded pool of rollout groups received from peers.

Every group offered is re-scored locally first (`rescore` regenerates the question from its task
reference, checks the hash, and scores each completion with the local verifier, once, into a
`VerifiedGroup`); a forged or unknown reference is dropped. What the pool keeps, and hands to the
trainer, is a `Candidate` (engine/sapo/records.py): that group under its content key, hashed once on
arrival, with its signer, the address it came from and when. Kept groups are bounded by capacity, by a per-peer share, by age (since receipt)
and by policy staleness (versions behind the newest seen from the same origin). Content-identical
groups are kept once. Every decision is counted per peer and kept in a short history.

Thread-safe: the asyncio side offers while the trainer thread reads candidates and marks them used.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from engine.sapo.records import Candidate, CandidateKey, RolloutGroup, VerifiedGroup, content_key
from engine.swarm.config import PoolConfig
from engine.swarm.limits import KeyedBuckets, TokenBucket

# Why a group left (or never entered) the pool.
DROP_REASONS = (
    "local_group",  # a group of our own: the pool holds peers' groups only
    "duplicate",  # same content as a group already received from the same origin
    "copied",  # same content as a group another origin signed first: the first signer keeps the credit
    "oversized",  # a completion longer than this node could generate (PoolConfig.max_completion_bytes)
    "over_cpu_budget",  # its origin (or all origins together) spent the minute's re-scoring CPU
    "forged_ref",  # the reference does not regenerate a question with that hash (or is unknown)
    "heldout_question",  # the reference names a held-out question: no peer may make a node train on its judge
    "rescore_error",  # the local verifier failed on it (logged with the error type)
    "stale_policy",  # generated too many policy versions before its origin's newest
    "question_used_up",  # its question was trained on max_question_uses times already (from any origin)
    "expired",  # in the pool longer than max_age_s
    "evicted_peer_share",  # its origin peer exceeded its share; its oldest group made room
    "evicted_address_share",  # the network address it came from exceeded its share (many identities, one host)
    "evicted_capacity",  # the pool was full; the oldest group made room
)
MAX_TRACKED_PEERS = 1024
SEEN_KEYS_PER_SLOT = 8  # remember this many content keys per pool slot for duplicate detection


@dataclass(frozen=True)
class PoolDecision:
    """What happened to one group: "pooled", "used" or "dropped" (with a reason)."""

    status: str
    reason: str
    group: RolloutGroup  # scored when status is "pooled" or "used"
    peer_name: str
    at: float
    evicted: bool = False  # it had been pooled and left unused (capacity, share, age, stale policy)
    question: Any = None  # its regenerated question once verified (pooled, used, evicted); else None

    @property
    def peer(self) -> str:
        return self.group.provenance.origin_peer


@dataclass
class _Entry:
    candidate: Candidate  # what the trainer gets; its key is this entry's key in the pool
    peer_name: str
    uses: int = 0

    @property
    def group(self) -> RolloutGroup:
        return self.candidate.group


@dataclass
class _PeerStats:
    name: str = ""
    received: int = 0
    pooled: int = 0
    used: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    newest_policy: int = -1

    def as_dict(self, in_pool: int) -> dict[str, Any]:
        return {"name": self.name, "received": self.received, "pooled": self.pooled, "used": self.used,
                "dropped": dict(self.dropped), "in_pool": in_pool, "newest_policy": self.newest_policy}


class RolloutPool:
    """Peers' scored rollout groups, bounded and deduplicated. See the module docstring."""

    def __init__(self, config: PoolConfig, rescore: Callable[[RolloutGroup], VerifiedGroup | None],
                 clock: Callable[[], float] = time.time,
                 on_decision: Callable[[PoolDecision], None] | None = None,
                 screen: Callable[[RolloutGroup], str | None] | None = None) -> None:
        self.config = config
        self._rescore = rescore
        self._screen = screen  # content checks before scoring: a drop reason, or None to go on
        self._clock = clock
        self._on_decision = on_decision
        self._lock = threading.Lock()
        self._entries: OrderedDict[CandidateKey, _Entry] = OrderedDict()  # content key -> entry, oldest first
        self._seen: OrderedDict[CandidateKey, str] = OrderedDict()  # content key ever offered -> first signer (bounded)
        self._copiers: deque[str] = deque(maxlen=MAX_TRACKED_PEERS)  # origins caught copying, not yet taken
        self._peers: OrderedDict[str, _PeerStats] = OrderedDict()
        self._history: deque[PoolDecision] = deque(maxlen=config.history)
        self._question_uses: OrderedDict[str, int] = OrderedDict()  # question hash -> peers' groups trained
        self._totals: Counter[str] = Counter()
        self._dropped: Counter[str] = Counter()
        # Re-scoring CPU credit (seconds), refilled per minute; per origin and for the whole pool.
        self._cpu_peer = KeyedBuckets(config.rescore_cpu_s_per_peer / 60, config.rescore_cpu_s_per_peer,
                                      MAX_TRACKED_PEERS)
        self._cpu_total = TokenBucket.full(config.rescore_cpu_s_total / 60, config.rescore_cpu_s_total, clock())
        self.rescore_cpu_s = 0.0  # CPU seconds re-scoring has spent (all origins)

    # --- writers ------------------------------------------------------------------------------------
    def offer(self, group: RolloutGroup, peer_name: str = "", source: str = "") -> PoolDecision:
        """Re-score and keep `group`, or drop it with a reason. Never trusts rewards on the group.
        `source`: the address of the direct link it came over; all identities behind one address share
        `config.per_source_cap` slots. The group's content is hashed here, once: its `Candidate` keeps
        the key."""
        group = group if group.rewards is None else replace(group, rewards=None)
        key = content_key(group)
        with self._lock:
            stats = self._peer(group.provenance.origin_peer, peer_name)
            stats.received += 1
            self._totals["received"] += 1
            early = self._early_reason(group, key, stats)
            if early is None:
                self._remember(key, group.provenance.origin_peer)  # claimed now, so a copy arriving while we score is a duplicate
        if early is not None:
            return self._decided([self._drop(group, peer_name, early)])
        cpu0 = time.thread_time()  # this thread's CPU: waiting for a core under load is not charged
        try:
            refused = self._screen(group) if self._screen is not None else None
            scored = self._rescore(group) if refused is None else None
        except Exception as exc:  # noqa: BLE001 - a verifier bug must cost one group, not the link
            scored, error = None, type(exc).__name__
        else:
            error = ""
        finally:
            self._charge(group.provenance.origin_peer, time.thread_time() - cpu0)
        if error:
            return self._decided([self._drop(group, peer_name, "rescore_error", error)])
        if refused is not None:
            return self._decided([self._drop(group, peer_name, refused)])
        if scored is None:
            return self._decided([self._drop(group, peer_name, "forged_ref")])
        try:  # exactly what was offered, with the verifier's rewards: VerifiedGroup checks that they fit
            verified = VerifiedGroup(replace(group, rewards=scored.group.rewards), scored.question)
        except ValueError:
            return self._decided([self._drop(group, peer_name, "rescore_error", "not verified")])
        with self._lock:
            decisions = self._insert(verified, key, peer_name, source)
        return self._decided(decisions)

    def mark_used(self, keys: Iterable[CandidateKey]) -> None:
        """The trainer used the candidates with these keys; after `max_uses` uses one leaves the pool."""
        decisions = []
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is None:
                    continue
                entry.uses += 1
                self._totals["used"] += 1
                self._peer(entry.candidate.origin, entry.peer_name).used += 1
                if entry.uses >= self.config.max_uses:
                    del self._entries[key]
                decisions.append(PoolDecision("used", "", entry.group, entry.peer_name, self._clock(),
                                              question=entry.candidate.question))
                self._count_question_use(entry.group.question_hash)
            decisions += self._retire_used_up_questions()
        self._finish(decisions)

    # --- readers ------------------------------------------------------------------------------------
    def candidates(self) -> list[Candidate]:
        """Current, non-stale, verified groups, oldest first (expired and policy-stale ones are dropped)."""
        with self._lock:
            decisions = self._expire()
            candidates = [entry.candidate for entry in self._entries.values()]
        self._finish(decisions)
        return candidates

    def take_copiers(self) -> list[str]:
        """Origins whose group copied another signer's since the last call (once per copy)."""
        with self._lock:
            out = list(self._copiers)
            self._copiers.clear()
        return out

    def has_verified(self, peer_id: str) -> bool:
        """This pool has verified (pooled) a group of `peer_id`'s (within the peers it still tracks)."""
        with self._lock:
            stats = self._peers.get(peer_id)
            return stats is not None and stats.pooled > 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def stats(self) -> dict[str, Any]:
        """received / pooled / used / dropped by reason, overall and per origin peer."""
        with self._lock:
            in_pool: Counter[str] = Counter(e.candidate.origin for e in self._entries.values())
            return {
                "size": len(self._entries),
                "capacity": self.config.capacity,
                "received": self._totals["received"],
                "pooled": self._totals["pooled"],
                "used": self._totals["used"],
                "dropped": dict(self._dropped),
                "rescore_cpu_s": self.rescore_cpu_s,
                "per_peer": {pid: s.as_dict(in_pool[pid]) for pid, s in self._peers.items()},
            }

    def recent(self) -> list[PoolDecision]:
        """The last `config.history` decisions, oldest first."""
        with self._lock:
            return list(self._history)

    # --- internals (called with the lock held unless noted) ------------------------------------------
    def _peer(self, peer_id: str, name: str) -> _PeerStats:
        stats = self._peers.get(peer_id)
        if stats is None:
            stats = self._peers[peer_id] = _PeerStats(name=name)
            if len(self._peers) > MAX_TRACKED_PEERS:
                self._peers.popitem(last=False)
        else:
            self._peers.move_to_end(peer_id)
            stats.name = name or stats.name
        return stats

    def _early_reason(self, group: RolloutGroup, key: CandidateKey, stats: _PeerStats) -> str | None:
        if group.is_local:
            return "local_group"
        first = self._seen.get(key)
        if first is not None:
            if first != group.provenance.origin_peer:
                self._copiers.append(group.provenance.origin_peer)
                return "copied"
            return "duplicate"
        if self._question_used_up(group.question_hash):
            return "question_used_up"
        cap = self.config.max_completion_bytes
        if any(len(c) > cap or len(c.encode("utf-8", "surrogatepass")) > cap for c in group.completions):
            return "oversized"
        now = self._clock()
        credit = self._cpu_peer.bucket(group.provenance.origin_peer, now)
        # With the pool's minute spent, only origins that themselves spent little are still scored:
        # the heavy spenders (a CPU bomb, a crowd of its identities) wait, honest peers don't.
        if not credit.has_credit(now) or not (self._cpu_total.has_credit(now) or credit.tokens >= credit.burst / 2):
            return "over_cpu_budget"
        version = group.provenance.policy_version
        stats.newest_policy = max(stats.newest_policy, version)
        if version + self.config.max_policy_lag < stats.newest_policy:
            return "stale_policy"
        return None

    def _count_question_use(self, question_hash: str) -> None:
        uses = self._question_uses.pop(question_hash, 0) + 1
        self._question_uses[question_hash] = uses
        if len(self._question_uses) > self.config.capacity * SEEN_KEYS_PER_SLOT:
            self._question_uses.popitem(last=False)

    def _question_used_up(self, question_hash: str) -> bool:
        return self._question_uses.get(question_hash, 0) >= self.config.max_question_uses

    def _retire_used_up_questions(self) -> list[PoolDecision]:
        return [self._evict(k, "question_used_up") for k, e in list(self._entries.items())
                if self._question_used_up(e.group.question_hash)]

    def _charge(self, peer: str, seconds: float) -> None:
        """Lock NOT held by the caller."""
        with self._lock:
            now = self._clock()
            self.rescore_cpu_s += seconds
            self._cpu_peer.bucket(peer, now).charge(now, seconds)
            self._cpu_total.charge(now, seconds)

    def _remember(self, key: CandidateKey, origin: str) -> None:
        self._seen[key] = origin
        if len(self._seen) > self.config.capacity * SEEN_KEYS_PER_SLOT:
            self._seen.popitem(last=False)

    def _insert(self, verified: VerifiedGroup, key: CandidateKey, peer_name: str, source: str = "") -> list[PoolDecision]:
        now = self._clock()
        group = verified.group
        peer = group.provenance.origin_peer
        decisions = self._expire()
        own = [k for k, e in self._entries.items() if e.candidate.origin == peer]
        # Prefer fresh work: a peer over its share loses its oldest group, not the new one.
        while len(own) >= self.config.per_peer_cap:
            decisions.append(self._evict(own.pop(0), "evicted_peer_share"))
        if source:  # the same for every identity behind one address
            same = [k for k, e in self._entries.items() if e.candidate.source == source]
            while len(same) >= self.config.per_source_cap:
                decisions.append(self._evict(same.pop(0), "evicted_address_share"))
        while len(self._entries) >= self.config.capacity:
            decisions.append(self._evict(next(iter(self._entries)), "evicted_capacity"))
        self._entries[key] = _Entry(Candidate(key, verified, peer, source, now), peer_name)
        self._totals["pooled"] += 1
        self._peer(peer, peer_name).pooled += 1
        decisions.append(PoolDecision("pooled", "", group, peer_name, now, question=verified.question))
        return decisions

    def _evict(self, key: CandidateKey, reason: str) -> PoolDecision:
        entry = self._entries.pop(key)
        return replace(self._count_drop(entry.group, entry.peer_name, reason), evicted=True,
                       question=entry.candidate.question)

    def _expire(self) -> list[PoolDecision]:
        now, decisions = self._clock(), []
        for key, entry in list(self._entries.items()):
            stats = self._peers.get(entry.candidate.origin)
            newest = stats.newest_policy if stats is not None else -1
            if now - entry.candidate.received_at > self.config.max_age_s:
                decisions.append(self._evict(key, "expired"))
            elif entry.group.provenance.policy_version + self.config.max_policy_lag < newest:
                decisions.append(self._evict(key, "stale_policy"))
        return decisions

    def _count_drop(self, group: RolloutGroup, peer_name: str, reason: str) -> PoolDecision:
        self._dropped[reason] += 1
        self._peer(group.provenance.origin_peer, peer_name).dropped[reason] += 1
        return PoolDecision("dropped", reason, group, peer_name, self._clock())

    def _drop(self, group: RolloutGroup, peer_name: str, reason: str, detail: str = "") -> PoolDecision:
        """Lock NOT held by the caller."""
        with self._lock:
            decision = self._count_drop(group, peer_name, reason)
        return decision if not detail else PoolDecision("dropped", f"{reason}: {detail}", group,
                                                       peer_name, decision.at)

    def _decided(self, decisions: list[PoolDecision]) -> PoolDecision:
        last = self._finish(decisions)
        if last is None:
            raise RuntimeError("offer produced no decision")  # unreachable: every path appends one
        return last

    def _finish(self, decisions: list[PoolDecision]) -> PoolDecision | None:
        """Record decisions and notify (lock NOT held: the callback may take its own locks).

        Returns the last decision: in `offer`, always the offered group's own.
        """
        with self._lock:
            self._history.extend(decisions)
        if self._on_decision is not None:
            for decision in decisions:
                self._on_decision(decision)
        return decisions[-1] if decisions else None
