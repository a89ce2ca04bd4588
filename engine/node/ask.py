"""Try it: a contributor's question answered by their model and by the starting model, and the
node's own recent groups.

Generation never races the trainer: the llama.cpp context and the torch model belong to the node's
worker thread. An ask is therefore queued here (at most MAX_PENDING; the control server allows one per
connection) and the worker answers it between rounds, or at once while the node is paused (the ask
wakes it). With no worker there is no model in memory: a stopped node answers "join first" rather
than loading a model for one question. Leaving, a crash, or a long pause that released the model
fail what is still queued, with the reason.

A drawn question comes from the node's own task mix at the curriculum's current rung, from a dataset
seed no round trains on and the held-out judge never uses, drawn with a private RNG: asking never
moves the trainer's checkpointed random stream. Both models answer greedily (their most likely
answer, so the comparison is not luck) and the local verifier scores both.

"The starting model": a LoRA policy with its adapter disabled (peft's `disable_adapter`: no second
copy, no llama.cpp re-sync); a fully fine-tuned policy through the trainer's frozen KL reference when
it keeps one, else its original weights loaded once from disk when small (the seed); otherwise the
reply says it is not available, and why.
"""

from __future__ import annotations

import collections
import contextlib
import math
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.control.protocol import MAX_QUESTION_CHARS, MAX_SPECIALTY_CHARS
from engine.errors import SapoError
from engine.events import Event, LogRecord
from engine.models.policy import load_policy
from engine.paths import SEED_MODEL_DIR
from engine.tasks.curriculum import LADDERS, rung_of
from engine.tasks.library import HELDOUT_SEED_BASE, Question, extract_answer, regenerate
from engine.tasks.prompts import PromptBuilder
from engine.tasks.reference import MAX_INDEX, TaskRefError
from engine.tasks.specialties import SPECIALTIES, ground_truth

MAX_PENDING = 4  # questions queued on one node, all clients together
RECENT_GROUPS = 16  # own groups kept for the app (a few rounds' worth)
SHOWN_COMPLETIONS = 4  # completions per recent group sent to the app
MAX_SHOWN_CHARS = 600  # per completion or question text sent to the app
MAX_START_PARAMS = 100_000_000  # a fully fine-tuned model this small may load its original weights again
# Held-out space (never trained on), far above the judge's seeds (HELDOUT_SEED_BASE + eval_seed).
ASK_SEED = HELDOUT_SEED_BASE + (1 << 40)

JOIN_FIRST = "join first: your model is in memory only while the node runs (paused is fine)"
RELEASED = "your model was released during the long pause to give its memory back: resume to load it again"


class AskError(SapoError, ValueError):
    """A question this node will not answer now; the message says why, in a contributor's words."""


def check_specialty(specialty: str, mix: Sequence[str]) -> None:
    """"" draws one from the mix; anything else must be a specialty of this node's mix."""
    if not specialty:
        return
    if specialty not in SPECIALTIES:
        raise AskError(f"unknown specialty {specialty[:MAX_SPECIALTY_CHARS]!r}; known: {', '.join(SPECIALTIES)}")
    if specialty not in mix:
        raise AskError(f"{specialty} is not in this node's task mix ({', '.join(mix)})")


def check_text(text: str) -> None:
    if len(text) > MAX_QUESTION_CHARS:
        raise AskError(f"a question is at most {MAX_QUESTION_CHARS} characters ({len(text)} given)")


