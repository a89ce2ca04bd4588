"""Fixed-capacity numeric series for plots: appends are O(1), reads are contiguous numpy views.

Storage is twice the capacity; when the write position reaches the end, the newest `capacity` points
move to the front (amortised O(1)), so `x`/`y` are always one contiguous slice pyqtgraph can take
without a copy. `version` changes on every append so a view redraws only the curves that changed.
Beside the newest points, each ring keeps its whole series at a bounded resolution (`Buckets`): what
a plot of 100,000 rounds draws.
"""

from __future__ import annotations

import collections

import numpy as np


class Buckets:
    """A whole series at bounded resolution: the means of `width` consecutive points per bucket. When
    all `capacity` buckets are full, neighbours merge and `width` doubles, so memory and drawing stay
    bounded however long training runs, and every point ever appended still counts in one mean."""

    def __init__(self, capacity: int = 1024) -> None:
        if capacity < 2 or capacity % 2:
            raise ValueError("capacity must be an even number of at least 2")
        self.capacity = capacity
        self._x = np.zeros(capacity)  # sums per bucket
        self._y = np.zeros(capacity)
        self._n = np.zeros(capacity)  # points per bucket
        self._len = 0
        self.width = 1
        self.total = 0  # points appended

    def __len__(self) -> int:
        return self._len

    def append(self, x: float, y: float) -> None:
        if not self._len or self._n[self._len - 1] >= self.width:
            if self._len == self.capacity:
                self._merge()
            self._len += 1
        i = self._len - 1
        self._x[i] += x
        self._y[i] += y
        self._n[i] += 1
        self.total += 1

    def _merge(self) -> None:
        half = self.capacity // 2
        for arr in (self._x, self._y, self._n):
            arr[:half] = arr[0::2] + arr[1::2]
            arr[half:] = 0.0
        self._len = half
        self.width *= 2

    def means(self, max_points: int) -> tuple[np.ndarray, np.ndarray]:
        """At most `max_points` (x, y) points: runs of buckets merged into their weighted means. Means,
        not min-max envelopes: an envelope of a noisy series fills the plot with solid colour."""
        n = self._len
        if not n:
            return np.zeros(0), np.zeros(0)
        starts = np.arange(0, n, max(1, -(-n // max(1, max_points))))
        counts = np.add.reduceat(self._n[:n], starts)
        return np.add.reduceat(self._x[:n], starts) / counts, np.add.reduceat(self._y[:n], starts) / counts

    def clear(self) -> None:
        for arr in (self._x, self._y, self._n):
            arr[:] = 0.0
        self._len = self.total = 0
        self.width = 1


class Ring:
    def __init__(self, capacity: int, summary: int = 1024) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._x = np.zeros(2 * capacity)
        self._y = np.zeros(2 * capacity)
        self._start = 0
        self._end = 0
        self.version = 0
        self.summary = Buckets(summary)  # every point so far, at bounded resolution (what plots draw)

    def __len__(self) -> int:
        return self._end - self._start

    def append(self, x: float, y: float) -> None:
        if self._end == 2 * self.capacity:  # compact: keep the newest capacity - 1, then append
            keep = self.capacity - 1
            self._x[:keep] = self._x[self._end - keep:self._end]
            self._y[:keep] = self._y[self._end - keep:self._end]
            self._start, self._end = 0, keep
        self._x[self._end] = x
        self._y[self._end] = y
        self._end += 1
        if self._end - self._start > self.capacity:
            self._start += 1
        self.summary.append(x, y)
        self.version += 1

    @property
    def x(self) -> np.ndarray:
        return self._x[self._start:self._end]

    @property
    def y(self) -> np.ndarray:
        return self._y[self._start:self._end]

    def last(self) -> float | None:
        return float(self._y[self._end - 1]) if len(self) else None

    def clear(self) -> None:
        self._start = self._end = 0
        self.summary.clear()
        self.version += 1


class Window:
    """The last `size` values: running mean, min and max (what the reward band shows)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("window size must be at least 1")
        self._values: collections.deque[float] = collections.deque(maxlen=size)
        self._sum = 0.0

    def push(self, value: float) -> None:
        if len(self._values) == self._values.maxlen:
            self._sum -= self._values[0]
        self._values.append(value)
        self._sum += value

    def mean(self) -> float:
        return self._sum / len(self._values) if self._values else 0.0

    def min(self) -> float:
        return min(self._values) if self._values else 0.0

    def max(self) -> float:
        return max(self._values) if self._values else 0.0


def decimate(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most `max_points` points that keep every bucket's minimum and maximum (spikes stay visible).

    A plot is a few hundred pixels wide: drawing 5,000 points costs ~10x more than 600 for the same
    picture. Buckets of `stride` points become two points each: (x of the bucket, min), (x, max).
    """
    n = len(x)
    if n <= max_points or max_points < 4:
        return x, y
    stride = -(-n // (max_points // 2))  # ceil: buckets * 2 <= max_points
    buckets = n // stride
    head = buckets * stride
    blocks = y[n - head:].reshape(buckets, stride)  # drop the oldest remainder, keep the newest points
    xs = np.repeat(x[n - head::stride], 2)
    ys = np.empty(2 * buckets)
    ys[0::2] = blocks.min(axis=1)
    ys[1::2] = blocks.max(axis=1)
    return xs, ys
