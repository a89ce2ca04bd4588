"""The node: a SAPO trainer, the swarm links and the store, composed; join / pause / leave.

Threads: the asyncio loop (swarm links, mDNS, control API) never trains. One worker thread runs
rounds back to back; it reads the pool (thread-safe), hands the groups it generated to the loop for
publishing, and emits typed events on the bus. Pausing and leaving take effect *between* rounds, so a
round in flight is never half-applied: a crash or a kill loses at most that round.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from engine import autostart, doctor
from engine.bus import EventBus
from engine.checkpoint import checkpoint_dir_for
from engine.control.model_switch import prepare_model
from engine.control.status import NodeStatus, recent_summary
from engine.events import Event, LogRecord, ModelProgress, NodeState, PeerUpdated, RolloutSeen, StateChanged
from engine.machine.contribution import Contribution
from engine.machine.governor import ThreadGovernor
from engine.machine.guard import Verdict, may_train, probe_machine
from engine.machine.load import PauseTimer, ThreadPacer
from engine.machine.memory import HeapTrimmer
from engine.models.catalog import about as about_model
from engine.models.catalog import short_name as model_name
from engine.models.resolve import release_model, resolve_model, stored_model_id
from engine.node.ask import AskDesk
from engine.node.build import build_trainer, private_judge_seed, ready_line
from engine.node.config import NodeConfig
from engine.node.swarm import NodeSwarm
from engine.sapo.step import step
from engine.settings import ContributorSettings
from engine.store import Store
from engine.supervisor import read_last_crash
from engine.tasks import preset as task_mix

log = logging.getLogger("sapo.node")

__all__ = ["Node", "NodeConfig", "private_judge_seed"]

GUARD_RECHECK_S = 5.0  # how often a paused node re-reads battery / idle / temperature


class Node:
    """Implements engine.control.api.NodeControl."""

    def __init__(self, config: NodeConfig, *, settings: ContributorSettings | None = None,
                 bus: EventBus | None = None) -> None:

        self.config = config
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.bus = bus or EventBus()
        self.settings = settings or ContributorSettings.load(config.data_dir)
        self.store = Store(config.data_dir / "node.db")
        self.bus.add_listener(self._record)
        self._state: NodeState = "stopped"
        self._detail = ""
        self._round, self._policy_version = 0, 0
        self._model_label, self._device, self._backend = config.model, "", ""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pause_requested = False
        self._paused_by = ""  # why it is paused: "you", "start" or a rule's cause (engine.machine.guard.CAUSES)
        self._stop_requested = False
        self._worker: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.net = NodeSwarm(config, self.settings, self.bus.publish, self.store)  # identity, pool, links
        self._model = config.model  # what the next trainer build loads; select_model changes it
        self._built_model: str | None = None  # what the live trainer was built from
        self._switching: str | None = None  # a select_model in progress
        self.finished = asyncio.Event()  # set when the worker ends (rounds limit, leave, or a crash)
        self.crashed = asyncio.Event()  # set when training raised: `sapo run` exits for its supervisor
        self.error: str | None = None
        self.identity_conflict = False  # another live node has this identity: a restart cannot help
        self._reputation: dict[str, dict[str, float]] = {}  # each peer's record here, as of the last round
        self._eval_every: int | None = None  # the live trainer's rounds between held-out evals (0 = never)
        self._eval_every_s: float | None = None  # ... and training seconds between them (0 = no time rule)
        self._recent_rounds: collections.deque[tuple[float, float]] = collections.deque(maxlen=64)  # (ts, reward)
        self._heap = HeapTrimmer(config.memory)
        self._contribution = Contribution(config.data_dir)  # what this machine has given, kept across restarts
        # The threads: the cores lent that other work leaves free, chosen again inside each round.
        self._governor = ThreadGovernor(ThreadPacer())
        self._threads: dict[str, Any] = {}  # the last round's (engine.machine.governor.round_record)
        self._pause = PauseTimer()  # a long pause releases the model's memory
        self._desk = AskDesk(list(task_mix(config.mix).specialties), config.seed, self.bus.publish)  # "Try it"

        self._last_crash = read_last_crash(config.data_dir)  # why the previous engine died, if it did

    # ---- NodeControl ------------------------------------------------------------------------------
    def status(self) -> NodeStatus:
        with self._lock:
            return NodeStatus(
                state=self._state, detail=self._detail, paused_by=self._paused_by, round=self._round,
                policy_version=self._policy_version, peers=self.net.peer_count(), model=self._model_label,
                model_about=about_model(self._model_label), model_name=model_name(self._model_label),
                device=self._device, backend=self._backend, data_dir=str(self.config.data_dir),
                peer_name=self.net.identity.name if self.net.identity else "",
                swarm=self.net.health(self._reputation), last_crash=self._last_crash, eval_every=self._eval_every,
                eval_every_s=self._eval_every_s, recent=recent_summary(list(self._recent_rounds), time.time()),
                memory=self._heap.status(), threads=dict(self._threads),
                contribution=self._contribution.status(self.net.groups_peers_trained()),
                model_released=self._pause.released)

    async def join(self) -> None:
        if self._worker is not None and self._worker.is_alive():
            await self.resume()
            return
        self._loop = asyncio.get_running_loop()
        self.finished = asyncio.Event()
        self._stop_requested = False
        self._pause_requested = False
        self._set_state("joining")
        self.error = None
        await self.net.stop()  # a worker that ended on its own may have left its links open
        if not self.config.solo:
            await self.net.start(self._model_id())
        self._worker = threading.Thread(target=self._work, name="sapo-trainer", daemon=True)
        self._desk.open()
        self._worker.start()

    async def leave(self) -> None:
        if self._worker is None:
            self._set_state("stopped")
            return
        self._stop_requested = True  # first: the worker then never paints over "leaving"
        self._set_state("leaving", "finishing the round in flight")
        self._wake.set()
        await asyncio.to_thread(self._worker.join)
        self._worker = None
        await self.net.stop()
        self._set_state("stopped", self.error or "")

    def hold(self) -> None:
        """Start paused (the `start_paused` setting): no worker and no model loaded until `resume`."""
        self._set_state("paused", "started paused: Resume (or `sapo resume`) starts training", paused_by="start")

    async def finish(self) -> None:
        """`sapo finish`: the round in flight finishes, then training stops (checkpointed, peers told);
        the engine stays up, and resume or join trains again."""
        await self.leave()
        if self.error is None:
            self._set_state("stopped", f"finished after round {self._round}: Join (or `sapo resume`) trains again")

    async def pause(self, after_round: bool = True) -> None:
        # A round is one optimizer update: it always finishes, so both ways wait for it.
        self._pause_requested = True
        if self._state not in ("paused", "stopped"):
            self._set_state("pausing", "finishing this round, then pausing", paused_by="you")
        elif self._state == "paused":
            self._set_state("paused", "paused by you", paused_by="you")
        self._wake.set()

    async def resume(self) -> None:
        """Lift a pause by hand and a snooze; the other rules still apply. A node that is not training
        (started paused, finished, left) joins."""
        self._pause_requested = False
        if self.settings.snooze_until > time.time():
            await self.update_settings({"snooze_until": 0.0})
        if self._worker is None or not self._worker.is_alive():
            await self.join()
            return
        self._wake.set()

    async def snooze(self, seconds: float) -> None:
        if not 0 < seconds <= 7 * 24 * 3600:
            raise ValueError("snooze must be between 0 and 7 days")
        await self.update_settings({"snooze_until": time.time() + seconds})

    def get_settings(self) -> dict[str, Any]:
        return self.settings.to_dict()

    async def update_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        if isinstance(changes, dict) and "model" in changes:
            raise ValueError("the model is switched with select_model (it checks the model loads)")
        new = ContributorSettings.from_dict(changes, base=self.settings)
        if new.start_at_login != self.settings.start_at_login:  # the OS's login items follow the setting

            autostart.apply_setting(new.start_at_login, self.config.data_dir)
        new.save(self.config.data_dir)
        old, self.settings = self.settings, new
        self.net.settings = new  # the swarm reads its settings when it starts
        swarm_keys = ("bootstrap_url", "lan_discovery", "ca_file")
        if self.net.running and any(getattr(old, k) != getattr(new, k) for k in swarm_keys):
            await self.net.stop()  # joined: the swarm starts again on the new settings now, training goes on
            await self.net.start(self._model_id())
        self._wake.set()  # a paused node re-checks its rules now
        return new.to_dict()

    def history(self, limit: int = 2000) -> dict[str, Any]:
        """The store's record, oldest first, for the GUI to rebuild its dashboards: the selected model's
        newest rounds, its evals and its totals over all its rounds (a model switched back to shows its
        own, not the last one trained); rollouts, peers, refusals."""
        with self._lock:
            model = stored_model_id(self._model)
        return {**self.store.model_history(limit, model),
                "rollouts": list(reversed(self.store.rollouts(limit=limit))), "peers": self.store.peers(),
                "frame_refusals": self.store.refusal_totals()}

    async def ask(self, specialty: str = "", text: str = "") -> dict[str, Any]:
        """Your model's and the starting model's answers to a question, between rounds (engine.node.ask)."""
        answer = self._desk.submit(specialty, text)
        self._wake.set()  # a paused worker answers at once
        return await asyncio.wrap_future(answer)

    def recent_groups(self) -> dict[str, Any]:
        """The node's own last groups: question, a few completions, rewards (newest first)."""
        return self._desk.recent()

    def machine(self) -> dict[str, Any]:
        return doctor.report(can_fetch=None, cpu_cores=self.settings.cpu_cores,
                             busy_cores=self._threads.get("others_busy"), measured=doctor.stored_rounds(self.store),
                             probe_dir=self.config.data_dir)

    # ---- switching models -------------------------------------------------------------------------
    async def select_model(self, model_id: str) -> None:
        """Switch the policy's model while stopped or paused: resolve it (a catalog model downloads,
        with ModelProgress events), check that it loads; the next join or resume trains it.
        ValueError (an "error" ModelProgress too) when it cannot be used."""
        if self._state not in ("stopped", "paused"):
            raise ValueError(f"pause or leave before switching models (the node is {self._state})")
        if self._switching is not None:
            raise ValueError(f"a switch to {self._switching} is already under way")
        self._switching = model_id
        self._checkpoint_dir(self.config.model)  # record which model owns the top checkpoint folder
        try:
            label = await asyncio.to_thread(prepare_model, model_id, self.bus.publish, resolve_model)
        finally:
            self._switching = None
        newest = self.store.rounds(limit=1, model=stored_model_id(model_id))  # rounds are numbered per model
        with self._lock:
            self._model, self._model_label = model_id, label
            self._round, self._policy_version = ((newest[-1]["round"], newest[-1]["policy_version"]) if newest
                                                 else (0, 0))
            self.settings = dataclasses.replace(self.settings, model=model_id)  # the next start trains it too
            self.settings.save(self.config.data_dir)
            self._backend = ""  # the old model's: the new one's is known when it loads
            state, paused_by = self._state, self._paused_by
        # the header says it too, not only the Machine tab: a switch while stopped changes no state
        self._set_state(state, f"{model_name(label) or label} is ready: "
                               f"{'Resume' if state == 'paused' else 'Join the swarm'} to train it", paused_by=paused_by)
        self.bus.publish(ModelProgress(model_id=model_id, phase="ready", done=1, total=1,
                                       message=f"{label}: the next round trains it"))
        self.bus.publish(LogRecord(level="info", message=f"model switched to {label}: the next round trains it"))

    def _checkpoint_dir(self, model: str) -> Path:
        return checkpoint_dir_for(self.config.data_dir / "checkpoints", model, self.config.model)

    def _continue_round_count(self, trainer: Any) -> None:
        """Rounds are numbered per model (a model switched to starts at its own round 1) and count on
        from the store's newest of this model: a checkpoint older than its rounds must not overwrite them."""
        trainer.round = max(trainer.round, self.store.last_round(model=trainer.model_id) or 0)

    def _model_id(self) -> str:
        return "seed" if self._model == "seed" else Path(self._model).name

    # ---- the worker thread ------------------------------------------------------------------------
    def _work(self) -> None:
        trainer = None
        try:
            trainer = self._build_trainer()
            done = 0
            while not self._stop_requested:
                copy = self.net.duplicate_identity
                if copy is not None:  # another live node has our identity: it must not be both
                    self.error = str(copy)
                    self.identity_conflict = True
                    self.bus.publish(LogRecord(level="error", message=self.error))
                    self._set_state("stopped", self.error)
                    break
                if not self._may_run_now():
                    self._desk.answer(trainer, self._built_model)  # paused: a question is answered at once
                    if trainer is not None and self._pause.release_due():
                        release_model(trainer, self.bus.publish)  # checkpointed, llama.cpp's copy freed
                        trainer = None
                        self._desk.forget_model()
                        self._pause.freed()
                    continue
                if trainer is None or self._built_model != self._model:  # released, or select_model while paused
                    if trainer is not None:
                        trainer.save_checkpoint()
                        trainer = None  # free the old weights before loading the new ones
                    if self._pause.released:  # progress while the model loads again after a long pause
                        self._set_state("joining", "loading the model again after the pause")
                    trainer, self._pause.released = self._build_trainer(), False
                self._desk.answer(trainer, self._built_model)  # between rounds: never racing the update
                self._set_state("in_swarm" if self.net.peer_count() else "solo", training=True)
                with self._governor.governing(self._device, self.settings.cpu_cores, trainer.generator) as chosen:
                    self._threads = chosen
                    self._run_one_round(trainer)
                self._threads = self._governor.round_record()
                done += 1
                if self.config.rounds and done >= self.config.rounds:
                    break
        except Exception as exc:  # noqa: BLE001 -- the worker's supervisor: report, never die silently
            self.error = f"{type(exc).__name__}: {exc}"
            self.bus.publish(LogRecord(level="error", message=traceback.format_exc()))
            self._set_state("stopped", self.error)
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self.crashed.set)
        finally:
            self._desk.close(f"training stopped: {self.error}" if self.error else "the node left before answering")
            if trainer is not None:
                trainer.save_checkpoint()
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self.finished.set)

    def _may_run_now(self) -> bool:
        verdict = (Verdict(False, "paused by you", "you") if self._pause_requested
                   else may_train(self.settings, probe_machine(time.time(), self.settings)))
        if not verdict.run:
            self._set_state("paused", verdict.reason, paused_by=verdict.cause)
            self._pause.paused()
            self._wake.wait(timeout=GUARD_RECHECK_S)
            self._wake.clear()
            return False
        self._pause.running()
        return True

    def _build_trainer(self) -> Any:
        model = self._model
        built = build_trainer(self.config, self.settings, model, self.store, self._checkpoint_dir(model),
                              self.bus.publish, self._round)
        trainer = built.trainer
        trainer.round_meter = self._contribution.round_energy  # each stored round says what it cost
        self._continue_round_count(trainer)
        self._built_model = model
        with self._lock:
            self._round, self._policy_version = trainer.round, trainer.policy_version
            self._device, self._backend = built.device, built.backend
            self._model_label = built.model_id
            self._eval_every, self._eval_every_s = trainer.cfg.eval_every, trainer.cfg.eval_every_s
        self.bus.publish(ready_line(built))
        return trainer

    def _follow_peers(self) -> None:
        """A peer came or went: a training node says at once whether it trains with others, not only
        when its next round starts (a real model's round, or its first held-out check, takes minutes)."""
        if self._state in ("solo", "in_swarm"):
            self._set_state("in_swarm" if self.net.peer_count() else "solo", training=True)

    def _run_one_round(self, trainer: Any) -> None:
        """One round; the trainer itself stores its metrics and emits RoundCompleted / EvalCompleted."""
        self._contribution.round_started()
        result = step(trainer, self.net)
        self.net.report_verdicts(result.verdicts)
        self._desk.keep_round(result.local_groups)
        self._contribution.round_done()
        with self._lock:
            self._round, self._policy_version = result.round, result.policy_version
            self._reputation = trainer.reputation_snapshot  # the trainer's copy of this round
            self._recent_rounds.append((time.time(), float(result.metrics.get("reward_mean", 0.0))))
        self._heap.after_round()

    # ---- bookkeeping ------------------------------------------------------------------------------
    def _set_state(self, state: NodeState, detail: str = "", training: bool = False, paused_by: str = "") -> None:
        """`training`: the worker starting a round; a leave or pause asked for meanwhile keeps its
        "leaving" / "pausing" (the round still runs, and the state says what comes after it).
        `paused_by`: why a paused or pausing node is (set with the state, under the lock: the worker and
        the control API both set it)."""
        with self._lock:
            if (state, detail) == (self._state, self._detail):
                return
            if training and ((self._state == "leaving" and self._stop_requested)
                             or (self._state == "pausing" and self._pause_requested)):
                return
            self._state, self._detail = state, detail
            self._paused_by = paused_by if state in ("paused", "pausing") else ""
        self.bus.publish(StateChanged(state=state, detail=detail))

    def _record(self, event: Event) -> None:
        """Bus listener: what peers sent and who they are goes to the store (round metrics are
        stored by the trainer itself)."""
        if isinstance(event, RolloutSeen):
            self.store.record_rollout(event.origin_peer, event.specialty, event.ref_key, event.status,
                                      event.reason, event.reward, event.ts)
            if event.status == "used":
                self.store.add_peer_counts(event.origin_peer, used=1)
            elif event.arrival:  # later verdicts (skipped, evicted) are on a group already received
                self.store.add_peer_counts(event.origin_peer, received=1)
        elif isinstance(event, PeerUpdated):
            self.store.upsert_peer(event.peer_id, event.name, event.model, event.found_by, event.address,
                                   event.ts)
            self._follow_peers()
        elif isinstance(event, LogRecord):
            level = event.level if event.level in ("info", "warning", "error") else "info"
            getattr(log, level)(event.message)

