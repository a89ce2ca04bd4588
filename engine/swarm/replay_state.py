"""The replay guard's state on disk, so a restarted node does not accept frames it already took.

A JSON object {sender: [highest seq, last seen]} written atomically every REPLAY_SAVE_S and at stop;
read back as untrusted (a torn or edited file restores nothing it cannot check).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from engine.swarm.limits import ReplayGuard

REPLAY_SAVE_S = 30.0  # a kill -9 forgets at most this long of what was seen
MAX_STATE_BYTES = 64 << 20


def load(path: Path, guard: ReplayGuard, now: float | None = None) -> int:
    """Restore what `path` holds into `guard` -> senders restored (0 when absent or unreadable)."""
    data: Any = None
    try:
        if path.stat().st_size <= MAX_STATE_BYTES:
            data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    return guard.restore(data, time.time() if now is None else now)


def save(path: Path, guard: ReplayGuard) -> None:
    """Write atomically (OSError to the caller)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(guard.snapshot()))
    os.replace(tmp, path)
