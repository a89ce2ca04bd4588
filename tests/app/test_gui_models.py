"""The GUI's Qt-free view models, on hand-built events and on rows from a real SQLite store."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from app.models import AppModel
from app.models.dashboard import DashboardModel
from app.models.feed import FeedModel
from app.models.history import parse_history
from app.models.node import NodeModel
from app.models.peers import PeersModel
from app.models.ring import Ring, Window, decimate
from engine.control.protocol import ControlProtocolError, status_from_wire
from engine.control.status import NodeStatus
from engine.events import EvalCompleted, PeerUpdated, RolloutSeen, RoundCompleted, StateChanged
from engine.store import Store


def _round(n: int, reward: float, **metrics: float) -> RoundCompleted:
    return RoundCompleted(round=n, policy_version=n, metrics={"reward_mean": reward, **metrics},
                          per_specialty_reward={"bf": reward / 2}, phase_seconds={"generate": 0.5, "update": 0.25},
                          num_local=4, num_external=4)


def _seen(peer: str, question: str, status: str, reason: str = "", reward: float | None = 1.0) -> RolloutSeen:
    return RolloutSeen(origin_peer=peer, peer_name=f"name-{peer}", specialty="bf", question=question,
                       completion="c", reward=reward, status=status, reason=reason)


def test_ring_keeps_the_newest_points_contiguous() -> None:
    ring = Ring(4)
    for i in range(11):
        ring.append(i, 10 * i)
        assert len(ring) == min(i + 1, 4)
        assert ring.x.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(ring.x, [7, 8, 9, 10])
    np.testing.assert_array_equal(ring.y, [70, 80, 90, 100])
    assert ring.version == 11 and ring.last() == 100
    with pytest.raises(ValueError):
        Ring(0)


def test_window_mean_min_max() -> None:
    window = Window(3)
    for value in (1.0, 5.0, 3.0, 2.0):
        window.push(value)
    assert (window.mean(), window.min(), window.max()) == (pytest.approx(10 / 3), 2.0, 5.0)


def test_dashboard_moving_average_band_and_cumulative() -> None:
    model = DashboardModel(window=2)
    for n, reward in enumerate((0.0, 1.0, 0.5, 0.25), start=1):
        assert model.apply_round(_round(n, reward, frac_reward_zero_std=0.5, tokens_per_s=100.0 * n))
    s = model.series
    np.testing.assert_allclose(s["reward"].y, [0.0, 1.0, 0.5, 0.25])
    np.testing.assert_allclose(s["reward_avg"].y, [0.0, 0.5, 0.75, 0.375])
    np.testing.assert_allclose(s["reward_lo"].y, [0.0, 0.0, 0.5, 0.25])
    np.testing.assert_allclose(s["reward_hi"].y, [0.0, 1.0, 1.0, 0.5])
    np.testing.assert_allclose(s["cumulative"].y, [0.0, 1.0, 1.5, 1.75])  # summed, as the node sent none
    np.testing.assert_allclose(s["zero_std"].y, [0.5] * 4)
    np.testing.assert_allclose(s["tokens_per_s"].y, [100, 200, 300, 400])
    assert len(s["completion_len"]) == 0  # absent metric: no fake points
    np.testing.assert_allclose(model.specialty["bf"].y, [0.0, 0.25, 0.375, 0.1875])
    assert set(model.phases) == {"generate", "update"}
    assert model.rounds == 4 and model.last_round == 4


def test_dashboard_ignores_replayed_rounds_and_prefers_the_nodes_cumulative() -> None:
    model = DashboardModel()
    model.apply_round(_round(1, 0.5, cumulative_reward=10.0))
    version = model.version
    assert not model.apply_round(_round(1, 0.9))
    assert model.version == version and model.rounds == 1
    assert model.latest("cumulative") == 10.0
    model.apply_eval(EvalCompleted(round=1, pass1=0.2, passk=0.6, k=8, per_specialty={}))
    assert not model.apply_eval(EvalCompleted(round=1, pass1=0.3, passk=0.6, k=8, per_specialty={}))
    assert model.latest("pass1") == 0.2


def test_feed_counts_each_group_once_across_status_changes() -> None:
    feed = FeedModel(capacity=3)
    feed.apply(_seen("A", "q1", "pooled"))
    feed.apply(_seen("A", "q1", "used"))  # the same group, now trained on
    feed.apply(_seen("B", "q2", "dropped", "question hash mismatch", reward=None))
    feed.apply(_seen("B", "q3", "dropped", ""))
    assert (len(feed.rows), feed.pooled, feed.dropped_total) == (3, 0, 2)
    assert feed.dropped == {"question hash mismatch": 1, "unspecified": 1}
    changes = feed.take_changes()
    assert changes.added == 3 and changes.removed == 0 and changes.updated == {0}
    assert feed.newest_first(0).seen.question == "q3" and feed.newest_first(2).status == "used"
    feed.apply(_seen("C", "q4", "pooled"))  # capacity 3: q1 scrolls out, counters keep it
    assert len(feed.rows) == 3 and feed.index_of(0) is None
    assert feed.take_changes().removed == 1 and feed.index_of(3) == 0


def test_peers_model_keeps_newest_news_and_bounds_its_size() -> None:
    peers = PeersModel(capacity=2)
    peers.apply(PeerUpdated(peer_id="a", name="a", model="seed", found_by="mdns", address="x", connected=True, ts=10))
    peers.apply(PeerUpdated(peer_id="a", name="a", model="seed", found_by="mdns", address="y", connected=False, ts=5))
    assert peers.rows["a"].address == "x" and peers.connected == 1  # older news ignored
    peers.apply(PeerUpdated(peer_id="b", name="b", model="seed", found_by="bootstrap", address="z",
                            connected=False, ts=20))
    peers.apply(PeerUpdated(peer_id="c", name="c", model="seed", found_by="mdns", address="w", connected=True, ts=30))
    assert set(peers.rows) == {"a", "c"}  # the disconnected one went first
    assert [r.peer_id for r in peers.sorted_rows()] == ["c", "a"]
    peers.touch("a", 40)  # a rollout from it arrived
    peers.touch("a", 35)
    peers.touch("nobody", 50)
    assert peers.rows["a"].last_seen == 40 and set(peers.rows) == {"a", "c"}


def test_node_model_status_validation_and_tooltip() -> None:
    node = NodeModel()
    for bad in ({"state": "bogus"}, {"round": -3}, {"peers": True}):  # the control client refuses these
        with pytest.raises(ControlProtocolError):
            status_from_wire({"model": "seed", **bad})
    node.apply_status(status_from_wire({"model": "seed", "policy_version": 7, "newer_key": 1}))
    assert (node.state, node.round, node.peers, node.model, node.policy_version) == ("stopped", 0, 0, "seed", 7)
    node.apply_state(StateChanged(state="pausing", detail="after this round"))
    node.connected = True
    assert node.active and "Pausing after this round" in node.tooltip() and "after this round" in node.tooltip()


def test_history_from_a_real_store(tmp_path: Path) -> None:
    with Store(tmp_path / "node.db") as store:
        for n in range(1, 6):
            store.record_round(n, n, {"reward_mean": n / 10, "frac_reward_zero_std": 0.5, "tokens_per_s": 900.0},
                               {"bf": 0.1 * n}, {"generate": 1.0, "update": 0.5}, 4, 4, ts=1000.0 + n)
        store.record_eval(5, 5, {"k": 8, "overall": {"pass1": 0.2, "passk": 0.5},
                                 "per_specialty": {"bf": {"pass1": 0.2, "passk": 0.5}}}, ts=1006.0)
        store.record_rollout("peerA", "bf", "bf|{}|1|2", "used", reward=1.0, ts=1003.0)
        store.record_rollout("peerA", "bf", "bf|{}|1|3", "dropped", "zero advantage", reward=0.0, ts=1004.0)
        store.upsert_peer("peerA", "amber-falcon", "seed", "mdns", "192.168.1.2:7070", seen_at=1005.0)
        store.add_peer_counts("peerA", received=2, used=1)
        history = {"rounds": store.rounds(), "evals": store.evals(), "rollouts": store.rollouts(),
                   "peers": store.peers()}
    model = AppModel()
    model.load_history(history)
    assert model.bad_history_rows == 0
    assert model.dashboard.rounds == 5 and model.node.round == 5
    np.testing.assert_allclose(model.dashboard.series["reward"].y, [0.1, 0.2, 0.3, 0.4, 0.5])
    assert set(model.dashboard.phases) == {"generate", "update"}
    assert "seconds_generate" not in str(model.dashboard.series)
    assert model.dashboard.latest("pass1") == 0.2
    assert (len(model.feed.rows), model.feed.dropped_total, model.peers.totals()) == (2, 1, (2, 1))
    assert model.peers.rows["peerA"].name == "amber-falcon" and not model.peers.rows["peerA"].connected


def test_bad_history_rows_are_skipped_and_counted() -> None:
    good = _round(1, 0.5).to_dict()
    history = {"rounds": [good, {"round": "x"}, "row", {"round": 2, "reward_mean": math.inf}],
               "evals": [{"round": 1, "pass1": "high", "passk": 0.1}], "rollouts": "nope", "peers": [{}]}
    parsed, bad = parse_history(history)
    assert [e.round for e in parsed["rounds"]] == [1, 2]  # the inf metric column is dropped, not the row
    assert parsed["rounds"][1].metrics == {}
    assert bad == 5
    assert parse_history(None)[1] == 1


def test_decimate_keeps_extremes_and_the_newest_points() -> None:
    x = np.arange(1000, dtype=float)
    y = np.zeros(1000)
    y[503], y[777] = 5.0, -3.0  # spikes must survive
    dx, dy = decimate(x, y, 100)
    assert len(dx) == len(dy) <= 100
    assert dy.max() == 5.0 and dy.min() == -3.0
    assert dx[-1] >= 980 and np.all(np.diff(dx) >= 0)
    sx, _ = decimate(x[:50], y[:50], 100)  # small series pass through untouched
    assert sx is not None and len(sx) == 50


def test_status_refresh_updates_identity_but_never_state_or_counters() -> None:
    node = NodeModel()
    node.apply_state(StateChanged(state="solo"))
    node.apply_round(_round(7, 0.5))
    version = node.version
    node.apply_identity(NodeStatus(state="stopped", round=3, model="tiny-b", device="cpu"))
    assert (node.state, node.round, node.model, node.device, node.backend) == ("solo", 7, "tiny-b", "cpu", "")
    assert node.version == version + 1
    node.apply_identity(NodeStatus(model="tiny-b", device="cpu"))
    assert node.version == version + 1  # nothing changed: no redraw


def test_model_switch_progress_text() -> None:
    from app.views.machine import progress_text, short_model_name
    from engine.events import ModelProgress

    assert short_model_name("/home/me/models/tiny-b/") == "tiny-b" and short_model_name("qwen3-0.6b") == "qwen3-0.6b"
    assert progress_text(ModelProgress("qwen3-0.6b", "download", 256, 1024, "0.2 of 1.0 MiB")) == \
        "Downloading qwen3-0.6b 25% (0.2 of 1.0 MiB)"
    assert progress_text(ModelProgress("qwen3-0.6b", "download", 0, 0)) == "Downloading qwen3-0.6b"
    assert progress_text(ModelProgress("C:\\models\\tiny", "load", 0, 0)) == "Loading tiny…"
    assert progress_text(ModelProgress("/m/tiny-b", "ready", 1, 1)) == "Switched to tiny-b: the next round trains it."
    assert progress_text(ModelProgress("x", "error", 0, 0, "unknown model 'x'")) == \
        "Could not switch to x: unknown model 'x'"
