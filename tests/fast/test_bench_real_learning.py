"""`sapo bench real-learning` end to end on the shipped seed model (the real run uses SmolLM2-135M)."""

from __future__ import annotations

import json
from pathlib import Path

from lab.bench import real_learning


def test_real_learning_bench_runs_both_arms_and_writes_the_issue_keys(tmp_path: Path) -> None:
    result = real_learning.run(out_dir=tmp_path, model="seed", rounds=2, judge_per_specialty=2, rl_per_specialty=1,
                               eval_k=2, eval_repeats=2, seed_peers=1, external=1,
                               arms=["solo", "mixed", "plain"], variants={"plain": {"format_reward": 0.0}})
    saved = json.loads((tmp_path / "real_learning.json").read_text())
    for key in ("model", "judge_questions", "eval_sd", "mixed_group_fraction", "rounds", "minutes"):
        assert key in saved
    for when in ("before", "after"):
        assert set(saved[when]) >= {"pass_at_1", "format_rate", "accuracy_formatted"}
        assert 0.0 <= saved[when]["pass_at_1"] <= saved[when]["format_rate"] <= 1.0
    assert saved["judge_questions"] == 2 * len(real_learning.SPECIALTIES) and saved["rounds"] == 2
    assert set(saved["arms"]) == {"solo", "mixed", "plain"} and saved["arms"]["mixed"]["seed_peers"] == 1
    solo, mixed = (saved["arms"][arm]["before"]["judge"] for arm in ("solo", "mixed"))
    same = ("pass_at_1", "pass_at_k", "format_rate", "per_specialty_pass_at_1")
    assert [solo[k] for k in same] == [mixed[k] for k in same]  # judged once: same weights, seeds, questions
    assert saved["arms"]["plain"]["config"]["format_reward"] == 0.0 < saved["arms"]["solo"]["config"]["format_reward"]
    assert saved["variant_effects"]["plain"]["pairs"] == [["solo", "plain"]]
    assert "This recipe vs `plain`" in (tmp_path / "real_learning.md").read_text()
    assert len(saved["arms"]["mixed"]["history"]) == 2 and "delta_pass_at_1" in result["mixed_model"]
    assert "| pass@1 |" in (tmp_path / "real_learning.md").read_text()
    assert (tmp_path / "real_learning.png").stat().st_size > 10_000
    # Another run of the same setup (here: the same arm under another name) folds in as a training seed.
    other = dict(saved, arms={"solo@7": saved["arms"]["solo"]})
    (tmp_path / "other.json").write_text(json.dumps(other))
    folded = real_learning.add_replicates(tmp_path, tmp_path / "other.json")
    assert set(folded["arms"]) == {"solo", "mixed", "plain", "solo@7"}
    seeds = folded["training_seeds"]
    assert set(seeds["arms"]) == {"solo", "solo@7"} and seeds["mixed_group_fraction_sd"] == 0.0
    assert [list(p) for p in folded["variant_effects"]["plain"]["pairs"]] == [["solo", "plain"]]  # kept
    assert "across 2 training seeds" in (tmp_path / "real_learning.md").read_text()
    (tmp_path / "other.json").write_text(json.dumps(dict(other, judge_questions=saved["judge_questions"] + 1)))
    try:
        real_learning.add_replicates(tmp_path, tmp_path / "other.json")
    except ValueError:
        pass
    else:
        raise AssertionError("a run with another judge must not fold in")
