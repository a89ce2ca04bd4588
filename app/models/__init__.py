"""Qt-free view models: plain Python state the views read. Events are applied here, on the Qt
thread, in batches; views redraw only what changed (each model has a `version`)."""

from __future__ import annotations

import json
import math
from typing import Any

from app.models.dashboard import DashboardModel
from app.models.feed import FeedModel
from app.models.node import LogModel, NodeModel
from app.models.peers import PeersModel
from engine.control.api import ModelProgress
from engine.control.protocol import check_event_types
from engine.events import (
    Event,
    EvalCompleted,
    EventError,
    LogRecord,
    PeerUpdated,
    RolloutSeen,
    RoundCompleted,
    StateChanged,
    event_from_dict,
)

__all__ = ["AppModel", "DashboardModel", "FeedModel", "LogModel", "NodeModel", "PeersModel"]

_ROUND_FIELDS = ("round", "policy_version", "ts", "num_local", "num_external", "metrics",
                 "per_specialty_reward", "phase_seconds")


def _json_field(value: Any) -> Any:
    """The store may keep nested dicts as JSON text columns."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _row_event(row: Any, event_type: str, **defaults: Any) -> Event:
    """A history row as its event: rows may be event dicts already or flat store rows."""
    if not isinstance(row, dict):
        raise EventError("history row must be an object")
    data = {k: _json_field(v) for k, v in row.items()}
    data.setdefault("type", event_type)
    for key, value in defaults.items():
        data.setdefault(key, value)
    if event_type == "round_completed" and not isinstance(data.get("metrics"), dict):
        # flat row: every other finite number is a metric column
        data["metrics"] = {k: float(v) for k, v in data.items() if k not in _ROUND_FIELDS
                           and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    event = event_from_dict(data)
    if event.type != event_type:
        raise EventError(f"expected a {event_type} row")
    check_event_types(event)
    return event


class AppModel:
    def __init__(self) -> None:
        self.node = NodeModel()
        self.dashboard = DashboardModel()
        self.feed = FeedModel()
        self.peers = PeersModel()
        self.log = LogModel()
        self.settings: dict[str, Any] = {}
        self.machine: dict[str, Any] = {}
        self.progress: ModelProgress | None = None
        self.bad_history_rows = 0

    def apply(self, event: Event) -> None:
        if isinstance(event, StateChanged):
            self.node.apply_state(event)
            self.log.add("info", f"state: {event.state}" + (f" ({event.detail})" if event.detail else ""),
                         event.ts)
        elif isinstance(event, RoundCompleted):
            self.dashboard.apply_round(event)
            self.node.apply_round(event)
        elif isinstance(event, EvalCompleted):
            self.dashboard.apply_eval(event)
        elif isinstance(event, RolloutSeen):
            self.feed.apply(event)
        elif isinstance(event, PeerUpdated):
            self.peers.apply(event)
            self.node.peers = self.peers.connected
            self.node.version += 1
        elif isinstance(event, LogRecord):
            self.log.add(event.level, event.message, event.ts)
        elif isinstance(event, ModelProgress):
            self.progress = event

    def apply_many(self, events: list[Event]) -> None:
        for event in events:
            self.apply(event)

    def load_history(self, history: Any) -> None:
        """The `history` reply: rounds, evals, rollouts, peers, oldest first. Bad rows are skipped."""
        if not isinstance(history, dict):
            self.bad_history_rows += 1
            return
        spec = (("rounds", "round_completed", {"num_local": 0, "num_external": 0, "per_specialty_reward": {},
                                               "phase_seconds": {}, "policy_version": 0}),
                ("evals", "eval_completed", {"k": 1, "per_specialty": {}}),
                ("rollouts", "rollout_seen", {"reason": "", "completion": ""}),
                ("peers", "peer_updated", {"connected": False, "received": 0, "used": 0}))
        parsed: dict[str, list[Event]] = {}
        for key, event_type, defaults in spec:
            rows = history.get(key, [])
            parsed[key] = []
            for row in rows if isinstance(rows, list) else []:
                try:
                    parsed[key].append(_row_event(row, event_type, **defaults))
                except (EventError, TypeError, ValueError):
                    self.bad_history_rows += 1
        self.dashboard.load([e for e in parsed["rounds"] if isinstance(e, RoundCompleted)],
                            [e for e in parsed["evals"] if isinstance(e, EvalCompleted)])
        for event in parsed["rounds"]:
            if isinstance(event, RoundCompleted):
                self.node.apply_round(event)
        for event in parsed["peers"] + parsed["rollouts"]:
            self.apply(event)
