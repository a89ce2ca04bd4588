"""The metric registry (engine/metrics.py): a real round emits only registered keys, the store's columns
come from it in their frozen order, and its plot entries agree with each other."""

from __future__ import annotations

import re
from pathlib import Path

from engine.events import Event, RoundCompleted
from engine.metrics import BY_NAME, COLUMNS_FROZEN_AT, METRICS, PLOTTED, STORED, panels
from engine.models.generate import SampleConfig
from engine.models.policy import build_tiny_policy, load_policy
from engine.sapo.config import SapoConfig
from engine.sapo.records import Candidate, Provenance, RolloutGroup, VerifiedGroup
from engine.sapo.repeated_text import RepeatedTextConfig
from engine.sapo.trainer import Trainer
from engine.store import Store
from engine.store.schema import (
    ROUND_METRICS,
    ROUND_METRICS_V2,
    ROUND_METRICS_V5,
    ROUND_METRICS_V6,
    SCHEMA_VERSION,
    STORED_METRICS,
)
from engine.tasks.library import preset, regenerate

# The rounds table's metric columns as files already written hold them: never reordered, never renamed.
FROZEN = {
    1: ("reward_mean", "reward_std", "frac_reward_zero_std", "completion_len_mean", "completion_len_max",
        "completion_clipped_ratio", "entropy", "loss", "grad_norm", "clip_fraction", "kl", "tokens_per_s",
        "groups_trained", "rows_trained"),
    2: ("format_rate", "format_weight"),
    5: ("own_pick_groups", "own_pick_mixed", "suggested_groups", "suggested_mixed", "peer_text_groups",
        "seconds_own_pick", "seconds_suggested", "seconds_peer_text"),
    6: ("peer_text_mixed",),
}
# A tiny round that updates (as tests/sapo/test_trainer.py builds it), with held-out evals on: the round
# then also says when the next one is due. A peer is judged from its first question here.
CFG = SapoConfig(num_local=2, num_external=2, completions=4, sampling=SampleConfig(max_new_tokens=6),
                 checkpoint_every=0, checkpoint_seconds=0.0, checkpoint_overhead=0.0, eval_every=100,
                 eval_per_specialty=1, eval_k=2, lr=1e-3, repeated_text=RepeatedTextConfig(min_questions=1),
                 quarantine_rounds=0)


def odd_length_reward(question: object, completion: str) -> float:
    """Mixed rewards from a random tiny model, so the update runs."""
    return float(len(completion) % 2)


def test_store_columns_come_from_the_registry_in_their_frozen_order() -> None:
    assert (ROUND_METRICS, ROUND_METRICS_V2, ROUND_METRICS_V5, ROUND_METRICS_V6) == (
        FROZEN[1], FROZEN[2], FROZEN[5], FROZEN[6])
    old = [name for version in sorted(FROZEN) for name in FROZEN[version]]
    assert list(STORED_METRICS[:len(old)]) == old  # newer metrics only ever come after
    newer = sorted({m.since for m in STORED if m.since not in FROZEN})
    assert all(since is not None and since > COLUMNS_FROZEN_AT for since in newer)  # a new column, a new version
    assert SCHEMA_VERSION == max([COLUMNS_FROZEN_AT, *newer])
    assert newer == list(range(COLUMNS_FROZEN_AT + 1, SCHEMA_VERSION + 1))  # one version after another


def test_every_entry_is_well_formed() -> None:
    names = [m.name for m in METRICS]
    assert len(set(names)) == len(names) == len(BY_NAME)
    aliases = [a for m in METRICS for a in m.aliases]
    assert not set(aliases) & set(names) and len(set(aliases)) == len(aliases)
    for m in METRICS:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", m.name), m.name  # a plain SQL column name
        assert m.doc.endswith(".") and len(m.doc) > 20, m.name
        assert not m.name.startswith(("seconds_generate", "seconds_total", "per_specialty", "rungs", "model"))
    series = [plot.series for _, plot in PLOTTED]
    assert len(set(series)) == len(series)
    for panel, entries in panels().items():  # metrics sharing a panel agree on what it is
        assert len({plot.title for _, plot in entries}) == 1, panel
        assert len({plot.bounded for _, plot in entries}) == 1, panel
        assert len(entries) == 1 or all(plot.legend for _, plot in entries), panel  # curves told apart


def test_a_real_round_emits_only_registered_metrics_and_the_store_keeps_the_stored_ones(tmp_path: Path) -> None:
    model, tok = load_policy(build_tiny_policy(tmp_path / "m", seed=11))
    events: list[Event] = []
    trainer = Trainer(model, tok, CFG, preset("rl"), Store(tmp_path / "node.db"), tmp_path / "ckpt", 7,
                      reward_fn=odd_length_reward, on_event=events.append)
    first = trainer.run_round()
    q = regenerate(first.local_groups[0].ref)
    peer = RolloutGroup(q.ref, q.hash, ("a", "bb", "ccc", "dddd"), Provenance("peerA", "seed", 3, 9, 0.0))
    second = trainer.run_round([Candidate.of(VerifiedGroup(peer.with_rewards((1.0, 0.0, 1.0, 0.0)), q))])
    emitted = [e.metrics for e in events if isinstance(e, RoundCompleted)]
    assert len(emitted) == 2 and "loss" in second.metrics and "external_repeated_text" in second.metrics
    assert "eval_due_in_s" in emitted[-1]
    for metrics in (first.metrics, second.metrics, *emitted):
        assert set(metrics) <= set(BY_NAME), set(metrics) - set(BY_NAME)
    assert trainer.store is not None
    row = trainer.store.rounds()[-1]
    for name, value in emitted[-1].items():
        assert row.get(name) == (value if BY_NAME[name].since is not None else None), name
