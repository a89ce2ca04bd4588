"""The node's side of the swarm: its identity, its pool of peers' groups and its SwarmService, and what
passes between them and the trainer thread.

`Node` owns one; the asyncio loop starts and stops it (`start`/`stop`); the trainer thread reads the
pool (thread-safe) and hands its groups and receipts to the loop (`publish`, `send_receipts`); the
control API reads `health()`. Attributes are replaced, never mutated, so other threads read each
one once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from engine import tasks
from engine.events import LogRecord
from engine.node.peer_groups import make_pool, rollout_event, task_library_version
from engine.sapo.records import Candidate, CandidateKey, RolloutGroup
from engine.sapo.verdicts import Verdict, VerdictLog
from engine.swarm.identity import Identity
from engine.swarm.service import SwarmService

MAX_REPUTATION_ROWS = 32


class NodeSwarm:
    def __init__(self, config: Any, settings: Any, publish_event: Callable[[Any], None], store: Any) -> None:
        self.config, self.settings = config, settings  # NodeConfig, ContributorSettings
        self._emit = publish_event
        self._store = store
        self.identity: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.pool: Any = None
        self.service: Any = None
        self._refusals_stored: dict[str, int] = {}  # the service's refusal counters as last stored
        self._verdicts = VerdictLog()  # the trainer's skips as last reported (trainer thread only)
        self._offered: dict[CandidateKey, Candidate] = {}  # this round's candidates: its verdicts name them by key

    async def start(self, model_id: str) -> None:
        cfg = self.config
        self._loop = asyncio.get_running_loop()  # the trainer thread hands its results to this loop
        self.identity = Identity.load_or_create(cfg.data_dir)
        self._refusals_stored = {}  # a new service counts from zero
        tokens = max(c.sampling.max_new_tokens for c in (cfg.sapo, cfg.real_sapo) if c)
        self.pool = make_pool(cfg.swarm.pool, tokens, cfg.sapo.partial_credit, tasks.preset(cfg.mix),
                              on_decision=self._pool_eviction)
        swarm_cfg = cfg.swarm
        if self.settings.bootstrap_url and self.settings.bootstrap_url not in swarm_cfg.bootstrap_urls:
            swarm_cfg = dataclasses.replace(
                swarm_cfg, bootstrap_urls=swarm_cfg.bootstrap_urls + (self.settings.bootstrap_url,))
        if not self.settings.lan_discovery:
            swarm_cfg = dataclasses.replace(swarm_cfg, mdns=False)
        if self.settings.ca_file:  # the app's setting; `sapo run --ca` wins
            swarm_cfg = dataclasses.replace(swarm_cfg, ca_file=swarm_cfg.ca_file or self.settings.ca_file)
        info = {"model_id": model_id, "task_lib_version": task_library_version()}
        service = SwarmService(self.identity, swarm_cfg, self.pool, info, self._emit,
                               replay_state=cfg.data_dir / "replay-guard.json",
                               receipts_state=cfg.data_dir / "receipts.json")
        await service.start()
        self.service = service
        self._emit(LogRecord(level="info", message=f"swarm: {self.identity.name} listening on "
                             f"{service.listen_url}"))

    async def stop(self) -> None:
        service, self.service = self.service, None
        if service is not None:
            await service.stop()

    def _pool_eviction(self, decision: Any) -> None:
        """Groups that left the pool unused reach the feed and the store like every other decision
        (offers are reported by the swarm service, uses by the round)."""
        if decision.evicted:
            self._emit(rollout_event(decision.group, "dropped", decision.reason, decision.question, evicted=True))

    # --- read from any thread ---------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.service is not None

    @property
    def duplicate_identity(self) -> Any:
        service = self.service
        return service.duplicate_identity if service is not None else None

    def peer_count(self) -> int:
        service = self.service  # read once: the loop may clear it while leaving
        return service.peer_count() if service is not None else 0

    def groups_peers_trained(self) -> int:
        """This node's groups peers said they trained on (its receipts, as the courier counts them)."""
        service = self.service
        return int(service.receipts.stats()["used"]) if service is not None else 0

    def health(self, reputation: dict[str, dict[str, float]]) -> dict[str, Any]:
        """What the swarm refused and why: frames by reason (signature, schema, replay, rate) and
        groups by reason (forged reference, oversized, duplicate, ...). Empty when solo."""
        service, pool = self.service, self.pool
        if service is None or pool is None:
            return {}
        stats, groups = service.stats(), pool.stats()
        rows = sorted(reputation.items(), key=lambda kv: -kv[1]["groups"])[:MAX_REPUTATION_ROWS]
        return {"frames_accepted": stats["frames_accepted"], "frames_refused": stats["refusals"],
                "groups_received": groups["received"], "groups_pooled": groups["pooled"],
                "groups_used": groups["used"], "groups_dropped": groups["dropped"], "pool_size": groups["size"],
                "links": stats["links"], "board": board_summary(stats.get("board") or {}),
                "known_peers": stats["known_peers"],
                "reputation": [{"peer": peer, "score": round(rec["score"], 4), "groups": int(rec["groups"])}
                               for peer, rec in rows],
                "receipts": stats["receipts"]}

    # --- the trainer thread ----------------------------------------------------------------------
    def candidates(self) -> list[Candidate]:
        pool = self.pool
        candidates: list[Candidate] = pool.candidates() if pool is not None else []
        self._offered = {c.key: c for c in candidates}
        return candidates

    def copiers(self) -> list[str]:
        pool = self.pool
        return pool.take_copiers() if pool is not None else []

    def after_round(self, own: Sequence[RolloutGroup], used: Sequence[Candidate]) -> None:
        """A round ended (the round step's exchange, on the trainer thread): mark and report the peers'
        groups it used, tell their origins (receipts), publish its own groups, store the refusals since
        the last."""
        pool = self.pool
        if pool is not None and used:
            pool.mark_used([c.key for c in used])
            for c in used:
                self._emit(rollout_event(c.group, "used", question=c.question))
        if used:  # display only: an origin sees that its work was used
            self._on_loop(lambda service: service.send_receipts(list(used)))
        if own:  # marked LOCAL_PEER by the trainer: the service signs them with this node's id
            groups = list(own)
            self._on_loop(lambda service: service.publish(groups), "publishing rollouts")
        self.store_refusals()

    def fetch(self, j: int) -> None:
        """Pull up to `j` peers' groups from the board for the next round (the round step, on the trainer
        thread); a node with nothing of its own to share this round fetches too."""
        self._on_loop(lambda service: service.fetch(j), "fetching rollouts")

    def _on_loop(self, work: Callable[[Any], Coroutine[Any, Any, Any]], failure: str = "") -> None:
        """Run `work(service)` on the swarm's loop, if it runs; a `failure` is logged as a warning."""
        service, loop = self.service, self._loop
        if service is None or loop is None or loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(work(service), loop)
        if failure:
            future.add_done_callback(functools.partial(self._log_failure, failure))

    def report_verdicts(self, verdicts: Sequence[Verdict]) -> None:
        """The round's verdicts on pooled groups it passed over reach the feed and the store like the
        pool's decisions; a verdict already reported for a group is not repeated (trainer thread)."""
        for verdict in self._verdicts.changed(verdicts):
            candidate = self._offered.get(verdict.key)
            if candidate is not None:
                self._emit(rollout_event(candidate.group, "skipped", verdict.reason, candidate.question))

    def _log_failure(self, what: str, future: Any) -> None:
        exc = future.exception()
        if exc is not None:
            self._emit(LogRecord(level="warning", message=f"{what} failed: {exc}"))

    def store_refusals(self) -> None:
        """What the swarm refused since the last round goes to the store (frames; groups are rows of
        `rollouts` already)."""
        service = self.service
        if service is None:
            return
        now = dict(service.stats()["refusals"])
        last = self._refusals_stored
        self._refusals_stored = now
        delta = {reason: n - last.get(reason, 0) for reason, n in now.items() if n > last.get(reason, 0)}
        self._store.record_refusals(delta)


def board_summary(board: dict[str, Any]) -> dict[str, Any]:
    """What the app shows of the board: where, how many nodes, until when this node may write."""
    return {key: board.get(key) for key in ("connected", "urls", "nodes_on_board", "credential_expires_at",
                                            "puts", "put_errors", "put_error", "fetch_rounds", "frames_used",
                                            "fetch_ms_p50")}
