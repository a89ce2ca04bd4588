"""`sapo train / eval / history` end to end on a tiny random policy (real files, real store)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from engine.cli import main
from engine.models.policy import build_tiny_policy


def test_train_resume_history_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = build_tiny_policy(tmp_path / "model", seed=2)
    common = ["--model", str(model), "--data-dir", str(tmp_path / "data"), "--set", "sampling.max_new_tokens=6",
              "--set", "num_local=2", "--set", "completions=2", "--set", "eval_per_specialty=1",
              "--set", "eval_k=2"]
    assert main(["train", "--rounds", "2", *common]) == 0
    assert main(["train", "--rounds", "1", *common]) == 0
    out = capsys.readouterr().out
    assert "resumed at round 2" in out and "round     3" in out
    assert main(["history", "--data-dir", str(tmp_path / "data"), "--csv", str(tmp_path / "h.csv")]) == 0
    with open(tmp_path / "h.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["round"] for r in rows] == ["1", "2", "3"]
    assert main(["eval", *common, "--repeat", "2", "--json", str(tmp_path / "e.json")]) == 0
    reports = json.loads((tmp_path / "e.json").read_text())
    assert len(reports) == 2 and reports[0]["k"] == 2
    assert "over 2 sampling seeds" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown config field"):
        main(["train", "--rounds", "1", *common, "--set", "learning_rate=1"])
    with pytest.raises(SystemExit, match="bad config"):
        main(["train", "--rounds", "1", *common, "--set", "lr=-1"])
    with pytest.raises(SystemExit, match="checkpoints exist"):
        main(["train", "--rounds", "1", "--fresh", *common])
