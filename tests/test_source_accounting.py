"""Per-source accounting in the store and `sapo history`: groups, groups with signal and seconds of the
node's own questions, peers' suggested questions and peers' answers (real SQLite)."""

from __future__ import annotations

import argparse
import io
import sqlite3
from pathlib import Path

import pytest

from engine.cli.train import run_history
from engine.sapo.frontier import source_metrics
from engine.store import SOURCE_METRICS, Store, schema


def _round(store: Store, n: int, metrics: dict[str, float]) -> None:
    store.record_round(n, n, {"reward_mean": 0.5, **metrics}, {}, {"total": 4.0}, 2, 1, ts=10.0 + n)


def test_the_store_keeps_each_sources_groups_signal_and_seconds(tmp_path: Path) -> None:
    sources = source_metrics(1, [True, False, True], kept=[0, 2], peer_text=2, gen_seconds=6.0, train_seconds=8.0,
                             peer_text_mixed=1)
    assert set(sources) == set(SOURCE_METRICS)
    with Store(tmp_path / "node.db") as store:
        _round(store, 1, {})  # an engine without sources: counts nothing
        _round(store, 2, sources)
        _round(store, 3, sources)
        row = store.rounds()[-1]
        assert (row["own_pick_groups"], row["suggested_mixed"], row["peer_text_groups"], row["peer_text_mixed"]) \
            == (2, 1, 2, 1)
        totals = store.source_totals(last=2)
        assert totals["own_pick_groups"] == 4 and totals["peer_text_mixed"] == 2
        assert totals["seconds_peer_text"] == pytest.approx(2 * sources["seconds_peer_text"])
        assert store.source_totals(last=3) == totals
        out = io.StringIO()
        store.export_rounds_csv(out)
        head = out.getvalue().splitlines()[0].split(",")
        assert all(m in head for m in SOURCE_METRICS)


def test_a_v5_store_gains_peer_text_mixed_and_reads_its_old_rounds_as_filtered(tmp_path: Path) -> None:
    path = tmp_path / "node.db"
    with Store(path) as store:
        _round(store, 1, source_metrics(0, [True, False], kept=[0], peer_text=2, gen_seconds=1.0, train_seconds=1.0))
    db = sqlite3.connect(path)  # as schema v5 wrote it: no peer_text_mixed column
    db.execute("ALTER TABLE rounds DROP COLUMN peer_text_mixed")
    db.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    with Store(path) as store:
        assert store.schema_version == schema.SCHEMA_VERSION
        assert store.rounds()[0]["peer_text_mixed"] is None and store.rounds()[0]["peer_text_groups"] == 2
        # under the zero-advantage filter every peer text group trained on had signal
        assert store.source_totals(last=10)["peer_text_mixed"] == 2


def test_sapo_history_prints_where_training_came_from(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Store(tmp_path / "node.db") as store:
        _round(store, 1, {})
        _round(store, 2, source_metrics(1, [True, False], kept=[0], peer_text=1, gen_seconds=3.0,
                                        train_seconds=1.0))
    assert run_history(argparse.Namespace(data_dir=tmp_path, csv=None, last=20)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[-5:] == ["own", "sugg", "peer", "cpu%", "o/s/p"]
    assert out[1].split()[-4:] == ["-", "-", "-", "-"]  # a round from before the sources were recorded
    # generation split by own groups (1.5 s each), the update by groups trained on (0.5 s each)
    assert out[2].split()[-4:] == ["1/0", "1/1", "1/1", "38/50/12"]
    summary = "\n".join(out[3:])
    assert "where training came from (last 2 rounds)" in summary
    assert [line.split()[-3:] for line in out[-3:]] == [["1", "0", "38%"], ["1", "1", "50%"], ["1", "1", "12%"]]
    assert out[-3].startswith("  your own questions") and out[-1].startswith("  peers' answers")
