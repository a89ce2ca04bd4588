"""The attack arms of `sapo bench swarm-learning`: fabricating identities among honest nodes."""

from __future__ import annotations

import json
import random
from pathlib import Path

from engine.tasks import library
from lab.bench import swarm_attack, swarm_learning


def _questions(n: int) -> list:
    return [library.regenerate(r) for r in library.preset("rl").sample_refs(random.Random(3), n, 1000)]


def test_each_tactic_writes_a_group_the_verifier_scores_half_right() -> None:
    rng = random.Random(0)
    for q in _questions(6):
        for tactic in swarm_attack.TACTICS:
            texts = swarm_attack.completions_for(tactic, q, 16, rng)
            assert len(texts) == 16 and sorted(library.score(q, t) for t in texts) == [0.0] * 8 + [1.0] * 8, tactic
            distinct = len({" ".join(t.lower().split()) for t in texts})
            assert distinct == (9 if tactic == "duplicates" else 16), tactic  # only the copy tactic repeats
        assert any("<|im_end|>" in t for t in swarm_attack.completions_for("eos_padding", q, 16, rng))


def test_every_identity_publishes_its_groups_and_heldout_ones_name_the_judge() -> None:
    rng = random.Random(1)
    judge = [library.regenerate(library.preset("rl").ref("basic_arithmetic", library.HELDOUT_SEED_BASE + 5, i))
             for i in range(4)]
    sent = swarm_attack.attacker_round(["a", "b"], 3, library.preset("rl"), judge, 8, rng)
    assert set(sent) == {"a", "b"} and all(len(g) == swarm_attack.GROUPS_PER_ROUND for g in sent.values())
    assert all(g.provenance.origin_peer == o for o, gs in sent.items() for g in gs)
    judge_hashes = {q.hash for q in judge}
    assert any(g.question_hash in judge_hashes for gs in sent.values() for g in gs)  # the heldout tactic
    assert all(library.is_heldout(g.ref) == (g.question_hash in judge_hashes) for gs in sent.values() for g in gs)


def test_attack_keys_pair_victims_with_the_honest_swarm_at_the_same_round() -> None:
    def run(arm: str, seed: int, rounds: int, end: float, midway: list | None = None, **extra: float) -> dict:
        return {"setting": "homogeneous", "arm": arm, "seed": seed, "rounds": rounds,
                "after": [{"pass_at_1": end}], "midway": midway or [], **extra}

    runs = [run("text-attacked-1", 0, 24, 0.10, attacker_loss_share_max=0.2, attacker_groups_trained=5),
            run("text-attacked-1", 1, 24, 0.12, attacker_loss_share_max=0.1, attacker_groups_trained=2),
            run("text-long", 0, 48, 0.2, [{"round": 24, "after": [{"pass_at_1": 0.11}]}]),
            run("solo-long", 0, 84, 0.3, [{"round": 24, "after": [{"pass_at_1": 0.07}]}])]
    keys = swarm_attack.attack_keys(runs, "homogeneous", "text-attacked-1")
    assert keys["attacker_loss_share_max"] == 0.2 and keys["attacker_groups_trained"] == 7
    assert keys["victim_delta_vs_honest_per_seed"] == {"0": 0.10 - 0.11}  # seed 1 has no honest pair
    assert abs(keys["victim_delta_vs_solo"] - 0.03) < 1e-12
    assert swarm_attack.attack_keys(runs, "homogeneous", "text-long") == {}


def test_the_attack_arm_runs_its_attackers_beside_the_honest_nodes(tmp_path: Path) -> None:
    opts = {"model": "seed", "nodes": 2, "rounds": 5, "seeds": [0], "arms": ["text-attacked-2"],
            "settings": ["homogeneous"], "judge_questions": 6, "eval_k": 1, "work_dir": str(tmp_path / "w")}
    result = swarm_learning.run(out_dir=tmp_path, **opts)
    [arm] = result["arms"]
    run = json.loads((tmp_path / "w" / "homogeneous-text-attacked-2-0.json").read_text())
    assert run["attackers"] == 2 and run["counters"]["groups_published"] >= 2 * 5 * swarm_attack.GROUPS_PER_ROUND
    assert run["counters"].get("pool:dropped:heldout_question", 0) > 0  # the judge is out of reach
    # I = 2 own + J = 2: the two identities together hold at most J / (I + J) of any round
    assert 0.0 <= arm["attacker_loss_share_max"] <= 2 / 4 + 1e-9
    assert arm["victim_delta_vs_honest"] is None  # no honest text-long run beside it here
    assert "| homogeneous | text-attacked-2 |" in (tmp_path / "swarm_learning.md").read_text()
