"""The engine child the app starts: idle priority, passive OpenMP waits, and `sapo run` doing the same itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.control.launcher import engine_env, start_engine

ROOT = Path(__file__).resolve().parents[2]
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux scheduling calls")

# The child reports its environment and its policy; it waits (bounded) for the launcher to lower it.
CHILD = """
import json, os, sys, time
want = sys.argv[1] == "idle"
deadline = time.monotonic() + 30
while want and os.sched_getscheduler(0) != os.SCHED_IDLE and time.monotonic() < deadline:
    time.sleep(0.01)
print(json.dumps({"omp": os.environ.get("OMP_WAIT_POLICY"), "level": os.environ.get("SAPO_PRIORITY"),
                  "policy": os.sched_getscheduler(0)}), flush=True)
"""


def test_the_child_environment_asks_for_passive_waits_and_says_the_level() -> None:
    env = engine_env(True, {"PATH": "/bin"})
    assert env == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE", "SAPO_PRIORITY": "idle"}
    assert engine_env(False, {"OMP_WAIT_POLICY": "ACTIVE"})["SAPO_PRIORITY"] == "normal"
    assert engine_env(False, {"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"  # someone chose it


@linux
@pytest.mark.parametrize("low", [True, False])
def test_start_engine_lowers_the_child_to_idle_priority(tmp_path: Path, low: bool) -> None:
    proc = start_engine(tmp_path, command=[sys.executable, "-c", CHILD, "idle" if low else "normal"],
                        low_priority=low)
    assert proc.wait(60) == 0
    seen = json.loads((tmp_path / "logs" / "engine.log").read_text().strip().splitlines()[-1])
    assert seen["omp"] == "PASSIVE"
    assert seen["level"] == ("idle" if low else "normal")
    assert seen["policy"] == (os.SCHED_IDLE if low else os.SCHED_OTHER)


# `sapo run` lowers itself and sets the wait policy before torch loads: its next step (the config) is
# replaced by a report, so nothing trains.
RUN = """
import logging, os, sys
from engine.cli import run as cli_run
def stop(args):
    print(os.environ.get("OMP_WAIT_POLICY"), os.sched_getscheduler(0), "torch" in sys.modules, flush=True)
    raise SystemExit(0)
cli_run.build_config = stop
from engine.cli import main
main(["run", "--headless", "--solo", "--rounds", "1", "--data-dir", sys.argv[1]] + sys.argv[2:])
"""


@linux
@pytest.mark.parametrize(("flags", "policy"), [([], os.SCHED_IDLE), (["--priority", "normal"], os.SCHED_OTHER)])
def test_sapo_run_lowers_itself_before_torch_loads(tmp_path: Path, flags: list[str], policy: int) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "SAPO_PRIORITY")}
    out = subprocess.run([sys.executable, "-c", RUN, str(tmp_path), *flags], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.split() == ["PASSIVE", str(policy), "False"]
    assert "CPU priority:" in out.stderr and "OpenMP waits: passive" in out.stderr
