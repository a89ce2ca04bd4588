"""`sapo bench poisoning`: a victim among honest peers, with and without one attacker per class.

Paired runs on the seed model: every run has the same victim (weights, seed, `sapo run`'s defaults for
a swarm: cpu-small, I = 2 + J = 2, positive-only), the same honest traffic (two frozen honest seed
peers' groups, generated once per peer before the runs and replayed in each) and the same judge; the attacked runs add one attacker
class (lab/bench/attacks.py), four groups a round (the Sybil class: one each from 8 identities).
Everything goes through the victim's real pool (regenerate, hash check, re-score, byte cap, CPU
budget) and its real trainer (the plausibility check, repeated-text screening, per-origin cap).

Per class: groups pooled and trained on, the victim's rounds/s against the control's, its held-out
pass@1 against the control's, the trigger's share in the victim's own completions over the last
tenth of the rounds, and log p(trigger | prompt) under the victim. Runs go two at a time, one thread
each. Writes bench/poisoning.{json,md,png}.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import random
import time
from pathlib import Path
from typing import Any

import torch

from engine.models.backends import HFGenerator
from engine.models.policy import load_policy
from engine.node.peer_groups import make_pool
from engine.paths import SEED_MODEL_DIR
from engine.sapo.config import preset
from engine.sapo.records import Provenance, RolloutGroup, content_key
from engine.sapo.step import PoolExchange, step
from engine.sapo.trainer import Trainer
from engine.swarm.config import PoolConfig
from engine.swarm.receipts import ReceiptBook, ReceiptConfig
from engine.tasks import library
from engine.tasks.prompts import PromptBuilder, PromptSpec
from lab import BENCH_DIR
from lab.bench import save_results
from lab.bench.attacks import (
    ATTACKS,
    GROUPS_FROM_HONEST,
    QUESTIONS_FROM_JUDGE,
    RECEIPTS_ONLY,
    TRIGGER,
    attack_groups,
    origins,
    recopy,
)
from lab.bench.poisoning_report import plot, summarize, table

DESCRIPTION = "peers that lie: a victim among honest peers, with and without each attacker class (long: ~40 min)"
LONG = True
HONEST = ("honest-0", "honest-1")
# The direct link each origin's groups arrive over (labels from TEST-NET-1, never dialled): each honest
# peer has its own; every attacker identity comes from one process, so from one address.
HONEST_ADDRESS = {"honest-0": "192.0.2.10", "honest-1": "192.0.2.11"}
ATTACKER_ADDRESS = "192.0.2.66"
ATTACKER_ADDRESS_2 = "192.0.2.67"  # fabricated_x2's second identity
HONEST_QUESTIONS = 4  # per honest peer per round
ATTACK_GROUPS = 4  # per round (the Sybil class: 8, one per identity)


def _victim_config(sampler: str, eval_per_specialty: int) -> Any:
    return preset("cpu-small").replace(num_local=2, num_external=2, eval_every=0, checkpoint_every=0,
                                       sampler=sampler, eval_per_specialty=eval_per_specialty)


def honest_traffic(peer: int, rounds: int, seed: int) -> list[list[Any]]:
    """One frozen honest peer's groups for every round (`HONEST[peer]`, its own draws): the same in
    every run, so it is generated once and replayed."""
    torch.set_num_threads(1)
    mix, sampling = library.preset("rl"), _victim_config("uniform", 1).sampling
    model, tok = load_policy(SEED_MODEL_DIR)
    model.eval()
    builder = PromptBuilder(PromptSpec("compact"), tok)
    gen = HFGenerator()
    gen.sync(model, 0)
    rng, origin = random.Random(seed * 1000 + peer), HONEST[peer]
    traffic = []
    for round_no in range(1, rounds + 1):
        qs = [library.regenerate(r) for r in mix.sample_refs(rng, HONEST_QUESTIONS, 1000 + round_no % 7)]
        samples = gen.generate(model, tok, [builder(q) for q in qs], 8, sampling, seed=rng.getrandbits(62))
        traffic.append([RolloutGroup(q.ref, q.hash, tuple(c.text for c in comps),
                                     Provenance(origin, "seed", 0, round_no, 0.0)) for q, comps in zip(qs, samples)])
    return traffic


def _trigger_logprob(trainer: Any, questions: list[Any]) -> float:
    """Mean log p(trigger + " " | prompt) under the victim, over held-out prompts."""
    total = 0.0
    model, tok = trainer.model, trainer.tokenizer
    with torch.no_grad():
        for q in questions:
            prompt = list(tok(trainer.prompt(q), add_special_tokens=False)["input_ids"])
            target = list(tok(TRIGGER + " ", add_special_tokens=False)["input_ids"])
            ids = torch.tensor([prompt + target])
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
            total += float(sum(logp[len(prompt) - 1 + i, t] for i, t in enumerate(target)))
    return total / max(len(questions), 1)


def _attacker_groups(attack: str, round_no: int, honest: list[Any], victim: Any, mix: Any,
                     rng: random.Random) -> list[Any]:
    """This round's groups of class `attack`: its own draws, the victim's held-out questions
    (`heldout_feed`), honest peers' groups re-signed (`copycat`), or none (`receipt_sybil`)."""
    if attack in RECEIPTS_ONLY:
        return []
    if attack in GROUPS_FROM_HONEST:
        return recopy(honest, origins(attack)[0], rng)
    n = 2 * ATTACK_GROUPS if attack.startswith("sybil") else ATTACK_GROUPS
    if attack in QUESTIONS_FROM_JUDGE:
        judge = victim.heldout_questions()
        qs = [judge[(round_no * n + i) % len(judge)] for i in range(n)]
    else:
        qs = [library.regenerate(ref) for ref in mix.sample_refs(rng, n, 1000 + round_no % 7)]
    return attack_groups(attack, qs, round_no, rng)


