"""The swarm-scale bench: its growth-law fit on hand-built points, a tiny real run of both arms
(a real nats-server with credentials, a real bootstrap relay, real signed frames), and a tiny shaped
case (each node's board connection through its own 100 ms link of the shaping proxy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.bench import swarm_scale


def test_growth_law_recovers_a_power() -> None:
    points = [{"n": n, "ingress_bytes_per_node_round": 7.0 * n ** 1.5} for n in (10, 100, 1000)]
    law = swarm_scale.growth_law(points)
    assert law["b"] == pytest.approx(1.5) and law["a"] == pytest.approx(7.0)
    flat = [{"n": n, "ingress_bytes_per_node_round": 90_000.0} for n in (10, 1000)]
    assert swarm_scale.growth_law(flat)["b"] == pytest.approx(0.0)


@pytest.mark.timeout(180)
def test_a_tiny_run_of_both_arms(tmp_path: Path) -> None:
    result = swarm_scale.run(out_dir=tmp_path, board_ns=[3], relay_ns=[3], rounds=2, period_s=1.0, workers=1)
    board = next(p for p in result["points"] if p["backend"] == "board")
    relay = next(p for p in result["points"] if p["backend"] == "relay")
    # Board: J = 4 asked, 2 others exist; relay: everyone's frame (2 others) each round.
    assert board["frames_per_node_round"] == 2 and board["lost"] == 0 and board["fetch_p99_ms"] is not None
    assert board["rtt_ms"] is None and relay["rtt_ms"] is None  # loopback, no proxy
    assert relay["frames_per_node_round"] == 2 and relay["lost"] == 0
    assert board["ingress_bytes_per_node_round"] > 2 * 20_000  # two paper-sized frames came in
    saved = json.loads((tmp_path / "swarm_scale.json").read_text())
    assert {p["backend"] for p in saved["points"]} == {"board", "relay"}
    assert "Growth law" in (tmp_path / "swarm_scale.md").read_text()


@pytest.mark.timeout(120)
def test_a_tiny_shaped_run_reports_rtt_fetch_and_groups_in_time(tmp_path: Path) -> None:
    result = swarm_scale.run(out_dir=tmp_path, board_ns=[], relay_ns=[], shaped_ns=[6], rtt_ms=[100],
                             stalls=0.01, uplink_mbit=5.0, rounds=2, period_s=3.0, workers=1)
    (point,) = result["points"]
    assert {"rtt_ms", "fetch_p50_ms", "fetch_p99_ms", "groups_in_time_fraction", "exchange_p50_ms",
            "ingress_bytes_per_node_round", "lost", "server_rss_mib"} <= set(point)
    assert point["rtt_ms"] == 100 and point["stalls"] == 0.01 and point["uplink_mbit"] == 5.0
    assert point["frames_per_node_round"] == 4 and point["lost"] == 0 and point["link_refused"] == 0
    # One direct get is at least one round trip; the exchange (put + extent + J gets) several.
    assert 95 <= point["fetch_p50_ms"] <= point["fetch_p99_ms"] < 5000
    assert point["exchange_p50_ms"] >= 3 * 95
    assert 0.5 <= point["groups_in_time_fraction"] <= 1.0  # a 3 s round leaves room for a ~1 s exchange
    assert result["growth_law"] == {} and result["targets"]["shaped"][0]["rtt_ms"] == 100
    assert "Shaped links" in (tmp_path / "swarm_scale.md").read_text()
