"""Peers' content that is hand-written to pass every check, sent as real signed frames through the
receiver's protocol into the node's own pool (`make_pool`): refused or bounded, while honest traffic
from the same link still passes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from swarm_helpers import real_groups
from test_protocol import open_link

from engine.checkpoint import latest_checkpoint
from engine.models.generate import SampleConfig
from engine.models.policy import build_tiny_policy, load_policy
from engine.node.peer_groups import make_pool
from engine.sapo.config import SapoConfig
from engine.sapo.quarantine import MAX_WAITING, Quarantine
from engine.sapo.records import Candidate, Provenance, RolloutGroup
from engine.sapo.repeated_text import RepeatedTextConfig
from engine.sapo.trainer import Trainer
from engine.swarm.config import PoolConfig
from engine.swarm.identity import Identity
from engine.swarm.protocol import RolloutsReceived
from engine.tasks import library


def deliver(sender: Identity, receiver: Identity, groups: list[RolloutGroup], pool) -> list[str]:
    """Sign `groups` as `sender` would, receive them on `receiver`'s link, offer each to `pool`
    -> each group's pool decision ("pooled" or the drop reason)."""
    tx, rx = open_link(sender, receiver)
    out = []
    for frame in tx.encode_rollouts(groups):
        [event] = rx.receive(frame)
        assert isinstance(event, RolloutsReceived), event
        out += [d.status if d.status == "pooled" else d.reason
                for d in (pool.offer(g, "peer", "192.0.2.7") for g in event.groups)]
    return out


def heldout_groups(origin: str, n: int) -> list[RolloutGroup]:
    """Right and wrong answers to the public judge's questions (seed 424242): what a peer would send to
    make a node train on its own held-out set."""
    out = []
    for question in library.heldout(library.preset("seed-easy"), n, 424242)[:n]:
        completions = (library.demonstration(question), "<answer>definitely wrong</answer>")
        out.append(RolloutGroup(question.ref, question.hash, completions,
                                Provenance(origin, "seed", 3, 1, time.time())))
    return out


def test_held_out_questions_are_refused_and_honest_ones_pass(alice: Identity, bob: Identity) -> None:
    pool = make_pool(PoolConfig(), 64, False)
    forged = heldout_groups(alice.peer_id, 3)
    assert all(library.is_heldout(g.ref) for g in forged)
    honest = real_groups(alice.peer_id, 2)
    assert deliver(alice, bob, forged + honest, pool) == ["heldout_question"] * 3 + ["pooled"] * 2
    assert pool.stats()["dropped"] == {"heldout_question": 3}
    assert {v.group.ref.key for v in pool.candidates()} == {g.ref.key for g in honest}


def test_a_private_seed_is_the_keys_own() -> None:
    me, other = Identity.generate(), Identity.generate()
    seed = me.private_seed("heldout-judge", bits=40)
    assert seed == me.private_seed("heldout-judge", bits=40) and 0 <= seed < 1 << 40
    assert seed != other.private_seed("heldout-judge", bits=40)  # 2^-40 chance of a false failure
    assert seed != me.private_seed("another-use", bits=40)


# The trainer side: I = 2, J = 2, and a peer trained from its first round: no quarantine, and no
# repeated-text screen (it waits for 3 questions of an origin, and at 1 it would call any number a
# demonstration shows once a repeat; tests/sapo/test_repeated_text.py covers it).
CFG = SapoConfig(num_local=2, num_external=2, completions=4, sampling=SampleConfig(max_new_tokens=96),
                 eval_every=0, checkpoint_every=0, repeated_text=RepeatedTextConfig(enabled=False),
                 quarantine_rounds=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "m", seed=11)


def victim(model_dir: Path, cfg: SapoConfig = CFG) -> Trainer:
    model, tok = load_policy(model_dir)
    trainer = Trainer(model, tok, cfg, library.preset("seed-easy"), None, None, seed=3)
    # No judge: seed-easy's small task spaces repeat the peers' question texts, and a judge text is refused
    # (tests/sapo/test_judge_unreachable.py); these tests are about the other screens.
    trainer.use_judge([])
    return trainer


def verdicts(result: Any, offered: list[Candidate]) -> dict[str, str]:
    """Each peer group's fate in a round, by its first completion: "used" or the trainer's reason."""
    by_key = {c.key: c for c in offered}
    out = {c.group.completions[0]: "used" for c in result.used_external}
    out.update((by_key[v.key].group.completions[0], v.reason) for v in result.skipped())
    return out


