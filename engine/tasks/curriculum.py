"""An adaptive curriculum: per specialty, a ladder of ReasoningGym settings and the rung a node is on.

GRPO learns only from groups whose completions disagree; the signal is strongest where a question's
pass rate is near one half (PODS, arXiv 2504.13818). A node therefore moves each specialty up its
ladder when its own recent pass rate there rises above `high` and down when it falls below `low`.

Rungs are a finite, published set (`LADDERS`), so a peer's task reference at any rung still verifies
(`engine.tasks.library.verify` runs only known settings: the DoS guard stays), and every group says
its rung through its settings (`rung_of`).

Every specialty starts on its entry rung (`ENTRY_RUNG`), the settings the held-out judge uses. The
rungs below it are for a model that cannot yet do the entry rung: there its own groups are nearly all
wrong, so nearly none carries a learning signal, and one rung down they disagree again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

_PLAIN = {"allow_parentheses": False, "allow_negation": False}

# Easiest first. Keys are ReasoningGym's own config fields.
LADDERS: dict[str, tuple[dict[str, Any], ...]] = {
    "basic_arithmetic": (
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"], **_PLAIN},
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"], **_PLAIN},
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-", "*"], **_PLAIN},
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+", "-", "*"], **_PLAIN},
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
        {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
        {"min_terms": 3, "max_terms": 4, "min_digits": 2, "max_digits": 2},
    ),
    "base_conversion": (
        {"min_base": 2, "max_base": 10, "min_value": 1, "max_value": 5},  # often the same digit in both bases
        {"min_base": 2, "max_base": 10, "min_value": 1, "max_value": 10},
        {"min_base": 2, "max_base": 10, "min_value": 1, "max_value": 20},
        {"min_base": 2, "max_base": 10, "min_value": 1, "max_value": 40},
        {"min_base": 2, "max_base": 16, "min_value": 1, "max_value": 100},
        {"min_base": 2, "max_base": 16, "min_value": 1, "max_value": 500},
    ),
    "fraction_simplification": (
        {"min_value": 1, "max_value": 5, "min_factor": 2, "max_factor": 2, "styles": ["plain"]},
        {"min_value": 1, "max_value": 10, "min_factor": 2, "max_factor": 2, "styles": ["plain"]},
        {"min_value": 1, "max_value": 10, "min_factor": 2, "max_factor": 3, "styles": ["plain"]},
        {"min_value": 1, "max_value": 20, "min_factor": 1, "max_factor": 5, "styles": ["plain"]},
        {"min_value": 1, "max_value": 20, "min_factor": 1, "max_factor": 5},
        {"min_value": 1, "max_value": 50, "min_factor": 1, "max_factor": 10},
        {"min_value": 1, "max_value": 100, "min_factor": 1, "max_factor": 20},
    ),
    "decimal_arithmetic": (
        # ReasoningGym's tolerance is one unit in the last allowed place: whole numbers within 1, then 0.1
        {"min_num_decimal_places": 0, "max_num_decimal_places": 0, "min_terms": 2, "max_terms": 2},
        {"min_num_decimal_places": 0, "max_num_decimal_places": 1, "min_terms": 2, "max_terms": 2},
        {"min_num_decimal_places": 1, "max_num_decimal_places": 1, "min_terms": 2, "max_terms": 2},
        {"min_num_decimal_places": 1, "max_num_decimal_places": 2, "min_terms": 2, "max_terms": 2},
        {"min_num_decimal_places": 2, "max_num_decimal_places": 2, "min_terms": 2, "max_terms": 3},
        {"min_num_decimal_places": 2, "max_num_decimal_places": 3, "min_terms": 3, "max_terms": 4},
    ),
    "calendar_arithmetic": (
        {"tasks": ["weekday_offset"], "offset_upper_bound": 7},
        {"tasks": ["weekday_offset"], "offset_upper_bound": 30},
        {"tasks": ["weekday_offset"]},
        {"tasks": ["weekday_offset", "weekday_of_date", "count_days"]},
    ),
    "binary_matrix": (
        {"min_n": 2, "max_n": 2},
        {"min_n": 2, "max_n": 3},
        {"min_n": 3, "max_n": 3},
        {"min_n": 3, "max_n": 5},
    ),
}


# The rung every node starts on and the judge's settings: the easiest rung before easier ones were added
# below it, so held-out results stay comparable across versions.
ENTRY_RUNG: dict[str, int] = {"basic_arithmetic": 1, "base_conversion": 1, "fraction_simplification": 2,
                              "decimal_arithmetic": 2}


def entry_rung(specialty: str) -> int:
    return ENTRY_RUNG.get(specialty, 0)


def entry_settings(specialty: str) -> dict[str, Any]:
    """The entry rung's ReasoningGym settings (a copy)."""
    return dict(LADDERS[specialty][entry_rung(specialty)])


