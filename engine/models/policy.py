"""Loading a policy (model + tokenizer) for training, and building tiny random ones for tests.

Full fine-tuning is the default (the seed model is ~5M parameters); LoRA via peft for larger models;
bitsandbytes NF4 / int8 when asked (int8 works on CPU; NF4 on CPU needs every Linear's out_features
to be a multiple of 32, see ENVIRONMENT.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUANTIZATIONS = ("nf4", "int8")
DTYPES = ("float32", "bfloat16", "float16")


# Every attention and MLP projection of a Llama/Qwen-style block: what real models adapt here.
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSpec:
    """A LoRA adapter to train instead of the full weights."""

    r: int = 16  # adapter rank
    alpha: int = 32  # scaling numerator (effective scale alpha / r)
    dropout: float = 0.0  # dropout on the adapter input; 0 keeps generation and training consistent
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")  # Linear names to adapt

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or not 1 <= self.r <= 1024:
            raise ValueError(f"LoRA rank must be an int in [1, 1024], got {self.r!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, int) or self.alpha < 1:
            raise ValueError(f"LoRA alpha must be a positive int, got {self.alpha!r}")
        if not (math.isfinite(self.dropout) and 0.0 <= self.dropout < 1.0):
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout!r}")
        if not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules):
            raise ValueError("LoRA target_modules must be a non-empty tuple of module names")


def lora_record(model: Any) -> dict[str, Any] | None:
    """The LoRA adapter a (peft) model trains, as a checkpoint records it: rank, alpha, target modules.
    Alpha is in no tensor, so an export reads it from here (None: the model trains its full weights)."""
    config = getattr(model, "peft_config", {}).get("default")
    if config is None:
        return None
    return {"r": int(config.r), "alpha": int(config.lora_alpha), "target_modules": sorted(config.target_modules)}


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return getattr(torch, dtype)


def load_policy(path: str | Path, *, device: str = "cpu", dtype: Any = None, lora: LoraSpec | None = None,
                quantization: str | None = None) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from a local directory -> (model, tokenizer).

    Never reaches the network (local_files_only). The tokenizer gets a pad token (EOS) if it has
    none; generation left-pads itself. With `lora`, only the adapter is trainable.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no model at {path} (config.json missing)")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS} or None, got {quantization!r}")
    kwargs: dict[str, Any] = {"local_files_only": True}
    torch_dtype = _torch_dtype(dtype)
    if torch_dtype is not None:
        kwargs["dtype"] = torch_dtype
    if quantization is not None:
        from transformers import BitsAndBytesConfig

        if quantization == "nf4":
            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype=torch_dtype or _torch_dtype("float32"))
        else:
            kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
        kwargs["device_map"] = {"": device}
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if quantization is None:
        model = model.to(device)
    if quantization is not None and lora is None:
        raise ValueError("a quantized model can only be trained through a LoRA adapter: pass lora=LoraSpec()")
    if lora is not None:
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

        if quantization is not None:
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                            target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
        model = get_peft_model(model, config)
    return model, tokenizer


def trainable_state_dict(model: Any) -> dict[str, Any]:
    """The trainable tensors by name (full weights, or just the LoRA adapter), detached, contiguous."""
    return {name: p.detach().contiguous() for name, p in model.named_parameters() if p.requires_grad}


def build_byte_tokenizer() -> Any:
    """A byte-level BPE tokenizer with no merges: 256 byte symbols + <pad>, <bos>, <eos>.

    Round-trips any UTF-8 text; good enough for tests and benches without the seed model.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<bos>", "<eos>"] + sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>")


def build_tiny_policy(out_dir: str | Path, *, seed: int = 0, hidden: int = 64, layers: int = 2,
                      heads: int = 4, intermediate: int = 128) -> Path:
    """Write a random tiny Llama + byte tokenizer to `out_dir` (loadable by `load_policy`)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_byte_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads,
                         intermediate_size=intermediate, max_position_embeddings=512,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.top_k = 50  # a hostile default: generate() must ignore it
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
