"""The `history` reply as events: store rows (engine/store/store.py columns) or event dicts, oldest first.

Rows are untrusted like any engine reply: each converts to its event and passes the event's type
check, or is skipped and counted. A round's curriculum rungs are optional extras: a malformed entry is
dropped and the round kept. `totals` (the current model's rounds over its life, not only those sent)
converts to `Totals`, or to None when absent or malformed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.control.protocol import check_event_types
from engine.events import Event, EventError, event_from_dict
from engine.store import PHASES

# Store columns of a round row that are not metrics.
_ROUND_COLUMNS = {"type", "round", "policy_version", "ts", "num_local", "num_external", "metrics",
                  "per_specialty", "per_specialty_reward", "phase_seconds", "rungs", "rungs_json", "model"}
MAX_RUNGS = 64  # specialties kept per round: the node has a dozen; more is garbage, not news
MAX_SPECIALTY = 256  # characters of a specialty name (the store's MAX_TEXT)


def _phase_column(name: str) -> bool:
    """A round's seconds in one phase; other seconds_ columns (per source, schema v5) are metrics."""
    return name.startswith("seconds_") and name[len("seconds_"):] in PHASES


def finite_number(value: Any) -> bool:
    """A real number (not a bool, not NaN or infinite): what any number from the engine must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _nested(value: Any) -> Any:
    """The store may keep nested dicts as JSON text."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def clean_rungs(value: Any) -> dict[str, int]:
    """Curriculum rungs as {specialty: non-negative int}; anything else (a bool, a float, a negative
    rung, a non-dict, JSON text that is not an object) is dropped rather than failing the round."""
    value = _nested(value)
    if not isinstance(value, dict):
        return {}
    rungs: dict[str, int] = {}
    for specialty, rung in value.items():
        if len(rungs) == MAX_RUNGS:
            break
        if (isinstance(specialty, str) and 0 < len(specialty) <= MAX_SPECIALTY and isinstance(rung, int)
                and not isinstance(rung, bool) and rung >= 0):
            rungs[specialty] = rung
    return rungs


def _event(data: dict[str, Any], event_type: str) -> Event:
    data["type"] = event_type
    event = event_from_dict(data)
    check_event_types(event)
    return event


def round_event(row: dict[str, Any]) -> Event:
    if row.get("type") == "round_completed":
        data = dict(row)
        if "rungs" in data:
            data["rungs"] = clean_rungs(data["rungs"])
        return _event(data, "round_completed")
    metrics = _nested(row.get("metrics"))
    if not isinstance(metrics, dict):  # flat store row: every other finite number is a metric column
        metrics = {k: float(v) for k, v in row.items()
                   if k not in _ROUND_COLUMNS and not _phase_column(k) and finite_number(v)}
    phases = _nested(row.get("phase_seconds"))
    if not isinstance(phases, dict):
        phases = {k[len("seconds_"):]: float(v) for k, v in row.items() if _phase_column(k) and finite_number(v)}
    specialty = _nested(row.get("per_specialty_reward", row.get("per_specialty", {})))
    return _event({"round": row.get("round"), "policy_version": row.get("policy_version", 0),
                   "ts": row.get("ts", 0.0), "metrics": metrics, "per_specialty_reward": specialty,
                   "phase_seconds": phases, "num_local": row.get("num_local", 0),
                   "num_external": row.get("num_external", 0),
                   "rungs": clean_rungs(row.get("rungs", row.get("rungs_json"))),
                   "model": row.get("model", "")}, "round_completed")


def eval_event(row: dict[str, Any]) -> Event:
    if row.get("type") == "eval_completed":
        return _event(dict(row), "eval_completed")
    report = _nested(row.get("report"))
    per_specialty = report.get("per_specialty", {}) if isinstance(report, dict) else {}
    return _event({"round": row.get("round"), "pass1": row.get("pass1"), "passk": row.get("passk"),
                   "k": row.get("k", 1), "ts": row.get("ts", 0.0),
                   "per_specialty": _nested(row.get("per_specialty", per_specialty)),
                   "model": row.get("model", "")}, "eval_completed")