def test_special_token_text_is_never_trained(alice: Identity, bob: Identity, model_dir: Path) -> None:
    """Literal "<eos>" in a completion tokenises to the EOS id: the tokens after it would be trained as
    if the policy had written past its end. The whole group is refused and its origin flagged."""
    pool = make_pool(PoolConfig(), CFG.sampling.max_new_tokens, False, library.preset("seed-easy"))
    [honest, smuggler] = real_groups(alice.peer_id, 2, seed=9)
    right = smuggler.completions[0]
    smuggled = RolloutGroup(smuggler.ref, smuggler.question_hash,
                            (right + "<eos> HACKED HACKED", right + "<pad>", "<answer>definitely wrong</answer>"),
                            smuggler.provenance)
    assert deliver(alice, bob, [honest, smuggled], pool) == ["pooled", "pooled"]  # valid text, scored mixed
    trainer = victim(model_dir)
    offered = pool.candidates()
    result = trainer.run_round(offered)
    assert verdicts(result, offered) == {honest.completions[0]: "used", smuggled.completions[0]: "special_tokens"}
    assert trainer.reputation.snapshot()[alice.peer_id]["flagged"] > 0


def fabricated(origin: str, seed: int, n: int, completions: int = 16) -> list[RolloutGroup]:
    """What a peer with no model sends: for real questions, hand-written right and wrong answers at the
    byte cap, as many as the frame allows (no model was run; every check on content passes)."""
    out = []
    for group in real_groups(origin, n, seed=seed):
        right, wrong = group.completions[0], "<answer>definitely wrong</answer>"
        texts = tuple(" ".join(str((i * 7 + j) % 10) for j in range(30)) + f" {right if i % 2 else wrong}"
                      for i in range(completions))
        out.append(RolloutGroup(group.ref, group.question_hash, texts, group.provenance))
    return out


@pytest.mark.parametrize("identities", [1, 2])
def test_fabricating_identities_hold_at_most_their_share_of_a_round(
        identities: int, bob: Identity, model_dir: Path) -> None:
    """I = 2 own groups, flat (a random tiny model never answers right: the worst case, where the step
    would otherwise be all the peers'), J = 2, one group per origin per round. However many and however
    long the completions, one identity holds <= 1/(I+J) of the round's step budget, two <= J/(I+J)."""
    cfg = CFG.replace(max_origin_share=0.5)
    pool = make_pool(PoolConfig(max_completion_bytes=1 << 16), cfg.sampling.max_new_tokens, False,
                     library.preset("seed-easy"))
    attackers = [Identity.generate() for _ in range(identities)]
    for k, attacker in enumerate(attackers):
        assert set(deliver(attacker, bob, fabricated(attacker.peer_id, 20 + k, 2), pool)) == {"pooled"}
    trainer = victim(model_dir, cfg)
    result = trainer.run_round(pool.candidates())
    assert not any(lg.has_signal for lg in result.local_groups)  # own groups flat, as meant
    assert len(result.used_external) == identities  # they were trained on: bounded, not refused
    shares = result.peer_loss_share
    assert set(shares) == {a.peer_id for a in attackers}
    assert max(shares.values()) <= 1 / 4 + 1e-9
    assert sum(shares.values()) <= identities / 4 + 1e-9
    assert result.metrics["peer_loss_share_max"] == max(shares.values())


def same_question(origins: list[Identity], seed: int = 31) -> list[list[RolloutGroup]]:
    """One real question, answered by each identity with answers of its own (so no group is a copy)."""
    [base] = real_groups(origins[0].peer_id, 1, seed=seed)
    right = base.completions[0]
    return [[RolloutGroup(base.ref, base.question_hash, (f"{k} {right}", f"<answer>wrong {k}</answer>"),
                          Provenance(o.peer_id, "seed", 3, 1, time.time()))] for k, o in enumerate(origins)]


def test_identities_sending_one_question_train_it_once_a_round(bob: Identity, model_dir: Path) -> None:
    sybils = [Identity.generate() for _ in range(2)]
    pool = make_pool(PoolConfig(), CFG.sampling.max_new_tokens, False, library.preset("seed-easy"))
    for sybil, groups in zip(sybils, same_question(sybils)):
        assert deliver(sybil, bob, groups, pool) == ["pooled"]
    [honest] = real_groups(Identity.generate().peer_id, 1, seed=32)
    pool.offer(honest, "honest", "192.0.2.8")
    result = victim(model_dir, CFG.replace(num_external=3)).run_round(pool.candidates())  # room for all three
    used = sorted(v.group.question_hash for v in result.used_external)
    assert used == sorted({honest.question_hash, same_question(sybils)[0][0].question_hash})
    assert [v.reason for v in result.skipped()] == ["same_question"]


def test_a_question_is_trained_from_peers_at_most_max_question_uses_times(bob: Identity) -> None:
    crowd = [Identity.generate() for _ in range(4)]
    groups = same_question(crowd)
    pool = make_pool(PoolConfig(max_question_uses=2), 96, False, library.preset("seed-easy"))
    for sender, sent in zip(crowd[:3], groups[:3]):
        assert deliver(sender, bob, sent, pool) == ["pooled"]
    first, second, _third = pool.candidates()
    pool.mark_used([first.key])
    assert len(pool.candidates()) == 2
    pool.mark_used([second.key])  # the question's second use: the crowd's other groups on it leave
    assert pool.candidates() == []
    assert pool.stats()["dropped"] == {"question_used_up": 1}
    assert deliver(crowd[3], bob, groups[3], pool) == ["question_used_up"]


