"""Task references: the few fields that regenerate a question and its ground truth anywhere.

ReasoningGym is procedural: `create_dataset(specialty, seed=seed, **config)[index]` is deterministic
across processes, so a peer sends the reference and a hash of the question text, never the ground
truth. The receiver regenerates the question and drops the group when the hash differs.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from engine.errors import SapoError

# Limits on what a reference from a peer may carry (validated in `from_dict`).
MAX_SPECIALTY_LEN = 64
MAX_CONFIG_KEYS = 32
MAX_CONFIG_JSON_BYTES = 2048
MAX_INDEX = 2**31 - 1
MAX_SEED = 2**63 - 1


class TaskRefError(SapoError, ValueError):
    """A task reference that is malformed or out of bounds."""


def question_hash(question: str) -> str:
    """sha256 (hex) of the question text as UTF-8: what travels beside a reference."""
    return hashlib.sha256(question.encode("utf-8")).hexdigest()


def _check_json_value(value: Any, depth: int = 0) -> None:
    if depth > 4:
        raise TaskRefError("config nests too deeply")
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TaskRefError("config holds a non-finite number")
        return
    if isinstance(value, list):
        for item in value:
            _check_json_value(item, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TaskRefError("config keys must be strings")
            _check_json_value(item, depth + 1)
        return
    raise TaskRefError(f"config holds a {type(value).__name__}")


@dataclass(frozen=True)
class TaskRef:
    """specialty + generator settings + dataset seed + item index = one exact question."""

    specialty: str
    config: dict[str, Any] = field(hash=False, compare=False)
    seed: int
    index: int

    @property
    def config_json(self) -> str:
        """Canonical JSON of the generator settings (sorted keys, no spaces)."""
        return json.dumps(self.config, sort_keys=True, separators=(",", ":"))

    @property
    def key(self) -> str:
        """A canonical string identifying this reference (dedupe keys, store columns)."""
        return f"{self.specialty}|{self.config_json}|{self.seed}|{self.index}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TaskRef) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def to_dict(self) -> dict[str, Any]:
        return {"specialty": self.specialty, "config": self.config, "seed": self.seed, "index": self.index}

    @classmethod
    def from_dict(cls, data: Any) -> TaskRef:
        """Validate untrusted input (a peer's frame, a file) into a reference."""
        if not isinstance(data, dict):
            raise TaskRefError("task reference must be an object")
        specialty, config = data.get("specialty"), data.get("config")
        seed, index = data.get("seed"), data.get("index")
        if not isinstance(specialty, str) or not 0 < len(specialty) <= MAX_SPECIALTY_LEN:
            raise TaskRefError("bad specialty")
        if not isinstance(config, dict) or len(config) > MAX_CONFIG_KEYS:
            raise TaskRefError("bad config")
        _check_json_value(config)
        if len(json.dumps(config, sort_keys=True, separators=(",", ":"))) > MAX_CONFIG_JSON_BYTES:
            raise TaskRefError("config too large")
        for name, value, bound in (("seed", seed, MAX_SEED), ("index", index, MAX_INDEX)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= bound:
                raise TaskRefError(f"bad {name}")
        return cls(specialty=specialty, config=dict(config), seed=int(seed), index=int(index))  # type: ignore[arg-type]
