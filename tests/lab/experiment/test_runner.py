"""End to end on a tiny random policy: one arm in-process, and the smoke preset through the CLI."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.paths import REPO_ROOT
from lab.experiment.config import ArmConfig
from lab.experiment.report import aggregate, load_arms
from lab.experiment.runner import EVAL_FIELDS, ROUND_FIELDS, run_arm


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.models.policy import build_tiny_policy

    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "model")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_one_arm_writes_rows_evals_and_counters(tmp_path: Path, tiny: Path) -> None:
    cfg = ArmConfig(agents=2, local=4, external=4, rounds=2, eval_every=0, eval_per_specialty=1, eval_k=2,
                    max_new_tokens=6, completions=4, setting="heterogeneous")
    summary = run_arm(cfg, tmp_path / "arms", str(tiny), cache_dir=tmp_path)
    arm_dir = tmp_path / "arms" / cfg.name
    rounds = _rows(arm_dir / "rounds.csv")
    assert list(rounds[0]) == list(ROUND_FIELDS)
    assert sorted((int(r["agent"]), int(r["round"])) for r in rounds) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert all(int(r["own_groups"]) == 4 for r in rounds)
    assert all(int(r["ext_candidates"]) == 0 for r in rounds if r["round"] == "1")  # lock-step: nothing yet
    assert all(int(r["ext_candidates"]) == 4 for r in rounds if r["round"] == "2")  # the peer's round 1
    evals = _rows(arm_dir / "evals.csv")
    assert list(evals[0]) == list(EVAL_FIELDS)
    assert {int(e["round"]) for e in evals} == {0, 2}
    # Heterogeneous: each agent is judged on all six specialties, two of which it generates.
    for agent in ("0", "1"):
        mine = [e for e in evals if e["agent"] == agent and e["round"] == "2"]
        flags = sorted(int(e["generated"]) for e in mine)
        assert flags == [-1, -1, 0, 0, 1, 1]  # 2 agents x 2 specialties: two nobody generates
    assert summary["swarm"]["groups_published"] == 16
    assert summary["swarm"]["pool:pooled"] == 8  # round 2's groups wait for a barrier that never comes
    assert json.loads((arm_dir / "arm.json").read_text())["config"] == cfg.to_dict()
    assert set(summary["evals"]) == {"0", "2"}
    assert list(tmp_path.glob("seed_eval_*.json"))  # the seed's eval is cached for other arms


def test_aggregate_reports_a_broken_arm_instead_of_guessing(tmp_path: Path) -> None:
    broken = tmp_path / "arms" / "x"
    broken.mkdir(parents=True)
    (broken / "arm.json").write_text("{not json")
    summary = aggregate(tmp_path)
    assert summary["arms"] == 0
    assert len(summary["problems"]) == 1 and summary["problems"][0].startswith("x:")
    assert load_arms(tmp_path)[0] == []


def test_smoke_preset_through_the_cli(tmp_path: Path, tiny: Path) -> None:
    out = tmp_path / "out"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "engine", "experiment", "--preset", "smoke", "--model",
                           str(tiny), "--out", str(out)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["arms"] == 4 and summary["problems"] == []
    per_spec = summary["per_specialty_pass1_final"]["heterogeneous"]["4/4 positive-only"]
    assert all("seed" in v for v in per_spec.values()) and any("peer" in v for v in per_spec.values())
    for setting in ("homogeneous", "heterogeneous"):
        arms = summary["settings"][setting]
        assert set(arms) == {"8/0", "4/4 positive-only"}
        assert "vs_8_0" in arms["4/4 positive-only"]
    for name in ("fig_a_trained_on.png", "fig_b_generated.png", "fig_c_heldout.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert len(_rows(out / "rounds.csv")) == 4 * 2 * 3  # arms x agents x rounds
    assert "| homogeneous | 8/0 |" in (out / "table.md").read_text()
    # A second run skips the finished arms (resumable presets).
    again = subprocess.run([sys.executable, "-m", "engine", "experiment", "--preset", "smoke", "--model",
                            str(tiny), "--out", str(out)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False,
                           timeout=120)
    assert again.returncode == 0 and "4 arm(s) already done" in again.stdout


def test_json_safe_turns_non_finite_numbers_into_null() -> None:
    from lab.experiment.runner import json_safe

    assert json_safe({"a": float("nan"), "b": [float("inf"), 1.0], "c": "x"}) == {"a": None, "b": [None, 1.0],
                                                                                   "c": "x"}
