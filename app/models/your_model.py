"""The dashboard's "Your model" headline, in words a contributor reads in a second, Qt-free:

    Your SmolLM2-135M-Instruct solves 29% of held-out questions, up from 6% when you started · 2 h of training

Held-out questions are never trained on, so this is what the model learned, not what it memorised. The
first check (the baseline, round 0) is taken before the model's first update here; later ones every
`eval_every_s` seconds of training and/or every `eval_every` rounds (engine/sapo/eval_schedule.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.models.dashboard import DashboardModel
from engine.models.catalog import short_name

HELD_OUT_TIP = ("Held-out questions: puzzles of the same kinds your model trains on, but never trained on, so "
                "a rise means it learned the skill rather than memorised answers. The share is pass@1: answered "
                "right on one try, sampled as in training.")


@dataclass(frozen=True)
class Headline:
    text: str  # the sentence
    detail: str  # a smaller line under it: when the next check comes
    trend: str  # "up", "down", "same" or "" (no comparison yet): the view's colour


def duration(seconds: float) -> str:
    """'40 s', '12 min', '2.5 h', '14 h': training time at the precision a contributor needs."""
    if seconds < 90:
        return f"{max(0.0, seconds):.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    hours = seconds / 3600
    return f"{hours:.1f} h" if hours < 10 else f"{hours:.0f} h"


def schedule_text(eval_every: int | None, eval_every_s: float | None) -> str:
    """How often the model is checked, or "" when that is not known (or checks are off)."""
    if eval_every_s:
        return f"every {duration(eval_every_s)} of training"
    return f"every {eval_every:,} rounds" if eval_every else ""


def _next_check(model: DashboardModel, eval_every: int | None, eval_every_s: float | None) -> str:
    due = model.eval_due_in_s
    if due is not None:
        if due <= 0:
            return "Checking it on held-out questions now…"
        return "Next check within a minute of training." if due < 60 else f"Next check in ~{duration(due)} of training."
    every = schedule_text(eval_every, eval_every_s)
    return f"Checked on held-out questions {every}." if every else ""


def headline(model: DashboardModel, eval_every: int | None = None, eval_every_s: float | None = None) -> Headline:
    """The sentence for the model the dashboard shows; `eval_every`/`eval_every_s`: its node's schedule
    (None: not told yet; 0: that rule is off)."""
    label = short_name(model.model) if model.model else "model"
    name = f"Your {'seed model' if label == 'seed' else label}"  # "Your seed solves" reads as a typo
    checks = sorted(model.eval_pass1)
    nxt = _next_check(model, eval_every, eval_every_s)
    if not checks:
        if eval_every == 0 and not eval_every_s:
            return Headline(f"{name}: held-out checks are off in this node's settings.", "", "")
        if model.eval_due_in_s is not None and model.eval_due_in_s > 0:
            return Headline(f"{name}: first check on held-out questions in ~{duration(model.eval_due_in_s)} "
                            "of training.", "", "")
        if not model.rounds:
            return Headline(f"{name} is checked on held-out questions before it starts training: that is "
                            "where it starts from.", nxt, "")
        return Headline(f"{name}: its first check on held-out questions comes during training.", nxt, "")
    first, last = checks[0], checks[-1]
    now = f"{name} solves {model.eval_pass1[last]:.0%} of held-out questions"
    if first == last:
        when = "before training" if first == 0 else f"at round {first:,}"
        return Headline(f"{now} ({when}).", nxt, "")
    before, after = round(100 * model.eval_pass1[first]), round(100 * model.eval_pass1[last])
    trend = "up" if after > before else "down" if after < before else "same"
    since = "when you started" if first == 0 else f"at round {first:,}"
    change = f"{trend} from {before}% {since}" if trend != "same" else f"the same as {since}"
    trained = model.eval_seconds.get(last, 0.0) - model.eval_seconds.get(first, 0.0)
    return Headline(f"{now}, {change}" + (f" · {duration(trained)} of training" if trained > 0 else ""), nxt, trend)
