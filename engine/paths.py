"""Where things live: the repository's resources and the user's data dir."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "sapo-swarm"
REPO_ROOT = Path(__file__).resolve().parent.parent
RESOURCES_DIR = Path(os.environ.get("SAPO_RESOURCES", REPO_ROOT / "resources"))
SEED_MODEL_DIR = RESOURCES_DIR / "models" / "seed"
BENCH_DIR = REPO_ROOT / "bench"


def default_data_dir() -> Path:
    """The user's data dir (identity, config, store, checkpoints); `--data-dir` overrides it."""
    return Path(os.environ.get("SAPO_DATA_DIR") or platformdirs.user_data_dir(APP_NAME, appauthor=False))
