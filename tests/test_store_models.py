"""Rounds numbered per model in the real SQLite store: each model's own count, the current model's
history and totals (exact however many rounds a dashboard loads, and after thinning), a v6 file's
migration, and `sapo history`'s model column."""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path

import pytest

from engine.cli.train import run_history
from engine.store import Store, schema

REPORT = {"k": 2, "overall": {"pass1": 0.25, "passk": 0.5}, "per_specialty": {}}


def _round(store: Store, n: int, model: str, reward: float = 0.5, seconds: float = 10.0, ts: float = 0.0) -> None:
    store.record_round(n, n, {"reward_mean": reward}, {"bf": reward}, {"total": seconds}, 2, 0, ts=ts or None,
                       model=model)


def test_each_model_counts_its_own_rounds_and_the_newest_model_is_current(tmp_path: Path) -> None:
    with Store(tmp_path / "node.db") as store:
        assert store.current_model() is None
        assert store.model_history(10) == {"rounds": [], "evals": [], "totals": None, "model": None}
        for n in range(1, 4):
            _round(store, n, "seed", reward=0.1 * n, ts=float(n))
        store.record_eval(0, 0, REPORT, model="smol", ts=4.0)  # the switched-to model's baseline, before its round 1
        assert store.current_model() == "smol"
        for n in range(1, 3):
            _round(store, n, "smol", reward=0.5, ts=4.0 + n)  # its own round 1 and 2: the seed's rows stay
        _round(store, 2, "smol", reward=0.75, ts=7.0)  # a round replayed after a resume replaces its own row only
        assert [(r["model"], r["round"]) for r in store.rounds()] == [
            ("seed", 1), ("seed", 2), ("seed", 3), ("smol", 1), ("smol", 2)]  # in the order written
        assert [r["round"] for r in store.rounds(model="seed")] == [1, 2, 3]
        assert [r["reward_mean"] for r in store.rounds(model="smol", limit=1)] == [0.75]
        assert (store.last_round(model="seed"), store.last_round(model="smol"), store.last_round(model="x")) == (3, 2, None)
        history = store.model_history(limit=1)
        assert [r["round"] for r in history["rounds"]] == [2] and [e["round"] for e in history["evals"]] == [0]
        assert history["totals"] == {"model": "smol", "rounds": 2, "reward_sum": 1.25, "seconds": 20.0,
                                     "last_round": 2}
        asked = store.model_history(limit=10, model="seed")  # the node's selected model, not the newest
        assert asked["model"] == "seed" and [r["round"] for r in asked["rounds"]] == [1, 2, 3] and not asked["evals"]
        assert store.model_history(limit=10, model="new")["rounds"] == []  # switched to, never trained here
        _round(store, 4, "seed", ts=8.0)  # back to the seed: it is current again
        assert store.current_model() == "seed" and store.round_totals("seed")["rounds"] == 4
        assert store.discard_rounds_after(1, "smol") == [2] and store.last_round(model="seed") == 4


def test_totals_count_every_round_not_the_window_sent_nor_what_thinning_removed(tmp_path: Path) -> None:
    """After a restart the dashboard loads the newest N rounds; the rounds card and the cumulative
    reward must still count all of them (3,647 rounds, not 2,000; 561, not 332)."""
    with Store(tmp_path / "node.db", round_tiers=((100, 10), (300, 100))) as store:
        for n in range(1, 601):
            _round(store, n, "seed", reward=0.25, seconds=2.0)
            if n <= 50:
                _round(store, n, "smol", reward=1.0, seconds=30.0)
        store.record_eval(600, 600, REPORT, model="seed")
        before = store.round_totals("seed")
        assert before == {"model": "seed", "rounds": 600, "reward_sum": 150.0, "seconds": 1200.0, "last_round": 600}
        assert store.thin_rounds() > 0
        assert len(store.rounds(model="seed")) < 200 and len(store.rounds(model="smol")) == 50  # its own horizon
        assert store.round_totals("seed") == before and store.round_totals("smol")["rounds"] == 50
        history = store.model_history(limit=20)
        assert len(history["rounds"]) == 20 and history["totals"]["rounds"] == 600
        assert history["evals"][0]["train_seconds"] == 1200.0  # two hours... of seed rounds: 600 x 2 s
        store.record_eval(600, 600, REPORT, model="seed")  # after thinning, thinned seconds still count
        assert store.evals(model="seed")[-1]["train_seconds"] == 1200.0


