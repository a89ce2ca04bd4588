"""How much of a round's step one peer's group may move: at most one own group's worth, whatever it sends.

A peer's completions are text that may be written by hand to pass every check (right and wrong answers
to a question regenerated from its reference). What it sends is not bounded, so what it may *weigh* is:

  1. `subsample_group`: a group larger than this node's own group size G is cut to G completions, at
     random but the same for the same content (64 completions weigh no more than G);
  2. `cap_peer_mass`: a peer group's advantage-token mass, M_g = sum_i |A_i| n_i over its rows the loss
     keeps (A_i its advantage, n_i its tokens), is scaled down to at most one own group's, U = G t_own
     (t_own: the mean length of this round's own completions, which only this node's policy wrote);
  3. `floor_peer_rows`: peers' rows are divided by max(D, F) rather than the round's loss denominator D,
     with F = (I + J) U (`step_floor`): a round whose own groups are flat (D small) does not hand the whole
     step to the peers' rows. Own rows keep D: a round without peers is the round it always was.

A group's share of the round's step budget, M_g / max(sum of all masses, (I + J) U), is then at most
1 / (I + J); one origin places at most ceil(J x max_origin_share) groups in a round, so J identities hold at
most J / (I + J) of any round (`loss_shares` measures it per round). What this leaves open: within its
bound, a hand-written right answer in the model's own format reads like an honest one (docs/SECURITY.md).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from engine.sapo.records import RolloutGroup
from engine.sapo.update import TrainRow


def subsample_group(group: RolloutGroup, size: int) -> RolloutGroup:
    """At most `size` of the group's completions (rewards and log-probs alike), chosen by a seed taken
    from the content: the same group always gives the same subsample, reordering it gives another draw."""
    n = len(group.completions)
    if n <= size:
        return group
    seed = hashlib.sha256("\x00".join(group.completions).encode("utf-8", "surrogatepass")).digest()
    keep = sorted(random.Random(seed).sample(range(n), size))

    def pick(values: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
        return None if values is None or len(values) != n else tuple(values[i] for i in keep)

    return replace(group, completions=tuple(group.completions[i] for i in keep), rewards=pick(group.rewards),
                   generator_logprobs=pick(group.generator_logprobs), logprob_summary=pick(group.logprob_summary))


def unit_mass(group_size: int, own_tokens: Sequence[int]) -> float:
    """U = G x the mean length of this round's own completions (at least one token each)."""
    mean = sum(own_tokens) / len(own_tokens) if own_tokens else 1.0
    return float(group_size) * max(mean, 1.0)


def step_floor(groups_in_round: int, unit: float) -> float:
    """The least loss denominator of a round of I + J groups: (I + J) x U tokens."""
    return float(groups_in_round) * unit


def _mass(row: TrainRow) -> float:
    return abs(row.advantage) * len(row.completion_ids)


def group_masses(rows: Sequence[TrainRow], keep: Sequence[bool]) -> dict[int, float]:
    """Advantage-token mass of each external group (by `TrainRow.source`) over the rows the loss keeps
    (`keep[i]`: row i enters the loss, `update.strategy_keep`)."""
    masses: dict[int, float] = {}
    for row, kept in zip(rows, keep):
        if row.external and kept:
            masses[row.source] = masses.get(row.source, 0.0) + _mass(row)
    return masses


def cap_peer_mass(rows: Sequence[TrainRow], unit: float, keep: Sequence[bool]) -> list[TrainRow]:
    """Rows with each external group's advantages scaled so its mass is at most `unit` (own rows as
    they are). The loss is linear in the advantage: scaling it scales the group's part of the step."""
    scale = {source: unit / mass for source, mass in group_masses(rows, keep).items() if mass > unit}
    return [replace(r, advantage=r.advantage * scale[r.source]) if r.external and r.source in scale else r
            for r in rows]


def floor_peer_rows(rows: Sequence[TrainRow], denominator: float, floor: float) -> list[TrainRow]:
    """External rows scaled by D / max(D, F): their part of the step is as if the loss were divided by
    max(D, F) (D: the round's loss denominator, F: its step floor)."""
    scale = denominator / max(denominator, floor, 1e-12)
    if scale >= 1.0:
        return list(rows)
    return [replace(r, advantage=r.advantage * scale) if r.external else r for r in rows]


def loss_shares(rows: Sequence[TrainRow], floor: float, keep: Sequence[bool]) -> dict[int, float]:
    """Each external group's share of the round's step budget: its mass over max(all rows' mass, floor)."""
    total = sum(_mass(r) for r, kept in zip(rows, keep) if kept)
    budget = max(total, floor, 1e-12)
    return {source: mass / budget for source, mass in group_masses(rows, keep).items()}
