"""Where things live: the repository's resources and the user's data dir."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import platformdirs

APP_NAME = "sapo-swarm"
REPO_ROOT = Path(__file__).resolve().parent.parent

# A PyInstaller bundle unpacks its data next to the code, under sys._MEIPASS (packaging/sapo.spec).
_BUNDLE_DIR = getattr(sys, "_MEIPASS", None) if getattr(sys, "frozen", False) else None
RESOURCES_DIR = Path(os.environ.get("SAPO_RESOURCES") or
                     (Path(_BUNDLE_DIR) / "resources" if _BUNDLE_DIR else REPO_ROOT / "resources"))
SEED_MODEL_DIR = RESOURCES_DIR / "models" / "seed"


def default_data_dir() -> Path:
    """The user's data dir (identity, config, store, checkpoints); `--data-dir` overrides it."""
    return Path(os.environ.get("SAPO_DATA_DIR") or platformdirs.user_data_dir(APP_NAME, appauthor=False))


def fleet_file() -> Path:
    """The app's list of the contributor's other engines (URLs and tokens): SAPO_FLEET_FILE or the
    user's config dir."""
    override = os.environ.get("SAPO_FLEET_FILE")
    return Path(override) if override else Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)) / "fleet.json"
