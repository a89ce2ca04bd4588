"""The round step that node, experiment and benches share, with a real tiny Llama and the node's own
pool (its gate: regenerate, hash check, local score; its completion-size cap)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine.models.generate import SampleConfig
from engine.models.policy import build_tiny_policy, load_policy
from engine.node.peer_groups import make_pool
from engine.sapo.config import SapoConfig
from engine.sapo.records import Provenance, RolloutGroup
from engine.sapo.repeated_text import RepeatedTextConfig
from engine.sapo.step import PoolExchange, step
from engine.sapo.trainer import Trainer
from engine.swarm.config import BYTES_PER_TOKEN, PoolConfig
from engine.tasks.library import preset, regenerate

CFG = SapoConfig(num_local=2, num_external=2, completions=4, sampling=SampleConfig(max_new_tokens=24),
                 checkpoint_every=0, eval_every=0, lr=1e-3, repeated_text=RepeatedTextConfig(min_questions=1),
                 quarantine_rounds=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "m", seed=11)


def _peer_group(index: int, answers: tuple[str, ...]) -> RolloutGroup:
    q = regenerate(preset("rl").ref("basic_arithmetic", 1000, index))
    texts = tuple(f"<answer>{q.answer if a == 'right' else 'x'}</answer>" for a in answers)
    return RolloutGroup(q.ref, q.hash, texts, Provenance("peerA", "seed", 1, 1, time.time()), rewards=None)


def test_the_step_draws_from_the_exchange_and_hands_it_the_round(model_dir: Path) -> None:
    model, tok = load_policy(model_dir)
    trainer = Trainer(model, tok, CFG, preset("rl"), None, None, 7)
    pool = make_pool(PoolConfig(), CFG.sampling.max_new_tokens, CFG.partial_credit, preset("rl"))
    assert pool.config.max_completion_bytes == BYTES_PER_TOKEN * 24  # nothing longer than we could write
    for i in range(3):
        assert pool.offer(_peer_group(i, ("right", "wrong", "right", "wrong")), "peerA").status == "pooled"
    published: list[RolloutGroup] = []
    fetched: list[int] = []

    class Fetching(PoolExchange):
        def fetch(self, j: int) -> None:
            fetched.append(j)

    exchange = Fetching(pool, published.extend)
    result = step(trainer, exchange)
    assert fetched == [CFG.num_external + CFG.num_suggested]  # its own step, after the round
    assert exchange.offered == 3
    assert list(result.local_groups) == published and len(published) == CFG.num_local
    assert 0 < len(result.used_external) <= CFG.num_external, result.verdicts
    for used in result.used_external:  # marked in the pool: max_uses = 1 takes them out of the next draw
        assert used not in pool.candidates()


def test_a_solo_trainer_asks_for_no_candidates(model_dir: Path) -> None:
    model, tok = load_policy(model_dir)
    trainer = Trainer(model, tok, SapoConfig.from_dict(CFG.to_dict() | {"num_external": 0}), preset("rl"),
                      None, None, 7)

    class Counting(PoolExchange):
        asked = 0

        def candidates(self):  # type: ignore[no-untyped-def]
            Counting.asked += 1
            return super().candidates()

    pool = make_pool(PoolConfig(), 6, False)
    step(trainer, Counting(pool))
    assert Counting.asked == 0
