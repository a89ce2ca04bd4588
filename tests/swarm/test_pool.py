"""The external rollout pool, with the real task library as the re-scorer."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
from swarm_helpers import library_rescore, make_group, real_groups, stub_rescore

from engine.sapo.records import Candidate, Provenance, content_key
from engine.swarm.config import PoolConfig
from engine.swarm.identity import Identity
from engine.swarm.pool import PoolDecision, RolloutPool
from engine.tasks.reference import TaskRef


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


PEER_A = Identity.generate().peer_id
PEER_B = Identity.generate().peer_id


def test_real_groups_are_rescored_locally() -> None:
    pool = RolloutPool(PoolConfig(), library_rescore, clock=lambda: 1234.0)
    [group] = real_groups(PEER_A, 1)
    forged_rewards = group.with_rewards((0.0, 1.0, 1.0))  # a peer's rewards are never believed
    decision = pool.offer(forged_rewards, "amber-otter", source="192.0.2.4")
    assert decision.status == "pooled"
    assert decision.group.rewards == (1.0, 0.0, 0.0)
    [candidate] = pool.candidates()  # the record the trainer gets: the group as offered, verified once
    assert isinstance(candidate, Candidate) and candidate.group == decision.group
    assert candidate.question.hash == group.question_hash and decision.question is candidate.question
    # Its identity, fixed on arrival: the content key (rewards and signer are not the content), the
    # signer, the link's address, the pool's clock.
    assert (candidate.key, candidate.origin, candidate.source, candidate.received_at) == (
        content_key(group), PEER_A, "192.0.2.4", 1234.0)


def test_a_gate_that_verifies_other_content_is_a_rescore_error() -> None:
    """The pool keeps exactly what was offered: a verified group that does not fit it is refused."""
    [group, other] = real_groups(PEER_A, 2)

    pool = RolloutPool(PoolConfig(), lambda offered: library_rescore(other))  # always verifies `other`
    assert pool.offer(group).reason == "rescore_error: not verified"  # another question
    shorter = replace(other, completions=other.completions[:2])
    assert pool.offer(shorter).reason == "rescore_error: not verified"  # not one reward per completion
    assert pool.offer(other).status == "pooled"
    assert [c.group.completions for c in pool.candidates()] == [other.completions]


def test_forged_task_reference_is_dropped() -> None:
    pool = RolloutPool(PoolConfig(), library_rescore)
    [group] = real_groups(PEER_A, 1)
    # Same reference, a hash of some other question: a peer trying to plant its own ground truth.
    forged = replace(group, question_hash="0" * 64)
    assert pool.offer(forged).reason == "forged_ref"
    unknown = replace(group, ref=TaskRef("no_such_task", {}, 1, 1))
    assert pool.offer(unknown).reason == "forged_ref"
    bad_config = replace(group, ref=TaskRef(group.ref.specialty, {"bogus_option": 3}, 1, 1))
    assert pool.offer(bad_config).reason == "forged_ref"
    assert pool.candidates() == []
    assert pool.stats()["dropped"] == {"forged_ref": 3}


def test_duplicates_by_content() -> None:
    pool = RolloutPool(PoolConfig(), stub_rescore(lambda g: (1.0,) * len(g.completions)))
    group = make_group(PEER_A, 1)
    assert pool.offer(group).status == "pooled"
    assert pool.offer(group).reason == "duplicate"
    # Same content with other provenance, or its completions reordered: still a duplicate.
    assert pool.offer(replace(group, provenance=replace(group.provenance, round=99))).reason == "duplicate"
    assert pool.offer(replace(group, completions=("5", "4"))).reason == "duplicate"
    # Re-signed by another origin: a copy (the first signer keeps the credit; the copier is flagged).
    copy = replace(group, completions=("5", "4"), provenance=replace(group.provenance, origin_peer=PEER_B))
    assert pool.offer(copy).reason == "copied"
    assert pool.take_copiers() == [PEER_B] and pool.take_copiers() == []
    assert pool.has_verified(PEER_A) and not pool.has_verified(PEER_B)
    assert pool.offer(replace(group, completions=("4", "6"))).status == "pooled"


def test_completions_longer_than_this_node_could_write_are_refused_before_scoring() -> None:
    scored = []
    pool = RolloutPool(PoolConfig(max_completion_bytes=64), lambda g: scored.append(g) or library_rescore(g))
    [group] = real_groups(PEER_A, 1)
    padded = replace(group, completions=(" " * 8000 + group.completions[0], *group.completions[1:]))
    assert pool.offer(padded).reason == "oversized"
    wide = replace(group, completions=("é" * 40, *group.completions[1:]))  # 40 characters, 80 bytes
    assert pool.offer(wide).reason == "oversized"
    assert scored == []  # no CPU spent on them
    assert pool.offer(group).status == "pooled"


def test_local_groups_are_refused() -> None:
    pool = RolloutPool(PoolConfig(), library_rescore)
    local = replace(make_group(PEER_A), provenance=Provenance.local("seed", 1, 1))
    assert pool.offer(local).reason == "local_group"


def test_capacity_and_per_peer_share_evict_oldest() -> None:
    cfg = PoolConfig(capacity=4, max_peer_share=0.5)
    pool = RolloutPool(cfg, stub_rescore(lambda g: (0.0,) * len(g.completions)))
    for i in range(3):
        pool.offer(make_group(PEER_A, i))
    # Peer A may hold 2: its oldest (index 0) made room.
    assert [v.group.ref.index for v in pool.candidates()] == [1, 2]
    for i in range(10, 13):
        pool.offer(make_group(PEER_B, i))
    assert [(v.group.provenance.origin_peer == PEER_A, v.group.ref.index) for v in pool.candidates()] == [
        (True, 1), (True, 2), (False, 11), (False, 12)]
    third = Identity.generate().peer_id
    pool.offer(make_group(third, 20))
    assert len(pool) == 4 and pool.candidates()[0].group.ref.index == 2  # global oldest evicted
    dropped = pool.stats()["dropped"]
    assert dropped == {"evicted_peer_share": 2, "evicted_capacity": 1}


def test_age_and_policy_staleness() -> None:
    clock = Clock()
    cfg = PoolConfig(max_age_s=60.0, max_policy_lag=5)
    seen: list = []
    pool = RolloutPool(cfg, stub_rescore(lambda g: (1.0,) * len(g.completions)), clock=clock,
                       on_decision=seen.append)
    pool.offer(make_group(PEER_A, 1, policy_version=10))
    clock.now += 30
    pool.offer(make_group(PEER_B, 2, policy_version=10))
    clock.now += 31  # group 1 is now 61 s old
    assert [v.group.ref.index for v in pool.candidates()] == [2]
    # B's policy moves to version 20: its version-10 group is now stale, and so is a late old one.
    pool.offer(make_group(PEER_B, 3, policy_version=20))
    assert [v.group.ref.index for v in pool.candidates()] == [3]
    assert pool.offer(make_group(PEER_B, 4, policy_version=14)).reason == "stale_policy"
    assert pool.offer(make_group(PEER_B, 5, policy_version=15)).status == "pooled"
    assert pool.stats()["dropped"] == {"expired": 1, "stale_policy": 2}
    # Groups that left unused are told apart from groups refused on arrival (the node reports them).
    assert [(d.group.ref.index, d.reason) for d in seen if d.evicted] == [(1, "expired"), (2, "stale_policy")]
    assert [d.group.ref.index for d in seen if d.status == "dropped" and not d.evicted] == [4]


def test_mark_used_and_stats_per_peer() -> None:
    seen: list[PoolDecision] = []
    pool = RolloutPool(PoolConfig(max_uses=2), library_rescore, on_decision=seen.append)
    groups = real_groups(PEER_A, 3)
    for group in groups:
        pool.offer(group, "amber-otter")
    pool.offer(replace(groups[0], question_hash="f" * 64), "amber-otter")
    keys = [c.key for c in pool.candidates()]
    pool.mark_used(keys[:2])
    assert len(pool.candidates()) == 3
    pool.mark_used(keys[:1])
    assert len(pool.candidates()) == 2
    stats = pool.stats()
    assert (stats["received"], stats["pooled"], stats["used"]) == (4, 3, 3)
    peer = stats["per_peer"][PEER_A]
    assert peer["name"] == "amber-otter" and peer["in_pool"] == 2 and peer["dropped"] == {"forged_ref": 1}
    assert [d.status for d in seen] == ["pooled"] * 3 + ["dropped", "used", "used", "used"]
    assert pool.recent() == seen


def test_rescore_errors_are_counted_not_raised() -> None:
    def broken(group):  # type: ignore[no-untyped-def]
        raise KeyError("verifier bug")

    pool = RolloutPool(PoolConfig(), broken)
    decision = pool.offer(make_group(PEER_A))
    assert decision.status == "dropped" and decision.reason == "rescore_error: KeyError"
    assert pool.stats()["dropped"] == {"rescore_error": 1}


def test_concurrent_offers_and_reads() -> None:
    pool = RolloutPool(PoolConfig(capacity=64, max_peer_share=1.0),
                       stub_rescore(lambda g: (1.0,) * len(g.completions)))
    errors: list[BaseException] = []

    def writer(base: int) -> None:
        for i in range(300):
            pool.offer(make_group(PEER_A, base + i))

    def reader() -> None:
        deadline = time.time() + 0.5
        while time.time() < deadline:
            try:
                pool.mark_used(c.key for c in pool.candidates()[:3])
                pool.stats()
            except (RuntimeError, KeyError, ValueError, IndexError) as exc:  # a race would show here
                errors.append(exc)
                return

    threads = [threading.Thread(target=writer, args=(b,)) for b in (0, 1000)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    stats = pool.stats()
    assert stats["received"] == 600 and stats["size"] <= 64
    assert stats["pooled"] == stats["used"] + stats["size"] + sum(stats["dropped"].values())


@pytest.mark.parametrize("bad", [{"capacity": 0}, {"max_peer_share": 1.5}, {"max_age_s": float("nan")},
                                 {"max_policy_lag": -1}, {"capacity": 2.5}])
def test_config_validation(bad: dict) -> None:
    with pytest.raises(ValueError, match="PoolConfig"):
        PoolConfig(**bad)


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_rescoring_cpu_is_budgeted_per_origin_and_refills() -> None:
    """A peer whose groups are expensive to score is stopped by the CPU it spent, not by a count;
    another origin is still scored, and the credit comes back with time."""
    clock = Clock()
    costly = {PEER_A: 0.06, PEER_B: 0.0}

    def rescore(group):  # the real verifier's cost, exaggerated for one origin
        _burn(costly[group.provenance.origin_peer])
        return stub_rescore(lambda g: tuple(0.0 for _ in g.completions))(group)

    pool = RolloutPool(PoolConfig(rescore_cpu_s_per_peer=0.1, rescore_cpu_s_total=10.0), rescore, clock=clock)
    reasons = [pool.offer(make_group(PEER_A, i)).reason for i in range(6)]
    assert reasons[:2] == ["", ""] and set(reasons[2:]) == {"over_cpu_budget"}  # 0.12 s spent of 0.1
    assert pool.offer(make_group(PEER_B, 99)).status == "pooled"
    assert pool.stats()["dropped"]["over_cpu_budget"] == 4 and pool.stats()["rescore_cpu_s"] >= 0.12
    clock.now += 60.0  # a minute later the debt is paid and credit is back
    assert pool.offer(make_group(PEER_A, 10)).status == "pooled"


def test_with_the_pools_minute_spent_only_light_origins_are_scored() -> None:
    clock = Clock()
    heavy = [Identity.generate().peer_id for _ in range(4)]  # one attacker's identities

    def rescore(group):
        _burn(0.0 if group.provenance.origin_peer == PEER_B else 0.05)
        return stub_rescore(lambda g: tuple(0.0 for _ in g.completions))(group)

    pool = RolloutPool(PoolConfig(rescore_cpu_s_per_peer=0.08, rescore_cpu_s_total=0.1), rescore, clock=clock)
    for i, sybil in enumerate(heavy):  # each fresh identity gets one group in, then the total is gone
        pool.offer(make_group(sybil, i))
    assert [pool.offer(make_group(s, 10 + i)).reason for i, s in enumerate(heavy)] == ["over_cpu_budget"] * 4
    assert pool.offer(make_group(PEER_B, 99)).status == "pooled"  # an honest peer is not starved


def test_identities_behind_one_address_share_one_quota() -> None:
    """Eight identities from one host fill at most the address's share; a peer elsewhere keeps its own."""
    cfg = PoolConfig(capacity=16, max_peer_share=0.25, max_address_share=0.25)
    pool = RolloutPool(cfg, stub_rescore(lambda g: tuple(0.0 for _ in g.completions)))
    sybils = [Identity.generate().peer_id for _ in range(8)]
    for i in range(40):
        pool.offer(make_group(sybils[i % 8], i), "sybil", source="203.0.113.7")
    honest = [pool.offer(make_group(PEER_B, 100 + i), "honest", source="198.51.100.2") for i in range(4)]
    held = [v.group.provenance.origin_peer for v in pool.candidates()]
    assert sum(o in sybils for o in held) == cfg.per_source_cap == 4  # one address: 4 of 16 slots
    assert all(d.status == "pooled" for d in honest) and held.count(PEER_B) == 4
    assert pool.stats()["dropped"]["evicted_address_share"] == 36
    for i in range(8):  # through a relay or the board (no address): only the per-peer share applies
        pool.offer(make_group(sybils[i], 500 + i), "sybil")
    assert sum(o in sybils for o in (v.group.provenance.origin_peer for v in pool.candidates())) > 4


def test_a_links_source_address_is_its_host_and_relays_have_none() -> None:
    from types import SimpleNamespace

    from engine.swarm.transport import source_host

    node = SimpleNamespace(role="node")
    assert source_host(SimpleNamespace(hello=node, address="203.0.113.7:51234")) == "203.0.113.7"
    assert source_host(SimpleNamespace(hello=node, address="[2001:db8::1]:7000")) == "2001:db8::1"
    assert source_host(SimpleNamespace(hello=node, address="ws://10.0.0.5:7700")) == "10.0.0.5"
    assert source_host(SimpleNamespace(hello=SimpleNamespace(role="bootstrap"), address="ws://b:7700")) == ""
