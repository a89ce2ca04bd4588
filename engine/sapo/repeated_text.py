"""Text a peer keeps repeating that its tasks do not explain: a backdoor trigger riding on right answers.

The published poisoning of decentralised GRPO ("Hail to the Thief", arXiv 2511.09780) sends correct
completions that all carry the same phrase ("HACKED " + a right answer): the verifier rewards them,
so the phrase is trained in. The log-prob plausibility check catches a phrase this policy would never
write, but dilutes over a long plausible completion. This is the second, independent signal: a word
that appears in many of one origin's completions, across several different questions, outside the
answer block, absent from those questions' text, and (almost) never in this node's own completions.
Such completions are left out before the group is weighed; a group left without signal is dropped.

"Words" are runs of two or more letters, of two or more digits, or of two or more symbols: a trigger
spelled "1337" or "#@!" is screened like "HACKED" (single characters are left alone: "=", "7" or "x"
are everywhere in honest working). Numbers a completion shares with its question are explained by
it; intermediate results differ from question to question, so they do not repeat across
`min_questions` questions the way a trigger does. Per-origin memory is a window of
its recent groups (LRU over origins); the node's own memory is its recent completions. Both bounded.
Cost: one regex pass over each external completion (<= the pool's byte cap) when first seen.
It cannot stop: a trigger this node's own policy also writes, one of a single character, a
trigger used on fewer than `min_questions` questions, or text spread over many identities (each is
judged on its own window). Peers of a different style (a chat model's reasoning beside an
answer-only seed) are filtered as well: the defence favours text this node could have written.
"""

from __future__ import annotations

import re
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

from engine.sapo.checks import check_enabled, check_ints, check_numbers
from engine.sapo.records import RolloutGroup
from engine.tasks.specialties import ANSWER_CLOSE, ANSWER_OPEN

WORD = re.compile(r"[^\W\d_]{2,}|\d{2,}|(?:[^\w\s]|_){2,}")  # letters, digits or symbols, 2 or more
MAX_ORIGINS = 1024
MAX_WORDS_PER_COMPLETION = 256  # a completion is <= 8 KiB; its word set is capped the same way
SEEN_GROUPS = 4096  # content of groups already counted (a pooled group is a candidate for rounds)


@dataclass(frozen=True)
class RepeatedTextConfig:
    """When a word a peer repeats counts as unexplained."""

    enabled: bool = True
    window: int = 32  # recent groups remembered per origin
    own_window: int = 256  # recent own completions remembered
    min_share: float = 0.25  # of the origin's remembered completions that contain the word
    min_questions: int = 3  # distinct questions it appeared on (one question's wording explains little)
    max_own_share: float = 0.02  # at most this share of own completions contain it

    def __post_init__(self) -> None:
        check_enabled("repeated_text", self)
        check_ints("repeated_text", self,
                   (("window", 2, 4096), ("own_window", 1, 65536), ("min_questions", 1, 4096)))
        check_numbers("repeated_text", self, (("min_share", 0, 1), ("max_own_share", 0, 1)))


def outside_answer(completion: str) -> str:
    """The completion without its first answer block (the part the verifier reads) and its tags."""
    start = completion.find(ANSWER_OPEN)
    end = completion.find(ANSWER_CLOSE, start + len(ANSWER_OPEN)) if start >= 0 else -1
    if start >= 0 and end >= 0:
        completion = completion[:start] + " " + completion[end + len(ANSWER_CLOSE):]
    return completion.replace(ANSWER_OPEN, " ").replace(ANSWER_CLOSE, " ")


def words(text: str) -> frozenset[str]:
    found: set[str] = set()
    for match in WORD.finditer(text.lower()):
        found.add(match.group())
        if len(found) >= MAX_WORDS_PER_COMPLETION:
            break
    return frozenset(found)


def residual_words(completion: str, question_text: str) -> frozenset[str]:
    """Words of a completion outside its answer block that its question's text does not contain."""
    return words(outside_answer(completion)) - words(question_text)


