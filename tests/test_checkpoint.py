"""Checkpoints on real files: round trip, atomic rename, pruning, refusal of bad or mismatched ones."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from engine.checkpoint import (
    CheckpointError,
    checkpoint_due,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)


def _model(seed: int, width: int = 4) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.Linear(width, 2))


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_round_trip_restores_weights_optimizer_and_rngs(tmp_path: Path) -> None:
    model = _model(0)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(model, opt)
    rng = random.Random(5)
    rng.random()
    torch.manual_seed(9)
    path = save_checkpoint(tmp_path, model=model, optimizer=opt, round=7, policy_version=3, python_rng=rng,
                           extra={"model_id": "seed"})
    expected_next = (rng.random(), torch.rand(1))
    _step(model, opt)  # the reference continues one more step
    after_one_more = [p.detach().clone() for p in model.parameters()]

    fresh = _model(1)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    torch.manual_seed(123)
    ckpt = load_checkpoint(path, model=fresh, optimizer=fresh_opt)
    assert (ckpt.round, ckpt.policy_version, ckpt.extra) == (7, 3, {"model_id": "seed"})
    restored = random.Random()
    restored.setstate(ckpt.python_rng)
    assert (restored.random(), torch.rand(1)) == expected_next
    _step(fresh, fresh_opt)  # the same step from the restored state lands on the same weights
    for a, b in zip(after_one_more, fresh.parameters()):
        assert torch.equal(a, b)


def test_incomplete_writes_are_ignored_and_old_ones_pruned(tmp_path: Path) -> None:
    model = _model(0)
    opt = torch.optim.AdamW(model.parameters())
    for r in (1, 2, 3):
        save_checkpoint(tmp_path, model=model, optimizer=opt, round=r, policy_version=r,
                        python_rng=random.Random(0), keep=2)
    (tmp_path / "ckpt-00000009.tmp").mkdir()  # a crash mid-write leaves only a .tmp directory
    (tmp_path / "ckpt-00000008").mkdir()  # a directory without state.json is not a checkpoint
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-00000002", "ckpt-00000003"]
    assert latest_checkpoint(tmp_path) == tmp_path / "ckpt-00000003"
    assert latest_checkpoint(tmp_path / "absent") is None


def test_refuses_bad_or_mismatched_checkpoints(tmp_path: Path) -> None:
    model = _model(0)
    opt = torch.optim.AdamW(model.parameters())
    path = save_checkpoint(tmp_path, model=model, optimizer=opt, round=1, policy_version=1,
                           python_rng=random.Random(0))
    with pytest.raises(CheckpointError, match="shape mismatch"):
        load_checkpoint(path, model=_model(0, width=5))
    (path / "state.json").write_text('{"format": 1, "round": -1, "policy_version": 0, "extra": {}}')
    with pytest.raises(CheckpointError, match="bad round"):
        load_checkpoint(path, model=_model(0))
    (path / "state.json").write_text("not json")
    with pytest.raises(CheckpointError):
        load_checkpoint(path, model=_model(0))


def test_checkpoint_due_bounds_the_work_a_crash_loses() -> None:
    def due(round_no: int, work: float, last: float | None, every: int = 0, max_loss: float = 30.0,
            overhead: float = 0.02) -> bool:
        return checkpoint_due(round_no, work, last, every=every, max_loss_s=max_loss, overhead=overhead)

    assert due(1, 0.3, None)  # the first round writes one, to learn what a write costs
    assert due(7, 13.0, 0.05)  # a LoRA round of 13 s, a 50 ms write: every round
    assert not due(7, 0.3, 0.05)  # a 0.3 s seed round: not every round ...
    assert due(7, 2.5, 0.05)  # ... but once 2.5 s of work would be lost (2 % overhead)
    assert due(7, 30.0, 5.0)  # an expensive write still happens before 30 s of work are at stake
    assert not due(7, 29.0, 5.0)
    assert due(10, 0.1, 5.0, every=5) and not due(11, 0.1, 5.0, every=5)
    assert not due(1, 100.0, None, max_loss=0.0, overhead=0.0)  # every rule off: only on stop
