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
import multiprocessing
import random
import time
from pathlib import Path
from typing import Any

from engine.swarm.pool import content_key
from engine.swarm.receipts import ReceiptBook, ReceiptConfig
from lab import BENCH_DIR
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
    from engine.sapo.config import preset

    return preset("cpu-small").replace(num_local=2, num_external=2, eval_every=0, checkpoint_every=0,
                                       sampler=sampler, eval_per_specialty=eval_per_specialty)


def honest_traffic(peer: int, rounds: int, seed: int) -> list[list[Any]]:
    """One frozen honest peer's groups for every round (`HONEST[peer]`, its own draws): the same in
    every run, so it is generated once and replayed."""
    import torch

    torch.set_num_threads(1)
    from engine.models.backends import HFGenerator
    from engine.models.policy import load_policy
    from engine.paths import SEED_MODEL_DIR
    from engine.sapo.records import Provenance, RolloutGroup
    from engine.tasks import library
    from engine.tasks.prompts import PromptBuilder, PromptSpec

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
    import torch

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
    from engine.tasks import library

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
    import torch

    torch.set_num_threads(1)
    from engine.models.policy import load_policy
    from engine.node.peer_groups import make_pool
    from engine.paths import SEED_MODEL_DIR
    from engine.sapo.step import PoolExchange, step
    from engine.sapo.trainer import Trainer
    from engine.swarm.config import PoolConfig
    from engine.tasks import library

    mix = library.preset("rl")
    cfg = _victim_config(sampler, eval_per_specialty)
    model, tok = load_policy(SEED_MODEL_DIR)
    victim = Trainer(model, tok, cfg, mix, None, None, seed=seed)
    for _ in range(perturb):
        victim.rng.random()
    if traffic is None:
        traffic = [honest_traffic(i, rounds, seed) for i in range(len(HONEST))]
    attack_rng = random.Random(seed + 77)
    pool = make_pool(PoolConfig(), cfg.sampling.max_new_tokens, cfg.partial_credit, mix)  # the node's own
    exchange = PoolExchange(pool)
    book = ReceiptBook(ReceiptConfig(), "victim", vouched=pool.has_verified)
    tally = _Tally(set(origins(attack)) if attack else set(), {q.hash for q in victim.heldout_questions()})
    own_texts: list[str] = []
    start, cpu_start = time.perf_counter(), time.process_time()
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
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    report = victim.evaluate_heldout(record=False)
    stats = pool.stats()
    return {"attack": attack or "control", "sampler": sampler, "perturb": perturb, "rounds": rounds,
            "seconds": seconds,
            "rounds_per_s": rounds / seconds, "cpu_seconds": cpu_seconds,
            "rounds_per_cpu_s": rounds / max(cpu_seconds, 1e-9), "offered": tally.offered, "pooled": tally.pooled,
            "trained_on": tally.trained_on, "trained_share": tally.trained_share, "credited": tally.credited,
            "honest_credited": tally.honest_credited, "heldout_trained": tally.heldout_trained,
            "judge_seen": len(victim.judge_seen),
            "heldout_pass_at_1": report.pass1, "heldout_pass_at_k": report.passk, "eval_k": report.k,
            "trigger_share": sum(TRIGGER in t for t in own_texts) / max(len(own_texts), 1),
            "logp_trigger": _trigger_logprob(victim, victim.heldout_questions()[:16]),
            "dropped": {reason: n for reason, n in stats["dropped"].items() if n},
            "rescore_cpu_s": stats["rescore_cpu_s"],
            "weights_sha256": _weights_digest(victim.model)}  # the same as the control's: the attack changed nothing


