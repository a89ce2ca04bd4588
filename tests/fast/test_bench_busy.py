"""`sapo bench busy` end to end, tiny: the seed model, one round and a 4-question judge per case, quiet
and beside one competitor, old and new settings (the real run uses SmolLM2-135M). Checks what each
engine asked of the OS and which threads it ran, never how fast."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lab.bench import BENCHES, busy


def test_busy_bench_runs_the_governor_and_its_fixed_references_and_writes_the_issue_keys(tmp_path: Path) -> None:
    result = busy.run(out_dir=tmp_path, model="seed", settings=["old", "new", "fixed-1"], competitors=[0, 1],
                      bursty=(0.5, 0.5), rounds=1, judge_per_specialty=1, eval_k=2, cap_s=6.0, baseline_s=2.0,
                      unit_steps=50_000)
    saved = json.loads((tmp_path / "busy.json").read_text())
    assert saved["cases"] == json.loads(json.dumps(result["cases"]))
    assert [(c["settings"], c["competitors"], bool(c["bursty"])) for c in saved["cases"]] == [
        ("old", 0, False), ("old", 1, False), ("old", 1, True), ("new", 0, False), ("new", 1, False),
        ("new", 1, True), ("fixed-1", 0, False)]  # a fixed count is a quiet reference only
    cores = saved["cores"]
    for case in saved["cases"]:
        assert {"threads", "round_s", "judge_s", "free_capacity_cores", "ratio_to_free_capacity",
                "ratio_to_best_fixed_idle", "owner_slowdown"} <= set(case)
        assert case["threads"]
        expected_free = cores - case["competitors"] * (0.5 if case["bursty"] else 1.0)
        assert case["free_capacity_cores"] == expected_free
        if case["competitors"] == 0:
            assert case["owner_slowdown"] is None and not case["censored"]
            assert case["ratio_to_best_fixed_idle"] is not None  # fixed-1 is the best (only) fixed count
    fixed = next(c for c in saved["cases"] if c["settings"] == "fixed-1")
    if cores == 2:  # one core free beside one steady competitor: fixed-1's quiet time is the reference
        one = next(c for c in saved["cases"] if c["settings"] == "new" and c["competitors"] == 1 and not c["bursty"])
        assert one["free_capacity_round_s"] == fixed["round_s"]
    assert saved["best_fixed_idle"] == {"threads": 1, "round_s": fixed["round_s"]}
    assert "doctor_estimate_ratio" in saved
    old, new = saved["engines"]["old"], saved["engines"]["new"]
    assert old["priority"] == "nice 15" and old["wait_policy"] == "(libgomp default)"
    assert new["wait_policy"] == "PASSIVE"
    if sys.platform.startswith("linux"):  # every thread of the engine, not only its main one
        assert new["priority"].startswith("SCHED_IDLE") and new["priority_now"] == "SCHED_IDLE"
        assert new["threads_now"] and all(t.startswith("SCHED_IDLE/") for t in new["threads_now"])
        assert old["threads_now"] == ["SCHED_OTHER/15"]
    doctor_new = saved["doctor"]["new"]
    assert doctor_new["source"] == "probed" and doctor_new["probe_seconds"] > 0  # a fresh machine's doctor probes
    assert doctor_new["catalog_round_seconds"] > 0 and "catalog_ratio" in doctor_new
    lent = doctor_new["threads"]
    assert lent == saved["physical_cores"]  # automatic lends every core: the governor keeps them free
    for case in saved["cases"]:
        if case["settings"] != "new":
            fixed_count = 2 if case["settings"] == "old" else 1
            assert set(case["threads"]) == {fixed_count} and case["others_busy_seen"] == [None] * len(case["threads"])
        else:  # the governor's choice: within the cores lent, from the load it measured
            low, high = case["threads_range"]
            assert 1 <= low <= high <= lent and all(b >= 0 for b in case["others_busy_seen"])
    assert set(saved["owner_unit_s_alone"]) == {"1"}
    assert set(saved["targets"]) >= {"idle_over", "free_capacity_over", "owner_slowed_more", "doctor_within"}
    text = (tmp_path / "busy.md").read_text()
    assert "| new | 1, 0.5 s on / 0.5 s off |" in text and "| fixed-1 | quiet |" in text
    assert (tmp_path / "busy.png").stat().st_size > 10_000
    assert BENCHES["busy"] == "lab.bench.busy"
