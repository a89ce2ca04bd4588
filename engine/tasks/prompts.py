"""Prompts per model family: what text a policy sees for a question.

  compact        the seed model's own short prompt (engine.tasks.specialties), completion follows.
  chat-text      one user turn: RG's question + the answer-format instruction, in the chat template.
  chat-fewshot   a short system instruction, k solved turns of the same specialty and rung, then the
                 question as the last user turn, in the model's chat template. SmolLM2-135M wrote
                 `<answer>` tags in 2% of completions under chat-text and in ~40% with one solved turn.
  fewshot        base (non-chat) models: k "Question: … / Answer: <answer>…</answer>" blocks, then the
                 question and an open "Answer:".

Demonstrations come from their own dataset seed (DEMO_SEED), disjoint from every training draw and
held-out set, and are answer-only: the verifier's strict extraction stays as it is.
`PromptBuilder` turns a question into the final text (the template applied), so generation, the
loss and evaluation all see the same bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from engine.tasks.library import DEMO_SEED, Question, regenerate, render_prompt
from engine.tasks.reference import MAX_INDEX, TaskRef
from engine.tasks.specialties import ANSWER_CLOSE, ANSWER_OPEN, _round_decimal, ground_truth, wrap_answer

PROMPT_STYLES = ("compact", "chat-text", "chat-fewshot", "fewshot")
MAX_SHOTS = 8
PROMPT_CACHE = 1024  # rendered prompts kept (a round's, peers' and the judge's)
DEFAULT_SYSTEM = (f"You solve short problems. Reply with the final answer only, inside {ANSWER_OPEN}"
                  f"{ANSWER_CLOSE} tags, e.g. {ANSWER_OPEN}42{ANSWER_CLOSE}.")


@dataclass(frozen=True)
class PromptSpec:
    """How one model family is prompted."""

    style: str = "compact"  # one of PROMPT_STYLES
    shots: int = 1  # solved demonstrations for the few-shot styles (ignored by the others)
    system: str = DEFAULT_SYSTEM  # the chat-fewshot system line

    def __post_init__(self) -> None:
        if self.style not in PROMPT_STYLES:
            raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {self.style!r}")
        if isinstance(self.shots, bool) or not isinstance(self.shots, int) or not 0 <= self.shots <= MAX_SHOTS:
            raise ValueError(f"prompt shots must be an int in [0, {MAX_SHOTS}], got {self.shots!r}")
        if not isinstance(self.system, str) or len(self.system) > 2000:
            raise ValueError("prompt system line must be a string of at most 2000 characters")


def answer_only(question: Question) -> str:
    """The answer-only demonstration completion: `<answer>truth</answer>` (decimals rounded to what
    the scorer still accepts, so a demonstration is never a 12-digit string)."""
    truth = ground_truth(question.entry)
    if question.specialty == "decimal_arithmetic":
        truth = _round_decimal(truth, int(question.entry["metadata"]["decimal_places"]))
    return wrap_answer(truth)


def demonstrations(question: Question, k: int) -> list[Question]:
    """k solved questions of the same specialty and generator settings (rung), from DEMO_SEED, chosen
    by the question's index (so prompts vary across questions but are reproducible everywhere)."""
    ref = question.ref
    out: list[Question] = []
    for j in range(k):
        index = (ref.index * 7919 + 104729 * (j + 1)) % (MAX_INDEX + 1)
        demo = regenerate(TaskRef(ref.specialty, dict(ref.config), DEMO_SEED, index))
        if demo.text == question.text:  # never show the question its own answer
            demo = regenerate(TaskRef(ref.specialty, dict(ref.config), DEMO_SEED, (index + 1) % (MAX_INDEX + 1)))
        out.append(demo)
    return out


def chat_messages(question: Question, spec: PromptSpec) -> list[dict[str, str]]:
    """The chat-fewshot conversation (system, k solved user/assistant turns, the question)."""
    messages = [{"role": "system", "content": spec.system}] if spec.system else []
    for demo in demonstrations(question, spec.shots):
        messages.append({"role": "user", "content": demo.text.strip()})
        messages.append({"role": "assistant", "content": answer_only(demo)})
    messages.append({"role": "user", "content": question.text.strip()})
    return messages


def fewshot_text(question: Question, spec: PromptSpec) -> str:
    """A plain few-shot prompt for base models; the completion starts after "Answer:"."""
    blocks = [f"Question: {d.text.strip()}\nAnswer: {answer_only(d)}\n\n" for d in demonstrations(question, spec.shots)]
    head = f"Give the final answer inside {ANSWER_OPEN}{ANSWER_CLOSE} tags.\n\n"
    return head + "".join(blocks) + f"Question: {question.text.strip()}\nAnswer:"


class PromptBuilder:
    """Question -> the exact prompt text the model sees. Chat styles apply `tokenizer`'s chat
    template here (the tokenizer then encodes the text as it is: see `TemplatedTokenizer`)."""

    def __init__(self, spec: PromptSpec, tokenizer: Any = None) -> None:
        self.spec = spec
        chat = spec.style in ("chat-text", "chat-fewshot")
        self._template = getattr(tokenizer, "chat_template", None) if chat else None
        self._tokenizer = tokenizer
        # Least recently used first: a round's prompts are asked again within the round (and the judge's
        # at every eval); evicting one at a time keeps the heap steady where clearing all churned it.
        self._cache: OrderedDict[str, str] = OrderedDict()

    @property
    def templated(self) -> bool:
        """True when the rendered text already holds the chat template's special tokens."""
        return bool(self._template)

    def __call__(self, question: Question) -> str:
        key = question.ref.key
        text = self._cache.get(key)
        if text is not None:
            self._cache.move_to_end(key)
            return text
        text = self._render(question)
        self._cache[key] = text
        if len(self._cache) > PROMPT_CACHE:
            self._cache.popitem(last=False)
        return text

    def _render(self, question: Question) -> str:
        style = self.spec.style
        if style == "compact":
            return render_prompt(question, "compact")
        if style == "fewshot":
            return fewshot_text(question, self.spec)
        if style == "chat-text":
            messages = [{"role": "user", "content": render_prompt(question, "chat-text")}]
        else:
            messages = chat_messages(question, self.spec)
        if not self._template:  # a chat style on a tokenizer without a template: a readable transcript
            return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\n\nassistant:"
        return str(self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
