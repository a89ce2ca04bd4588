"""`sapo bench poisoning` end to end on the seed, a few rounds (the real run is >= 1,000 rounds per class)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from engine.tasks import library
from lab.bench import attacks, poisoning


def test_every_attack_class_builds_valid_groups_of_real_questions() -> None:
    rng = random.Random(0)
    mix = library.preset("rl")
    qs = [library.regenerate(r) for r in mix.sample_refs(rng, 8, 1000)]
    for name in attacks.ATTACKS:
        groups = attacks.attack_groups(name, qs, 3, rng)
        assert len(groups) == len(qs)
        assert {g.provenance.origin_peer for g in groups} == set(attacks.origins(name))
        for g, q in zip(groups, qs):
            assert len(g.completions) == attacks.COMPLETIONS and g.ref == q.ref
            assert (library.verify(g.ref, g.question_hash) is None) == (name == "forged_refs")
    backdoor = attacks.trigger_backdoor(qs[0], "a", 1, rng)
    assert [library.score(qs[0], c) for c in backdoor.completions][:4] == [1.0] * 4  # right answers carry it
    zero = library.regenerate(next(r for r in mix.sample_refs(random.Random(1), 4000, 1000)
                                   if library.regenerate(r).answer.strip() == "0"))
    for name in ("forged_refs", "format_gaming", "long_correct", "trigger_backdoor"):  # their wrong half is wrong
        group = attacks.ATTACKS[name](zero, "a", 1, rng)
        assert [library.score(zero, c) for c in group.completions[4:]] == [0.0] * 4, name


def test_the_bench_pairs_a_control_with_each_class_and_writes_the_issue_keys(tmp_path: Path) -> None:
    result = poisoning.run(out_dir=tmp_path, rounds=3, workers=2, classes=["trigger_backdoor", "forged_refs"],
                           reputation_classes=["trigger_backdoor"], eval_per_specialty=1)
    saved = json.loads((tmp_path / "poisoning.json").read_text())
    assert {(k["name"], k["sampler"]) for k in saved["classes"]} == {
        ("trigger_backdoor", "uniform"), ("forged_refs", "uniform"), ("trigger_backdoor", "reputation")}
    for k in saved["classes"]:
        assert set(k) >= {"name", "trained_on", "rounds_per_s_ratio", "heldout_delta", "trigger_share"}
        assert k["rounds_per_s_ratio"] > 0 and 0.0 <= k["trigger_share"] <= 1.0
    forged = next(k for k in saved["classes"] if k["name"] == "forged_refs")
    assert forged["pooled"] == forged["trained_on"] == 0 and forged["dropped"]["forged_ref"] == forged["offered"] > 0
    assert forged["same_weights_as_control"] is True  # never pooled: the control's very path
    assert set(saved["controls"]) == {"uniform", "reputation"} and result["rounds"] == 3
    assert "| trigger_backdoor | reputation |" in (tmp_path / "poisoning.md").read_text()
    assert (tmp_path / "poisoning.png").stat().st_size > 5_000
    # the noise band: perturbed controls, each on its own path
    assert len(saved["control_replicas_pass_at_1"]) == 3 and saved["heldout_noise_sd"] is not None
    assert all(isinstance(k["heldout_beyond_noise"], bool) for k in saved["classes"])
    # a later run extends the committed one: one more class, the rest kept
    poisoning.run(out_dir=tmp_path, rounds=3, workers=2, classes=["garbage"], reputation_classes=[],
                  eval_per_specialty=1, replicas=0, extend=True)
    again = json.loads((tmp_path / "poisoning.json").read_text())
    assert {(k["name"], k["sampler"]) for k in again["classes"]} == {
        ("trigger_backdoor", "uniform"), ("forged_refs", "uniform"), ("trigger_backdoor", "reputation"),
        ("garbage", "uniform")}
    assert len(again["control_replicas_pass_at_1"]) == 3
    # the extension ran its own control, and each class is paired with its own batch's control
    batches = {k["name"]: k["control_batch"] for k in again["classes"] if k["sampler"] == "uniform"}
    assert batches["garbage"] != batches["trigger_backdoor"] == batches["forged_refs"] is not None


def test_fabricated_groups_are_mixed_distinct_texts_and_the_smuggled_eos_is_literal() -> None:
    rng = random.Random(2)
    mix = library.preset("rl")
    for q in [library.regenerate(r) for r in mix.sample_refs(rng, 6, 1000)]:
        group = attacks.fabricated(q, "attacker", 1, rng)
        scores = sorted(library.score(q, c) for c in group.completions)
        assert scores == [0.0] * 4 + [1.0] * 4  # what the receiver's verifier calls a mixed group
        folded = {" ".join(c.lower().split()) for c in group.completions}
        assert len(folded) == attacks.COMPLETIONS  # no two alike even with case and spacing ignored
        smuggled = attacks.eos_smuggle(q, "attacker", 1, rng)
        assert sum("<|endoftext|>" + attacks.TRIGGER in c for c in smuggled.completions) == 4
    honest = attacks.fabricated(q, "honest-0", 1, rng)
    (copy,) = attacks.recopy([honest], "attacker", random.Random(0))
    assert copy.provenance.origin_peer == "attacker" and sorted(copy.completions) == sorted(honest.completions)


def test_the_forged_content_classes_gain_nothing_they_may_not(tmp_path: Path) -> None:
    """Past the 3-round quarantine: a copy and a held-out question are never trained, minted receipts
    count nothing while an honest peer's do, and a fabricating identity holds at most 1/(I+J)."""
    poisoning.run(out_dir=tmp_path, rounds=6, workers=2, reputation_classes=[], eval_per_specialty=1, replicas=0,
                  classes=["fabricated", "eos_smuggle", "heldout_feed", "copycat", "receipt_sybil"])
    saved = {k["name"]: k for k in json.loads((tmp_path / "poisoning.json").read_text())["classes"]}
    for k in saved.values():
        assert set(k) >= {"trained_share", "credited", "heldout_trained", "honest_credited"}
        assert k["heldout_trained"] == 0 and k["honest_credited"] > 0
    assert saved["receipt_sybil"]["credited"] == 0 and saved["receipt_sybil"]["offered"] == 0
    assert saved["copycat"]["trained_on"] == saved["copycat"]["credited"] == 0
    assert saved["copycat"]["dropped"]["copied"] == saved["copycat"]["offered"] > 0
    feed = saved["heldout_feed"]
    assert feed["pooled"] == 0 and feed["dropped"]["heldout_question"] > 0, feed["dropped"]
    assert saved["eos_smuggle"]["trained_on"] == 0
    assert 0.0 <= saved["fabricated"]["trained_share"] <= 1 / 4 + 1e-9
