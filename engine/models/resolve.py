"""Where and what a node trains: the device and the model's local files (torch's thread count is the
machine's: engine/machine/load.py).

Shared by the node and the model backends (which resolve catalog ids to downloaded directories).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.events import LogRecord
from engine.models import catalog
from engine.models.catalog import resolve_model_id
from engine.models.policy import DEFAULT_LORA_TARGETS, LoraSpec
from engine.paths import SEED_MODEL_DIR


def pick_device(requested: str | None, use_gpu: bool) -> str:
    if requested is not None:
        return requested
    if not use_gpu:
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def release_model(trainer: Any, publish: Callable[[Any], None] | None = None) -> None:
    """Before a long pause drops the trainer: checkpoint it and close its generator (llama.cpp holds its
    own copy of the weights outside Python's reach). The next round loads the model again."""
    trainer.save_checkpoint()
    close = getattr(trainer.generator, "close", None)
    if close is not None:
        close()
    if publish is not None:
        publish(LogRecord(level="info", message="a long pause: the model is released to give its memory back; "
                          "it loads again when training resumes"))


def stored_model_id(model: str) -> str:
    """The id `model`'s rounds and evals are stored under (`resolve_model`'s first value), found without
    loading or downloading it: a local directory's name, else the id itself (the catalog id behind an
    alias; "seed")."""
    model = resolve_model_id(model)
    path = Path(model).expanduser()
    return path.name if model != "seed" and path.is_dir() else model


def resolve_model(model: str, progress: Any = None) -> tuple[str, Path, Any]:
    """(model id, local directory, LoRA spec or None). The seed model trains in full; catalog
    models train LoRA adapters and are downloaded from the hub on first use (with progress: a tqdm
    class, e.g. engine.control.model_switch.hub_progress_class)."""

    if model == "seed":
        return "seed", SEED_MODEL_DIR, None
    path = Path(model).expanduser()
    if path.is_dir():
        return path.name, path, None
    spec = catalog.get(model)  # KeyError names the known ids
    if spec.is_gguf or spec.hf_repo is None:
        raise ValueError(f"{model} is a GGUF build: run it with the llama.cpp backend")
    from huggingface_hub import snapshot_download

    local = Path(snapshot_download(spec.hf_repo, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"],
                                   tqdm_class=progress))
    return spec.id, local, LoraSpec(target_modules=DEFAULT_LORA_TARGETS)


def train_dtype(device: str, full_finetune: bool) -> str:
    """The dtype a policy's weights are loaded in for training on `device` (the fit's plans).

    Checkpoints say their own dtype (Qwen2.5 and SmolLM2 ship bf16) and transformers 5 loads that by
    default; training wants it chosen: full fine-tuning keeps fp32 everywhere (no master copy to
    round into), LoRA freezes the base in half precision on GPUs (bf16 where the card has it, else
    fp16; fp16 on MPS) and fp32 on CPUs, where the update may autocast to bf16 (SapoConfig.autocast).
    """
    if full_finetune or device == "cpu":
        return "float32"
    if device == "mps":
        return "float16"
    import torch

    return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
