"""Header and log view models: the node's state and counters, and a bounded log."""

from __future__ import annotations

import collections
import time
from typing import Any

from engine.control.status import NodeStatus
from engine.events import (
    ACTIVE_STATES,
    NODE_STATES,
    LogRecord,
    NodeState,
    RoundCompleted,
    StateChanged,
    WorkProgress,
)
from engine.supervisor import crash_text, parse_crash

STATE_LABELS = {
    "stopped": "Not contributing",
    "solo": "Training solo",
    "joining": "Joining the swarm…",
    "in_swarm": "In the swarm",
    "pausing": "Pausing after this round",
    "paused": "Paused",
    "leaving": "Leaving…",
}
CRASH_SHOWN_FOR_S = 24 * 3600  # the header mentions the engine's last crash for a day

IDENTITY_KEYS = ("model", "model_name", "model_about", "device", "backend", "peer_name", "data_dir")  # from `status` only

CONTRIBUTION_NUMBERS = ("train_hours", "cpu_hours", "rounds", "cpu_share_last_round", "energy_wh", "memory_bytes")
CONTRIBUTION_OPTIONAL = ("watts_training", "groups_peers_trained", "wh_per_group_peers_trained")


def parse_contribution(raw: Any) -> dict[str, Any]:
    """The engine's `contribution` status with every number finite and >= 0; {} when malformed."""
    if not isinstance(raw, dict):
        return {}
    out: dict[str, Any] = {}
    for key in CONTRIBUTION_NUMBERS:
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e18:
            return {}  # NaN fails the comparison too
        out[key] = float(value)
    out["energy_measured"] = raw.get("energy_measured") is True
    for key in CONTRIBUTION_OPTIONAL:  # engines before energy per hour and per group leave them out
        value = raw.get(key, 0.0)
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value < 1e18
        out[key] = float(value) if ok else 0.0
    return out


def work_text(work: WorkProgress) -> str:
    """A phase in a contributor's words."""
    if work.phase == "loading_model":
        return f"Loading {work.detail or 'the model'}"
    if work.phase == "generating":
        return f"Round {work.round:,}: writing {work.total} answer{'' if work.total == 1 else 's'} ({work.detail})"
    if work.phase == "updating":
        return f"Round {work.round:,}: learning from {work.total} group{'' if work.total == 1 else 's'}"
    if work.round == 0:  # the baseline: every later "up from" is read against it
        return f"Checking where your model starts: {work.done} of {work.total} held-out questions"
    return f"Checking held-out questions: {work.done} of {work.total}"  # evaluating


