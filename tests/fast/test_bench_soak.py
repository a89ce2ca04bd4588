"""The soak bench's arithmetic on hand-built series, and a short real soak (node + 2 peers + bootstrap)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.bench import soak, soak_stats


def test_slope_and_its_error_on_a_known_line() -> None:
    ts = [i / 10 for i in range(50)]
    assert soak_stats.fit_slope(ts, [3.0 + 2.0 * t for t in ts]) == pytest.approx(2.0)
    assert soak_stats.slope_se(ts, [3.0 + 2.0 * t for t in ts]) == pytest.approx(0.0, abs=1e-9)
    noisy = [3.0 + (1 if i % 2 else -1) for i in range(50)]
    assert soak_stats.fit_slope(ts, noisy) == pytest.approx(0.0, abs=0.2)
    assert soak_stats.slope_se(ts, noisy) > 0
    assert soak_stats.slope_se(ts[:2], noisy[:2]) is None


def test_floors_ignore_the_sawtooth_and_follow_a_leak() -> None:
    ts = [i / 100 for i in range(300)]  # 3 h, a sample every 36 s
    breathing = [500 + (40 if i % 3 else 0) for i in range(300)]  # +40 MiB spikes, flat floor
    t, v = soak_stats.floors(ts, breathing, 0.25)
    assert len(t) == 12 and set(v) == {500}
    leaking = [b + 5 * x for b, x in zip(breathing, ts)]  # 5 MiB/h under the same spikes
    t, v = soak_stats.floors(ts, leaking, 0.25)
    assert soak_stats.fit_slope(t, v) == pytest.approx(5.0, abs=0.3)


def test_theil_sen_ignores_one_dipped_window_but_not_a_steady_leak() -> None:
    t = [(12.5 + 5 * i) / 60 for i in range(22)]  # 22 floors of 5-min windows after a 10-min warm-up
    dipped = [481.2, 475.6] + [482.9] * 20  # flat, but for one low window just after the warm-up
    assert soak_stats.fit_slope(t, dipped) > 1.0  # least squares reads the dip as +1.2 MiB/h of growth
    slope, low, high = soak_stats.theil_sen(t, dipped)
    assert slope == pytest.approx(0.0) and low <= slope <= high
    leak = [480 + 3.0 * x + (0.4 if i % 2 else -0.4) for i, x in enumerate(t)]  # 3 MiB/h under noise
    slope, low, high = soak_stats.theil_sen(t, leak)
    assert slope == pytest.approx(3.0, abs=0.5) and low > 1.0  # a leak is not explained away
    assert soak_stats.theil_sen(t[:2], leak[:2]) is None


def test_the_judged_slope_is_the_robust_one_with_least_squares_beside_it() -> None:
    samples = [{"t_s": 30.0 * i, "rss_mib": 480.0 - 6.0 * (40 <= i < 50), "fds": 12, "threads": 5,
                "store_mib": 1.0, "round": i, "pool_size": 10, "state": "in_swarm"} for i in range(240)]
    result = soak.summarize(samples, 120.0, 10.0, "seed")  # one 5-min window 6 MiB low, else flat
    assert result["rss_slope_method"].startswith("theil-sen")
    assert result["rss_slope_mib_per_hour"] == pytest.approx(0.0) and result["target_met"]
    assert result["rss_slope_least_squares_mib_per_hour"] > 0.5
    assert "Theil-Sen" in soak.table(result) and "least squares" in soak.table(result)


def test_summary_flags_growth_in_descriptors() -> None:
    samples = [{"t_s": 60.0 * i, "rss_mib": 400.0, "fds": 12 + (i >= 50), "threads": 5, "store_mib": 1.0,
                "round": i, "pool_size": 10, "state": "in_swarm"} for i in range(60)]
    result = soak.summarize(samples, minutes=60, warmup_minutes=5, model="seed")
    assert result["fd_growth"] == 1 and result["thread_growth"] == 0
    assert result["rss_slope_mib_per_hour"] == pytest.approx(0.0) and not result["target_met"]
    flat = [dict(s, fds=12) for s in samples]
    assert soak.summarize(flat, minutes=60, warmup_minutes=5, model="seed")["target_met"]


def test_a_node_that_lost_its_board_fails_the_soak() -> None:
    """Memory flat, but the board gone for the second half (as when its credential expired unrenewed):
    not the node the soak means to measure."""
    samples = [{"t_s": 60.0 * i, "rss_mib": 400.0, "fds": 12, "threads": 5, "store_mib": 1.0, "round": i,
                "pool_size": 10, "state": "in_swarm", "board_connected": i < 30, "board_put_errors": max(0, i - 30)}
               for i in range(60)]
    result = soak.summarize(samples, minutes=60, warmup_minutes=5, model="seed")
    assert result["board_connected_share"] == pytest.approx(25 / 55) and result["board_put_errors"] == 29
    assert not result["target_met"] and "on its board" in soak.table(result)
    healed = [dict(s, board_connected=True, board_put_errors=0) for s in samples]
    assert soak.summarize(healed, minutes=60, warmup_minutes=5, model="seed")["target_met"]


def test_resident_memory_splits_into_heap_anonymous_and_file_pages() -> None:
    import os

    parts = soak.rss_parts(os.getpid())
    if parts is None:
        pytest.skip("no /proc/<pid>/smaps here")
    assert set(parts) == {"heap", "anon", "file"} and parts["file"] > 1  # the interpreter's own libraries
    block = bytearray(64 << 20)  # 64 MiB, mmapped: anonymous, not the main arena
    block[::4096] = b"x" * len(block[::4096])  # touched, so resident
    grown = soak.rss_parts(os.getpid())
    assert grown is not None and grown["anon"] - parts["anon"] > 50
    rss_mib = int(Path(f"/proc/{os.getpid()}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    assert sum(grown.values()) == pytest.approx(rss_mib, rel=0.1)
    del block


@pytest.mark.timeout(240)
def test_a_short_soak_samples_a_live_node(tmp_path: Path) -> None:
    result = soak.run(out_dir=tmp_path, minutes=0.9, warmup_minutes=0.3, sample_every_s=3.0, nice=0)
    assert not result["crashed"]
    samples = result["samples"]
    assert len(samples) >= 10 and all(s["rss_mib"] > 50 and s["threads"] >= 1 for s in samples)
    assert samples[-1]["round"] > samples[0]["round"]  # the node trains while it is watched
    assert any(s["pool_size"] for s in samples)  # and pools its peers' groups
    assert samples[-1]["board_connected"] is True  # through the bootstrap's board
    saved = json.loads((tmp_path / "soak.json").read_text())
    assert saved["rss_slope_mib_per_hour"] == result["rss_slope_mib_per_hour"]
    assert (tmp_path / "soak.png").stat().st_size > 1000 and "RSS slope" in (tmp_path / "soak.md").read_text()
    assert all(s["rss_heap_part_mib"] is not None for s in samples) and "anon" in result["rss_part_slopes_mib_per_hour"]


def test_traced_growth_is_named_by_the_engine_line_that_allocated_it(tmp_path: Path) -> None:
    import tracemalloc

    from engine.swarm.receipts import ReceiptBook, ReceiptConfig
    from lab.bench import soak_trace

    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start(soak_trace.FRAMES)
    try:
        book = ReceiptBook(ReceiptConfig(remember_published=1 << 16), "me")
        soak_trace._snapshot_to(tmp_path / "first.snap")
        book.published([f"{i:064x}" for i in range(20_000)])  # ~20,000 keys held by the book
        soak_trace._snapshot_to(tmp_path / "latest.snap")
    finally:
        if started:
            tracemalloc.stop()
    top = soak_trace.growth(tmp_path / "first.snap", tmp_path / "latest.snap", top=3)
    assert top[0]["where"].startswith("engine/swarm/receipts.py:") and top[0]["grew_kib"] > 1000, top
    with pytest.raises(SystemExit, match="usage"):
        soak_trace.main([str(tmp_path), "60", "60"])
