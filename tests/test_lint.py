"""The tree stays lint-clean, and the swarm (the code that faces untrusted peers) type-checks strictly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean() -> None:
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "engine", "app", "lab", "tests"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-4000:]


def test_swarm_and_sapo_type_check_strictly() -> None:
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--ignore-missing-imports",
                          "--follow-imports=silent", "engine/swarm", "engine/sapo"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, check=False)
    assert out.returncode == 0, out.stdout[-4000:]
