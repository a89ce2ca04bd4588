"""The node's SQLite store (WAL): per-round metrics, held-out evals, rollouts seen, peers.

One connection shared by the node's threads behind a lock; every write commits, so metrics already
written survive a crash. Text that came from peers is length-capped; numbers must be finite.
The schema is versioned in `meta`; a newer schema than this code knows is refused, not guessed at.
"""

from __future__ import annotations

import csv
import json
import math
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Self, TextIO

from engine.errors import SapoError
from engine.events import ROLLOUT_STATUSES
from engine.store.schema import (
    PHASES,
    ROUND_METRICS,  # noqa: F401 (re-exported: callers read the v1 columns here)
    SCHEMA,
    SCHEMA_VERSION,
    SOURCE_METRICS,
    STORED_METRICS,
    migrate,
)

MAX_TEXT = 256  # characters kept of any peer-supplied string (names, addresses, reasons)
MAX_REF_KEY = 4096  # a task reference key holds its generator config JSON (<= 2 KiB)
# Older rounds are kept thinner, so a node that trains for months keeps a store whose size grows
# with the log of its rounds, not with them: rows older than N rounds keep only every k-th round.
ROUND_TIERS = ((50_000, 10), (500_000, 100), (5_000_000, 1000))  # (older than N rounds, keep every k-th)
THIN_EVERY = 1000  # rounds recorded between thinning passes
PEER_SOURCES = ("mdns", "bootstrap", "manual", "inbound")  # inbound: a peer that dialled our listener


class StoreError(SapoError, RuntimeError):
    """The database can't be used by this version (newer schema, corrupt file)."""