def rollout_event(row: dict[str, Any]) -> Event:
    if row.get("type") == "rollout_seen":
        return _event(dict(row), "rollout_seen")
    return _event({"origin_peer": row.get("origin_peer"), "peer_name": row.get("peer_name", ""),
                   "specialty": row.get("specialty"), "question": row.get("question", row.get("ref_key", "")),
                   "completion": row.get("completion", ""), "reward": row.get("reward"),
                   "status": row.get("status"), "reason": row.get("reason", ""), "ts": row.get("ts", 0.0)},
                  "rollout_seen")


def peer_event(row: dict[str, Any]) -> Event:
    if row.get("type") == "peer_updated":
        return _event(dict(row), "peer_updated")
    return _event({"peer_id": row.get("peer_id", row.get("id")), "name": row.get("name", ""),
                   "model": row.get("model", ""), "found_by": row.get("found_by", ""),
                   "address": row.get("address", ""), "connected": bool(row.get("connected", False)),
                   "received": row.get("received", 0), "used": row.get("used", 0),
                   "ts": row.get("last_seen", row.get("ts", 0.0))}, "peer_updated")


CONVERTERS: dict[str, Callable[[dict[str, Any]], Event]] = {
    "rounds": round_event, "evals": eval_event, "rollouts": rollout_event, "peers": peer_event}


def parse_history(history: Any) -> tuple[dict[str, list[Event]], int]:
    """-> ({"rounds": [...], "evals": [...], "rollouts": [...], "peers": [...]}, rows skipped)."""
    parsed: dict[str, list[Event]] = {key: [] for key in CONVERTERS}
    if not isinstance(history, dict):
        return parsed, 1
    bad = 0
    for key, convert in CONVERTERS.items():
        rows = history.get(key, [])
        if not isinstance(rows, list):
            bad += 1
            continue
        for row in rows:
            try:
                if not isinstance(row, dict):
                    raise EventError("row must be an object")
                parsed[key].append(convert(row))
            except (EventError, TypeError, ValueError):
                bad += 1
    # rollouts come newest first from some stores: the feed wants arrival order
    parsed["rollouts"].sort(key=lambda e: e.ts)
    return parsed, bad


@dataclass(frozen=True)
class Totals:
    """The history's `totals`: one model's rounds over its whole life in the store, however many of them
    the reply carries (the dashboard's rounds card, cumulative reward and hours of training come from here)."""

    model: str
    rounds: int
    reward_sum: float
    seconds: float
    last_round: int  # the newest round the totals count (0: none yet)
    eval_seconds: dict[int, float] = field(default_factory=dict)  # training seconds up to each eval's round


def whole_count(value: Any) -> int | None:
    """`value` when it is a count (an int >= 0, not a bool) from another process; else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def parse_totals(history: Any) -> Totals | None:
    """`history["totals"]` (engine/store/store.py `round_totals`) and each eval row's `train_seconds`."""
    raw = history.get("totals") if isinstance(history, dict) else None
    if not isinstance(raw, dict):
        return None
    model, last = raw.get("model"), raw.get("last_round")
    last = 0 if last is None else last
    if not (isinstance(model, str) and len(model) <= MAX_SPECIALTY and whole_count(raw.get("rounds")) is not None
            and whole_count(last) is not None
            and finite_number(raw.get("reward_sum")) and finite_number(raw.get("seconds")) and raw["seconds"] >= 0):
        return None
    seconds: dict[int, float] = {}
    evals = history.get("evals")
    for row in evals if isinstance(evals, list) else []:
        if isinstance(row, dict) and whole_count(row.get("round")) is not None and finite_number(row.get("train_seconds")) \
                and row.get("model", model) == model:
            seconds[row["round"]] = float(row["train_seconds"])
    return Totals(model, raw["rounds"], float(raw["reward_sum"]), float(raw["seconds"]), last, seconds)
