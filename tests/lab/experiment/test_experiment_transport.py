"""The in-memory swarm: real signed frames, real pools, the local verifier, then the trainer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from engine.sapo.records import Provenance, RolloutGroup
from engine.tasks.library import preset, regenerate
from lab.experiment.transport import InMemorySwarm, agent_identity

RIGHT, WRONG = "right", "wrong"


def _group(index: int, pattern: tuple[str, ...], round_no: int = 1) -> RolloutGroup:
    """A basic_arithmetic group whose completions are right or wrong answers to the real question."""
    q = regenerate(preset("rl").ref("basic_arithmetic", 1000, index))
    texts = tuple(f"<answer>{q.answer if p == RIGHT else 'x'}</answer>" for p in pattern)
    # Claimed rewards are lies: the receiver must score for itself.
    return RolloutGroup(q.ref, q.hash, texts, Provenance.local("seed", round_no, round_no),
                        rewards=tuple(1.0 for _ in pattern))


def _swarm(lockstep: bool, agents: int = 3, max_age: float = 0.5) -> InMemorySwarm:
    return InMemorySwarm([agent_identity(9, k) for k in range(agents)], 32, max_age, lockstep=lockstep)


def test_agent_identities_are_deterministic_and_distinct() -> None:
    assert agent_identity(1, 0).peer_id == agent_identity(1, 0).peer_id
    assert len({agent_identity(1, k).peer_id for k in range(4)} | {agent_identity(2, 0).peer_id}) == 5


def test_lockstep_holds_frames_until_the_barrier_and_rescores_locally() -> None:
    swarm = _swarm(lockstep=True)
    swarm.clock.now = 1.0
    swarm.publish(0, [_group(1, (RIGHT, WRONG, WRONG, WRONG)), _group(2, (WRONG,) * 4)])
    assert swarm.candidates(1) == []  # not before the barrier
    swarm.clock.now = 2.0
    assert swarm.flush() == 2  # one frame to each of the two other agents
    got = [v.group for v in swarm.candidates(1)]
    assert sorted(g.rewards for g in got) == [(0.0, 0.0, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0)]
    assert all(g.provenance.origin_peer == agent_identity(9, 0).peer_id for g in got)
    assert swarm.candidates(0) == []  # a sender never receives its own groups
    swarm.clock.now = 3.0  # next barrier: last round's unused groups have expired
    assert swarm.candidates(2) == []


def test_async_delivers_at_once_and_keeps_groups_for_the_window() -> None:
    swarm = _swarm(lockstep=False, max_age=2.0)
    swarm.clock.now = 5.0
    swarm.publish(1, [_group(3, (RIGHT, RIGHT, WRONG, RIGHT))])
    assert len(swarm.candidates(0)) == 1
    swarm.clock.now = 7.0
    assert len(swarm.candidates(0)) == 1
    swarm.clock.now = 7.5
    assert swarm.candidates(0) == []


def test_forged_question_and_tampered_frame_are_dropped_not_raised() -> None:
    swarm = _swarm(lockstep=False)
    forged = dataclasses.replace(_group(4, (RIGHT, WRONG)), question_hash="0" * 64)
    swarm.publish(0, [forged])
    assert swarm.candidates(1) == []
    assert swarm.counters["pool:dropped:forged_ref"] == 2
    frame = swarm.protocols[0].encode_rollouts([dataclasses.replace(
        _group(5, (RIGHT, WRONG)), rewards=None, provenance=dataclasses.replace(
            _group(5, (RIGHT, WRONG)).provenance, origin_peer=agent_identity(9, 0).peer_id))])[0]
    tampered = frame.replace(b"<answer>x</answer>", b"<answer>y</answer>")
    assert tampered != frame
    assert swarm.deliver(1, tampered) == 0
    assert swarm.counters["refused:bad_signature"] == 1
    assert swarm.deliver(1, b"\xff not json") == 0
    assert swarm.deliver(1, frame) == 1
    assert swarm.deliver(1, frame) == 0  # a replayed frame
    assert swarm.counters["refused:duplicate"] == 1


def test_pooled_groups_enter_the_trainers_update_and_leave_the_pool(tmp_path: Path) -> None:
    import torch

    from engine.models.generate import SampleConfig
    from engine.models.policy import build_tiny_policy, load_policy
    from engine.sapo.config import SapoConfig
    from engine.sapo.trainer import Trainer
    from lab.experiment.agents import PairedQuestions

    torch.manual_seed(0)
    model, tok = load_policy(build_tiny_policy(tmp_path / "tiny"))
    # The peers' completions fit this node's token cap (longer ones are cut and scored again)
    cfg = SapoConfig(num_local=1, num_external=2, completions=4, sampling=SampleConfig(max_new_tokens=32),
                     eval_every=0, checkpoint_every=0, quarantine_rounds=0)  # peers known: no wait
    questions = PairedQuestions(preset("rl"), 1, 1, cfg.dataset_seed)
    trainer = Trainer(model, tok, cfg, questions, None, None, seed=0)
    swarm = _swarm(lockstep=False)
    swarm.clock.now = 1.0
    swarm.publish(0, [_group(6, (RIGHT, WRONG, WRONG, WRONG)), _group(7, (WRONG,) * 4),
                      _group(8, (RIGHT, RIGHT, WRONG, WRONG))])
    before = [p.detach().clone() for p in model.parameters()]
    questions.start_round(1)
    result = trainer.run_round(swarm.candidates(1))
    assert len(result.used_external) == 2  # the all-wrong group was filtered (zero advantage)
    assert all(len(set(v.group.rewards or ())) > 1 for v in result.used_external)
    assert result.metrics["rows_trained"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    swarm.mark_used(1, [c.key for c in result.used_external])
    assert len(swarm.candidates(1)) == 1  # only the unused zero-advantage group is left