def _canonical(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


# A checkpoint's rungs are indices into these ladders: one saved under other ladders is not restored.
LADDERS_ID = hashlib.sha256(_canonical({s: list(ladder) for s, ladder in LADDERS.items()}).encode()).hexdigest()[:16]


_RUNG_INDEX = {(s, _canonical(c)): i for s, ladder in LADDERS.items() for i, c in enumerate(ladder)}


def rung_of(specialty: str, config: dict[str, Any]) -> int | None:
    """The rung these settings are on (None: not a ladder rung, e.g. a preset's own settings)."""
    return _RUNG_INDEX.get((specialty, _canonical(config)))


def is_rung(specialty: str, config: dict[str, Any]) -> bool:
    return rung_of(specialty, config) is not None


def next_rung(pass_rate: float, rung: int, n_rungs: int, low: float, high: float, lowest: int = 0) -> int:
    """Keep the pass rate in [low, high]: one rung up above `high`, one down below `low`, within
    [lowest, n_rungs - 1]."""
    if pass_rate > high:
        return min(rung + 1, n_rungs - 1)
    if pass_rate < low:
        return max(rung - 1, lowest)
    return rung


@dataclass(frozen=True)
class CurriculumConfig:
    """The adaptive curriculum of one node."""

    enabled: bool = False  # off: the mix's own settings, as before
    low: float = 0.25  # below this recent pass rate a specialty moves one rung down
    high: float = 0.65  # above it, one rung up
    window: int = 48  # recent own completions per specialty the pass rate is taken over
    start_rung: int = 0  # rungs above each specialty's entry rung where it starts (clipped to its ladder)
    below_entry: bool = True  # may move below the entry rung onto easier settings (off: the entry rung is the floor)

    def __post_init__(self) -> None:
        for name in ("enabled", "below_entry"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"curriculum.{name} must be a boolean")  # noqa: TRY004 - config convention
        for name in ("low", "high"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not 0.0 <= value <= 1.0:
                raise ValueError(f"curriculum.{name} must be in [0, 1], got {value!r}")
        if self.low >= self.high:
            raise ValueError("curriculum.low must be below curriculum.high")
        for name, lo in (("window", 2), ("start_rung", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= 100_000:
                raise ValueError(f"curriculum.{name} must be an int >= {lo}, got {value!r}")


class Curriculum:
    """The rung of every laddered specialty of a mix and the recent rewards that move it.

    Owned by the trainer thread. A move clears that specialty's window, so each rung is judged on
    completions sampled at it."""

    def __init__(self, cfg: CurriculumConfig, specialties: list[str]) -> None:
        self.cfg = cfg
        self.rungs = {s: min(entry_rung(s) + cfg.start_rung, len(LADDERS[s]) - 1) for s in specialties
                      if s in LADDERS}
        self._recent: dict[str, deque[float]] = {s: deque(maxlen=cfg.window) for s in self.rungs}
        self.moves = 0

    def apply(self, mix: Any) -> Any:
        """The mix with each laddered specialty's settings at its current rung."""
        if not self.cfg.enabled or not self.rungs:
            return mix
        # replace(), not the classes: the library imports the ladders, so this module must not import it
        specs = {name: dataclasses.replace(spec, config=dict(LADDERS[name][self.rungs[name]]))
                 if name in self.rungs else spec for name, spec in mix.specialties.items()}
        return dataclasses.replace(mix, specialties=specs)

    def observe(self, specialty: str, rewards: tuple[float, ...] | list[float]) -> int | None:
        """Record one own group's binary rewards; returns the new rung when the specialty moved."""
        if not self.cfg.enabled or specialty not in self.rungs:
            return None
        window = self._recent[specialty]
        window.extend(1.0 if r >= 1.0 - 1e-6 else 0.0 for r in rewards)
        if len(window) < window.maxlen:  # type: ignore[operator]
            return None
        rung = self.rungs[specialty]
        lowest = 0 if self.cfg.below_entry else min(entry_rung(specialty), rung)
        new = next_rung(sum(window) / len(window), rung, len(LADDERS[specialty]), self.cfg.low, self.cfg.high, lowest)
        if new == rung:
            return None
        self.rungs[specialty] = new
        window.clear()
        self.moves += 1
        return new

    def pass_rates(self) -> dict[str, float]:
        return {s: (sum(w) / len(w) if w else 0.0) for s, w in self._recent.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"rungs": dict(self.rungs), "recent": {s: list(w) for s, w in self._recent.items()},
                "moves": self.moves, "ladders": LADDERS_ID}

    def load_state(self, state: Any) -> None:
        """Restore from a checkpoint; unknown specialties and out-of-range rungs are ignored."""
        if not isinstance(state, dict) or state.get("ladders") != LADDERS_ID:
            return  # garbage, or indices into other ladders: start again at the entry rungs
        rungs, recent = state.get("rungs"), state.get("recent")
        for s in self.rungs:
            if isinstance(rungs, dict) and isinstance(rungs.get(s), int) and 0 <= rungs[s] < len(LADDERS[s]):
                self.rungs[s] = rungs[s]
            if isinstance(recent, dict) and isinstance(recent.get(s), list):
                self._recent[s].clear()
                self._recent[s].extend(float(v) for v in recent[s][-self.cfg.window:]
                                       if isinstance(v, (int, float)) and v in (0, 1))
        if isinstance(state.get("moves"), int):
            self.moves = state["moves"]
