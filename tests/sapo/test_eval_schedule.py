"""Held-out evals by training time and the baseline eval, on a real tiny Llama with a real store and
real checkpoints (the clock is set by hand where a test needs 30 minutes to pass)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.events import EvalCompleted, Event, RoundCompleted
from engine.models.generate import SampleConfig
from engine.models.policy import build_tiny_policy, load_policy
from engine.sapo.config import SapoConfig, preset
from engine.sapo.eval_schedule import eval_due, eval_due_in
from engine.sapo.trainer import Trainer
from engine.store import Store
from engine.tasks.library import preset as mix_preset

HOUR = 3600.0
CFG = SapoConfig(num_local=2, completions=4, sampling=SampleConfig(max_new_tokens=6), checkpoint_every=1,
                 checkpoint_seconds=0.0, checkpoint_overhead=0.0, eval_every=0, eval_every_s=HOUR,
                 eval_per_specialty=1, eval_k=2, lr=1e-3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "m", seed=5)


def _trainer(model_dir: Path, tmp: Path, store: Store | None, **kw: Any) -> Trainer:
    model, tok = load_policy(model_dir)
    return Trainer.resume(model, tok, CFG, mix_preset("rl"), store, tmp / "ckpt", 7, model_id="tiny",
                          reward_fn=lambda q, c: float(len(c) % 2), **kw)


def test_when_an_eval_is_due_by_rounds_by_time_or_both() -> None:
    rounds, timed, both, off = (CFG.replace(eval_every=10, eval_every_s=0.0), CFG,
                                CFG.replace(eval_every=10), CFG.replace(eval_every_s=0.0))
    assert eval_due(rounds, 20, 0.0) and not eval_due(rounds, 21, 10 * HOUR)
    assert eval_due(timed, 3, HOUR) and not eval_due(timed, 20, HOUR - 1)
    assert eval_due(both, 20, 0.0) and eval_due(both, 3, HOUR) and not eval_due(off, 100, 10 * HOUR)
    assert eval_due_in(rounds, 17, 0.0, 30.0) == 90.0  # 3 rounds of ~30 s
    assert eval_due_in(timed, 17, HOUR - 600, 30.0) == 600.0 and eval_due_in(timed, 1, 2 * HOUR, 5.0) == 0.0
    assert eval_due_in(both, 17, HOUR - 60, 30.0) == 60.0 and eval_due_in(off, 17, 0.0, 30.0) is None
    with pytest.raises(ValueError, match="eval_every_s"):
        CFG.replace(eval_every_s=-1.0)
    with pytest.raises(ValueError, match="eval_every_s"):
        CFG.replace(eval_every_s=float("nan"))
    # the real model's preset checks by time (its rounds take 10-70 s), the seed's by rounds
    assert preset("cpu-real").eval_every_s == 1800.0 and preset("cpu-real").eval_every == 0
    assert preset("cpu-small").eval_every and not preset("cpu-small").eval_every_s


def test_a_baseline_then_evals_by_training_time_and_the_clock_survives_a_restart(model_dir: Path,
                                                                                 tmp_path: Path) -> None:
    events: list[Event] = []
    store = Store(tmp_path / "node.db")
    trainer = _trainer(model_dir, tmp_path, store, on_event=events.append)
    first = trainer.run_round()
    assert [(e["round"], e["model"], e["train_seconds"]) for e in store.evals()] == [(0, "tiny", 0.0)]
    assert first.eval is None and 0 < trainer.eval_clock < 60
    assert first.metrics["eval_due_in_s"] == pytest.approx(HOUR - trainer.eval_clock)
    kinds = [type(e) for e in events if isinstance(e, (RoundCompleted, EvalCompleted))]
    assert kinds == [EvalCompleted, RoundCompleted]  # the baseline came before the first update
    assert all(e.model == "tiny" for e in events if isinstance(e, (RoundCompleted, EvalCompleted)))

    trainer.eval_clock = HOUR - 1e-6  # an hour of training later (whatever the number of rounds)
    second = trainer.run_round()
    assert second.eval is not None and second.metrics["eval_due_in_s"] == 0.0 and trainer.eval_clock == 0.0
    evals = store.evals(model="tiny")
    assert [e["round"] for e in evals] == [0, 2]
    seconds = sum(r["seconds_total"] for r in store.rounds(model="tiny"))
    assert evals[1]["train_seconds"] == pytest.approx(seconds)  # what "N h of training" reads

    third = trainer.run_round()
    assert third.eval is None and third.checkpoint is not None
    resumed = _trainer(model_dir, tmp_path, store)
    assert resumed.round == 3 and resumed.eval_clock == trainer.eval_clock > 0
    resumed.run_round()
    assert [e["round"] for e in store.evals()] == [0, 2]  # no second baseline for a model that has trained
    store.close()


def test_the_baseline_runs_once_and_only_where_there_is_a_record(model_dir: Path, tmp_path: Path) -> None:
    store = Store(tmp_path / "node.db")
    _trainer(model_dir, tmp_path / "a", store).run_round()  # "a" dies before its first checkpoint...
    lost = _trainer(model_dir, tmp_path / "b", store)
    assert lost.round == 0  # ... (another folder: no checkpoint) and starts over at round 0
    lost.run_round()
    assert [e["round"] for e in store.evals()] == [0]  # its baseline stands: not taken twice
    off = _trainer(model_dir, tmp_path / "c", Store(tmp_path / "other.db"))
    off.cfg = CFG.replace(eval_every_s=0.0)  # evals off: no baseline either
    off.run_round()
    assert off.store is not None and off.store.evals() == []
    harness = _trainer(model_dir, tmp_path / "d", None)  # no store: a harness evaluates on its own
    assert harness.run_round().eval is None
    store.close()
