"""The lab's commands, added to `sapo` when the lab is present (a source checkout, never the bundle)."""

from __future__ import annotations

from typing import Any

from lab.cli import bench, experiment


def register(sub: Any) -> None:
    bench.register(sub)
    experiment.register(sub)
