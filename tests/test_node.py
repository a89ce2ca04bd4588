"""The node on a tiny real model: join, rounds, pause after the round, resume, leave, restart."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from engine.events import RoundCompleted, StateChanged
from engine.models.policy import build_tiny_policy
from engine.node import Node, NodeConfig
from engine.sapo.config import preset
from engine.settings import ContributorSettings


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "model")


def small_config(data_dir: Path, model: Path, rounds: int = 0) -> NodeConfig:
    sapo = preset("cpu-small").replace(num_local=2, completions=4, eval_every=0, checkpoint_every=2)
    return NodeConfig(data_dir=data_dir, model=str(model), sapo=sapo, solo=True, rounds=rounds, seed=3)


async def wait_for(predicate, timeout: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_join_pause_resume_leave(tmp_path: Path, tiny_model: Path) -> None:
    node = Node(small_config(tmp_path, tiny_model))
    seen: list[object] = []
    node.bus.add_listener(seen.append)

    async def main() -> None:
        await node.join()
        await wait_for(lambda: node.status().round >= 2)
        await node.pause(after_round=True)
        await wait_for(lambda: node.status().state == "paused")
        paused_at = node.status().round
        await asyncio.sleep(0.5)
        assert node.status().round == paused_at  # no round runs while paused
        await node.resume()
        await wait_for(lambda: node.status().round > paused_at)
        await node.leave()
        assert node.status().state == "stopped"

    asyncio.run(main())
    states = [e.state for e in seen if isinstance(e, StateChanged)]
    assert states[0] == "joining" and "solo" in states and "pausing" in states and "paused" in states
    assert states[-2:] == ["leaving", "stopped"]
    rounds = [e.round for e in seen if isinstance(e, RoundCompleted)]
    assert rounds == list(range(1, len(rounds) + 1))
    history = node.history()
    assert [r["round"] for r in history["rounds"]] == rounds
    stored = node.store.rounds()
    assert all(r["energy_j"] > 0 and r["energy_measured"] in (0.0, 1.0) for r in stored)  # each round's cost
    threads = node.status().threads  # the governor's record of the last round
    assert {"threads", "threads_low", "threads_high", "thread_changes"} <= set(threads)
    assert node.error is None
    node.store.close()


def test_restart_resumes_from_the_checkpoint(tmp_path: Path, tiny_model: Path) -> None:
    async def run_rounds(n: int) -> Node:
        node = Node(small_config(tmp_path, tiny_model, rounds=n))
        await node.join()
        await node.finished.wait()
        await node.leave()
        node.store.close()
        return node

    first = asyncio.run(run_rounds(3))
    assert first.status().round == 3
    second = asyncio.run(run_rounds(2))
    assert second.status().round == 5  # continued, did not start over
    assert second.status().policy_version >= first.status().policy_version


def test_settings_update_is_validated_and_persisted(tmp_path: Path, tiny_model: Path) -> None:
    node = Node(small_config(tmp_path, tiny_model))

    async def main() -> None:
        with pytest.raises(ValueError):
            await node.update_settings({"cpu_cores": -1})
        await node.update_settings({"pause_on_battery": False})
        await node.snooze(3600)

    asyncio.run(main())
    again = Node(small_config(tmp_path, tiny_model))
    assert again.get_settings()["pause_on_battery"] is False
    assert again.get_settings()["snooze_until"] > 0
    node.store.close()
    again.store.close()


def test_snoozed_node_pauses_with_the_reason(tmp_path: Path, tiny_model: Path) -> None:
    node = Node(small_config(tmp_path, tiny_model))

    async def main() -> None:
        await node.snooze(3600)
        await node.join()
        await wait_for(lambda: node.status().state == "paused")
        assert "snoozed" in node.status().detail
        assert node.status().round == 0
        await node.resume()  # resume ends the snooze
        await wait_for(lambda: node.status().round >= 1)
        await node.leave()

    asyncio.run(main())
    node.store.close()


def test_run_flags_reach_the_llamacpp_config(tmp_path: Path) -> None:
    import argparse

    from engine.cli import run as run_cli
    from engine.models.llamacpp import LlamaCppConfig

    parser = argparse.ArgumentParser()
    run_cli.register(parser.add_subparsers())
    args = parser.parse_args(["run", "--data-dir", str(tmp_path), "--backend", "llamacpp",
                              "--llamacpp-weights", "f16", "--llamacpp-kv", "unified"])
    config = run_cli.build_config(args)
    assert config.backend == "llamacpp" and config.model == ContributorSettings.load(tmp_path).model != ""
    assert config.llamacpp == LlamaCppConfig(weights="f16", kv_layout="unified")
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--llamacpp-weights", "q4_0"])
    with pytest.raises(TypeError, match="LlamaCppConfig"):
        NodeConfig(data_dir=tmp_path, llamacpp={"weights": "f16"})


def test_auto_preset_trains_pretrained_models_with_the_real_model_parts(tmp_path: Path) -> None:
    import argparse

    from engine.cli import run as run_cli
    from engine.sapo.config import preset

    parser = argparse.ArgumentParser()
    run_cli.register(parser.add_subparsers())
    config = run_cli.build_config(parser.parse_args(["run", "--data-dir", str(tmp_path), "--set", "lr=2e-4"]))
    assert config.sapo.prompt_style == "compact" and not config.sapo.curriculum.enabled  # the seed: cpu-small
    real = config.real_sapo
    assert real is not None and real.curriculum.enabled and real.format_reward > 0 and real.prompt_style == "chat-fewshot"
    assert (real.num_local, real.num_external, real.num_suggested) == (2, 2, 0) and real.lr == 2e-4  # answers; --set applies
    assert real.external_same_model  # peers of this model only
    questions = run_cli.build_config(parser.parse_args(["run", "--data-dir", str(tmp_path), "--external", "0",
                                                        "--set", "num_suggested=1"])).real_sapo
    assert questions is not None and (questions.num_external, questions.num_suggested) == (0, 1)  # when asked for
    solo = run_cli.build_config(parser.parse_args(["run", "--data-dir", str(tmp_path), "--solo"])).real_sapo
    assert solo is not None and (solo.num_local, solo.num_external) == (preset("cpu-real").num_local, 0)
    fixed = run_cli.build_config(parser.parse_args(["run", "--data-dir", str(tmp_path), "--preset", "paper"]))
    assert fixed.real_sapo is None  # an explicit preset trains every model
    with pytest.raises(TypeError, match="real_sapo"):
        NodeConfig(data_dir=tmp_path, real_sapo={"lr": 1.0})


def test_status_shows_what_the_swarm_refused(tmp_path: Path, tiny_model: Path) -> None:
    import dataclasses

    from engine.swarm.config import SwarmConfig
    from engine.tasks.library import preset as mix_preset

    cfg = dataclasses.replace(small_config(tmp_path, tiny_model, rounds=1), solo=False,
                              swarm=SwarmConfig(listen_host="127.0.0.1", mdns=False))
    node = Node(cfg)
    assert node.status().swarm == {}  # not in a swarm yet

    async def main() -> None:
        await node.join()
        await wait_for(lambda: node.net.service is not None)
        import random
        import time

        from engine.sapo.records import Provenance, RolloutGroup
        from engine.tasks import library

        [ref] = mix_preset("rl").sample_refs(random.Random(1), 1, dataset_seed=5)
        question = library.regenerate(ref)
        group = RolloutGroup(ref, question.hash, (library.demonstration(question), "no"),
                             Provenance("x" * 43, "seed", 1, 1, time.time()))
        node.net.pool.offer(dataclasses.replace(group, completions=(" " * 9000, *group.completions[1:])))
        node.net.pool.offer(dataclasses.replace(group, question_hash="0" * 64))
        health = node.status().swarm
        assert health["groups_dropped"] == {"oversized": 1, "forged_ref": 1} and health["groups_received"] == 2
        assert health["frames_refused"] == {} and health["links"] == 0
        from engine.swarm.errors import ProtocolError

        with pytest.raises(ProtocolError):
            node.net.service.protocol.open(b"{not json")  # a frame the swarm refuses ...
        node.net.store_refusals()  # ... reaches the store (the worker does this after every round)
        assert node.store.refusal_totals() == {"bad_json": 1}
        assert node.history()["frame_refusals"] == {"bad_json": 1}
        await wait_for(lambda: node.finished.is_set())
        await node.leave()

    asyncio.run(main())
    node.store.close()


def test_a_bootstrap_url_set_in_the_settings_is_used_at_once(tmp_path: Path, tiny_model: Path) -> None:
    """The app's Settings change the joined node's swarm without an engine restart (it kept the
    settings object it was built with, and the URL waited for the next process)."""
    import dataclasses

    from engine.swarm.bootstrap import BootstrapServer
    from engine.swarm.config import BootstrapConfig, SwarmConfig

    cfg = dataclasses.replace(small_config(tmp_path, tiny_model), solo=False,
                              swarm=SwarmConfig(listen_host="127.0.0.1", mdns=False))
    node = Node(cfg)

    async def main() -> None:
        boot = BootstrapServer(BootstrapConfig(host="127.0.0.1", port=0), log=lambda level, msg: None)
        await boot.start()
        try:
            await node.join()
            await wait_for(lambda: node.net.service is not None)
            assert boot.status()["peers"] == []
            await node.update_settings({"bootstrap_url": boot.url})
            await wait_for(lambda: len(boot.status()["peers"]) == 1, timeout=30)
            assert node.status().round >= 0 and node.net.settings.bootstrap_url == boot.url
            await node.leave()
        finally:
            await boot.stop()

    asyncio.run(main())
    node.store.close()


def test_a_first_run_trains_the_doctors_pick_and_remembers_it(tmp_path: Path) -> None:
    """A newcomer's engine trains the model `sapo doctor` picks (a real one where it fits), not the
    seed; later starts keep it, a choice made in the app wins, and so does --model for one run."""
    import argparse

    from engine import doctor
    from engine.cli import run as run_cli

    parser = argparse.ArgumentParser()
    run_cli.register(parser.add_subparsers())
    pick = doctor.report()["pick"]["model"]
    assert run_cli.build_config(parser.parse_args(["run", "--data-dir", str(tmp_path)])).model == pick
    assert ContributorSettings.load(tmp_path).model == pick
    assert run_cli.build_config(parser.parse_args(["run", "--data-dir", str(tmp_path), "--model", "seed"])).model \
        == "seed"
    assert ContributorSettings.load(tmp_path).model == pick  # --model is for one run
    dataclasses.replace(ContributorSettings.load(tmp_path), model="seed").save(tmp_path)  # chosen in the app
    assert run_cli.build_config(parser.parse_args(["run", "--data-dir", str(tmp_path)])).model == "seed"
