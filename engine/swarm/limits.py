"""Pure, clock-injected bookkeeping for the protocol: token buckets, replay windows, refusal counts.

No I/O and no wall clock of their own: callers pass `now`, so tests drive time by hand.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass


@dataclass
class TokenBucket:
    """Classic token bucket: `rate` tokens/s refill up to `burst`; a take of `cost` needs that many."""

    rate: float
    burst: float
    tokens: float
    updated: float

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> TokenBucket:
        return cls(rate, burst, burst, now)

    def take(self, now: float, cost: float = 1.0) -> bool:
        # A clock that steps backwards must not mint tokens: only refill on forward time.
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False

    def has_credit(self, now: float) -> bool:
        """Whether any token is left (for costs known only afterwards: admit, then `charge`)."""
        self.take(now, 0.0)  # refill
        return self.tokens > 0

    def charge(self, now: float, cost: float) -> None:
        """Spend `cost` measured after the fact; the debt (down to -burst) is paid off by refill."""
        self.take(now, 0.0)
        self.tokens = max(-self.burst, self.tokens - cost)


class KeyedBuckets:
    """One token bucket per key (peer id, link), LRU-bounded so memory stays flat under churn."""

    def __init__(self, rate: float, burst: float, max_keys: int) -> None:
        self.rate, self.burst, self.max_keys = rate, burst, max_keys
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def take(self, key: str, now: float, cost: float = 1.0) -> bool:
        # Forgetting a bucket refills it: acceptable, since eviction needs max_keys other senders.
        return self.bucket(key, now).take(now, cost)

    def bucket(self, key: str, now: float) -> TokenBucket:
        """The key's bucket (a new, full one for a new key), marked most recently used."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket.full(self.rate, self.burst, now)
            if len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket

    def __len__(self) -> int:
        return len(self._buckets)


class ReplayWindow:
    """Sliding-window duplicate detector for one sender's sequence numbers (as in IPsec/DTLS).

    `high` is the largest seq accepted; bit i of `mask` says whether seq `high - i` was seen.
    A seq at or below `high - size` cannot be proven new and is refused.
    """

    __slots__ = ("high", "mask", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.high = -1
        self.mask = 0

    def check_and_mark(self, seq: int) -> str | None:
        """None if new (and now marked seen); else "duplicate" or "replay_old"."""
        if seq > self.high:
            shift = seq - self.high
            self.mask = 1 if shift >= self.size else ((self.mask << shift) | 1) & ((1 << self.size) - 1)
            self.high = seq
            return None
        offset = self.high - seq
        if offset >= self.size:
            return "replay_old"
        if self.mask >> offset & 1:
            return "duplicate"
        self.mask |= 1 << offset
        return None


class ReplayGuard:
    """Replay windows for any number of senders, bounded by time rather than by count.

    A frame can be replayed only while its timestamp is acceptable (within the clock-skew window), so
    a sender must be remembered until `horizon_s` (twice that window) after its last accepted frame,
    and can be forgotten after: memory holds the senders active within the horizon, never fewer. A
    count-bounded LRU would forget a sender under a flood of identities and then accept its replays;
    here, when `max_senders` are all still within the horizon, a *new* sender is refused
    ("too_many_senders") instead: fail closed. `snapshot`/`restore` carry the state across restarts
    (each sender's highest seq; everything at or below it counts as seen after a restore).
    """

    def __init__(self, window: int, max_senders: int, horizon_s: float = 7200.0) -> None:
        self.window, self.max_senders, self.horizon_s = window, max_senders, horizon_s
        self._windows: OrderedDict[str, ReplayWindow] = OrderedDict()
        self._seen_at: dict[str, float] = {}  # sender -> last accepted (receiver's clock)

    def _expire(self, now: float) -> None:
        while self._windows:
            sender = next(iter(self._windows))
            if now - self._seen_at[sender] <= self.horizon_s:
                return
            del self._windows[sender]
            del self._seen_at[sender]

    def check_and_mark(self, sender: str, seq: int, now: float = 0.0) -> str | None:
        self._expire(now)
        win = self._windows.get(sender)
        if win is None:
            if len(self._windows) >= self.max_senders:
                return "too_many_senders"
            win = self._windows[sender] = ReplayWindow(self.window)
            self._seen_at[sender] = now
        verdict = win.check_and_mark(seq)
        if verdict is None:
            self._windows.move_to_end(sender)
            self._seen_at[sender] = max(now, self._seen_at.get(sender, now))
        return verdict

    def snapshot(self) -> dict[str, list[float]]:
        """{sender: [highest seq, last seen]} (what a restart must not forget)."""
        return {s: [w.high, self._seen_at[s]] for s, w in self._windows.items() if w.high >= 0}

    def restore(self, data: object, now: float) -> int:
        """Load a snapshot (untrusted file contents: bad entries are skipped) -> senders restored."""
        if not isinstance(data, dict):
            return 0
        entries = []
        for sender, value in data.items():
            if (isinstance(sender, str) and len(sender) <= 64 and isinstance(value, list) and len(value) == 2
                    and isinstance(value[0], int) and not isinstance(value[0], bool) and value[0] >= 0
                    and isinstance(value[1], (int, float)) and not isinstance(value[1], bool)
                    and now - self.horizon_s < value[1] <= now + 60):
                entries.append((float(value[1]), sender, value[0]))
        restored = 0
        for seen_at, sender, high in sorted(entries)[-self.max_senders:]:  # oldest first: LRU order
            win = ReplayWindow(self.window)
            win.high, win.mask = high, (1 << self.window) - 1  # everything up to `high` counts as seen
            self._windows[sender], self._seen_at[sender] = win, seen_at
            self._windows.move_to_end(sender)
            restored += 1
        while len(self._windows) > self.max_senders:
            old, _ = self._windows.popitem(last=False)
            self._seen_at.pop(old, None)
        return restored

    def __len__(self) -> int:
        return len(self._windows)


class RefusalCounter:
    """Counts refusals by reason, overall and per sender (sender count bounded)."""

    def __init__(self, max_senders: int = 1024) -> None:
        self.by_reason: Counter[str] = Counter()
        self.by_sender: OrderedDict[str, Counter[str]] = OrderedDict()
        self.max_senders = max_senders

    def add(self, reason: str, sender: str = "") -> None:
        self.by_reason[reason] += 1
        if sender:
            counts = self.by_sender.setdefault(sender, Counter())
            self.by_sender.move_to_end(sender)
            counts[reason] += 1
            if len(self.by_sender) > self.max_senders:
                self.by_sender.popitem(last=False)

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())

    def snapshot(self) -> dict[str, int]:
        return dict(sorted(self.by_reason.items()))
