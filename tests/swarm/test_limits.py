"""Token buckets, replay windows and refusal counters, driven by a hand-held clock."""

from __future__ import annotations

import pytest

from engine.swarm.limits import KeyedBuckets, RefusalCounter, ReplayGuard, ReplayWindow, TokenBucket


def test_token_bucket_burst_then_refill() -> None:
    bucket = TokenBucket.full(rate=2.0, burst=3.0, now=100.0)
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(100.5)  # 0.5 s * 2/s = one token
    assert not bucket.take(100.5)
    assert bucket.take(200.0) and bucket.tokens == pytest.approx(2.0)  # capped at burst


def test_token_bucket_ignores_a_clock_stepping_back() -> None:
    bucket = TokenBucket.full(rate=4.0, burst=1.0, now=100.0)  # binary fractions: exact arithmetic
    assert bucket.take(100.0)
    assert not bucket.take(50.0)  # going back in time must not mint tokens
    assert not bucket.take(100.125)  # half a token accrued since 100.0
    assert bucket.take(100.25)


def test_keyed_buckets_are_independent_and_bounded() -> None:
    buckets = KeyedBuckets(rate=1.0, burst=1.0, max_keys=2)
    assert buckets.take("a", 0.0) and not buckets.take("a", 0.0)
    assert buckets.take("b", 0.0)
    assert buckets.take("c", 0.0)
    assert len(buckets) == 2  # "a" evicted (least recently used)


def test_replay_window_accepts_each_seq_once() -> None:
    win = ReplayWindow(size=4)
    assert win.check_and_mark(10) is None
    assert win.check_and_mark(10) == "duplicate"
    assert win.check_and_mark(8) is None  # late, but inside the window
    assert win.check_and_mark(8) == "duplicate"
    assert win.check_and_mark(6) == "replay_old"  # 10 - 6 >= 4
    assert win.check_and_mark(12) is None
    assert win.check_and_mark(10) == "duplicate"  # remembered across the slide
    assert win.check_and_mark(9) is None
    assert win.check_and_mark(100) is None  # a big jump clears the window
    assert win.check_and_mark(12) == "replay_old"
    assert win.check_and_mark(99) is None


def test_replay_window_matches_a_set_model() -> None:
    import random

    rng = random.Random(5)
    size = 16
    win = ReplayWindow(size)
    seen: set[int] = set()
    high = -1
    for _ in range(3000):
        seq = max(0, high + rng.randint(-20, 5))
        got = win.check_and_mark(seq)
        if seq > high:
            expected = None
        elif high - seq >= size:
            expected = "replay_old"
        else:
            expected = "duplicate" if seq in seen else None
        assert got == expected, (seq, high)
        if expected is None:
            seen.add(seq)
            high = max(high, seq)


def test_replay_guard_per_sender() -> None:
    guard = ReplayGuard(window=8, max_senders=2, horizon_s=100)
    assert guard.check_and_mark("a", 5, now=0) is None
    assert guard.check_and_mark("b", 5, now=0) is None
    assert guard.check_and_mark("a", 5, now=1) == "duplicate"
    # Both slots hold senders active within the horizon: a third is refused, nobody is forgotten.
    assert guard.check_and_mark("c", 1, now=50) == "too_many_senders" and len(guard) == 2
    assert guard.check_and_mark("a", 5, now=99) == "duplicate"  # still remembered
    assert guard.check_and_mark("a", 6, now=99) is None  # a new frame from a: remembered from now
    # b (last accepted at 0) is past the horizon: its frames are stale anyway, and its slot is free.
    assert guard.check_and_mark("c", 1, now=101) is None
    assert guard.check_and_mark("d", 1, now=101) == "too_many_senders"  # a (at 99) and c hold both


def test_a_flood_of_identities_does_not_make_an_old_frame_new() -> None:
    """The old LRU of 8,192 senders forgot alice after 8,192 others and accepted her replay."""
    guard = ReplayGuard(window=64, max_senders=100_000, horizon_s=7200)
    assert guard.check_and_mark("alice", 42, now=0) is None
    for i in range(20_000):
        guard.check_and_mark(f"sybil{i}", 1, now=1 + i / 1000)
    assert guard.check_and_mark("alice", 42, now=30) == "duplicate"


def test_replay_state_survives_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from engine.swarm import replay_state

    guard = ReplayGuard(window=64, max_senders=10, horizon_s=100)
    guard.check_and_mark("alice", 40, now=1000)
    guard.check_and_mark("alice", 42, now=1001)
    replay_state.save(tmp_path / "r.json", guard)
    fresh = ReplayGuard(window=64, max_senders=10, horizon_s=100)
    assert replay_state.load(tmp_path / "r.json", fresh, now=1010) == 1
    assert fresh.check_and_mark("alice", 41, now=1011) == "duplicate"  # at or below the floor: seen
    assert fresh.check_and_mark("alice", 43, now=1011) is None
    assert replay_state.load(tmp_path / "r.json", ReplayGuard(64, 10, 100), now=5000) == 0  # expired
    (tmp_path / "bad.json").write_text('{"x": [1], "y": ["a", 1], "z": [-1, 1000], "w": [true, 1000]')
    assert replay_state.load(tmp_path / "bad.json", ReplayGuard(64, 10, 100), now=1000) == 0
    (tmp_path / "bad.json").write_text('{"x": [1], "y": ["a", 1], "z": [-1, 1000], "ok": [7, 1000]}')
    assert replay_state.load(tmp_path / "bad.json", ReplayGuard(64, 10, 100), now=1000) == 1


def test_refusal_counter() -> None:
    counter = RefusalCounter(max_senders=1)
    counter.add("bad_signature", "x")
    counter.add("bad_signature")
    counter.add("stale", "y")
    assert counter.snapshot() == {"bad_signature": 2, "stale": 1}
    assert counter.total == 3 and list(counter.by_sender) == ["y"]


def test_a_restarted_service_refuses_the_frames_it_took_before(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two real SwarmService lifetimes with one state file: a frame opened in the first is a
    duplicate in the second (the node's data dir holds replay-guard.json)."""
    import asyncio

    from swarm_helpers import make_group, swarm_config

    from engine.swarm.config import ProtocolLimits
    from engine.swarm.errors import ProtocolError
    from engine.swarm.identity import Identity
    from engine.swarm.pool import PoolConfig, RolloutPool
    from engine.swarm.protocol import SwarmProtocol
    from engine.swarm.service import SwarmService

    alice = SwarmProtocol(Identity.generate(), ProtocolLimits())
    (frame,) = alice.encode_rollouts([make_group(alice.identity.peer_id)])
    me, state = Identity.generate(), tmp_path / "replay-guard.json"

    async def lifetime() -> str | None:
        service = SwarmService(me, swarm_config(listen=False), RolloutPool(PoolConfig(), lambda g: g), {},
                               lambda e: None, replay_state=state)
        await service.start()
        try:
            service.protocol.open(frame)
            return None
        except ProtocolError as exc:
            return exc.reason
        finally:
            await service.stop()

    assert asyncio.run(lifetime()) is None
    assert state.is_file()
    assert asyncio.run(lifetime()) == "duplicate"