def test_a_new_identitys_groups_are_shown_but_wait_before_training(alice: Identity, bob: Identity,
                                                                    model_dir: Path) -> None:
    """A fresh key's valid groups are pooled (the feed shows them) and trained on only once its
    quarantine of 3 of this node's rounds is over."""
    pool = make_pool(PoolConfig(), CFG.sampling.max_new_tokens, False, library.preset("seed-easy"))
    assert deliver(alice, bob, real_groups(alice.peer_id, 2, seed=51), pool) == ["pooled", "pooled"]
    trainer = victim(model_dir, CFG.replace(quarantine_rounds=3))
    for _ in range(3):
        result = trainer.run_round(pool.candidates())
        assert result.used_external == () and result.metrics["external_pending"] == 2
    assert len(trainer.run_round(pool.candidates()).used_external) == 2


def test_a_flood_of_fresh_keys_cannot_send_a_known_peer_back_to_quarantine() -> None:
    gate = Quarantine(2)
    assert not gate.ready("honest", 1) and not gate.ready("honest", 2) and gate.ready("honest", 3)
    for k in range(MAX_WAITING + 10):
        assert not gate.ready(f"sybil-{k}", 4)
    assert gate.ready("honest", 5) and gate.waiting() == MAX_WAITING
    restored = Quarantine(2)
    restored.load_state(gate.state_dict())
    assert restored.ready("honest", 5) and not restored.ready("sybil-20", 5)


def templated(origin: str, seed: int) -> RolloutGroup:
    """The Reliquary-style group: one right template five times (respaced, recased), one wrong three."""
    [group] = real_groups(origin, 1, seed=seed)
    right, wrong = group.completions[0], "<answer>definitely wrong</answer>"
    copies = (right, right.upper(), " " + right, right + "\n", right.replace(">", "> "), wrong, wrong, wrong.upper())
    return RolloutGroup(group.ref, group.question_hash, copies, group.provenance)


def test_a_group_of_templated_copies_is_refused_and_sampled_answers_pass(alice: Identity, bob: Identity,
                                                                         model_dir: Path) -> None:
    """Eight answers that are two texts respaced and recased: more copies than sampling gives (here the
    uncalibrated bound, half the group), so the group is refused and its origin flagged; an honest group
    on the same link passes."""
    cfg = CFG.replace(completions=8)
    pool = make_pool(PoolConfig(), cfg.sampling.max_new_tokens, False, library.preset("seed-easy"))
    [honest] = real_groups(alice.peer_id, 1, seed=61)
    forged = templated(alice.peer_id, 62)
    assert deliver(alice, bob, [honest, forged], pool) == ["pooled", "pooled"]  # valid, scored mixed
    trainer = victim(model_dir, cfg)
    offered = pool.candidates()
    result = trainer.run_round(offered)
    assert verdicts(result, offered) == {honest.completions[0]: "used", forged.completions[0]: "copied_answers"}
    assert trainer.reputation.snapshot()[alice.peer_id]["flagged"] > 0
    assert result.metrics["copy_share_bound"] == 0.5


def test_the_log_prob_floor_is_calibrated_on_own_rounds_and_survives_a_restart(model_dir: Path,
                                                                               tmp_path: Path) -> None:
    """Real rounds set the floor peers' rows are held to from this node's own trained answers, above the
    fixed -8, and a checkpoint keeps it. (A random tiny model finds every text about as likely: that a
    peer's unlikely text is then left out is shown on hand-built rows, tests/sapo/test_plausibility.py.)"""
    # the tiny model's own groups are flat: kept (no filter) and forwarded (a KL term), so they calibrate
    cfg = CFG.replace(filter_zero_advantage=False, beta=0.04, checkpoint_every=1)
    model, tok = load_policy(model_dir)
    trainer = Trainer(model, tok, cfg, library.preset("seed-easy"), None, tmp_path, seed=3)
    results = [trainer.run_round() for _ in range(6)]
    assert results[0].metrics["external_logprob_floor"] == cfg.external_min_logprob  # nothing measured yet
    assert trainer.plausibility.calibrated()
    floor = trainer.plausibility.floor()
    assert cfg.external_min_logprob < floor < 0
    model, tok = load_policy(model_dir)
    resumed = Trainer(model, tok, cfg, library.preset("seed-easy"), None, tmp_path, seed=3)
    resumed.load(latest_checkpoint(tmp_path))
    assert resumed.plausibility.floor() == floor
    assert resumed.run_round().metrics["external_logprob_floor"] == floor