def _weights_digest(model: Any) -> str:
    import torch

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
        import json

        old = json.loads((Path(out_dir) / "poisoning.json").read_text())
        if old.get("rounds") != rounds or old.get("seed", seed) != seed:
            raise ValueError("extend: the committed result has other rounds or another seed")
        previous = old["runs"]
    start = time.time()
    batch = time.strftime("%Y-%m-%d %H:%M:%S")  # rounds/s compare within a batch: it reruns its controls
    with multiprocessing.get_context("spawn").Pool(max(1, workers)) as procs:
        traffic = procs.map(_traffic_star, [(i, rounds, seed) for i in range(len(HONEST))], chunksize=1)
        print(f"poisoning: honest traffic ready ({time.time() - start:.0f} s)", flush=True)
        jobs = [(None, rounds, seed, s, eval_per_specialty, traffic) for s in samplers]
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


def summarize(runs: list[dict[str, Any]], wall_s: float, seed: int = 0) -> dict[str, Any]:
    import statistics

    plain = [r for r in runs if r["attack"] == "control" and not r.get("perturb")]
    controls = {r["sampler"]: r for r in plain}  # the newest batch's (runs are in batch order)
    same_batch = {(r["sampler"], r.get("batch")): r for r in plain}  # what a run's rounds/s compare with
    replicas = [r for r in runs if r["attack"] == "control" and r.get("perturb")]
    # The noise of one paired run's held-out delta: the control and its perturbed replicas, none attacked.
    pass1 = [controls["uniform"]["heldout_pass_at_1"]] + [r["heldout_pass_at_1"] for r in replicas]
    noise_sd = statistics.stdev(pass1) if len(pass1) > 1 else None
    classes = []
    for r in runs:
        if r["attack"] == "control":
            continue
        c = controls[r["sampler"]]
        t = same_batch.get((r["sampler"], r.get("batch")), c)  # machines drift over an hour: same batch
        classes.append({
            "name": r["attack"], "sampler": r["sampler"], "offered": r["offered"], "pooled": r["pooled"],
            "trained_on": r["trained_on"],
            # runs from before the forged-content classes did not record these (None: not measured)
            "trained_share": r.get("trained_share"), "credited": r.get("credited"),
            "honest_credited": r.get("honest_credited"), "heldout_trained": r.get("heldout_trained"),
            "rounds_per_s_ratio": r["rounds_per_s"] / t["rounds_per_s"],
            # the victim's own CPU per round: what contention from other processes cannot move
            "rounds_per_cpu_s_ratio": (r["rounds_per_cpu_s"] / t["rounds_per_cpu_s"]
                                       if "rounds_per_cpu_s" in r and "rounds_per_cpu_s" in t else None),
            "timed_against_batch": t.get("batch"),
            "heldout_delta": r["heldout_pass_at_1"] - c["heldout_pass_at_1"],
            "heldout_delta_relative": (r["heldout_pass_at_1"] - c["heldout_pass_at_1"]) / max(c["heldout_pass_at_1"], 1e-9),
            "trigger_share": r["trigger_share"], "logp_trigger_delta": r["logp_trigger"] - c["logp_trigger"],
            # the victim ended with exactly the control's weights: the attacker's traffic changed nothing
            "same_weights_as_control": (None if not (r.get("weights_sha256") and c.get("weights_sha256"))
                                        else r["weights_sha256"] == c["weights_sha256"]),
            "dropped": r["dropped"]})
    for k in classes:  # beyond two noise sds of the paired delta, in either direction
        k["heldout_beyond_noise"] = (None if noise_sd is None
                                     else abs(k["heldout_delta"]) > 2 * noise_sd * 2 ** 0.5)
    return {"rounds": runs[0]["rounds"], "seed": seed, "controls": controls, "classes": classes, "runs": runs,
            "control_replicas_pass_at_1": pass1[1:], "heldout_noise_sd": noise_sd,
            "wall_minutes": wall_s / 60, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
            "targets": {"trigger_share": 0.0, "heldout_within": 0.05, "rounds_per_s_ratio_min": 0.8,
                        "trained_share_one_identity_max": 1 / 4, "trained_share_two_identities_max": 2 / 4,
                        "heldout_trained": 0, "credited_receipt_sybil_and_copycat": 0}}


