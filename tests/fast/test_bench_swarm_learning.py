"""`sapo bench swarm-learning` end to end on the shipped seed model (the real run uses SmolLM2-135M):
every node runs the node's round step, arms are paired with solo by seed, a rerun resumes."""

from __future__ import annotations

import json
from pathlib import Path

from engine.tasks.curriculum import entry_rung
from lab.bench import swarm_curves, swarm_learning, swarm_why
from lab.bench.swarm_arm import node_specialties


def test_heterogeneous_nodes_cover_every_specialty_twice() -> None:
    four = ["a", "b", "c", "d"]
    assert node_specialties("homogeneous", 2, four) == four
    picked = [node_specialties("heterogeneous", k, four) for k in range(4)]
    assert all(len(p) == 2 for p in picked) and sorted(s for p in picked for s in p) == sorted(four * 2)


def test_equal_cpu_reads_a_curve_between_measured_points_never_beyond() -> None:
    # the start, two runs of the same length (averaged: their difference is the judge's noise), a longer one
    points = swarm_curves._merge_near(sorted([(0.0, 0.10), (300.0, 0.14), (310.0, 0.16), (700.0, 0.25)]))
    assert [(c, round(v, 9)) for c, v in points] == [(0.0, 0.10), (305.0, 0.15), (700.0, 0.25)]
    assert abs(swarm_curves.curve_at(points, 305.0) - 0.15) < 1e-12
    assert abs(swarm_curves.curve_at(points, 502.5) - 0.20) < 1e-12  # halfway between 305 and 700
    assert abs(swarm_curves.curve_at(points, 152.5) - 0.125) < 1e-12
    assert swarm_curves.curve_at(points, 710.0) is not None  # within 2% of the longest run
    assert swarm_curves.curve_at(points, 800.0) is None  # beyond it: not extrapolated
    curves = {("solo", "heterogeneous", 0): points, ("solo", "heterogeneous", 1): points}
    arm = {0: {"judged": [(502.5, 0.23)]}, 1: {"judged": [(305.0, 0.17)]}}
    out = swarm_curves.equal_cpu(arm, curves, "heterogeneous", "solo")
    assert [round(d, 6) for d in out["delta_vs_solo_equal_cpu_per_seed"]] == [0.03, 0.02]
    assert abs(out["delta_vs_solo_equal_cpu_mean"] - 0.025) < 1e-12
    assert out["delta_vs_solo_equal_cpu_at_cpu"] == [502.5, 305.0]
    # a long arm whose end lies past the curve is read at its judge before, inside the curve
    past = swarm_curves.equal_cpu({0: {"judged": [(305.0, 0.2), (750.0, 0.3)]}}, curves, "heterogeneous")
    assert past["delta_vs_solo_equal_cpu_at_cpu"] == [305.0] and abs(past["delta_vs_solo_equal_cpu_mean"] - 0.05) < 1e-9
    longer = swarm_curves.equal_cpu({0: {"judged": [(900.0, 0.3)]}}, curves, "heterogeneous")
    assert longer["delta_vs_solo_equal_cpu_per_seed"] == [None] and longer["delta_vs_solo_equal_cpu_mean"] is None
    no_curve = swarm_curves.equal_cpu(arm, curves, "heterogeneous", "question")
    assert no_curve["delta_vs_question_equal_cpu_per_seed"] == [None, None]


def test_own_groups_are_split_by_outcome_per_third_of_the_run() -> None:
    def row(mixed: int, right: int, wrong: int) -> dict[str, float]:
        return {"own_pick_groups": 1.0, "suggested_groups": 1.0, "own_pick_mixed": float(min(mixed, 1)),
                "suggested_mixed": float(max(mixed - 1, 0)), "own_all_right": float(right), "own_all_wrong": float(wrong)}
    # two nodes, six rounds: all mixed early, half all-wrong midway, all right at the end
    node = [row(2, 0, 0), row(2, 0, 0), row(1, 0, 1), row(1, 0, 1), row(0, 2, 0), row(0, 2, 0)]
    thirds = swarm_why.own_outcomes_by_third([node, node])
    assert thirds == [[1.0, 0.0, 0.0], [0.5, 0.0, 0.5], [0.0, 1.0, 0.0]]
    old = [[{k: v for k, v in r.items() if not k.startswith("own_all")} for r in node]]
    assert swarm_why.own_outcomes_by_third(old) is None  # runs made before the bench recorded it


