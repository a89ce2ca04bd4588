"""The SQLite store on real files: rounds, evals, rollouts, peers, schema version, bad input."""

from __future__ import annotations

import io
import sqlite3
import threading
from pathlib import Path

import pytest

from engine.store import PHASES, ROUND_METRICS, Store, StoreError, schema


def _metrics(x: float) -> dict[str, float]:
    return {m: x for m in ROUND_METRICS}


def test_rounds_survive_reopen_and_replace_on_replay(tmp_path: Path) -> None:
    path = tmp_path / "node.db"
    with Store(path) as store:
        assert store.schema_version == schema.SCHEMA_VERSION
        for r in range(1, 4):
            store.record_round(r, r, _metrics(r / 10), {"bf": r / 10}, {"generate": 0.5, "total": 1.0}, 8, 0,
                               ts=100.0 + r)
        store.record_round(3, 3, _metrics(0.9), {"bf": 0.9}, {}, 8, 0, ts=200.0)  # replayed after resume
    with Store(path) as store:
        rows = store.rounds()
        assert [r["round"] for r in rows] == [1, 2, 3]
        assert rows[2]["reward_mean"] == 0.9 and rows[2]["seconds_generate"] is None
        assert rows[0]["per_specialty"] == {"bf": 0.1} and rows[0]["seconds_generate"] == 0.5
        assert [r["round"] for r in store.rounds(since=1)] == [2, 3]
        assert [r["round"] for r in store.rounds(limit=2)] == [2, 3]
        assert store.last_round() == 3
        out = io.StringIO()
        assert store.export_rounds_csv(out) == 3
        lines = out.getvalue().splitlines()
        assert lines[0].startswith("round,policy_version") and lines[0].endswith("reward_bf")
        assert lines[1].split(",")[-1] == "0.1"
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_v1_store_gains_the_format_and_rung_columns_and_keeps_its_rounds(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)  # a v1 database as the previous release wrote it
    cols = ", ".join(f"{m} REAL" for m in ROUND_METRICS) + ", " + ", ".join(f"seconds_{p} REAL" for p in PHASES)
    db.executescript(f"""CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '1');
        CREATE TABLE rounds (round INTEGER PRIMARY KEY, policy_version INTEGER NOT NULL, ts REAL NOT NULL,
            num_local INTEGER NOT NULL, num_external INTEGER NOT NULL, {cols}, per_specialty_json TEXT NOT NULL);""")
    db.execute("INSERT INTO rounds (round, policy_version, ts, num_local, num_external, reward_mean, "
               "per_specialty_json) VALUES (1, 1, 5.0, 4, 0, 0.25, ?)", ('{"bf": 0.25}',))
    db.commit()
    db.close()
    with Store(path) as store:
        assert store.schema_version == schema.SCHEMA_VERSION
        old = store.rounds()[0]
        assert old["reward_mean"] == 0.25 and old["rungs"] == {} and old["format_rate"] is None
        store.record_round(2, 2, {**_metrics(0.5), "format_rate": 0.75, "format_weight": 0.1}, {"bf": 0.5}, {}, 4, 0,
                           rungs={"basic_arithmetic": 2})
    with Store(path) as store:  # reopening a v2 store migrates nothing twice
        new = store.rounds()[1]
        assert new["format_rate"] == 0.75 and new["format_weight"] == 0.1 and new["rungs"] == {"basic_arithmetic": 2}
        with pytest.raises(ValueError):
            store.record_round(3, 3, _metrics(0.5), {}, {}, 4, 0, rungs={"basic_arithmetic": -1})


