"""`sapo bench swarm-learning` end to end on the shipped seed model (the real run uses SmolLM2-135M):
every node runs the node's round step, arms are paired with solo by seed, a rerun resumes."""

from __future__ import annotations

import json
from pathlib import Path

from lab.bench import swarm_learning
from lab.bench.swarm_arm import node_specialties


def test_heterogeneous_nodes_cover_every_specialty_twice() -> None:
    four = ["a", "b", "c", "d"]
    assert node_specialties("homogeneous", 2, four) == four
    picked = [node_specialties("heterogeneous", k, four) for k in range(4)]
    assert all(len(p) == 2 for p in picked) and sorted(s for p in picked for s in p) == sorted(four * 2)


def test_swarm_learning_bench_runs_paired_arms_and_resumes(tmp_path: Path) -> None:
    opts = {"model": "seed", "nodes": 2, "rounds": 2, "seeds": [0], "arms": ["solo", "both"],
            "settings": ["heterogeneous"], "judge_per_specialty": 1, "eval_k": 2, "work_dir": str(tmp_path / "w")}
    result = swarm_learning.run(out_dir=tmp_path, **opts)
    saved = json.loads((tmp_path / "swarm_learning.json").read_text())
    assert saved == json.loads(json.dumps(result))
    by = {(a["setting"], a["name"]): a for a in saved["arms"]}
    assert set(by) == {("heterogeneous", "solo"), ("heterogeneous", "both")}
    for arm in saved["arms"]:
        for key in ("name", "setting", "seeds", "pass_at_1_after", "delta_vs_solo_mean", "delta_vs_solo_sd",
                    "mixed_fraction", "cpu_seconds", "gain_per_cpu_hour"):
            assert key in arm
        assert arm["seeds"] == [0] and arm["cpu_seconds"] > 0 and arm["nodes"] == 2 and arm["rounds"] == 2
    assert by[("heterogeneous", "solo")]["delta_vs_solo_mean"] == 0.0
    both = by[("heterogeneous", "both")]
    assert both["delta_vs_solo_per_seed"] == [both["pass_at_1_after"][0] - by[("heterogeneous", "solo")]
                                              ["pass_at_1_after"][0]]
    assert both["sources"]["own_pick_groups"] + both["sources"]["suggested_groups"] == 2 * 2  # I = 2, 2 rounds
    assert by[("heterogeneous", "solo")]["sources"]["peer_text_groups"] == 0
    assert "| heterogeneous | both |" in (tmp_path / "swarm_learning.md").read_text()
    # a rerun finds every arm done: nothing is trained again, the result is the same
    stamp = (tmp_path / "w" / "heterogeneous-both-0.json").stat().st_mtime
    again = swarm_learning.run(out_dir=tmp_path, **opts)
    assert (tmp_path / "w" / "heterogeneous-both-0.json").stat().st_mtime == stamp
    assert again["arms"] == result["arms"]