def write(result: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    from lab.bench import save_results

    return save_results(out_dir, "poisoning", result, table, plot)


def table(result: dict[str, Any]) -> str:
    c = result["controls"]["uniform"]
    lines = [(f"# Peers that lie: a seed victim among 2 honest peers, {result['rounds']} rounds per run "
              f"({result['measured_at']}, {result['wall_minutes']:.0f} min)"), "",
             (f"Control (no attacker): {c['rounds_per_s']:.2f} rounds/s, held-out pass@1 {c['heldout_pass_at_1']:.4f} "
              f"(pass@{c['eval_k']} {c['heldout_pass_at_k']:.4f}), log p(trigger) {c['logp_trigger']:.1f}. "
              "Targets: trigger share 0, held-out pass@1 within 5% of control, rounds/s >= 0.8x under CPU bombs "
              "and Sybils; one identity at most 1/(I+J) of a round's step and two at most J/(I+J); 0 held-out "
              "questions trained; credit 0 for receipts from unverified senders and for copies. Credited: "
              "receipts the victim sent the attacker (one per group it trained), or for receipt_sybil the "
              "attacker's receipts the victim counted."), "", _noise_line(result), "",
             ("| class | sampler | offered | pooled | trained on | rounds/s vs control (per CPU-s) "
              "| largest share of a round's step | credited | held-out questions trained "
              "| held-out Δ pass@1 (rel.) | beyond noise | same weights as control | trigger share | Δ log p(trigger) "
              "| dropped |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in result["classes"]:
        dropped = ", ".join(f"{reason} {n}" for reason, n in sorted(k["dropped"].items(), key=lambda kv: -kv[1])[:3])
        lines.append(f"| {k['name']} | {k['sampler']} | {k['offered']:,} | {k['pooled']:,} | {k['trained_on']:,} | "
                     f"{k['rounds_per_s_ratio']:.2f}x ({_ratio(k.get('rounds_per_cpu_s_ratio'))}) | "
                     f"{_share(k.get('trained_share'))} | {_count(k.get('credited'))} | {_count(k.get('heldout_trained'))} | "
                     f"{k['heldout_delta']:+.4f} ({k['heldout_delta_relative']:+.0%}) | "
                     f"{_beyond(k.get('heldout_beyond_noise'))} | {_same(k.get('same_weights_as_control'))} | "
                     f"{k['trigger_share']:.3f} | {k['logp_trigger_delta']:+.1f} | {dropped} |")
    return "\n".join(lines)


def _noise_line(result: dict[str, Any]) -> str:
    sd, replicas = result.get("heldout_noise_sd"), result.get("control_replicas_pass_at_1") or []
    if sd is None:
        return "Held-out noise: not measured (no perturbed control replicas)."
    values = ", ".join(f"{v:.4f}" for v in replicas)
    return (f"Held-out noise: the control's pass@1 and {len(replicas)} perturbed replicas' ({values}; the same "
            f"victim and traffic, another path) have sd {sd:.4f}; a paired delta beyond 2·√2·sd = "
            f"{2 * 2 ** 0.5 * sd:.4f} is marked beyond noise.")


def _beyond(value: bool | None) -> str:
    return "–" if value is None else ("**yes**" if value else "no")


def _same(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "no")


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _count(value: int | None) -> str:
    return "–" if value is None else f"{value:,}"


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [k for k in result["classes"] if k["sampler"] == "uniform"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    names = [k["name"] for k in rows]
    for ax, key, title in ((axes[0], "trained_on", "attacker groups trained on"),
                           (axes[1], "rounds_per_s_ratio", "victim rounds/s vs control"),
                           (axes[2], "heldout_delta", "held-out pass@1 vs control")):
        ax.barh(names, [k[key] for k in rows], color="#2563eb")
        ax.set_title(title)
        if key == "rounds_per_s_ratio":
            ax.axvline(0.8, color="#dc2626", ls="--", lw=1)
    fig.suptitle(f"Poisoning bench: {result['rounds']} rounds per run (seed victim, uniform sampler)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