def test_last_third_own_groups_are_counted_by_specialty_and_rung() -> None:
    entry = entry_rung("basic_arithmetic")
    early = {"own_groups": [["basic_arithmetic", entry, "mixed", "own_pick"]]}
    late = {"own_groups": [["basic_arithmetic", entry + 2, "wrong", "own_pick"],
                           ["basic_arithmetic", entry, "right", "suggested"], ["custom", -1, "mixed", "own_pick"]]}
    counts = swarm_why.last_third_by_specialty([[early, early, late], [early, early, late]])
    assert counts == {"basic_arithmetic": {"groups": 4, "mixed": 0, "right": 2, "wrong": 2, "rungs": 4},
                      "custom": {"groups": 2, "mixed": 2, "right": 0, "wrong": 0, "rungs": 0}}
    merged = swarm_why.merge_counts([counts, None, counts])  # a seed run before the bench logged groups
    assert merged is not None and merged["basic_arithmetic"]["wrong"] == 4
    assert swarm_why.last_third_by_specialty([[{"reward_mean": 0.5}]]) is None
    lines = swarm_why.specialty_outcome_lines({"arms": [{"setting": "homogeneous", "name": "solo-long",
                                                         "own_groups_by_specialty_last_third": merged}]})
    assert "| homogeneous | solo-long | basic_arithmetic | 0.00 / 0.50 / 0.50 | 8 | +1.00 |" in lines


def test_own_groups_are_counted_by_the_source_of_their_question() -> None:
    row = {"own_groups": [["a", 0, "mixed", "replay"], ["a", 0, "wrong", "own_pick"], ["b", 0, "mixed", "own_pick"]]}
    counts = swarm_why.mixed_by_source([[row, row], [row]])
    assert counts is not None and {k: (c["groups"], c["mixed"]) for k, c in counts.items()} == {"replay": (3, 3),
                                                                                              "own_pick": (6, 3)}
    merged = swarm_why.merge_counts([counts, None, counts])
    assert merged is not None and {k: (c["groups"], c["mixed"]) for k, c in merged.items()} == {"own_pick": (12, 6),
                                                                                              "replay": (6, 6)}
    lines = swarm_why.source_mixed_lines({"arms": [{"setting": "homogeneous", "name": "replay",
                                                    "mixed_by_source": merged}]})
    assert "| homogeneous | replay | 0.50 (12) | 1.00 (6) | — |" in lines


def test_swarm_learning_bench_runs_paired_arms_and_resumes(tmp_path: Path) -> None:
    opts = {"model": "seed", "nodes": 2, "rounds": 2, "seeds": [0], "arms": ["solo", "both", "replay", "solo-long"],
            "settings": ["heterogeneous"], "judge_questions": 6, "eval_k": 2, "work_dir": str(tmp_path / "w")}
    result = swarm_learning.run(out_dir=tmp_path, **opts)
    saved = json.loads((tmp_path / "swarm_learning.json").read_text())
    assert saved == json.loads(json.dumps(result))
    by = {(a["setting"], a["name"]): a for a in saved["arms"]}
    assert set(by) == {("heterogeneous", "solo"), ("heterogeneous", "both"), ("heterogeneous", "replay"),
                       ("heterogeneous", "solo-long")}
    # solo's curve: the long solo run trains 4.5x the rounds and is judged at each whole multiple too
    long_run = json.loads((tmp_path / "w" / "heterogeneous-solo-long-0.json").read_text())
    assert long_run["rounds"] == 9 and [m["round"] for m in long_run["midway"]] == [2, 4, 6, 8]
    assert by[("heterogeneous", "solo-long")]["rounds"] == 9
    assert saved["judge_questions"] == 6 and saved["judge"]["questions"] == 6  # disjoint by content
    assert by[("heterogeneous", "solo")]["delta_vs_solo_equal_cpu_per_seed"][0] is not None  # inside the curve
    for arm in (a for a in saved["arms"] if a["name"] != "solo-long"):
        for key in ("name", "setting", "seeds", "pass_at_1_after", "delta_vs_solo_mean", "delta_vs_solo_sd",
                    "mixed_fraction", "cpu_seconds", "gain_per_cpu_hour", "curve", "cpu_per_round_vs_solo",
                    "judge_excluded_seen", "delta_vs_solo_equal_cpu_ci95"):
            assert key in arm
        assert arm["seeds"] == [0] and arm["cpu_seconds"] > 0 and arm["nodes"] == 2 and arm["rounds"] == 2
        assert "delta_vs_solo_equal_cpu_mean" in arm
    for third in by[("heterogeneous", "solo-long")]["own_outcomes_by_third"][1:]:  # every own group has one outcome
        assert abs(sum(third) - 1.0) < 1e-9
    last = by[("heterogeneous", "solo-long")]["own_groups_by_specialty_last_third"]  # rounds 7-9 of 9, 2 nodes, I = 2
    assert sum(c["groups"] for c in last.values()) == 2 * 2 * 3
    assert all(c["mixed"] + c["right"] + c["wrong"] == c["groups"] for c in last.values())
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
