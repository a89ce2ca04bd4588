"""A bench judge disjoint *by content* from training: held out by seed is not enough.

ReasoningGym's entry rungs have small question spaces: 100 training draws of fraction_simplification's
entry rung reproduce most of a seed-held-out judge's texts, so a node that memorises its training
questions scores on the judge. Here the judge's candidates (held-out seeds, the curriculum's entry rung of
each specialty) are kept only when their text is not among a large probe of the training distribution
(every training mix's settings and the entry rungs, which the curriculum trains on first), and each text
once. The probe is a sample, so each trainer also reports the judge texts it really trained on
(`Trainer.judge_seen`), and those are left out of its score too.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from engine.tasks.library import SpecialtySpec, TaskMix, heldout, regenerate

PROBE_DRAWS = 4000  # training draws per specialty and setting probed for texts the judge must not hold
CANDIDATES_PER_SLOT = 16  # held-out candidates drawn per judge slot before a specialty is left short


def training_texts(mixes: Sequence[Any], draws: int, seed: int) -> set[str]:
    """Hashes of question texts `draws` training draws per specialty of each mix produce."""
    rng = random.Random(seed)
    texts: set[str] = set()
    for mix in mixes:
        for name, spec in mix.specialties.items():
            single = TaskMix(f"probe-{name}", {name: SpecialtySpec(1.0, spec.config)})
            for ref in single.sample_refs(rng, draws, rng.getrandbits(32)):
                texts.add(regenerate(ref).hash)
    return texts


def disjoint_judge(judge_mixes: Sequence[Any], train_mixes: Sequence[Any], total: int, seed: int,
                   probe_draws: int = PROBE_DRAWS) -> tuple[list[Any], dict[str, Any]]:
    """-> (questions, facts): `total` held-out questions split evenly over the specialties, whose texts
    are distinct and unseen in the probe, from the first of `judge_mixes` (e.g. the entry rungs) and,
    where its space is used up by training, the next (e.g. the training settings). facts: candidates
    looked at, excluded as seen in training, repeated texts among them, the count per specialty and mix."""
    seen = training_texts([*train_mixes, *judge_mixes], probe_draws, seed)
    specialties = list(judge_mixes[0].specialties)
    per_specialty = -(-total // len(specialties))
    candidates = [q for mix in judge_mixes for q in heldout(mix, per_specialty * CANDIDATES_PER_SLOT, seed)]
    taken: set[str] = set()
    questions: list[Any] = []
    per: dict[str, int] = {}
    excluded_seen = repeats = 0
    by_mix = {True: 0, False: 0}  # from the first judge mix / from a later one
    # an even share per specialty first; what a used-up space leaves short, the others fill
    for cap in (per_specialty, total):
        for q in candidates:
            if q.hash in taken or per.get(q.specialty, 0) >= cap or len(questions) >= total:
                continue
            if q.hash in seen:
                excluded_seen += cap == per_specialty
                continue
            taken.add(q.hash)
            questions.append(q)
            per[q.specialty] = per.get(q.specialty, 0) + 1
            by_mix[q.ref.config == judge_mixes[0].specialties[q.specialty].config] += 1
    repeats = len(candidates) - len({q.hash for q in candidates})
    return questions, {"questions": len(questions), "candidates": len(candidates),
                       "excluded_seen_in_training": excluded_seen, "excluded_repeats": repeats,
                       "per_specialty": per, "from_first_mix": by_mix[True], "from_later_mixes": by_mix[False],
                       "probe_draws": probe_draws}