def test_a_v6_store_keys_its_rounds_by_model_and_keeps_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "node.db"
    db = sqlite3.connect(path)  # a v6 file: rounds keyed by number alone, a switched model counting on
    db.executescript(schema.SCHEMA)
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    monkeypatch.setattr(schema, "_key_rounds_by_model", lambda db: None)
    schema.migrate(db, 1)
    monkeypatch.undo()
    db.execute("ALTER TABLE evals DROP COLUMN train_seconds")
    db.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    for n in range(1, 6):
        db.execute("INSERT INTO rounds (round, policy_version, ts, num_local, num_external, reward_mean, seconds_total, "
                   "per_specialty_json, model) VALUES (?, ?, ?, 2, 0, 0.5, 60.0, '{}', ?)",
                   (n, n, float(n), "seed" if n <= 3 else "smol"))
    db.execute("INSERT INTO evals (round, policy_version, ts, kind, k, pass1, passk, report_json, model) "
               "VALUES (5, 5, 6.0, 'heldout', 2, 0.3, 0.5, '{}', 'smol')")
    db.commit()
    db.close()
    with Store(path) as store:
        assert store.schema_version == schema.SCHEMA_VERSION
        assert [(r["model"], r["round"]) for r in store.rounds()] == [
            ("seed", 1), ("seed", 2), ("seed", 3), ("smol", 4), ("smol", 5)]
        assert store.evals()[0]["train_seconds"] == 120.0  # smol's rounds 4 and 5, a minute each
        _round(store, 1, "qwen")  # a new model's round 1 overwrites nothing
        assert len(store.rounds()) == 6 and store.rounds(model="seed")[0]["round"] == 1
    pk = sqlite3.connect(path).execute("SELECT name, pk FROM pragma_table_info('rounds') WHERE pk > 0").fetchall()
    assert sorted(pk, key=lambda c: c[1]) == [("model", 1), ("round", 2)]


def test_sapo_history_names_the_model_of_each_round(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Store(tmp_path / "node.db") as store:
        store.record_round(1, 1, {"reward_mean": 0.1}, {}, {"total": 1.0}, 2, 0)  # written before models were kept
        _round(store, 1, "seed")
        _round(store, 1, "smollm2-135m-instruct-q4_1")
        store.record_eval(1, 1, REPORT, model="smollm2-135m-instruct-q4_1")
    assert run_history(argparse.Namespace(data_dir=tmp_path, csv=None, last=20)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["model", "round"]
    # each model's own round 1, under the name a contributor knows it by
    assert [line.split()[:3] for line in out[1:4]] == [["-", "1", "1"], ["seed", "1", "1"],
                                                       ["SmolLM2-135M-Instruct", "1", "1"]]
    assert any("SmolLM2-135M-Instruct round      1 (heldout)" in line for line in out)


def test_a_v7_store_gains_the_energy_columns_and_keeps_its_rounds(tmp_path: Path) -> None:
    path = tmp_path / "node.db"
    with Store(path) as store:
        _round(store, 1, "seed")
    db = sqlite3.connect(path)  # the same file as a v7 engine left it: no energy columns
    for column in ("energy_j", "energy_measured"):
        db.execute(f"ALTER TABLE rounds DROP COLUMN {column}")
    db.execute("UPDATE meta SET value = '7' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    with Store(path) as store:
        assert store.schema_version == schema.SCHEMA_VERSION == 8
        assert store.rounds()[0]["energy_j"] is None  # not measured then, not made up now
        store.record_round(2, 2, {"reward_mean": 0.5, "energy_j": 41.5, "energy_measured": 0.0}, {}, {}, 2, 0,
                           model="seed")
        assert (store.rounds()[1]["energy_j"], store.rounds()[1]["energy_measured"]) == (41.5, 0.0)


def test_sapo_history_gives_each_rounds_energy_and_says_when_it_is_an_estimate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Store(tmp_path / "node.db") as store:
        _round(store, 1, "seed")  # stored before energy was: "-"
        for n, (joules, measured) in enumerate([(40.0, 0.0), (60.0, 1.0)], start=2):
            store.record_round(n, n, {"reward_mean": 0.5, "energy_j": joules, "energy_measured": measured}, {},
                               {"total": 10.0}, 2, 0, model="seed")
    assert run_history(argparse.Namespace(data_dir=tmp_path, csv=None, last=20)) == 0
    out = capsys.readouterr().out.splitlines()
    column = out[0].split().index("J")
    assert [line.split()[column] for line in out[1:4]] == ["-", "~40", "60"]
    assert any(line == "energy: 0.03 Wh over 2 rounds, 5.0 W while training (estimated from CPU time where no "
               "meter was readable)" for line in out)
