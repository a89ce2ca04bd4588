"""What one SAPO round hands from phase to phase (asked -> scored -> planned -> updated), the metrics it
reports, and the RoundResult it ends with. Plain data and pure functions: `Trainer.run_round` drives."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.evaluation import EvalReport
from engine.models.generate import Completion
from engine.sapo.frontier import source_metrics
from engine.sapo.records import Candidate, CandidateKey, RolloutGroup
from engine.sapo.replay import ReplayEntry
from engine.sapo.rows import LocalGroup, rollout_metrics
from engine.sapo.sampler import has_signal
from engine.sapo.update import TrainRow, UpdateStats
from engine.sapo.verdicts import Verdict

if TYPE_CHECKING:
    from engine.tasks.library import Question


@dataclass(frozen=True)
class RoundResult:
    """What one round did. `local_groups` is what the node publishes (with generator log-probs)."""

    round: int  # 1-based count of rounds this trainer has completed, this one included
    policy_version: int  # optimizer steps taken after this round's update
    local_groups: tuple[RolloutGroup, ...]  # all I own groups, scored (published even when filtered)
    used_external: tuple[Candidate, ...]  # peers' groups whose text entered the loss
    metrics: dict[str, float]  # each key a metric of engine/metrics.py (tests/test_metrics.py checks)
    per_specialty_reward: dict[str, float]  # own-generation reward mean per specialty
    phase_seconds: dict[str, float]  # generate, score, prepare, update, total
    eval: EvalReport | None = None  # the held-out eval, when this round ran one
    checkpoint: Path | None = None  # the checkpoint written after this round, if any
    suggested: tuple[Candidate, ...] = ()  # peers' groups whose question this round answered itself
    verdicts: tuple[Verdict, ...] = ()  # one per candidate offered: suggested, used, skipped (why), pending
    peer_loss_share: dict[str, float] = field(default_factory=dict)  # origin -> its share of the step budget

    def skipped(self) -> tuple[Verdict, ...]:
        """The candidates passed over (they stay pooled), each with the trainer's reason."""
        return tuple(v for v in self.verdicts if v.status == "skipped")


@dataclass(frozen=True)
class Asked:
    """The round's I questions and the policy's L answers to each."""

    suggested: list[Candidate]  # peers' groups taken for their question (asked first)
    replayed: list[tuple[str, ReplayEntry]]  # own frontier questions asked again (next), by question hash
    external: Sequence[Candidate]  # the rest of the peers' groups: candidates for text training
    questions: list[Question]  # suggested questions, then own draws
    prompts: list[str]  # [I] rendered prompts
    samples: list[list[Completion]]  # [I][L]
    gen_version: int  # policy version of the weights that sampled


@dataclass(frozen=True)
class Scored:
    """Own groups scored twice: `local` carries the verifier's correctness rewards (metrics, the
    curriculum, publishing); `shaped` the training reward (+ the fading format bonus), which alone
    picks and weighs groups."""

    weight: float  # the format bonus's weight this round
    local: list[LocalGroup]
    shaped: list[LocalGroup]


@dataclass(frozen=True)
class UpdatePlan:
    """What the update trains on, and what was left out."""

    rows: list[TrainRow]
    kept: list[int]  # the own groups kept, by their index among the round's own groups
    peer_text: list[RolloutGroup]  # the J external groups drawn, as trained on
    used_external: list[Candidate]  # the same groups as the pool verified them
    dropped: list[tuple[CandidateKey, str]]  # external groups left out, by key, with the reason
    j: int  # J this round
    pending: list[CandidateKey]  # external groups not yet judged
    repeated: int  # completions the repeated-text screen removed
    step_floor: float = 0.0  # what peers' rows are divided by at least this round (engine/sapo/peer_weight.py)
    peer_shares: dict[str, float] = field(default_factory=dict)  # origin -> its share of the step budget


def round_metrics(asked: Asked, scored: Scored, plan: UpdatePlan, stats: UpdateStats,
                  times: tuple[float, float, float, float], format_reward: Callable[[str], float],
                  copy_share_bound: float) -> tuple[dict[str, float], dict[str, float]]:
    """The round's metrics (each key an entry of engine/metrics.py) and own reward per specialty:
    the plan's kept own groups and the peers' text groups it trained on; `times`: start, generated,
    scored, updated; `copy_share_bound`: the copy screen's bound this round."""
    t0, t_gen, t_score, t_upd = times
    local, kept, peer_text = scored.local, plan.kept, plan.peer_text
    metrics, per_spec = rollout_metrics(local)
    metrics.update(source_metrics(len(asked.suggested), has_signal([lg.group for lg in local]), kept,
                                  len(peer_text), gen_seconds=t_score - t0, train_seconds=t_upd - t_score,
                                  peer_text_mixed=sum(has_signal(peer_text))))
    gen_tokens = sum(len(c.token_ids) for lg in local for c in lg.completions)
    formatted = [format_reward(c) for lg in local for c in lg.group.completions]
    metrics.update(groups_trained=float(len(kept) + len(peer_text)), rows_trained=float(stats.rows),
                   tokens_per_s=gen_tokens / max(t_gen - t0, 1e-9),
                   format_rate=sum(formatted) / max(len(formatted), 1))
    metrics.update(format_weight=scored.weight, external_repeated_text=float(plan.repeated),
                   external_j=float(plan.j), external_pending=float(len(plan.pending)),
                   peer_loss_share_max=max(plan.peer_shares.values(), default=0.0),
                   replayed_groups=float(len(asked.replayed)), copy_share_bound=copy_share_bound,
                   external_logprob_floor=stats.logprob_floor)
    if stats.rows:  # update metrics exist only for rounds that updated (stored as NULL otherwise)
        metrics.update(loss=stats.loss, grad_norm=stats.grad_norm, clip_fraction=stats.clip_fraction,
                       entropy=stats.entropy, kl=stats.kl, external_implausible=float(stats.implausible))
    return metrics, per_spec
