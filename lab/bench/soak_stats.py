"""The soak's slopes (lab/bench/soak.py): least squares with its standard error, Theil-Sen with Sen's
interval, and the floor of each window that they are fitted to."""

from __future__ import annotations


def fit_slope(ts_h: list[float], values: list[float]) -> float:
    """Least-squares slope of values over time (units per hour); 0 with fewer than 2 points."""
    n = len(ts_h)
    if n < 2:
        return 0.0
    mt, mv = sum(ts_h) / n, sum(values) / n
    var = sum((t - mt) ** 2 for t in ts_h)
    return sum((t - mt) * (v - mv) for t, v in zip(ts_h, values)) / var if var > 0 else 0.0


def slope_se(ts_h: list[float], values: list[float]) -> float | None:
    """Standard error of that slope (per hour): how far sample noise alone moves it."""
    n = len(ts_h)
    if n < 3:
        return None
    b = fit_slope(ts_h, values)
    mt, mv = sum(ts_h) / n, sum(values) / n
    resid = sum((v - mv - b * (t - mt)) ** 2 for t, v in zip(ts_h, values))
    var = sum((t - mt) ** 2 for t in ts_h)
    return (resid / (n - 2) / var) ** 0.5 if var > 0 else None


def theil_sen(ts_h: list[float], values: list[float]) -> tuple[float, float, float] | None:
    """Theil-Sen slope (units per hour) and Sen's 95% interval: (slope, low, high); None with fewer
    than 3 points. The interval ignores ties, so it is a little wider than it need be."""
    n = len(ts_h)
    if n < 3:
        return None
    slopes = sorted((values[j] - values[i]) / (ts_h[j] - ts_h[i])
                    for i in range(n) for j in range(i + 1, n) if ts_h[j] != ts_h[i])
    if not slopes:
        return None
    count, mid = len(slopes), len(slopes) // 2
    median = slopes[mid] if count % 2 else (slopes[mid - 1] + slopes[mid]) / 2
    spread = 1.96 * (n * (n - 1) * (2 * n + 5) / 18) ** 0.5  # Kendall's S under no trend
    low = slopes[max(0, round((count - spread) / 2) - 1)]
    high = slopes[min(count - 1, round((count + spread) / 2))]
    return median, low, high


def floors(ts_h: list[float], values: list[float], window_h: float) -> tuple[list[float], list[float]]:
    """The lowest value in each `window_h` window (at the window's middle): RSS breathes by tens of
    MiB within a round (activations, batches); a leak lifts the floor."""
    if not ts_h:
        return [], []
    out_t, out_v, start = [], [], ts_h[0]
    while start <= ts_h[-1]:
        chunk = [v for t, v in zip(ts_h, values) if start <= t < start + window_h]
        if chunk:
            out_t.append(start + window_h / 2)
            out_v.append(min(chunk))
        start += window_h
    return out_t, out_v
