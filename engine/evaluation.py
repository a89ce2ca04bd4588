"""Held-out evaluation: pass@1 and pass@k at a fixed sampling config, overall and per specialty.

Per-round training reward is too noisy to judge learning (std ~0.14 per round on the seed); a fixed
held-out question set, sampled k times per question, is what counts. Definitions, per question with
k samples and c of them solved (binary score, no partial credit):
    pass1           = c / k                      (mean solve rate; the unbiased pass@1 estimate)
    passk           = 1 if c > 0 else 0          (any of the k samples solved it)
    mixed           = 1 if 0 < c < k else 0      (a GRPO group on this question has signal)
    malformed_rate  = fraction of samples with no parsable <answer>
Each is averaged over questions (overall = over all questions, so specialties weigh by count).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.models.generate import SampleConfig, generate

SOLVED_AT = 1.0 - 1e-6  # a sample counts as solved when its binary score reaches 1

MAX_QUESTIONS = 100_000  # a stored report's per-question list: far above any held-out set


@dataclass(frozen=True)
class EvalStats:
    """Aggregates over a set of questions (see the module docstring for the definitions)."""

    n_questions: int  # questions in this set
    pass1: float  # mean over questions of solved samples / k
    passk: float  # fraction of questions solved by at least one of the k samples
    mixed_fraction: float  # fraction of questions with both solved and unsolved samples
    malformed_rate: float  # fraction of samples without a parsable answer
    truncated_rate: float  # fraction of samples that hit max_new_tokens
    mean_tokens: float  # mean completion length in tokens

    @classmethod
    def from_dict(cls, data: Any) -> EvalStats:
        if not isinstance(data, dict):
            raise ValueError("eval stats must be an object")  # noqa: TRY004 (ValueError for every bad input)
        values: dict[str, Any] = {}
        for name in cls.__dataclass_fields__:
            value = data.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"eval stats field {name!r} must be a finite number")
            values[name] = int(value) if name == "n_questions" else float(value)
        return cls(**values)


@dataclass(frozen=True)
class EvalReport:
    """One evaluation of one policy on one held-out set."""

    k: int  # samples per question
    overall: EvalStats
    per_specialty: dict[str, EvalStats] = field(default_factory=dict)
    seconds: float = 0.0  # wall time of the evaluation
    solved: tuple[int, ...] = ()  # per question, in the order asked: how many of the k were right
    skipped_seen: int = 0  # judge questions left out: this node had trained on a question with their text

    @property
    def pass1(self) -> float:
        return self.overall.pass1

    @property
    def passk(self) -> float:
        return self.overall.passk

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "overall": asdict(self.overall), "seconds": self.seconds,
                "per_specialty": {name: asdict(s) for name, s in sorted(self.per_specialty.items())},
                "solved": list(self.solved), "skipped_seen": self.skipped_seen}

    @classmethod
    def from_dict(cls, data: Any) -> EvalReport:
        """Validate a stored report (e.g. from the store's JSON column)."""
        if not isinstance(data, dict) or not isinstance(data.get("per_specialty"), dict):
            raise ValueError("eval report must be an object with per_specialty")  # noqa: TRY004 (ValueError for every bad input)
        k, seconds = data.get("k"), data.get("seconds", 0.0)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError("eval report k must be a positive int")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            raise ValueError("eval report seconds must be a finite number")
        per = {str(name): EvalStats.from_dict(s) for name, s in data["per_specialty"].items()}
        solved = data.get("solved", [])  # absent from reports stored before it existed
        if not isinstance(solved, list) or len(solved) > MAX_QUESTIONS or not all(
                isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= k for n in solved):
            raise ValueError(f"eval report solved must be a list of at most {MAX_QUESTIONS} counts in [0, k]")
        skipped = data.get("skipped_seen", 0)  # absent from reports stored before it existed
        if isinstance(skipped, bool) or not isinstance(skipped, int) or not 0 <= skipped <= MAX_QUESTIONS:
            raise ValueError(f"eval report skipped_seen must be a count in [0, {MAX_QUESTIONS}]")
        return cls(k=k, overall=EvalStats.from_dict(data.get("overall")), per_specialty=per,
                   seconds=float(seconds), solved=tuple(solved), skipped_seen=skipped)

    def table(self) -> str:
        """A plain-text table: one line per specialty, then the overall line."""
        head = f"{'specialty':<26}{'n':>5}{'pass@1':>9}{'pass@' + str(self.k):>9}{'mixed':>8}" \
               f"{'malformed':>11}{'trunc':>8}{'tokens':>8}"
        lines = [head, "-" * len(head)]
        rows = sorted(self.per_specialty.items()) + [("overall", self.overall)]
        for name, s in rows:
            if name == "overall":
                lines.append("-" * len(head))
            lines.append(f"{name:<26}{s.n_questions:>5}{s.pass1:>9.3f}{s.passk:>9.3f}{s.mixed_fraction:>8.3f}"
                         f"{s.malformed_rate:>11.3f}{s.truncated_rate:>8.3f}{s.mean_tokens:>8.1f}")
        return "\n".join(lines)


@dataclass(frozen=True)
class _QuestionResult:
    specialty: str
    solved: int
    k: int
    malformed: int
    truncated: int
    tokens: int


def _aggregate(results: Sequence[_QuestionResult]) -> EvalStats:
    if not results:
        return EvalStats(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    n = len(results)
    samples = sum(r.k for r in results)
    return EvalStats(
        n_questions=n,
        pass1=sum(r.solved / r.k for r in results) / n,
        passk=sum(1 for r in results if r.solved > 0) / n,
        mixed_fraction=sum(1 for r in results if 0 < r.solved < r.k) / n,
        malformed_rate=sum(r.malformed for r in results) / samples,
        truncated_rate=sum(r.truncated for r in results) / samples,
        mean_tokens=sum(r.tokens for r in results) / samples,
    )


def report_from_results(results: Sequence[_QuestionResult], k: int, seconds: float = 0.0) -> EvalReport:
    by_specialty: dict[str, list[_QuestionResult]] = {}
    for r in results:
        by_specialty.setdefault(r.specialty, []).append(r)
    return EvalReport(k=k, overall=_aggregate(results), seconds=seconds,
                      per_specialty={name: _aggregate(rs) for name, rs in by_specialty.items()},
                      solved=tuple(r.solved for r in results))


def evaluate(model: Any, tokenizer: Any, questions: list[Any], *, k: int = 8, sample_cfg: SampleConfig,
             prompt_style: str, seed: int, batch_prompts: int = 16,
             progress: Callable[[int, int], None] | None = None,
             prompt: Callable[[Any], str] | None = None, generator: Any = None,
             policy_version: int = 0) -> EvalReport:
    """Sample k completions per held-out question and score them with the local verifier.

    Deterministic for (model weights, questions, k, sample_cfg, seed, batch_prompts).
    `progress(done, total)` is called after each batch of prompts. `prompt` renders a question
    (default: render_prompt with `prompt_style`); `generator` samples (default: torch generation;
    a llama.cpp generator is synced to `policy_version` first).
    """
    import time

    from engine.tasks.library import extract_answer, render_prompt, score

    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if batch_prompts < 1:
        raise ValueError("batch_prompts must be >= 1")
    start = time.perf_counter()
    render = prompt or (lambda q: render_prompt(q, prompt_style))
    if generator is not None:
        generator.sync(model, policy_version)
    results: list[_QuestionResult] = []
    for b, lo in enumerate(range(0, len(questions), batch_prompts)):
        chunk = questions[lo:lo + batch_prompts]
        prompts = [render(q) for q in chunk]
        batch_seed = seed * 1_000_003 + b
        groups = (generate(model, tokenizer, prompts, k, sample_cfg, seed=batch_seed) if generator is None
                  else generator.generate(model, tokenizer, prompts, k, sample_cfg, seed=batch_seed))
        for q, group in zip(chunk, groups):
            scores = [score(q, c.text, partial_credit=False) for c in group]
            results.append(_QuestionResult(
                specialty=q.specialty, k=k,
                solved=sum(1 for s in scores if s >= SOLVED_AT),
                malformed=sum(1 for c in group if extract_answer(c.text) is None),
                truncated=sum(1 for c in group if c.truncated),
                tokens=sum(len(c.token_ids) for c in group)))
        if progress is not None:
            progress(min(lo + batch_prompts, len(questions)), len(questions))
    return report_from_results(results, k, seconds=time.perf_counter() - start)
