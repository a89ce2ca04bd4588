"""`sapo bench relay` at toy scale, and the `sapo bootstrap` command's argument checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.bench import relay

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]


def test_relay_bench_small(tmp_path: Path) -> None:
    result = relay.run(out_dir=tmp_path, peers=4, rates=[5.0], seconds=1.0, warmup=0.3)
    [row] = result["rows"]
    assert row["lost"] == 0 and row["expected"] > 0
    assert row["delivered_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
    assert result["bootstrap_relayed"] >= row["expected"]
    saved = json.loads((tmp_path / "relay.json").read_text())
    assert saved["rows"] == result["rows"]
    assert "| 5 |" in (tmp_path / "relay.md").read_text()


def test_bootstrap_command_rejects_bad_arguments() -> None:
    proc = subprocess.run([sys.executable, "-m", "engine", "bootstrap", "--port", "70000"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "BootstrapConfig.port must be 0..65535" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "engine", "bootstrap", "--nats", "http://x"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "board_urls must be a tuple" in proc.stderr
