"""What a contributor gives: training time, CPU time and its share of the machine, energy, memory held.

Totals survive restarts (`contribution.json` in the data dir, written atomically after each round).
Energy is read from the CPU's own meter (Linux powercap/RAPL) where the file is readable; otherwise it
is estimated from CPU time at a typical power per busy core and labelled so: a contributor must never
mistake a guess for a measurement.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

FILE = "contribution.json"
POWERCAP = Path("/sys/class/powercap")
# A busy laptop/desktop core draws roughly 4-15 W; 8 W is the estimate's middle (labelled "estimated").
ESTIMATED_WATTS_PER_BUSY_CORE = 8.0
MAX_ROUND_GAP_S = 3600.0  # a gap longer than this between rounds is a pause or a sleep, not training


@dataclass
class Totals:
    """Since this data dir's first round; every field a non-negative number."""

    train_seconds: float = 0.0  # wall time spent in rounds
    cpu_seconds: float = 0.0  # the engine process's CPU time in those rounds (all its threads)
    energy_j: float = 0.0
    measured_energy_j: float = 0.0  # the part of energy_j read from the CPU's meter
    rounds: int = 0

    @classmethod
    def from_dict(cls, raw: Any) -> Totals:
        """A saved file; anything malformed starts from zero rather than crash the engine."""
        if not isinstance(raw, dict):
            return cls()
        values = {}
        for name in ("train_seconds", "cpu_seconds", "energy_j", "measured_energy_j", "rounds"):
            value = raw.get(name, 0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not 0 <= value < 1e15:
                return cls()
            values[name] = int(value) if name == "rounds" else float(value)
        return cls(**values)


def read_energy_uj(root: Path = POWERCAP) -> tuple[int, int] | None:
    """(energy so far, counter range) in µJ summed over the CPU packages, or None where no meter is
    readable (no RAPL, a VM, or the file is root-only as on recent kernels)."""
    total = span = 0
    found = False
    for zone in sorted(root.glob("intel-rapl:[0-9]*")) if root.is_dir() else []:
        if ":" in zone.name.split("intel-rapl:", 1)[1]:
            continue  # sub-zones (core, uncore, dram) are inside the package's count
        try:
            total += int((zone / "energy_uj").read_text())
            span += int((zone / "max_energy_range_uj").read_text())
            found = True
        except (OSError, ValueError):
            return None
    return (total, span) if found else None


def energy_delta_uj(before: int, after: int, span: int) -> int:
    """The counter wraps at `span`: one wrap between two reads a round apart is all it can do."""
    return after - before if after >= before else after + span - before


class Contribution:
    """Owned by the node: `round_done` on the trainer thread, `status` from any (a lock)."""

    def __init__(self, data_dir: Path, process: psutil.Process | None = None) -> None:
        self.path = data_dir / FILE
        self._process = process or psutil.Process()
        self._lock = threading.Lock()
        self.totals = self._load()
        self._last = self._sample()  # (wall, cpu, energy reading)
        self._recent_share = 0.0

    def _load(self) -> Totals:
        try:
            return Totals.from_dict(json.loads(self.path.read_text()))
        except (OSError, ValueError):
            return Totals()

    def _sample(self) -> tuple[float, float, tuple[int, int] | None]:
        cpu = self._process.cpu_times()
        return time.monotonic(), cpu.user + cpu.system, read_energy_uj()

    def round_started(self) -> None:
        """Time before a round (after a pause, say) is not counted as given."""
        self._last = self._sample()

    def _since(self, start: tuple[float, float, tuple[int, int] | None],
               end: tuple[float, float, tuple[int, int] | None]) -> tuple[float, float, float, bool]:
        """(wall s, CPU s, joules, measured) between two samples."""
        (wall0, cpu0, energy0), (wall1, cpu1, energy1) = start, end
        wall, cpu = wall1 - wall0, max(0.0, cpu1 - cpu0)
        if energy0 is not None and energy1 is not None:
            return wall, cpu, energy_delta_uj(energy0[0], energy1[0], energy1[1]) / 1e6, True
        return wall, cpu, cpu * ESTIMATED_WATTS_PER_BUSY_CORE, False

    def round_energy(self) -> dict[str, float]:
        """The round's energy so far (since `round_started`), as the round's metrics: `energy_j` and
        `energy_measured` (1 when read from the CPU's meter, 0 when estimated from CPU time)."""
        _, _, joules, measured = self._since(self._last, self._sample())
        return {"energy_j": round(joules, 3), "energy_measured": 1.0 if measured else 0.0}

    def round_done(self) -> None:
        start = self._last
        self._last = self._sample()
        wall, cpu, joules, measured = self._since(start, self._last)
        if not 0 < wall <= MAX_ROUND_GAP_S:
            return
        with self._lock:
            t = self.totals
            t.train_seconds += wall
            t.cpu_seconds += cpu
            t.energy_j += joules
            t.measured_energy_j += joules if measured else 0.0
            t.rounds += 1
            self._recent_share = cpu / (wall * (psutil.cpu_count() or 1))
            text = json.dumps(asdict(t))
        self._save(text)

    def _save(self, text: str) -> None:
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(text)
            os.replace(tmp, self.path)
        except OSError:
            pass  # a full disk costs the totals' last round, never the training

    def status(self, groups_peers_trained: int = 0) -> dict[str, Any]:
        """The totals for the app; `groups_peers_trained`: this node's groups peers trained on (its
        receipts), which the energy is also given per."""
        with self._lock:
            t = self.totals
            share = self._recent_share
        try:
            memory = int(self._process.memory_info().rss)
        except psutil.Error:
            memory = 0
        measured = t.energy_j > 0 and t.measured_energy_j >= 0.99 * t.energy_j
        return {"train_hours": t.train_seconds / 3600, "cpu_hours": t.cpu_seconds / 3600,
                "rounds": t.rounds, "cpu_share_last_round": share, "energy_wh": t.energy_j / 3600,
                "energy_measured": measured, "memory_bytes": memory,
                "watts_training": t.energy_j / t.train_seconds if t.train_seconds > 0 else 0.0,
                "groups_peers_trained": groups_peers_trained,
                "wh_per_group_peers_trained": t.energy_j / 3600 / groups_peers_trained if groups_peers_trained else 0.0}