def clip(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


class StartUnavailable(AskError):
    """The starting model cannot answer here (the reason is its message)."""


@dataclass
class AskRequest:
    specialty: str  # "" = drawn from the mix
    text: str  # "" = the drawn question's own text; else the contributor's words
    future: Future[dict[str, Any]] = field(default_factory=Future)
    asked_at: float = field(default_factory=time.monotonic)


def own_group_row(group: Any, question: Question) -> dict[str, Any]:
    """One of the node's own groups as the app shows it (texts clipped, a few completions)."""
    rewards = [float(r) for r in (group.rewards or ())]
    shown = [{"text": clip(c), "reward": r} for c, r in zip(group.completions, rewards)][:SHOWN_COMPLETIONS]
    return {"round": int(group.provenance.round), "policy_version": int(group.provenance.policy_version),
            "model": str(group.provenance.model_id), "specialty": question.specialty, "question": clip(question.text),
            "expected": clip(ground_truth(question.entry), 200), "completions": shown,
            "right": sum(1 for r in rewards if r >= 1.0), "total": len(rewards)}


class AskDesk:
    """The queue of questions and the ring of own groups. `submit`, `recent` and `open`/`close` run on
    the node's event loop; `answer` and `keep_round` on the worker thread."""

    def __init__(self, mix: Sequence[str], seed: int = 0, publish: Callable[[Event], None] | None = None) -> None:
        self.mix = list(mix)
        self._publish = publish  # the node's bus: each answer is logged
        self._lock = threading.Lock()
        self._pending: collections.deque[AskRequest] = collections.deque()
        self._open = False  # a worker is there to answer
        self._recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT_GROUPS)
        self._rng = random.Random(seed ^ 0x7A51)  # private: the trainer's stream never moves
        self._start: tuple[Any, Any] | None = None  # (trainer id, original weights) loaded from disk
        self.answered = 0

    # ---- the loop's side ---------------------------------------------------------------------------
    def open(self) -> None:
        with self._lock:
            self._open = True

    def close(self, reason: str) -> None:
        """The worker is gone: what is queued fails with `reason`; the starting weights are dropped."""
        with self._lock:
            self._open = False
            pending, self._pending = list(self._pending), collections.deque()
        for request in pending:
            _fail(request, reason)
        self.forget_model()

    def submit(self, specialty: str, text: str) -> Future[dict[str, Any]]:
        check_specialty(specialty, self.mix)
        check_text(text)
        with self._lock:
            if not self._open:
                raise AskError(JOIN_FIRST)
            if len(self._pending) >= MAX_PENDING:
                raise AskError(f"{MAX_PENDING} questions are already waiting: ask again after an answer")
            request = AskRequest(specialty, text.strip())
            self._pending.append(request)
        return request.future

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def recent(self) -> dict[str, Any]:
        with self._lock:
            groups = list(reversed(self._recent))
        return {"groups": groups, "specialties": list(self.mix), "pending": self.pending()}

    # ---- the worker's side -------------------------------------------------------------------------
    def keep_round(self, groups: Sequence[Any]) -> None:
        """A round's own groups, for `recent` (the question regenerated here: groups carry refs)."""
        rows = []
        for group in groups:
            try:
                rows.append(own_group_row(group, regenerate(group.ref)))
            except TaskRefError:
                continue
        with self._lock:
            self._recent.extend(rows)

    def forget_model(self) -> None:
        self._start = None

    def answer(self, trainer: Any, model_source: str | None) -> int:
        """Answer everything queued with `trainer` (None: released) -> how many were answered."""
        if not self._pending:  # the common case, every round: no lock, nothing to do
            return 0
        done = 0
        while True:
            with self._lock:
                request = self._pending.popleft() if self._pending else None
            if request is None:
                return done
            if not request.future.set_running_or_notify_cancel():
                continue  # its client went away
            if trainer is None:
                request.future.set_exception(AskError(RELEASED))
                continue
            try:
                result = self._answer_one(trainer, model_source, request)
            except Exception as exc:  # noqa: BLE001 -- a failed answer is the asker's error, never the worker's
                request.future.set_exception(exc if isinstance(exc, AskError)
                                             else AskError(f"could not answer: {type(exc).__name__}: {exc}"))
                continue
            request.future.set_result(result)
            done += 1
            self.answered += 1
            self._log(result)

    def _log(self, result: dict[str, Any]) -> None:
        if self._publish is not None:
            self._publish(LogRecord(level="info", message=f"answered your {result['specialty']} question after round "
                                    f"{result['round']}: your model {_word(result['yours'])}, the starting model "
                                    f"{_word(result['start'])}"))

    def _question(self, trainer: Any, request: AskRequest) -> Question:
        mix = trainer.curriculum.apply(trainer.mix)  # each laddered specialty at its current rung
        names = list(mix.specialties)
        specialty = request.specialty
        if not specialty:
            specialty = self._rng.choices(names, weights=[mix.specialties[s].weight for s in names])[0]
        elif specialty not in names:
            raise AskError(f"{specialty} is not in this node's task mix ({', '.join(names)})")
        question = regenerate(mix.ref(specialty, ASK_SEED, self._rng.randrange(MAX_INDEX + 1)))
        if not request.text:
            return question
        if trainer.prompt.spec.style == "compact":
            raise AskError("this model reads only its own short task prompts: ask for a drawn question "
                           "(a chat model answers typed questions)")
        # The contributor's words in the drawn question's place: same family (its few-shot examples).
        return Question(ref=question.ref, text=request.text, answer=None, entry=question.entry)

    def _answer_one(self, trainer: Any, model_source: str | None, request: AskRequest) -> dict[str, Any]:
        from engine.models.generate import SampleConfig  # torch: the worker loads it, the protocol never

        waited = time.monotonic() - request.asked_at
        question = self._question(trainer, request)
        # A builder of its own: the trainer's prompt cache holds rounds' questions, not these.
        prompt = PromptBuilder(trainer.prompt.spec, trainer.tokenizer)(question)
        greedy = SampleConfig(temperature=0.0, max_new_tokens=trainer.cfg.sampling.max_new_tokens)
        t0 = time.perf_counter()
        version = trainer.generator.sync(trainer.model, trainer.policy_version)
        mine = trainer.generator.generate(trainer.model, trainer.tokenizer, [prompt], 1, greedy, seed=0)[0][0]
        yours = self._verdict(trainer, question, request, mine.text, time.perf_counter() - t0)
        yours["policy_version"] = int(version)
        start, note = None, ""
        try:
            with self._starting_model(trainer, model_source) as base:
                t1 = time.perf_counter()
                text = _greedy_torch(base, trainer.tokenizer, prompt, greedy)
                start = self._verdict(trainer, question, request, text, time.perf_counter() - t1)
        except StartUnavailable as why:
            note = str(why)
        typed = bool(request.text)
        return {"question": clip(question.text), "specialty": question.specialty, "typed": typed,
                "difficulty": None if typed else _level(question), "expected": None if typed else clip(ground_truth(question.entry), 200),
                "expected_note": _expected_note(question, typed), "yours": yours, "start": start,
                "start_note": note, "round": int(trainer.round), "model": str(trainer.model_id),
                "waited_s": round(waited, 2)}

    def _verdict(self, trainer: Any, question: Question, request: AskRequest, text: str,
                 seconds: float) -> dict[str, Any]:
        """An answer scored by the node's own verifier (a typed question has no ground truth)."""
        correct: bool | None = None
        if not request.text:
            reward = float(trainer.reward_fn(question, text))
            correct = math.isfinite(reward) and reward >= 1.0
        return {"text": clip(text, 2000), "answer": extract_answer(text), "correct": correct,
                "seconds": round(seconds, 2)}

    @contextlib.contextmanager
    def _starting_model(self, trainer: Any, model_source: str | None) -> Iterator[Any]:
        """The policy's starting weights, for the length of the block; StartUnavailable says why not."""
        model = trainer.model
        if hasattr(model, "disable_adapter"):  # LoRA: the base is the starting model, in the same tensors
            with model.disable_adapter():
                yield model
            return
        if trainer.ref_model is not None:
            yield trainer.ref_model
            return
        yield self._original_weights(trainer, model_source)

    def _original_weights(self, trainer: Any, model_source: str | None) -> Any:
        """A fully fine-tuned policy's original weights, loaded from disk once per trainer (small ones)."""
        if self._start is not None and self._start[0] == id(trainer):
            return self._start[1]
        size = sum(p.numel() for p in trainer.model.parameters())
        folder = start_dir(model_source)
        if folder is None or size > MAX_START_PARAMS:
            raise StartUnavailable("not available: this model is trained in full and its starting weights are "
                                   "not kept in memory (a model this size would need a second copy)")
        model = _load_original(trainer, folder)
        self._start = (id(trainer), model)
        return model


