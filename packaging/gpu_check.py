"""GPU check for the CUDA path -- UNMEASURED: no GPU session has run this yet.

What a GPU session runs (one command, a few minutes on any recent NVIDIA card):

    python packaging/gpu_check.py --out /tmp/gpu_check            # nf4 (QLoRA); --quant int8 for 8-bit

It builds a Qwen2-architecture model with Qwen2.5-0.5B-Instruct's published shape (hidden 896, 24
layers, 14 heads / 2 KV heads, intermediate 4864, vocabulary 151936, tied embeddings; ~0.49B
parameters) with *random* weights, saves it with a byte-level tokenizer padded to that vocabulary,
then loads it the way `sapo run --backend bnb-nf4` does (engine.models.backends.load_for_node:
bitsandbytes 4-bit NF4 base, bf16 compute, LoRA on all projections), runs one paper-sized SAPO round
(8 questions x 8 completions, solo) and compares the CUDA peak memory with the fit estimate
(engine.models.fit.estimate_bytes for the same plan and round shape). Random weights rarely emit EOS,
so completions run to the token cap: the worst case. A random reward keeps every group mixed so the
update really runs. Writes gpu_check.json (and prints it).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

QWEN25_05B_SHAPE = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                    "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
                    "max_position_embeddings": 32768, "tie_word_embeddings": True}
# --smoke-cpu: same family, every Linear a multiple of 32 (bitsandbytes' CPU 4-bit kernels need it)
SMOKE_SHAPE = QWEN25_05B_SHAPE | {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "intermediate_size": 256}


def padded_byte_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE (no merges) whose vocabulary is padded with filler tokens to `vocab_size`, so a
    random model's every token id decodes."""
    import itertools

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<bos>", "<eos>"] + alphabet)}
    for a, b, c in itertools.product(alphabet, repeat=3):
        if len(vocab) >= vocab_size:
            break
        vocab[a + b + c] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")


def build_random_qwen2(out: Path, shape: dict[str, Any]) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = padded_byte_tokenizer(shape["vocab_size"])
    config = Qwen2Config(**shape, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check_out"))
    parser.add_argument("--quant", choices=("nf4", "int8"), default="nf4")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=4, help="rows per backward pass (fit's micro_batch)")
    parser.add_argument("--smoke-cpu", action="store_true",
                        help="a CPU dry run of this script on a small model of the same family (no numbers); "
                             "use --quant int8 there: bitsandbytes' CPU 4-bit path fails on biased layers "
                             "(Qwen2's q/k/v) once an eval pass has repacked them")
    args = parser.parse_args(argv)

    import torch

    from engine.models import catalog, fit
    from engine.models.backends import load_for_node
    from engine.models.generate import SampleConfig
    from engine.sapo.config import preset
    from engine.sapo.trainer import Trainer
    from engine.tasks import library

    device = "cpu" if args.smoke_cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (--smoke-cpu tests the script on a CPU)", file=sys.stderr)
        return 2
    cuda = device == "cuda"
    shape_cfg = SMOKE_SHAPE if args.smoke_cpu else QWEN25_05B_SHAPE
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model_dir = build_random_qwen2(args.out / "qwen2-random", shape_cfg)
    t_build = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    loaded = load_for_node(str(model_dir), f"bnb-{args.quant}", device, args.out / "data")
    load_peak = torch.cuda.max_memory_allocated() if cuda else 0
    cfg = preset("paper").replace(sampling=SampleConfig(max_new_tokens=args.max_new_tokens), eval_every=0,
                                  checkpoint_every=0, micro_batch=args.micro_batch,
                                  micro_batch_tokens=args.micro_batch * (args.max_new_tokens + 64))
    draw = random.Random(0)
    trainer = Trainer(loaded.model, loaded.tokenizer, cfg, library.preset("paper"), None, None, seed=0,
                      model_id="qwen2-0.5b-random", reward_fn=lambda q, c: float(draw.random() < 0.5),
                      generator=loaded.generator)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    result = trainer.run_round()
    round_peak = torch.cuda.max_memory_allocated() if cuda else 0
    prompt_tokens = round(sum(len(loaded.tokenizer(library.render_prompt(library.regenerate(g.ref), cfg.prompt_style))
                                  ["input_ids"]) for g in result.local_groups) / len(result.local_groups))
    spec = catalog.spec_from_hf_config(shape_cfg, "qwen2-random")
    shape = fit.RoundShape(prompt_tokens=prompt_tokens, max_new_tokens=args.max_new_tokens,
                           micro_batch=args.micro_batch, gradient_checkpointing=False)
    plan = fit.Plan("transformers+bitsandbytes", args.quant, False)
    estimate = fit.estimate_bytes(spec, plan, shape, "cuda")
    report = {
        "status": "measured by packaging/gpu_check.py" if cuda else "CPU smoke run: no memory numbers",
        "device": torch.cuda.get_device_name(0) if cuda else "cpu", "rows_trained": result.metrics["rows_trained"],
        "quantization": args.quant, "backend_label": loaded.label, "params": spec.params,
        "build_seconds": t_build, "round_phase_seconds": result.phase_seconds,
        "round_metrics": result.metrics,
        "tokens_generated": result.metrics["completion_len_mean"] * cfg.num_local * cfg.completions,
        "peak_bytes_load": load_peak if cuda else None, "peak_bytes_round": round_peak if cuda else None,
        # the estimate counts the CUDA context (fit.RUNTIME_BYTES); the allocator's peak does not
        "peak_bytes_with_context": round_peak + fit.RUNTIME_BYTES["cuda"] if cuda else None,
        "fit_estimate": estimate,
        "estimate_over_measured": estimate["total"] / (round_peak + fit.RUNTIME_BYTES["cuda"]) if cuda else None,
    }
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