class _Window:
    """Word document-frequencies over a bounded window of items (each a set of words)."""

    def __init__(self, size: int) -> None:
        self.items: deque[tuple[str, tuple[frozenset[str], ...]]] = deque()
        self.size = size
        self.completions = 0
        self.df: Counter[str] = Counter()  # completions containing the word
        self.questions: Counter[str] = Counter()  # items (questions) containing it

    def add(self, question: str, per_completion: tuple[frozenset[str], ...]) -> None:
        self.items.append((question, per_completion))
        self._count(per_completion, +1)
        while len(self.items) > self.size:
            self._count(self.items.popleft()[1], -1)

    def _count(self, per_completion: tuple[frozenset[str], ...], sign: int) -> None:
        self.completions += sign * len(per_completion)
        touched = frozenset().union(*per_completion)
        for ws in per_completion:
            for w in ws:
                self.df[w] += sign
        for w in touched:
            self.questions[w] += sign
            if sign < 0 and self.questions[w] <= 0:  # gone from the window: forget it
                del self.questions[w]
                del self.df[w]


class RepeatedTextGuard:
    """Owned by the trainer thread: each round `observe_own` its groups and `observe` every external
    candidate, then `screen` the ones it is about to train on."""

    def __init__(self, cfg: RepeatedTextConfig) -> None:
        self.cfg = cfg
        self._own: deque[frozenset[str]] = deque(maxlen=cfg.own_window)
        self._own_df: Counter[str] = Counter()
        self._origins: OrderedDict[str, _Window] = OrderedDict()
        # Groups already counted, by the hash of (origin, question, completions): an int, where the
        # tuple itself kept up to 4,096 groups' completion texts alive. A collision (2^-64) only
        # leaves one group uncounted.
        self._seen: OrderedDict[int, None] = OrderedDict()

    def observe_own(self, completions: Sequence[str], question_text: str) -> None:
        for text in completions:
            if len(self._own) == self._own.maxlen:
                for w in self._own[0]:
                    self._own_df[w] -= 1
                    if self._own_df[w] <= 0:
                        del self._own_df[w]
            ws = residual_words(text, question_text)
            self._own.append(ws)
            for w in ws:
                self._own_df[w] += 1

    def observe(self, group: RolloutGroup, question_text: str) -> _Window:
        """Count a peer's group once (a pooled group is a candidate in several rounds)."""
        origin = group.provenance.origin_peer
        window = self._origins.get(origin)
        if window is None:
            window = self._origins[origin] = _Window(self.cfg.window)
            if len(self._origins) > MAX_ORIGINS:
                self._origins.popitem(last=False)
        else:
            self._origins.move_to_end(origin)
        key = _seen_key(group)
        if key not in self._seen:
            self._seen[key] = None
            if len(self._seen) > SEEN_GROUPS:
                self._seen.popitem(last=False)
            window.add(group.ref.key, tuple(residual_words(c, question_text) for c in group.completions))
        return window

    def questions_seen(self, origin: str) -> int:
        """Distinct questions in `origin`'s window: fewer than `min_questions`, nothing can be judged."""
        window = self._origins.get(origin)
        return 0 if window is None else len({question for question, _ in window.items})

    def unexplained(self, window: _Window) -> set[str]:
        """Words this origin repeats that neither its questions nor this node's own writing explain."""
        if window.completions == 0:
            return set()
        own = max(len(self._own), 1)
        return {w for w, n in window.df.items()
                if n / window.completions >= self.cfg.min_share and window.questions[w] >= self.cfg.min_questions
                and self._own_df.get(w, 0) / own <= self.cfg.max_own_share}

    def screen(self, group: RolloutGroup, question_text: str) -> tuple[RolloutGroup, int]:
        """The group without completions carrying an unexplained repeated word, and how many left."""
        if not self.cfg.enabled:
            return group, 0
        flagged = self.unexplained(self.observe(group, question_text))
        if not flagged:
            return group, 0
        keep = [i for i, c in enumerate(group.completions) if not residual_words(c, question_text) & flagged]
        if len(keep) == len(group.completions):
            return group, 0
        return subset(group, keep), len(group.completions) - len(keep)


def _seen_key(group: RolloutGroup) -> int:
    return hash((group.provenance.origin_peer, group.ref.key, group.completions))


def subset(group: RolloutGroup, keep: Sequence[int]) -> RolloutGroup:
    """The group with only the completions at `keep` (their rewards and log-prob claims alike)."""
    def pick(values: tuple | None) -> tuple | None:  # type: ignore[type-arg]
        return None if values is None else tuple(values[i] for i in keep)

    return replace(group, completions=tuple(group.completions[i] for i in keep), rewards=pick(group.rewards),
                   generator_logprobs=pick(group.generator_logprobs), logprob_summary=pick(group.logprob_summary))
