"""`sapo bench checkpoint`: what writing a checkpoint costs next to a training round.

For each model, the node's own loading path (`load_for_node`) and its own preset (`cpu-small` for the
seed, `cpu-real` for a pretrained model), one real round, then `repeats` real checkpoint writes
(atomic: temp dir, fsync, rename) of that trainer's state. The ratio write/round is what the
checkpoint policy (SapoConfig.checkpoint_overhead) compares: at 2 % or less, every round is kept.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from engine import tasks
from engine.models.backends import load_for_node
from engine.sapo.config import preset
from engine.sapo.trainer import Trainer
from lab import BENCH_DIR

DESCRIPTION = "checkpoint write cost (seconds, MB) against a real round, seed and SmolLM2-135M LoRA"
LONG = True  # loads SmolLM2 and runs one of its rounds (~1 min)


def _measure(model: str, work: Path, repeats: int) -> dict[str, Any]:
    loaded = load_for_node(model, "auto", "cpu", work)
    cfg = preset("cpu-small" if model == "seed" else "cpu-real").replace(
        checkpoint_seconds=0.0, checkpoint_overhead=0.0, eval_every=0, eval_every_s=0.0)
    trainer = Trainer(loaded.model, loaded.tokenizer, cfg, tasks.preset("rl"), None, work / "ckpt", seed=0,
                      model_id=loaded.model_id, generator=loaded.generator)
    rounds = [trainer.run_round().phase_seconds["total"] for _ in range(2)]
    writes = []
    for _ in range(repeats):
        trainer.round += 1  # a new round each time (an unchanged state is not rewritten)
        t0 = time.perf_counter()
        path = trainer.save_checkpoint()
        writes.append(time.perf_counter() - t0)
    size = sum(f.stat().st_size for f in path.iterdir())
    trainable = sum(p.numel() for p in loaded.model.parameters() if p.requires_grad)
    close = getattr(loaded.generator, "close", None)
    if close is not None:
        close()
    del trainer, loaded
    torch.set_num_threads(torch.get_num_threads())
    write_s = statistics.median(writes)
    return {"backend_round_seconds": rounds, "round_seconds": rounds[-1], "write_seconds": write_s,
            "write_seconds_max": max(writes), "checkpoint_mb": size / 1e6, "trainable_params": trainable,
            "write_over_round": write_s / rounds[-1]}


def run(out_dir: Path = BENCH_DIR, models: tuple[str, ...] | list[str] = ("seed", "smollm2-135m"),
        repeats: int = 5, threads: int = 1) -> dict[str, Any]:
    torch.set_num_threads(threads)
    result: dict[str, Any] = {"threads": threads, "repeats": repeats, "models": {},
                              "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            result["models"][model] = _measure(model, Path(tmp) / model.replace("/", "_"), repeats)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "checkpoint.json").write_text(json.dumps(result, indent=1))
    (out_dir / "checkpoint.md").write_text(table(result) + "\n")
    return result


def table(result: dict[str, Any]) -> str:
    lines = [(f"# Checkpoint cost ({result['threads']} thread, median of {result['repeats']} writes, "
              f"{result['measured_at']})"), "",
             "| model | trainable params | checkpoint | write | round | write / round |", "|---|---|---|---|---|---|"]
    for model, m in result["models"].items():
        lines.append(f"| {model} | {m['trainable_params']:,} | {m['checkpoint_mb']:.1f} MB | "
                     f"{m['write_seconds'] * 1000:.0f} ms | {m['round_seconds']:.2f} s | {m['write_over_round']:.1%} |")
    return "\n".join(lines)
