"""`sapo bench round` on a tiny random model: TRL and ours take the same step (slow: imports TRL)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.models.policy import build_tiny_policy

pytest.importorskip("trl")


@pytest.mark.slow
def test_round_bench_matches_trl_step(tmp_path: Path) -> None:
    from lab.bench import round as bench

    model = build_tiny_policy(tmp_path / "m", seed=0, hidden=64, layers=2)
    result = bench.run(out_dir=tmp_path / "out", model_dir=model, steps=1, rounds=1, repeats=1)
    saved = json.loads((tmp_path / "out" / "round.json").read_text())
    assert saved["batch"]["rows"] == 64
    # Same batch, same optimizer settings: one step lands on the same weights, the same loss.
    assert result["param_max_abs_diff_after_one_step"] < 1e-4
    assert result["first_step_loss"]["ours"] == pytest.approx(result["first_step_loss"]["trl"], abs=1e-4)
    assert result["ratio_ours_over_trl"] > 0
    assert "ratio ours / TRL" in (tmp_path / "out" / "round.md").read_text()
