"""What a node says of itself across the control API: one frozen, typed `NodeStatus`.

The node builds it (`Node.status()`), engine/control/protocol.py encodes it for the wire and checks
every field's type on the way back (`status_to_wire`, `status_from_wire`), the client hands it to its
callers parsed (`ControlClient.status()`), and the app applies it to its models. The wire keys are the
field names, so `sapo status --json` and older clients read the same object as before. The nested
reports (`swarm`, `memory`, `contribution`, `threads`, `last_crash`) stay JSON objects: each has one
reader that checks its own (the peers view, the Machine tab, engine.supervisor.parse_crash).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.events import NodeState

RECENT_WINDOW_S = 600.0  # rounds per minute are counted over this long
RECENT_ROUNDS = 20  # the reward trend compares the mean of the last this-many rounds with the ones before


@dataclass(frozen=True)
class NodeStatus:
    """A node's state and counters now. `paused_by` says why a paused node is paused ("you", "start", or
    a rule of engine.machine.guard.CAUSES: "snooze", "schedule", "battery", "owner", "temperature"),
    "" otherwise."""

    state: NodeState = "stopped"
    detail: str = ""
    paused_by: str = ""
    round: int = 0  # rounds completed by the current model (rounds are numbered per model)
    policy_version: int = 0
    peers: int = 0
    model: str = ""  # the model's id (catalog id, "seed", or a local directory's name)
    model_about: str = ""  # one sentence on what the model is
    model_name: str = ""  # what a contributor calls it ("SmolLM2-135M-Instruct")
    device: str = ""  # "" until the model has loaded
    backend: str = ""
    data_dir: str = ""
    peer_name: str = ""
    swarm: dict[str, Any] = field(default_factory=dict)  # what the swarm refused and why; {} when solo
    last_crash: dict[str, Any] | None = None  # the supervisor's record of why the previous engine died
    eval_every: int | None = None  # rounds between held-out evals (0 = never); None before a trainer is built
    eval_every_s: float | None = None  # training seconds between them (0 = no time rule)
    recent: dict[str, float | None] = field(default_factory=dict)  # `recent_summary` of the last rounds
    memory: dict[str, Any] = field(default_factory=dict)  # engine.machine.memory.HeapTrimmer.status()
    contribution: dict[str, Any] = field(default_factory=dict)  # engine.machine.contribution's totals
    threads: dict[str, Any] = field(default_factory=dict)  # the last round's engine.machine.load.ThreadChoice
    model_released: bool = False  # a long pause gave the model's memory back


def recent_summary(rounds: Sequence[tuple[float, float]], now: float) -> dict[str, float | None]:
    """`NodeStatus.recent` from (timestamp, mean reward) of the node's recent rounds, oldest first: rounds
    per minute over the last RECENT_WINDOW_S, the mean reward of the last RECENT_ROUNDS rounds and of
    the RECENT_ROUNDS before (the trend), and when the last round ended."""
    window = [t for t, _ in rounds if now - t <= RECENT_WINDOW_S]
    rate = None
    if len(window) >= 2 and window[-1] > window[0]:
        rate = (len(window) - 1) / (window[-1] - window[0]) * 60.0
    rewards = [r for _, r in rounds if math.isfinite(r)]
    last, before = rewards[-RECENT_ROUNDS:], rewards[-2 * RECENT_ROUNDS:-RECENT_ROUNDS]
    return {"rounds_per_min": rate, "reward": sum(last) / len(last) if last else None,
            "reward_before": sum(before) / len(before) if before else None,
            "last_round_at": rounds[-1][0] if rounds else None}
