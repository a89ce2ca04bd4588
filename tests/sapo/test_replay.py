"""A node's own frontier questions asked again: which are kept (mixed here), how often one comes back
(at most twice, only while still mixed), that the buffer is bounded, that a node without replay keeps
its exact random path, and that a real round re-asks them through the trainer."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from engine.models.generate import SampleConfig
from engine.models.policy import build_tiny_policy, load_policy
from engine.sapo.config import SapoConfig
from engine.sapo.replay import FrontierReplay
from engine.sapo.trainer import Trainer
from engine.tasks.library import preset
from engine.tasks.reference import TaskRef


def _ref(index: int) -> TaskRef:
    return preset("rl").ref("basic_arithmetic", 1000, index)


def test_only_mixed_questions_are_kept_and_each_comes_back_at_most_twice() -> None:
    replay, rng = FrontierReplay(capacity=8, max_replays=2), random.Random(0)
    replay.observe_fresh("a", _ref(1), mixed=True)
    replay.observe_fresh("b", _ref(2), mixed=False)  # all right or all wrong: nothing to replay
    assert len(replay) == 1
    asked = []
    for _ in range(4):
        drawn = replay.draw(1, rng)
        asked += [key for key, _ in drawn]
        for key, entry in drawn:
            assert entry.ref == _ref(1)
            replay.observe_replayed(key, entry, mixed=True)  # still at the frontier
    assert asked == ["a", "a"]  # asked again twice, then retired however mixed it stays
    replay.observe_fresh("c", _ref(3), mixed=True)
    (drawn,) = replay.draw(3, rng)
    replay.observe_replayed(*drawn, mixed=False)  # came back all right or all wrong: dropped at once
    assert len(replay) == 0 and replay.draw(1, rng) == []


def test_the_buffer_forgets_the_oldest_and_an_idle_one_draws_nothing_from_the_rng() -> None:
    replay = FrontierReplay(capacity=3)
    for k in range(5):
        replay.observe_fresh(f"q{k}", _ref(k), mixed=True)
    rng = random.Random(5)
    state = rng.getstate()
    assert replay.draw(0, rng) == [] and rng.getstate() == state  # num_replay = 0: the exact random path
    assert sorted(key for key, _ in replay.draw(5, rng)) == ["q2", "q3", "q4"]
    assert replay.draw(1, rng) == [] and len(replay) == 0
    with pytest.raises(ValueError):
        FrontierReplay(capacity=0)


def test_the_buffer_survives_a_checkpoint_and_skips_what_a_file_got_wrong() -> None:
    replay = FrontierReplay(capacity=4)
    replay.observe_fresh("a" * 64, _ref(1), mixed=True)
    replay.observe_fresh("b" * 64, _ref(2), mixed=True)
    state = replay.state_dict()
    garbage = [{"hash": "c" * 64, "ref": {"specialty": "basic_arithmetic"}, "replays": 0},  # no seed/index
               {"hash": "not hex", "ref": _ref(3).to_dict(), "replays": 0},
               {"hash": "d" * 64, "ref": _ref(4).to_dict(), "replays": 7},  # past max_replays
               {"hash": "e" * 64, "ref": _ref(5).to_dict(), "replays": True}, "junk"]
    restored = FrontierReplay(capacity=4)
    restored.load_state([*garbage, *state])
    assert restored.state_dict() == state
    restored.load_state("not a list")  # ignored: the buffer stands
    assert len(restored) == 2


def test_config_bounds_replays_by_the_own_questions() -> None:
    with pytest.raises(ValueError, match="num_replay"):
        SapoConfig(num_local=2, num_replay=3)
    with pytest.raises(ValueError, match="num_replay"):
        SapoConfig(num_local=2, num_replay=-1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "m", seed=11)


def test_a_round_re_asks_its_own_mixed_questions_and_never_its_solved_ones(model_dir: Path) -> None:
    flip = itertools.cycle((1.0, 0.0))

    def reward(question: Any, completion: str) -> float:
        """Arithmetic is always solved (never worth asking again); every other group is mixed."""
        return 1.0 if question.specialty == "basic_arithmetic" else next(flip)

    model, tok = load_policy(model_dir)
    cfg = SapoConfig(num_local=2, num_replay=1, completions=4, sampling=SampleConfig(max_new_tokens=6),
                     checkpoint_every=0, eval_every=0)
    trainer = Trainer(model, tok, cfg, preset("rl"), None, None, 3, reward_fn=reward)
    results = [trainer.run_round() for _ in range(8)]
    asked = Counter(g.question_hash for r in results for g in r.local_groups)
    mixed_first = {g.question_hash for g in results[0].local_groups if g.has_signal}
    assert results[0].metrics["replayed_groups"] == 0.0  # nothing to replay yet
    assert results[1].metrics["replayed_groups"] == 1.0
    assert results[1].local_groups[0].question_hash in mixed_first  # replays are asked first, then fresh draws
    assert max(asked.values()) == 3  # once fresh, then at most twice again
    solved = {g.question_hash for r in results for g in r.local_groups if g.ref.specialty == "basic_arithmetic"}
    assert all(asked[h] == 1 for h in solved)
    assert all(r.metrics["own_pick_groups"] == 2.0 for r in results)  # a replay is this node's own question


def test_a_resumed_trainer_asks_what_it_would_have_asked(model_dir: Path, tmp_path: Path) -> None:
    def reward(question: Any, completion: str) -> float:
        return float(len(completion) % 2)

    cfg = SapoConfig(num_local=2, num_replay=1, completions=4, sampling=SampleConfig(max_new_tokens=6),
                     checkpoint_every=0, eval_every=0)

    def trainer(resume: bool) -> Trainer:
        model, tok = load_policy(model_dir)
        make = Trainer.resume if resume else Trainer
        return make(model, tok, cfg, preset("rl"), None, tmp_path / "ckpt", 3, reward_fn=reward)

    first = trainer(False)
    for _ in range(3):
        first.run_round()
    first.save_checkpoint()
    assert len(first.replay) > 0, "three rounds of odd/even-length answers leave a mixed question"
    resumed = trainer(True)
    assert resumed.replay.state_dict() == first.replay.state_dict()
    ahead, again = first.run_round(), resumed.run_round()
    assert [g.question_hash for g in again.local_groups] == [g.question_hash for g in ahead.local_groups]