def test_rejects_non_finite_and_bad_values(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        with pytest.raises(ValueError):
            store.record_round(1, 1, {"loss": float("nan")}, {}, {}, 1, 0)
        with pytest.raises(ValueError):
            store.record_round(-1, 1, {}, {}, {}, 1, 0)
        with pytest.raises(ValueError):
            store.record_rollout("p", "bf", "k", "eaten")
        with pytest.raises(ValueError):
            store.upsert_peer("p", "n", "m", "carrier-pigeon", "addr")
        assert store.rounds() == []


def test_evals_rollouts_and_peers(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db", max_rollouts=10) as store:
        store.record_eval(5, 5, {"k": 8, "overall": {"pass1": 0.2, "passk": 0.5}, "per_specialty": {}})
        ev = store.evals("heldout")
        assert len(ev) == 1 and ev[0]["pass1"] == 0.2 and ev[0]["report"]["k"] == 8
        store.upsert_peer("peer1", "x" * 1000, "seed", "mdns", "127.0.0.1:1", seen_at=1.0)
        store.upsert_peer("peer1", "alice", "seed", "bootstrap", "127.0.0.1:2", seen_at=2.0)
        store.add_peer_counts("peer1", received=3, used=1)
        store.add_peer_counts("peer1", received=2)
        (peer,) = store.peers()
        assert (peer["name"], peer["found_by"], peer["first_seen"], peer["last_seen"]) == ("alice", "bootstrap", 1.0, 2.0)
        assert (peer["received"], peer["used"]) == (5, 1)
        for i in range(1005):  # pruning runs every 1000 inserts and keeps max_rollouts
            store.record_rollout("peer1", "bf", f"bf|{{}}|1|{i}", "used" if i % 2 else "dropped",
                                 "zero_advantage" if i % 2 == 0 else "", reward=1.0)
        newest = store.rollouts(limit=3)
        assert [r["ref_key"] for r in newest] == ["bf|{}|1|1004", "bf|{}|1|1003", "bf|{}|1|1002"]
        assert sum(store.rollout_counts().values()) < 1005


def test_threads_share_one_store(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        def write(base: int) -> None:
            for r in range(base, base + 50):
                store.record_round(r, r, {}, {}, {}, 1, 0)
        threads = [threading.Thread(target=write, args=(b,)) for b in (0, 100, 200)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(store.rounds()) == 150


def test_refuses_a_newer_schema_and_garbage(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema v99"):
        Store(path)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError):
        Store(junk)


def test_a_resume_rolls_back_exactly_the_rounds_its_model_lost(tmp_path: Path) -> None:
    with Store(tmp_path / "node.db") as store:
        for r in range(1, 8):  # rounds 1-4 by "a" (checkpointed at 3), 5-6 by "b", 7 by "a" again
            model = "b" if r in (5, 6) else "a"
            store.record_round(r, r, {"loss": 0.1}, {}, {}, 1, 0, model=model)
            store.record_eval(r, r, {"k": 1, "overall": {"pass1": 0.0, "passk": 0.0}}, model=model)
        assert store.discard_rounds_after(3, "a") == [4, 7]
        assert [(r["round"], r["model"]) for r in store.rounds()] == [(1, "a"), (2, "a"), (3, "a"), (5, "b"), (6, "b")]
        assert [e["round"] for e in store.evals()] == [1, 2, 3, 5, 6]
        assert store.discard_rounds_after(3, "a") == [] and store.discard_rounds_after(0, "") == []
        assert store.rolled_back_total() == 2


def test_frame_refusals_are_kept_by_reason_over_time(tmp_path: Path) -> None:
    with Store(tmp_path / "node.db", max_rollouts=3) as store:
        store.record_refusals({"bad_signature": 2, "stale": 0}, ts=10.0)
        store.record_refusals({"bad_signature": 1, "duplicate": 4}, ts=20.0)
        assert store.refusal_totals() == {"bad_signature": 3, "duplicate": 4}
        assert store.refusal_totals(since=15.0) == {"bad_signature": 1, "duplicate": 4}
        with pytest.raises(ValueError):
            store.record_refusals({"x": -1})
        for t in range(10):  # bounded like the rollouts table
            store.record_refusals({"rate_limited": 1}, ts=30.0 + t)
        assert store._read("SELECT COUNT(*) AS n FROM refusals")[0]["n"] <= 4


def test_old_rounds_are_thinned_so_the_store_stays_bounded(tmp_path: Path) -> None:
    """The newest rounds at full resolution, older ones every 10th, oldest every 100th; evals stay."""
    import engine.store.store as store_module

    with Store(tmp_path / "s.db", round_tiers=((100, 10), (1000, 100))) as store:
        store.record_eval(5, 5, {"k": 1, "overall": {"pass1": 0.1, "passk": 0.1}}, ts=1.0)
        for r in range(1, 3001):
            store.record_round(r, r, _metrics(0.5), {}, {}, 2, 0, ts=float(r))
        assert store_module.THIN_EVERY <= 3000  # at least one pass ran on its own
        store.thin_rounds()
        kept = [row["round"] for row in store.rounds()]
        assert kept[-100:] == list(range(2901, 3001))  # the newest 100 untouched
        assert [r for r in kept if 2000 < r <= 2900] == list(range(2010, 2901, 10))
        assert [r for r in kept if r <= 2000] == list(range(100, 2001, 100))
        assert len(store.evals()) == 1 and store.last_round() == 3000
    with pytest.raises(ValueError, match="round_tiers"):
        Store(tmp_path / "t.db", round_tiers=((100, 1),))
