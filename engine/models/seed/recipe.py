"""The seed-model recipe: every number that decides the shipped model, in one validated place."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Relative share of demonstrations per specialty. Arithmetic-like specialties get more: they are the
# ones the RL mix keeps and where skill (not a constant answer) is needed. bf and propositional_logic
# are long or trivially gamed, so they get less of the token budget.
DEFAULT_WEIGHTS: dict[str, float] = {
    "base_conversion": 1.5,
    "basic_arithmetic": 1.5,
    "arc_1d": 1.0,
    "bf": 0.5,
    "propositional_logic": 0.5,
    "fraction_simplification": 1.5,
    "decimal_arithmetic": 1.5,
    "calendar_arithmetic": 1.0,
    "binary_matrix": 1.0,
}


def _multiple_of_32(name: str, value: int) -> None:
    # bitsandbytes' CPU 4-bit kernels need every Linear's out_features divisible by 32 (QLoRA later).
    if value <= 0 or value % 32:
        raise ValueError(f"{name} must be a positive multiple of 32, got {value}")


@dataclass(frozen=True)
class SeedRecipe:
    """Tokenizer, architecture, data and optimisation of the seed model."""

    seed: int = 1234  # seeds torch, data order and the demonstration draw
    mix: str = "seed-easy"  # task-mix preset the demonstrations come from
    weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))  # demo shares
    vocab_size: int = 768  # byte-level BPE vocabulary (256 bytes + merges + 2 specials)
    hidden_size: int = 192  # model width (head_dim 32)
    num_layers: int = 4  # transformer blocks
    num_heads: int = 6  # attention heads (head_dim = hidden / heads)
    intermediate_size: int = 512  # SwiGLU width
    max_seq_len: int = 160  # longest prompt + completion kept (arc_1d/bf are ~60-70 tokens)
    steps: int = 3000  # optimizer steps (fixed, not time-based, so the result is reproducible)
    batch_size: int = 64  # sequences per step
    lr: float = 2e-3  # AdamW peak learning rate
    warmup_steps: int = 200  # linear warm-up
    min_lr_ratio: float = 0.1  # cosine decay floor, as a fraction of lr
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    grad_clip: float = 1.0  # global grad-norm clip
    threads: int = 1  # torch CPU threads: 1 stays fast when the cores are shared (2 threads
    # slowed ~5x under load here: their sync barriers wait on descheduled threads)
    heldout_seed: int = 0  # the judge set (heldout(mix, n, heldout_seed)) whose questions are excluded
    heldout_n: int = 256  # judge-set size per specialty excluded from training

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "vocab_size"):
            _multiple_of_32(name, getattr(self, name))
        if self.num_heads <= 0 or self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ValueError("hidden_size must split into an even head_dim across num_heads")
        if self.vocab_size < 300:
            raise ValueError("vocab_size must exceed the 256 byte symbols plus specials")
        for name in ("num_layers", "max_seq_len", "steps", "batch_size", "threads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if not 0 < self.lr < 1 or not 0 <= self.min_lr_ratio <= 1 or self.warmup_steps < 0:
            raise ValueError("bad learning-rate schedule")
        if self.weight_decay < 0 or self.grad_clip <= 0 or self.heldout_n < 0 or self.heldout_seed < 0:
            raise ValueError("weight_decay, grad_clip, heldout_n, heldout_seed out of range")
        if not self.weights or any(not (w >= 0) for w in self.weights.values()) or sum(self.weights.values()) <= 0:
            raise ValueError("weights must be >= 0 with a positive sum")

    @property
    def num_sequences(self) -> int:
        return self.steps * self.batch_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
