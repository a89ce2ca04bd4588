"""One arm in one process: `python -m lab.experiment.worker '<arm config JSON>' OUT_DIR`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers

from engine.paths import SEED_MODEL_DIR
from lab.experiment.config import ArmConfig
from lab.experiment.driver import ARMS_DIR
from lab.experiment.runner import run_arm


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m lab.experiment.worker '<arm config JSON>' OUT_DIR", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # after the imports: one core per worker, two workers on two cores
    transformers.logging.disable_progress_bar()
    cfg = ArmConfig.from_dict(json.loads(argv[0]))
    out = Path(argv[1])
    run_arm(cfg, out / ARMS_DIR, cfg.model or str(SEED_MODEL_DIR), cache_dir=out,
            progress=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
