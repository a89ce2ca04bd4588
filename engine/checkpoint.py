"""Checkpoints: trainable weights + optimizer state + RNG states + counters, no pickle.

Layout of one checkpoint directory `ckpt-<round, 8 digits>/`:
    weights.safetensors     trainable tensors by parameter name (full weights, or the LoRA adapter)
    optimizer.safetensors   optimizer per-parameter tensors, keyed "<param index>/<name>"
    state.json              round, policy_version, python RNG state, optimizer layout, extra (config...)
    rng.safetensors         torch's global CPU RNG state
It is written to a `.tmp` directory and renamed into place, so a crash mid-write leaves the previous
checkpoint as the newest complete one. The newest `keep` checkpoints are kept. Each model trained in one
data dir has its own folder of them (`checkpoint_dir_for`).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from engine.errors import SapoError

FORMAT = 1
_NAME = re.compile(r"^ckpt-(\d{8})$")


class CheckpointError(SapoError, RuntimeError):
    """A checkpoint that can't be read or doesn't fit the model it's loaded into."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    round: int  # rounds completed when saved
    policy_version: int  # optimizer steps taken when saved
    python_rng: Any  # random.Random state (as random.getstate() returns it)
    extra: dict[str, Any]  # free-form JSON (config, model id, ...)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_to_json(state: Any) -> Any:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _rng_from_json(data: Any) -> Any:
    if not (isinstance(data, list) and len(data) == 3 and isinstance(data[1], list)
            and all(isinstance(x, int) and not isinstance(x, bool) for x in data[1])):
        raise CheckpointError("bad python RNG state")
    state = (data[0], tuple(data[1]), data[2])
    random.Random().setstate(state)  # validates (raises on a malformed state)
    return state


def save_checkpoint(directory: str | Path, *, model: Any, optimizer: torch.optim.Optimizer, round: int,
                    policy_version: int, python_rng: random.Random, extra: dict[str, Any] | None = None,
                    keep: int = 2) -> Path:
    """Write a complete checkpoint for `round` and prune old ones -> its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"ckpt-{round:08d}"
    tmp = directory / f"ckpt-{round:08d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    weights = {n: p.detach().contiguous().cpu() for n, p in model.named_parameters() if p.requires_grad}
    save_file(weights, str(tmp / "weights.safetensors"))
    opt_state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, entry in opt_state["state"].items():
        for name, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}/{name}"] = value.detach().contiguous().cpu()
            else:
                scalars.setdefault(str(idx), {})[name] = value
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
    state = {"format": FORMAT, "round": round, "policy_version": policy_version,
             "python_rng": _rng_to_json(python_rng.getstate()), "saved_at": time.time(),
             "optimizer_param_groups": opt_state["param_groups"], "optimizer_scalars": scalars,
             "extra": extra or {}}
    (tmp / "state.json").write_text(json.dumps(state))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _fsync_dir(directory)
    for old in list_checkpoints(directory)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoint_due(round_no: int, work_since_s: float, last_write_s: float | None, *, every: int,
                   max_loss_s: float, overhead: float) -> bool:
    """After a finished round: write a checkpoint now?

    work_since_s: training seconds since the newest checkpoint; last_write_s: what writing it cost
    (None before the first write). Yes when the round rule says so, when a crash would otherwise lose
    more than max_loss_s, or when a write is cheap next to the work it saves (at most `overhead` of
    it). The first round writes one (if any rule is on) to learn what a write costs.
    """
    if every and round_no % every == 0:
        return True
    if max_loss_s and work_since_s >= max_loss_s:
        return True
    if overhead and (last_write_s is None or last_write_s <= overhead * work_since_s):
        return True
    return bool(max_loss_s) and last_write_s is None


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if p.is_dir() and _NAME.match(p.name) and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(directory: str | Path) -> Path | None:
    found = list_checkpoints(directory)
    return found[-1] if found else None


def read_state(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        state = json.loads((path / "state.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {path / 'state.json'}: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: unknown checkpoint format")
    for key in ("round", "policy_version"):
        if isinstance(state.get(key), bool) or not isinstance(state.get(key), int) or state[key] < 0:
            raise CheckpointError(f"{path}: bad {key}")
    if not isinstance(state.get("extra"), dict):
        raise CheckpointError(f"{path}: bad extra")
    return state


def load_weights(path: str | Path, model: Any) -> None:
    """Copy a checkpoint's trainable tensors into `model` (names and shapes must all match)."""
    tensors = load_file(str(Path(path) / "weights.safetensors"))
    params = dict(model.named_parameters())
    missing = [n for n, p in params.items() if p.requires_grad and n not in tensors]
    unknown = [n for n in tensors if n not in params]
    if missing or unknown:
        raise CheckpointError(f"checkpoint does not fit the model: missing {missing[:3]}, unknown {unknown[:3]}")
    with torch.no_grad():
        for name, value in tensors.items():
            if params[name].shape != value.shape:
                raise CheckpointError(f"shape mismatch for {name}: {tuple(value.shape)} vs {tuple(params[name].shape)}")
            params[name].copy_(value)