def _address(origin: str) -> str:
    """The direct link an origin's groups come over: each honest peer its own, `attacker-2` another
    host (the two-identity class costs its owner two addresses), every other attacker one."""
    return HONEST_ADDRESS.get(origin, ATTACKER_ADDRESS_2 if origin == "attacker-2" else ATTACKER_ADDRESS)


def _send_receipts(book: Any, victim_groups: Any, senders: list[str]) -> int:
    """Every sender claims to have trained on every own group of the victim's round -> uses counted."""
    keys = [content_key(g) for g in victim_groups]
    return sum(book.receive(sender, book.me, keys, keys) for sender in senders)


class _Tally:
    """What the attacker got in one run: groups offered, pooled and trained, the largest share of a
    round's step its identities held together, held-out questions trained, and credit."""

    def __init__(self, bad: set[str], judge: set[str]) -> None:
        self.bad, self.judge = bad, judge
        self.offered = self.pooled = self.trained_on = self.heldout_trained = 0
        self.credited = self.honest_credited = 0
        self.trained_share = 0.0

    def offer(self, group: Any, decision: Any) -> None:
        if group.provenance.origin_peer in self.bad:
            self.offered += 1
            self.pooled += decision.status == "pooled"

    def round(self, result: Any) -> None:
        theirs = [v for v in result.used_external if v.group.provenance.origin_peer in self.bad]
        self.trained_on += len(theirs)
        self.credited += len(theirs)  # one receipt the victim sends per group it trained
        self.heldout_trained += sum(v.question.hash in self.judge for v in theirs)
        shares = result.peer_loss_share
        self.trained_share = max(self.trained_share, sum(v for k, v in shares.items() if k in self.bad))


def run_one(attack: str | None, rounds: int, seed: int, sampler: str, eval_per_specialty: int = 16,
            traffic: list[list[list[Any]]] | None = None, perturb: int = 0) -> dict[str, Any]:
    """One victim run (`attack` None: the control). `traffic`: each honest peer's groups per round
    (`honest_traffic`); None generates it here. `perturb` > 0: a control replica whose victim draws
    `perturb` extra random numbers first, so its run diverges from the control the way an attacked
    run's does (another draw, another path) with no attacker: the spread of those is the noise."""
    torch.set_num_threads(1)
    mix = library.preset("rl")
    cfg = _victim_config(sampler, eval_per_specialty)
    model, tok = load_policy(SEED_MODEL_DIR)
    victim = Trainer(model, tok, cfg, mix, None, None, seed=seed)
    for _ in range(perturb):
        victim.rng.random()
    if traffic is None:
        traffic = [honest_traffic(i, rounds, seed) for i in range(len(HONEST))]
    pool = make_pool(PoolConfig(), cfg.sampling.max_new_tokens, cfg.partial_credit, mix)  # the node's own
    tally = _Tally(set(origins(attack)) if attack else set(), {q.hash for q in victim.heldout_questions()})
    start, cpu_start = time.perf_counter(), time.process_time()
    own_texts = _play(attack, rounds, seed, victim, pool, traffic, tally)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    return {"attack": attack or "control", "sampler": sampler, "perturb": perturb, "rounds": rounds,
            "seconds": seconds,
            "rounds_per_s": rounds / seconds, "cpu_seconds": cpu_seconds,
            "rounds_per_cpu_s": rounds / max(cpu_seconds, 1e-9), "offered": tally.offered, "pooled": tally.pooled,
            "trained_on": tally.trained_on, "trained_share": tally.trained_share, "credited": tally.credited,
            "honest_credited": tally.honest_credited, "heldout_trained": tally.heldout_trained,
            **_victim_after(victim, pool, own_texts)}


