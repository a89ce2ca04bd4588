"""`sapo bench fit`: the training-memory estimate next to the measured peak of one real round.

Each model runs in a fresh subprocess (so peaks don't mix): build or load the model, note the
resident memory after imports (the runtime), generate the round's completions with a KV cache, then
take one full training step (forward over micro-batches, fp32 log-softmax of the sampled tokens,
backward, Adam). The process's peak RSS is compared to the estimate of `engine.models.fit`, both
with and without the fixed runtime term.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from engine.models import fit
from engine.models.catalog import spec_from_hf_config
from engine.paths import SEED_MODEL_DIR
from lab import BENCH_DIR

TINY_MODELS = {  # random Llama-style models built here: (hidden, layers, heads, kv, intermediate, vocab)
    "tiny-random-4m": (256, 4, 8, 4, 704, 4096),
    "tiny-random-32k-vocab": (384, 6, 8, 4, 1024, 32000),
}
SHAPE = fit.RoundShape(questions=8, completions=8, prompt_tokens=48, max_new_tokens=96, micro_batch=16,
                       gradient_checkpointing=False)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


def _child(model: str, threads: int) -> dict[str, Any]:
    """Runs inside the subprocess: one generation phase and one training step."""
    import transformers

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    # transformers imports model code lazily: load it before the baseline so the runtime measured
    # is the framework's, and what comes after is the model's and the round's
    import transformers.generation.utils
    import transformers.models.llama.modeling_llama

    baseline = _rss_bytes()
    if model == "seed":
        net = transformers.AutoModelForCausalLM.from_pretrained(SEED_MODEL_DIR, dtype=torch.float32)
    else:
        h, layers, heads, kv, inter, vocab = TINY_MODELS[model]
        cfg = transformers.LlamaConfig(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
                                       num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
                                       max_position_embeddings=512, tie_word_embeddings=True)
        net = transformers.LlamaForCausalLM(cfg)
    vocab = net.config.vocab_size
    n_seq, s_prompt = SHAPE.sequences, SHAPE.prompt_tokens
    prompts = torch.randint(3, vocab, (n_seq, s_prompt))
    started = time.perf_counter()
    with torch.no_grad():  # generation: KV cache for the whole round, fixed length (no early EOS)
        out = net.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, top_k=0,
                           top_p=1.0, max_new_tokens=SHAPE.max_new_tokens,
                           min_new_tokens=SHAPE.max_new_tokens, pad_token_id=0)
    gen_s = time.perf_counter() - started
    opt = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=1e-5)
    started = time.perf_counter()
    for chunk in out.split(SHAPE.micro_batch):
        logits = net(chunk).logits[:, s_prompt - 1:-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, chunk[:, s_prompt:, None]).squeeze(-1)
        (-logp.mean() * len(chunk) / n_seq).backward()
        del logits, logp
    opt.step()
    opt.zero_grad(set_to_none=True)
    train_s = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"baseline_bytes": baseline, "peak_bytes": peak, "config": net.config.to_dict(),
            "generate_seconds": gen_s, "train_seconds": train_s}


def measure(model: str, threads: int) -> dict[str, Any]:
    code = f"import json; from lab.bench.fit import _child; print(json.dumps(_child({model!r}, {threads})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=1800)
    child = json.loads(out.stdout.strip().splitlines()[-1])
    spec = spec_from_hf_config(child["config"], model)
    plan = fit.Plan("transformers", "fp32", True)
    terms = fit.estimate_bytes(spec, plan, SHAPE, "cpu")
    measured_model = child["peak_bytes"] - child["baseline_bytes"]
    estimated_model = terms["total"] - terms["runtime"]
    return {
        "model": model, "params": spec.params, "plan": "transformers fp32 full fine-tuning",
        "estimate_bytes": terms["total"], "estimate_without_runtime_bytes": estimated_model,
        "measured_peak_bytes": child["peak_bytes"], "measured_runtime_bytes": child["baseline_bytes"],
        "measured_without_runtime_bytes": measured_model,
        "ratio_total": terms["total"] / child["peak_bytes"],
        "ratio_without_runtime": estimated_model / measured_model,
        "terms": terms, "generate_seconds": child["generate_seconds"],
        "train_seconds": child["train_seconds"],
    }


def run(out_dir: Path = BENCH_DIR, threads: int = 2, include_seed: bool = True) -> dict[str, Any]:
    models = list(TINY_MODELS) + (["seed"] if include_seed and (SEED_MODEL_DIR / "config.json").exists() else [])
    rows = [measure(m, threads) for m in models]
    result = {"bench": "fit", "shape": SHAPE.__dict__, "threads": threads, "results": rows,
              "goal": "estimate within 25% of the measured peak",
              "all_within_25pct": all(abs(r["ratio_total"] - 1) <= 0.25 for r in rows)}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "fit.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / "fit.md").write_text(table(result))
    return result


def table(result: dict[str, Any]) -> str:
    mib = 1024**2
    shape = (f"One round of {SHAPE.questions}x{SHAPE.completions} completions, {SHAPE.prompt_tokens}+"
             f"{SHAPE.max_new_tokens} tokens, micro-batch {SHAPE.micro_batch}, CPU fp32, full fine-tuning.")
    lines = ["# sapo bench fit", "", shape, "",
             "| model | params | estimate MiB | measured peak MiB | ratio | model-only est. | model-only meas. | ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["results"]:
        lines.append(f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['estimate_bytes'] / mib:.0f} | "
                     f"{r['measured_peak_bytes'] / mib:.0f} | {r['ratio_total']:.2f} | "
                     f"{r['estimate_without_runtime_bytes'] / mib:.0f} | "
                     f"{r['measured_without_runtime_bytes'] / mib:.0f} | {r['ratio_without_runtime']:.2f} |")
    return "\n".join(lines) + "\n"


def with_shape(**changes: Any) -> fit.RoundShape:
    return replace(SHAPE, **changes)
