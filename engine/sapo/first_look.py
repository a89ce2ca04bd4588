"""A peer's group is judged once, before the J draw: what would this node train on, if drawn?

Before, the repeated-text screen and the cut to the receiver's token cap ran on the J groups already
drawn. A poisoner's group (a trigger on right answers, padding before one) passed the zero-advantage
filter, took a J slot, and was then left out: the round trained on fewer peer groups than J, and its
path differed from the same round without the attacker. Judged first, such a group never enters the
draw, its slot goes to a group that is trained on, and an attacker the screens catch changes nothing.

Per candidate, once (a pooled group is a candidate in every round until it is used or leaves):
  0. a group larger than this node's own group size is subsampled to it (engine/sapo/peer_weight.py);
  1. its origin's repeated-text window counts it, and its origin's reputation records it; a group
     with more copied answers than this node's own groups hold is refused (engine/sapo/copies.py);
  2. completions carrying the origin's unexplained repeated words are removed;
  3. the rest is re-tokenised as this node trains it, cut at its token cap, and a cut group re-scored;
  4. the view is kept: each round it is shaped with that round's format weight and must still have
     signal to be drawn.
A fresh origin's groups wait ("pending", not dropped) until the screen has seen it on
`min_questions` questions (before that a trigger cannot be told from a question's wording, and the
first groups of every fresh identity would pass unjudged) and its quarantine is over (a number of this
node's rounds since it was first a candidate: engine/sapo/quarantine.py). Memory: one view per pooled group, by
its candidate key (the cache is pruned to the current candidates each round).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.sapo.copies import CopiesConfig, CopyScreen
from engine.sapo.peer_weight import subsample_group
from engine.sapo.quarantine import Quarantine
from engine.sapo.records import Candidate, CandidateKey, RolloutGroup
from engine.sapo.repeated_text import RepeatedTextGuard
from engine.sapo.reputation import Reputation
from engine.sapo.rows import receiver_view, score_group, shape_rewards, special_ids_of, special_token_rows
from engine.sapo.sampler import has_signal

DROP_CUT_NO_SIGNAL = "cut_no_signal"  # cut to this node's token cap and re-scored, it had no signal left
DROP_REPEATED_TEXT = "repeated_text"  # without its completions carrying a peer's unexplained repeat: no signal
DROP_SPECIAL_TOKENS = "special_tokens"  # a completion's text holds a special token (EOS, PAD, chat markers)
DROP_COPIES = "copied_answers"  # more copies of one answer than this node's own sampling gives


@dataclass(frozen=True)
class Look:
    """One candidate as this node would train on it.

    view:     the completions left after screening (cut texts where cut), scored by the local verifier
    ids:      token ids per completion of `view`, as the loss sees them
    removed:  completions the repeated-text screen took out
    cut:      some completion was cut at the token cap (then `view` was re-scored)
    special:  completions whose text tokenises to a special token before their end (never trained)
    copied:   the group holds more copies of one answer than this node's own groups do
    """

    candidate: Candidate
    view: RolloutGroup
    ids: tuple[tuple[int, ...], ...]
    removed: int
    cut: bool
    special: int = 0
    copied: bool = False

    def drop_reason(self, shaped: RolloutGroup, filter_zero_advantage: bool) -> str:
        """Why the shaped view may not be drawn this round ("" = it may). A group the screens did not
        touch and that has no signal is left to the sampler's own zero-advantage filter."""
        if self.special:
            return DROP_SPECIAL_TOKENS
        if self.copied:
            return DROP_COPIES
        if not (self.removed or self.cut) or not filter_zero_advantage or has_signal([shaped])[0]:
            return ""
        return DROP_REPEATED_TEXT if self.removed else DROP_CUT_NO_SIGNAL


class FirstLook:
    """Owned by the trainer thread. `judge` each round's candidates; it remembers every verdict until
    the group leaves the candidates."""

    def __init__(self, guard: RepeatedTextGuard, reputation: Reputation, tokenizer: Any, eos_id: int,
                 max_tokens: int, reward_fn: Callable[[Any, str], float], group_size: int = 1 << 16,
                 quarantine: Quarantine | None = None, copies: CopyScreen | None = None) -> None:
        self.guard, self.reputation = guard, reputation
        self.quarantine = quarantine if quarantine is not None else Quarantine(0)
        self.copies = copies if copies is not None else CopyScreen(CopiesConfig(enabled=False))
        self._group_size = group_size  # a peer's group is cut to this node's own group size
        self._tokenizer, self._eos_id, self._max_tokens = tokenizer, eos_id, max_tokens
        self._special_ids = special_ids_of(tokenizer)
        self._reward_fn = reward_fn
        self._looks: dict[CandidateKey, Look] = {}  # candidate key -> its view, while it is a candidate

    def observe_own(self, group: RolloutGroup, question_text: str) -> None:
        """This node's own scored group: what its own sampling looks like, for both screens."""
        self.guard.observe_own(group.completions, question_text)
        self.copies.observe_own(group)

    def judge(self, candidates: Sequence[Candidate], format_weight: float, filter_zero_advantage: bool,
              round_no: int = 0) -> tuple[list[tuple[Look, RolloutGroup]], list[tuple[CandidateKey, str]],
                                          list[CandidateKey], int]:
        """-> (candidates that may be drawn, each with its view shaped by this round's format weight;
        those the screens left without signal, by key, with the reason; the keys of those pending;
        completions the screen removed from groups first judged now)."""
        current: dict[CandidateKey, Look] = {}
        looks: list[tuple[Look, RolloutGroup]] = []
        dropped: list[tuple[CandidateKey, str]] = []
        pending: list[CandidateKey] = []
        removed = 0
        fresh = [v for v in candidates if v.key not in self._looks and not v.group.is_local]
        if self.guard.cfg.enabled:  # all of this round's groups count before any is judged
            for v in fresh:
                self.guard.observe(v.group, v.question.text)
        for v in candidates:
            look = self._looks.get(v.key)
            first = look is None
            if look is None:
                if not v.group.is_local and not self._ready(v, round_no):
                    pending.append(v.key)
                    continue
                look = self._look(v)
                removed += look.removed
            current[v.key] = look
            shaped = shape_rewards(look.view, format_weight)
            why = look.drop_reason(shaped, filter_zero_advantage)
            if first and not v.group.is_local:  # its origin's record: once per group
                self.reputation.record(v.group.provenance.origin_peer, flagged=look.removed > 0 or bool(why))
            if why:
                dropped.append((v.key, why))
            else:
                looks.append((look, shaped))
        self._looks = current
        return looks, dropped, pending, removed

    def _ready(self, v: Candidate, round_no: int) -> bool:
        """The origin's quarantine is over and the screen has seen it on enough questions to judge it."""
        origin = v.group.provenance.origin_peer
        released = self.quarantine.ready(origin, round_no)
        if not self.guard.cfg.enabled:
            return released
        return released and self.guard.questions_seen(origin) >= self.guard.cfg.min_questions

    def _look(self, v: Candidate) -> Look:
        group = v.group if v.group.is_local else subsample_group(v.group, self._group_size)
        screened, removed = self.guard.screen(group, v.question.text) if not group.is_local else (group, 0)
        view, ids, cut = receiver_view(screened, self._tokenizer, self._eos_id, self._max_tokens)
        special = special_token_rows(ids, self._special_ids, self._eos_id) if not group.is_local else 0
        if cut and not special:  # scored on the text it is trained on: the cut text is scored again
            view = score_group(view, v.question, self._reward_fn)
        copied = not group.is_local and self.copies.refuses(view)
        return Look(v, view, ids, removed, cut, special, copied)
