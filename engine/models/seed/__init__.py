"""The shipped seed model: a tiny Llama-style causal LM trained from scratch on ReasoningGym
demonstrations (`sapo seed-model train`). Imports of torch/transformers stay inside functions."""

from engine.models.seed.recipe import SeedRecipe

__all__ = ["SeedRecipe"]