def _text(value: Any, name: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string")  # noqa: TRY004 (ValueError for every bad input)
    return value[:limit]


def _finite(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


class Store:
    """SQLite store at `path` (created with parents). Use as a context manager or call close()."""

    def __init__(self, path: str | Path, *, max_rollouts: int = 100_000,
                 round_tiers: tuple[tuple[int, int], ...] = ROUND_TIERS) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_rollouts = max_rollouts
        if any(age < 1 or keep < 2 for age, keep in round_tiers):
            raise ValueError("round_tiers: (older than N >= 1 rounds, keep every k >= 2-th)")
        self.round_tiers = round_tiers
        self._rounds_since_thin = 0
        self._lock = threading.Lock()
        self._inserts_since_prune = 0
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
        self._db.row_factory = sqlite3.Row
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across app crashes
            with self._db:
                self._db.executescript(SCHEMA)
                row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                if row is None:
                    self._db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
                elif int(row[0]) > SCHEMA_VERSION:
                    raise StoreError(f"{self.path} has schema v{row[0]}; this version reads up to "
                                     f"v{SCHEMA_VERSION}: upgrade sapo-swarm or use another data dir")
                migrate(self._db, int(row[0]) if row is not None else 1)
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StoreError(f"cannot open store {self.path}: {exc}") from exc
        except StoreError:
            self._db.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, sql: str, params: Iterable[Any] = ()) -> sqlite3.Cursor:
        with self._lock, self._db:
            return self._db.execute(sql, tuple(params))

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._db.execute(sql, tuple(params)).fetchall()]

    @property
    def schema_version(self) -> int:
        return int(self._read("SELECT value FROM meta WHERE key='schema_version'")[0]["value"])

    # -- rounds -------------------------------------------------------------------------------
    def record_round(self, round: int, policy_version: int, metrics: Mapping[str, float],
                     per_specialty: Mapping[str, float], phase_seconds: Mapping[str, float],
                     num_local: int, num_external: int, ts: float | None = None,
                     rungs: Mapping[str, int] | None = None, model: str = "") -> None:
        """Write one round (a replayed round after a resume replaces the old row); `model`: its id."""
        values: list[Any] = [_count(round, "round"), _count(policy_version, "policy_version"),
                  _finite(ts if ts is not None else time.time(), "ts"),
                  _count(num_local, "num_local"), _count(num_external, "num_external")]
        values += [_finite(metrics[m], m) if m in metrics else None for m in STORED_METRICS]
        values += [_finite(phase_seconds[p], p) if p in phase_seconds else None for p in PHASES]
        spec = {_text(k, "specialty"): _finite(v, k) for k, v in per_specialty.items()}
        values.append(json.dumps(spec, sort_keys=True))
        values.append(json.dumps({_text(k, "specialty"): _count(v, k) for k, v in (rungs or {}).items()},
                                 sort_keys=True))
        values.append(_text(model, "model"))
        cols = ["round", "policy_version", "ts", "num_local", "num_external", *STORED_METRICS,
                *(f"seconds_{p}" for p in PHASES), "per_specialty_json", "rungs_json", "model"]
        self._write(f"INSERT OR REPLACE INTO rounds ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    values)
        self._rounds_since_thin += 1
        if self._rounds_since_thin >= THIN_EVERY:
            self._rounds_since_thin = 0
            self.thin_rounds()

    def thin_rounds(self) -> int:
        """Apply `round_tiers` below each model's newest round -> rows removed. What a removed row held
        (a round, its reward, its seconds) is added to its model's `thinned` tally first, so totals stay
        exact. Evals are never thinned."""
        removed = 0
        newest = self._read("SELECT model, MAX(round) AS newest FROM rounds GROUP BY model")
        old = "model = ? AND round <= ? AND round % ? != 0"
        for row in newest:
            for age, keep in self.round_tiers:
                if row["newest"] <= age:
                    continue
                params = (row["model"], row["newest"] - age, keep)
                with self._lock, self._db:
                    self._db.execute(
                        "INSERT INTO thinned (model, rounds, reward_sum, seconds) SELECT model, COUNT(*), "
                        f"COALESCE(SUM(reward_mean), 0), COALESCE(SUM(seconds_total), 0) FROM rounds WHERE {old} "
                        "GROUP BY model ON CONFLICT(model) DO UPDATE SET rounds = rounds + excluded.rounds, "
                        "reward_sum = reward_sum + excluded.reward_sum, seconds = seconds + excluded.seconds", params)
                    removed += self._db.execute(f"DELETE FROM rounds WHERE {old}", params).rowcount
        return removed

    def rounds(self, since: int | None = None, limit: int | None = None,
               model: str | None = None) -> list[dict[str, Any]]:
        """Rounds oldest first: one `model`'s in round order, or every model's in the order they were
        written (rounds are numbered per model). since: rounds numbered above it; limit: the newest
        `limit` of those."""
        where: list[str] = []
        params: list[Any] = []
        order = "seq_" if model is None else "round"
        if model is not None:
            where, params = ["model = ?"], [_text(model, "model")]
        if since is not None:
            where.append("round > ?")
            params.append(since)
        sql = "SELECT rowid AS seq_, * FROM rounds" + (f" WHERE {' AND '.join(where)}" if where else "")
        if limit is not None:
            sql = f"SELECT * FROM ({sql} ORDER BY {order} DESC LIMIT ?) ORDER BY {order}"
            params.append(int(limit))
        else:
            sql += f" ORDER BY {order}"
        rows = self._read(sql, params)
        for r in rows:
            del r["seq_"]
            r["per_specialty"] = json.loads(r.pop("per_specialty_json"))
            r["rungs"] = json.loads(r.pop("rungs_json"))
        return rows

    def source_totals(self, last: int) -> dict[str, float]:
        """SOURCE_METRICS summed over the `last` rounds written last (rounds from before schema v5 add 0; in v5
        rows every peer text group trained on had signal, as the zero-advantage filter leaves them)."""
        sums = ", ".join(f"COALESCE(SUM({m}), 0) AS {m}" for m in SOURCE_METRICS if m != "peer_text_mixed")
        sums += ", COALESCE(SUM(COALESCE(peer_text_mixed, peer_text_groups)), 0) AS peer_text_mixed"
        rows = self._read(f"SELECT {sums} FROM (SELECT * FROM rounds ORDER BY rowid DESC LIMIT ?)",
                          (_count(last, "last"),))
        return {m: float(rows[0][m]) for m in SOURCE_METRICS}

    def discard_rounds_after(self, round: int, model: str) -> list[int]:
        """Roll back what `model` recorded after `round` (rounds and their evals) -> the rounds removed.
        The resumed weights are those of `round`: a crash took the rest. Other models' rows stay, as
        do rows of unknown model (written before schema v3)."""
        if not model:
            return []
        with self._lock, self._db:
            gone = [int(r[0]) for r in self._db.execute(
                "SELECT round FROM rounds WHERE round > ? AND model = ? ORDER BY round", (_count(round, "round"), model))]
            self._db.execute("DELETE FROM rounds WHERE round > ? AND model = ?", (round, model))
            self._db.execute("DELETE FROM evals WHERE round > ? AND model = ?", (round, model))
            if gone:
                self._db.execute("INSERT INTO meta VALUES ('rounds_rolled_back', ?) ON CONFLICT(key) DO UPDATE "
                                 "SET value = CAST(value AS INTEGER) + ?", (str(len(gone)), len(gone)))
        return gone

    def rolled_back_total(self) -> int:
        """Rounds rolled back after crashes, over this store's life."""
        rows = self._read("SELECT value FROM meta WHERE key = 'rounds_rolled_back'")
        return int(rows[0]["value"]) if rows else 0

    def last_round(self, model: str | None = None) -> int | None:
        """The highest round number (of `model`, else of any model)."""
        sql, params = "SELECT MAX(round) AS r FROM rounds", []
        if model is not None:
            sql, params = sql + " WHERE model = ?", [_text(model, "model")]
        row = self._read(sql, params)[0]
        return None if row["r"] is None else int(row["r"])

    def round_totals(self, model: str) -> dict[str, Any]:
        """One model's rounds over its life here, rows thinned away included: how many, their summed mean
        reward (the cumulative reward), their seconds, and the newest round (None: none yet)."""
        live = self._read("SELECT COUNT(*) AS n, COALESCE(SUM(reward_mean), 0) AS reward, COALESCE(SUM(seconds_total), "
                          "0) AS seconds, MAX(round) AS newest FROM rounds WHERE model = ?", (_text(model, "model"),))[0]
        gone = self._read("SELECT rounds, reward_sum, seconds FROM thinned WHERE model = ?", (model,))
        thinned = gone[0] if gone else {"rounds": 0, "reward_sum": 0.0, "seconds": 0.0}
        return {"model": model, "rounds": int(live["n"]) + int(thinned["rounds"]),
                "reward_sum": float(live["reward"]) + float(thinned["reward_sum"]),
                "seconds": float(live["seconds"]) + float(thinned["seconds"]), "last_round": live["newest"]}

    def current_model(self) -> str | None:
        """The model this node trained last: that of the newest round or held-out eval written (a model
        switched to is current from its first held-out check, before its first round)."""
        newest = self._read("SELECT model, ts FROM rounds ORDER BY rowid DESC LIMIT 1")
        newest += self._read("SELECT model, ts FROM evals WHERE kind = 'heldout' ORDER BY id DESC LIMIT 1")
        return str(max(newest, key=lambda r: float(r["ts"]))["model"]) if newest else None

    def model_history(self, limit: int, model: str | None = None) -> dict[str, Any]:
        """What a dashboard shows: `model`'s (default: the current model's) newest `limit` rounds, its
        evals, and its totals over every round (not only the `limit` sent); "model" says whose."""
        model = model or self.current_model()
        if model is None:
            return {"rounds": [], "evals": [], "totals": None, "model": None}
        return {"rounds": self.rounds(limit=limit, model=model), "evals": self.evals(model=model),
                "totals": self.round_totals(model), "model": model}

    def export_rounds_csv(self, out: TextIO) -> int:
        """Write all rounds as CSV, in the order they were written (per-specialty rewards as
        reward_<specialty> columns) -> rows."""
        rows = self.rounds()
        specialties = sorted({s for r in rows for s in r["per_specialty"]})
        head = ["round", "policy_version", "model", "ts", "num_local", "num_external", *STORED_METRICS,
                *(f"seconds_{p}" for p in PHASES), *(f"reward_{s}" for s in specialties)]
        writer = csv.writer(out)
        writer.writerow(head)
        for r in rows:
            writer.writerow([r[c] for c in head[:-len(specialties) or None]]
                            + [r["per_specialty"].get(s, "") for s in specialties])
        return len(rows)

    # -- evals --------------------------------------------------------------------------------
    def record_eval(self, round: int, policy_version: int, report: Mapping[str, Any],
                    kind: str = "heldout", ts: float | None = None, model: str = "") -> None:
        """Store an EvalReport.to_dict() (overall pass1/passk as columns, the rest as JSON), with the
        model's training seconds up to `round` (what the time between two evals reads)."""
        overall = report.get("overall") or {}
        values = (_count(round, "round"), _count(policy_version, "policy_version"),
                  _finite(ts if ts is not None else time.time(), "ts"), _text(kind, "kind"),
                  _count(report.get("k"), "k"), _finite(overall.get("pass1"), "pass1"),
                  _finite(overall.get("passk"), "passk"), json.dumps(dict(report), sort_keys=True),
                  _text(model, "model"))
        self._write("INSERT INTO evals (round, policy_version, ts, kind, k, pass1, passk, report_json, model, "
                    "train_seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, (SELECT COALESCE(SUM(seconds_total), 0) "
                    "FROM rounds WHERE model = ? AND round <= ?) + COALESCE((SELECT seconds FROM thinned WHERE "
                    "model = ?), 0))", (*values, values[-1], values[0], values[-1]))

    def evals(self, kind: str | None = None, model: str | None = None) -> list[dict[str, Any]]:
        """Evals by round (of one `kind`, of one `model`)."""
        where = [(col, value) for col, value in (("kind", kind), ("model", model)) if value is not None]
        sql = "SELECT * FROM evals" + (" WHERE " + " AND ".join(f"{c} = ?" for c, _ in where) if where else "")
        rows = self._read(sql + " ORDER BY round, id", [v for _, v in where])
        for r in rows:
            r["report"] = json.loads(r.pop("report_json"))
        return rows

    # -- rollouts from peers --------------------------------------------------------------------
    def record_rollout(self, origin_peer: str, specialty: str, ref_key: str, status: str,
                       reason: str = "", reward: float | None = None, ts: float | None = None) -> None:
        if status not in ROLLOUT_STATUSES:
            raise ValueError(f"status must be one of {ROLLOUT_STATUSES}, got {status!r}")
        self._write("INSERT INTO rollouts (ts, origin_peer, specialty, ref_key, status, reason, reward) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (_finite(ts if ts is not None else time.time(), "ts"), _text(origin_peer, "origin_peer"),
                     _text(specialty, "specialty"), _text(ref_key, "ref_key", MAX_REF_KEY), status, _text(reason, "reason"),
                     None if reward is None else _finite(reward, "reward")))
        self._inserts_since_prune += 1
        if self._inserts_since_prune >= 1000:  # bounded: the table never grows past max_rollouts
            self._inserts_since_prune = 0
            self._write("DELETE FROM rollouts WHERE id <= (SELECT MAX(id) FROM rollouts) - ?",
                        (self.max_rollouts,))

    def record_refusals(self, counts: Mapping[str, int], ts: float | None = None) -> None:
        """Frames refused since the last call, by reason (rows with a zero count are skipped)."""
        now = _finite(ts if ts is not None else time.time(), "ts")
        rows = [(now, _text(reason, "reason", 64), _count(n, reason)) for reason, n in counts.items() if n]
        if not rows:
            return
        with self._lock, self._db:
            self._db.executemany("INSERT INTO refusals (ts, reason, count) VALUES (?, ?, ?)", rows)
            self._db.execute("DELETE FROM refusals WHERE id <= (SELECT MAX(id) FROM refusals) - ?",
                             (self.max_rollouts,))

    def refusal_totals(self, since: float | None = None) -> dict[str, int]:
        """{reason: frames refused} over the store's life (or since a time)."""
        rows = self._read("SELECT reason, SUM(count) AS n FROM refusals WHERE ts >= ? GROUP BY reason",
                          (since if since is not None else 0.0,))
        return {r["reason"]: int(r["n"]) for r in rows}

    def rollouts(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest `limit` rollouts, newest first."""
        return self._read("SELECT * FROM rollouts ORDER BY id DESC LIMIT ?", (int(limit),))

    def rollout_counts(self) -> dict[str, int]:
        rows = self._read("SELECT status, COUNT(*) AS n FROM rollouts GROUP BY status")
        return {r["status"]: int(r["n"]) for r in rows}

    # -- peers ----------------------------------------------------------------------------------
    def upsert_peer(self, peer_id: str, name: str, model: str, found_by: str, address: str,
                    seen_at: float | None = None) -> None:
        if found_by not in PEER_SOURCES:
            raise ValueError(f"found_by must be one of {PEER_SOURCES}, got {found_by!r}")
        now = _finite(seen_at if seen_at is not None else time.time(), "seen_at")
        self._write("INSERT INTO peers (id, name, model, found_by, address, first_seen, last_seen) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET name=excluded.name, "
                    "model=excluded.model, found_by=excluded.found_by, address=excluded.address, "
                    "last_seen=excluded.last_seen",
                    (_text(peer_id, "peer_id"), _text(name, "name"), _text(model, "model"), found_by,
                     _text(address, "address"), now, now))

    def add_peer_counts(self, peer_id: str, received: int = 0, used: int = 0) -> None:
        self._write("UPDATE peers SET received = received + ?, used = used + ? WHERE id = ?",
                    (_count(received, "received"), _count(used, "used"), _text(peer_id, "peer_id")))

    def peers(self) -> list[dict[str, Any]]:
        return self._read("SELECT * FROM peers ORDER BY last_seen DESC")
