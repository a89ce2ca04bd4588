"""`sapo doctor`: this machine, every catalog model's training fit, and the pick, as one object."""

from __future__ import annotations

import os
from typing import Any

from engine.hardware import GIB, CpuInfo, GpuInfo, HardwareProfile, mps_default_budget, probe
from engine.models import catalog, fit

DEFAULT_MAX_ROUND_SECONDS = 300.0  # "a few minutes" per paper-sized round suits a contributor


def hypothetical(device: str, memory_gb: float, cores: int = 8, bf16: bool = True) -> HardwareProfile:
    """A machine like ... : `memory_gb` is GPU memory on CUDA, unified memory on MPS, RAM on CPU."""
    mem = int(memory_gb * GIB)
    ram = mem if device in ("cpu", "mps") else max(mem, 16 * GIB)
    cpu = CpuInfo(name=f"{cores}-core CPU", physical_cores=cores, logical_cores=cores * 2,
                  ram_total_bytes=ram, ram_available_bytes=int(ram * 0.7) if device == "cpu" else ram)
    if device == "cuda":
        gpu = GpuInfo(0, f"{memory_gb:g} GB CUDA GPU", mem, int(mem * 0.95), (8, 6) if bf16 else (7, 5))
        return HardwareProfile(kind="cuda", cpu=cpu, gpus=(gpu,))
    if device == "mps":
        return HardwareProfile(kind="mps", cpu=cpu, mps_budget_bytes=mps_default_budget(mem))
    return HardwareProfile(kind="cpu", cpu=cpu)


def can_fetch_models() -> bool:
    """Whether hub downloads are allowed (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE switch them off)."""
    return not any(os.environ.get(v, "").lower() in ("1", "true", "yes")
                   for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def report(hw: HardwareProfile | None = None, shape: fit.RoundShape | None = None,
           can_fetch: bool | None = None, max_round_seconds: float = DEFAULT_MAX_ROUND_SECONDS,
           models: list[catalog.ModelSpec] | None = None) -> dict[str, Any]:
    hw = hw or probe()
    fetch = can_fetch_models() if can_fetch is None else can_fetch
    specs = models or catalog.catalog()
    shapes = {spec.id: shape or fit.shape_for(spec, hw) for spec in specs}  # the round each would run
    candidates = [e for spec in specs for e in fit.assess(spec, hw, shapes[spec.id], fetch)]
    chosen = fit.pick(candidates, max_round_seconds)
    shape = shapes[chosen.model]
    keys = ("model", "backend", "quantization", "estimated_bytes", "budget_bytes", "verdict", "reason")
    return {
        "device": hw.to_dict(),
        "round": {"questions": shape.questions, "completions": shape.completions,
                  "prompt_tokens": shape.prompt_tokens, "max_new_tokens": shape.max_new_tokens,
                  "micro_batch": shape.micro_batch, "max_round_seconds": max_round_seconds},
        "can_fetch": fetch,
        "pick": {k: getattr(chosen, k) for k in keys} | {"round_seconds": chosen.round_seconds},
        "candidates": [e.to_dict() for e in candidates],
        "fast_paths": fast_paths(),
    }


def fast_paths() -> dict[str, Any]:
    """This machine's software speed-ups (not the hypothetical device's): llama.cpp for generation,
    with bf16 weights where its build has hardware bf16, and bf16 autocast for LoRA updates on CPU."""
    from engine.hardware import torch_cpu_bf16

    try:
        from importlib.metadata import version

        from engine.models.llamacpp import native_bf16

        llamacpp: str | None = version("llama-cpp-python")
        llamacpp_bf16 = native_bf16()
    except (ImportError, OSError, RuntimeError):  # not installed, or its library does not load here: "none"
        llamacpp, llamacpp_bf16 = None, False
    return {"llamacpp": llamacpp, "llamacpp_bf16": llamacpp_bf16, "torch_cpu_bf16": torch_cpu_bf16()}
