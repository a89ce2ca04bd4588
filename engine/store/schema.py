"""The node store's SQLite schema and its migrations (engine/store/store.py reads and writes through them).

Each schema version is a step `migrate` applies to an older file; rows already written stay as they are.
"""

from __future__ import annotations

import sqlite3

from engine.metrics import COLUMNS_FROZEN_AT, STORED, columns

# A stored metric added to the registry after v7 takes the next version: the schema follows it.
SCHEMA_VERSION = max(COLUMNS_FROZEN_AT, *(m.since or 1 for m in STORED))

# Per-round scalar metrics (engine/metrics.py), in the order `sapo history` prints them.
ROUND_METRICS: tuple[str, ...] = columns(1)
PHASES: tuple[str, ...] = ("generate", "score", "prepare", "update", "total")
# Added in schema v2 (appended to v1 tables by `migrate`): the format warm-up, recorded apart from the
# correctness reward (format_rate: own completions with a well-formed answer; format_weight: the bonus's
# weight that round), and each specialty's curriculum rung.
ROUND_METRICS_V2: tuple[str, ...] = columns(2)
# Schema v5: where the round's groups came from (own pick, a peer's frontier question, a peer's text
# group), how many of each had signal, and the round's seconds split between them (sapo/frontier.py).
ROUND_METRICS_V5: tuple[str, ...] = columns(5)
# Schema v6: how many of the peers' text groups trained on had signal (with the zero-advantage filter
# off, a group without one enters the loss and teaches nothing).
ROUND_METRICS_V6: tuple[str, ...] = columns(6)
SOURCE_METRICS = ROUND_METRICS_V5 + ROUND_METRICS_V6  # per source: groups, with signal, seconds
# Every metric column, in the table's order (a file migrated from v1 has them in this order too).
STORED_METRICS: tuple[str, ...] = tuple(m.name for m in STORED)
# Schema v4: `refusals`, frames the swarm refused (signature, schema, replay, rate ...) by reason over
# time; groups dropped are rows of `rollouts`. (The table is created for older files too.)
# Schema v3: rounds and evals say which model trained them ('' in rows written before), so a resume
# can roll back exactly the rounds a crash took from that model's weights.
# Schema v7: rounds are numbered per model (primary key (model, round)): a model switched to starts at
# its own round 1 instead of continuing another model's count. `thinned` keeps, per model, what thinning
# removed (rounds, summed reward, seconds), so totals stay exact; evals keep the model's training seconds
# up to their round (what "2 h of training" between two evals reads).

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY, policy_version INTEGER NOT NULL, ts REAL NOT NULL,
    num_local INTEGER NOT NULL, num_external INTEGER NOT NULL,
    {", ".join(f"{m} REAL" for m in ROUND_METRICS)},
    {", ".join(f"seconds_{p} REAL" for p in PHASES)},
    per_specialty_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS evals (
    id INTEGER PRIMARY KEY AUTOINCREMENT, round INTEGER NOT NULL, policy_version INTEGER NOT NULL,
    ts REAL NOT NULL, kind TEXT NOT NULL, k INTEGER NOT NULL, pass1 REAL NOT NULL, passk REAL NOT NULL,
    report_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rollouts (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, origin_peer TEXT NOT NULL,
    specialty TEXT NOT NULL, ref_key TEXT NOT NULL, status TEXT NOT NULL, reason TEXT NOT NULL,
    reward REAL
);
CREATE INDEX IF NOT EXISTS rollouts_peer ON rollouts(origin_peer);
CREATE TABLE IF NOT EXISTS refusals (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, reason TEXT NOT NULL, count INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS peers (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, model TEXT NOT NULL, found_by TEXT NOT NULL,
    address TEXT NOT NULL, first_seen REAL NOT NULL, last_seen REAL NOT NULL,
    received INTEGER NOT NULL DEFAULT 0, used INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS thinned (
    model TEXT PRIMARY KEY, rounds INTEGER NOT NULL, reward_sum REAL NOT NULL, seconds REAL NOT NULL
);
"""


def migrate(db: sqlite3.Connection, version: int) -> None:
    """Bring a database of schema `version` (1 for a fresh file) to SCHEMA_VERSION, in the caller's
    transaction."""
    if version < 2:
        _add_metric_columns(db, 2)
        db.execute("ALTER TABLE rounds ADD COLUMN rungs_json TEXT NOT NULL DEFAULT '{}'")
    if version < 3:
        for table in ("rounds", "evals"):
            db.execute(f"ALTER TABLE {table} ADD COLUMN model TEXT NOT NULL DEFAULT ''")
    if version < 5:
        _add_metric_columns(db, 5)
    if version < 6:
        _add_metric_columns(db, 6)
    if version < 7:
        _key_rounds_by_model(db)
        if "train_seconds" not in {c[1] for c in db.execute("PRAGMA table_info(evals)")}:
            db.execute("ALTER TABLE evals ADD COLUMN train_seconds REAL NOT NULL DEFAULT 0")
        db.execute("UPDATE evals SET train_seconds = (SELECT COALESCE(SUM(r.seconds_total), 0) FROM rounds r "
                   "WHERE r.model = evals.model AND r.round <= evals.round)")
    for since in range(max(version, COLUMNS_FROZEN_AT) + 1, SCHEMA_VERSION + 1):  # metrics added since v7
        _add_metric_columns(db, since)
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))


def _add_metric_columns(db: sqlite3.Connection, since: int) -> None:
    have = {c[1] for c in db.execute("PRAGMA table_info(rounds)")}
    for metric in columns(since):
        if metric not in have:  # a migration interrupted after some columns went in may run again
            db.execute(f"ALTER TABLE rounds ADD COLUMN {metric} REAL")


def _key_rounds_by_model(db: sqlite3.Connection) -> None:
    """Schema v7's key. SQLite cannot change a primary key in place: the table is rebuilt with the same
    columns, its rows copied in round order (the order they were written, which rowid then keeps)."""
    cols = db.execute("PRAGMA table_info(rounds)").fetchall()
    defs = []
    for _cid, name, ctype, notnull, default, _pk in cols:
        column = f"{name} {ctype}" + (" NOT NULL" if notnull or name == "round" else "")
        defs.append(column + (f" DEFAULT {default}" if default is not None else ""))
    names = ", ".join(c[1] for c in cols)
    db.execute(f"CREATE TABLE rounds_by_model ({', '.join(defs)}, PRIMARY KEY (model, round))")
    db.execute(f"INSERT INTO rounds_by_model ({names}) SELECT {names} FROM rounds ORDER BY round")
    db.execute("DROP TABLE rounds")
    db.execute("ALTER TABLE rounds_by_model RENAME TO rounds")
