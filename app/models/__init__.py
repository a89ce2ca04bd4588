"""Qt-free view models: plain Python state the views read. Events are applied here, on the Qt
thread, in batches; views redraw only what changed (each model has a `version`)."""

from __future__ import annotations

from typing import Any

from app.models.dashboard import DashboardModel
from app.models.feed import FeedModel
from app.models.history import parse_history, parse_totals
from app.models.node import LogModel, NodeModel
from app.models.peers import PeersModel
from engine.events import (
    EvalCompleted,
    Event,
    LogRecord,
    ModelProgress,
    PeerUpdated,
    RolloutSeen,
    RoundCompleted,
    StateChanged,
    WorkProgress,
)

__all__ = ["AppModel", "DashboardModel", "FeedModel", "LogModel", "NodeModel", "PeersModel"]

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
            self.peers.touch(event.origin_peer, event.ts)
            self.peers.count(event)  # live only: history's peer rows already hold the store's totals
        elif isinstance(event, PeerUpdated):
            self.peers.apply(event)
            self.node.set_peers(self.peers.connected)
        elif isinstance(event, LogRecord):
            self.log.add(event.level, event.message, event.ts)
        elif isinstance(event, ModelProgress):
            self.progress = event
            if event.phase == "ready":  # switched: the charts show that model's own record, asked for now
                self.dashboard.wants_history = event.model_id
        elif isinstance(event, WorkProgress):
            self.node.apply_work(event)

    def apply_many(self, events: list[Event]) -> None:
        for event in events:
            self.apply(event)

    def load_history(self, history: Any) -> None:
        """The `history` reply: rounds, evals, rollouts, peers, the current model's totals. Bad rows are
        skipped and counted."""
        parsed, bad = parse_history(history)
        self.bad_history_rows += bad
        rounds = [e for e in parsed["rounds"] if isinstance(e, RoundCompleted)]
        whose = history.get("model") if isinstance(history, dict) else None
        self.dashboard.load(rounds, [e for e in parsed["evals"] if isinstance(e, EvalCompleted)],
                            parse_totals(history), whose if isinstance(whose, str) and len(whose) <= 200 else "")
        for event in rounds:
            self.node.apply_round(event)
        for peer in parsed["peers"]:
            self.apply(peer)
        for rollout in parsed["rollouts"]:  # the feed's recent rows; the counts are in the peer rows
            if isinstance(rollout, RolloutSeen):
                self.feed.apply(rollout)
                self.peers.touch(rollout.origin_peer, rollout.ts)
