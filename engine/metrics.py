"""The per-round metrics: one entry each, read by the store, the dashboard and the trainer's tests.

A round's metrics are the dict `RoundResult.metrics` / `RoundCompleted.metrics` carries (engine/sapo
round_parts.py, rows.py, frontier.py and trainer.py produce it). Each key is a `Metric` here: what it
means in a contributor's words, its unit, whether the store keeps it as a column of `rounds` (and from
which schema version), and whether the dashboard draws it. So a new plotted metric is one entry:
  - the store's columns are `STORED` (engine/store/schema.py derives its tuples and migrations from it);
  - the dashboard's series and plots are `PLOTTED` (app/models/dashboard.py, app/views/dashboard.py).
tests/test_metrics.py checks that a real round emits no key missing here and the frozen column order;
tests/app/test_gui_metrics.py that every entry with a plot is drawn.

Qt-free, plain data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The schema version that last added round columns; a stored metric added later takes the next version,
# and engine/store/schema.py adds its column to older files (its SCHEMA_VERSION follows).
COLUMNS_FROZEN_AT = 7


@dataclass(frozen=True)
class Plot:
    """Where the dashboard draws a metric: on the plot `panel` (DashboardView's `<panel>_plot`), as the
    model's series `series`. Metrics that share a panel share its title; a `legend` names each curve."""

    panel: str
    title: str
    series: str
    bounded: bool = False  # a fraction: the plot keeps 0..1, and a value outside is a bad metric, not a point
    legend: str = ""  # this curve's entry in the title legend (plots of one curve need none)
    color: int = 0  # index into the app's palette (app/theme.py PLOT_COLORS): a stable colour per curve
    dashed: bool = False  # a schedule the node follows, not something it measured


@dataclass(frozen=True)
class Metric:
    name: str  # the trainer's dict key, and the store column when stored
    doc: str  # what it means, in a contributor's words (the dashboard's tooltips show it)
    unit: str  # "" for a plain number
    since: int | None = 1  # schema version whose `rounds` table gained the column; None: not stored
    plot: Plot | None = None
    aliases: tuple[str, ...] = ()  # other spellings the dashboard also reads (older engines)


_SOURCE_WORDS = {"own_pick": "questions this node picked itself",
                 "suggested": "questions peers suggested (answered here by this node's model)",
                 "peer_text": "peers' own answers, trained on as text"}


def _source_metrics(source: str, since: int) -> tuple[Metric, ...]:
    words = _SOURCE_WORDS[source]
    return (Metric(f"{source}_groups", f"Question groups this round from {words}.", "groups", since),
            Metric(f"{source}_mixed", f"Of the groups from {words}, those with both a right and a wrong "
                   "answer: only those teach anything.", "groups", since))


def _source_seconds(source: str, since: int) -> Metric:
    return Metric(f"seconds_{source}", f"The round's seconds spent on {_SOURCE_WORDS[source]} (generation "
                  "split by own groups, the update by groups trained on).", "s", since)


# In the store's column order: schema v1's columns, then each version's additions. The order and the
# `since` of a stored entry are frozen (files already written have these columns in this order).
METRICS: tuple[Metric, ...] = (
    Metric("reward_mean", "Share of this node's own answers the checker scored correct this round "
           "(the mean reward).", "reward",
           plot=Plot("reward", "Training reward per round", "reward", bounded=True), aliases=("reward",)),
    Metric("reward_std", "How much those rewards varied across the round's answers (standard deviation).",
           "reward"),
    Metric("frac_reward_zero_std", "Zero-std groups: the share of this round's questions whose completions "
           "all got the same reward (all right, or all wrong). Training learns only from questions with both, "
           "so lower means more is learned per round.", "fraction",
           plot=Plot("zero_std", "All right or all wrong (fraction)", "zero_std", bounded=True, color=2),
           aliases=("zero_std_fraction",)),
    Metric("completion_len_mean", "Average length of this node's answers this round.", "tokens",
           plot=Plot("length", "Completion length (tokens)", "completion_len", color=3),
           aliases=("completion_tokens_mean",)),
    Metric("completion_len_max", "Length of the round's longest answer.", "tokens"),
    Metric("completion_clipped_ratio", "Share of answers cut off at the token limit before they finished.",
           "fraction"),
    Metric("entropy", "How unsure the model was when picking each token, on average: near 0, it writes the "
           "same answer every time.", "nats"),
    Metric("loss", "The training loss of the round's update (only rounds that updated have one).", ""),
    Metric("grad_norm", "How large the update's step was before clipping (the gradient norm).", ""),
    Metric("clip_fraction", "Share of tokens whose update was capped because the model had already moved far "
           "from the one that wrote the answers.", "fraction"),
    Metric("kl", "How far the update moved the model from the one that wrote the answers (KL divergence).",
           "nats"),
    Metric("tokens_per_s", "Tokens generated per second in the last round's generation phase.", "tokens/s",
           plot=Plot("speed", "Tokens / s", "tokens_per_s", color=5), aliases=("tokens_per_second",)),
    Metric("groups_trained", "Question groups the update trained on, own and peers'.", "groups"),
    Metric("rows_trained", "Answers the update trained on.", "answers"),
    # schema v2: the format warm-up, apart from the correctness reward
    Metric("format_rate", "Share of own answers written in the expected answer format, right or wrong.",
           "fraction", 2, Plot("format", "Answer format (fraction)", "format_rate", bounded=True,
                               legend="well-formed answers", color=5)),
    Metric("format_weight", "The weight of the fading bonus for a well-formed answer this round: a schedule "
           "the node follows, not something it measured.", "", 2,
           Plot("format", "Answer format (fraction)", "format_weight", bounded=True, legend="format bonus weight",
                color=8, dashed=True)),
    # schema v5: where the round's groups came from and what each source cost (sapo/frontier.py)
    *_source_metrics("own_pick", 5), *_source_metrics("suggested", 5),
    Metric("peer_text_groups", f"Question groups this round from {_SOURCE_WORDS['peer_text']}.", "groups", 5),
    *(_source_seconds(source, 5) for source in _SOURCE_WORDS),
    # schema v6: with the zero-advantage filter off, a peer's group without signal enters the loss
    Metric("peer_text_mixed", f"Of the groups from {_SOURCE_WORDS['peer_text']}, those with both a right "
           "and a wrong answer.", "groups", 6),
    # schema v8: what the round cost in energy (engine/machine/contribution.py)
    Metric("energy_j", "The energy this machine spent on the round (its held-out check not included): read "
           "from the CPU's power meter where one is readable, else estimated from CPU time.", "J", 8),
    Metric("energy_measured", "1 when the round's energy was read from the CPU's power meter, 0 when it was "
           "estimated from CPU time.", "", 8),
    # not stored: the round's event carries them (sapo history and the dashboard read the event)
    Metric("external_implausible", "Peers' answers left out of the update because this model found them "
           "implausible (too unlikely under it to have come from a model like it).", "answers", None),
    Metric("external_repeated_text", "Peers' answers the repeated-text screen removed.", "answers", None),
    Metric("replayed_groups", "Of this node's own questions this round, those asked again because they were at "
           "its frontier lately (a right and a wrong answer here).", "groups", None),
    Metric("external_j", "How many peers' groups this round could train on (J).", "groups", None),
    Metric("external_pending", "Peers' groups not judged yet, waiting for a later round.", "groups", None),
    Metric("peer_loss_share_max", "The largest share of this round's update any one peer held (at most "
           "one of this round's groups' worth, whatever it sent).", "", None),
    Metric("copy_share_bound", "The share of repeated answers a peer's group may hold: as many as this model's "
           "own groups hold (measured on them), more and the group is refused as written from a template.", "", None),
    Metric("external_logprob_floor", "How likely, per token, a peer's answer must be under this model to be "
           "trained on: a little below the least likely of this model's own answers (nats per token).", "", None),
    Metric("eval_due_in_s", "Training seconds until the next held-out check (the dashboard's \"next check "
           "in ~N min\").", "s", None),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
STORED: tuple[Metric, ...] = tuple(m for m in METRICS if m.since is not None)
# (metric, its plot) of each metric the dashboard draws, in registry order
PLOTTED: tuple[tuple[Metric, Plot], ...] = tuple((m, m.plot) for m in METRICS if m.plot is not None)


def columns(since: int) -> tuple[str, ...]:
    """The round columns schema version `since` added, in order."""
    return tuple(m.name for m in STORED if m.since == since)


def panels(plotted: Sequence[tuple[Metric, Plot]] = PLOTTED) -> dict[str, list[tuple[Metric, Plot]]]:
    """Dashboard panel -> the metrics drawn on it, panels in the order their first metric comes."""
    out: dict[str, list[tuple[Metric, Plot]]] = {}
    for metric, plot in plotted:
        out.setdefault(plot.panel, []).append((metric, plot))
    return out
