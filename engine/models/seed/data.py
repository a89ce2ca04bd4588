"""Demonstrations for supervised training: compact prompt + target completion per RG item."""

from __future__ import annotations

import random
from dataclasses import dataclass

from engine.models.seed.recipe import SeedRecipe
from engine.tasks import TaskMix, demonstration, heldout, preset, regenerate, render_prompt

DEDUPE_EXEMPT = ("binary_matrix", "propositional_logic")


@dataclass(frozen=True)
class Demo:
    specialty: str
    prompt: str  # compact prompt (ends with "\n")
    completion: str  # target completion (scratchpad + <answer>…</answer>)


def demo_counts(recipe: SeedRecipe, mix: TaskMix) -> dict[str, int]:
    """Sequences per specialty, proportional to the recipe's weights (specialties in the mix only)."""
    weights = {s: recipe.weights.get(s, 0.0) for s in mix.specialties}
    total = sum(weights.values())
    return {s: round(recipe.num_sequences * w / total) for s, w in weights.items() if w > 0}


def build_demos(recipe: SeedRecipe) -> list[Demo]:
    """All demonstrations, shuffled with the recipe seed. The judge set's question texts are left
    out, so the card's held-out numbers measure generalisation, not recall."""
    mix = preset(recipe.mix)
    # binary_matrix and propositional_logic are exempt: their easy spaces hold a few hundred items, so
    # banning the judge set
    # would remove most of their inputs from training altogether (the card says so).
    banned = {q.hash for q in heldout(mix, recipe.heldout_n, recipe.heldout_seed)
              if q.specialty not in DEDUPE_EXEMPT}
    demos: list[Demo] = []
    for specialty, count in demo_counts(recipe, mix).items():
        index = 0
        made = 0
        while made < count:
            if index > 50 * count + 1000:
                raise ValueError(f"{specialty}: question space too small for {count} demonstrations")
            q = regenerate(mix.ref(specialty, recipe.seed, index))
            index += 1
            if q.hash in banned:
                continue
            demos.append(Demo(specialty, render_prompt(q, "compact"), demonstration(q)))
            made += 1
    random.Random(recipe.seed).shuffle(demos)
    return demos
