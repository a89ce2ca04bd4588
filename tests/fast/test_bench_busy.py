"""`sapo bench busy` end to end, tiny: the seed model, one round and a 4-question judge per case, quiet
and beside one competitor, old and new settings (the real run uses SmolLM2-135M). Checks what each
engine asked of the OS and which threads it ran, never how fast."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lab.bench import BENCHES, busy


def test_busy_bench_runs_old_and_new_settings_and_writes_the_issue_keys(tmp_path: Path) -> None:
    result = busy.run(out_dir=tmp_path, model="seed", settings=["old", "new"], competitors=[0, 1], rounds=1,
                      judge_per_specialty=1, eval_k=2, cap_s=6.0, baseline_s=1.0, unit_steps=50_000)
    saved = json.loads((tmp_path / "busy.json").read_text())
    assert saved["cases"] == json.loads(json.dumps(result["cases"]))
    assert [(c["settings"], c["competitors"]) for c in saved["cases"]] == [("old", 0), ("old", 1), ("new", 0),
                                                                           ("new", 1)]
    for case in saved["cases"]:
        assert {"competitors", "settings", "round_s", "judge_s", "ratio_to_fair_share", "owner_slowdown"} <= set(case)
        assert case["threads"] and case["fair_share_cores"] > 0
        if case["competitors"] == 0:
            assert case["owner_slowdown"] is None and not case["censored"]
            assert case["ratio_to_fair_share"]["round"] == 1.0  # the quiet case is its own reference
    old, new = saved["engines"]["old"], saved["engines"]["new"]
    assert old["priority"] == "nice 15" and old["wait_policy"] == "(libgomp default)"
    assert new["wait_policy"] == "PASSIVE"
    if sys.platform.startswith("linux"):  # every thread of the engine, not only its main one
        assert new["priority"].startswith("SCHED_IDLE") and new["priority_now"] == "SCHED_IDLE"
        assert new["threads_now"] and all(t.startswith("SCHED_IDLE/") for t in new["threads_now"])
        assert old["threads_now"] == ["SCHED_OTHER/15"]
    lent = saved["doctor"]["new"]["threads"]
    for case in saved["cases"]:
        if case["settings"] == "old":
            assert set(case["threads"]) == {2} and case["others_busy_seen"] == [None] * len(case["threads"])
        else:  # the node's own choice: within the cores lent, from the load it measured
            assert all(1 <= t <= lent for t in case["threads"]) and all(b >= 0 for b in case["others_busy_seen"])
    assert set(saved["owner_unit_s_alone"]) == {"1"}
    assert set(saved["targets"]) >= {"over_fair_share", "owner_slowed_more", "doctor_off"}
    assert "| old | 1 |" in (tmp_path / "busy.md").read_text()
    assert (tmp_path / "busy.png").stat().st_size > 10_000
    assert BENCHES["busy"] == "lab.bench.busy"
