"""Will this model *train* on this machine, and how long would a round take? Then: which one to pick.

Memory estimate for one SAPO round (bytes), every term documented:

  weights      = embedding_params * compute_bytes + linear_params * weight_bytes(quantization)
                 (bitsandbytes keeps embeddings, norms and lm_head in the compute dtype; nf4 stores
                 4 bits + a scale per 64 weights + double-quantized scales ≈ 0.516 B/param; int8
                 1 B + a row scale; a GGUF build adds its own file for llama.cpp generation)
  trainable    = full fine-tuning: every parameter; LoRA rank r: layers * r * Σ(in + out) over the 7
                 projections. Each trainable parameter costs 4 (fp32 grad) + 8 (Adam m, v) bytes,
                 plus 4 for an fp32 master copy when the compute dtype is 16-bit and training is full.
  activations  = what backward keeps for one micro-batch of m sequences of s tokens. Per token and
                 layer a SwiGLU decoder saves ≈ 6h + 2·kv + 4i values (norm inputs, q/k/v, attention
                 output, residuals, gate/up/act/product); SDPA keeps no s² score matrix. With gradient
                 checkpointing only each layer's input (h) is kept, plus one layer recomputed.
  logits       = m · s · vocab · 4 bytes · 3 (fp32 logits, log-softmax, its gradient): with a 152k
                 vocabulary this term dominates, which is why the micro-batch is small on big vocabs.
  kv_cache     = 2 · layers · kv_dim · (prompt + new tokens) · (questions · completions) · compute
                 bytes, during generation (freed before the update).
  runtime      = fixed cost of the framework in the process: CUDA context ≈ 0.6 GiB on GPUs; on CPU
                 and MPS the resident torch + transformers runtime ≈ 0.45 GiB (measured by
                 `sapo bench fit`), plus 8% allocator slack on everything else.

  peak = runtime + weights + optimizer + max(kv_cache + generation logits, activations + logits)

Round time = prompt tokens prefilled · 2·params / prefill_flops + new tokens · 2·params / decode_flops
           + packed trained tokens · (6 full | 4 LoRA)·params · passes / train_flops,
with effective (not peak) FLOP rates per device class (`effective_flops`). Prompts count once per
question where they are shared: llama.cpp prefills a prompt once for its L samples, and the update
packs a group's L completions behind one copy of its prompt (engine/sapo/logprobs.py). Counting the
prompt per completion made the estimate several times pessimistic for few-shot prompts.
The CPU pick sizes the round a CPU node runs (`shape_for`: the cpu-small / cpu-real presets), not the
paper's 8 x 8 x 256 tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from engine.machine.hardware import GIB, HardwareProfile
from engine.models.catalog import GGUF_BYTES_PER_PARAM, ModelSpec

WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0 + 4 / 4096, "nf4": 0.516}
COMPUTE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 2, "nf4": 2}
RUNTIME_BYTES = {"cuda": int(0.6 * GIB), "mps": int(0.45 * GIB), "cpu": int(0.45 * GIB)}
ALLOCATOR_SLACK = 1.08
FITS_WELL, TIGHT, NO_FIT = "fits well", "tight", "does not fit"
WELL_FRACTION = 0.8  # "fits well" leaves 20% of the budget for the rest of the machine
# Effective CPU FLOP/s per physical core (see effective_flops; calibrated against measured rounds).
CPU_DECODE_LLAMACPP = 25e9
CPU_DECODE_HF = 14e9
CPU_PREFILL = 60e9
CPU_MATMUL = 38e9


@dataclass(frozen=True)
class RoundShape:
    """The round being sized (paper: 8 questions x 8 completions)."""

    questions: int = 8
    completions: int = 8
    prompt_tokens: int = 192
    max_new_tokens: int = 256
    micro_batch: int = 4  # sequences per backward pass (the logits term scales with it)
    num_iterations: int = 1
    gradient_checkpointing: bool = True
    lora_rank: int = 16
    mean_new_fraction: float = 0.6  # completions stop early: mean length / max_new_tokens

    @property
    def sequences(self) -> int:
        return self.questions * self.completions

    @property
    def seq_len(self) -> int:
        return self.prompt_tokens + self.max_new_tokens


# What CPU nodes run (engine/sapo/config.py presets): the seed's compact prompts (cpu-small), and a
# pretrained chat model's 3-shot prompts with answer-only completions (cpu-real: ~10 of 24 tokens).
CPU_SEED_ROUND = RoundShape(questions=4, completions=8, prompt_tokens=16, max_new_tokens=32)
CPU_REAL_ROUND = RoundShape(questions=2, completions=16, prompt_tokens=240, max_new_tokens=24, mean_new_fraction=0.45)


def shape_for(spec: ModelSpec, hw: HardwareProfile) -> RoundShape:
    """The round a node of this kind runs: the CPU presets' shapes on CPUs, the paper's elsewhere."""
    if hw.kind != "cpu":
        return RoundShape()
    return CPU_SEED_ROUND if spec.id == "seed" else CPU_REAL_ROUND


@dataclass(frozen=True)
class Plan:
    """A way to run a model: backend, quantization, full or LoRA training."""

    backend: str  # "transformers", "transformers+bitsandbytes", "llamacpp+transformers"
    quantization: str  # "fp32", "bf16", "fp16", "int8", "nf4" (training weights)
    full_finetune: bool


@dataclass(frozen=True)
class Estimate:
    model: str
    backend: str
    quantization: str
    full_finetune: bool
    params: int
    trainable_params: int
    weights_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    logits_bytes: int
    kv_cache_bytes: int
    runtime_bytes: int
    estimated_bytes: int
    budget_bytes: int
    verdict: str
    round_seconds: float
    available: bool
    micro_batch: int = 1  # sequences per backward pass that this estimate assumes
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trainable_params(spec: ModelSpec, full: bool, rank: int) -> int:
    if full:
        return spec.params
    return spec.layers * rank * sum(a + b for a, b in spec.linear_shapes)


def estimate_bytes(spec: ModelSpec, plan: Plan, shape: RoundShape, device_kind: str) -> dict[str, int]:
    """The terms of the module docstring, in bytes."""
    compute = COMPUTE_BYTES[plan.quantization]
    embed_and_norms = spec.params - spec.linear_params
    weights = embed_and_norms * compute + spec.linear_params * WEIGHT_BYTES[plan.quantization]
    if spec.is_gguf:  # llama.cpp holds its own copy for generation
        weights += spec.params * GGUF_BYTES_PER_PARAM[spec.gguf_quant or "F16"]
    trainable = trainable_params(spec, plan.full_finetune, shape.lora_rank)
    master = 4 if (plan.full_finetune and compute == 2) else 0
    optimizer = trainable * (4 + 8 + master)
    m, s = min(shape.micro_batch, shape.sequences), shape.seq_len
    per_token_layer = 6 * spec.hidden + 2 * spec.kv_dim + 4 * spec.intermediate
    if shape.gradient_checkpointing:
        activations = m * s * (spec.layers * spec.hidden + per_token_layer) * compute
    else:
        activations = m * s * spec.layers * per_token_layer * compute
    logits = m * s * spec.vocab * 4 * 3
    kv_cache = 2 * spec.layers * spec.kv_dim * s * shape.sequences * compute
    gen_logits = shape.sequences * spec.vocab * 4 * 2
    body = weights + optimizer + max(kv_cache + gen_logits, activations + logits)
    runtime = RUNTIME_BYTES[device_kind]
    return {"weights": int(weights), "optimizer": int(optimizer), "activations": int(activations),
            "logits": int(logits), "kv_cache": int(kv_cache), "runtime": runtime,
            "total": int(runtime + body * ALLOCATOR_SLACK), "trainable": trainable}


def effective_flops(hw: HardwareProfile, plan: Plan) -> tuple[float, float, float]:
    """(prefill, decode, training) FLOP/s actually reached on small models.

    CPU, per physical core, measured on a 2-core x86 without AVX512, SmolLM2-135M, 1 thread, a cpu-real
    round that trains all 32 completions (3-shot prompts of ~228 tokens, completions ~10.4 tokens):
    generate 6.9 s, update 17.7 s, 24.6 s in all; the estimate says 26.5 s. The cpu-real shape of now,
    2 questions x 16 (one prompt prefilled per question): 18.3 s measured, 17.6 s estimated. That is llama.cpp prefill
    ~60 GFLOP/s, decode ~25 (f16 weights widened to fp32; transformers ~14), the packed LoRA update
    ~38. CPUs with AVX512-BF16 run ~2x faster (bench/cpu_round.md): the estimate stays the conservative
    one, and rounds whose groups have no signal skip most of the update (solo rounds averaged 12 s). CUDA: 15 TFLOP/s bf16 on Ampere or newer, 5 otherwise, 4-bit dequantization
    costing ~40%. MPS: ~2 TFLOP/s fp16.
    """
    if hw.kind == "cuda":
        base = 15e12 if (hw.gpus and hw.gpus[0].bf16) else 5e12
        if plan.quantization in ("nf4", "int8"):
            base *= 0.6
        return base, base, base
    if hw.kind == "mps":
        return 2e12, 2e12, 2e12
    cores = max(1, hw.cpu.physical_cores)
    decode = (CPU_DECODE_LLAMACPP if plan.backend.startswith("llamacpp") else CPU_DECODE_HF) * cores
    return CPU_PREFILL * cores, decode, CPU_MATMUL * cores


def round_seconds(spec: ModelSpec, plan: Plan, shape: RoundShape, hw: HardwareProfile) -> float:
    prefill_flops, decode_flops, train_flops = effective_flops(hw, plan)
    shared = plan.backend.startswith("llamacpp")  # llama.cpp prefills a prompt once for its L samples
    prefill = (shape.questions if shared else shape.sequences) * shape.prompt_tokens
    new_tokens = shape.sequences * shape.max_new_tokens * shape.mean_new_fraction
    packed = shape.questions * (shape.prompt_tokens + shape.completions * shape.max_new_tokens
                                * shape.mean_new_fraction) * shape.num_iterations
    train_cost = 6 * spec.params if plan.full_finetune else 4 * spec.params  # LoRA skips weight grads
    return (prefill * 2 * spec.params / prefill_flops + new_tokens * 2 * spec.params / decode_flops
            + packed * train_cost / train_flops)


def plans_for(spec: ModelSpec, hw: HardwareProfile) -> list[Plan]:
    """Ways to train `spec` on this device, best quality first."""
    if spec.id == "seed":
        return [Plan("transformers", "fp32" if hw.kind == "cpu" else "fp16" if hw.kind == "mps" else "bf16"
                     if hw.gpus and hw.gpus[0].bf16 else "fp32", True)]
    if spec.is_gguf:
        if hw.kind == "cuda":
            return []  # on CUDA the transformers + bitsandbytes path is the fast one
        return [Plan("llamacpp+transformers", "fp32" if hw.kind == "cpu" else "fp16", False)]
    if hw.kind == "cuda":
        half = "bf16" if hw.gpus and hw.gpus[0].bf16 else "fp16"
        return [Plan("transformers", half, False), Plan("transformers+bitsandbytes", "int8", False),
                Plan("transformers+bitsandbytes", "nf4", False)]
    if hw.kind == "mps":
        return [Plan("transformers", "fp16", False)]
    return [Plan("transformers", "fp32", False)]


def verdict(estimated: int, budget: int) -> str:
    if estimated <= WELL_FRACTION * budget:
        return FITS_WELL
    return TIGHT if estimated <= budget else NO_FIT


def assess(spec: ModelSpec, hw: HardwareProfile, shape: RoundShape, can_fetch: bool) -> list[Estimate]:
    """One estimate per plan. The micro-batch shrinks (gradient accumulation: same work, same round
    time) until the plan fits well, since logits of a 152k vocabulary dominate memory otherwise."""
    out = []
    budget = hw.accelerator_budget_bytes
    available = spec.local_path is not None or (can_fetch and (spec.hf_repo or spec.gguf_repo) is not None)
    for plan in plans_for(spec, hw):
        micro = shape.micro_batch
        terms = estimate_bytes(spec, plan, shape, hw.kind)
        while micro > 1 and verdict(terms["total"], budget) != FITS_WELL:
            micro //= 2
            terms = estimate_bytes(spec, plan, replace(shape, micro_batch=micro), hw.kind)
        out.append(Estimate(
            model=spec.id, backend=plan.backend, quantization=plan.quantization,
            full_finetune=plan.full_finetune, params=spec.params, trainable_params=terms["trainable"],
            weights_bytes=terms["weights"], optimizer_bytes=terms["optimizer"],
            activation_bytes=terms["activations"], logits_bytes=terms["logits"],
            kv_cache_bytes=terms["kv_cache"], runtime_bytes=terms["runtime"],
            estimated_bytes=terms["total"], budget_bytes=budget, verdict=verdict(terms["total"], budget),
            round_seconds=round(round_seconds(spec, plan, shape, hw), 1), available=available,
            micro_batch=micro))
    return out


def pick(candidates: list[Estimate], max_round_seconds: float) -> Estimate:
    """The largest available model that fits well and whose round suits a contributor; else the
    fastest thing that fits at all (the seed model is always there)."""
    def ok(e: Estimate) -> bool:
        return e.available and e.verdict == FITS_WELL and e.round_seconds <= max_round_seconds

    good = [e for e in candidates if ok(e)]
    if good:
        # largest first; for one model the faster plan (e.g. llama.cpp generation on a CPU), and
        # `max` keeps the first of equals, i.e. the best-quality plan as `plans_for` orders them
        best = max(good, key=lambda e: (e.params, -e.round_seconds))
        why = (f"largest model that fits well ({best.estimated_bytes / GIB:.1f} of "
               f"{best.budget_bytes / GIB:.1f} GiB) with a round of ~{best.round_seconds:.0f} s "
               f"(limit {max_round_seconds:.0f} s)")
        return _with_reason(best, why)
    fallback = [e for e in candidates if e.available and e.verdict != NO_FIT]
    if not fallback:
        raise RuntimeError("no model fits this machine: not even the seed model")
    best = min(fallback, key=lambda e: e.round_seconds)
    return _with_reason(best, "no larger model fits well with a short enough round here; "
                              f"using {best.model} (~{best.round_seconds:.0f} s per round)")


def _with_reason(e: Estimate, reason: str) -> Estimate:
    return replace(e, reason=reason)