def _fail(request: AskRequest, reason: str) -> None:
    if request.future.set_running_or_notify_cancel():
        request.future.set_exception(AskError(reason))


def _word(verdict: dict[str, Any] | None) -> str:
    if verdict is None:
        return "not available"
    return {True: "right", False: "wrong"}.get(verdict["correct"], "answered")


def _level(question: Question) -> dict[str, int] | None:
    """The question's difficulty: its curriculum rung (1-based) of the specialty's ladder, when on one."""
    rung = rung_of(question.specialty, question.ref.config)
    return None if rung is None else {"level": rung + 1, "levels": len(LADDERS[question.specialty])}


def _expected_note(question: Question, typed: bool) -> str:
    if typed:
        return "your own question: there is no known answer to score against"
    if question.specialty == "propositional_logic":
        return "one valid conclusion: any valid one counts"
    return ""


def _greedy_torch(model: Any, tokenizer: Any, prompt: str, cfg: Any) -> str:
    from engine.models.generate import generate  # torch: see _answer_one

    return generate(model, tokenizer, [prompt], 1, cfg, seed=0)[0][0].text


def start_dir(model_source: str | None) -> Path | None:
    """Where a fully fine-tuned model's original weights are: the seed's folder or a local directory."""
    if model_source == "seed":
        return Path(SEED_MODEL_DIR)
    if model_source and Path(model_source).expanduser().is_dir():
        return Path(model_source).expanduser()
    return None


def _load_original(trainer: Any, folder: Path) -> Any:
    weight = next(trainer.model.parameters())
    model, _ = load_policy(folder, device=str(weight.device), dtype=weight.dtype)
    return model.eval()
