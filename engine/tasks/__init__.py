"""ReasoningGym tasks: the mix, task references, prompts, answer extraction and verifiers."""

from engine.tasks.library import (
    DEMO_SEED,
    HELDOUT_SEED_BASE,
    PRESETS,
    Question,
    RewardConfig,
    SpecialtySpec,
    TaskMix,
    demonstration,
    extract_answer,
    format_reward,
    format_weight_at,
    heldout,
    is_heldout,
    preset,
    regenerate,
    render_prompt,
    reward,
    score,
    verify,
)
from engine.tasks.reference import TaskRef, TaskRefError, question_hash
from engine.tasks.specialties import SPECIALTIES

__all__ = [
    "DEMO_SEED", "HELDOUT_SEED_BASE", "PRESETS", "SPECIALTIES", "Question", "RewardConfig", "SpecialtySpec", "TaskMix",
    "TaskRef", "TaskRefError", "demonstration", "extract_answer", "format_reward", "format_weight_at", "heldout", "is_heldout",
    "preset",
    "question_hash", "regenerate", "render_prompt", "reward", "score", "verify",
]
