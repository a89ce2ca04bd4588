"""The swarm-scale bench: its growth-law fit on hand-built points, and a tiny real run of both arms
(a real nats-server with credentials, a real bootstrap relay, real signed frames)."""

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
    assert relay["frames_per_node_round"] == 2 and relay["lost"] == 0
    assert board["ingress_bytes_per_node_round"] > 2 * 20_000  # two paper-sized frames came in
    saved = json.loads((tmp_path / "swarm_scale.json").read_text())
    assert {p["backend"] for p in saved["points"]} == {"board", "relay"}
    assert "Growth law" in (tmp_path / "swarm_scale.md").read_text()
