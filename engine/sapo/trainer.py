"""The SAPO round on one node: generate -> score -> select (I own + J external) -> update -> record.

The node drives a Trainer: it publishes `RoundResult.local_groups`, feeds back external groups as
the pool verified them, once (`Candidate`s: question regenerated, hash checked, re-scored locally,
under the content key the pool gave each; the trainer uses that question as it is, judges and draws
by that key: engine/sapo/plan.py, and names each in `RoundResult.verdicts`), and calls
`save_checkpoint()` on a clean stop. Everything random comes from one `random.Random` whose state is
checkpointed, so `Trainer.resume` continues exactly: same next batch, same next loss.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from engine.checkpoint import checkpoint_due, latest_checkpoint, load_checkpoint, save_checkpoint
from engine.evaluation import EvalReport, evaluate
from engine.events import EvalCompleted, Event, RoundCompleted, WorkProgress
from engine.models.backends import Generator, HFGenerator
from engine.models.generate import SampleConfig, eos_token_ids
from engine.models.policy import lora_record
from engine.sapo.adaptive_j import JBandit
from engine.sapo.config import SapoConfig
from engine.sapo.copies import CopyScreen
from engine.sapo.eval_schedule import eval_due, eval_due_in
from engine.sapo.first_look import DROP_CUT_NO_SIGNAL, DROP_REPEATED_TEXT, FirstLook
from engine.sapo.frontier import Suggestions
from engine.sapo.plan import RoundPlanner, judge_texts_trained, off_the_judge
from engine.sapo.plausibility import PlausibilityFloor
from engine.sapo.quarantine import Quarantine
from engine.sapo.records import Candidate, Provenance, RolloutGroup
from engine.sapo.repeated_text import RepeatedTextGuard
from engine.sapo.replay import FrontierReplay
from engine.sapo.reputation import Reputation
from engine.sapo.round_parts import Asked, RoundResult, Scored, UpdatePlan, round_metrics
from engine.sapo.rows import LocalGroup, score_group, shape_rewards
from engine.sapo.sampler import make_sampler
from engine.sapo.source_choice import SourceChoice
from engine.sapo.update import UpdateStats, frozen_reference, make_optimizer, policy_update
from engine.sapo.verdicts import round_verdicts
from engine.store import Store
from engine.tasks.curriculum import Curriculum
from engine.tasks.prompts import PromptBuilder, PromptSpec


class _Learned(Protocol):
    def state_dict(self) -> Any: ...

    def load_state(self, state: Any) -> None: ...


class Trainer:
    """One node's SAPO trainer. Dependencies come in; nothing global.

    reward_fn(question, completion) -> float defaults to the task library's verifier with
    cfg.partial_credit. on_event receives RoundCompleted / EvalCompleted events.
    """

    def __init__(self, model: Any, tokenizer: Any, cfg: SapoConfig, mix: Any, store: Store | None,
                 checkpoint_dir: str | Path | None, seed: int, *, model_id: str = "seed",
                 reward_fn: Callable[[Any, str], float] | None = None,
                 on_event: Callable[[Event], None] | None = None, generator: Generator | None = None) -> None:
        from engine.tasks import library

        self.model, self.tokenizer, self.cfg, self.mix = model, tokenizer, cfg, mix
        self.store = store
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.seed, self.model_id = seed, model_id
        self._lib = library
        self.reward_fn = reward_fn or (lambda q, c: library.score(q, c, partial_credit=cfg.partial_credit))
        self.on_event = on_event
        self.round_meter: Callable[[], Mapping[str, float]] | None = None  # more of a round's metrics
        self.generator = generator if generator is not None else HFGenerator()  # samples each round
        self.rng = random.Random(seed)
        self.round = 0
        self.policy_version = 0
        self.optimizer = make_optimizer(model, cfg)
        # Each origin's record here; the reputation sampler draws J by it, any sampler keeps it current.
        self.reputation = Reputation(cfg.reputation)
        self.sampler = make_sampler(cfg.sampler, self.reputation)
        self.suggestions = Suggestions(cfg.reputation)  # peers' questions: which to take, what they yielded
        self.sources = SourceChoice()  # what own picks and suggestions yielded here (cfg.adaptive_sources)
        self.replay = FrontierReplay()  # own recent frontier questions (cfg.num_replay)
        self.reputation_snapshot: dict[str, dict[str, float]] = {}  # a copy for other threads, per round
        # Adaptive J draws from the trainer's own (checkpointed) RNG, so a resumed run chooses alike.
        self.j_bandit = (JBandit(cfg.adaptive_j, cfg.num_external, self.rng)
                         if cfg.adaptive_j.enabled and cfg.num_external else None)
        self.ref_model = frozen_reference(model, cfg)  # taken before any step: the policy as handed in
        eos = eos_token_ids(model, tokenizer)
        if not eos:
            raise ValueError("the tokenizer/model defines no EOS token")
        self.eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else min(eos)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        # The exact prompt text per question (chat template applied here for chat models).
        self.prompt = PromptBuilder(PromptSpec(cfg.prompt_style, cfg.prompt_shots), tokenizer)
        self.curriculum = Curriculum(cfg.curriculum, list(mix.specialties))
        self.repeated_text = RepeatedTextGuard(cfg.repeated_text)
        self.plausibility = PlausibilityFloor(cfg.external_min_logprob, cfg.external_logprob_margin)
        self.first_look = FirstLook(self.repeated_text, self.reputation, tokenizer, self.eos_id,
                                    cfg.sampling.max_new_tokens, self.reward_fn, group_size=cfg.completions,
                                    quarantine=Quarantine(cfg.quarantine_rounds), copies=CopyScreen(cfg.copies))
        self.planner = RoundPlanner(cfg, model_id, self.first_look, self.sampler, self.prompt, tokenizer)
        self._heldout: list[Any] | None = None
        # Hashes of the judge's question texts this node has trained on (own draws or peers' groups that
        # happen to share a judge question's text): those are left out of every later eval.
        self.judge_seen: set[str] = set()
        self._mid_update = False  # weights may differ from (round, policy_version): don't checkpoint
        self.config_changes: list[str] = []  # config fields that differ from the resumed checkpoint's
        self.work_since_checkpoint = 0.0  # training seconds a crash now would lose
        self.eval_clock = 0.0  # training seconds since the last held-out eval (cfg.eval_every_s), checkpointed
        self.last_checkpoint_seconds: float | None = None  # what the newest checkpoint write cost
        self.discarded_rounds: list[int] = []  # rounds the store held past the resumed checkpoint
        self._checkpointed: tuple[int, int] | None = None  # (round, policy_version) of the newest checkpoint

    # -- the round --------------------------------------------------------------------------------
    def run_round(self, external: Sequence[Candidate] = ()) -> RoundResult:
        self._baseline_eval()
        t0 = time.perf_counter()
        round_no = self.round + 1
        judge = frozenset(q.hash for q in self.heldout_questions())
        external, on_judge = off_the_judge(external, judge)
        asked = self._ask(round_no, external)
        t_gen = time.perf_counter()
        scored = self._score(round_no, asked)
        t_score = time.perf_counter()
        plan = self.planner.plan(asked.external, scored, self._choose_j(scored), self.rng, round_no)
        t_prep = time.perf_counter()
        stats = self._update(round_no, plan)
        t_upd = time.perf_counter()
        self.judge_seen.update(judge_texts_trained(asked, plan, judge))

        metrics, per_spec = round_metrics(asked, scored, plan, stats, (t0, t_gen, t_score, t_upd),
                                          self._lib.format_reward, self.first_look.copies.max_share())
        if self.cfg.adaptive_sources:
            self.sources.observe_round(metrics)
        phases = {"generate": t_gen - t0, "score": t_score - t_gen, "prepare": t_prep - t_score,
                  "update": t_upd - t_prep, "total": t_upd - t0}
        self._record_round(metrics, per_spec, phases, len(plan.kept), len(plan.used_external))
        report, ckpt = self._eval_and_checkpoint(round_no, t0)
        verdicts = round_verdicts([c.key for c in asked.suggested], [c.key for c in plan.used_external],
                                  on_judge + plan.dropped, plan.pending)
        return RoundResult(round=round_no, policy_version=self.policy_version,
                           local_groups=tuple(lg.group for lg in scored.local),
                           used_external=tuple(plan.used_external), metrics=metrics, per_specialty_reward=per_spec,
                           phase_seconds=phases, eval=report, checkpoint=ckpt, suggested=tuple(asked.suggested),
                           verdicts=verdicts, peer_loss_share=dict(plan.peer_shares))

    def _ask(self, round_no: int, external: Sequence[Candidate]) -> Asked:
        """Draw the round's I questions and sample L completions to each."""
        cfg = self.cfg
        mix = self.curriculum.apply(self.mix)  # each laddered specialty at its current rung
        # Part of the I questions may be peers' frontier questions (regenerated and hash-checked by the
        # pool's gate), answered here on-policy; a group taken for its question is not also a text group.
        suggested = self.suggestions.pick(external, self._suggestion_slots(len(external)), cfg.suggested_per_origin,
                                          self.rng)
        if suggested:
            taken = {c.key for c in suggested}
            external = [c for c in external if c.key not in taken]
        replayed = self.replay.draw(min(cfg.num_replay, cfg.num_local - len(suggested)), self.rng)
        refs = [entry.ref for _, entry in replayed]
        refs += mix.sample_refs(self.rng, cfg.num_local - len(suggested) - len(replayed), cfg.dataset_seed)
        questions = [v.question for v in suggested] + [self._lib.regenerate(r) for r in refs]
        prompts = [self.prompt(q) for q in questions]
        self._emit(WorkProgress(phase="generating", round=round_no, total=len(prompts) * cfg.completions,
                                detail=f"{len(prompts)} questions x {cfg.completions} answers"))
        gen_seed = self.rng.getrandbits(62)
        gen_version = self.generator.sync(self.model, self.policy_version)  # the weights that sample this round
        samples = self.generator.generate(self.model, self.tokenizer, prompts, cfg.completions, cfg.sampling,
                                          seed=gen_seed)
        return Asked(suggested, replayed, external, questions, prompts, samples, gen_version)

    def _score(self, round_no: int, asked: Asked) -> Scored:
        """Score every own completion locally, once as correctness and once shaped for training; the
        curriculum, the repeated-text guard and the suggesting peers' records learn from it."""
        weight = self._lib.format_weight_at(round_no, self.cfg.format_reward, self.cfg.format_reward_rounds)
        local: list[LocalGroup] = []
        shaped: list[LocalGroup] = []
        prov = Provenance.local(self.model_id, asked.gen_version, round_no)
        for k, (q, prompt, comps) in enumerate(zip(asked.questions, asked.prompts, asked.samples)):
            group = RolloutGroup(ref=q.ref, question_hash=q.hash, completions=tuple(c.text for c in comps),
                                 provenance=prov, generator_logprobs=tuple(c.logprobs for c in comps))
            group = score_group(group, q, self.reward_fn)
            local.append(LocalGroup(group, prompt, tuple(comps)))
            shaped.append(LocalGroup(shape_rewards(group, weight), prompt, tuple(comps)))
            self._observe_own(k, asked, q, group)
            self.first_look.observe_own(group, q.text)
            self.suggestions.asked(q.hash)
        for c, lg in zip(asked.suggested, local):  # each origin's suggestions: judged by what they yielded here
            mixed = lg.group.has_signal
            self.reputation.record(c.origin, flagged=not mixed)
            self.suggestions.observe(c.origin, mixed)
        return Scored(weight, local, shaped)

    def _observe_own(self, k: int, asked: Asked, question: Any, group: RolloutGroup) -> None:
        """The curriculum learns from fresh own draws only: a peer's question, or one of ours asked again,
        may sit at another rung than the current one. The replay buffer keeps what came back mixed."""
        fresh = k - len(asked.suggested) - len(asked.replayed)
        if fresh >= 0:
            self.curriculum.observe(question.specialty, group.rewards or ())
            if self.cfg.num_replay:
                self.replay.observe_fresh(question.hash, question.ref, group.has_signal)
        elif k >= len(asked.suggested):
            key, entry = asked.replayed[k - len(asked.suggested)]
            self.replay.observe_replayed(key, entry, group.has_signal)

    def _choose_j(self, scored: Scored) -> int:
        """J this round: the config's, or the bandit's (last round's J earned this round's own reward)."""
        if self.j_bandit is None:
            return self.cfg.num_external
        own = [r for lg in scored.local for r in (lg.group.rewards or ())]
        self.j_bandit.observe(sum(own) / max(len(own), 1))
        return self.j_bandit.choose()

    def _update(self, round_no: int, plan: UpdatePlan) -> UpdateStats:
        """One policy update on the plan's rows; the round counts as done once it has stepped."""
        trained = len(plan.kept) + len(plan.used_external)
        self._emit(WorkProgress(phase="updating", round=round_no, total=trained,
                                detail=f"learning from {trained} groups"))
        self._mid_update = True
        stats = policy_update(self.model, self.optimizer, plan.rows, self.cfg, self.pad_id, self.ref_model,
                              min_logprob=self.plausibility.floor())
        self.plausibility.observe(stats.own_mean_logps)
        self.policy_version += stats.steps
        for k, c in enumerate(plan.used_external):  # what training found out beyond the first look
            if k in stats.implausible_sources:
                self.reputation.record(c.origin, flagged=True)
        self.reputation_snapshot = self.reputation.snapshot()
        self.round = round_no
        self._mid_update = False
        return stats

    def _suggestion_slots(self, candidates: int) -> int:
        """How many of this round's own questions may come from peers' suggestions."""
        cfg = self.cfg
        if not cfg.adaptive_sources:
            return cfg.num_suggested
        return self.sources.suggested_slots(cfg.num_local, cfg.num_suggested, candidates, self.rng)

    def _record_round(self, metrics: dict[str, float], per_spec: dict[str, float], phases: dict[str, float],
                      num_local: int, num_external: int) -> None:
        """Store the finished round and emit it; its metrics say when the next held-out eval comes."""
        self.eval_clock += phases["total"]
        due_in = eval_due_in(self.cfg, self.round, self.eval_clock, phases["total"])
        if due_in is not None:  # not a store column: the dashboard's "next check in ~N min"
            metrics["eval_due_in_s"] = due_in
        if self.round_meter is not None:  # e.g. the round's energy, read by whoever runs the trainer
            metrics.update(self.round_meter())
        rungs = dict(self.curriculum.rungs) if self.cfg.curriculum.enabled else {}
        if self.store is not None:
            self.store.record_round(self.round, self.policy_version, metrics, per_spec, phases,
                                    num_local, num_external, rungs=rungs, model=self.model_id)
        self._emit(RoundCompleted(round=self.round, policy_version=self.policy_version, metrics=dict(metrics),
                                  per_specialty_reward=dict(per_spec), phase_seconds=dict(phases),
                                  num_local=num_local, num_external=num_external, rungs=rungs, model=self.model_id))

    def _baseline_eval(self) -> None:
        """Before a model's first update here, a held-out eval at round 0: where it started, what every
        later eval is read against. Only on a node that keeps a store (harnesses without one evaluate on
        their own schedule), with evals on, and once (a restart before the first checkpoint finds it)."""
        cfg = self.cfg
        if self.round or self.store is None or not (cfg.eval_every or cfg.eval_every_s):
            return
        if not self.store.evals(kind="heldout", model=self.model_id):
            self.evaluate_heldout()

    def _eval_and_checkpoint(self, round_no: int, t0: float) -> tuple[EvalReport | None, Path | None]:
        """The held-out eval when this round is due one (by rounds or by training time); a checkpoint when
        the work since the last is due one (`t0`: when this round started)."""
        cfg = self.cfg
        report = self.evaluate_heldout() if eval_due(cfg, round_no, self.eval_clock) else None
        self.work_since_checkpoint += time.perf_counter() - t0
        if self.checkpoint_dir is not None and checkpoint_due(
                round_no, self.work_since_checkpoint, self.last_checkpoint_seconds, every=cfg.checkpoint_every,
                max_loss_s=cfg.checkpoint_seconds, overhead=cfg.checkpoint_overhead):
            return report, self.save_checkpoint()
        return report, None

    # -- evaluation ------------------------------------------------------------------------------
    def heldout_questions(self) -> list[Any]:
        if self._heldout is None:
            self._heldout = self._lib.heldout(self.mix, self.cfg.eval_per_specialty, self.cfg.eval_seed)
        return self._heldout

    def use_judge(self, questions: Sequence[Any]) -> None:
        """Judge on `questions` instead of the config's held-out set (a bench's own judge): the texts of
        these this trainer trains on are tracked in `judge_seen` from now on."""
        self._heldout = list(questions)
        self.judge_seen = set()

    def eval_sample_config(self) -> SampleConfig:
        """Held-out sampling: true T = 1, no truncation, the training length cap."""
        return SampleConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=self.cfg.sampling.max_new_tokens)

    def evaluate_heldout(self, *, record: bool = True) -> EvalReport:
        """pass@1 / pass@k on the fixed held-out set, less the questions whose text this node has trained
        on (counted in the report); stored and emitted when `record`."""
        judge = self.heldout_questions()
        questions = [q for q in judge if q.hash not in self.judge_seen]

        def progress(done: int, total: int) -> None:  # an eval takes minutes on a real model: say so
            self._emit(WorkProgress(phase="evaluating", round=self.round, done=done, total=total,
                                    detail="checking held-out questions"))
        if record:
            progress(0, len(questions))
        report = evaluate(self.model, self.tokenizer, questions, k=self.cfg.eval_k,
                          sample_cfg=self.eval_sample_config(), prompt_style=self.cfg.prompt_style,
                          seed=self.cfg.eval_seed, prompt=self.prompt, generator=self.generator,
                          policy_version=self.policy_version, progress=progress if record else None)
        report = dataclasses.replace(report, skipped_seen=len(judge) - len(questions))
        if record:
            self.eval_clock = 0.0
            if self.store is not None:
                self.store.record_eval(self.round, self.policy_version, report.to_dict(), model=self.model_id)
            per = {name: {"pass1": s.pass1, "passk": s.passk} for name, s in report.per_specialty.items()}
            self._emit(EvalCompleted(round=self.round, pass1=report.pass1, passk=report.passk, k=report.k,
                                     per_specialty=per, model=self.model_id))
        return report

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        if self.checkpoint_dir is None:
            raise ValueError("this trainer has no checkpoint directory")
        if self._mid_update:
            raise RuntimeError("a round was interrupted inside its update; the last checkpoint stands")
        newest = latest_checkpoint(self.checkpoint_dir)
        if newest is not None and self._checkpointed == (self.round, self.policy_version):
            return newest  # nothing trained since: rewriting it would only open a window to lose it
        t0 = time.perf_counter()
        extra = {"config": self.cfg.to_dict(), "model_id": self.model_id, "mix": self.mix.name,
                 "seed": self.seed, **{name: part.state_dict() if part is not None else None
                                       for name, part in self._learned().items()},
                 "eval_clock": self.eval_clock, "judge_seen": sorted(self.judge_seen),
                 "lora": lora_record(self.model)}
        path = save_checkpoint(self.checkpoint_dir, model=self.model, optimizer=self.optimizer, round=self.round,
                               policy_version=self.policy_version, python_rng=self.rng, extra=extra,
                               keep=self.cfg.keep_checkpoints)
        self.last_checkpoint_seconds = time.perf_counter() - t0
        self.work_since_checkpoint = 0.0
        self._checkpointed = (self.round, self.policy_version)
        return path

    def load(self, path: str | Path) -> None:
        """Restore weights, optimizer, RNG states and counters from a checkpoint directory."""
        ckpt = load_checkpoint(path, model=self.model, optimizer=self.optimizer)
        for group in self.optimizer.param_groups:  # the config in force wins over the saved hyperparameters
            group.update(lr=self.cfg.lr, betas=(self.cfg.adam_beta1, self.cfg.adam_beta2),
                         weight_decay=self.cfg.weight_decay)
        self.rng.setstate(ckpt.python_rng)
        self.round, self.policy_version = ckpt.round, ckpt.policy_version
        self._checkpointed = (ckpt.round, ckpt.policy_version)
        for name, part in self._learned().items():  # each checks its own (untrusted) state
            if part is not None:
                part.load_state(ckpt.extra.get(name))
        clock = ckpt.extra.get("eval_clock")
        self.eval_clock = float(clock) if isinstance(clock, (int, float)) and math.isfinite(clock) and clock >= 0 else 0.0
        seen = ckpt.extra.get("judge_seen")
        self.judge_seen = {h for h in seen if isinstance(h, str)} if isinstance(seen, list) else set()
        self.reputation_snapshot = self.reputation.snapshot()
        saved = ckpt.extra.get("config")
        self.config_changes = sorted(k for k, v in self.cfg.to_dict().items()
                                     if isinstance(saved, dict) and saved.get(k, v) != v)

    def _learned(self) -> dict[str, _Learned | None]:
        """What the trainer learned beside the weights, by its name in a checkpoint (None: not in use)."""
        return {"curriculum": self.curriculum, "reputation": self.reputation, "quarantine": self.first_look.quarantine,
                "copies": self.first_look.copies, "plausibility": self.plausibility, "adaptive_j": self.j_bandit,
                "sources": self.sources, "replay": self.replay, "suggestion_yield": self.suggestions}

    @classmethod
    def resume(cls, model: Any, tokenizer: Any, cfg: SapoConfig, mix: Any, store: Store | None,
               checkpoint_dir: str | Path, seed: int, **kwargs: Any) -> Trainer:
        """A trainer continuing from the newest checkpoint in `checkpoint_dir` (fresh if there is none).

        Pass the *seed* weights as `model`: the KL reference is taken from them before the
        checkpoint's weights are loaded. Rounds the store holds for this model past that checkpoint
        (a crash killed their weights) are rolled back and listed in `discarded_rounds`: history never
        shows rounds the model does not hold, and the restored RNG redoes them as those rounds.
        """
        trainer = cls(model, tokenizer, cfg, mix, store, checkpoint_dir, seed, **kwargs)
        path = latest_checkpoint(checkpoint_dir)
        if path is not None:
            trainer.load(path)
        if store is not None:  # rounds this model trained after that checkpoint died with the process
            trainer.discarded_rounds = store.discard_rounds_after(trainer.round, trainer.model_id)
        return trainer

    def _emit(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)


__all__ = ["DROP_CUT_NO_SIGNAL", "DROP_REPEATED_TEXT", "RoundResult", "Trainer", "shape_rewards"]
