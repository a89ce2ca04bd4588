"""`sapo bench round`: seconds per phase of a paper-sized round, and our update vs TRL's GRPOTrainer.

Same work on both sides: one paper-sized batch (8 questions x 8 completions sampled from the model),
every row carrying a non-zero advantage (verifier rewards where a group is mixed, else alternating
1/0, so neither side can skip rows), token-level loss normalisation (ours `tokens`, TRL `dapo`),
beta 0, eps 0.2/0.28, one pass, AdamW lr 1e-4, grad-norm clip 1, the same thread count, fp32.
TRL's update runs through `GRPOTrainer.train()` with generation replaced by the prepared batch, and is
timed per optimizer step by a callback; ours is `policy_update`. The first step of each is warm-up.
The two alternate `repeats` times and the ratio uses each side's fastest step (the least disturbed by
other processes on a shared machine); medians are reported too. Both start from the same weights, so
the parameters after one step are compared as a correctness check.
"""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from engine.models.generate import generate, left_pad
from engine.models.policy import load_policy
from engine.paths import REPO_ROOT, SEED_MODEL_DIR
from engine.sapo.config import preset
from engine.sapo.records import Provenance, RolloutGroup
from engine.sapo.rows import advantages_of
from engine.sapo.trainer import Trainer
from engine.sapo.update import TrainRow, make_optimizer, policy_update
from engine.tasks import library
from engine.tasks.library import preset as mix_preset
from engine.tasks.prompts import PromptBuilder, PromptSpec
from lab import BENCH_DIR

DESCRIPTION = "one paper-sized round per phase, and our GRPO update vs TRL's GRPOTrainer"


def _shown(path: Path) -> str:
    """A model path as the report shows it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def _batch(model: Any, tok: Any, cfg: Any, seed: int) -> tuple[list[Any], dict[str, Any]]:
    import random

    mix = library.preset("rl")
    questions = [library.regenerate(r) for r in mix.sample_refs(random.Random(seed), 8, cfg.dataset_seed)]
    render = PromptBuilder(PromptSpec(cfg.prompt_style, cfg.prompt_shots), tok)
    prompts = [render(q) for q in questions]
    groups = generate(model, tok, prompts, cfg.completions, cfg.sampling, seed=seed)
    rows, mixed = [], 0
    for q, prompt, comps in zip(questions, prompts, groups):
        rewards = [library.score(q, c.text) for c in comps]
        if len(set(rewards)) > 1:
            mixed += 1
        else:
            rewards = [float(i % 2) for i in range(len(comps))]
        group = RolloutGroup(q.ref, q.hash, tuple(c.text for c in comps), Provenance.local("bench", 0, 0),
                             rewards=tuple(rewards))
        prompt_ids = tuple(tok(prompt)["input_ids"])
        for c, adv in zip(comps, advantages_of(group, cfg.advantage_eps)):
            rows.append(TrainRow(prompt_ids, c.token_ids, adv, False))
    info = {"rows": len(rows), "mixed_groups_from_verifier": mixed,
            "completion_tokens": sum(len(r.completion_ids) for r in rows),
            "prompt_tokens_mean": statistics.fmean(len(r.prompt_ids) for r in rows)}
    return rows, info


def _ours(model_dir: Path, rows: list[Any], cfg: Any, steps: int) -> tuple[list[float], Any]:
    model, tok = load_policy(model_dir)
    opt = make_optimizer(model, cfg)
    times, first = [], None
    for i in range(steps + 1):
        stats = policy_update(model, opt, rows, cfg, tok.pad_token_id)
        times.append(stats.seconds)
        if i == 0:
            first = [p.detach().clone() for p in model.parameters()]
    return times[1:], first


def _trl(model_dir: Path, rows: list[Any], cfg: Any, steps: int, threads: int) -> tuple[list[float], Any, float]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model, tok = load_policy(model_dir)
    pad = tok.pad_token_id
    prompt_ids, prompt_mask = left_pad([r.prompt_ids for r in rows], pad)
    width = max(len(r.completion_ids) for r in rows)
    comp = torch.full((len(rows), width), pad, dtype=torch.long)
    comp_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        comp[i, :len(r.completion_ids)] = torch.tensor(r.completion_ids)
        comp_mask[i, :len(r.completion_ids)] = 1
    prepared = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": comp,
                "completion_mask": comp_mask, "advantages": torch.tensor([r.advantage for r in rows]),
                "num_items_in_batch": comp_mask.sum()}

    class PreparedBatch(GRPOTrainer):  # type: ignore[misc]
        """GRPOTrainer whose generation returns the bench batch: the rest of its step is TRL's own."""

        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            return {k: v.clone() for k, v in prepared.items()}

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.times: list[float] = []
            self.params: Any = None
            self._t = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._t = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.times.append(time.perf_counter() - self._t)
            if self.params is None:
                self.params = [p.detach().clone() for p in kw["model"].parameters()]

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, per_device_train_batch_size=len(rows), gradient_accumulation_steps=1,
                          num_generations=cfg.completions, max_completion_length=cfg.sampling.max_new_tokens,
                          learning_rate=cfg.lr, beta=0.0, epsilon=cfg.eps_low, epsilon_high=cfg.eps_high,
                          loss_type="dapo", num_iterations=1, max_steps=steps + 1, lr_scheduler_type="constant",
                          weight_decay=0.0, max_grad_norm=cfg.max_grad_norm, optim="adamw_torch",
                          report_to="none", save_strategy="no", logging_steps=1, use_cpu=True, bf16=False,
                          disable_tqdm=True, dataloader_num_workers=0, seed=0)
        dataset = Dataset.from_dict({"prompt": ["x"] * len(rows)})
        trainer = PreparedBatch(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                                args=args, train_dataset=dataset, processing_class=tok, callbacks=[timer])
        torch.set_num_threads(threads)  # accelerate may have changed it
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return timer.times[1:], timer.params, float(losses[0]) if losses else float("nan")