def _seconds(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


class NodeModel:
    """What the header and the tray show. `connected` is the control link, not the swarm."""

    def __init__(self) -> None:
        self.state: NodeState = "stopped"
        self.detail = ""
        self.round = 0
        self.policy_version = 0
        self.peers = 0
        self.model = ""
        self.model_name = ""  # what a contributor calls it ("SmolLM2-135M-Instruct")
        self.model_about = ""  # one sentence on what the model is (the engine's words)
        self.device = ""
        self.backend = ""
        self.peer_name = ""
        self.data_dir = ""
        self.connected = False
        self.engine_url = ""
        self.last_crash: dict[str, Any] | None = None  # why the engine last died (its supervisor's record)
        self.eval_every: int | None = None  # rounds between held-out evals (0 = off; None = not told yet)
        self.eval_every_s: float | None = None  # training seconds between them (0 = off; None = not told yet)
        self.round_model = ""  # the model whose round `round` is (rounds are numbered per model)
        self.work: WorkProgress | None = None  # the engine's current phase (model load, round phases)
        self.work_started = 0.0  # when that phase began (its progress events each carry their own time)
        self.contribution: dict[str, Any] = {}  # what this machine has given (engine.machine.contribution), checked
        self.version = 0

    def connect(self, url: str, status: NodeStatus) -> None:
        """The control link came up at `url`, with the engine's status at that moment."""
        self.connected, self.engine_url = True, url
        self.apply_status(status)

    def disconnect(self, last_crash: dict[str, Any] | None = None) -> None:
        """The control link went down (`last_crash`: why a local engine died, if its supervisor said)."""
        self.connected = False
        self.last_crash = last_crash or self.last_crash
        self.version += 1

    def set_peers(self, peers: int) -> None:
        """The peers reachable now, as the peers table counts them."""
        if peers != self.peers:
            self.peers = peers
            self.version += 1

    def apply_status(self, status: NodeStatus) -> None:
        """Everything a status says (the control client has checked its types)."""
        self.state, self.detail = status.state, status.detail
        for key in IDENTITY_KEYS:
            setattr(self, key, getattr(status, key))
        self.round, self.policy_version, self.peers = status.round, status.policy_version, status.peers
        self.last_crash = parse_crash(status.last_crash)
        self._apply_eval_every(status)
        self.contribution = parse_contribution(status.contribution)
        self.version += 1

    def _apply_eval_every(self, status: NodeStatus) -> bool:
        changed = False
        if status.eval_every is not None and status.eval_every != self.eval_every:
            self.eval_every, changed = status.eval_every, True
        if status.eval_every_s is not None and status.eval_every_s != self.eval_every_s:
            self.eval_every_s, changed = float(status.eval_every_s), True
        return changed

    def apply_identity(self, status: NodeStatus) -> None:
        """What events don't carry (model, device, backend, names) from a later `status` reply; the
        state and counters stay with the events, which may be newer than the reply."""
        changed = self._apply_eval_every(status)
        contribution = parse_contribution(status.contribution)
        if contribution != self.contribution:
            self.contribution, changed = contribution, True
        crash = parse_crash(status.last_crash)
        if crash != self.last_crash:
            self.last_crash, changed = crash, True
        switched = self.model not in ("", status.model)
        for key in IDENTITY_KEYS:
            value = getattr(status, key)
            if value != getattr(self, key):
                setattr(self, key, value)
                changed = True
        if switched:  # rounds are numbered per model: the switched-to model's count, before it trains
            self.round, self.policy_version = status.round, status.policy_version
        if changed:
            self.version += 1

    def apply_state(self, event: StateChanged) -> None:
        if event.state in NODE_STATES:
            self.state, self.detail = event.state, event.detail
            if event.state in ("stopped", "paused"):
                self.work = None  # nothing is being worked on
            self.version += 1

    def apply_work(self, event: WorkProgress) -> None:
        old = self.work
        if old is None or (old.phase, old.round) != (event.phase, event.round) or event.done < old.done:
            self.work_started = event.ts
        self.work = event
        self.version += 1

    def activity(self, now: float | None = None) -> str:
        """What the engine is doing right now, with how long it has been at it ("" when idle)."""
        work = self.work
        if work is None or self.state in ("stopped", "paused"):
            return ""
        elapsed = max(0.0, (time.time() if now is None else now) - self.work_started)
        text = f"{work_text(work)} · {_seconds(elapsed)}"
        if work.phase == "evaluating" and 0 < work.done < work.total:  # minutes long on a real model
            text += f", about {_seconds(elapsed / work.done * (work.total - work.done))} left"
        return text

    def apply_round(self, event: RoundCompleted) -> None:
        # rounds are numbered per model: another model's round 1 is news, not an old round
        if event.round >= self.round or (event.model and event.model != self.round_model):
            self.round, self.policy_version = event.round, event.policy_version
            self.round_model = event.model or self.round_model
            if self.work is not None and self.work.phase in ("generating", "updating") and self.work.round <= event.round:
                self.work = None  # that round is done
            self.version += 1

    def crash_note(self, now: float | None = None) -> str:
        """The header's line about the last crash, while it is recent; "" otherwise."""
        crash = self.last_crash
        now = time.time() if now is None else now
        if crash is None or now - crash["ts"] > CRASH_SHOWN_FOR_S:
            return ""
        return crash_text(crash)

    @property
    def active(self) -> bool:
        """The big button says "Leave" while the node trains."""
        return self.state in ACTIVE_STATES

    @property
    def label(self) -> str:
        return STATE_LABELS.get(self.state, self.state)

    def tooltip(self) -> str:
        if not self.connected:
            return "SAPO Swarm: engine not connected"
        parts = [f"SAPO Swarm: {self.label}"]
        if self.detail:
            parts.append(self.detail)
        parts.append(f"round {self.round} · {self.peers} peer{'s' if self.peers != 1 else ''}")
        return "\n".join(parts)


def log_text(line: LogRecord) -> str:
    """A log line as the log view shows it: time, level, message."""
    return f"{time.strftime('%H:%M:%S', time.localtime(line.ts))}  {line.level.upper():7} {line.message}"


class LogModel:
    def __init__(self, capacity: int = 5000) -> None:
        self.capacity = capacity
        self.lines: collections.deque[LogRecord] = collections.deque(maxlen=capacity)
        self._new: list[LogRecord] = []
        self.version = 0

    def add(self, level: str, message: str, ts: float | None = None) -> None:
        line = LogRecord(level[:16], message[:4000], ts=time.time() if ts is None else ts)
        self.lines.append(line)
        self._new.append(line)
        if len(self._new) > self.capacity:  # a view that never reads must not grow this
            del self._new[: len(self._new) - self.capacity]
        self.version += 1

    def take_new(self) -> list[LogRecord]:
        new, self._new = self._new, []
        return new