def _play(attack: str | None, rounds: int, seed: int, victim: Any, pool: Any, traffic: list[list[list[Any]]],
          tally: _Tally) -> list[str]:
    """The victim's rounds: each round's honest (and attacker) groups offered to its pool, then its round
    step, with receipts sent and counted. Returns the victim's own completions of the last tenth."""
    mix = victim.mix
    attack_rng = random.Random(seed + 77)
    exchange = PoolExchange(pool)
    book = ReceiptBook(ReceiptConfig(), "victim", vouched=pool.has_verified)
    own_texts: list[str] = []
    for r in range(1, rounds + 1):
        honest = [g for peer in traffic for g in peer[r - 1]]
        groups = honest + (_attacker_groups(attack, r, honest, victim, mix, attack_rng) if attack else [])
        for g in groups:
            tally.offer(g, pool.offer(g, g.provenance.origin_peer, _address(g.provenance.origin_peer)))
        result = step(victim, exchange)
        tally.round(result)
        book.published(content_key(g) for g in result.local_groups)
        tally.honest_credited += _send_receipts(book, result.local_groups, [HONEST[0]])
        if attack in RECEIPTS_ONLY:
            tally.credited += _send_receipts(book, result.local_groups, origins(attack))
        if r > rounds - max(1, rounds // 10):
            own_texts += [c for g in result.local_groups for c in g.completions]
    return own_texts


def _victim_after(victim: Any, pool: Any, own_texts: list[str]) -> dict[str, Any]:
    """What the run left in the victim: its held-out pass, the trigger in its own completions and under
    its weights, what its pool dropped, and a digest of the weights."""
    report = victim.evaluate_heldout(record=False)
    stats = pool.stats()
    return {"judge_seen": len(victim.judge_seen),
            "heldout_pass_at_1": report.pass1, "heldout_pass_at_k": report.passk, "eval_k": report.k,
            "trigger_share": sum(TRIGGER in t for t in own_texts) / max(len(own_texts), 1),
            "logp_trigger": _trigger_logprob(victim, victim.heldout_questions()[:16]),
            "dropped": {reason: n for reason, n in stats["dropped"].items() if n},
            "rescore_cpu_s": stats["rescore_cpu_s"],
            "weights_sha256": _weights_digest(victim.model)}  # the same as the control's: the attack changed nothing


def _weights_digest(model: Any) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().to(torch.float32).cpu().numpy().tobytes())
    return digest.hexdigest()


def _run_star(args: tuple[Any, ...]) -> dict[str, Any]:
    return run_one(*args)


def _traffic_star(args: tuple[int, int, int]) -> list[list[Any]]:
    return honest_traffic(*args)


def run(out_dir: Path = BENCH_DIR, rounds: int = 1000, seed: int = 0, workers: int = 2,
        classes: list[str] | None = None, reputation_classes: list[str] | None = None,
        eval_per_specialty: int = 16, replicas: int = 3, extend: bool = False) -> dict[str, Any]:
    """`reputation_classes`: classes run again with the reputation sampler (default: the backdoors).
    `replicas`: perturbed controls (the noise band of a held-out delta). `extend`: add these runs to
    out_dir's result (same rounds and seed; a run of the same class, sampler and perturbation is replaced;
    the controls run again, and each run's rounds/s is compared with its own batch's control)."""
    classes = list(ATTACKS) if classes is None else classes
    reputation_classes = (["trigger_backdoor", "sybil_backdoor"] if reputation_classes is None
                          else reputation_classes)
    samplers = ["uniform", "reputation"] if reputation_classes else ["uniform"]
    previous: list[dict[str, Any]] = []
    if extend:
        old = json.loads((Path(out_dir) / "poisoning.json").read_text())
        if old.get("rounds") != rounds or old.get("seed", seed) != seed:
            raise ValueError("extend: the committed result has other rounds or another seed")
        previous = old["runs"]
    start = time.time()
    batch = time.strftime("%Y-%m-%d %H:%M:%S")  # rounds/s compare within a batch: it reruns its controls
    with multiprocessing.get_context("spawn").Pool(max(1, workers)) as procs:
        traffic = procs.map(_traffic_star, [(i, rounds, seed) for i in range(len(HONEST))], chunksize=1)
        print(f"poisoning: honest traffic ready ({time.time() - start:.0f} s)", flush=True)
        jobs: list[tuple[Any, ...]] = [(None, rounds, seed, s, eval_per_specialty, traffic) for s in samplers]
        jobs += [(c, rounds, seed, "uniform", eval_per_specialty, traffic) for c in classes]
        jobs += [(c, rounds, seed, "reputation", eval_per_specialty, traffic) for c in reputation_classes]
        jobs += [(None, rounds, seed, "uniform", eval_per_specialty, traffic, k) for k in range(1, replicas + 1)]
        runs = []
        for done in procs.imap_unordered(_run_star, jobs, chunksize=1):  # progress as each run ends
            runs.append({**done, "batch": batch})
            print(f"poisoning: {done['attack']} ({done['sampler']}) done, {done['rounds_per_s']:.2f} rounds/s "
                  f"[{len(runs)}/{len(jobs)}, {(time.time() - start) / 60:.0f} min]", flush=True)
    def ident(r: dict[str, Any]) -> tuple[str, str, int, str]:
        """A later run of a class replaces the earlier; a batch's controls stay with their batch."""
        return (r["attack"], r["sampler"], int(r.get("perturb", 0)),
                str(r.get("batch")) if r["attack"] == "control" else "")

    fresh = {ident(r) for r in runs}
    runs = [r for r in previous if ident(r) not in fresh] + runs
    wall = time.time() - start + (60 * float(old.get("wall_minutes", 0.0)) if extend else 0.0)
    return write(summarize(runs, wall, seed), out_dir)


def write(result: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    return save_results(out_dir, "poisoning", result, table, plot)
