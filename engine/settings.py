"""Contributor settings: what the person lending the machine controls. Persisted as TOML.

Untrusted on the way in (a hand-edited file, the control API): `from_dict` validates every field and
ignores unknown keys, so a newer settings file never stops an older engine from starting.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from engine.machine.schedule import Schedule, parse_schedule

SETTINGS_FILE = "settings.toml"


@dataclass(frozen=True)
class ContributorSettings:
    bootstrap_url: str = ""  # ws:// or wss:// rendezvous server; "" = LAN only
    lan_discovery: bool = True  # announce and browse `_sapo._tcp.local.` by mDNS
    cpu_cores: int = 0  # torch threads for training; 0 = all physical cores but one
    use_gpu: bool = True  # use CUDA / MPS when present
    only_when_idle: bool = False  # pause while the user is active (where idle time is known)
    idle_minutes: int = 5  # how long without input counts as idle
    pause_on_battery: bool = True  # pause while running on battery (where known)
    snooze_until: float = 0.0  # unix seconds; paused until then ("snooze for an hour")
    start_at_login: bool = False  # register with the OS's autostart mechanism
    max_temperature_c: float = 0.0  # pause above this CPU/GPU temperature; 0 = no cap
    keep_running_on_close: bool = True  # closing the window leaves the engine contributing
    # the model last switched to in the app (catalog id, "seed" or a model directory); the engine
    # trains it after a restart unless `sapo run --model` names one. "" = the engine's default
    model: str = ""
    # wss:// bootstraps and the board's TLS servers must chain to a CA in this PEM file (a swarm that
    # runs its own CA hands it out); "" = the system's CAs. `sapo run --ca FILE` overrides it
    ca_file: str = ""
    # train only inside these weekly windows of the machine's local time, e.g. "Mon-Fri 18:00-08:00,
    # Sat-Sun 00:00-24:00" (an end at or before the start crosses midnight); "" = at any time
    schedule: str = ""
    # the engine comes up paused (`sapo run --headless --control`, at login): it trains once resumed
    # (the app's Resume, `sapo resume`)
    start_paused: bool = False

    @functools.cached_property
    def parsed_schedule(self) -> Schedule:
        """`schedule`, parsed once (validated at construction, so this never raises later)."""
        return parse_schedule(self.schedule)

    def __post_init__(self) -> None:
        if self.bootstrap_url and not self.bootstrap_url.startswith(("ws://", "wss://")):
            raise ValueError("bootstrap_url must start with ws:// or wss://")
        if len(self.bootstrap_url) > 512:
            raise ValueError("bootstrap_url is too long")
        if not 0 <= self.cpu_cores <= 1024:
            raise ValueError("cpu_cores must be between 0 and 1024")
        if not 1 <= self.idle_minutes <= 24 * 60:
            raise ValueError("idle_minutes must be between 1 and 1440")
        for name in ("snooze_until", "max_temperature_c"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0")
        if self.max_temperature_c > 150:
            raise ValueError("max_temperature_c must be at most 150")
        if len(self.model) > 1024 or any(ord(ch) < 32 or ord(ch) == 127 for ch in self.model):
            raise ValueError("model must be at most 1024 characters, without control characters")
        if len(self.ca_file) > 4096 or any(ord(ch) < 32 or ord(ch) == 127 for ch in self.ca_file):
            raise ValueError("ca_file must be a file path of at most 4096 characters, without control characters")
        _ = self.parsed_schedule  # ValueError here, with the part that is wrong, not at the next round

    @classmethod
    def from_dict(cls, data: Any, base: ContributorSettings | None = None) -> ContributorSettings:
        """Validated update of `base` (default values if None) from an untrusted mapping."""
        if not isinstance(data, dict):
            raise ValueError("settings must be an object")  # noqa: TRY004 (ValueError for every bad input)
        base = base or cls()
        changes: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            value, default = data[f.name], getattr(base, f.name)
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise ValueError(f"{f.name} must be true or false")  # noqa: TRY004 (ValueError for every bad input)
            elif isinstance(default, int):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"{f.name} must be an integer")  # noqa: TRY004 (ValueError for every bad input)
            elif isinstance(default, float):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"{f.name} must be a number")  # noqa: TRY004 (ValueError for every bad input)
                value = float(value)
            elif isinstance(default, str) and not isinstance(value, str):
                raise ValueError(f"{f.name} must be a string")  # noqa: TRY004 (ValueError for every bad input)
            changes[f.name] = value
        return dataclasses.replace(base, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def load(cls, data_dir: Path) -> ContributorSettings:
        path = data_dir / SETTINGS_FILE
        if not path.exists():
            return cls()
        with path.open("rb") as fh:
            return cls.from_dict(tomllib.load(fh))

    def save(self, data_dir: Path) -> None:
        """Atomic write (temp file + rename) so a crash never leaves a half-written file."""
        data_dir.mkdir(parents=True, exist_ok=True)
        lines = [f"{k} = {_toml_value(v)}" for k, v in self.to_dict().items()]
        tmp = data_dir / (SETTINGS_FILE + ".tmp")
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.replace(tmp, data_dir / SETTINGS_FILE)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