def _phases(model_dir: Path, rounds: int, seed: int) -> dict[str, float]:
    model, tok = load_policy(model_dir)
    cfg = preset("paper").replace(checkpoint_every=0, eval_every=0)
    trainer = Trainer(model, tok, cfg, mix_preset("rl"), None, None, seed)
    results = [trainer.run_round() for _ in range(rounds + 1)][1:]  # the first round warms up
    return {k: statistics.median(r.phase_seconds[k] for r in results) for k in results[0].phase_seconds} | {
        "groups_trained_mean": statistics.fmean(r.metrics["groups_trained"] for r in results)}


def run(out_dir: Path = BENCH_DIR, model_dir: Path = SEED_MODEL_DIR, threads: int = 1, steps: int = 4,
        rounds: int = 5, seed: int = 0, repeats: int = 3) -> dict[str, Any]:
    torch.set_num_threads(threads)
    cfg = preset("paper").replace(loss_norm="tokens", filter_zero_advantage=False)
    model, tok = load_policy(model_dir)
    rows, info = _batch(model, tok, cfg, seed)
    ours: list[float] = []
    trl_times: list[float] = []
    trl_params, trl_loss, trl_version = None, float("nan"), None
    for _ in range(repeats):
        times, ours_params = _ours(model_dir, rows, cfg, steps)
        ours += times
        try:
            times, trl_params, trl_loss = _trl(model_dir, rows, cfg, steps, threads)
            import trl

            trl_version = trl.__version__
            trl_times += times
        except ImportError:
            pass
    torch.set_num_threads(threads)
    diff = None
    if trl_params is not None and ours_params is not None:
        diff = max(float((a - b).abs().max()) for a, b in zip(ours_params, trl_params))
    # Our first-pass loss on the same batch, for the side-by-side check.
    fresh, _ = load_policy(model_dir)
    our_loss = policy_update(fresh, make_optimizer(fresh, cfg), rows, cfg, tok.pad_token_id).loss
    result: dict[str, Any] = {
        "model": _shown(model_dir), "parameters": sum(p.numel() for p in model.parameters()),
        "threads": threads, "torch": torch.__version__, "trl": trl_version, "machine": platform.processor() or
        platform.machine(), "batch": info, "round_phases_s": _phases(model_dir, rounds, seed),
        "update_s": {"ours_min": min(ours), "ours_median": statistics.median(ours), "ours_all": ours,
                     "trl_min": min(trl_times) if trl_times else None,
                     "trl_median": statistics.median(trl_times) if trl_times else None, "trl_all": trl_times},
        "first_step_loss": {"ours": our_loss, "trl": trl_loss},
        "param_max_abs_diff_after_one_step": diff, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if trl_times:
        result["ratio_ours_over_trl"] = min(ours) / min(trl_times)
        result["ratio_of_medians"] = statistics.median(ours) / statistics.median(trl_times)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "round.json").write_text(json.dumps(result, indent=1))
    (out_dir / "round.md").write_text(table(result) + "\n")
    return result


def table(result: dict[str, Any]) -> str:
    ph = result["round_phases_s"]
    up = result["update_s"]
    b = result["batch"]
    lines = [
        f"# One paper-sized round (8 questions x 8 completions), {result['model']}",
        (f"{result['parameters'] / 1e6:.2f}M parameters, {result['threads']} thread(s), torch {result['torch']}, "
         f"TRL {result['trl']}; measured {result['measured_at']}"), "",
        "| phase | seconds (median) |", "|---|---|",
        *(f"| {k} | {v:.3f} |" for k, v in ph.items() if k != "groups_trained_mean"),
        f"| (groups trained per round, mean) | {ph['groups_trained_mean']:.1f} |", "",
        (f"## The same GRPO update ({b['rows']} rows, {b['completion_tokens']} completion tokens, every row "
         "with a non-zero advantage)"), "",
        "| implementation | s/update (fastest) | s/update (median) | first-step loss |", "|---|---|---|---|",
        (f"| ours (`policy_update`) | {up['ours_min']:.4f} | {up['ours_median']:.4f} | "
         f"{result['first_step_loss']['ours']:+.5f} |"),
    ]
    if up["trl_median"] is not None:
        lines.append(f"| TRL `GRPOTrainer` (loss_type dapo) | {up['trl_min']:.4f} | {up['trl_median']:.4f} | "
                     f"{result['first_step_loss']['trl']:+.5f} |")
        lines += ["", (f"**ratio ours / TRL = {result['ratio_ours_over_trl']:.3f}** (fastest steps; goal <= 0.5), "
                       f"{result['ratio_of_medians']:.3f} on medians; largest parameter difference after one "
                       f"step: {result['param_max_abs_diff_after_one_step']:.2e}")]
    else:
        lines += ["", "TRL not installed (`pip install -e '.[bench]'`): no ratio."]
    return "\n".join(lines)
