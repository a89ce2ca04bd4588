"""llama.cpp generation for a torch-trained policy: same call shape and sampling as `generate.generate`.

What runs where: prompts are tokenized by the policy's own (transformers) tokenizer and fed to
llama.cpp as token ids, so the completions' token ids are exactly what the torch loss trains on;
llama.cpp only produces logits. Sampling happens in numpy (`engine.models.sampling_np`) with the
semantics of `engine.models.generate` (true temperature, optional top-k / top-p, log-probs of the
tempered, untruncated policy). The ctypes side (contexts, KV layouts, the decode loop) is
`engine.models.llamacpp_runtime`.

Keeping llama.cpp in step with the torch policy (`LlamaCppGenerator.sync`):
  * LoRA policies: the adapter is written as a llama.cpp LoRA GGUF and hot-swapped every update.
  * fully fine-tuned policies (the seed model): the GGUF's tensors are rewritten from the torch
    weights (milliseconds for the seed) every `sync_every` policy versions and the model reloaded.
The policy version of the weights that generated a round is what `sync` returns; the trainer stamps
it into the rollouts' provenance. Log-probs for the loss are always recomputed by the torch policy.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.models.generate import MAX_BATCH_ROWS, Completion, SampleConfig, encode_prompts, eos_token_ids
from engine.models.llamacpp_runtime import (
    BATCH_TOKENS,
    CELL_PAD,
    KV_LAYOUTS,
    KV_TYPES,
    MAX_SEQUENCES,
    WEIGHT_TYPES,
    LlamaCppRuntime,
    load_cpu_backends,
    native_bf16,
)


@dataclass(frozen=True)
class LlamaCppConfig:
    """How llama.cpp generates for the trainer."""

    threads: int = 0  # llama.cpp threads; 0 = torch's current thread count
    sync_every: int = 1  # full fine-tuning: policy versions between weight refreshes (LoRA: every version)
    kv_type: str = "f16"  # KV cache element type: "f16" (llama.cpp's default) or "f32"
    gpu_layers: int = 0  # layers offloaded to a GPU build of llama.cpp (Metal on Apple); 0 = CPU
    kv_layout: str = "auto"  # "split" (a KV stream per row), "unified" (one shared cache) or "auto" (measured)
    # Base weights llama.cpp computes with: "auto" keeps f32 for full fine-tuning (rewritten from torch
    # every sync, exact) and, for a LoRA base, bf16 where llama.cpp has hardware bf16 dot products on
    # the CPU (faster, at ~4x the log-prob gap to torch of f16: bench/generate.md), else f16.
    weights: str = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or not 0 <= self.threads <= 1024:
            raise ValueError(f"threads must be an int in [0, 1024], got {self.threads!r}")
        if isinstance(self.sync_every, bool) or not isinstance(self.sync_every, int) or self.sync_every < 1:
            raise ValueError(f"sync_every must be an int >= 1, got {self.sync_every!r}")
        if self.kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(KV_TYPES)}, got {self.kv_type!r}")
        if isinstance(self.gpu_layers, bool) or not isinstance(self.gpu_layers, int) or self.gpu_layers < 0:
            raise ValueError(f"gpu_layers must be an int >= 0, got {self.gpu_layers!r}")
        if self.kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {self.kv_layout!r}")
        if self.weights not in WEIGHT_TYPES:
            raise ValueError(f"weights must be one of {WEIGHT_TYPES}, got {self.weights!r}")

    def base_weights(self, *, lora: bool) -> str:
        """The GGUF type of the base weights llama.cpp will hold ("auto" resolved, see `weights`)."""
        if self.weights != "auto":
            return self.weights
        if not lora:
            return "f32"
        return "bf16" if self.gpu_layers == 0 and native_bf16() else "f16"


class LlamaCppGenerator:
    """Generates with llama.cpp from weights kept in step with a torch policy (module docstring).

    base_gguf: the policy's base weights as GGUF. mode "full": rewritten from the torch weights on
    sync (needs `plan` to cover every trainable parameter); mode "lora": the base stays, the peft
    adapter is hot-swapped (lora_alpha: the adapter's alpha).
    """

    name = "llamacpp"

    def __init__(self, base_gguf: Path, work_dir: Path, plan: Any, *, mode: str, cfg: LlamaCppConfig | None = None,
                 lora_alpha: float = 0.0) -> None:
        if mode not in ("full", "lora"):
            raise ValueError("mode must be 'full' or 'lora'")
        self.base_gguf, self.work_dir, self.plan, self.mode = Path(base_gguf), Path(work_dir), plan, mode
        self.cfg = cfg or LlamaCppConfig()
        self.lora_alpha = lora_alpha
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.weights_version: int | None = None  # policy version llama.cpp holds; None = not synced yet
        self.sync_seconds = 0.0  # total time spent syncing (refresh/reload or adapter writes)
        self.syncs = 0
        self._runtime: LlamaCppRuntime | None = None
        self._paced_threads = 0  # set_threads' choice; 0 = none yet

    def _threads(self) -> int:
        if self._paced_threads:
            return self._paced_threads
        if self.cfg.threads:
            return self.cfg.threads
        import torch

        return torch.get_num_threads()

    def set_threads(self, threads: int) -> None:
        """Threads from now on, over `cfg.threads`: the node re-chooses them between rounds from the
        cores that are free (engine.machine.load.ThreadPacer)."""
        self._paced_threads = max(1, threads)
        if self._runtime is not None:
            self._runtime.set_threads(self._paced_threads)

    def runtime(self) -> LlamaCppRuntime:
        if self._runtime is None:
            self._runtime = LlamaCppRuntime(self.base_gguf, threads=self._threads(), kv_type=self.cfg.kv_type,
                                            gpu_layers=self.cfg.gpu_layers, kv_layout=self.cfg.kv_layout)
        return self._runtime

    def sync(self, model: Any, policy_version: int) -> int:
        """Bring llama.cpp's weights up to `policy_version` when due -> the version it now holds."""
        import time

        from engine.models.gguf_convert import lora_pairs, refresh_weights, write_lora_adapter

        held = self.weights_version
        due = held is None or (policy_version != held and (self.mode == "lora" or held > policy_version
                                                           or policy_version - held >= self.cfg.sync_every))
        if not due:
            return held  # type: ignore[return-value]
        start = time.perf_counter()
        runtime = self.runtime()
        if self.mode == "full":
            path = self.work_dir / "policy.gguf"
            refresh_weights(self.base_gguf, self.plan, model.state_dict(), path)
            runtime.load(path)
        else:
            path = self.work_dir / f"adapter-{policy_version % 2}.gguf"  # alternate: the live one stays intact
            write_lora_adapter(self.plan, lora_pairs(model), self.lora_alpha, path)
            runtime.set_adapter(path)
        self.weights_version = policy_version
        self.sync_seconds += time.perf_counter() - start
        self.syncs += 1
        return policy_version

    def generate(self, model: Any, tokenizer: Any, prompts: list[str], n: int, cfg: SampleConfig,
                 seed: int | None = None) -> list[list[Completion]]:
        """Same contract as engine.models.generate.generate, sampled by llama.cpp's forward passes."""
        if n < 1:
            raise ValueError("n must be >= 1")
        if not prompts:
            return []
        if len(prompts) * n > MAX_BATCH_ROWS:
            raise ValueError(f"{len(prompts)} prompts x {n} samples exceeds {MAX_BATCH_ROWS} rows")
        if self.weights_version is None:
            raise RuntimeError("sync() the generator with the policy before generating")
        eos = eos_token_ids(model, tokenizer)
        rows = encode_prompts(tokenizer, prompts)
        if any(len(r) == 0 for r in rows):
            raise ValueError("a prompt tokenized to zero tokens")
        seed = int(seed) if seed is not None else secrets.randbits(62)
        per_call = max(1, MAX_SEQUENCES // n)  # prompts per llama.cpp call
        result: list[list[Completion]] = []
        for lo in range(0, len(rows), per_call):
            sampled = self.runtime().sample(rows[lo:lo + per_call], n, cfg, eos, seed + lo)
            for p in range(len(rows[lo:lo + per_call])):
                group = []
                for tokens, logps, stopped in sampled[p * n:(p + 1) * n]:
                    body = tokens[:-1] if stopped else tokens
                    group.append(Completion(text=tokenizer.decode(body, skip_special_tokens=True),
                                            token_ids=tuple(tokens), logprobs=tuple(logps), truncated=not stopped))
                result.append(group)
        return result

    def close(self) -> None:
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None


# What callers import from here; the runtime lives in engine.models.llamacpp_runtime.
__all__ = ["BATCH_TOKENS", "CELL_PAD", "KV_LAYOUTS", "KV_TYPES", "MAX_SEQUENCES", "WEIGHT_TYPES", "LlamaCppConfig",
           "LlamaCppGenerator", "LlamaCppRuntime", "load_cpu_backends", "native_bf16"]
