"""A STAND-IN for the real engine node (engine/node.py), used only by the GUI and control tests.

It implements `NodeControl` by script: no model, no swarm. It publishes real events through a real
EventBus (state changes, RoundCompleted with plausible metrics, RolloutSeen, PeerUpdated, LogRecord)
and validates settings with the real ContributorSettings. The fixture in conftest.py may swap it for
the real node once that exists.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import time
from pathlib import Path
from typing import Any

from engine.bus import EventBus
from engine.events import EvalCompleted, LogRecord, PeerUpdated, RolloutSeen, RoundCompleted, StateChanged
from engine.settings import ContributorSettings

SPECIALTIES = ("base_conversion", "basic_arithmetic", "propositional_logic", "binary_matrix")
PHASES = {"generate": 0.55, "score": 0.04, "prepare": 0.08, "update": 0.3}  # mean seconds, as on a laptop
PEERS = (("peerAAA", "amber-falcon", "mdns", "192.168.1.20:7070"),
         ("peerBBB", "quiet-heron", "bootstrap", "relay:wss://boot.example"),
         ("peerCCC", "brisk-otter", "mdns", "192.168.1.31:7070"))


class StandInNode:
    def __init__(self, data_dir: Path, round_s: float = 0.05, seed: int = 0) -> None:
        self.bus = EventBus()
        self.data_dir = Path(data_dir)
        self.round_s = round_s  # wall time of one scripted round
        self.rng = random.Random(seed)
        self.settings = ContributorSettings.load(self.data_dir)
        self.state = "stopped"
        self.detail = ""
        self.round = 0
        self.policy_version = 0
        self.cumulative = 0.0
        self.rounds: list[RoundCompleted] = []
        self.rollouts: list[RolloutSeen] = []
        self.evals: list[EvalCompleted] = []
        self._loop_task: asyncio.Task[None] | None = None
        self._round_done = asyncio.Event()
        self.gate = asyncio.Event()  # a round completes only while this is set (tests clear it to hold one)
        self.gate.set()
        self.calls: list[str] = []

    def _set_state(self, state: str, detail: str = "") -> None:
        self.state, self.detail = state, detail
        self.bus.publish(StateChanged(state=state, detail=detail))

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "detail": self.detail, "round": self.round,
                "policy_version": self.policy_version,
                "peers": len(PEERS) if self.state in ("in_swarm", "pausing") else 0,
                "model": "seed", "device": "cpu", "backend": "transformers", "data_dir": str(self.data_dir),
                "peer_name": "stand-in-node"}

    async def join(self) -> None:
        self.calls.append("join")
        if self._loop_task is not None and not self._loop_task.done():
            return
        self._set_state("joining", "looking for peers")
        await asyncio.sleep(self.round_s)
        for peer_id, name, found_by, address in PEERS:
            self.bus.publish(PeerUpdated(peer_id=peer_id, name=name, model="seed", found_by=found_by,
                                         address=address, connected=True))
        self._set_state("in_swarm", f"{len(PEERS)} peers")
        self._loop_task = asyncio.create_task(self._rounds())

    async def _rounds(self) -> None:
        while self.state in ("in_swarm", "pausing", "leaving", "solo"):
            await asyncio.sleep(self.round_s)
            await self.gate.wait()
            self._publish_round()
            self._round_done.set()
            if self.state == "pausing":
                self._set_state("paused", "after round")
                return
            if self.state == "leaving":
                self._set_state("stopped", "left the swarm")
                return

    def _publish_round(self) -> None:
        self.round += 1
        self.policy_version += 1
        # a slowly rising noisy reward, as a learning node shows
        base = 0.25 + 0.2 * (1 - math.exp(-self.round / 200))
        reward = min(1.0, max(0.0, base + self.rng.gauss(0, 0.08)))
        self.cumulative += reward
        per_specialty = {s: min(1.0, max(0.0, reward + self.rng.gauss(0, 0.1)))
                         for s in self.rng.sample(SPECIALTIES, 3)}
        event = RoundCompleted(
            round=self.round, policy_version=self.policy_version,
            metrics={"reward_mean": reward, "reward_std": 0.3,
                     "frac_reward_zero_std": min(1.0, max(0.0, 0.55 - 0.2 * base + self.rng.gauss(0, 0.06))),
                     "completion_len_mean": 18 + 6 * base + self.rng.gauss(0, 1.5),
                     "tokens_per_s": 1200 + self.rng.gauss(0, 60), "cumulative_reward": self.cumulative},
            per_specialty_reward=per_specialty,
            phase_seconds={p: max(0.0, mean + self.rng.gauss(0, mean / 10)) for p, mean in PHASES.items()},
            num_local=4, num_external=4)
        self.rounds.append(event)
        self.bus.publish(event)
        peer_id, name, _, _ = PEERS[self.round % len(PEERS)]
        status, reason = ("used", "") if self.round % 3 else ("dropped", "zero advantage")
        seen = RolloutSeen(origin_peer=peer_id, peer_name=name, specialty=next(iter(per_specialty)),
                           question=f"Round {self.round}: what is {self.round} + {self.round % 7}?",
                           completion=f"<answer>{self.round + self.round % 7}</answer>",
                           reward=1.0 if status == "used" else 0.0, status=status, reason=reason)
        self.rollouts.append(seen)
        self.bus.publish(seen)
        self.bus.publish(LogRecord(level="info", message=f"round {self.round}: reward {reward:.3f}"))
        if self.round % 10 == 0:
            pass1 = 0.2 + 0.1 * (1 - math.exp(-self.round / 300))
            self.evals.append(EvalCompleted(round=self.round, pass1=pass1, passk=min(1.0, 2.2 * pass1), k=8,
                                            per_specialty={}))
            self.bus.publish(self.evals[-1])

    async def wait_round(self) -> None:
        self._round_done.clear()
        await self._round_done.wait()

    async def leave(self) -> None:
        self.calls.append("leave")
        if self._loop_task is None or self._loop_task.done():
            self._set_state("stopped")
            return
        self._set_state("leaving", "finishing the round in flight")
        await self._loop_task
        for peer_id, name, found_by, address in PEERS:
            self.bus.publish(PeerUpdated(peer_id=peer_id, name=name, model="seed", found_by=found_by,
                                         address=address, connected=False))

    async def pause(self, after_round: bool = True) -> None:
        self.calls.append(f"pause:{after_round}")
        if after_round and self._loop_task is not None and not self._loop_task.done():
            self._set_state("pausing", "after this round")
            return
        if self._loop_task is not None:
            self._loop_task.cancel()
        self._set_state("paused")

    async def resume(self) -> None:
        self.calls.append("resume")
        if self.state in ("paused", "pausing"):
            self._set_state("in_swarm")
            if self._loop_task is None or self._loop_task.done():
                self._loop_task = asyncio.create_task(self._rounds())

    async def snooze(self, seconds: float) -> None:
        self.calls.append(f"snooze:{seconds:g}")
        await self.pause(after_round=False)
        self.settings = dataclasses.replace(self.settings, snooze_until=time.time() + seconds)
        self._set_state("paused", f"snoozed for {seconds / 60:.0f} min")

    def get_settings(self) -> dict[str, Any]:
        return self.settings.to_dict()

    async def update_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        self.settings = ContributorSettings.from_dict(changes, base=self.settings)
        self.settings.save(self.data_dir)
        return self.settings.to_dict()

    def history(self, limit: int = 2000) -> dict[str, Any]:
        return {"rounds": [r.to_dict() for r in self.rounds[-limit:]], "evals": [e.to_dict() for e in self.evals],
                "rollouts": [r.to_dict() for r in self.rollouts[-limit:]], "peers": []}

    def machine(self) -> dict[str, Any]:
        return {"device": {"kind": "cpu", "name": "Stand-in CPU", "budget_bytes": 8 * 2**30,
                           "cpu": {"physical_cores": 2, "logical_cores": 2, "ram_total_bytes": 16 * 2**30}},
                "pick": {"model": "seed", "backend": "transformers", "verdict": "fits well",
                         "estimated_bytes": 2**28, "budget_bytes": 8 * 2**30, "reason": "shipped seed model",
                         "round_seconds": 1.2},
                "candidates": [{"model": "seed", "backend": "transformers", "verdict": "fits well",
                                "estimated_bytes": 2**28, "round_seconds": 1.2, "available": True, "params": 5_000_000},
                               {"model": "qwen2.5-0.5b-instruct", "backend": "transformers", "verdict": "too slow",
                                "estimated_bytes": 6 * 2**30, "round_seconds": 1430.0, "available": False,
                                "params": 494_000_000}]}
