"""Helpers for the swarm tests: real identities, real groups, hand-signed frames."""

from __future__ import annotations

import time
from typing import Any

from engine.sapo.records import Provenance, RolloutGroup, VerifiedGroup
from engine.swarm.identity import Identity, b64url
from engine.swarm.wire import canonical
from engine.tasks.reference import TaskRef, question_hash

_TEXTS: dict[str, str] = {}  # question text by hash, for the groups make_group built


def stub_rescore(rewards: Any) -> Any:
    """A pool gate for make_group's made-up questions: the question is the text make_group hashed,
    the rewards `rewards(group)`. Unknown hashes raise (the pool drops them as rescore errors)."""
    from engine.tasks.library import Question

    def rescore(group: RolloutGroup) -> VerifiedGroup:
        question = Question(ref=group.ref, text=_TEXTS[group.question_hash], answer=None, entry={})
        return VerifiedGroup(group.with_rewards(tuple(rewards(group))), question)

    return rescore


def make_group(origin: str, index: int = 0, completions: tuple[str, ...] = ("4", "5"),
               policy_version: int = 3, question: str | None = None,
               logprobs: tuple[tuple[float, ...], ...] | None = None) -> RolloutGroup:
    ref = TaskRef("basic_arithmetic", {"min_terms": 2, "max_terms": 2}, seed=7, index=index)
    text = question if question is not None else f"what is 2+{index}?"
    _TEXTS[question_hash(text)] = text
    return RolloutGroup(
        ref=ref,
        question_hash=question_hash(text),
        completions=completions,
        provenance=Provenance(origin, "seed", policy_version, round=11, created_at=time.time()),
        generator_logprobs=logprobs,
    )


def signed_frame(identity: Identity, frame: dict[str, Any]) -> bytes:
    """Sign an arbitrary (possibly malformed) frame the way a peer would: valid signature, any body."""
    unsigned = {k: v for k, v in frame.items() if k != "sig"}
    sig = b64url(identity.sign(canonical(unsigned)))
    return canonical({**unsigned, "sig": sig})


# Above any seq a SwarmProtocol started in this test run has issued (they start at time_ns // 1000).
SEQ_BASE = time.time_ns() // 1000 + 10**12


def frame_dict(identity: Identity, frame_type: str, body: dict[str, Any], seq: int = 1,
               ts: float | None = None) -> dict[str, Any]:
    """A frame as a dict; `seq` is relative to SEQ_BASE so it is newer than the link's hello."""
    return {"v": 1, "type": frame_type, "from": identity.peer_id, "seq": SEQ_BASE + seq,
            "ts": time.time() if ts is None else ts, "body": body}


def real_groups(origin: str, n: int, seed: int = 5, policy_version: int = 3) -> list[RolloutGroup]:
    """Groups for real ReasoningGym questions: one correct completion, one wrong, one malformed."""
    import random

    from engine.tasks import library

    refs = library.preset("seed-easy").sample_refs(random.Random(seed), n, dataset_seed=seed)
    groups = []
    for ref in refs:
        question = library.regenerate(ref)
        completions = (library.demonstration(question), "<answer>definitely wrong</answer>", "no answer")
        groups.append(RolloutGroup(ref, question.hash, completions,
                                   Provenance(origin, "seed", policy_version, 1, time.time())))
    return groups


def library_rescore(group: RolloutGroup) -> VerifiedGroup | None:
    """What the node passes to RolloutPool: regenerate from the ref, check the hash, score locally."""
    from engine.node.peer_groups import make_rescorer

    return make_rescorer(partial_credit=False)(group)


# --- async scaffolding for service tests ------------------------------------------------------------

def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_for(predicate: Any, timeout: float = 10.0, what: str = "condition") -> None:
    import asyncio

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


class Node:
    """A SwarmService with a real pool (library re-scoring) and the events it emitted."""

    def __init__(self, config: Any, identity: Identity | None = None) -> None:
        from engine.swarm.pool import RolloutPool
        from engine.swarm.service import SwarmService

        self.identity = identity or Identity.generate()
        self.events: list[Any] = []
        self.pool = RolloutPool(config.pool, library_rescore)
        self.service = SwarmService(self.identity, config, self.pool,
                                    {"model_id": "seed", "task_lib_version": "test-1"}, self.events.append)

    def of_type(self, name: str) -> list[Any]:
        return [e for e in self.events if type(e).__name__ == name]

    def peer_ids(self) -> set[str]:
        return {p.peer_id for p in self.service.peers()}


def swarm_config(**overrides: Any) -> Any:
    from engine.swarm.config import LinkConfig, SwarmConfig

    fast = LinkConfig(reconnect_initial_s=0.1, reconnect_max_s=0.5, ping_interval_s=1.0, ping_timeout_s=2.0,
                      connect_timeout_s=3.0)
    return SwarmConfig(**{"listen_host": "127.0.0.1", "mdns": False, "link": fast, **overrides})


def async_test(fn: Any) -> Any:
    """Run an async test function on a fresh event loop (no pytest-asyncio dependency)."""
    import asyncio
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


async def node_board(urls: list[str], ident: Identity, cred: Any, **options: Any) -> Any:
    """A board connection made the way a credentialed node makes one: its own inbox, the board's
    read calls through its account's imports."""
    from engine.swarm.nats_auth import NODE_API_PREFIX, connect_options, node_inbox
    from engine.swarm.nats_board import NatsBoard

    extra = options.pop("connect_options", {})
    return NatsBoard(urls, create=False, api_prefix=NODE_API_PREFIX, **options,
                     connect_options={**connect_options(ident.sign, lambda: cred, node_inbox(ident.peer_id)), **extra})
