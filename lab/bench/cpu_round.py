"""`sapo bench cpu-round`: a whole SAPO round on a CPU, with and without the fast paths.

Rounds that train are what a contributor's machine spends its time on, so every completion gets a
reward that alternates 0/1 within its group (synthetic: every group has a non-zero advantage and the
update covers all 64 completions; a tiny pretrained model on the paper mix scores 0 and would skip
its update). Configurations, each from a fresh load of the same weights, same trainer seed:

  hf-fp32         HF `generate`, fp32 update: what a round costs without the fast paths
  llamacpp-fp32   llama.cpp generating (the node's defaults), fp32 update
  llamacpp-bf16   llama.cpp generating, update under bf16 autocast (SapoConfig.autocast "bf16")

Round 1 of the two llama.cpp configurations trains on the very same completions (same sampler,
seeds and weights), so their update times compare like for like.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from lab import BENCH_DIR
from lab.bench.generate import round_trainer

DESCRIPTION = "a SAPO round that trains on all 64 completions: HF + fp32 vs llama.cpp + fp32 vs llama.cpp + bf16"
LONG = True  # several minutes per configuration on SmolLM2-135M
CONFIGS = {"hf-fp32": ("hf", "off"), "llamacpp-fp32": ("llamacpp", "off"), "llamacpp-bf16": ("llamacpp", "bf16")}


def _round_phases(model: str, work: Path, threads: int, generator: str, autocast: str, rounds: int,
                  max_new_tokens: int) -> list[dict[str, float]]:
    flip = itertools.count()
    trainer, loaded = round_trainer(model, work, threads, generator, "paper", max_new_tokens,
                                    reward_fn=lambda q, c: float(next(flip) % 2), autocast=autocast)
    out = []
    for _ in range(rounds):
        r = trainer.run_round()
        out.append({**r.phase_seconds, "rows_trained": r.metrics.get("rows_trained", 0.0)})
    loaded.generator.close()
    return out


def run(out_dir: Path = BENCH_DIR, model: str = "smollm2-135m", threads: int = 1, rounds: int = 2,
        max_new_tokens: int = 128) -> dict[str, Any]:
    torch.set_num_threads(threads)
    result: dict[str, Any] = {"model": model, "threads": threads, "rounds": rounds, "max_new_tokens": max_new_tokens,
                              "torch": torch.__version__, "load_average_at_start": os.getloadavg()[0],
                              "configs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (generator, autocast) in CONFIGS.items():
            phases = _round_phases(model, Path(tmp), threads, generator, autocast, rounds, max_new_tokens)
            result["configs"][name] = {"rounds": phases,
                                       "median": {k: statistics.median(p[k] for p in phases) for k in phases[0]}}
            gc.collect()
    result["load_average_at_end"] = os.getloadavg()[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "cpu_round.json").write_text(json.dumps(result, indent=1))
    (out_dir / "cpu_round.md").write_text(table(result) + "\n")
    return result


def table(result: dict[str, Any]) -> str:
    base = result["configs"]["hf-fp32"]["median"]["total"]
    lines = [(f"{result['model']}, {result['threads']} thread(s), paper round 8 x 8, {result['max_new_tokens']}-token "
              f"cap, every completion trained (synthetic alternating rewards); median of {result['rounds']} rounds; "
              f"load average {result['load_average_at_start']:.1f} -> {result['load_average_at_end']:.1f}"), "",
             "| configuration | generate s | update s | round s | vs hf-fp32 | round 1 update s |",
             "|---|---|---|---|---|---|"]
    for name, c in result["configs"].items():
        m = c["median"]
        lines.append(f"| {name} | {m['generate']:.1f} | {m['update']:.1f} | {m['total']:.1f} | "
                     f"{base / m['total']:.2f}x | {c['rounds'][0]['update']:.1f} |")
    return "\n".join(lines)
