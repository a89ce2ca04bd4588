"""Typed events the node emits (frozen dataclasses). The GUI applies them to its view models.

Every event serialises to a JSON object with a "type" field (the class name in snake case) for the
control API; `event_from_dict` is the inverse and validates.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, cast, get_args

from engine.errors import SapoError

# What a node is doing (StateChanged, engine.control.status.NodeStatus).
NodeState = Literal["stopped", "solo", "joining", "in_swarm", "pausing", "paused", "leaving"]
NODE_STATES: tuple[str, ...] = get_args(NodeState)
ACTIVE_STATES: tuple[NodeState, ...] = ("solo", "joining", "in_swarm", "pausing")  # its worker is training
# What became of a peer's group: in the pool, trained on, gone (the pool dropped it), or passed over by
# this round's trainer while it stays in the pool ("skipped", with one of TRAINER_VERDICTS as reason).
RolloutStatus = Literal["pooled", "used", "dropped", "skipped"]
ROLLOUT_STATUSES: tuple[str, ...] = get_args(RolloutStatus)
# The trainer's reasons (engine/sapo/first_look.py, sampler.py): screened to no signal, cut to no signal,
# no signal to begin with, not re-scored, eligible but not drawn into this round's J, another model's, or
# holding a special token in its text, on a question another peer's drawn group already has, or more
# copies of one answer than this node's own sampling gives, or on one of this node's judge questions.
TrainerVerdict = Literal["repeated_text", "cut_no_signal", "zero_advantage", "not_rescored", "not_sampled",
                         "other_model", "special_tokens", "same_question", "copied_answers", "judge_question"]
TRAINER_VERDICTS: tuple[str, ...] = get_args(TrainerVerdict)


class EventError(SapoError, ValueError):
    """An event object that does not match its schema."""


@dataclass(frozen=True)
class Event:
    ts: float = field(default_factory=time.time, kw_only=True)
    registry: ClassVar[dict[str, type[Event]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        Event.registry[_snake(cls.__name__)] = cls

    @property
    def type(self) -> str:
        return _snake(type(self).__name__)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **dataclasses.asdict(self)}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@dataclass(frozen=True)
class StateChanged(Event):
    """The node's state. `detail` says why (e.g. 'on battery')."""

    state: NodeState
    detail: str = ""


@dataclass(frozen=True)
class RoundCompleted(Event):
    """One SAPO round finished: its metrics (names as in the store's `rounds` table)."""

    round: int
    policy_version: int
    metrics: dict[str, float]
    per_specialty_reward: dict[str, float]
    phase_seconds: dict[str, float]
    num_local: int
    num_external: int
    rungs: dict[str, int] = field(default_factory=dict)  # curriculum rung per specialty (empty: no curriculum)
    model: str = ""  # the model trained (rounds are numbered per model); "" from engines before that


@dataclass(frozen=True)
class RolloutSeen(Event):
    """A group received from a peer: kept in the pool, used in training, dropped (reason), or skipped by
    a round's trainer while it waits in the pool (reason: one of TRAINER_VERDICTS)."""

    origin_peer: str
    peer_name: str
    specialty: str
    question: str
    completion: str
    reward: float | None
    status: RolloutStatus
    reason: str = ""
    ref_key: str = ""  # TaskRef.key of the group (store column; empty where unknown)
    evicted: bool = False  # dropped after it had been pooled (unused): not a second arrival

    def __post_init__(self) -> None:
        rollout_status(self.status)
        if not isinstance(self.evicted, bool):
            raise EventError("evicted must be true or false")

    @property
    def arrival(self) -> bool:
        """The group's first verdict here (kept, or refused on arrival): "received" counts these, so a
        group counts once however many verdicts follow (pooled, then used or evicted)."""
        return self.status == "pooled" or (self.status == "dropped" and not self.evicted)

    @classmethod
    def of(cls, group: Any, status: str, reason: str = "", question: str = "", peer_name: str = "",
           evicted: bool = False) -> RolloutSeen:
        """The one builder: every RolloutSeen (pooled, dropped, used, skipped) describes its group alike."""
        rewards = group.rewards
        return cls(origin_peer=group.provenance.origin_peer, peer_name=peer_name, specialty=group.ref.specialty,
                   question=question[:2000], completion=group.completions[0][:2000] if group.completions else "",
                   reward=sum(rewards) / len(rewards) if rewards else None, status=rollout_status(status), reason=reason,
                   ref_key=group.ref.key, evicted=evicted)


def rollout_status(value: str) -> RolloutStatus:
    """`value` as a RolloutStatus, or EventError (the pool's decisions carry their status as text)."""
    if value not in ROLLOUT_STATUSES:
        raise EventError(f"rollout status must be one of {ROLLOUT_STATUSES}, got {value!r}")
    return cast(RolloutStatus, value)


@dataclass(frozen=True)
class PeerUpdated(Event):
    """A peer appeared or changed; `connected` False means it left or was lost."""

    peer_id: str
    name: str
    model: str
    found_by: str  # "mdns" | "bootstrap" | "manual"
    address: str
    connected: bool
    received: int = 0
    used: int = 0


@dataclass(frozen=True)
class EvalCompleted(Event):
    """Held-out evaluation at `round`: pass@1 and pass@k overall and per specialty."""

    round: int
    pass1: float
    passk: float
    k: int
    per_specialty: dict[str, dict[str, float]]
    model: str = ""  # the model evaluated; "" from engines before rounds were numbered per model


# What the engine is busy with for more than a moment: loading a model, or a round's phases.
WorkPhase = Literal["loading_model", "generating", "updating", "evaluating"]
WORK_PHASES: tuple[str, ...] = get_args(WorkPhase)


@dataclass(frozen=True)
class WorkProgress(Event):
    """The engine started `phase` (of `round`; 0 outside a round): `done` of `total` units (answers,
    groups, questions; total 0 when there is no count), `detail` in a contributor's words."""

    phase: WorkPhase
    round: int = 0
    done: int = 0
    total: int = 0
    detail: str = ""

    def __post_init__(self) -> None:
        if self.phase not in WORK_PHASES:
            raise EventError(f"unknown work phase {self.phase!r}")
        for name in ("round", "done", "total"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**40:
                raise EventError(f"work progress {name} must be a count")
        if not isinstance(self.detail, str) or len(self.detail) > 300:
            raise EventError("work progress detail must be a short text")


@dataclass(frozen=True)
class ModelProgress(Event):
    """Progress of a model switch (the node's optional `select_model`): download, conversion, load."""

    model_id: str
    phase: str  # "download" | "convert" | "load" | "ready" | "error"
    done: float  # units of work done (bytes, steps); 0 when unknown
    total: float  # units of work in all; 0 when unknown (indeterminate progress)
    message: str = ""


@dataclass(frozen=True)
class LogRecord(Event):
    level: str
    message: str


def _check_finite(value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise EventError("non-finite number in event")
    if isinstance(value, dict):
        for item in value.values():
            _check_finite(item)
    if isinstance(value, list):
        for item in value:
            _check_finite(item)


def event_from_dict(data: Any) -> Event:
    """Rebuild an event from its JSON object (e.g. from the control API), checking field names."""
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise EventError("event must be an object with a 'type'")
    cls = Event.registry.get(data["type"])
    if cls is None:
        raise EventError(f"unknown event type {data['type']!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in data.items() if k in names}
    _check_finite(kwargs)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise EventError(str(exc)) from exc
