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
    guard = ReplayGuard(window=8, max_senders=2)
    assert guard.check_and_mark("a", 5) is None
    assert guard.check_and_mark("b", 5) is None
    assert guard.check_and_mark("a", 5) == "duplicate"
    guard.check_and_mark("c", 1)
    assert len(guard) == 2


def test_refusal_counter() -> None:
    counter = RefusalCounter(max_senders=1)
    counter.add("bad_signature", "x")
    counter.add("bad_signature")
    counter.add("stale", "y")
    assert counter.snapshot() == {"bad_signature": 2, "stale": 1}
    assert counter.total == 3 and list(counter.by_sender) == ["y"]
