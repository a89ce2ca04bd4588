"""Running many arms: one single-threaded worker process per arm, `jobs` at a time, resumable.

An arm whose arm.json exists is skipped (it finished earlier), so a preset interrupted by a budget or
a crash continues where it stopped, and `--aggregate-only` rebuilds the summary from what exists.
Threads: each worker sets torch to one thread *after* importing it (a module that sets threads at
import silently doubled the threads of parallel runs here), and OMP/MKL to one in its environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from lab.experiment.config import ArmConfig

ARMS_DIR = "arms"


def arm_done(out_dir: Path, arm: ArmConfig) -> bool:
    return (out_dir / ARMS_DIR / arm.name / "arm.json").is_file()


def run_arms(arms: Sequence[ArmConfig], out_dir: Path, jobs: int, *, log: Callable[[str], None] = print,
             poll_s: float = 0.5) -> dict[str, int]:
    """Run every unfinished arm in its own worker process, `jobs` at once -> return codes by arm name."""
    if jobs < 1:
        raise ValueError("jobs must be >= 1")
    (out_dir / ARMS_DIR).mkdir(parents=True, exist_ok=True)
    todo = [a for a in arms if not arm_done(out_dir, a)]
    skipped = len(arms) - len(todo)
    if skipped:
        log(f"{skipped} arm(s) already done, skipped")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    running: list[tuple[ArmConfig, subprocess.Popen[bytes], float]] = []
    codes: dict[str, int] = {}
    while todo or running:
        while todo and len(running) < jobs:
            arm = todo.pop(0)
            log_path = out_dir / ARMS_DIR / f"{arm.name}.log"
            with log_path.open("wb") as fh:
                proc = subprocess.Popen([sys.executable, "-m", "lab.experiment.worker", json.dumps(arm.to_dict()),
                                         str(out_dir)], stdout=fh, stderr=subprocess.STDOUT, env=env)
            running.append((arm, proc, time.time()))
            log(f"started {arm.name} (pid {proc.pid})")
        still = []
        for arm, proc, started in running:
            code = proc.poll()
            if code is None:
                still.append((arm, proc, started))
                continue
            codes[arm.name] = code
            log(f"{'finished' if code == 0 else f'FAILED ({code})'} {arm.name} in {time.time() - started:.0f}s")
        running = still
        if running:
            time.sleep(poll_s)
    return codes
