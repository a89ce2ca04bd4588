"""A short probe of this machine before it has rounds of its own: one real round of the model the
doctor picked, timed, for `sapo doctor`'s estimate (engine/doctor.py: `calibrate`).

The catalog's CPU rates were measured on one kind of CPU; a machine with AVX512-BF16 runs a round
about 1.4x faster than they say, an old laptop slower. So the probe does the real work, the way a node
does it: the model loaded as the node loads it, the round's questions and completions generated at its
shape and threads, then one update on all of them (rewards alternate 0/1 within each group, so every
completion trains, as the estimate assumes), timed on the second such round (the first allocates the
context, caches and autograd buffers). Fewer questions would not do: decoding 16 sequences costs
nearly what 32 do (each step reads every weight once), so half a round timed 1.4x slow at 1 thread.
It takes under a minute with a 135M model, most of it loading, so its result is stored beside the
node's data and used until the machine's own measured rounds replace it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.errors import SapoError
from engine.machine import load as machine_load
from engine.models import fit

PROBE_FILE = "round_probe.json"
PROBE_VERSION = 2  # bump when what the probe times changes: older files are then ignored


class ProbeError(SapoError, RuntimeError):
    """The probe could not run here (the model is not on this machine, or it failed to load)."""


def _alternating() -> Any:
    """0, 1, 0, ... within the group: a group with signal whatever the model answers."""
    flip = itertools.count()
    return lambda question, completion: float(next(flip) % 2)


def _probe_config(shape: fit.RoundShape, loaded: Any) -> Any:
    """The node's cpu-real trainer at `shape`, solo, with no evals or checkpoints."""
    from engine.sapo.config import SapoConfig, preset

    cfg = SapoConfig.from_dict(preset("cpu-real").to_dict() | {
        "prompt_style": loaded.prompt_style or "chat-fewshot", "prompt_shots": loaded.prompt_shots or 1,
        "num_local": shape.questions, "num_external": 0, "completions": shape.completions,
        "eval_every": 0, "eval_every_s": 0.0, "checkpoint_every": 0})
    return cfg.replace(sampling=dataclasses.replace(cfg.sampling, max_new_tokens=shape.max_new_tokens))


def run_probe(model: str, shape: fit.RoundShape, threads: int, data_dir: Path) -> dict[str, Any]:
    """Time a real round of `model` (a catalog id on this machine) at `shape` on `threads` CPU threads
    -> that round's seconds and its parts (the keys `calibrate` reads)."""
    import torch

    from engine import tasks
    from engine.models.backends import load_for_node
    from engine.models.llamacpp import LlamaCppConfig
    from engine.sapo.trainer import Trainer

    torch.set_num_threads(max(1, threads))
    started = time.perf_counter()
    try:
        loaded = load_for_node(model, "auto", "cpu", data_dir, llamacpp_cfg=LlamaCppConfig(threads=threads))
    except (FileNotFoundError, KeyError, OSError, ValueError) as exc:
        raise ProbeError(f"cannot probe with {model}: {exc}") from exc
    load_s = time.perf_counter() - started
    trainer = Trainer(loaded.model, loaded.tokenizer, _probe_config(shape, loaded), tasks.preset("rl"), None, None, seed=0,
                      model_id=loaded.model_id, generator=loaded.generator, reward_fn=_alternating())
    try:
        trainer.run_round()  # warm-up: the first round allocates the context, caches and autograd buffers
        result = trainer.run_round()
    finally:
        close = getattr(loaded.generator, "close", None)
        if close is not None:
            close()
    phases, rows = result.phase_seconds, int(result.metrics.get("rows_trained", 0))
    generate = sum(phases.get(p, 0.0) for p in ("generate", "score", "prepare"))
    if rows <= 0 or phases.get("update", 0.0) <= 0:
        raise ProbeError(f"the probe's round of {model} trained nothing")
    per_completion = phases["update"] / rows
    return {"version": PROBE_VERSION, "model": model, "threads": threads, "backend": loaded.label,
            "rounds_probed": 2, "completions_probed": rows, "load_seconds": round(load_s, 1),
            "generate_seconds": round(generate, 2), "update_seconds_per_completion": round(per_completion, 4),
            "round_seconds": round(generate + per_completion * shape.questions * shape.completions, 1),
            "probe_seconds": round(time.perf_counter() - started, 1), "measured_at": time.time()}


def probe_like_a_node(model: str, shape: fit.RoundShape, threads: int, data_dir: Path,
                      timeout_s: float = 900.0) -> dict[str, Any]:
    """`run_probe` in a child process that runs as `sapo run` does: OpenMP workers that wait passively and
    the engine's priority (idle by default). Measured on a quiet 2-core machine, the same round with
    spinning waits generated in 1.6 s where the node takes 2.6-3.4 s: an optimistic estimate."""
    args = [sys.executable, "-m", "engine.round_probe", model, json.dumps(dataclasses.asdict(shape)),
            str(threads), str(data_dir)]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False,
                              env=machine_load.passive_wait_env(os.environ))
    except subprocess.TimeoutExpired as exc:
        raise ProbeError(f"the probe of {model} took over {timeout_s:.0f} s") from exc
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProbeError(f"the probe of {model} failed: {why}")
    probe: dict[str, Any] = json.loads(lines[-1][len("PROBE "):])
    return probe


def _main(argv: list[str]) -> int:
    model, shape, threads, data_dir = argv
    machine_load.apply_priority(machine_load.default_priority())
    try:
        probe = run_probe(model, fit.RoundShape(**json.loads(shape)), int(threads), Path(data_dir))
    except ProbeError as exc:
        print(exc, file=sys.stderr)
        return 1
    print("PROBE " + json.dumps(probe), flush=True)
    return 0


def stored_probe(data_dir: Path, model: str, threads: int) -> dict[str, Any] | None:
    """The probe stored for `model` at `threads` threads, or None (none, another model or thread count,
    an older probe, or a file that does not parse)."""
    try:
        probe = json.loads((data_dir / PROBE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(probe, dict) or probe.get("version") != PROBE_VERSION:
        return None
    if probe.get("model") != model or probe.get("threads") != threads:
        return None
    number = probe.get("round_seconds")
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not 0 < number < 1e6:
        return None
    return probe


def save_probe(data_dir: Path, probe: dict[str, Any]) -> None:
    """Written whole or not at all (a probe killed mid-write leaves the old file)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=data_dir, prefix=".probe-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(probe, f, indent=1)
    os.replace(tmp, data_dir / PROBE_FILE)


__all__ = ["PROBE_FILE", "ProbeError", "probe_like_a_node", "run_probe", "save_probe", "stored_probe"]


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
