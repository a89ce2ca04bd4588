"""ReasoningGym tasks: the mix, task references, prompts, answer extraction and verifiers."""

from engine.tasks.reference import TaskRef, question_hash

__all__ = ["TaskRef", "question_hash"]