def load_checkpoint(path: str | Path, *, model: Any, optimizer: torch.optim.Optimizer | None = None,
                    restore_torch_rng: bool = True) -> Checkpoint:
    """Restore weights (and optimizer state, torch RNG) from `path` -> its counters and python RNG state."""
    path = Path(path)
    state = read_state(path)
    load_weights(path, model)
    if optimizer is not None:
        tensors = load_file(str(path / "optimizer.safetensors"))
        per_param: dict[int, dict[str, Any]] = {}
        for key, value in tensors.items():
            idx, _, name = key.partition("/")
            per_param.setdefault(int(idx), {})[name] = value
        scalars = state.get("optimizer_scalars", {})
        if not isinstance(scalars, dict):
            raise CheckpointError(f"{path}: bad optimizer scalars")
        for idx, entry in scalars.items():
            per_param.setdefault(int(idx), {}).update(entry)
        groups = state.get("optimizer_param_groups")
        if not isinstance(groups, list):
            raise CheckpointError(f"{path}: bad optimizer param groups")
        for g in groups:
            if isinstance(g.get("betas"), list):
                g["betas"] = tuple(g["betas"])
        try:
            optimizer.load_state_dict({"state": per_param, "param_groups": groups})
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"{path}: optimizer state does not fit: {exc}") from exc
    if restore_torch_rng:
        torch.set_rng_state(load_file(str(path / "rng.safetensors"))["torch"])
    return Checkpoint(path=path, round=state["round"], policy_version=state["policy_version"],
                      python_rng=_rng_from_json(state.get("python_rng")), extra=state["extra"])


ROOT_MODEL_FILE = "root_model.txt"  # which model owns the top checkpoint folder


def checkpoint_dir_for(base: Path, model: str, configured: str) -> Path:
    """Where `model`'s checkpoints live. `base` itself belongs to one model for good: the one it was
    first used for (recorded in `base/ROOT_MODEL_FILE`; a data dir from before the record belongs to
    `configured`, the model the node was started with). Any other model gets its own folder under
    `base/models/`, so one model's weights never load into another's (same-shaped models would load
    silently), even when a restart starts the node on a model switched to earlier. `base/models/`
    holds no `ckpt-*` entry, so pruning never touches it."""
    record = base / ROOT_MODEL_FILE
    try:
        owner = record.read_text(encoding="utf-8").strip() if record.is_file() else ""
    except (OSError, UnicodeDecodeError):
        owner = ""
    if not owner:
        owner = configured
        base.mkdir(parents=True, exist_ok=True)
        record.write_text(owner + "\n", encoding="utf-8")
    if model == owner:
        return base
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model).name)[:48] or "model"
    return base / "models" / f"{slug}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"
